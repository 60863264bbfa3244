//! What a PreToolUse hook adds to a tool call, in one run: a no-op
//! in-process tool through the full pipeline (a) without hooks, (b) with one
//! `command` hook running a trivial script, (c) with one `http` hook against
//! a local axum server. The handler's own time is measured beside them the
//! same way, in the same rounds: the script spawned directly (`sh -c`, the
//! payload on stdin, output read back) and the server asked by a bare
//! reqwest POST. What the hook layer adds is then (b − a) − script and
//! (c − a) − server, at p50.
//!
//! Run: `cargo bench -p omicos-tool-runner --bench hooks` (release build).
//! `BENCH_ROUNDS` (default 20) × `BENCH_PER_ROUND` (default 25) calls a path.

use async_trait::async_trait;
use omicos_proto::ToolSpec;
use omicos_tool_runner::config::{HookHandler, HookMatcher, HooksConfig};
use omicos_tool_runner::{CallIo, CallRequest, Config, Pipeline, Registry};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

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
                json!({"type":"object","properties":{"x":{"type":"integer"}}}),
            )
            .build(),
        ]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(Value::String("ok".into()))
    }
}

/// What both hooks answer: Claude Code's PreToolUse allow.
const ALLOW: &str =
    r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow"}}"#;

fn request(i: usize) -> CallRequest {
    CallRequest {
        call_id: format!("call_{i}"),
        tool_name: "noop".into(),
        arguments: r#"{"x":1}"#.into(),
        session_id: "bench".into(),
        agent_id: "bench".into(),
        permission_mode: omicos_proto::PermissionMode::Full as i32,
        ..Default::default()
    }
}

fn pipeline(ws: &std::path::Path, hook: Option<HookHandler>) -> Pipeline {
    let mut cfg = Config {
        workspace: ws.to_path_buf(),
        ..Config::default()
    };
    if let Some(h) = hook {
        cfg.hooks = HooksConfig {
            pre_tool_use: vec![HookMatcher {
                matcher: "noop".into(),
                hooks: vec![h],
            }],
            ..Default::default()
        };
    }
    let provider: Arc<dyn Provider> = Arc::new(Noop);
    Pipeline::new(
        &cfg,
        Arc::new(Registry::new(Duration::from_secs(30))),
        vec![provider],
    )
    .unwrap()
}

async fn call(p: &Pipeline, i: usize, hooks: usize) -> Duration {
    let s = Instant::now();
    let o = p.execute(request(i), CallIo::detached()).await;
    let d = s.elapsed();
    assert_eq!(o.result.status().as_str(), "done", "{}", o.result.result);
    assert_eq!(o.record.hooks.len(), hooks, "{:?}", o.record.hooks);
    assert!(
        o.record.hooks.iter().all(|h| h.message.is_empty()),
        "{:?}",
        o.record.hooks
    );
    d
}

/// The script run as the hook layer runs it, without the layer.
async fn spawn_script(script: &str, cwd: &std::path::Path, payload: &[u8]) -> Duration {
    let s = Instant::now();
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let bytes = payload.to_vec();
    tokio::spawn(async move {
        let _ = stdin.write_all(&bytes).await;
        let _ = stdin.shutdown().await;
    });
    let out = child.wait_with_output().await.unwrap();
    let d = s.elapsed();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("allow"));
    d
}

async fn post(client: &reqwest::Client, url: &str, payload: &[u8]) -> Duration {
    let s = Instant::now();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(payload.to_vec())
        .send()
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    let d = s.elapsed();
    assert!(body.contains("allow"));
    d
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let script = dir.path().join("allow.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\ncat >/dev/null\necho '{ALLOW}'\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = script.display().to_string();

        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|body: axum::body::Bytes| async move {
                std::hint::black_box(body);
                ([("content-type", "application/json")], ALLOW)
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });

        let none = pipeline(&ws, None);
        let command = pipeline(&ws, Some(HookHandler::command(script.clone())));
        let http = pipeline(&ws, Some(HookHandler::http(url.clone())));
        // The payload the hooks get, for the bare runs.
        let payload = json!({
            "session_id": "bench", "transcript_path": "", "cwd": ws.display().to_string(),
            "permission_mode": "full", "hook_event_name": "PreToolUse", "tool_name": "noop",
            "tool_input": {"x": 1}, "tool_use_id": "call_0",
        })
        .to_string()
        .into_bytes();
        let client = reqwest::Client::new();

        let (rounds, per) = (env("BENCH_ROUNDS", 20), env("BENCH_PER_ROUND", 25));
        // Warm up every path (schema compiled, connections open, page cache warm).
        for i in 0..20 {
            call(&none, i, 0).await;
            call(&command, i, 1).await;
            call(&http, i, 1).await;
            spawn_script(&script, &ws, &payload).await;
            post(&client, &url, &payload).await;
        }
        let (mut a, mut b, mut s, mut c, mut h) = (vec![], vec![], vec![], vec![], vec![]);
        let started = Instant::now();
        // Interleaved rounds, so that every path sees the same machine state.
        for r in 0..rounds {
            for i in 0..per {
                let n = r * per + i;
                a.push(call(&none, n, 0).await);
                b.push(call(&command, n, 1).await);
                s.push(spawn_script(&script, &ws, &payload).await);
                c.push(call(&http, n, 1).await);
                h.push(post(&client, &url, &payload).await);
            }
        }
        let n = a.len();
        let (a, b, s, c, h) = (p50(a), p50(b), p50(s), p50(c), p50(h));
        let added_cmd = ms(b) - ms(a) - ms(s);
        let added_http = ms(c) - ms(a) - ms(h);
        println!(
            "PreToolUse hook cost, {n} calls a path in {rounds} interleaved rounds ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        println!("| path | p50 ms |");
        println!("|---|---:|");
        println!("| (a) pipeline, no hooks | {:.3} |", ms(a));
        println!("| (b) pipeline + command hook | {:.3} |", ms(b));
        println!(
            "|     the script alone (sh -c, stdin, stdout) | {:.3} |",
            ms(s)
        );
        println!("| (c) pipeline + http hook | {:.3} |", ms(c));
        println!(
            "|     the server alone (bare reqwest POST) | {:.3} |",
            ms(h)
        );
        let verdict = |added: f64, target: f64| if added < target { "met" } else { "MISSED" };
        println!(
            "command hook adds (b − a) − script = {added_cmd:.3} ms p50 (target < 5 ms: {})",
            verdict(added_cmd, 5.0)
        );
        println!(
            "http hook adds (c − a) − server = {added_http:.3} ms p50 (target < 2 ms: {})",
            verdict(added_http, 2.0)
        );
    });
}
