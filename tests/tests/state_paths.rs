//! Tools that run outside the box and take a path (issue 39): `pdf__*`,
//! `notebook__*` and the shell's `workdir` are confined to the caller's
//! workspace, and, like the file tools, reach nothing of `.omicos/`,
//! omicos's own state. That is where other sessions' outputs lie, and, in
//! the default tenant's workspace, every other tenant's workspace
//! (`.omicos/tenants/<t>/`). A model (or what it read) names such a path
//! directly, or through a symlink its box planted; either way nothing is
//! read, nothing is written, and the refusal says why.
//!
//! dora is in the default tenant, alice and bob in `acme`.

use omicos_e2e::{FakeLlm, Stack, StackOptions, api_key};
use omicos_proto::ToolStatus;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;

const DORA: &str = "dora-key-0123456789abcdef";
const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";

/// The parts' service secret.
const SECRET_OF_THE_PARTS: &str = "parts-secret-0123456789abcdef";

/// What alice's notebook holds: never in another principal's result.
const SECRET: &str = "ALICE-NOTEBOOK-SECRET-41c7";

/// One call as `token` in a new session: (session, status, result).
async fn call(url: &str, token: &str, tool: &str, args: Value) -> (String, ToolStatus, String) {
    let (session, call) = omicos_e2e::stack::one_call(url, token, tool, &args).await;
    (session, call.status(), call.result)
}

fn notebook(secret: &str) -> String {
    json!({
        "cells": [{"cell_type": "code", "id": "a1", "metadata": {}, "execution_count": null,
                   "outputs": [], "source": [format!("token = '{secret}'")]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5
    })
    .to_string()
}

fn pdf_bytes() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../services/pdf/tests/data/replicate-design-note.pdf"),
    )
    .unwrap()
}

