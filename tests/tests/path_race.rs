//! A file tool outside the box checks a path, then opens it (issue 39).
//! The session's box may still be running a background job that swaps a
//! directory of the workspace for a symlink in between (a symlink's target
//! is only text: the box need not see where it points). The write must
//! land where it was checked, or nowhere: never in another tenant's
//! workspace under `.omicos/tenants/`, nor in omicos's state, nor outside
//! the workspace.
//!
//! The box's job is played by a thread of the test doing exactly what a
//! process in the box can do to the workspace: rename, mkdir, symlink.

use omicos_e2e::stack::{ChatHandle, client_with, finished_calls};
use omicos_e2e::{FakeLlm, Stack, StackOptions, api_key};
use omicos_proto::ChatRequest;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const DORA: &str = "dora-key-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_directory_never_redirects_a_file_tool() {
    race(
        "file_manager__write",
        |n| json!({"path": format!("d/pwn{n}.txt"), "content": "planted"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_directory_never_redirects_a_notebook_edit() {
    race(
        "notebook__edit",
        |n| json!({"path": format!("d/pwn{n}.ipynb"), "action": "insert", "source": "planted"}),
    )
    .await;
}

/// `tool` called 300 times with `args(n)` while the box's job swaps `d`.
async fn race(tool: &str, args: impl Fn(usize) -> Value) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().canonicalize().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![])
        .await
        .with_responder(omicos_e2e::fake_llm::call_per_message());
    let kernel: Arc<dyn omicos_toolkit::Provider> = omicos_kernel::KernelProvider::new(
        omicos_kernel::KernelConfig {
            pool_size: 0,
            ..Default::default()
        },
        ws.clone(),
        vec![],
    )
    .expect("kernel provider");
    let stack = Stack::start(
        llm,
        StackOptions {
            workspace: Some(ws.clone()),
            providers: vec![kernel],
            runner_overrides: json!({"service_secret": "parts-secret-0123456789abcdef"}),
            tweak: Some(Box::new(|c| {
                c.service_secret = "parts-secret-0123456789abcdef".into();
                c.auth.api_keys = vec![api_key(DORA, "dora", "default", "full")];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    let acme = ws.join(".omicos/tenants/acme");
    std::fs::create_dir_all(&acme).unwrap();

    // The box's background job: `d` is a directory, then a link into
    // acme's workspace, then one out of the workspace, over and over.
    let stop = Arc::new(AtomicBool::new(false));
    let job = {
        let (stop, ws, out) = (stop.clone(), ws.clone(), outside.path().to_path_buf());
        std::thread::spawn(move || {
            let d = ws.join("d");
            let real = ws.join("d.real");
            std::fs::create_dir_all(&real).unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&d);
                let _ = std::fs::rename(&real, &d);
                std::thread::yield_now();
                let _ = std::fs::rename(&d, &real);
                let target = if i.is_multiple_of(2) {
                    std::path::PathBuf::from(".omicos/tenants/acme")
                } else {
                    out.clone()
                };
                let _ = std::os::unix::fs::symlink(&target, &d);
                std::thread::yield_now();
                i += 1;
            }
        })
    };

    let mut landed = 0;
    for n in 0..300 {
        let args = args(n);
        let mut h = ChatHandle::open(
            client_with(&url, DORA).await,
            ChatRequest {
                message: format!("CALL {tool} {args}"),
                permission_mode: "full".into(),
                ..Default::default()
            },
        )
        .await
        .expect("chat");
        let events = h.until_done().await;
        if finished_calls(&events)
            .first()
            .is_some_and(|c| c.status() == omicos_proto::ToolStatus::Done)
        {
            landed += 1;
        }
        let escaped: Vec<_> = [acme.as_path(), outside.path()]
            .iter()
            .flat_map(|dir| std::fs::read_dir(dir).unwrap().flatten())
            .map(|e| e.path().display().to_string())
            .filter(|p| p.contains("pwn"))
            .collect();
        if !escaped.is_empty() {
            stop.store(true, Ordering::Relaxed);
            job.join().unwrap();
            panic!("{tool}: after {n} calls a racing symlink redirected a write: {escaped:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    job.join().unwrap();
    // The race was run: some writes landed where they were checked.
    assert!(landed > 0, "{tool}: no write went through at all");
}
