//! The store's share of the event path (issue 15): `SESSIONS` sessions append
//! `EVENTS` events each, concurrently, every append awaited before the next
//! (as the hub does: a session's next event waits for the previous commit).
//! Prints, per store, the process's CPU per event (user + system, all
//! threads: the runtime, SQLite's workers) and events per second; the memory
//! store in the same run is the floor. A PostgreSQL server's own CPU is not
//! in it.
//!
//! `cargo bench -p omicos-sessionstore --bench append` (release). Settings:
//! `APPEND_SESSIONS` (default 200), `APPEND_EVENTS` (86), `APPEND_PAUSE_MS`
//! (a session's pause before each append, default 0: the load bench's model
//! sends a turn's deltas 10 ms apart), `APPEND_STORES`
//! (`memory,sqlite,postgres`; PostgreSQL is skipped when it does not answer).

use omicos_sessionstore::{SessionMeta, SessionStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time of the whole process so far (every thread: the runtime and
/// SQLite's connection workers), from each thread's `schedstat` (ns; the
/// clock ticks of `/proc/self/stat` are 10 ms, too coarse for a run of a
/// second).
fn cpu() -> Duration {
    let mut ns = 0u64;
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

fn env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run(
    store: Arc<dyn SessionStore>,
    sessions: usize,
    events: usize,
    pause: Duration,
) -> (Duration, Duration) {
    let body = vec![7u8; 60];
    let ids: Vec<String> = (0..sessions)
        .map(|i| format!("bench-{i}-{}", uuid::Uuid::new_v4()))
        .collect();
    for id in &ids {
        store
            .put_session(&SessionMeta {
                id: id.clone(),
                tenant: "default".into(),
                subject: "bench".into(),
                ..Default::default()
            })
            .await
            .expect("session");
    }
    let c0 = cpu();
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let store = store.clone();
        let body = body.clone();
        tasks.spawn(async move {
            for seq in 1..=events as u64 {
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                store.append_event(&id, seq, &body).await.expect("append");
            }
            id
        });
    }
    let mut done = vec![];
    while let Some(r) = tasks.join_next().await {
        done.push(r.expect("task"));
    }
    let (wall, cpu_used) = (t0.elapsed(), cpu() - c0);
    for id in &done {
        let got = store.events_since(id, 0).await.expect("read");
        assert_eq!(got.len(), events, "{id}: every event stored once");
        assert!(
            got.iter().enumerate().all(|(i, (s, _))| *s == i as u64 + 1),
            "{id}: seqs in order"
        );
    }
    (wall, cpu_used)
}

fn main() {
    let sessions = env("APPEND_SESSIONS", 200);
    let events = env("APPEND_EVENTS", 86);
    let pause = Duration::from_millis(env("APPEND_PAUSE_MS", 0) as u64);
    let stores = std::env::var("APPEND_STORES").unwrap_or_else(|_| "memory,sqlite,postgres".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("{sessions} sessions × {events} events, each append awaited, {pause:?} apart");
    println!();
    println!("| store | CPU µs per event | events/s |");
    println!("|---|---|---|");
    for name in stores.split(',').map(str::trim) {
        let dir = tempfile::tempdir().unwrap();
        let mut _pg = None;
        let url = match name {
            "memory" => "memory:".to_owned(),
            "sqlite" => format!("sqlite://{}/sessions.db", dir.path().display()),
            "postgres" => match rt.block_on(omicos_testdb::postgres("append", "oab")) {
                Some(b) => _pg.insert(b).url.clone(),
                None => {
                    println!("| postgres | (skipped: PostgreSQL does not answer) | | |");
                    continue;
                }
            },
            other => panic!("unknown store {other}"),
        };
        let store = rt.block_on(omicos_sessionstore::open(&url)).expect("open");
        // A warm-up round, then the measured one.
        rt.block_on(run(store.clone(), sessions.min(20), 10, pause));
        let (wall, used) = rt.block_on(run(store, sessions, events, pause));
        let n = (sessions * events) as f64;
        let per = used.as_secs_f64() * 1e6 / n;
        println!("| {name} | {per:.1} | {:.0} |", n / wall.as_secs_f64());
    }
}
