//! A writer that never stops, for the kill -9 tests: appends a message and an
//! event per round and prints `<writer> <seq>` once both are committed.
//!
//! `omicos-sessionstore-crashwriter STORE_URL SESSION_ID [WRITERS]`: with
//! WRITERS > 1, that many tasks write concurrently to sessions
//! `SESSION_ID-0`, `SESSION_ID-1`, …, so the store's writer commits their
//! rows together in batches.

use omicos_sessionstore::{SessionMeta, SessionStore, SqlStore, now_ms};
use std::io::Write;

fn fail(e: omicos_sessionstore::StoreError) -> ! {
    eprintln!("crashwriter: {e}");
    std::process::exit(1);
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(session)) = (args.next(), args.next()) else {
        eprintln!("usage: omicos-sessionstore-crashwriter STORE_URL SESSION_ID [WRITERS]");
        std::process::exit(2);
    };
    let writers: usize = match args.next().map(|w| w.parse()) {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("crashwriter: WRITERS must be a positive number");
            std::process::exit(2);
        }
    };
    let store = SqlStore::open(&url).await.unwrap_or_else(|e| fail(e));
    let (out, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    for w in 0..writers {
        let id = if writers == 1 {
            session.clone()
        } else {
            format!("{session}-{w}")
        };
        let store = store.clone();
        let out = out.clone();
        tokio::spawn(async move {
            if store
                .get_session(&id)
                .await
                .unwrap_or_else(|e| fail(e))
                .is_none()
            {
                let meta = SessionMeta {
                    id: id.clone(),
                    title: "crash".into(),
                    agent: "a".into(),
                    created_ms: now_ms(),
                    last_active_ms: now_ms(),
                    ..Default::default()
                };
                store.put_session(&meta).await.unwrap_or_else(|e| fail(e));
            }
            let mut seq = store.last_seq(&id).await.unwrap_or_else(|e| fail(e));
            loop {
                seq += 1;
                let msg = omicos_sessionstore::HistoryItem::Assistant(
                    omicos_history::AssistantMessage::new(format!(
                        "reply {seq} {}",
                        "x".repeat((seq % 64) as usize)
                    )),
                );
                store
                    .append_messages(&id, &[msg])
                    .await
                    .unwrap_or_else(|e| fail(e));
                store
                    .append_event(&id, seq, format!("event {seq}").as_bytes())
                    .await
                    .unwrap_or_else(|e| fail(e));
                if out.send(format!("{w} {seq}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(out);
    let mut stdout = std::io::stdout();
    while let Some(l) = lines.recv().await {
        let _ = writeln!(stdout, "{l}");
        let _ = stdout.flush();
    }
}
