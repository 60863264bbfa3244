//! Kernel bench (release: `cargo bench -p omicos-kernel`):
//! 1. `1+1` through run_python_code over gRPC (one hop: provider; two hops:
//!    a relay provider in front, standing in for the tool-runner), against
//!    jupyter_client's blocking client on the same kind of kernel, in one run;
//! 2. a new session's first call with the warm pool, against a cold start.

use omicos_kernel::{KernelConfig, KernelProvider};
use omicos_toolkit::{CallCtx, Provider, ProviderHosting, remote::RemoteProvider, serve_provider};
use serde_json::json;
use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

fn python() -> String {
    let py = std::env::var("OMICOS_KERNEL_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../.venv/bin/python3")
                .display()
                .to_string()
        });
    let ok = std::process::Command::new(&py)
        .args(["-c", "import ipykernel, jupyter_client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{py} lacks ipykernel/jupyter_client: run `python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` at the repo root"
    );
    py
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

async fn serve<P: Provider>(
    p: Arc<P>,
    ws: &std::path::Path,
) -> (String, omicos_servicekit::Shutdown) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sd = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: ws.to_path_buf(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(p, listener, hosting, sd.clone()));
    (format!("http://{addr}"), sd)
}

async fn round_trips<P: Provider>(
    p: &P,
    ws: &std::path::Path,
    session: &str,
    n: usize,
) -> Vec<f64> {
    for _ in 0..50 {
        p.call(
            "run_python_code",
            json!({"code": "1+1"}),
            CallCtx::for_test(ws, session),
        )
        .await
        .expect("warm-up call");
    }
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        let r = p
            .call(
                "run_python_code",
                json!({"code": "1+1"}),
                CallCtx::for_test(ws, session),
            )
            .await
            .expect("call");
        t.push(s.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r["execute_result"]["text/plain"], "2");
    }
    t
}

fn baseline(py: &str, transport: &str, n: usize) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/jupyter_client_bench.py");
    let out = std::process::Command::new(py)
        .arg(&script)
        .arg(transport)
        .arg(n.to_string())
        .output()
        .expect("run the baseline");
    assert!(
        out.status.success(),
        "baseline failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("{}")
            .as_bytes(),
    )
    .expect("baseline JSON")
}

