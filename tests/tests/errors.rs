//! Errors answered right: each failure reaches the client with its gRPC code
//! and its kind (`omicos-error-kind` metadata on a status, `ErrorEvent.kind`
//! in a stream), from the one mapping in the orchestrator's error.rs.

use omicos_e2e::stack::{assert_gap_free, done_reason};
use omicos_e2e::{FakeLlm, FlakyStore, Op, Reply, Stack, StackOptions};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, ChatRequest, Decision, DeleteSessionRequest,
    GetSessionRequest, ListAgentToolsRequest, chat_event,
};
use omicos_sessionstore::StoreError;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

fn req(message: &str) -> ChatRequest {
    ChatRequest {
        message: message.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

/// Asserts the status's code and kind.
#[track_caller]
fn assert_status(s: &tonic::Status, code: Code, kind: &str) {
    assert_eq!(s.code(), code, "{s:?}");
    assert_eq!(
        s.metadata()
            .get(ERROR_KIND_METADATA)
            .and_then(|v| v.to_str().ok()),
        Some(kind),
        "{s:?}"
    );
}

#[tokio::test]
async fn each_refusal_has_its_code_and_kind() {
    let llm = FakeLlm::start(vec![
        Reply::Slow("still thinking about it".into(), Duration::from_millis(300)),
        Reply::Text("done".into()),
    ])
    .await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let mut client = stack.client().await;

    let missing = || GetSessionRequest {
        session_id: "no-such-session".into(),
    };
    let s = client.get_session(missing()).await.unwrap_err();
    assert_status(&s, Code::NotFound, "session_not_found");
    assert!(s.message().contains("no-such-session"), "{s:?}");
    let s = client
        .attach(AttachRequest {
            session_id: "no-such-session".into(),
            since_seq: 0,
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "session_not_found");

    let s = stack.chat(req("")).await.err().expect("empty message");
    assert_status(&s, Code::InvalidArgument, "invalid_argument");
    let s = stack
        .chat(ChatRequest {
            permission_mode: "yolo".into(),
            ..req("hi")
        })
        .await
        .err()
        .expect("unknown mode");
    assert_status(&s, Code::InvalidArgument, "invalid_argument");
    let s = client
        .list_agent_tools(ListAgentToolsRequest {
            permission_mode: "yolo".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::InvalidArgument, "invalid_argument");

    // A running turn: a second turn and a delete are refused as busy.
    let mut chat = stack.chat(req("think slowly")).await.unwrap();
    let first = chat.next().await.expect("turn started");
    let session = first.session_id.clone();
    let s = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("and now this")
        })
        .await
        .err()
        .expect("busy");
    assert_status(&s, Code::FailedPrecondition, "session_busy");
    let s = client
        .delete_session(DeleteSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::FailedPrecondition, "session_busy");
    let s = client
        .approve_tool(ApproveToolRequest {
            session_id: session.clone(),
            call_id: "not-waiting".into(),
            decision: Decision::AllowOnce as i32,
            rule: String::new(),
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "approval_not_pending");
    let s = client
        .approve_tool(ApproveToolRequest {
            session_id: session.clone(),
            call_id: "not-waiting".into(),
            decision: Decision::Unspecified as i32,
            rule: String::new(),
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::InvalidArgument, "invalid_argument");
    assert_eq!(
        done_reason(&chat.until_done().await).as_deref(),
        Some("completed")
    );
}

#[tokio::test]
async fn a_lost_tool_runner_is_unavailable_and_ends_the_turn_with_its_kind() {
    let llm = FakeLlm::start(vec![Reply::Text("never asked".into())]).await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    stack.runner_shutdown.trigger();
    // Wait until the runner's port no longer answers.
    let mut client = stack.client().await;
    let mut last = None;
    for _ in 0..100 {
        match client
            .list_agent_tools(ListAgentToolsRequest::default())
            .await
        {
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => {
                last = Some(s);
                break;
            }
        }
    }
    let s = last.expect("the runner never went away");
    assert_status(&s, Code::Unavailable, "tool_runner_unavailable");
    assert!(
        s.message().contains("the tool-runner did not list tools"),
        "{s:?}"
    );
    let events = stack.chat(req("hi")).await.unwrap().until_done().await;
    let err = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) => Some(x.clone()),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(err.kind, "tool_runner_unavailable", "{err:?}");
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    assert!(llm.requests().is_empty(), "the model was not called");
}

/// A stack over a [`FlakyStore`] (a memory store underneath).
async fn flaky_stack(llm: FakeLlm) -> (Stack, Arc<FlakyStore>) {
    let store = FlakyStore::new(Arc::new(omicos_sessionstore::MemoryStore::new()));
    let stack = Stack::start(
        llm,
        StackOptions {
            store: Some(store.clone()),
            ..Default::default()
        },
    )
    .await;
    (stack, store)
}

#[tokio::test]
async fn a_history_that_cannot_be_read_fails_the_turn_clearly() {
    let llm = FakeLlm::start(vec![
        Reply::Text("first answer".into()),
        Reply::Text("third answer".into()),
    ])
    .await;
    let (stack, store) = flaky_stack(llm.clone()).await;
    let first = stack.chat(req("first")).await.unwrap().until_done().await;
    assert_eq!(done_reason(&first).as_deref(), Some("completed"));
    let session = first[0].session_id.clone();
    let last = first.last().unwrap().event_seq;

    store.fail(Op::Messages, StoreError::Backend("disk I/O error".into()));
    let events = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("second")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_gap_free(&events, last);
    assert!(matches!(
        events[0].kind,
        Some(chat_event::Kind::TurnStarted(_))
    ));
    let err = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) => Some(x.clone()),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(err.kind, "history_unavailable", "{err:?}");
    assert!(
        err.message.contains(&session) && err.message.contains("disk I/O error"),
        "{err:?}"
    );
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    assert_eq!(
        llm.requests().len(),
        1,
        "the model never ran without its history"
    );

    // The history is as it was: the failed turn's message was not appended.
    store.heal(Op::Messages);
    let s = stack
        .client()
        .await
        .get_session(GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.messages_json.len(), 2, "{:?}", s.messages_json);
    // And the session goes on with its real history.
    let third = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("third")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&third).as_deref(), Some("completed"));
    let body = llm.requests()[1].body.to_string();
    assert!(
        body.contains("first answer") && body.contains("third") && !body.contains("second"),
        "{body}"
    );
}

