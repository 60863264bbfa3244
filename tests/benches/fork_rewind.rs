//! ForkSession and RewindSession (issue 40; targets: a fork of a
//! 1,000-message session under 50 ms, a rewind of one turn whose file tools
//! changed 20 files under 100 ms), on SQLite, through the orchestrator's
//! gRPC API on loopback (the runner restores the files).
//!
//! The session is made of real turns: each answer asks for 99 calls of
//! `file_manager__list`, so a turn is 102 messages, and ten turns are 1,020.
//! Each rewind round first runs a turn that overwrites 20 files of 4 KiB
//! (not timed), then times the rewind that restores them.
//!
//! `cargo bench -p omicos-e2e --bench fork_rewind` (release).
//! `FORK_REWIND_ROUNDS=N` sets the rounds (default 20).

use omicos_e2e::stack::ChatHandle;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::{
    ChatRequest, ForkSessionRequest, RewindSessionRequest, chat_event, rewind_session_request,
};
use serde_json::json;
use std::time::Instant;

const CALLS_PER_TURN: usize = 99;
const HISTORY_TURNS: usize = 10;
const FILES: usize = 20;

fn req(session: &str, message: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

fn writes(round: usize) -> Reply {
    Reply::Tools(
        String::new(),
        (0..FILES)
            .map(|i| {
                let content = format!("{round:>4} {i:>4} ").repeat(4096 / 10);
                (
                    format!("w{round}_{i}"),
                    "file_manager__write".into(),
                    json!({"path": format!("bench/f{i}.txt"), "content": content}).to_string(),
                )
            })
            .collect(),
    )
}

async fn turn(stack: &Stack, session: &str, message: &str) -> String {
    let mut h = ChatHandle::open(stack.client().await, req(session, message))
        .await
        .expect("chat");
    let events = h.until_done().await;
    let done = events.iter().any(|e| {
        matches!(&e.kind, Some(chat_event::Kind::TurnDone(d))
            if d.reason == omicos_proto::TurnDoneReason::Completed as i32)
    });
    assert!(done, "{message}: the turn did not complete");
    events[0].session_id.clone()
}

fn report(name: &str, mut ms: Vec<f64>, target: f64) {
    ms.sort_by(f64::total_cmp);
    let p = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms over {} rounds (target < {target} ms)",
        p(0.5),
        p(0.95),
        ms[ms.len() - 1],
        ms.len()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("FORK_REWIND_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut script = vec![];
    for t in 0..HISTORY_TURNS {
        script.push(Reply::Tools(
            String::new(),
            (0..CALLS_PER_TURN)
                .map(|i| {
                    (
                        format!("l{t}_{i}"),
                        "file_manager__list".into(),
                        json!({"path": "."}).to_string(),
                    )
                })
                .collect(),
        ));
        script.push(Reply::Text(format!("listed {t}")));
    }
    // The files, first written in a turn of their own.
    script.push(writes(0));
    script.push(Reply::Text("written".into()));
    for r in 1..=rounds {
        script.push(writes(r));
        script.push(Reply::Text(format!("rewritten {r}")));
    }
    let llm = FakeLlm::start(script).await;
    let db = omicos_testdb::sqlite("sessions.db");
    let stack = Stack::start(
        llm,
        StackOptions {
            store_url: db.url.clone(),
            ..Default::default()
        },
    )
    .await;
    let mut c = stack.client().await;

    let built = Instant::now();
    let mut sid = String::new();
    for t in 0..HISTORY_TURNS {
        sid = turn(&stack, &sid, &format!("list {t}")).await;
    }
    println!(
        "session of {HISTORY_TURNS} turns built in {:.1} s",
        built.elapsed().as_secs_f64()
    );

    let mut fork_ms = vec![];
    let mut messages = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let f = c
            .fork_session(ForkSessionRequest {
                session_id: sid.clone(),
                at: None,
                copy_files: false,
            })
            .await
            .expect("fork")
            .into_inner();
        fork_ms.push(t.elapsed().as_secs_f64() * 1e3);
        messages = f.messages;
    }
    report(
        &format!("fork of a {messages}-message session"),
        fork_ms,
        50.0,
    );

    turn(&stack, &sid, "write the files").await;
    let mut rewind_ms = vec![];
    let mut restored = 0;
    for r in 1..=rounds {
        turn(&stack, &sid, &format!("rewrite {r}")).await;
        let t = Instant::now();
        let w = c
            .rewind_session(RewindSessionRequest {
                session_id: sid.clone(),
                to: Some(rewind_session_request::To::LastTurns(1)),
                keep_files: false,
            })
            .await
            .expect("rewind")
            .into_inner();
        rewind_ms.push(t.elapsed().as_secs_f64() * 1e3);
        restored = w.files_restored.len();
        assert_eq!(restored, FILES);
    }
    report(
        &format!("rewind of one turn with {restored} changed files"),
        rewind_ms,
        100.0,
    );
}
