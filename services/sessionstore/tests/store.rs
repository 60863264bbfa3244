//! The conversation store on every backend: the trait's contract, restarts,
//! the turn lease between replicas, concurrent appends, and kill -9.

mod common;

use omicos_sessionstore::{
    HistoryItem, SessionMeta, SessionStore, SqlStore, StoreError, StoreResult, now_ms, open,
};
use serde_json::json;
use std::sync::Arc;

fn meta(id: &str, last_active_ms: i64) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        title: format!("title of {id}"),
        agent: "analyst".into(),
        team_members: vec!["analyst".into(), "coder".into()],
        created_ms: 1_000,
        last_active_ms,
        tenant: "default".into(),
        subject: "local".into(),
    }
}

/// The trait's contract, checked the same way on every store.
async fn contract(s: Arc<dyn SessionStore>, name: &str) {
    assert!(s.get_session("nope").await.unwrap().is_none());
    s.put_session(&meta("a", 10)).await.unwrap();
    s.put_session(&meta("b", 30)).await.unwrap();
    s.put_session(&meta("c", 20)).await.unwrap();
    assert_eq!(
        s.get_session("a").await.unwrap().unwrap(),
        meta("a", 10),
        "{name}"
    );
    let order: Vec<String> = s
        .list_sessions(10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(order, ["b", "c", "a"], "{name}: most recently active first");
    assert_eq!(s.list_sessions(2).await.unwrap().len(), 2);
    // put_session upserts.
    let mut renamed = meta("a", 10);
    renamed.title = "renamed".into();
    s.put_session(&renamed).await.unwrap();
    assert_eq!(s.get_session("a").await.unwrap().unwrap().title, "renamed");

    // messages, in order, bumping last_active
    let m1 = HistoryItem::user("hi ünïcode 🙂");
    let m2 = HistoryItem::from_value(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"ls\"}"}}]}),
    );
    let m3 = HistoryItem::from_value(
        json!({"role": "tool", "tool_call_id": "c1", "content": "{\"status\":\"done\",\"result\":\"x\"}"}),
    );
    s.append_messages("a", &[m1.clone(), m2.clone()])
        .await
        .unwrap();
    s.append_messages("a", std::slice::from_ref(&m3))
        .await
        .unwrap();
    assert_eq!(s.messages("a").await.unwrap(), vec![m1, m2, m3], "{name}");
    assert!(s.get_session("a").await.unwrap().unwrap().last_active_ms >= now_ms() - 60_000);
    assert_eq!(s.list_sessions(1).await.unwrap()[0].id, "a");
    assert!(s.messages("b").await.unwrap().is_empty());
    assert!(
        matches!(
            s.append_messages("ghost", &[HistoryItem::from_value(json!({}))])
                .await,
            Err(StoreError::NotFound(_))
        ),
        "{name}"
    );

    // events: gap-free seq
    assert_eq!(s.last_seq("a").await.unwrap(), 0);
    for seq in 1..=5u64 {
        s.append_event("a", seq, format!("ev{seq}").as_bytes())
            .await
            .unwrap();
    }
    let e = s.append_event("a", 7, b"gap").await.unwrap_err();
    assert!(e.to_string().contains("out of order"), "{name}: {e}");
    assert!(
        s.append_event("a", 5, b"dup").await.is_err(),
        "{name}: a seq is written once"
    );
    assert!(matches!(
        s.append_event("ghost", 1, b"x").await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.last_seq("a").await.unwrap(), 5);
    let since: Vec<(u64, Vec<u8>)> = s.events_since("a", 3).await.unwrap();
    assert_eq!(
        since,
        vec![(4, b"ev4".to_vec()), (5, b"ev5".to_vec())],
        "{name}"
    );
    assert_eq!(s.events_since("a", 0).await.unwrap().len(), 5);
    assert!(s.events_since("a", 5).await.unwrap().is_empty());
    assert!(s.events_since("a", u64::MAX).await.unwrap().is_empty());
    // One event by its seq (what ReadValue reads a cut value from).
    for seq in 1..=5u64 {
        assert_eq!(
            s.event_at("a", seq).await.unwrap(),
            Some(format!("ev{seq}").into_bytes()),
            "{name}: event {seq}"
        );
    }
    for (id, seq) in [("a", 0), ("a", 6), ("a", u64::MAX), ("b", 1), ("ghost", 1)] {
        assert_eq!(
            s.event_at(id, seq).await.unwrap(),
            None,
            "{name}: {id} {seq}"
        );
    }
    // Several events in one append: consecutive seqs, all or none.
    let group = |from: u64, n: u64| -> Vec<Vec<u8>> {
        (from..from + n)
            .map(|q| format!("ev{q}").into_bytes())
            .collect()
    };
    s.append_events("a", 6, group(6, 3)).await.unwrap();
    assert_eq!(s.last_seq("a").await.unwrap(), 8, "{name}");
    let e = s.append_events("a", 10, group(10, 2)).await.unwrap_err();
    assert!(e.to_string().contains("out of order"), "{name}: {e}");
    assert!(
        s.append_events("a", 8, group(8, 3)).await.is_err(),
        "{name}: a group that starts on a written seq is refused whole"
    );
    assert_eq!(
        s.last_seq("a").await.unwrap(),
        8,
        "{name}: nothing of it was written"
    );
    assert!(matches!(
        s.append_events("ghost", 1, group(1, 2)).await,
        Err(StoreError::NotFound(_))
    ));
    s.append_events("a", 9, vec![]).await.unwrap();
    let all: Vec<u64> = s
        .events_since("a", 0)
        .await
        .unwrap()
        .into_iter()
        .map(|(q, body)| {
            assert_eq!(body, format!("ev{q}").into_bytes(), "{name}");
            q
        })
        .collect();
    assert_eq!(all, (1..=8).collect::<Vec<_>>(), "{name}");
    // Binary events survive byte for byte.
    s.append_event("b", 1, &[0, 159, 146, 150, 255])
        .await
        .unwrap();
    assert_eq!(
        s.events_since("b", 0).await.unwrap()[0].1,
        vec![0, 159, 146, 150, 255]
    );

    // the turn lease
    assert!(
        s.try_lease_turn("a", "replica-1", 60_000).await.unwrap(),
        "{name}"
    );
    assert!(
        !s.try_lease_turn("a", "replica-2", 60_000).await.unwrap(),
        "{name}: busy"
    );
    assert!(
        s.try_lease_turn("a", "replica-1", 60_000).await.unwrap(),
        "the holder renews"
    );
    s.release_turn("a", "replica-2").await.unwrap();
    assert!(
        !s.try_lease_turn("a", "replica-2", 60_000).await.unwrap(),
        "only the holder releases"
    );
    s.release_turn("a", "replica-1").await.unwrap();
    assert!(s.try_lease_turn("a", "replica-2", 50).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    assert!(
        s.try_lease_turn("a", "replica-3", 60_000).await.unwrap(),
        "{name}: an expired lease is taken over"
    );
    assert!(matches!(
        s.try_lease_turn("ghost", "r", 1000).await,
        Err(StoreError::NotFound(_))
    ));
    s.release_turn("ghost", "r").await.unwrap();

    // delete takes messages, events and the lease with it
    assert!(s.delete_session("a").await.unwrap());
    assert!(!s.delete_session("a").await.unwrap());
    assert!(s.get_session("a").await.unwrap().is_none());
    assert!(s.messages("a").await.unwrap().is_empty());
    assert!(s.events_since("a", 0).await.unwrap().is_empty());
    assert_eq!(s.last_seq("a").await.unwrap(), 0);
    s.put_session(&meta("a", 1)).await.unwrap();
    assert!(
        s.try_lease_turn("a", "new-owner", 60_000).await.unwrap(),
        "{name}: the old lease went with the session"
    );
    assert!(s.messages("a").await.unwrap().is_empty());
    s.append_event("a", 1, b"fresh").await.unwrap();
}

#[tokio::test]
async fn contract_on_every_backend() {
    contract(open("memory:").await.unwrap(), "memory").await;
    for b in common::all("contract").await {
        contract(open(&b.url).await.unwrap(), b.name).await;
    }
    match open("mysql://x").await {
        Err(e) => assert!(e.to_string().contains("expected"), "{e}"),
        Ok(_) => panic!("mysql:// is not a backend"),
    }
}

#[tokio::test]
async fn restart_keeps_history_and_attach_resumes_from_an_old_seq() {
    for b in common::all("restart").await {
        {
            let s = SqlStore::open(&b.url).await.unwrap();
            s.put_session(&meta("conv", 1)).await.unwrap();
            s.append_messages(
                "conv",
                &[
                    HistoryItem::user("first"),
                    HistoryItem::Assistant(omicos_history::AssistantMessage::new("one")),
                ],
            )
            .await
            .unwrap();
            for seq in 1..=4 {
                s.append_event("conv", seq, format!("e{seq}").as_bytes())
                    .await
                    .unwrap();
            }
            s.close().await;
        }
        // A new process (or another replica) opens the same store.
        let s = SqlStore::open(&b.url).await.unwrap();
        assert_eq!(s.messages("conv").await.unwrap().len(), 2, "{}", b.name);
        assert_eq!(s.last_seq("conv").await.unwrap(), 4);
        let replay = s.events_since("conv", 2).await.unwrap();
        assert_eq!(
            replay,
            vec![(3, b"e3".to_vec()), (4, b"e4".to_vec())],
            "{}",
            b.name
        );
        // The conversation continues where it stopped.
        s.append_messages("conv", &[HistoryItem::user("second")])
            .await
            .unwrap();
        s.append_event("conv", 5, b"e5").await.unwrap();
        assert_eq!(
            s.messages("conv").await.unwrap()[2].content(),
            Some("second")
        );
        assert_eq!(
            s.events_since("conv", 0)
                .await
                .unwrap()
                .iter()
                .map(|e| e.0)
                .collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
    }
}

/// A new session and its first turn's lease, written together: both are
/// there after it, another owner is refused the lease, a session that was
/// already there is updated and leased as `put_session` and
/// `try_lease_turn` would, and the new session takes its first events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_is_written_with_its_lease() {
    let mut stores: Vec<(Arc<dyn SessionStore>, String)> =
        vec![(open("memory:").await.unwrap(), "memory".into())];
    let backends = common::all("created").await;
    for b in &backends {
        stores.push((open(&b.url).await.unwrap(), b.name.to_string()));
    }
    for (s, name) in stores {
        let m = meta("fresh", 5);
        assert!(
            s.create_leased_session(&m, "turn-1", 60_000).await.unwrap(),
            "{name}"
        );
        assert_eq!(s.get_session("fresh").await.unwrap().unwrap(), m, "{name}");
        let lease = s.lease("fresh").await.unwrap().expect("a lease");
        assert_eq!(lease.owner, "turn-1", "{name}");
        assert!(
            !s.try_lease_turn("fresh", "turn-2", 60_000).await.unwrap(),
            "{name}: the lease is live"
        );
        s.append_events("fresh", 1, vec![b"one".to_vec(), b"two".to_vec()])
            .await
            .unwrap();
        assert_eq!(s.last_seq("fresh").await.unwrap(), 2, "{name}");

        // Already there: its metadata is updated, and a live lease of
        // another owner refuses the turn.
        let mut again = meta("fresh", 9);
        again.title = "renamed".into();
        assert!(
            !s.create_leased_session(&again, "turn-2", 60_000)
                .await
                .unwrap(),
            "{name}"
        );
        assert_eq!(
            s.get_session("fresh").await.unwrap().unwrap().title,
            "renamed",
            "{name}"
        );
        assert_eq!(
            s.lease("fresh").await.unwrap().unwrap().owner,
            "turn-1",
            "{name}"
        );
        // Released, the next one takes it; the log is as it was.
        s.release_turn("fresh", "turn-1").await.unwrap();
        assert!(
            s.create_leased_session(&again, "turn-2", 60_000)
                .await
                .unwrap(),
            "{name}"
        );
        assert_eq!(
            s.lease("fresh").await.unwrap().unwrap().owner,
            "turn-2",
            "{name}"
        );
        assert_eq!(s.events_since("fresh", 0).await.unwrap().len(), 2, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_contend_for_the_turn_lease() {
    for b in common::all("lease").await {
        // Two stores = two orchestrator replicas with their own pools.
        let r1 = SqlStore::open(&b.url).await.unwrap();
        let r2 = SqlStore::open(&b.url).await.unwrap();
        r1.put_session(&meta("busy", 1)).await.unwrap();
        for round in 0..5 {
            let mut tries = Vec::new();
            for i in 0..16 {
                let s = if i % 2 == 0 { r1.clone() } else { r2.clone() };
                tries.push(tokio::spawn(async move {
                    let owner = format!("replica-{}-turn-{i}", i % 2);
                    s.try_lease_turn("busy", &owner, 60_000)
                        .await
                        .map(|won| won.then_some(owner))
                }));
            }
            let mut winners = Vec::new();
            for t in tries {
                if let Some(w) = t.await.unwrap().unwrap() {
                    winners.push(w);
                }
            }
            assert_eq!(
                winners.len(),
                1,
                "{} round {round}: exactly one turn runs: {winners:?}",
                b.name
            );
            // The other replica sees it busy until the winner releases.
            assert!(!r2.try_lease_turn("busy", "late", 60_000).await.unwrap());
            assert!(!r1.try_lease_turn("busy", "late", 60_000).await.unwrap());
            r1.release_turn("busy", &winners[0]).await.unwrap();
        }
        // A replica that died holding the lease frees it by expiry.
        assert!(r1.try_lease_turn("busy", "dies", 100).await.unwrap());
        assert!(!r2.try_lease_turn("busy", "survivor", 60_000).await.unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        assert!(
            r2.try_lease_turn("busy", "survivor", 60_000).await.unwrap(),
            "{}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_from_two_replicas() {
    for b in common::all("appends").await {
        let r1 = SqlStore::open(&b.url).await.unwrap();
        let r2 = SqlStore::open(&b.url).await.unwrap();
        r1.put_session(&meta("shared", 1)).await.unwrap();
        // Both race for every seq: each seq is written exactly once.
        let mut tasks = Vec::new();
        for (w, s) in [r1.clone(), r2.clone()].into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut written = 0;
                for _ in 0..200 {
                    let next = s.last_seq("shared").await.unwrap() + 1;
                    if s.append_event("shared", next, format!("w{w}").as_bytes())
                        .await
                        .is_ok()
                    {
                        written += 1;
                    }
                    s.append_messages("shared", &[HistoryItem::user(format!("w{w}"))])
                        .await
                        .unwrap();
                }
                written
            }));
        }
        let mut written = 0;
        for t in tasks {
            written += t.await.unwrap();
        }
        let events = r1.events_since("shared", 0).await.unwrap();
        assert_eq!(events.len(), written, "{}", b.name);
        assert!(
            events.iter().enumerate().all(|(i, e)| e.0 == i as u64 + 1),
            "{}: gap-free",
            b.name
        );
        assert_eq!(
            r2.messages("shared").await.unwrap().len(),
            400,
            "{}: no message lost",
            b.name
        );
        assert_eq!(r1.integrity_check().await.unwrap(), "ok");
    }
}

/// The writer remembers each session's cursor from its own commits (issue
/// 15). What another store on the same database did since must still win:
/// a seq that follows the other's writes is taken, a stale one is refused,
/// a message index is never written twice, and a session deleted through
/// the other store takes no more rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_cursor_gives_way_to_another_stores_writes() {
    for b in common::all("cursor").await {
        let a = SqlStore::open(&b.url).await.unwrap();
        let other = SqlStore::open(&b.url).await.unwrap();
        a.put_session(&meta("s", 1)).await.unwrap();
        for seq in 1..=3 {
            a.append_event("s", seq, b"a").await.unwrap();
        }
        a.append_messages("s", &[HistoryItem::user("a1")])
            .await
            .unwrap();
        // The other store writes after a's last commit.
        for seq in 4..=5 {
            other.append_event("s", seq, b"o").await.unwrap();
        }
        other
            .append_messages("s", &[HistoryItem::user("o1")])
            .await
            .unwrap();
        // a's cursor says 3: seq 4 was taken by the other, and is refused...
        let stale = a.append_event("s", 4, b"stale").await;
        refused_out_of_order(&stale, b.name);
        // ...while the seq after the other's (what a hub that re-read asks) is taken.
        a.append_event("s", 6, b"a").await.unwrap();
        a.append_messages("s", &[HistoryItem::user("a2")])
            .await
            .unwrap();
        let events = other.events_since("s", 0).await.unwrap();
        let bodies: Vec<(u64, &[u8])> = events.iter().map(|(q, e)| (*q, e.as_slice())).collect();
        assert_eq!(
            bodies,
            vec![
                (1, &b"a"[..]),
                (2, b"a"),
                (3, b"a"),
                (4, b"o"),
                (5, b"o"),
                (6, b"a")
            ],
            "{}",
            b.name
        );
        let contents: Vec<String> = other
            .messages("s")
            .await
            .unwrap()
            .iter()
            .map(|m| m.content().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(contents, ["a1", "o1", "a2"], "{}", b.name);
        // Deleted through the other store: a's remembered cursor writes nothing more.
        assert!(other.delete_session("s").await.unwrap(), "{}", b.name);
        let gone = a.append_event("s", 7, b"late").await;
        assert!(
            matches!(gone, Err(StoreError::NotFound(_))),
            "{}: {gone:?}",
            b.name
        );
        let gone = a.append_messages("s", &[HistoryItem::user("late")]).await;
        assert!(
            matches!(gone, Err(StoreError::NotFound(_))),
            "{}: {gone:?}",
            b.name
        );
        assert!(
            a.events_since("s", 0).await.unwrap().is_empty(),
            "{}",
            b.name
        );
        assert!(a.messages("s").await.unwrap().is_empty(), "{}", b.name);
        // A session a store has just created starts from seq 1 without a
        // read (PostgreSQL's writer is told so); when another store wrote
        // first, that cursor gives way like a remembered one.
        a.put_session(&meta("u", 1)).await.unwrap();
        for seq in 1..=2 {
            other.append_event("u", seq, b"o").await.unwrap();
        }
        let stale = a.append_event("u", 1, b"stale").await;
        refused_out_of_order(&stale, b.name);
        a.append_event("u", 3, b"a").await.unwrap();
        assert_eq!(seqs(&a, "u", 0).await, [1, 2, 3], "{}", b.name);
        // And through its own store: the next append is refused too.
        a.put_session(&meta("t", 1)).await.unwrap();
        a.append_event("t", 1, b"a").await.unwrap();
        assert!(a.delete_session("t").await.unwrap(), "{}", b.name);
        assert!(
            !a.delete_session("t").await.unwrap(),
            "{}: deleted once",
            b.name
        );
        let gone = a.append_event("t", 2, b"late").await;
        assert!(
            matches!(gone, Err(StoreError::NotFound(_))),
            "{}: {gone:?}",
            b.name
        );
        assert_eq!(a.integrity_check().await.unwrap(), "ok");
    }
}

/// Schema 5 rebuilds SQLite's event and message tables with a foreign key
/// to their session: a store written by schema 4 keeps every row of its
/// sessions, loses the rows a deleted session left, and takes appends after.
#[tokio::test]
async fn a_schema_4_store_upgrades_with_its_rows() {
    let b = common::sqlite();
    let store = SqlStore::open(&b.url).await.unwrap();
    store.put_session(&meta("kept", 1)).await.unwrap();
    for seq in 1..=3 {
        store
            .append_event("kept", seq, format!("e{seq}").as_bytes())
            .await
            .unwrap();
    }
    store
        .append_messages("kept", &[HistoryItem::user("hi")])
        .await
        .unwrap();
    store.close().await;
    drop(store);
    // Back to schema 4's tables: no foreign key, and orphan rows of a
    // session deleted long ago.
    {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&b.url).await.unwrap();
        sqlx::raw_sql(
            "PRAGMA foreign_keys = OFF;
             CREATE TABLE ev4 (session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (session_id, seq));
             INSERT INTO ev4 SELECT * FROM session_events;
             INSERT INTO ev4 SELECT session_id, seq, body FROM session_event_tail;
             DROP TABLE session_event_tail;
             DROP TABLE session_events; ALTER TABLE ev4 RENAME TO session_events;
             CREATE TABLE ms4 (session_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (session_id, idx));
             INSERT INTO ms4 SELECT session_id, idx, body FROM session_messages;
             DROP TABLE session_turns; DROP TABLE session_checkpoints; DROP TABLE session_forks;
             DROP TABLE session_messages; ALTER TABLE ms4 RENAME TO session_messages;
             INSERT INTO session_events VALUES ('gone', 1, x'00');
             INSERT INTO session_messages VALUES ('gone', 1, '{}');
             DELETE FROM omicos_sessions_schema WHERE version >= 5;",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    }
    let store = SqlStore::open(&b.url).await.unwrap();
    let events = store.events_since("kept", 0).await.unwrap();
    let bodies: Vec<&[u8]> = events.iter().map(|(_, e)| e.as_slice()).collect();
    assert_eq!(bodies, [&b"e1"[..], b"e2", b"e3"]);
    assert_eq!(store.messages("kept").await.unwrap().len(), 1);
    assert!(store.events_since("gone", 0).await.unwrap().is_empty());
    assert!(store.messages("gone").await.unwrap().is_empty());
    store.append_event("kept", 4, b"e4").await.unwrap();
    // The foreign key holds now: a session that does not exist takes no row.
    assert!(matches!(
        store.append_event("gone", 2, b"x").await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.integrity_check().await.unwrap(), "ok");
}

/// The seqs of `id`'s events after `since`, in the order read.
async fn seqs(store: &dyn SessionStore, id: &str, since: u64) -> Vec<u64> {
    let events = store.events_since(id, since).await.unwrap();
    events.iter().map(|(q, _)| *q).collect()
}

/// Rows of SQLite's event tail and log, through a connection of the test's.
async fn tail_and_log(url: &str) -> (i64, i64) {
    use sqlx::Connection;
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    let r = sqlx::query_as(
        "SELECT (SELECT count(*) FROM session_event_tail), (SELECT count(*) FROM session_events)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    c.close().await.unwrap();
    r
}

/// Reads `id` (through `store`, named in messages by `by`) while its
/// events, bodies `"{id} {seq}"`, are being written: its last seq, then
/// its log, which holds at least that many events, gap-free from seq 1,
/// each with its body. Its last seq.
async fn read_a_prefix_of_what_was_written(store: &SqlStore, id: &str, by: &str) -> u64 {
    let last = store.last_seq(id).await.unwrap();
    let events = store.events_since(id, 0).await.unwrap();
    assert!(
        events.len() as u64 >= last,
        "{id}{by}: {} events, last seq {last}",
        events.len()
    );
    for (i, (seq, body)) in events.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "{id}{by}: gap-free");
        assert_eq!(body, format!("{id} {seq}").as_bytes());
    }
    // One event by its seq, wherever it is (the tail, or the log, or mid-move).
    if last > 0 {
        for seq in [1, last] {
            assert_eq!(
                store.event_at(id, seq).await.unwrap().as_deref(),
                Some(format!("{id} {seq}").as_bytes()),
                "{id}{by}: event {seq}"
            );
        }
    }
    last
}

/// Waits (up to 10 s) until SQLite's event tail is empty; the log's rows.
async fn tail_moved(url: &str) -> i64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (tail, log) = tail_and_log(url).await;
        if tail == 0 {
            return log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tail still holds {tail} rows after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// SQLite's writer appends events to a tail and moves it into the log
/// (past `MOVE_ROWS` live rows, 16,384, 64 sessions a step, and when idle). Readers
/// during the writes and the moves see each session's log gap-free, as a
/// prefix of what was written, never a row twice or missing; afterwards
/// the tail is empty and the log holds every event once, with its content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_events_move_from_the_tail_without_a_gap() {
    const SESSIONS: u64 = 150;
    // 18,000 events: past MOVE_ROWS, so that the tail moves during the writes.
    const EVENTS: u64 = 120;
    let b = common::sqlite();
    let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
    for s in 0..SESSIONS {
        store.put_session(&meta(&format!("m{s}"), 1)).await.unwrap();
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for s in 0..SESSIONS {
        let store = store.clone();
        writers.spawn(async move {
            let id = format!("m{s}");
            for seq in 1..=EVENTS {
                let body = format!("{id} {seq}");
                store.append_event(&id, seq, body.as_bytes()).await.unwrap();
            }
        });
    }
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for s in 0..SESSIONS {
                    let id = format!("m{s}");
                    let last = read_a_prefix_of_what_was_written(&store, &id, "").await;
                    let since = store.events_since(&id, last).await.unwrap();
                    assert!(since.iter().all(|(q, _)| *q > last));
                    reads += 1;
                }
            }
            reads
        })
    };
    while let Some(r) = writers.join_next().await {
        r.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        reader.await.unwrap() > 0,
        "the reader read during the writes"
    );
    // Past MOVE_ROWS the writer moved the tail while writing.
    let (tail, log) = tail_and_log(&b.url).await;
    assert!(
        log > 0,
        "no move during {} events (tail {tail})",
        SESSIONS * EVENTS
    );
    // Idle, it moves the rest.
    assert_eq!(tail_moved(&b.url).await, (SESSIONS * EVENTS) as i64);
    for s in 0..SESSIONS {
        let id = format!("m{s}");
        assert_eq!(store.last_seq(&id).await.unwrap(), EVENTS);
        assert_eq!(seqs(&*store, &id, EVENTS - 2).await, [EVENTS - 1, EVENTS]);
    }
    assert_eq!(store.integrity_check().await.unwrap(), "ok");
    store.close().await;
}

/// Two stores on one SQLite file (two processes would be the same): each
/// writer appends to the one tail and moves it, knowing its live rows from
/// its own index, which does not see the other's commits until it notices
/// them (`PRAGMA data_version`). Reads through either store, during the
/// writes and both stores' moves, see every session's log gap-free, as a
/// prefix of what was written, whichever store wrote it; afterwards the
/// tail is empty and the log holds every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_read_each_others_tail_without_a_gap() {
    const SESSIONS: u64 = 40;
    // 2 × 40 × 250 = 20,000 events: past MOVE_ROWS, so both stores move.
    const EVENTS: u64 = 250;
    let b = common::sqlite();
    let stores = [
        Arc::new(SqlStore::open(&b.url).await.unwrap()),
        Arc::new(SqlStore::open(&b.url).await.unwrap()),
    ];
    let id = |w: usize, s: u64| format!("{}{s}", ["a", "b"][w]);
    for (w, store) in stores.iter().enumerate() {
        for s in 0..SESSIONS {
            store.put_session(&meta(&id(w, s), 1)).await.unwrap();
        }
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for (w, store) in stores.iter().enumerate() {
        for s in 0..SESSIONS {
            let store = store.clone();
            writers.spawn(async move {
                let id = id(w, s);
                for seq in 1..=EVENTS {
                    let body = format!("{id} {seq}");
                    store.append_event(&id, seq, body.as_bytes()).await.unwrap();
                }
            });
        }
    }
    // Each store reads the other's sessions.
    let mut readers = Vec::new();
    for (r, store) in stores.iter().enumerate() {
        let (store, done) = (store.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for s in 0..SESSIONS {
                    let id = id(1 - r, s);
                    let by = format!(" through store {r}");
                    read_a_prefix_of_what_was_written(&store, &id, &by).await;
                    reads += 1;
                }
            }
            reads
        }));
    }
    while let Some(r) = writers.join_next().await {
        r.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.await.unwrap() > 0, "the reader read during the writes");
    }
    let (_, log) = tail_and_log(&b.url).await;
    assert!(log > 0, "no move during the writes");
    assert_eq!(tail_moved(&b.url).await, (2 * SESSIONS * EVENTS) as i64);
    for (r, store) in stores.iter().enumerate() {
        for w in 0..2 {
            for s in [0, SESSIONS - 1] {
                let id = id(w, s);
                assert_eq!(
                    store.last_seq(&id).await.unwrap(),
                    EVENTS,
                    "{id} through {r}"
                );
                assert_eq!(
                    seqs(&**store, &id, 0).await,
                    (1..=EVENTS).collect::<Vec<_>>(),
                    "{id} through {r}"
                );
            }
        }
    }
    // Writes go on through the other store on a session the first wrote.
    stores[1]
        .append_event(&id(0, 0), EVENTS + 1, b"b")
        .await
        .unwrap();
    assert_eq!(stores[0].last_seq(&id(0, 0)).await.unwrap(), EVENTS + 1);
    assert_eq!(stores[0].integrity_check().await.unwrap(), "ok");
    for store in stores {
        store.close().await;
    }
}

