//! Shared test setup: the interpreter with ipykernel, providers, calls.
#![allow(dead_code)]

use omicos_kernel::{KernelConfig, KernelProvider};
use omicos_toolkit::{CallCtx, EventSink, Provider, ProviderEvent, ToolError};
use serde_json::Value;
use std::{path::PathBuf, sync::Arc};
use tokio::sync::mpsc;

/// The interpreter the tests run kernels on: OMICOS_KERNEL_PYTHON, else the
/// repo's .venv. Fails clearly when it lacks ipykernel.
pub fn python() -> String {
    let py = std::env::var("OMICOS_KERNEL_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            // Resolved: a box sees the venv, not the path through services/kernel/..
            let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .canonicalize()
                .expect("the repository root");
            repo.join(".venv/bin/python3").display().to_string()
        });
    let ok = std::process::Command::new(&py)
        .args(["-c", "import ipykernel"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{py} cannot import ipykernel. Run the README's setup first: `python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` \
         at the repository root (or set OMICOS_KERNEL_PYTHON to an interpreter with ipykernel)"
    );
    py
}

/// Test config: small timeouts, the test interpreter.
pub fn config(pool_size: usize) -> KernelConfig {
    KernelConfig {
        python: python(),
        pool_size,
        timeout: std::time::Duration::from_secs(30),
        interrupt_grace: std::time::Duration::from_secs(1),
        heartbeat_interval: std::time::Duration::from_secs(1),
        ..Default::default()
    }
}

/// A workspace and a provider over it.
pub fn provider(cfg: KernelConfig) -> (tempfile::TempDir, Arc<KernelProvider>) {
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    let p = KernelProvider::new(cfg, ws_path, vec![]).unwrap();
    (ws, p)
}

/// A call context for `session` in `ws`, with its events collected.
pub fn ctx(ws: &tempfile::TempDir, session: &str) -> (CallCtx, mpsc::Receiver<ProviderEvent>) {
    let (tx, rx) = mpsc::channel(10_000);
    let mut c = CallCtx::for_test(ws.path().canonicalize().unwrap(), session);
    c.events = EventSink::new(tx);
    (c, rx)
}

/// Runs code in `session`.
pub async fn run(
    p: &KernelProvider,
    ws: &tempfile::TempDir,
    session: &str,
    code: &str,
) -> Result<Value, ToolError> {
    let (c, _rx) = ctx(ws, session);
    call(p, "run_python_code", serde_json::json!({"code": code}), c).await
}

/// Validates then calls, as the runner does.
pub async fn call(
    p: &KernelProvider,
    tool: &str,
    args: Value,
    c: CallCtx,
) -> Result<Value, ToolError> {
    p.validate_input(tool, &args, &c)?;
    p.call(tool, args, c).await
}

/// The text/plain of the last expression.
pub fn value(r: &Value) -> String {
    r["execute_result"]["text/plain"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Drains collected events.
pub fn events(rx: &mut mpsc::Receiver<ProviderEvent>) -> Vec<ProviderEvent> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}
