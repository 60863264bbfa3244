//! Two orchestrator replicas on one PostgreSQL database (issue 13, points 3
//! and 4): ApproveTool and CancelTurn through the replica that does not run
//! the turn, an allow-for-session grant that holds on the other replica, and
//! a turn whose orchestrator was lost, closed by the survivor as INTERRUPTED.
//! SKIPPED without PostgreSQL (a failure under CI=true, see omicos-testdb).

use omicos_e2e::stack::{ChatHandle, done_reason, finished_calls};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_orchestrator::config::TurnRecovery;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelTurnRequest, ChatEvent, ChatRequest, Decision,
    ToolCallStarted, ToolStatus, TurnMoved, TurnStarted, chat_event,
};
use omicos_sessionstore::SessionStore;
use prost::Message;
use std::time::{Duration, Instant};

fn req(session: &str, message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn write(call: &str, path: &str) -> Reply {
    Reply::Tools(
        String::new(),
        vec![(
            call.into(),
            "file_manager__write".into(),
            format!(r#"{{"path":"{path}","content":"x"}}"#),
        )],
    )
}

/// A stack on a fresh PostgreSQL schema plus a second orchestrator replica.
async fn two_replicas(
    test: &str,
    llm: &FakeLlm,
) -> Option<(Stack, String, omicos_testdb::Backend)> {
    two_replicas_recovering(test, llm, TurnRecovery::Resume).await
}

async fn two_replicas_recovering(
    test: &str,
    llm: &FakeLlm,
    recovery: TurnRecovery,
) -> Option<(Stack, String, omicos_testdb::Backend)> {
    let pg = omicos_testdb::postgres(test, "orep").await?;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url: pg.url.clone(),
            tweak: Some(Box::new(
                move |c: &mut omicos_orchestrator::config::Config| {
                    c.turn_lease = Duration::from_secs(5);
                    c.turn_recovery = recovery;
                },
            )),
            ..Default::default()
        },
    )
    .await;
    let other = stack.add_replica().await;
    Some((stack, other, pg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approve_and_cancel_through_the_other_replica() {
    let llm = FakeLlm::start(vec![
        write("c_w", "a.txt"),
        Reply::Text("written".into()),
        Reply::Tools(
            String::new(),
            vec![(
                "c_sleep".into(),
                "shell".into(),
                r#"{"command":"sleep 30"}"#.into(),
            )],
        ),
        Reply::Text("never".into()),
    ])
    .await;
    let Some((stack, other, _pg)) = two_replicas("approve_cancel_other", &llm).await else {
        return;
    };
    let mut b = omicos_e2e::client_at(&other).await;

    // The approval, answered through the replica that does not run the turn.
    let mut chat = stack.chat(req("", "write a.txt", "auto")).await.unwrap();
    let call = chat.until_approval().await;
    let session = chat.events[0].session_id.clone();
    let asked = Instant::now();
    b.approve_tool(ApproveToolRequest {
        session_id: session.clone(),
        call_id: call.clone(),
        decision: Decision::AllowOnce as i32,
        rule: String::new(),
    })
    .await
    .expect("the other replica accepts the decision");
    let events = chat.until_done().await;
    eprintln!(
        "approve via the other replica → turn done: {:?}",
        asked.elapsed()
    );
    assert!(events.iter().any(|e| matches!(&e.kind,
        Some(chat_event::Kind::ToolApprovalResolved(r)) if r.decision == Decision::AllowOnce as i32)));
    assert_eq!(finished_calls(&events)[0].status(), ToolStatus::Done);
    assert_eq!(
        std::fs::read_to_string(stack.workspace.join("a.txt")).unwrap(),
        "x"
    );
    // A second decision for the same call is refused: nothing is pending any more.
    let again = b
        .approve_tool(ApproveToolRequest {
            session_id: session.clone(),
            call_id: call,
            decision: Decision::Deny as i32,
            rule: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::NotFound);

    // CancelTurn through the other replica stops a running tool and the turn.
    let mut chat = stack.chat(req(&session, "sleep", "full")).await.unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            break;
        }
    }
    let asked = Instant::now();
    let r = b
        .cancel_turn(CancelTurnRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.cancelled, "the other replica found the turn to cancel");
    let events = chat.until_done().await;
    eprintln!(
        "cancel via the other replica → turn done: {:?}",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "not the 30 s sleep"
    );
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    // No turn runs now: nothing to cancel.
    let r = b
        .cancel_turn(CancelTurnRequest {
            session_id: session,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.cancelled);
    llm.assert_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_holds_for_the_next_turn_on_the_other_replica() {
    let llm = FakeLlm::start(vec![
        write("c1", "one.txt"),
        Reply::Text("one".into()),
        write("c2", "two.txt"),
        Reply::Text("two".into()),
    ])
    .await;
    let Some((stack, other, _pg)) = two_replicas("grant_other_replica", &llm).await else {
        return;
    };
    let mut chat = stack.chat(req("", "write one", "auto")).await.unwrap();
    let call = chat.until_approval().await;
    let session = chat.events[0].session_id.clone();
    chat.approve(&call, Decision::AllowSession).await;
    assert_eq!(
        done_reason(&chat.until_done().await).as_deref(),
        Some("completed")
    );

    // The next turn lands on the other replica: no approval is asked again.
    let b = omicos_e2e::client_at(&other).await;
    let events = ChatHandle::open(b, req(&session, "write two", "auto"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, Some(chat_event::Kind::ToolApprovalRequest(_)))),
        "the grant made on replica one holds on replica two: {events:#?}"
    );
    assert_eq!(finished_calls(&events)[0].status(), ToolStatus::Done);
    assert!(stack.workspace.join("two.txt").exists());
}

/// What a lost orchestrator leaves behind: a turn started in the log, a tool
/// call started and never finished, the assistant message asking for it, and
/// a lease nobody renews.
async fn leave_a_lost_turn(store: &dyn SessionStore, session: &str) -> u64 {
    store
        .put_session(&omicos_sessionstore::SessionMeta {
            id: session.into(),
            title: "lost".into(),
            // The test stacks' principal (TEST_TOKEN): its owner may Attach.
            tenant: "default".into(),
            subject: "tester".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ev = |seq: u64, kind| ChatEvent {
        session_id: session.into(),
        turn_id: "t_lost".into(),
        event_seq: seq,
        execution_context_id: "root".into(),
        agent_id: "omicos".into(),
        timestamp_ms: omicos_sessionstore::now_ms(),
        kind: Some(kind),
        cut_values: vec![],
    };
    assert!(
        store
            .try_lease_turn(session, "dead-replica:t_lost", 5_000)
            .await
            .unwrap()
    );
    store
        .append_event(
            session,
            1,
            &ev(1, chat_event::Kind::TurnStarted(TurnStarted::default())).encode_to_vec(),
        )
        .await
        .unwrap();
    store
        .append_messages(
            session,
            &[
                omicos_history::HistoryItem::user("go"),
                omicos_history::HistoryItem::Assistant(omicos_history::AssistantMessage {
                    tool_calls: Some(vec![omicos_history::ToolCall::function(
                        "c_lost", "shell", "{}",
                    )]),
                    ..Default::default()
                }),
            ],
        )
        .await
        .unwrap();
    store
        .append_event(
            session,
            2,
            &ev(
                2,
                chat_event::Kind::ToolCallStarted(ToolCallStarted {
                    call_id: "c_lost".into(),
                    name: "shell".into(),
                    arguments: "{}".into(),
                }),
            )
            .encode_to_vec(),
        )
        .await
        .unwrap();
    2
}

async fn attach_until_done(url: String, session: String) -> (Vec<ChatEvent>, Duration) {
    let t0 = Instant::now();
    let mut c = omicos_e2e::client_at(&url).await;
    let mut s = c
        .attach(AttachRequest {
            session_id: session,
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = vec![];
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(20), s.message())
        .await
        .expect("an event within 20 s")
    {
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        let done = matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)));
        out.push(ev);
        if done {
            break;
        }
    }
    (out, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_orchestrators_turn_is_closed_once_as_interrupted() {
    let llm = FakeLlm::start(vec![Reply::Text("after the loss".into())]).await;
    let Some((stack, other, pg)) =
        two_replicas_recovering("lost_turn_interrupted", &llm, TurnRecovery::Interrupt).await
    else {
        return;
    };
    let store = omicos_sessionstore::open(&pg.url).await.unwrap();
    let session = "s-lost";
    let before = leave_a_lost_turn(store.as_ref(), session).await;
    // Clients attached through both replicas while the lease runs out.
    let (a, b) = tokio::join!(
        attach_until_done(stack.orchestrator.clone(), session.into()),
        attach_until_done(other.clone(), session.into()),
    );
    for (events, took) in [&a, &b] {
        eprintln!("lost orchestrator → client saw INTERRUPTED after {took:?}");
        let seqs: Vec<u64> = events.iter().map(|e| e.event_seq).collect();
        assert_eq!(
            seqs,
            [1, 2, 3, 4],
            "no event lost or duplicated: {events:#?}"
        );
        let f = &finished_calls(events)[0];
        assert_eq!(f.call_id, "c_lost");
        assert_eq!(f.status(), ToolStatus::Error);
        assert!(
            f.result.contains("orchestrator running this turn was lost"),
            "{}",
            f.result
        );
        assert_eq!(done_reason(events).as_deref(), Some("interrupted"));
        assert!(
            *took < Duration::from_secs(5 + 5),
            "within the lease and a few seconds"
        );
    }
    assert_eq!(
        store.last_seq(session).await.unwrap(),
        before + 2,
        "closed exactly once"
    );
    // The recovering replica gives the lease back after it wrote the close,
    // which the clients may see first.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.lease(session).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease is still held: {:?}",
            store.lease(session).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The history answers the interrupted call, so the next turn's request is well formed.
    let events = stack
        .chat(req(session, "again", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let sent = llm.requests()[0].body.to_string();
    assert!(
        sent.contains("c_lost") && sent.contains("interrupted"),
        "{sent}"
    );
    llm.assert_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_orchestrators_turn_is_resumed_once_by_one_replica() {
    let llm = FakeLlm::start(vec![Reply::Text("resumed and answered".into())]).await;
    let Some((stack, other, pg)) = two_replicas("lost_turn_resumed", &llm).await else {
        return;
    };
    let store = omicos_sessionstore::open(&pg.url).await.unwrap();
    let session = "s-resumed";
    leave_a_lost_turn(store.as_ref(), session).await;
    // Clients attached through both replicas while the lease runs out.
    let (a, b) = tokio::join!(
        attach_until_done(stack.orchestrator.clone(), session.into()),
        attach_until_done(other.clone(), session.into()),
    );
    for (events, _) in [&a, &b] {
        let seqs: Vec<u64> = events.iter().map(|e| e.event_seq).collect();
        let want: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, want, "no event lost or duplicated: {events:#?}");
        let moved: Vec<&TurnMoved> = events
            .iter()
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::TurnMoved(m)) => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(moved.len(), 1, "one TurnMoved: {events:#?}");
        // No runner holds the fabricated call: it is answered as lost, not run.
        assert_eq!(moved[0].lost_calls, ["c_lost"]);
        assert!(moved[0].reattached_calls.is_empty());
        assert!(!moved[0].model_request_reissued);
        let f = &finished_calls(events)[0];
        assert_eq!(f.call_id, "c_lost");
        assert_eq!(f.status(), ToolStatus::Error);
        assert!(
            f.result.contains(omicos_orchestrator::engine::resume::LOST),
            "{}",
            f.result
        );
        assert!(
            events.iter().all(|e| e.turn_id == "t_lost"),
            "one continuous turn, under its own id"
        );
        assert_eq!(done_reason(events).as_deref(), Some("completed"));
    }
    assert_eq!(
        a.0.iter().map(|e| e.event_seq).collect::<Vec<_>>(),
        b.0.iter().map(|e| e.event_seq).collect::<Vec<_>>(),
        "both replicas' clients see the same turn"
    );
    assert_eq!(llm.requests().len(), 1, "one model request, by one replica");
    let sent = llm.requests()[0].body.to_string();
    assert!(sent.contains("c_lost") && sent.contains("lost:"), "{sent}");
    assert_eq!(
        store.lease(session).await.unwrap(),
        None,
        "released at the end"
    );
    let history = store.messages(session).await.unwrap();
    assert!(
        matches!(history.last(), Some(omicos_history::HistoryItem::Assistant(a)) if a.content == "resumed and answered"),
        "{history:?}"
    );
    llm.assert_invariants();
}

/// A tool-runner of its own on a loopback port, with its own workspace.
async fn runner(workspace: &std::path::Path) -> (String, omicos_servicekit::Shutdown) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cfg: omicos_tool_runner::Config =
        serde_json::from_value(serde_json::json!({"workspace": workspace, "approval_timeout": 5}))
            .unwrap();
    let sd = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
    tokio::spawn(omicos_tool_runner::run(cfg, listener, sd.clone(), vec![]));
    (url, sd)
}

/// A TCP proxy in front of `upstream`; cancelling the token drops every
/// connection and the listener at once, which the orchestrator sees exactly as
/// a runner killed with SIGKILL (connections reset, then refused). A graceful
/// shutdown would not do: the runner answers its calls as cancelled.
async fn cuttable(upstream: String) -> (String, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cut = tokio_util::sync::CancellationToken::new();
    let token = cut.clone();
    let up = upstream.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = tokio::select! {
                _ = token.cancelled() => return,
                a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
            };
            let up = up.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(up).await else {
                    return;
                };
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    (url, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_lost_mid_call_fails_that_call_only() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (real_a, _sd_a) = runner(dirs[0].path()).await;
    let (real_b, _sd_b) = runner(dirs[1].path()).await;
    let (url_a, sd_a) = cuttable(real_a).await;
    let (url_b, sd_b) = cuttable(real_b).await;
    let list = format!("{url_a}, {url_b}");
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c_long".into(),
                "shell".into(),
                r#"{"command":"touch here && sleep 30"}"#.into(),
            )],
        ),
        Reply::Tools(
            String::new(),
            vec![(
                "c_next".into(),
                "shell".into(),
                r#"{"command":"echo next"}"#.into(),
            )],
        ),
        Reply::Text("went on".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            tweak: Some(Box::new(
                move |c: &mut omicos_orchestrator::config::Config| {
                    c.tool_runner = list;
                    c.runner_refresh = Duration::from_millis(500);
                },
            )),
            ..Default::default()
        },
    )
    .await;
    let mut chat = stack
        .chat(req("", "long then short", "full"))
        .await
        .unwrap();
    // Which runner took the long call: the one whose workspace got the file.
    let t0 = Instant::now();
    let lost = loop {
        if let Some(i) = dirs.iter().position(|d| d.path().join("here").exists()) {
            break i;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the long call never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let killed = Instant::now();
    [&sd_a, &sd_b][lost].cancel();
    let events = chat.until_done().await;
    let calls = finished_calls(&events);
    eprintln!(
        "runner lost mid-call → client saw the error after {:?}",
        killed.elapsed()
    );
    assert_eq!(calls.len(), 2, "{events:#?}");
    assert_eq!(calls[0].call_id, "c_long");
    assert_eq!(calls[0].status(), ToolStatus::Error);
    assert!(
        calls[0]
            .result
            .contains(omicos_orchestrator::runner_client::RUNNER_LOST),
        "{}",
        calls[0].result
    );
    assert_eq!(
        calls[1].status(),
        ToolStatus::Done,
        "the next call went to the live runner: {}",
        calls[1].result
    );
    assert!(calls[1].result.contains("next"));
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    omicos_e2e::assert_gap_free(&events, 0);
    llm.assert_invariants();
}
