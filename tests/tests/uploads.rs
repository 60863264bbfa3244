//! Files attached to a message (issue 42), through a real stack (SQLite
//! store, real runner): UploadFiles writes them into the caller's workspace
//! under `uploads/`, the message the model gets names them, and the agent's
//! file tool reads them back. Another principal, hostile names, sizes over
//! the limits and name clashes are refused or renamed, and write nothing
//! they should not.

use omicos_e2e::fake_llm::user_messages;
use omicos_e2e::stack::{ChatHandle, client_with, finished_calls};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_orchestrator::service::uploads::ATTACHED_FILES;
use omicos_proto::{Attachment, ChatRequest, UploadFile, UploadFilesRequest};
use serde_json::json;
use tonic::Code;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abcdef";

async fn stack(script: Vec<Reply>, max_file_bytes: u64) -> Stack {
    Stack::start(
        FakeLlm::start(script).await,
        StackOptions {
            tweak: Some(Box::new(move |c| {
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
                c.uploads.max_file_bytes = max_file_bytes;
            })),
            ..Default::default()
        },
    )
    .await
}

fn upload(session: &str, files: &[(&str, &[u8])]) -> UploadFilesRequest {
    UploadFilesRequest {
        session_id: session.into(),
        files: files
            .iter()
            .map(|(n, c)| UploadFile {
                name: (*n).into(),
                content: c.to_vec(),
            })
            .collect(),
    }
}

/// Every file under `dir`, workspace-relative, sorted.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(root, &e.path(), out);
            } else if t.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push(rel);
            }
        }
    }
    let mut out = vec![];
    walk(dir, dir, &mut out);
    // The store's own files change with every request; they are not uploads.
    out.retain(|p| !p.contains("sessions.db"));
    out.sort();
    out
}

/// The one directory under `root` that holds `rel`.
fn workspace_holding(root: &std::path::Path, rel: &str) -> std::path::PathBuf {
    let found: Vec<_> = files_under(root)
        .into_iter()
        .filter(|p| p.ends_with(rel))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    root.join(found[0].strip_suffix(rel).unwrap())
}

