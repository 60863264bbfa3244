//! Memory a runner gives back: the real `omicos-tool-runner` binary on
//! 127.0.0.1, resident set size (VmRSS of /proc/<pid>/status) at rest, then
//! after rounds of four parallel 30 MiB `file_manager__write` calls over gRPC.
//! Buffers for one call must not outlive it: the RSS after a round should come
//! back near the RSS at rest, and must not grow from round to round.
//!
//! Run: `cargo bench -p omicos-tool-runner --bench rss` (release build).
//! `OMICOS_RSS_MIB` changes the size of each write, `OMICOS_RSS_ROUNDS` the rounds.

use omicos_proto::{
    ExecuteClientMessage, ExecuteStart, MAX_MESSAGE_BYTES, PermissionMode,
    execute_client_message::Msg as In, execute_server_message::Msg as Out,
    tool_runner_client::ToolRunnerClient,
};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::transport::Channel;

/// A line of /proc/<pid>/status, in MiB.
fn status_mib(pid: u32, key: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} missing"));
    kb / 1024.0
}

async fn write(client: &mut ToolRunnerClient<Channel>, name: &str, content: &str) -> Duration {
    let started = Instant::now();
    let start = ExecuteStart {
        call_id: format!("call_{name}"),
        tool_name: "file_manager__write".into(),
        arguments: json!({"path": name, "content": content}).to_string(),
        session_id: "rss".into(),
        agent_id: "bench".into(),
        permission_mode: PermissionMode::Full as i32,
        ..Default::default()
    };
    let msg = ExecuteClientMessage {
        msg: Some(In::Start(start)),
    };
    let mut resp = client
        .execute(tokio_stream::iter(vec![msg]))
        .await
        .expect("execute")
        .into_inner();
    let mut done = false;
    while let Some(m) = resp.message().await.expect("no transport error") {
        if let Some(Out::Result(r)) = m.msg {
            assert_eq!(r.status().as_str(), "done", "{}", r.result);
            done = true;
        }
    }
    assert!(done, "a result");
    started.elapsed()
}

/// What one runner process did.
struct Run {
    rest: f64,
    after: Vec<f64>,
    peak: f64,
}

async fn measure(mib: usize, rounds: usize, allocator_defaults: bool) -> Run {
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-tool-runner"));
    cmd.env("OMICOS_LISTEN", "127.0.0.1:0")
        .env("OMICOS_WORKSPACE", ws.path())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if allocator_defaults {
        cmd.env(omicos_tool_runner::allocator::DEFAULTS_ENV, "1");
    }
    let mut child = cmd.spawn().expect("start the runner");
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the runner says where it listens")
        .unwrap()
        .unwrap();
    let endpoint = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    let channel = Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = ToolRunnerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    // At rest: after a small call, so that lazy start-up allocations are in.
    write(&mut client.clone(), "warm.txt", "warm").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rest = status_mib(pid, "VmRSS:");
    println!(
        "{}:",
        if allocator_defaults {
            "glibc defaults (OMICOS_ALLOCATOR_DEFAULTS=1)"
        } else {
            "as shipped"
        }
    );
    println!("  at rest                 {rest:7.1} MiB");
    let content = "x".repeat(mib << 20);
    let mut after = Vec::new();
    for round in 1..=rounds {
        let calls = (0..4).map(|i| {
            let mut c = client.clone();
            let content = &content;
            async move { write(&mut c, &format!("r{round}_{i}.txt"), content).await }
        });
        let took = futures::future::join_all(calls).await;
        let slowest = took.iter().max().unwrap();
        let now = status_mib(pid, "VmRSS:");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let settled = status_mib(pid, "VmRSS:");
        after.push(settled);
        println!(
            "  round {round}: right after {now:7.1} MiB, 2 s later {settled:7.1} MiB  (slowest call {:.0} ms)",
            slowest.as_secs_f64() * 1e3
        );
    }
    let peak = status_mib(pid, "VmHWM:");
    println!("  peak (VmHWM)            {peak:7.1} MiB");
    for r in 0..rounds {
        let f = ws.path().join(format!("r{}_0.txt", r + 1));
        assert_eq!(std::fs::metadata(f).unwrap().len() as usize, mib << 20);
    }
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
    Run { rest, after, peak }
}

#[tokio::main]
async fn main() {
    let mib: usize = std::env::var("OMICOS_RSS_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let rounds: usize = std::env::var("OMICOS_RSS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("tool-runner RSS: 4 parallel file_manager__write of {mib} MiB each, {rounds} rounds");
    let base = measure(mib, rounds, true).await;
    let ours = measure(mib, rounds, false).await;
    let kept = |r: &Run| r.after.last().unwrap() - r.rest;
    println!(
        "kept after the last round: {:+.1} MiB with glibc defaults, {:+.1} MiB as shipped; peak {:.0} vs {:.0} MiB",
        kept(&base),
        kept(&ours),
        base.peak,
        ours.peak
    );
}
