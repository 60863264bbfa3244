//! The runner's own cost per call: a no-op in-process tool through the full
//! pipeline (no hooks) vs the same tool called directly, in one run; then the
//! pipeline with a trajectory record per call (serialized and appended to a
//! JSONL file, as the orchestrator does), sequential and with concurrent callers.
//!
//! Run: `cargo bench -p omicos-tool-runner` (release build).

use async_trait::async_trait;
use omicos_proto::ToolSpec;
use omicos_tool_runner::{CallIo, CallRequest, Config, Pipeline, Registry};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Noop;

#[async_trait]
impl Provider for Noop {
    fn name(&self) -> &str {
        "bench"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "noop",
                "does nothing",
                json!({"type":"object","properties":{"x":{"type":"integer"},"tag":{"type":"string"}}}),
            )
            .build(),
        ]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(Value::String("ok".into()))
    }
}

struct Stats {
    calls_per_s: f64,
    p50: Duration,
    p99: Duration,
}

fn stats(mut lat: Vec<Duration>, total: Duration) -> Stats {
    lat.sort();
    let n = lat.len();
    Stats {
        calls_per_s: n as f64 / total.as_secs_f64(),
        p50: lat[n / 2],
        p99: lat[(n * 99 / 100).min(n - 1)],
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn request(i: usize) -> CallRequest {
    CallRequest {
        call_id: format!("call_{i}"),
        tool_name: "noop".into(),
        arguments: r#"{"x":1,"tag":"bench"}"#.into(),
        session_id: "bench".into(),
        agent_id: "bench".into(),
        permission_mode: omicos_proto::PermissionMode::Full as i32,
        ..Default::default()
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            workspace: dir.path().join("ws"),
            ..Config::default()
        };
        let provider: Arc<dyn Provider> = Arc::new(Noop);
        let pipeline = Pipeline::new(
            &cfg,
            Arc::new(Registry::new(Duration::from_secs(30))),
            vec![provider.clone()],
        )
        .unwrap();
        let n: usize = std::env::var("BENCH_CALLS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(50_000);
        let ctx = CallCtx::for_test(pipeline.workspace(), "bench");

        // Warm up both paths (schema compiled once, allocator warmed).
        for i in 0..2_000 {
            let o = pipeline.execute(request(i), CallIo::detached()).await;
            assert_eq!(o.result.status().as_str(), "done", "{}", o.result.result);
            provider
                .call("noop", json!({"x":1}), ctx.clone())
                .await
                .unwrap();
        }

        // Interleaved rounds so both paths see the same machine state.
        let (mut direct_lat, mut pipe_lat) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut direct_total, mut pipe_total) = (Duration::ZERO, Duration::ZERO);
        let rounds = 10;
        for round in 0..rounds {
            let t0 = Instant::now();
            for _ in 0..n / rounds {
                let s = Instant::now();
                let v = provider
                    .call("noop", json!({"x":1,"tag":"bench"}), ctx.clone())
                    .await
                    .unwrap();
                std::hint::black_box(v);
                direct_lat.push(s.elapsed());
            }
            direct_total += t0.elapsed();
            let t0 = Instant::now();
            for i in 0..n / rounds {
                let s = Instant::now();
                let o = pipeline
                    .execute(request(round * n + i), CallIo::detached())
                    .await;
                std::hint::black_box(&o.result);
                pipe_lat.push(s.elapsed());
            }
            pipe_total += t0.elapsed();
        }
        let direct = stats(direct_lat, direct_total);
        let pipe = stats(pipe_lat, pipe_total);

        // With a trajectory record per call: serialize it and append it to a JSONL file.
        let traj = dir.path().join("trajectory.jsonl");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&traj).unwrap());
        let mut rec_lat = Vec::with_capacity(n);
        let t0 = Instant::now();
        for i in 0..n {
            let s = Instant::now();
            let r = pipeline
                .execute(request(i), CallIo::detached())
                .await
                .into_result();
            file.write_all(r.record_json.as_bytes()).unwrap();
            file.write_all(b"\n").unwrap();
            rec_lat.push(s.elapsed());
        }
        file.flush().unwrap();
        let rec = stats(rec_lat, t0.elapsed());

        // Concurrent callers (as several orchestrator turns would be), records included.
        let callers = 8;
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..callers {
            let p = pipeline.clone();
            tasks.push(tokio::spawn(async move {
                let mut bytes = 0usize;
                for i in 0..n / callers {
                    let r = p
                        .execute(request(c * n + i), CallIo::detached())
                        .await
                        .into_result();
                    bytes += r.record_json.len();
                }
                bytes
            }));
        }
        for t in tasks {
            std::hint::black_box(t.await.unwrap());
        }
        let concurrent_cps = (n / callers * callers) as f64 / t0.elapsed().as_secs_f64();

        // The same call over gRPC: one Execute stream per call on loopback (what the orchestrator pays).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
        let grpc_cfg = Config { workspace: dir.path().join("ws-grpc"), ..Config::default() };
        tokio::spawn(omicos_tool_runner::run(grpc_cfg, listener, shutdown.clone(), vec![Arc::new(Noop)]));
        let channel = loop {
            if let Ok(c) = tonic::transport::Endpoint::from_shared(addr.clone()).unwrap().tcp_nodelay(true).connect().await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let client = omicos_proto::tool_runner_client::ToolRunnerClient::new(channel);
        let grpc_n = (n / 10).max(1000);
        let mut grpc_lat = Vec::with_capacity(grpc_n);
        let mut t0 = Instant::now();
        for i in 0..grpc_n + 200 {
            if i == 200 {
                t0 = Instant::now();
            }
            let s = Instant::now();
            let start = omicos_proto::ExecuteStart {
                call_id: format!("g{i}"),
                tool_name: "noop".into(),
                arguments: r#"{"x":1}"#.into(),
                session_id: "bench".into(),
                permission_mode: omicos_proto::PermissionMode::Full as i32,
                ..Default::default()
            };
            let msg = omicos_proto::ExecuteClientMessage { msg: Some(omicos_proto::execute_client_message::Msg::Start(start)) };
            let mut stream = client.clone().execute(tokio_stream::iter(vec![msg])).await.unwrap().into_inner();
            let mut done = false;
            while let Some(m) = stream.message().await.unwrap() {
                if let Some(omicos_proto::execute_server_message::Msg::Result(r)) = m.msg {
                    done = r.status().as_str() == "done";
                }
            }
            assert!(done);
            if i >= 200 {
                grpc_lat.push(s.elapsed());
            }
        }
        let grpc = stats(grpc_lat, t0.elapsed());
        shutdown.trigger();

        let overhead = pipe.p50.saturating_sub(direct.p50);
        println!("## tool-runner pipeline bench ({n} calls per path, 2 worker threads)");
        println!("| path | calls/s | p50 µs | p99 µs |");
        println!("|---|---:|---:|---:|");
        println!(
            "| direct provider call | {:.0} | {:.2} | {:.2} |",
            direct.calls_per_s,
            us(direct.p50),
            us(direct.p99)
        );
        println!(
            "| full pipeline, no hooks | {:.0} | {:.2} | {:.2} |",
            pipe.calls_per_s,
            us(pipe.p50),
            us(pipe.p99)
        );
        println!(
            "| pipeline + trajectory record (JSONL append) | {:.0} | {:.2} | {:.2} |",
            rec.calls_per_s,
            us(rec.p50),
            us(rec.p99)
        );
        println!("| pipeline + record, {callers} concurrent callers | {concurrent_cps:.0} | | |");
        println!("| over gRPC: one Execute stream per call, loopback ({grpc_n} calls) | {:.0} | {:.2} | {:.2} |", grpc.calls_per_s, us(grpc.p50), us(grpc.p99));
        println!();
        println!(
            "pipeline/direct: p50 ratio {:.1}x, throughput ratio {:.3}",
            us(pipe.p50) / us(direct.p50).max(0.001),
            pipe.calls_per_s / direct.calls_per_s
        );
        println!(
            "pipeline overhead p50: {:.2} µs (target < 100 µs): {}",
            us(overhead),
            if overhead < Duration::from_micros(100) {
                "PASS"
            } else {
                "FAIL"
            }
        );
        println!(
            "with a trajectory record per call: {:.0} calls/s (target >= 5000): {}",
            rec.calls_per_s,
            if rec.calls_per_s >= 5000.0 {
                "PASS"
            } else {
                "FAIL"
            }
        );
    });
}
