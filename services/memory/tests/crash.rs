//! kill -9 during writes: the database stays consistent and usable.

mod common;

use omicos_memory::{MemoryStore, SearchQuery};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Starts the crash writer, waits for `writes` committed writes, kills it with
/// SIGKILL mid-stream, and returns how many it reported.
fn run_and_kill(url: &str, scope: &str, writes: u64) -> u64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_omicos-memory-crashwriter"))
        .args([url, scope])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn crash writer");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while seen < writes {
        match lines.next() {
            Some(Ok(l)) => seen = l.trim().parse().unwrap(),
            other => panic!("crash writer stopped early: {other:?}"),
        }
    }
    // Child::kill is SIGKILL on Unix: no destructors, no rollback, no checkpoint.
    child.kill().unwrap();
    child.wait().unwrap();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_keeps_the_database_intact() {
    for b in common::all("kill9").await {
        for round in 0..3 {
            let seen = run_and_kill(&b.url, "crash", 150);
            let s = MemoryStore::open(&b.url)
                .await
                .expect("reopens after kill -9");
            assert_eq!(
                s.integrity_check().await.unwrap(),
                "ok",
                "{} round {round}",
                b.name
            );
            let (valid, total) = s.count("crash").await.unwrap();
            // Every reported write committed; at most the one in flight is lost.
            assert!(
                total as u64 >= seen,
                "{}: {total} rows < {seen} reported writes",
                b.name
            );
            // One valid entry per key (13 keys), however the kill landed.
            assert_eq!(
                valid, 13,
                "{} round {round}: valid {valid} of {total}",
                b.name
            );
            // Supersede links are whole: every superseded entry names its successor.
            let page = s.list("crash", None, 100, None, true).await.unwrap();
            for m in &page.entries {
                if m.expired_reason.as_deref() == Some("superseded") {
                    let next = m
                        .superseded_by
                        .expect("superseded entries point to their successor");
                    let n = s.get("crash", next).await.unwrap().unwrap();
                    assert_eq!(n.supersedes, Some(m.id));
                }
            }
            // The full-text index answers and agrees with the table.
            let hits = s
                .search(
                    "crash",
                    &SearchQuery {
                        text: "note".into(),
                        limit: 100,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(hits.len(), 13, "{}", b.name);
            s.close().await;
        }
    }
}
