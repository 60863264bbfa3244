//! Three principals in two tenants (issue 39): alice and bob in `acme`,
//! mallory in `evil`. Every session RPC over gRPC and gRPC-web, and every
//! HTTP route that reaches a session, refuses bob and mallory on alice's
//! session exactly as it refuses an id that does not exist, and changes
//! nothing: alice's history and log are the same before and after, and the
//! model was not called.

use omicos_e2e::stack::{ChatHandle, client_with};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelTurnRequest, ChatEvent, ChatRequest, CompactRequest,
    Decision, DeleteSessionRequest, EventValue, GetSessionRequest, ReadValueRequest, ValueRef,
    chat_event, orchestrator_web_client::OrchestratorWebClient, value_ref,
};
use prost::Message;
use std::time::Duration;
use tonic::Code;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abcdef";

fn chat_req(session: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: "hi".into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

/// alice's session as the store and the model see it: its history, its
/// log (replayed by Attach) and how many model requests were made.
async fn snapshot(url: &str, sid: &str, llm: &FakeLlm) -> (Vec<String>, Vec<ChatEvent>, usize) {
    let mut c = client_with(url, ALICE).await;
    let history = c
        .get_session(GetSessionRequest {
            session_id: sid.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .messages_json;
    let mut s = c
        .attach(AttachRequest {
            session_id: sid.into(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut log = vec![];
    while let Ok(Some(Ok(Some(mut ev)))) = tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .map(Some)
    {
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        ev.timestamp_ms = 0;
        log.push(ev);
    }
    let title = c
        .list_sessions(omicos_proto::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .into_iter()
        .find(|x| x.session_id == sid)
        .map(|x| x.title)
        .unwrap_or_default();
    let mut history = history;
    history.push(format!("title: {title}"));
    (history, log, llm.requests().len())
}

/// ReadValue of the first event's first field (TurnStarted carries none,
/// so even the owner would hear NOT_FOUND: the guard must answer first).
fn read_value_req(session: &str) -> ReadValueRequest {
    ReadValueRequest {
        session_id: session.into(),
        value: Some(ValueRef {
            at: Some(value_ref::At::Event(EventValue {
                event_seq: 1,
                field: "text_delta.text".into(),
            })),
            size_bytes: 0,
        }),
        offset: 0,
    }
}

/// An upload into `session`'s workspace: a file no refused attempt may write.
fn upload_req(session: &str) -> omicos_proto::UploadFilesRequest {
    omicos_proto::UploadFilesRequest {
        session_id: session.into(),
        files: vec![omicos_proto::UploadFile {
            name: "planted-by-another.txt".into(),
            content: b"planted".to_vec(),
        }],
    }
}

/// A refusal as the caller sees it: (code, error kind) or in-band kind.
type Refusal = (Code, String);

fn refusal(s: tonic::Status) -> Refusal {
    let kind = s
        .metadata()
        .get(ERROR_KIND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (s.code(), kind)
}

/// Every session RPC over gRPC as `token` on `sid`: what each answered.
async fn grpc_attempts(url: &str, token: &str, sid: &str) -> Vec<(&'static str, Refusal)> {
    let mut c = client_with(url, token).await;
    let s = || sid.to_owned();
    let mut out = vec![];
    let r = |x: Result<(), tonic::Status>| {
        x.map_err(refusal)
            .err()
            .unwrap_or((Code::Ok, String::new()))
    };
    out.push((
        "Attach",
        r(c.attach(AttachRequest {
            session_id: s(),
            since_seq: 0,
        })
        .await
        .map(|_| ())),
    ));
    out.push((
        "CancelTurn",
        r(c.cancel_turn(CancelTurnRequest { session_id: s() })
            .await
            .map(|_| ())),
    ));
    out.push((
        "ApproveTool",
        r(c.approve_tool(ApproveToolRequest {
            session_id: s(),
            call_id: "c1".into(),
            decision: Decision::AllowOnce as i32,
            rule: String::new(),
        })
        .await
        .map(|_| ())),
    ));
    out.push((
        "GetSession",
        r(c.get_session(GetSessionRequest { session_id: s() })
            .await
            .map(|_| ())),
    ));
    out.push((
        "Compact",
        r(c.compact(CompactRequest { session_id: s() })
            .await
            .map(|_| ())),
    ));
    out.push((
        "ReadValue",
        r(c.read_value(read_value_req(sid)).await.map(|_| ())),
    ));
    out.push((
        "ForkSession",
        r(c.fork_session(omicos_proto::ForkSessionRequest {
            session_id: s(),
            ..Default::default()
        })
        .await
        .map(|_| ())),
    ));
    out.push((
        "RewindSession",
        r(c.rewind_session(omicos_proto::RewindSessionRequest {
            session_id: s(),
            to: Some(omicos_proto::rewind_session_request::To::LastTurns(1)),
            keep_files: false,
        })
        .await
        .map(|_| ())),
    ));
    out.push((
        "RenameSession",
        r(c.rename_session(omicos_proto::RenameSessionRequest {
            session_id: s(),
            title: "renamed by another".into(),
        })
        .await
        .map(|_| ())),
    ));
    out.push((
        "UploadFiles",
        r(c.upload_files(upload_req(sid)).await.map(|_| ())),
    ));
    out.push((
        "DeleteSession",
        r(c.delete_session(DeleteSessionRequest { session_id: s() })
            .await
            .map(|_| ())),
    ));
    // Chat answers an unknown session in-band.
    let mut h = ChatHandle::open(client_with(url, token).await, chat_req(sid))
        .await
        .unwrap();
    let events = h.until_done().await;
    let kind = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) => Some(x.kind.clone()),
            _ => None,
        })
        .unwrap_or_default();
    out.push(("Chat", (Code::NotFound, kind)));
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut web =
        OrchestratorWebClient::new(omicos_auth::Credentials::bearer(token).unwrap().channel(ch));
    out.push((
        "StartTurn",
        r(web.start_turn(chat_req(sid)).await.map(|_| ())),
    ));
    out
}

/// The same over gRPC-web (HTTP/1.1, as a browser): the grpc-status of each.
async fn grpc_web_attempts(url: &str, token: &str, sid: &str) -> Vec<(&'static str, String)> {
    let http = reqwest::Client::builder().http1_only().build().unwrap();
    let call = |path: &'static str, body: Vec<u8>| {
        let http = http.clone();
        let url = url.to_owned();
        let token = token.to_owned();
        async move {
            let mut framed = vec![0u8];
            framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
            framed.extend_from_slice(&body);
            let res = http
                .post(format!("{url}{path}"))
                .header("content-type", "application/grpc-web+proto")
                .header("x-grpc-web", "1")
                .header("authorization", format!("Bearer {token}"))
                .body(framed)
                .send()
                .await
                .unwrap();
            if let Some(code) = res.headers().get("grpc-status") {
                return code.to_str().unwrap().to_owned();
            }
            let body = res.bytes().await.unwrap();
            let text = String::from_utf8_lossy(&body);
            text.split("grpc-status:")
                .nth(1)
                .map(|r| r.trim().split("\r\n").next().unwrap_or("").to_owned())
                .unwrap_or_default()
        }
    };
    let s = || sid.to_owned();
    vec![
        (
            "web Attach",
            call(
                "/omicos.v1.Orchestrator/Attach",
                AttachRequest {
                    session_id: s(),
                    since_seq: 0,
                }
                .encode_to_vec(),
            )
            .await,
        ),
        (
            "web CancelTurn",
            call(
                "/omicos.v1.Orchestrator/CancelTurn",
                CancelTurnRequest { session_id: s() }.encode_to_vec(),
            )
            .await,
        ),
        (
            "web ApproveTool",
            call(
                "/omicos.v1.Orchestrator/ApproveTool",
                ApproveToolRequest {
                    session_id: s(),
                    call_id: "c1".into(),
                    decision: 1,
                    rule: String::new(),
                }
                .encode_to_vec(),
            )
            .await,
        ),
        (
            "web GetSession",
            call(
                "/omicos.v1.Orchestrator/GetSession",
                GetSessionRequest { session_id: s() }.encode_to_vec(),
            )
            .await,
        ),
        (
            "web Compact",
            call(
                "/omicos.v1.Orchestrator/Compact",
                CompactRequest { session_id: s() }.encode_to_vec(),
            )
            .await,
        ),
        (
            "web ReadValue",
            call(
                "/omicos.v1.Orchestrator/ReadValue",
                read_value_req(sid).encode_to_vec(),
            )
            .await,
        ),
        (
            "web ForkSession",
            call(
                "/omicos.v1.Orchestrator/ForkSession",
                omicos_proto::ForkSessionRequest {
                    session_id: s(),
                    ..Default::default()
                }
                .encode_to_vec(),
            )
            .await,
        ),
        (
            "web RewindSession",
            call(
                "/omicos.v1.Orchestrator/RewindSession",
                omicos_proto::RewindSessionRequest {
                    session_id: s(),
                    to: Some(omicos_proto::rewind_session_request::To::LastTurns(1)),
                    keep_files: false,
                }
                .encode_to_vec(),
            )
            .await,
        ),
        (
            "web RenameSession",
            call(
                "/omicos.v1.Orchestrator/RenameSession",
                omicos_proto::RenameSessionRequest {
                    session_id: s(),
                    title: "renamed by another".into(),
                }
                .encode_to_vec(),
            )
            .await,
        ),
        (
            "web UploadFiles",
            call(
                "/omicos.v1.Orchestrator/UploadFiles",
                upload_req(sid).encode_to_vec(),
            )
            .await,
        ),
        (
            "web DeleteSession",
            call(
                "/omicos.v1.Orchestrator/DeleteSession",
                DeleteSessionRequest { session_id: s() }.encode_to_vec(),
            )
            .await,
        ),
        (
            "web StartTurn",
            call(
                "/omicos.v1.OrchestratorWeb/StartTurn",
                chat_req(sid).encode_to_vec(),
            )
            .await,
        ),
    ]
}

#[tokio::test]
async fn other_principals_are_refused_on_every_route_and_change_nothing() {
    let llm = FakeLlm::start(vec![Reply::Text("hello".into()); 20]).await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            tweak: Some(Box::new(|c| {
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    let mut h = ChatHandle::open(client_with(&url, ALICE).await, chat_req(""))
        .await
        .unwrap();
    let sid = h.until_done().await[0].session_id.clone();
    let out_dir = stack
        .workspace
        .join(".omicos/tenants/acme/.omicos/outputs")
        .join(&sid);
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join("plot.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    // A spooled result of the session, in its own folder of the spool.
    let spool_dir = stack
        .workspace
        .join(".omicos/tenants/acme/.omicos/tool_outputs")
        .join(&sid);
    std::fs::create_dir_all(&spool_dir).unwrap();
    std::fs::write(spool_dir.join("17__c.txt"), "alice's spooled result").unwrap();
    let before = snapshot(&url, &sid, &llm).await;
    assert!(!before.0.is_empty() && !before.1.is_empty());

    // What an id that does not exist gets: the reference answer.
    let missing_grpc = grpc_attempts(&url, BOB, "no-such-session").await;
    let missing_web = grpc_web_attempts(&url, BOB, "no-such-session").await;
    for (rpc, r) in &missing_grpc {
        assert_eq!(
            r,
            &(Code::NotFound, "session_not_found".to_owned()),
            "{rpc}"
        );
    }
    for (rpc, code) in &missing_web {
        assert_eq!(code, &(Code::NotFound as i32).to_string(), "{rpc}");
    }
    let http = reqwest::Client::new();
    let get = |token: &'static str, path: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            http.get(format!("{url}/files/{path}"))
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let file =
        |token: &'static str, sid: String| get(token, format!(".omicos/outputs/{sid}/plot.png"));
    let spooled = |token: &'static str, path: String| get(token, path);
    let spool_paths = [
        format!(".omicos/tool_outputs/{sid}/17__c.txt"),
        format!(".omicos/tool_outputs/no-such-session/../{sid}/17__c.txt"),
        format!(".omicos/tool_outputs/%2e%2e/tool_outputs/{sid}/17__c.txt"),
    ];
    for (who, token) in [
        ("bob (same tenant)", BOB),
        ("mallory (other tenant)", MALLORY),
    ] {
        assert_eq!(
            grpc_attempts(&url, token, &sid).await,
            missing_grpc,
            "{who}: gRPC"
        );
        assert_eq!(
            grpc_web_attempts(&url, token, &sid).await,
            missing_web,
            "{who}: gRPC-web"
        );
        assert_eq!(file(token, sid.clone()).await, 404, "{who}: /files/");
        assert_eq!(file(token, "no-such-session".into()).await, 404);
        for p in &spool_paths {
            assert_eq!(spooled(token, p.clone()).await, 404, "{who}: {p}");
        }
    }
    // Nothing changed: the same history, title and log, no model call, no
    // file uploaded, no session forked from alice's.
    assert_eq!(snapshot(&url, &sid, &llm).await, before);
    let planted: Vec<_> = walk_files(&stack.workspace)
        .into_iter()
        .filter(|p| p.contains("planted-by-another"))
        .collect();
    assert!(planted.is_empty(), "{planted:?}");
    for token in [BOB, MALLORY] {
        let listed = client_with(&url, token)
            .await
            .list_sessions(omicos_proto::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sessions;
        assert!(listed.is_empty(), "a fork of alice's session: {listed:?}");
    }
    // And alice still has it all.
    assert_eq!(file(ALICE, sid.clone()).await, 200);
    assert_eq!(spooled(ALICE, spool_paths[0].clone()).await, 200);
}

/// Every file under `dir`, as paths.
fn walk_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(walk_files(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}