#[tokio::test]
async fn a_seq_that_cannot_be_read_fails_the_operation_and_never_restarts_at_zero() {
    let llm = FakeLlm::start(vec![
        Reply::Text("one".into()),
        Reply::Text("fresh".into()),
        Reply::Text("two".into()),
    ])
    .await;
    let (stack, store) = flaky_stack(llm.clone()).await;
    let first = stack.chat(req("one")).await.unwrap().until_done().await;
    let session = first[0].session_id.clone();
    let last = first.last().unwrap().event_seq;
    assert_eq!(last, first.len() as u64);

    store.fail(Op::LastSeq, StoreError::Backend("connection reset".into()));
    let s = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("two")
        })
        .await
        .err()
        .expect("refused while the seq cannot be read");
    assert_status(&s, Code::Unavailable, "store_unavailable");
    assert!(s.message().contains("connection reset"), "{s:?}");
    let mut client = stack.client().await;
    let s = client
        .list_sessions(omicos_proto::ListSessionsRequest { limit: 0 })
        .await
        .unwrap_err();
    assert_status(&s, Code::Unavailable, "store_unavailable");
    let s = client
        .get_session(GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::Unavailable, "store_unavailable");
    assert_eq!(llm.requests().len(), 1);
    // A session made for its turn has no seq to read: it starts at 1 (the
    // store still checks every seq it is given).
    let fresh = stack.chat(req("fresh")).await.unwrap().until_done().await;
    assert_eq!(done_reason(&fresh).as_deref(), Some("completed"));
    assert_gap_free(&fresh, 0);
    assert_ne!(fresh[0].session_id, session);
    assert_eq!(llm.requests().len(), 2);

    // Once the store answers, the session's sequence goes on where it was.
    store.heal(Op::LastSeq);
    let second = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("two")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&second).as_deref(), Some("completed"));
    assert_gap_free(&second, last);
    // The refused turn left no lease behind.
    let summary = client
        .get_session(GetSessionRequest {
            session_id: session,
        })
        .await
        .unwrap()
        .into_inner()
        .summary
        .unwrap();
    assert_eq!(summary.last_event_seq, last + second.len() as u64);
}

#[tokio::test]
async fn a_log_that_cannot_be_read_ends_attach_with_unavailable_and_a_gone_session_is_not_found() {
    let llm = FakeLlm::start(vec![Reply::Text("hello".into())]).await;
    let (stack, store) = flaky_stack(llm).await;
    let first = stack.chat(req("hi")).await.unwrap().until_done().await;
    let session = first[0].session_id.clone();
    let mut client = stack.client().await;

    store.fail(Op::EventsSince, StoreError::Backend("timeout".into()));
    let mut stream = client
        .attach(AttachRequest {
            session_id: session.clone(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let s = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an answer")
        .expect_err("the stream ends with an error, not a silent end");
    assert_status(&s, Code::Unavailable, "store_unavailable");
    store.heal(Op::EventsSince);
    let mut stream = client
        .attach(AttachRequest {
            session_id: session.clone(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut replayed = 0;
    while let Some(ev) = stream.message().await.unwrap() {
        replayed += 1;
        assert_eq!(ev.event_seq, replayed);
    }
    assert_eq!(replayed, first.len() as u64);

    // The store says the session is gone (deleted between two reads): NOT_FOUND, not UNAVAILABLE.
    store.fail(Op::Messages, StoreError::NotFound(session.clone()));
    let s = client
        .get_session(GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "session_not_found");
    store.fail(Op::Messages, StoreError::Backend("disk full".into()));
    let s = client
        .get_session(GetSessionRequest {
            session_id: session,
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::Unavailable, "history_unavailable");
}
