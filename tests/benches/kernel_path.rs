//! `1+1` through the real path an agent's call takes: ToolRunner.Execute (the
//! whole pipeline) → registry → kernel provider over gRPC → ipykernel; against
//! jupyter_client's blocking client on the same ipykernel (its connection
//! file), in interleaved rounds of one run; and, for reference, on a kernel
//! of its own.
//!
//! `cargo bench -p omicos-e2e --bench kernel_path` (release). N with KERNEL_PATH_N (default 300).

use omicos_proto::ToolStatus;
use omicos_proto::{
    ExecuteClientMessage, ExecuteStart, ListProvidersRequest, execute_client_message,
    execute_server_message, registry_client::RegistryClient, tool_runner_client::ToolRunnerClient,
};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{ProviderHosting, serve_provider};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let python = std::env::var("OMICOS_KERNEL_PYTHON")
        .unwrap_or_else(|_| root.join(".venv/bin/python3").display().to_string());
    let n: usize = std::env::var("KERNEL_PATH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let ws = tempfile::tempdir().unwrap();
    let workspace = ws.path().canonicalize().unwrap();
    let sd = Shutdown::new(Duration::from_secs(1));

    let rl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runner = format!("http://{}", rl.local_addr().unwrap());
    let rcfg: omicos_tool_runner::Config =
        serde_json::from_value(serde_json::json!({"workspace": workspace})).unwrap();
    tokio::spawn(omicos_tool_runner::run(rcfg, rl, sd.clone(), vec![]));

    let kcfg = omicos_kernel::KernelConfig {
        python: python.clone(),
        pool_size: 1,
        ..Default::default()
    };
    let kernel = omicos_kernel::KernelProvider::new(kcfg, workspace.clone(), vec![]).unwrap();
    let kl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hosting = ProviderHosting {
        registry: Some(runner.clone()),
        advertise: None,
        workspace: workspace.clone(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(kernel.clone(), kl, hosting, sd.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut reg = RegistryClient::connect(runner.clone()).await.unwrap();
    while reg
        .list(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let client = ToolRunnerClient::connect(runner.clone()).await.unwrap();
    let call = |i: usize| {
        let mut c = client.clone();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(ExecuteClientMessage {
                msg: Some(execute_client_message::Msg::Start(ExecuteStart {
                    call_id: format!("b{i}"),
                    tool_name: "run_python_code".into(),
                    arguments: r#"{"code":"1+1"}"#.into(),
                    session_id: "bench".into(),
                    permission_mode: omicos_proto::PermissionMode::Full as i32,
                    ..Default::default()
                })),
            })
            .await
            .unwrap();
            let t = Instant::now();
            let mut s = c
                .execute(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            while let Some(m) = s.message().await.unwrap() {
                if let Some(execute_server_message::Msg::Result(r)) = m.msg {
                    assert_eq!(r.status(), ToolStatus::Done, "{}", r.result);
                    assert!(r.result.contains('2'));
                    break;
                }
            }
            drop(tx);
            t.elapsed().as_secs_f64() * 1000.0
        }
    };
    for i in 0..50 {
        call(i).await;
    }
    // The same ipykernel, reached by jupyter_client through its connection
    // file, in rounds interleaved with ours: the machine's noise falls on both.
    let conn = kernel
        .kernels()
        .session_kernel("bench")
        .expect("the bench session has a kernel")
        .connection_file();
    let same = root.join("services/kernel/benches/jupyter_client_same.py");
    let mut jc = tokio::process::Command::new(&python)
        .arg(&same)
        .arg(&conn)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run jupyter_client on the same kernel");
    let mut jc_in = jc.stdin.take().unwrap();
    let mut jc_out = tokio::io::BufReader::new(jc.stdout.take().unwrap()).lines();
    let ready = jc_out.next_line().await.unwrap().unwrap_or_default();
    assert!(ready.contains("ready"), "jupyter_client said: {ready}");
    let rounds = 12;
    let per = n.div_ceil(rounds);
    let mut ours = Vec::with_capacity(n);
    let mut theirs = Vec::with_capacity(n);
    for r in 0..rounds {
        for i in 0..per {
            ours.push(call(1000 + r * per + i).await);
        }
        jc_in
            .write_all(format!("{per}\n").as_bytes())
            .await
            .unwrap();
        let line = jc_out.next_line().await.unwrap().expect("a round's times");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        theirs.extend(
            v["ms"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap()),
        );
    }
    drop(jc_in);
    let _ = jc.wait().await;
    ours.sort_by(f64::total_cmp);
    theirs.sort_by(f64::total_cmp);

    // For reference: jupyter_client on a kernel of its own, started the way
    // jupyter starts one (tcp, no box), after ours.
    let script = root.join("services/kernel/benches/jupyter_client_bench.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg("tcp")
        .arg(n.to_string())
        .output()
        .expect("run jupyter_client baseline");
    let line = String::from_utf8_lossy(&out.stdout);
    let base: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| {
        panic!(
            "baseline said: {line} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let (bp50, bp99) = (
        base["p50_ms"].as_f64().unwrap(),
        base["p99_ms"].as_f64().unwrap(),
    );
    let (p50, p99) = (pct(&ours, 0.5), pct(&ours, 0.99));
    let (sp50, sp99) = (pct(&theirs, 0.5), pct(&theirs, 0.99));
    println!(
        "1+1 round trip, n = {} each, {rounds} interleaved rounds (ms); ratios against jupyter_client on the same kernel",
        ours.len()
    );
    println!("| path | p50 | p99 | p50 ratio |");
    println!("|---|---|---|---|");
    println!(
        "| omicos: ToolRunner.Execute → pipeline → registry → kernel provider (gRPC) → ipykernel | {p50:.2} | {p99:.2} | {:.2} |",
        p50 / sp50
    );
    println!(
        "| jupyter_client blocking execute_interactive, the same kernel (ipc) | {sp50:.2} | {sp99:.2} | 1.00 |"
    );
    println!(
        "| jupyter_client blocking execute_interactive, its own unboxed kernel (tcp), after | {bp50:.2} | {bp99:.2} | {:.2} |",
        bp50 / sp50
    );
    kernel.close().await;
    sd.trigger();
}