/// When sessions get too few events each for the tail to pay (here one
/// per session in a window of 4,096 events), SQLite's writer writes them
/// straight into the log; when they get many again, into the tail. A
/// session's events split over both tables in any way read back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_past_the_tail_while_it_would_not_pay() {
    const SESSIONS: u64 = 4200;
    // Events of each of 20 sessions at the end: past the rest of the
    // direct window, then a window of many events a session.
    const MANY: u64 = 300;
    let b = common::sqlite();
    let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
    let id = |s: u64| format!("w{s}");
    for s in 0..SESSIONS {
        store.put_session(&meta(&id(s), 1)).await.unwrap();
    }
    // One event per session: the first window goes to the tail.
    let mut firsts = tokio::task::JoinSet::new();
    for chunk in 0..4 {
        let store = store.clone();
        firsts.spawn(async move {
            for s in (chunk..SESSIONS).step_by(4) {
                store.append_event(&id(s), 1, b"1").await.unwrap();
            }
        });
    }
    while let Some(r) = firsts.join_next().await {
        r.unwrap();
    }
    tail_moved(&b.url).await;
    // The next go to the log directly: the tail stays empty.
    for s in 0..500 {
        store.append_event(&id(s), 2, b"2").await.unwrap();
    }
    let (tail, log) = tail_and_log(&b.url).await;
    assert_eq!(
        (tail, log),
        (0, SESSIONS as i64 + 500),
        "written past the tail"
    );
    // Many events per session: after a window, they go to the tail again.
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..20 {
        let store = store.clone();
        let id = id(s);
        tasks.spawn(async move {
            for seq in 3..=MANY + 2 {
                store.append_event(&id, seq, b"n").await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let (tail, _) = tail_and_log(&b.url).await;
    let last = tail_moved(&b.url).await;
    assert_eq!(last, (SESSIONS + 500 + 20 * MANY) as i64);
    for s in [0, 19, 20, 499, 500, SESSIONS - 1] {
        let want: u64 = if s < 20 {
            MANY + 2
        } else if s < 500 {
            2
        } else {
            1
        };
        let seqs = seqs(&*store, &id(s), 0).await;
        assert_eq!(seqs, (1..=want).collect::<Vec<_>>(), "{}", id(s));
        assert_eq!(store.last_seq(&id(s)).await.unwrap(), want);
    }
    assert!(
        tail > 0,
        "back to the tail once sessions got many events each"
    );
    store.close().await;
}

/// A tail left unmoved (a crash between a batch and the move) is read as
/// part of the log, the next seq follows it, and the reopened store moves
/// it; deleting a session deletes what the tail holds of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tail_left_by_a_crash_is_read_and_moved() {
    let b = common::sqlite();
    let store = SqlStore::open(&b.url).await.unwrap();
    for id in ["left", "other"] {
        store.put_session(&meta(id, 1)).await.unwrap();
        store.append_event(id, 1, b"e1").await.unwrap();
    }
    tail_moved(&b.url).await;
    store.close().await;
    drop(store);
    // What a killed writer leaves: events committed to the tail, not moved.
    {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&b.url).await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO session_event_tail (session_id, seq, body) VALUES
             ('left', 2, x'6532'), ('other', 2, x'6532'), ('left', 3, x'6533')",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    }
    let store = SqlStore::open(&b.url).await.unwrap();
    assert_eq!(store.last_seq("left").await.unwrap(), 3);
    let bodies: Vec<Vec<u8>> = store
        .events_since("left", 1)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    assert_eq!(bodies, [b"e2".to_vec(), b"e3".to_vec()]);
    // The writer reads the cursor through the tail: 3 is taken, 4 is next.
    refused_out_of_order(&store.append_event("left", 3, b"again").await, "sqlite");
    store.append_event("left", 4, b"e4").await.unwrap();
    assert_eq!(tail_moved(&b.url).await, 6);
    assert_eq!(seqs(&store, "left", 0).await, [1, 2, 3, 4]);
    // A delete takes the session's rows from the tail as well as the log.
    store.append_event("left", 5, b"e5").await.unwrap();
    store.append_event("other", 3, b"e3").await.unwrap();
    assert!(store.delete_session("left").await.unwrap());
    assert!(store.events_since("left", 0).await.unwrap().is_empty());
    assert_eq!(store.last_seq("left").await.unwrap(), 0);
    assert_eq!(tail_moved(&b.url).await, 3, "only other's events are left");
    assert_eq!(store.last_seq("other").await.unwrap(), 3);
    assert_eq!(store.integrity_check().await.unwrap(), "ok");
    // Closed right after a write, the store leaves its log in one table.
    store.append_event("other", 4, b"e4").await.unwrap();
    store.close().await;
    assert_eq!(tail_and_log(&b.url).await, (0, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_loses_at_most_the_write_in_flight() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    for b in common::all("kill9").await {
        for round in 0..3 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_omicos-sessionstore-crashwriter"))
                .args([b.url.as_str(), "crash"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut seen = 0u64;
            while seen < 200 * (round + 1) {
                seen = reported(&lines.next().expect("crash writer stopped early").unwrap()).1;
            }
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();

            let s = SqlStore::open(&b.url).await.expect("reopens after kill -9");
            assert_eq!(
                s.integrity_check().await.unwrap(),
                "ok",
                "{} round {round}",
                b.name
            );
            let last = s.last_seq("crash").await.unwrap();
            assert!(
                last >= seen,
                "{}: every reported event committed ({last} < {seen})",
                b.name
            );
            let events = s.events_since("crash", 0).await.unwrap();
            assert_eq!(events.len() as u64, last);
            assert!(
                events
                    .iter()
                    .enumerate()
                    .all(|(i, (seq, body))| *seq == i as u64 + 1
                        && *body == format!("event {seq}").into_bytes())
            );
            // Each write is a message then its event: the history holds every
            // event's message, plus at most the one in flight per kill so far.
            let n = s.messages("crash").await.unwrap().len() as u64;
            assert!(
                n >= last && n <= last + round + 1,
                "{}: {n} messages for {last} events",
                b.name
            );
            s.close().await;
        }
    }
}

/// A crash writer's line: `<writer> <seq>`, both committed.
fn reported(line: &str) -> (usize, u64) {
    let (w, seq) = line.trim().split_once(' ').expect("`<writer> <seq>`");
    (w.parse().unwrap(), seq.parse().unwrap())
}

/// Group commit under kill -9: eight writers whose rows the store commits
/// together. Every event a writer was told is committed is there, each
/// session's log is gap-free with the content written, and each kill loses
/// at most the one write in flight per writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_batched_writes_loses_nothing_committed() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    const WRITERS: usize = 8;
    for b in common::all("kill9batch").await {
        let mut seen = [0u64; WRITERS];
        for round in 0..3u64 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_omicos-sessionstore-crashwriter"))
                .args([b.url.as_str(), "crash", &WRITERS.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            while seen.iter().sum::<u64>() < 800 * (round + 1) {
                let (w, seq) =
                    reported(&lines.next().expect("crash writer stopped early").unwrap());
                seen[w] = seen[w].max(seq);
            }
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();

            let s = SqlStore::open(&b.url).await.expect("reopens after kill -9");
            assert_eq!(
                s.integrity_check().await.unwrap(),
                "ok",
                "{} round {round}",
                b.name
            );
            for (w, seen) in seen.iter_mut().enumerate() {
                let id = format!("crash-{w}");
                let last = s.last_seq(&id).await.unwrap();
                assert!(
                    last >= *seen,
                    "{} {id}: every reported event committed ({last} < {seen})",
                    b.name
                );
                let events = s.events_since(&id, 0).await.unwrap();
                assert_eq!(events.len() as u64, last, "{} {id}", b.name);
                assert!(
                    events
                        .iter()
                        .enumerate()
                        .all(|(i, (seq, body))| *seq == i as u64 + 1
                            && *body == format!("event {seq}").into_bytes()),
                    "{} {id}: gap-free, with the content written",
                    b.name
                );
                let n = s.messages(&id).await.unwrap().len() as u64;
                assert!(
                    n >= last && n <= last + round + 1,
                    "{} {id}: {n} messages for {last} events",
                    b.name
                );
                // The next run continues from what is stored.
                *seen = last;
            }
            s.close().await;
        }
    }
}

/// `stale` is the refusal of an event whose seq is not the session's next.
fn refused_out_of_order(stale: &StoreResult<()>, name: &str) {
    assert!(
        matches!(stale, Err(StoreError::Backend(m)) if m.contains("out of order")),
        "{name}: {stale:?}"
    );
}

/// The next notice about `session` within 5 s (other sessions' notices skipped).
async fn next_notice(
    rx: &mut tokio::sync::broadcast::Receiver<omicos_sessionstore::Notice>,
    session: &str,
) -> omicos_sessionstore::Notice {
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            let n = rx.recv().await.expect("notice bus open");
            if n.session() == Some(session) {
                return n;
            }
        }
    })
    .await
    .expect("a notice within 5 s")
}

/// The next notice for `session` that is not an event's: a receiver made
/// after an append may still get that append's notice (PostgreSQL delivers
/// it asynchronously).
async fn next_non_event_notice(
    rx: &mut tokio::sync::broadcast::Receiver<omicos_sessionstore::Notice>,
    session: &str,
) -> omicos_sessionstore::Notice {
    loop {
        let n = next_notice(rx, session).await;
        if !matches!(n, omicos_sessionstore::Notice::Event { .. }) {
            return n;
        }
    }
}

/// Grants, approvals, cancel requests and their notices cross from one
/// replica's store to another's (two opens of one database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_and_notices_cross_replicas() {
    use omicos_sessionstore::Notice;
    for b in common::all("state").await {
        let a = open(&b.url).await.unwrap();
        let other = open(&b.url).await.unwrap();
        let name = b.name;
        a.put_session(&meta("s", 1)).await.unwrap();
        let mut rx = other.notices();

        // Grants outlive the replica that recorded them.
        a.add_grant("s", "shell").await.unwrap();
        a.add_grant("s", "shell").await.unwrap();
        a.add_grant("s", "file_manager__write").await.unwrap();
        assert_eq!(
            other.grants("s").await.unwrap(),
            ["file_manager__write", "shell"],
            "{name}"
        );

        // An event appended on one replica is announced on the other.
        a.append_event("s", 1, b"e1").await.unwrap();
        assert_eq!(
            next_notice(&mut rx, "s").await,
            Notice::Event {
                session: "s".into(),
                seq: 1
            },
            "{name}"
        );

        // A pending approval decided on the other replica, exactly once.
        assert!(a.try_lease_turn("s", "r1:t1", 60_000).await.unwrap());
        let mut rx_a = a.notices();
        assert!(
            !other.decide_approval("s", "c1", 2, "").await.unwrap(),
            "{name}: nothing pending yet"
        );
        a.put_approval("s", "c1", "r1:t1").await.unwrap();
        assert_eq!(a.approval_decision("s", "c1").await.unwrap(), None);
        // Answered with a rule (ALLOW_SESSION = 2): the rule travels with it.
        assert!(
            other
                .decide_approval("s", "c1", 2, "shell(git *)")
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !other.decide_approval("s", "c1", 3, "").await.unwrap(),
            "{name}: decided once"
        );
        assert_eq!(
            next_non_event_notice(&mut rx_a, "s").await,
            Notice::Approval {
                session: "s".into(),
                call_id: "c1".into(),
                decision: 2,
                rule: "shell(git *)".into(),
            },
            "{name}"
        );
        assert_eq!(
            a.approval_decision("s", "c1").await.unwrap(),
            Some((2, "shell(git *)".to_owned()))
        );
        // Waiting again on the same call forgets the old answer and its rule.
        a.put_approval("s", "c1", "r1:t1").await.unwrap();
        assert_eq!(a.approval_decision("s", "c1").await.unwrap(), None);
        assert!(other.decide_approval("s", "c1", 2, "").await.unwrap());
        assert_eq!(
            next_non_event_notice(&mut rx_a, "s").await,
            Notice::Approval {
                session: "s".into(),
                call_id: "c1".into(),
                decision: 2,
                rule: String::new(),
            },
            "{name}"
        );
        assert_eq!(
            a.approval_decision("s", "c1").await.unwrap(),
            Some((2, String::new()))
        );

        // A cancel request names the turn holding the live lease.
        assert_eq!(
            other.request_cancel("s").await.unwrap().as_deref(),
            Some("r1:t1")
        );
        assert_eq!(
            next_non_event_notice(&mut rx_a, "s").await,
            Notice::Cancel {
                session: "s".into(),
                owner: "r1:t1".into()
            },
            "{name}"
        );
        assert!(a.cancel_requested("s", "r1:t1").await.unwrap());
        assert!(!a.cancel_requested("s", "r2:t9").await.unwrap());
        let lease = a.lease("s").await.unwrap().unwrap();
        assert_eq!((lease.owner.as_str(), lease.turn_id()), ("r1:t1", "t1"));
        assert!(a.expired_leases(now_ms(), 10).await.unwrap().is_empty());
        assert_eq!(
            a.expired_leases(lease.expires_ms, 10).await.unwrap(),
            ["s"],
            "{name}"
        );

        // Releasing the turn forgets its approvals and cancel requests; grants stay.
        a.release_turn("s", "r1:t1").await.unwrap();
        assert_eq!(a.lease("s").await.unwrap(), None);
        assert_eq!(a.approval_decision("s", "c1").await.unwrap(), None);
        assert!(!a.cancel_requested("s", "r1:t1").await.unwrap());
        assert_eq!(
            other.request_cancel("s").await.unwrap(),
            None,
            "{name}: no turn, nothing to cancel"
        );
        assert_eq!(other.grants("s").await.unwrap().len(), 2);

        // Deleting the session deletes its state.
        assert!(a.delete_session("s").await.unwrap());
        assert!(other.grants("s").await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn session_state_on_the_memory_store() {
    let s: Arc<dyn SessionStore> = Arc::new(omicos_sessionstore::MemoryStore::new());
    s.put_session(&meta("s", 1)).await.unwrap();
    let mut rx = s.notices();
    s.add_grant("s", "shell").await.unwrap();
    assert_eq!(s.grants("s").await.unwrap(), ["shell"]);
    assert!(s.try_lease_turn("s", "r:t", 60_000).await.unwrap());
    s.put_approval("s", "c", "r:t").await.unwrap();
    assert!(s.decide_approval("s", "c", 1, "").await.unwrap());
    assert!(!s.decide_approval("s", "c", 1, "").await.unwrap());
    assert!(matches!(
        next_notice(&mut rx, "s").await,
        omicos_sessionstore::Notice::Approval { decision: 1, .. }
    ));
    assert_eq!(s.request_cancel("s").await.unwrap().as_deref(), Some("r:t"));
    assert!(s.cancel_requested("s", "r:t").await.unwrap());
    s.release_turn("s", "r:t").await.unwrap();
    assert!(!s.cancel_requested("s", "r:t").await.unwrap());
    assert_eq!(s.approval_decision("s", "c").await.unwrap(), None);
}

/// SQLite's WAL goes back into the database file by the store's own
/// checkpoints, off the commit path (the write connection never checkpoints):
/// the file grows while nobody closes the store, and the WAL starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_checkpoints_the_wal_while_open() {
    let b = common::sqlite();
    let path = b.url.strip_prefix("sqlite://").unwrap().to_owned();
    let store = SqlStore::open(&b.url).await.unwrap();
    store.put_session(&meta("ck", 1)).await.unwrap();
    let size = |p: &str| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    // Let any checkpoint of the schema's pages pass, then note the size.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let before = size(&path);
    let body = vec![b'x'; 400];
    for seq in 1..=2000u64 {
        store.append_event("ck", seq, &body).await.unwrap();
    }
    let wal = format!("{path}-wal");
    assert!(
        size(&wal) > 800_000,
        "the events are in the WAL first ({} bytes)",
        size(&wal)
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while size(&path) < before + 800_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within 10 s: database {} bytes (was {before}), WAL {}",
            size(&path),
            size(&wal)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The next write after a complete checkpoint starts the WAL over: it
    // does not keep growing past what one checkpoint interval writes.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    store.append_event("ck", 2001, &body).await.unwrap();
    let r: (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(&sqlx::SqlitePool::connect(&b.url).await.unwrap())
        .await
        .unwrap();
    assert!(
        r.1 < 100,
        "the WAL started over: {r:?} (busy, frames, copied)"
    );
    assert_eq!(store.events_since("ck", 0).await.unwrap().len(), 2001);
    store.close().await;
}

/// The group-commit writer keeps SQLite's write connection while idle: a
/// write of the store's own after an append (the writer holding the
/// connection, its queue empty) is not left waiting, nor is the append after
/// it, and close() still returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writer_keeps_its_idle_connection_for_every_write() {
    async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(10), f)
            .await
            .unwrap_or_else(|_| panic!("{what} waited 10 s"))
    }
    let b = common::sqlite();
    let store = SqlStore::open(&b.url).await.unwrap();
    store.put_session(&meta("a", 1)).await.unwrap();
    for round in 0..3u64 {
        store.append_event("a", round + 1, b"e").await.unwrap();
        let s = format!("b{round}");
        within("put_session", store.put_session(&meta(&s, 2)))
            .await
            .unwrap();
        within("add_grant", store.add_grant("a", "shell"))
            .await
            .unwrap();
    }
    within("append", store.append_event("b0", 1, b"e"))
        .await
        .unwrap();
    assert_eq!(store.last_seq("a").await.unwrap(), 3);
    assert_eq!(store.last_seq("b0").await.unwrap(), 1);
    assert!(store.get_session("b2").await.unwrap().is_some());
    within("close", store.close()).await;
}

/// The store's other writes share SQLite's one write connection with the
/// group-commit writer: under a stream of appends from many sessions, new
/// sessions, leases and grants are written without "database is locked",
/// and close() returns (the writer gives the connection back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_share_one_connection_with_the_batches() {
    let b = common::sqlite();
    let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let s = store.clone();
        tasks.spawn(async move {
            let id = format!("w{i}");
            s.put_session(&meta(&id, i)).await.unwrap();
            for seq in 1..=50u64 {
                s.append_event(&id, seq, b"delta").await.unwrap();
                if seq % 10 == 0 {
                    assert!(s.try_lease_turn(&id, "me", 60_000).await.unwrap());
                    s.add_grant(&id, &format!("tool{seq}")).await.unwrap();
                    s.release_turn(&id, "me").await.unwrap();
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    for i in 0..40 {
        let id = format!("w{i}");
        assert_eq!(store.last_seq(&id).await.unwrap(), 50);
        assert_eq!(store.grants(&id).await.unwrap().len(), 5);
        assert!(store.lease(&id).await.unwrap().is_none());
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), store.close())
        .await
        .expect("close returns");
}

/// On SQLite the store's own writes to a session's metadata and turn lease
/// run inside the group-commit writer's batches: queued at once with
/// appends, each still gets its own answer (taken, refused, no such
/// session), and every row of the batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_own_writes_in_a_batch_keep_their_answers() {
    let b = common::sqlite();
    let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
    for id in ["held", "free", "rows"] {
        store.put_session(&meta(id, 1)).await.unwrap();
    }
    assert!(store.try_lease_turn("held", "other", 60_000).await.unwrap());
    for round in 0..20u64 {
        let (s1, s2, s3, s4, s5) = (
            store.clone(),
            store.clone(),
            store.clone(),
            store.clone(),
            store.clone(),
        );
        let owner = format!("me{round}");
        let (held, free, missing, appended, created) = tokio::join!(
            async move { s1.try_lease_turn("held", "me", 60_000).await },
            async move { s2.try_lease_turn("free", &owner, 60_000).await },
            async move { s3.try_lease_turn("missing", "me", 60_000).await },
            async move {
                s4.append_events("rows", round * 2 + 1, vec![b"a".to_vec(), b"b".to_vec()])
                    .await
            },
            async move { s5.put_session(&meta(&format!("new{round}"), 2)).await },
        );
        assert!(!held.unwrap(), "another owner's live lease is refused");
        assert!(free.unwrap(), "a free lease is taken");
        assert!(
            matches!(missing, Err(StoreError::NotFound(_))),
            "{missing:?}"
        );
        appended.unwrap();
        created.unwrap();
        store
            .release_turn("free", &format!("me{round}"))
            .await
            .unwrap();
    }
    assert_eq!(store.last_seq("rows").await.unwrap(), 40);
    assert_eq!(store.lease("held").await.unwrap().unwrap().owner, "other");
    assert!(store.lease("free").await.unwrap().is_none());
    assert!(store.get_session("new19").await.unwrap().is_some());
    assert_eq!(store.integrity_check().await.unwrap(), "ok");
}

/// On SQLite, grants, approvals and cancel requests are written in the
/// group-commit writer's batches too, among appends: each keeps its answer
/// (one decision of many racing wins; a cancel names the lease's owner and
/// is announced), and nothing of the batches around them is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_approvals_and_cancels_in_batches_keep_their_answers() {
    let b = common::sqlite();
    let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
    store.put_session(&meta("s", 1)).await.unwrap();
    assert!(store.try_lease_turn("s", "turn-1", 60_000).await.unwrap());
    // Appends stream while the other writes come.
    let appender = {
        let s = store.clone();
        tokio::spawn(async move {
            for seq in 1..=200u64 {
                s.append_event("s", seq, b"delta").await.unwrap();
            }
        })
    };
    store.put_approval("s", "call-1", "turn-1").await.unwrap();
    let mut notices = store.notices();
    let mut deciders = tokio::task::JoinSet::new();
    for i in 0..8 {
        let s = store.clone();
        deciders.spawn(async move {
            let decision = if i % 2 == 0 { 1 } else { 2 };
            let won = s
                .decide_approval("s", "call-1", decision, &format!("rule{i}"))
                .await
                .unwrap();
            won.then_some((decision, format!("rule{i}")))
        });
    }
    let mut winners = Vec::new();
    while let Some(r) = deciders.join_next().await {
        winners.extend(r.unwrap());
    }
    assert_eq!(winners.len(), 1, "exactly one decision wins: {winners:?}");
    assert_eq!(
        store.approval_decision("s", "call-1").await.unwrap(),
        Some(winners[0].clone())
    );
    store.add_grant("s", "shell").await.unwrap();
    store.add_grant("s", "shell").await.unwrap();
    assert_eq!(store.grants("s").await.unwrap(), ["shell"]);
    assert_eq!(
        store.request_cancel("s").await.unwrap().as_deref(),
        Some("turn-1")
    );
    assert!(store.cancel_requested("s", "turn-1").await.unwrap());
    assert_eq!(store.request_cancel("nobody").await.unwrap(), None);
    // The decision and the cancel were announced on the bus (among the
    // appends' notices; the bus keeps the last 4,096).
    let (mut approval, mut cancel) = (false, false);
    while let Ok(n) = notices.try_recv() {
        match n {
            omicos_sessionstore::Notice::Approval { call_id, .. } => {
                approval |= call_id == "call-1"
            }
            omicos_sessionstore::Notice::Cancel { owner, .. } => cancel |= owner == "turn-1",
            _ => {}
        }
    }
    assert!(approval && cancel, "approval {approval}, cancel {cancel}");
    store.clear_approval("s", "call-1").await.unwrap();
    assert_eq!(store.approval_decision("s", "call-1").await.unwrap(), None);
    appender.await.unwrap();
    assert_eq!(store.last_seq("s").await.unwrap(), 200);
    store.release_turn("s", "turn-1").await.unwrap();
    assert!(!store.cancel_requested("s", "turn-1").await.unwrap());
    assert_eq!(store.integrity_check().await.unwrap(), "ok");
}

/// SQLite's writer runs its batches on the runtime's threads. When another
/// connection holds the write lock, its `BEGIN` waits without blocking the
/// runtime: on a one-thread runtime, the holder (a task of that runtime)
/// still runs, commits, and the append then lands.
#[tokio::test]
async fn sqlite_writer_waits_for_the_write_lock_without_blocking_the_runtime() {
    use sqlx::Connection;
    let b = common::sqlite();
    let store = SqlStore::open(&b.url).await.unwrap();
    store.put_session(&meta("s", 1)).await.unwrap();
    let mut other = sqlx::SqliteConnection::connect(&b.url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let s = store.clone();
    let append = tokio::spawn(async move { s.append_event("s", 1, b"e").await });
    // This task still runs while the writer waits for the lock.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!append.is_finished(), "the append waits for the lock");
    sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), append)
        .await
        .expect("the append lands once the lock is free")
        .unwrap()
        .unwrap();
    assert_eq!(store.last_seq("s").await.unwrap(), 1);
    store.close().await;
}

/// Events of many sessions written at once (batches of hundreds of sessions,
/// whose notices PostgreSQL carries several sessions to a notification) are
/// each announced on another replica, with the session's last seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sessions_events_are_announced_on_another_replica() {
    use omicos_sessionstore::Notice;
    const SESSIONS: usize = 400;
    for b in common::all("announce").await {
        let a = open(&b.url).await.unwrap();
        let other = open(&b.url).await.unwrap();
        let ids: Vec<String> = (0..SESSIONS)
            .map(|i| format!("{:08x}-announce-{i}", i * 7919))
            .collect();
        for id in &ids {
            a.put_session(&meta(id, 1)).await.unwrap();
        }
        let mut rx = other.notices();
        // Two appends per session, all sessions at once: each batch holds
        // many sessions.
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids.clone() {
            let a = a.clone();
            tasks.spawn(async move {
                a.append_event(&id, 1, b"e1").await.unwrap();
                a.append_events(&id, 2, vec![b"e2".to_vec(), b"e3".to_vec()])
                    .await
                    .unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let mut last: std::collections::HashMap<String, u64> = Default::default();
        let all_seen = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while last.len() < SESSIONS || last.values().any(|s| *s < 3) {
                match rx.recv().await.expect("notice bus open") {
                    Notice::Event { session, seq } => {
                        let e = last.entry(session).or_default();
                        assert!(seq > *e, "{}: seqs announced in order", b.name);
                        *e = seq;
                    }
                    other => panic!("{}: unexpected notice {other:?}", b.name),
                }
            }
        })
        .await;
        assert!(
            all_seen.is_ok(),
            "{}: {} of {SESSIONS} sessions announced up to seq 3",
            b.name,
            last.values().filter(|s| **s == 3).count()
        );
        let mut announced: Vec<&String> = last.keys().collect();
        announced.sort();
        let mut want: Vec<&String> = ids.iter().collect();
        want.sort();
        assert_eq!(announced, want, "{}", b.name);
    }
}

/// Turn marks, checkpoints, rewind and fork (issue 40), the same on every
/// store: a rewind hides the end of the history (kept in the store, appends
/// go on after it), a path keeps its first prior per turn, a fork copies the
/// history, the marks and checkpoints before its point, and a delete takes
/// it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_checkpoints_rewind_and_fork_on_every_backend() {
    use omicos_sessionstore::{FileCheckpoint, TurnMark};
    let mut stores: Vec<(Arc<dyn SessionStore>, String)> =
        vec![(open("memory:").await.unwrap(), "memory".into())];
    let backends = common::all("rewind").await;
    for b in &backends {
        stores.push((open(&b.url).await.unwrap(), b.name.to_string()));
    }
    let cp = |path: &str, prior: &[u8], created: bool| FileCheckpoint {
        path: path.into(),
        created,
        too_large: false,
        prior: prior.to_vec(),
    };
    for (s, name) in stores {
        s.put_session(&meta("p", 1)).await.unwrap();
        for (t, first) in [("t1", 0u64), ("t2", 2), ("t3", 4)] {
            s.mark_turn(
                "p",
                &TurnMark {
                    turn_id: t.into(),
                    first_message: first,
                    first_seq: first + 1,
                },
            )
            .await
            .unwrap();
            s.append_messages(
                "p",
                &[HistoryItem::user(t), HistoryItem::user(format!("{t} done"))],
            )
            .await
            .unwrap();
        }
        s.keep_file_changes("p", "t2", &[cp("a", b"\x00first\xff", false)])
            .await
            .unwrap();
        s.keep_file_changes("p", "t2", &[cp("a", b"second", false), cp("n", b"", true)])
            .await
            .unwrap();
        s.keep_file_changes("p", "t3", &[cp("a", b"third", false)])
            .await
            .unwrap();
        let mut got = s.file_checkpoints("p", &["t2".into()]).await.unwrap();
        got.sort_by(|a, b| a.1.path.cmp(&b.1.path));
        assert_eq!(
            got,
            [
                ("t2".to_string(), cp("a", b"\x00first\xff", false)),
                ("t2".to_string(), cp("n", b"", true))
            ],
            "{name}"
        );

        // Fork at t2: four messages, the marks and checkpoints of t1 and t2.
        let mut f = meta("f", 2);
        f.title = "forked".into();
        let history = s.messages("p").await.unwrap();
        s.fork_session("p", "t2", &f, &history[..4]).await.unwrap();
        assert_eq!(s.messages("f").await.unwrap(), history[..4], "{name}");
        let marks: Vec<String> = s
            .turns("f")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.turn_id)
            .collect();
        assert_eq!(marks, ["t1", "t2"], "{name}");
        assert_eq!(
            s.file_checkpoints("f", &["t2".into(), "t3".into()])
                .await
                .unwrap()
                .len(),
            2,
            "{name}"
        );
        assert_eq!(
            s.forked_from("f").await.unwrap(),
            Some(("p".into(), "t2".into())),
            "{name}"
        );

        // Rewind t2 and t3: two messages stay; the next append follows them.
        s.rewind("p", 2, &["t2".into(), "t3".into()]).await.unwrap();
        let marks: Vec<String> = s
            .turns("p")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.turn_id)
            .collect();
        assert_eq!(marks, ["t1"], "{name}");
        assert_eq!(s.messages("p").await.unwrap(), history[..2], "{name}");
        s.append_messages("p", &[HistoryItem::user("t4")])
            .await
            .unwrap();
        let after = s.messages("p").await.unwrap();
        assert_eq!(after.len(), 3, "{name}");
        assert_eq!(after[2], HistoryItem::user("t4"), "{name}");

        assert!(s.rename_session("p", "renamed").await.unwrap(), "{name}");
        assert_eq!(s.get_session("p").await.unwrap().unwrap().title, "renamed");
        assert!(!s.rename_session("nope", "x").await.unwrap(), "{name}");

        assert!(s.delete_session("f").await.unwrap());
        assert!(s.turns("f").await.unwrap().is_empty(), "{name}");
        assert!(
            s.file_checkpoints("f", &["t2".into()])
                .await
                .unwrap()
                .is_empty(),
            "{name}"
        );
        assert_eq!(s.forked_from("f").await.unwrap(), None, "{name}");
    }
}
