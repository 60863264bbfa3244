//! A writer that never stops, for the kill -9 test: appends a message and an
//! event per round and prints the number of committed rounds after each one.

use omicos_sessionstore::{SessionMeta, SessionStore, SqlStore, now_ms};
use std::io::Write;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(session)) = (args.next(), args.next()) else {
        eprintln!("usage: omicos-sessionstore-crashwriter STORE_URL SESSION_ID");
        std::process::exit(2);
    };
    let fail = |e: omicos_sessionstore::StoreError| -> ! {
        eprintln!("crashwriter: {e}");
        std::process::exit(1);
    };
    let store = SqlStore::open(&url).await.unwrap_or_else(|e| fail(e));
    if store
        .get_session(&session)
        .await
        .unwrap_or_else(|e| fail(e))
        .is_none()
    {
        let meta = SessionMeta {
            id: session.clone(),
            title: "crash".into(),
            agent: "a".into(),
            created_ms: now_ms(),
            last_active_ms: now_ms(),
            ..Default::default()
        };
        store.put_session(&meta).await.unwrap_or_else(|e| fail(e));
    }
    let mut seq = store.last_seq(&session).await.unwrap_or_else(|e| fail(e));
    let mut out = std::io::stdout();
    loop {
        seq += 1;
        let msg = serde_json::json!({"role": "assistant", "content": format!("reply {seq} {}", "x".repeat((seq % 64) as usize))});
        store
            .append_messages(&session, &[msg])
            .await
            .unwrap_or_else(|e| fail(e));
        store
            .append_event(&session, seq, format!("event {seq}").as_bytes())
            .await
            .unwrap_or_else(|e| fail(e));
        let _ = writeln!(out, "{seq}");
        let _ = out.flush();
    }
}
