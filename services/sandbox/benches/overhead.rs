//! The sandbox's cost per shell call: `bash -lc true` as the shell tool runs
//! it (stdout and stderr piped, waited for, then everything it started
//! ended), unconfined and in a session's box, in one run; each iteration
//! runs both in a shuffled order. Also the cost of a session's first call,
//! which builds its box. Prints p50/p90 and the overhead against the
//! baseline.
//!
//! `cargo bench -p omicos-sandbox` (OMICOS_BENCH_ITERS to change the count).

use omicos_sandbox::{Command, Placement, Sandbox, SandboxConfig, SandboxPolicy, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The unconfined baseline: a plain spawn in a process group of its own,
/// with the same small environment and piped output.
async fn unconfined(ws: &std::path::Path) {
    let mut c = tokio::process::Command::new("bash");
    c.args(["-lc", "true"])
        .current_dir(ws)
        .env_clear()
        .env("PATH", omicos_sandbox::config::DEFAULT_PATH)
        .env("HOME", "/tmp")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = c.spawn().expect("bash runs");
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let mut sink = Vec::new();
    out.read_to_end(&mut sink).await.expect("read");
    err.read_to_end(&mut sink).await.expect("read");
    let s = child.wait().await.expect("wait");
    assert!(s.success());
}

async fn boxed(sandbox: &Sandbox, place: &Placement) {
    let mut cmd = Command::new("bash");
    cmd.args(["-lc", "true"])
        .stdout(Stdio::Piped)
        .stderr(Stdio::Piped);
    let mut p = sandbox.spawn(place, cmd).await.expect("boxed bash runs");
    let mut out = p.stdout.take().expect("piped");
    let mut err = p.stderr.take().expect("piped");
    let mut sink = Vec::new();
    out.read_to_end(&mut sink).await.expect("read");
    err.read_to_end(&mut sink).await.expect("read");
    let s = p.wait().await.expect("wait");
    assert!(s.success(), "{s:?}");
    p.end().await;
}

fn report(name: &str, v: &mut [Duration], base_p50: Duration) {
    let (p50, p90) = (pct(v, 0.5), pct(v, 0.9));
    println!(
        "{name:<34} p50 {:>7.3} ms  p90 {:>7.3} ms  overhead p50 {:>+7.3} ms  ratio {:.2}x",
        ms(p50),
        ms(p90),
        ms(p50) - ms(base_p50),
        p50.as_secs_f64() / base_p50.as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iters: usize = std::env::var("OMICOS_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    for l in &sandbox.report().lines {
        println!("{l}");
    }
    let place = Placement::new("bench", "s1", &ws, SandboxPolicy::WorkspaceWrite);
    // Warm-up: the session's box is built by its first call.
    boxed(&sandbox, &place).await;
    unconfined(&ws).await;
    let (mut base, mut inbox) = (Vec::new(), Vec::new());
    for i in 0..iters {
        let order = i % 2 == 0;
        for first in [order, !order] {
            let t = Instant::now();
            if first {
                unconfined(&ws).await;
                base.push(t.elapsed());
            } else {
                boxed(&sandbox, &place).await;
                inbox.push(t.elapsed());
            }
        }
    }
    let base_p50 = pct(&mut base, 0.5);
    println!("\nbash -lc true, {iters} iterations each, interleaved:");
    report("unconfined spawn (baseline)", &mut base, base_p50);
    report("in the session's box", &mut inbox, base_p50);
    // A session's first call builds its box (namespaces, view, cgroup).
    let firsts = (iters / 10).max(10);
    let mut first = Vec::new();
    for i in 0..firsts {
        let place = Placement::new(
            "bench",
            format!("new-{i}"),
            &ws,
            SandboxPolicy::WorkspaceWrite,
        );
        let t = Instant::now();
        boxed(&sandbox, &place).await;
        first.push(t.elapsed());
        sandbox.end_session("bench", &format!("new-{i}"));
    }
    println!("\na session's first call (builds its box), {firsts} sessions:");
    report("first call of a session", &mut first, base_p50);
}