/// Every file under `dir` but its `.omicos/` (trajectories change with
/// every call), with its bytes; symlinks as their targets' text.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(d: &Path, top: bool, out: &mut Vec<(String, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.push((
                    p.display().to_string(),
                    target.display().to_string().into_bytes(),
                ));
            } else if t.is_dir() {
                if !(top && e.file_name() == ".omicos") {
                    walk(&p, false, out);
                }
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = vec![];
    walk(dir, true, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_tools_reach_no_state_and_no_other_tenant() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().canonicalize().unwrap();
    let llm = FakeLlm::start(vec![])
        .await
        .with_responder(omicos_e2e::fake_llm::call_per_message());
    let kernel = omicos_kernel::KernelProvider::new(
        omicos_kernel::KernelConfig {
            pool_size: 0,
            ..Default::default()
        },
        ws.clone(),
        vec![],
    )
    .expect("kernel provider");
    let kernel: Arc<dyn omicos_toolkit::Provider> = kernel;
    let pdf: Arc<dyn omicos_toolkit::Provider> =
        Arc::new(omicos_pdf::PdfProvider::new(omicos_pdf::Config::default()));
    let stack = Stack::start(
        llm,
        StackOptions {
            workspace: Some(ws.clone()),
            providers: vec![pdf, kernel],
            // As `omicos up` and deploy/ configure them: the runner takes
            // the tenant only from an authenticated orchestrator.
            runner_overrides: json!({"service_secret": SECRET_OF_THE_PARTS}),
            tweak: Some(Box::new(|c| {
                c.service_secret = SECRET_OF_THE_PARTS.into();
                c.auth.api_keys = vec![
                    api_key(DORA, "dora", "default", "full"),
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();

    // alice's files: a notebook and a PDF in acme's workspace, and a PDF
    // among the outputs of one of her sessions.
    let (alice_sid, status, own) = call(
        &url,
        ALICE,
        "notebook__edit",
        json!({"path": "mine.ipynb", "action": "insert", "source": "1"}),
    )
    .await;
    assert_eq!(
        status,
        ToolStatus::Done,
        "alice edits her own notebook: {own}"
    );
    let acme = ws.join(".omicos/tenants/acme");
    std::fs::write(acme.join("analysis.ipynb"), notebook(SECRET)).unwrap();
    std::fs::write(acme.join("contract.pdf"), pdf_bytes()).unwrap();
    let outputs = acme.join(".omicos/outputs").join(&alice_sid);
    std::fs::create_dir_all(&outputs).unwrap();
    std::fs::write(outputs.join("report.pdf"), pdf_bytes()).unwrap();
    std::fs::write(outputs.join("cells.ipynb"), notebook(SECRET)).unwrap();
    // What alice reads of her own PDF: what no one else may read.
    let (_, status, alice_pdf) = call(
        &url,
        ALICE,
        "pdf__read",
        json!({"path": "contract.pdf", "pages": "1"}),
    )
    .await;
    assert_eq!(status, ToolStatus::Done, "{alice_pdf}");
    let (_, _, inspected) = call(
        &url,
        ALICE,
        "notebook__inspect",
        json!({"path": "analysis.ipynb"}),
    )
    .await;
    assert!(inspected.contains(SECRET), "{inspected}");
    let marker: String = serde_json::from_str::<Value>(&alice_pdf)
        .ok()
        .and_then(|v| v["text"].as_str().map(str::to_owned))
        .unwrap_or(alice_pdf.clone())
        .split_whitespace()
        .filter(|w| w.len() > 6)
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!marker.is_empty(), "{alice_pdf}");
    let first_word = marker.split(' ').next().unwrap().to_owned();

    // Links a box could plant in the shared default workspace (a symlink's
    // target is only text: the box need not see it).
    std::os::unix::fs::symlink(".omicos/tenants/acme/analysis.ipynb", ws.join("link.ipynb"))
        .unwrap();
    std::os::unix::fs::symlink(".omicos/tenants/acme/contract.pdf", ws.join("link.pdf")).unwrap();
    // And in acme's workspace, towards alice's session outputs.
    std::os::unix::fs::symlink(
        format!(".omicos/outputs/{alice_sid}/cells.ipynb"),
        acme.join("theirs.ipynb"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        format!(".omicos/outputs/{alice_sid}/report.pdf"),
        acme.join("theirs.pdf"),
    )
    .unwrap();

    let before = tree(&acme);
    let outputs_before = tree(&outputs);
    let attempts: Vec<(&str, &str, Value)> = vec![
        // dora, from the default tenant, into acme's workspace.
        (
            "dora",
            "pdf__read",
            json!({"path": ".omicos/tenants/acme/contract.pdf"}),
        ),
        (
            "dora",
            "pdf__info",
            json!({"path": ".omicos/tenants/acme/contract.pdf"}),
        ),
        ("dora", "pdf__read", json!({"path": "link.pdf"})),
        (
            "dora",
            "notebook__inspect",
            json!({"path": ".omicos/tenants/acme/analysis.ipynb"}),
        ),
        ("dora", "notebook__inspect", json!({"path": "link.ipynb"})),
        (
            "dora",
            "notebook__edit",
            json!({"path": ".omicos/tenants/acme/analysis.ipynb", "action": "insert", "source": "pwned = 1"}),
        ),
        (
            "dora",
            "notebook__edit",
            json!({"path": ".omicos/tenants/acme/new.ipynb", "action": "insert", "source": "x"}),
        ),
        (
            "dora",
            "notebook__edit",
            json!({"path": "link.ipynb", "action": "insert", "source": "pwned = 2"}),
        ),
        (
            "dora",
            "shell",
            json!({"command": "cat analysis.ipynb", "workdir": ".omicos/tenants/acme"}),
        ),
        // bob, in alice's tenant, into her session's outputs.
        (
            "bob",
            "pdf__read",
            json!({"path": format!(".omicos/outputs/{alice_sid}/report.pdf")}),
        ),
        ("bob", "pdf__read", json!({"path": "theirs.pdf"})),
        (
            "bob",
            "notebook__inspect",
            json!({"path": format!(".omicos/outputs/{alice_sid}/cells.ipynb")}),
        ),
        ("bob", "notebook__inspect", json!({"path": "theirs.ipynb"})),
        (
            "bob",
            "notebook__edit",
            json!({"path": format!(".omicos/outputs/{alice_sid}/evil.ipynb"), "action": "insert", "source": "x"}),
        ),
        (
            "bob",
            "notebook__edit",
            json!({"path": ".omicos/agents/evil.ipynb", "action": "insert", "source": "x"}),
        ),
        (
            "bob",
            "notebook__edit",
            json!({"path": "theirs.ipynb", "action": "insert", "source": "pwned = 3"}),
        ),
    ];
    for (who, tool, args) in attempts {
        let token = if who == "dora" { DORA } else { BOB };
        let (_, status, result) = call(&url, token, tool, args.clone()).await;
        assert_eq!(status, ToolStatus::Error, "{who} {tool} {args}: {result}");
        assert!(
            !result.contains(SECRET) && !result.contains(&first_word),
            "{who} {tool} {args} read another's file: {result}"
        );
        assert!(
            result.contains(".omicos/"),
            "{who} {tool} {args}: the refusal says why: {result}"
        );
    }
    // Nothing was written: acme's workspace and alice's state are as they were.
    assert_eq!(tree(&acme), before, "acme's workspace changed");
    assert_eq!(tree(&outputs), outputs_before, "alice's outputs changed");
    assert!(!ws.join(".omicos/tenants/acme/new.ipynb").exists());
    assert!(!acme.join(".omicos/agents/evil.ipynb").exists());
    // alice still reads hers.
    let (_, status, again) = call(
        &url,
        ALICE,
        "notebook__inspect",
        json!({"path": "analysis.ipynb"}),
    )
    .await;
    assert_eq!(status, ToolStatus::Done, "{again}");
}