#[tokio::test]
async fn an_attached_file_reaches_the_model_and_its_tools_byte_exact() {
    let csv = "city,temp\nOslo,-3\nLisboa,17\nnaïve ✓\n";
    let stack = stack(
        vec![
            Reply::Tools(
                String::new(),
                vec![(
                    "c1".into(),
                    "file_manager__read".into(),
                    json!({"path": "uploads/data.csv"}).to_string(),
                )],
            ),
            Reply::Text("Lisboa is warmer.".into()),
        ],
        25 << 20,
    )
    .await;
    let url = stack.orchestrator.clone();
    let mut c = client_with(&url, ALICE).await;
    // No session yet: the files go to the workspace the new session works in.
    let up = c
        .upload_files(upload("", &[("data.csv", csv.as_bytes())]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(up.files.len(), 1);
    assert_eq!(up.files[0].path, "uploads/data.csv");
    assert_eq!(up.files[0].size_bytes, csv.len() as u64);
    // The caller's workspace: the tenant's folder when the runner keeps
    // tenants apart, the root otherwise; the file tools read the same one.
    let ws = workspace_holding(&stack.workspace, "uploads/data.csv");
    assert_eq!(
        std::fs::read(ws.join("uploads/data.csv")).unwrap(),
        csv.as_bytes()
    );

    let mut h = ChatHandle::open(
        client_with(&url, ALICE).await,
        ChatRequest {
            message: "Which city is warmer?".into(),
            permission_mode: "full".into(),
            attachments: up
                .files
                .iter()
                .map(|f| Attachment {
                    path: f.path.clone(),
                    size_bytes: f.size_bytes,
                })
                .collect(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let events = h.until_done().await;
    let reqs = stack.llm.requests();
    let first = user_messages(&reqs[0].body).join("\n");
    assert!(
        first.contains(&format!(
            "{ATTACHED_FILES} uploads/data.csv ({} bytes)",
            csv.len()
        )),
        "{first}"
    );
    assert!(first.starts_with("Which city is warmer?"), "{first}");
    let read = finished_calls(&events);
    assert_eq!(read.len(), 1, "{read:?}");
    for line in csv.lines() {
        assert!(read[0].result.contains(line), "{line}: {}", read[0].result);
    }
    stack.llm.assert_invariants();

    // A later upload into the now named session, with a clash: the first
    // file is kept, the new one is numbered.
    let sid = events[0].session_id.clone();
    // The session is named by what was typed, not by the attachment line.
    let listed = c
        .list_sessions(omicos_proto::ListSessionsRequest { limit: 10 })
        .await
        .unwrap()
        .into_inner();
    let title = listed
        .sessions
        .iter()
        .find(|s| s.session_id == sid)
        .map(|s| s.title.as_str());
    assert_eq!(title, Some("Which city is warmer?"));
    let again = c
        .upload_files(upload(&sid, &[("data.csv", b"second")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.files[0].path, "uploads/data (1).csv");
    assert_eq!(
        std::fs::read(ws.join("uploads/data.csv")).unwrap(),
        csv.as_bytes()
    );
    assert_eq!(
        std::fs::read(ws.join("uploads/data (1).csv")).unwrap(),
        b"second"
    );
    // Two of the same name in one request: two files.
    let two = c
        .upload_files(upload(&sid, &[("b.bin", &[0, 255]), ("b.bin", &[1])]))
        .await
        .unwrap()
        .into_inner();
    let paths: Vec<_> = two.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["uploads/b.bin", "uploads/b (1).bin"]);
    assert_eq!(std::fs::read(ws.join("uploads/b.bin")).unwrap(), [0, 255]);
}

#[tokio::test]
async fn other_principals_hostile_names_and_big_files_write_nothing() {
    let stack = stack(vec![Reply::Text("hello".into()); 4], 1024).await;
    let url = stack.orchestrator.clone();
    let mut h = ChatHandle::open(
        client_with(&url, ALICE).await,
        ChatRequest {
            message: "hi".into(),
            permission_mode: "full".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let sid = h.until_done().await[0].session_id.clone();
    let root = stack.workspace.clone();
    let before = files_under(&root);

    // bob (same tenant) and mallory (another) on alice's session: as if it
    // did not exist, and nothing written.
    for token in [BOB, MALLORY] {
        let e = client_with(&url, token)
            .await
            .upload_files(upload(&sid, &[("x.txt", b"intruder")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert_eq!(
            e.metadata().get(ERROR_KIND_METADATA).unwrap(),
            "session_not_found"
        );
    }

    let mut alice = client_with(&url, ALICE).await;
    let long = "n".repeat(300);
    for bad in [
        "../x",
        "/etc/passwd",
        ".omicos/token",
        "a/../../b",
        "a\0b",
        long.as_str(),
        "..",
        "",
    ] {
        // A good file first: a refused request writes nothing at all.
        let e = alice
            .upload_files(upload(&sid, &[("ok.txt", b"fine"), (bad, b"evil")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(e.message().starts_with("the file name"), "{}", e.message());
    }

    // Over the per-file limit (1 KiB here): a sentence with both sizes.
    let e = alice
        .upload_files(upload(
            &sid,
            &[("ok.txt", b"fine"), ("big.bin", &[7u8; 2048])],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.message(),
        "big.bin is 2 KB; the limit is 1 KB (uploads.max_file_bytes). Nothing was written"
    );
    assert_eq!(
        e.metadata().get(ERROR_KIND_METADATA).unwrap(),
        "upload_too_large"
    );
    assert_eq!(files_under(&root), before, "nothing was written anywhere");
    assert!(!root.parent().unwrap().join("x").exists());
    assert_eq!(stack.llm.requests().len(), 1, "the model was not called");
}

#[tokio::test]
async fn over_the_workspace_disk_bound_nothing_is_written() {
    let stack = Stack::start(
        FakeLlm::start(vec![]).await,
        StackOptions {
            // Far below the upload (omicos's own state under .omicos, the
            // store among it, is not counted: see the test below).
            runner_overrides: json!({"sandbox": {"session_limits": {"workspace_bytes": 16 << 20}}}),
            ..Default::default()
        },
    )
    .await;
    let mut c = stack.client().await;
    let e = c
        .upload_files(upload("", &[("a.bin", &vec![1u8; 20 << 20])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("workspace_bytes"), "{}", e.message());
    assert!(!stack.workspace.join("uploads/a.bin").exists());
    // Under it: written.
    let ok = c
        .upload_files(upload("", &[("a.bin", &[1u8; 1024])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.files[0].path, "uploads/a.bin");
}

/// The bound is the agent's write budget: the session store under
/// `.omicos/`, grown past it by real chats, does not count, so a small
/// upload still fits and a big one is still refused by what it adds.
#[tokio::test]
async fn a_store_grown_past_the_bound_leaves_uploads_their_budget() {
    const BOUND: u64 = 16 << 20;
    // One long answer, streamed: the store (message, event log, WAL) grows
    // far past the bound with it.
    let answer = "7".repeat(128 << 10);
    let stack = Stack::start(
        FakeLlm::start(vec![Reply::Text(answer)]).await,
        StackOptions {
            runner_overrides: json!({"sandbox": {"session_limits": {"workspace_bytes": BOUND}}}),
            ..Default::default()
        },
    )
    .await;
    let mut h = stack
        .chat(ChatRequest {
            message: "a long answer, please".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    h.until_done().await;
    let state = stack.workspace.join(".omicos");
    let files: Vec<(&str, u64)> = ["sessions.db", "sessions.db-wal", "sessions.db-shm"]
        .into_iter()
        .filter_map(|f| Some((f, std::fs::metadata(state.join(f)).ok()?.len())))
        .collect();
    let store: u64 = files.iter().map(|(_, n)| n).sum();
    assert!(store > BOUND, "the store is not past the bound: {files:?}");
    assert!(
        omicos_sandbox::disk_usage(&stack.workspace) > BOUND,
        "the whole workspace is past the bound"
    );
    let mut c = stack.client().await;
    let ok = c
        .upload_files(upload("", &[("one.bin", &vec![3u8; 1 << 20])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.files[0].path, "uploads/one.bin");
    assert_eq!(
        std::fs::read(stack.workspace.join("uploads/one.bin"))
            .unwrap()
            .len(),
        1 << 20
    );
    // What the agent's workspace would then hold past the bound: refused.
    let e = c
        .upload_files(upload("", &[("big.bin", &vec![4u8; 16 << 20])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("workspace_bytes"), "{}", e.message());
    assert!(!stack.workspace.join("uploads/big.bin").exists());
}
