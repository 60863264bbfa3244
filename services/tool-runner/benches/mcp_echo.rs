//! An MCP echo call (server-everything over stdio) through the whole pipeline
//! (resolve → parse → validate → permission → hooks → dispatch to the
//! in-runner MCP provider → shape) against the same call made directly with
//! an rmcp client, in one run, alternating blocks so both see the same machine.
//!
//! Run: `scripts/mcp-servers.sh && cargo bench -p omicos-tool-runner --bench mcp_echo`.

use omicos_tool_runner::{CallIo, CallRequest, Config};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const BLOCKS: usize = 10;
const PER_BLOCK: usize = 100;

fn everything() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp-servers/node_modules/.bin/mcp-server-everything");
    assert!(p.exists(), "run scripts/mcp-servers.sh first");
    p.canonicalize().unwrap().display().to_string()
}

fn pct(v: &mut [Duration], q: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config {
        workspace: dir.path().to_owned(),
        ..Config::default()
    };
    cfg.mcp.servers = vec![omicos_mcp::ServerConfig {
        name: "everything".into(),
        command: Some(everything()),
        args: vec!["stdio".into()],
        ..Default::default()
    }];
    let pipeline = omicos_tool_runner::mcp::build_with_mcp(&cfg, vec![], Default::default())
        .await
        .unwrap();
    let mut cmd = tokio::process::Command::new(everything());
    cmd.arg("stdio").stderr(std::process::Stdio::null());
    let direct = ().serve(rmcp::transport::TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let args = json!({"message": "hello bench"});
    let via_pipeline = |i: usize| {
        let p = pipeline.clone();
        async move {
            let r = p
                .execute(
                    CallRequest {
                        call_id: format!("c{i}"),
                        tool_name: "mcp__everything__echo".into(),
                        arguments: r#"{"message":"hello bench"}"#.into(),
                        session_id: "bench".into(),
                        permission_mode: omicos_proto::PermissionMode::ReadOnly as i32,
                        ..Default::default()
                    },
                    CallIo::detached(),
                )
                .await;
            assert_eq!(r.result.result, "Echo: hello bench");
        }
    };
    // Warm both paths.
    for i in 0..50 {
        via_pipeline(i).await;
        direct
            .peer()
            .call_tool(
                CallToolRequestParams::new("echo")
                    .with_arguments(args.as_object().unwrap().clone()),
            )
            .await
            .unwrap();
    }
    let (mut lp, mut ld) = (Vec::new(), Vec::new());
    let (mut tp, mut td) = (Duration::ZERO, Duration::ZERO);
    for b in 0..BLOCKS {
        let t = Instant::now();
        for i in 0..PER_BLOCK {
            let s = Instant::now();
            direct
                .peer()
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            ld.push(s.elapsed());
            let _ = i;
        }
        td += t.elapsed();
        let t = Instant::now();
        for i in 0..PER_BLOCK {
            let s = Instant::now();
            via_pipeline(b * PER_BLOCK + i).await;
            lp.push(s.elapsed());
        }
        tp += t.elapsed();
    }
    let n = (BLOCKS * PER_BLOCK) as f64;
    let (mp, md) = (tp.as_secs_f64() * 1e6 / n, td.as_secs_f64() * 1e6 / n);
    println!(
        "MCP echo, server-everything over stdio, {} calls each, alternating blocks of {PER_BLOCK}",
        BLOCKS * PER_BLOCK
    );
    println!(
        "  direct rmcp client : mean {md:7.1} µs  p50 {:7.1} µs  p99 {:7.1} µs",
        pct(&mut ld, 0.5),
        pct(&mut ld, 0.99)
    );
    println!(
        "  through pipeline   : mean {mp:7.1} µs  p50 {:7.1} µs  p99 {:7.1} µs",
        pct(&mut lp, 0.5),
        pct(&mut lp, 0.99)
    );
    let (p50p, p50d) = (pct(&mut lp, 0.5), pct(&mut ld, 0.5));
    println!("  ratio (mean)       : {:.2} (target ≤ 1.5)", mp / md);
    println!("  ratio (p50)        : {:.2} (target ≤ 1.5)", p50p / p50d);
}
