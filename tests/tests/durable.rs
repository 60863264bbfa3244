//! Durable sessions: the conversation store keeps history and the event log,
//! so a restarted orchestrator continues a chat and Attach replays old
//! events; with PostgreSQL two replicas serve one session, one turn at a time.

use omicos_e2e::stack::{ChatHandle, assert_gap_free, done_reason};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, events_text};
use omicos_proto::{AttachRequest, ChatRequest, ListSessionsRequest, chat_event};
use std::time::Duration;

fn req(session: &str, message: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

async fn attach_all(url: &str, session: &str, since: u64) -> Vec<omicos_proto::ChatEvent> {
    let mut c = omicos_e2e::client_at(url).await;
    let mut s = c
        .attach(AttachRequest {
            session_id: session.into(),
            since_seq: since,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = vec![];
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .unwrap()
    {
        if !matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            out.push(ev);
        }
    }
    out
}

#[tokio::test]
async fn restart_mid_conversation_on_sqlite() {
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c1".into(),
                "file_manager__write".into(),
                r#"{"path":"k.txt","content":"kiwi"}"#.into(),
            )],
        ),
        Reply::Text("saved kiwi".into()),
        Reply::Text("you said kiwi".into()),
    ])
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let db = format!(
        "sqlite://{}",
        tmp.path().join(".omicos/sessions.db").display()
    );
    std::fs::create_dir_all(tmp.path().join(".omicos")).unwrap();
    let mut stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url: db,
            workspace: Some(tmp.path().into()),
            ..Default::default()
        },
    )
    .await;
    let first = stack
        .chat(req("", "save kiwi"))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = first[0].session_id.clone();
    let last = first.last().unwrap().event_seq;
    stack.restart_orchestrator().await;
    // Attach on the new process replays from an old seq.
    let replayed = attach_all(&stack.orchestrator, &session, 2).await;
    assert_gap_free(&replayed, 2);
    assert_eq!(replayed.last().unwrap().event_seq, last);
    assert_eq!(
        replayed.iter().map(|e| e.event_seq).collect::<Vec<_>>(),
        first[2..].iter().map(|e| e.event_seq).collect::<Vec<_>>()
    );
    // The chat continues with its history, and the seq goes on without a gap.
    let second = stack
        .chat(req(&session, "what did I save?"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_gap_free(&second, last);
    assert_eq!(events_text(&second), "you said kiwi");
    let third_req = llm.requests()[2].body.to_string();
    assert!(
        third_req.contains("save kiwi")
            && third_req.contains("saved kiwi")
            && third_req.contains("c1"),
        "{third_req}"
    );
    llm.assert_invariants();
    let sessions = stack
        .client()
        .await
        .list_sessions(ListSessionsRequest { limit: 10 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sessions.sessions.len(), 1);
    assert_eq!(sessions.sessions[0].title, "save kiwi");
}

#[tokio::test]
async fn two_replicas_on_postgres_one_turn_at_a_time() {
    // A fresh schema; SKIPPED without PostgreSQL, a failure under CI=true.
    let Some(pg) = omicos_testdb::postgres("two_replicas_on_postgres", "oe2e").await else {
        return;
    };
    let url = pg.url.clone();
    let slow: String = (0..30).map(|i| format!("w{i} ")).collect();
    let llm = FakeLlm::start(vec![
        Reply::Slow(slow, Duration::from_millis(30)),
        Reply::Text("replica two answers".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url: url,
            ..Default::default()
        },
    )
    .await;
    let replica = stack.add_replica().await;
    let mut a = stack.chat(req("", "long turn")).await.unwrap();
    let first = a.next().await.unwrap();
    let session = first.session_id.clone();
    // The second replica refuses a second turn on the busy session.
    let client_b = omicos_e2e::client_at(&replica).await;
    let busy = ChatHandle::open(client_b.clone(), req(&session, "me too"))
        .await
        .err()
        .expect("refused while busy");
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition);
    assert!(busy.message().contains("busy"), "{}", busy.message());
    // Replica two follows the live turn from the store.
    let followed = attach_all(&replica, &session, 0).await;
    let done_a = a.until_done().await;
    assert_eq!(done_reason(&done_a).as_deref(), Some("completed"));
    assert_eq!(
        followed.last().map(|e| e.event_seq),
        done_a.last().map(|e| e.event_seq),
        "attach on the other replica saw the whole turn"
    );
    // Then replica two serves the session's next turn, with the history.
    let b = ChatHandle::open(client_b, req(&session, "next"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(events_text(&b), "replica two answers");
    assert_gap_free(&b, done_a.last().unwrap().event_seq);
    assert!(llm.requests()[1].body.to_string().contains("long turn"));
}

/// A replica whose lease renewal is refused (another replica took the turn
/// over: a partition, a stalled store) stops the turn at once and writes
/// nothing more of it, so a turn never runs on two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_lease_was_taken_stops_writing_here() {
    let llm = FakeLlm::start(vec![Reply::Streamed {
        text: "a long answer that streams for many seconds, chunk after chunk after chunk".into(),
        chunks: 60,
        delay: Duration::from_millis(200),
        calls: vec![],
    }])
    .await;
    let flaky = omicos_e2e::FlakyStore::new(omicos_sessionstore::open("memory:").await.unwrap());
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store: Some(flaky.clone()),
            tweak: Some(Box::new(|c: &mut omicos_orchestrator::config::Config| {
                c.turn_lease = Duration::from_secs(5)
            })),
            ..Default::default()
        },
    )
    .await;
    let mut chat = stack.chat(req("", "talk for long")).await.unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::TextDelta(_))) {
            break;
        }
    }
    let session = chat.events[0].session_id.clone();
    // Another replica takes the lease: this one's next renewal is refused.
    flaky.fail(
        omicos_e2e::flaky_store::Op::LeaseTaken,
        omicos_sessionstore::StoreError::Backend("taken".into()),
    );
    use omicos_sessionstore::SessionStore;
    // The log stops growing: no more deltas and no turn_done from here.
    let mut last = flaky.last_seq(&session).await.unwrap();
    let mut still = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = flaky.last_seq(&session).await.unwrap();
        if now == last {
            still += 1;
            if still == 4 {
                break;
            }
        } else {
            (last, still) = (now, 0);
        }
    }
    assert_eq!(still, 4, "the fenced turn stopped writing its events");
    let log = flaky.events_since(&session, 0).await.unwrap();
    let done = log.iter().any(|(_, b)| {
        matches!(
            <omicos_proto::ChatEvent as prost::Message>::decode(b.as_slice()).map(|e| e.kind),
            Ok(Some(chat_event::Kind::TurnDone(_)))
        )
    });
    assert!(!done, "the turn's end is the other replica's to write");
    let history = flaky.messages(&session).await.unwrap();
    assert!(
        !history
            .iter()
            .any(|m| matches!(m, omicos_history::HistoryItem::Assistant(_))),
        "no partial answer written from the fenced replica: {history:?}"
    );
    // 60 chunks of 200 ms would still be streaming: the model request was cancelled.
    assert!(
        (last as usize) < 40,
        "stopped well before the answer's end (last seq {last})"
    );
}
