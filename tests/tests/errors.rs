//! Errors answered right: each failure reaches the client with its gRPC code
//! and its kind (`omicos-error-kind` metadata on a status, `ErrorEvent.kind`
//! in a stream), from the one mapping in the orchestrator's error.rs.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, ChatRequest, Decision, DeleteSessionRequest,
    GetSessionRequest, ListAgentToolsRequest, chat_event,
};
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
        })
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "approval_not_pending");
    let s = client
        .approve_tool(ApproveToolRequest {
            session_id: session.clone(),
            call_id: "not-waiting".into(),
            decision: Decision::Unspecified as i32,
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
