//! Produces the stored-history fixture (`services/history/tests/fixtures/stored_rows.jsonl`):
//! a real conversation on SQLite that leaves every kind of row the engine
//! writes (user, assistant with usage and tool calls, tool results with and
//! without `spool_path`, an interrupted assistant, a compaction marker).
//!
//! Ignored: it is run by hand, on the code whose rows the fixture keeps.
//! `HISTORY_ROWS_DB=/tmp/rows.db cargo nextest run -p omicos-e2e --run-ignored only -E 'binary(history_rows)'`,
//! then `sqlite3 /tmp/rows.db "SELECT body FROM session_messages ORDER BY session_id, idx"`.

use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::{ChatRequest, CompactRequest, chat_event};
use std::time::Duration;

fn req(session: &str, message: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "writes the fixture's database; run by hand"]
async fn a_conversation_leaves_every_kind_of_row() {
    let Ok(db) = std::env::var("HISTORY_ROWS_DB") else {
        eprintln!("HISTORY_ROWS_DB not set: nothing to write");
        return;
    };
    let long: String = (0..80).map(|i| format!("w{i} ")).collect();
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            "Writing the notes, then reading the data.".into(),
            vec![
                (
                    "call_w1".into(),
                    "file_manager__write".into(),
                    r#"{"path":"notes/a.txt","content":"kiwi ünïcode 🙂"}"#.into(),
                ),
                (
                    "call_r1".into(),
                    "file_manager__read".into(),
                    r#"{"path":"big.txt"}"#.into(),
                ),
                // Past the runner's spool threshold: the row names the spool file.
                (
                    "call_s1".into(),
                    "shell".into(),
                    r#"{"command":"seq 1 6000"}"#.into(),
                ),
            ],
        ),
        Reply::Text("Wrote notes/a.txt and read big.txt (40 KB of rows).".into()),
        Reply::Slow(long, Duration::from_millis(25)),
        Reply::Text("SUMMARY: the user had notes written and big.txt read.".into()),
        Reply::Text("Picking up after the summary.".into()),
    ])
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let big: String = (0..2000).map(|i| format!("row {i:05} value\n")).collect();
    std::fs::write(tmp.path().join("big.txt"), big).unwrap();
    let _ = std::fs::remove_file(&db);
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url: format!("sqlite://{db}"),
            workspace: Some(tmp.path().into()),
            // Priced, so `usage.cost` is a real fraction.
            tweak: Some(Box::new(|c| {
                c.budget.prices.insert(
                    "fake-gpt".into(),
                    omicos_orchestrator::config::Price {
                        input_per_mtok: 3.0,
                        output_per_mtok: 15.0,
                    },
                );
            })),
            ..Default::default()
        },
    )
    .await;
    let first = stack
        .chat(req("", "write notes and read big.txt"))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = first[0].session_id.clone();
    // A turn cancelled while the answer streams: the partial answer is kept, marked.
    let mut chat = stack.chat(req(&session, "talk at length")).await.unwrap();
    let mut deltas = 0;
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::TextDelta(_))) {
            deltas += 1;
            if deltas == 5 {
                break;
            }
        }
    }
    chat.cancel().await;
    chat.until_done().await;
    stack
        .client()
        .await
        .compact(CompactRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap();
    stack
        .chat(req(&session, "go on"))
        .await
        .unwrap()
        .until_done()
        .await;
    eprintln!("session {session} written to {db}");
}