/// A new session's first call `1+1`, `rounds` times: from the warm pool,
/// then with a cold kernel start (ms each).
async fn first_calls(
    cfg: &KernelConfig,
    ws: &std::path::Path,
    rounds: usize,
) -> (Vec<f64>, Vec<f64>) {
    let ws = ws.to_path_buf();
    let warm_p = KernelProvider::new(cfg.clone(), ws.clone(), vec![]).expect("provider");
    let mut warm = Vec::new();
    for i in 0..rounds {
        let deadline = Instant::now() + Duration::from_secs(60);
        while warm_p.kernels().warm_count() < 1 {
            assert!(Instant::now() < deadline, "pool did not refill");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = Instant::now();
        warm_p
            .call(
                "run_python_code",
                json!({"code": "1+1"}),
                CallCtx::for_test(&ws, &format!("warm{i}")),
            )
            .await
            .expect("call");
        warm.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    warm_p.close().await;
    let cold_p = KernelProvider::new(
        KernelConfig {
            pool_size: 0,
            ..cfg.clone()
        },
        ws.clone(),
        vec![],
    )
    .expect("provider");
    let mut cold = Vec::new();
    for i in 0..rounds {
        let s = Instant::now();
        cold_p
            .call(
                "run_python_code",
                json!({"code": "1+1"}),
                CallCtx::for_test(&ws, &format!("cold{i}")),
            )
            .await
            .expect("call");
        cold.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    cold_p.close().await;
    (warm, cold)
}

#[tokio::main]
async fn main() {
    let py = python();
    let n = 300;
    let ws = tempfile::tempdir().expect("tempdir");
    let ws = ws.path().canonicalize().expect("ws");
    let cfg = KernelConfig {
        python: py.clone(),
        pool_size: 1,
        ..Default::default()
    };

    // 1. Round trip of `1+1`.
    let provider = KernelProvider::new(cfg.clone(), ws.clone(), vec![]).expect("provider");
    let inproc = round_trips(provider.as_ref(), &ws, "inproc", n).await;
    let (ep1, sd1) = serve(provider.clone(), &ws).await;
    let hop1 = RemoteProvider::connect(&ep1).await.expect("connect");
    let one_hop = round_trips(&hop1, &ws, "onehop", n).await;
    // A relay in front of the provider: the hop the tool-runner adds.
    let (ep2, sd2) = serve(
        Arc::new(RemoteProvider::connect(&ep1).await.expect("connect")),
        &ws,
    )
    .await;
    let hop2 = RemoteProvider::connect(&ep2).await.expect("connect");
    let two_hops = round_trips(&hop2, &ws, "twohops", n).await;
    provider.close().await;
    sd1.trigger();
    sd2.trigger();
    let tcp = baseline(&py, "tcp", n);
    let ipc = baseline(&py, "ipc", n);
    let base = tcp["p50_ms"].as_f64().expect("p50");
    println!("## 1+1 round trip (n = {n}, p50 / p99 ms)");
    for (name, v) in [
        ("omicos in-process (no gRPC)", &inproc),
        ("omicos via gRPC, 1 hop", &one_hop),
        ("omicos via gRPC, 2 hops (relay)", &two_hops),
    ] {
        let p50 = pct(v.clone(), 0.5);
        println!(
            "{name:<38} {p50:7.2} / {:7.2}   ratio p50 vs jupyter_client tcp: {:.2}",
            pct(v.clone(), 0.99),
            p50 / base
        );
    }
    for b in [&tcp, &ipc] {
        println!(
            "{:<38} {:7.2} / {:7.2}",
            format!(
                "jupyter_client blocking, {}",
                b["transport"].as_str().unwrap_or("")
            ),
            b["p50_ms"].as_f64().unwrap_or(0.0),
            b["p99_ms"].as_f64().unwrap_or(0.0)
        );
    }

    // 2. A new session's first call: warm pool vs cold start, in the
    // session's box and unconfined (the kernel as it ran before the box),
    // rounds interleaved so both see the same machine.
    let rounds = 5;
    let unboxed_cfg = KernelConfig {
        sandbox: omicos_sandbox::SandboxConfig {
            policy: omicos_sandbox::SandboxPolicy::DangerFullAccess,
            ..cfg.sandbox.clone()
        },
        ..cfg.clone()
    };
    let (mut warm, mut cold, mut warm_u, mut cold_u) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (w, c) = first_calls(&cfg, &ws, 1).await;
        warm.extend(w);
        cold.extend(c);
        let (w, c) = first_calls(&unboxed_cfg, &ws, 1).await;
        warm_u.extend(w);
        cold_u.extend(c);
    }
    println!(
        "## first call of a new session, boxed against unconfined (n = {rounds}, p50 / max ms)"
    );
    for (name, v) in [
        ("warm pool, unconfined", &warm_u),
        ("cold kernel start, unconfined", &cold_u),
    ] {
        println!(
            "{name:<38} {:7.2} / {:7.2}",
            pct(v.clone(), 0.5),
            pct(v.clone(), 1.0)
        );
    }
    println!(
        "boxed/unconfined p50: warm {:.2}, cold {:.2}",
        pct(warm.clone(), 0.5) / pct(warm_u.clone(), 0.5),
        pct(cold.clone(), 0.5) / pct(cold_u.clone(), 0.5)
    );
    println!("## first call of a new session (n = {rounds}, p50 / max ms)");
    println!(
        "{:<38} {:7.2} / {:7.2}",
        "warm pool",
        pct(warm.clone(), 0.5),
        pct(warm.clone(), 1.0)
    );
    println!(
        "{:<38} {:7.2} / {:7.2}   ratio warm/cold p50: {:.3}",
        "cold kernel start",
        pct(cold.clone(), 0.5),
        pct(cold.clone(), 1.0),
        pct(warm, 0.5) / pct(cold, 0.5)
    );
}
