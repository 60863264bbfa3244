//! The orchestrator's one port as the web page uses it: the page over plain
//! HTTP/1.1, OrchestratorWeb and Orchestrator over gRPC-web (HTTP/1.1 POSTs
//! with framed protobuf bodies, exactly what connect-web sends), and the same
//! services over native gRPC (HTTP/2). A real orchestrator and tool-runner on
//! 127.0.0.1, a scripted model, a real HTTP client.

use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::{
    AgentInfo, ApproveToolRequest, ApproveToolResponse, AttachRequest, CancelTurnRequest,
    CancelTurnResponse, ChatEvent, ChatRequest, ClientConfig, Decision, GetClientConfigRequest,
    ListAgentsRequest, ListAgentsResponse, PermissionMode, StartTurnResponse, TurnDoneReason,
    chat_event, orchestrator_web_client::OrchestratorWebClient,
};
use prost::Message;
use std::time::Duration;

/// A gRPC-web client over HTTP/1.1, as a browser is one.
struct GrpcWeb {
    http: reqwest::Client,
    base: String,
}

/// A gRPC status: its code and message.
#[derive(Debug, PartialEq)]
struct Failed(i32, String);

/// Frames of a gRPC-web body: (flags, payload).
fn frames(buf: &mut Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    let mut out = vec![];
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        out.push((buf[0], buf[5..5 + len].to_vec()));
        buf.drain(..5 + len);
    }
    out
}

/// `grpc-status` and `grpc-message` of a trailer frame (`name:value\r\n` lines).
fn trailer_status(payload: &[u8]) -> Failed {
    let text = String::from_utf8_lossy(payload);
    let mut code = -1;
    let mut message = String::new();
    for line in text.split("\r\n") {
        if let Some((k, v)) = line.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "grpc-status" => code = v.trim().parse().unwrap_or(-1),
                "grpc-message" => message = v.trim().to_owned(),
                _ => {}
            }
        }
    }
    Failed(code, message)
}

impl GrpcWeb {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .http1_only()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            base: base.to_owned(),
        }
    }

    /// POSTs one framed message to `path`; the response, its status checked.
    async fn post(&self, path: &str, msg: &impl Message) -> reqwest::Response {
        let body = msg.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/grpc-web+proto")
            .header("x-grpc-web", "1")
            .header(
                "authorization",
                format!("Bearer {}", omicos_e2e::stack::TEST_TOKEN),
            )
            .body(framed)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        assert_eq!(
            res.headers()["content-type"],
            "application/grpc-web+proto",
            "{path}"
        );
        res
    }

    /// A unary call: its answer, or the status it failed with.
    async fn unary<T: Message + Default>(
        &self,
        path: &str,
        msg: &impl Message,
    ) -> Result<T, Failed> {
        let res = self.post(path, msg).await;
        // A trailers-only answer carries the status in the headers.
        if let Some(code) = res.headers().get("grpc-status") {
            let code: i32 = code.to_str().unwrap().parse().unwrap();
            let message = res
                .headers()
                .get("grpc-message")
                .map(|m| m.to_str().unwrap().to_owned())
                .unwrap_or_default();
            if code != 0 {
                return Err(Failed(code, message));
            }
        }
        let mut buf = res.bytes().await.unwrap().to_vec();
        let mut answer = None;
        for (flags, payload) in frames(&mut buf) {
            if flags & 0x80 != 0 {
                let st = trailer_status(&payload);
                if st.0 != 0 {
                    return Err(st);
                }
            } else {
                answer = Some(T::decode(payload.as_slice()).unwrap());
            }
        }
        assert!(buf.is_empty(), "{path}: a partial frame at the end");
        answer.ok_or_else(|| Failed(0, "no message".into()))
    }

    /// Attach as a server stream: the events (heartbeats left out) up to and
    /// including the TurnDone of `turn_id`, read as they arrive.
    async fn attach_until_done(
        &self,
        session_id: &str,
        since_seq: u64,
        turn_id: &str,
    ) -> Vec<ChatEvent> {
        let mut res = self
            .post(
                "/omicos.v1.Orchestrator/Attach",
                &AttachRequest {
                    session_id: session_id.into(),
                    since_seq,
                },
            )
            .await;
        let mut buf = vec![];
        let mut events = vec![];
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(30), res.chunk())
                .await
                .expect("an Attach frame within 30 s")
                .unwrap()
                .unwrap_or_else(|| panic!("Attach ended before the TurnDone: {events:#?}"));
            buf.extend_from_slice(&chunk);
            for (flags, payload) in frames(&mut buf) {
                assert_eq!(
                    flags & 0x80,
                    0,
                    "trailers before the TurnDone: {:?}",
                    trailer_status(&payload)
                );
                let ev = ChatEvent::decode(payload.as_slice()).unwrap();
                if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
                    continue;
                }
                let done =
                    ev.turn_id == turn_id && matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)));
                events.push(ev);
                if done {
                    return events;
                }
            }
        }
    }

    async fn start_turn(&self, req: ChatRequest) -> Result<StartTurnResponse, Failed> {
        self.unary("/omicos.v1.OrchestratorWeb/StartTurn", &req)
            .await
    }
}

fn text_of(events: &[ChatEvent]) -> String {
    omicos_e2e::events_text(events)
}

fn done_of(events: &[ChatEvent]) -> TurnDoneReason {
    events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::TurnDone(d)) => Some(d.reason()),
            _ => None,
        })
        .expect("a TurnDone")
}

fn streamed(text: &str, chunks: usize, delay_ms: u64) -> Reply {
    Reply::Streamed {
        text: text.into(),
        chunks,
        delay: Duration::from_millis(delay_ms),
        calls: vec![],
    }
}

#[tokio::test]
async fn the_page_and_grpc_web_share_the_orchestrators_port() {
    let stack = Stack::start(FakeLlm::start(vec![]).await, StackOptions::default()).await;
    let outputs = stack.workspace.join(".omicos/outputs/s1");
    std::fs::create_dir_all(&outputs).unwrap();
    std::fs::write(outputs.join("plot.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    let web = GrpcWeb::new(&stack.orchestrator);

    // The page and its routes, as a browser asks for them.
    for path in ["/", "/s/some-session"] {
        let r = web
            .http
            .get(format!("{}{path}", stack.orchestrator))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
        assert!(r.text().await.unwrap().contains(r#"<div id="app">"#));
    }
    let img = web
        .http
        .get(format!(
            "{}/files/.omicos/outputs/s1/plot.png",
            stack.orchestrator
        ))
        .send()
        .await
        .unwrap();
    // /files/ asks the same credential as gRPC (tests/tests/auth.rs has the rest).
    assert_eq!(img.status(), 401);
    let secret = web
        .http
        .get(format!("{}/files/.omicos/sessions.db", stack.orchestrator))
        .header(
            "authorization",
            format!("Bearer {}", omicos_e2e::stack::TEST_TOKEN),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(secret.status(), 404);

    // What the page asks first, over gRPC-web.
    let cfg: ClientConfig = web
        .unary(
            "/omicos.v1.OrchestratorWeb/GetClientConfig",
            &GetClientConfigRequest {},
        )
        .await
        .unwrap();
    assert_eq!(cfg.providers.first().map(String::as_str), Some("openai"));
    assert_eq!(cfg.default_model, "fake-model");
    assert!(cfg.model_override);
    assert_eq!(cfg.heartbeat_secs, 30);
    // The upload limits, so the page can refuse a file before sending it.
    let uploads = omicos_orchestrator::config::UploadsConfig::default();
    assert_eq!(cfg.upload_max_file_bytes, uploads.max_file_bytes);
    assert_eq!(cfg.upload_max_request_bytes, uploads.max_request_bytes);
    assert_eq!(cfg.upload_max_files as usize, uploads.max_files);
    assert!(cfg.upload_max_file_bytes > 0 && cfg.upload_max_files > 0);
    assert_eq!(cfg.default_permission_mode(), PermissionMode::ReadOnly);
    assert!(!cfg.deployment_tier.is_empty());
    let agents: ListAgentsResponse = web
        .unary("/omicos.v1.Orchestrator/ListAgents", &ListAgentsRequest {})
        .await
        .unwrap();
    assert!(
        agents
            .agents
            .iter()
            .any(|a: &AgentInfo| a.id == "assistant"),
        "{agents:?}"
    );
    assert_eq!(agents.deployment_tier, cfg.deployment_tier);

    // The same service over native gRPC (HTTP/2) on the same port.
    let mut native = native_web_client(&stack.orchestrator).await;
    let again = native
        .get_client_config(GetClientConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, cfg);

    // An unknown method is a gRPC answer, not the page.
    let r = web
        .post("/omicos.v1.Nope/Nothing", &ListAgentsRequest {})
        .await;
    let code = r
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(code.as_deref(), Some("12"), "{:?}", r.headers());
}

#[tokio::test]
async fn start_turn_returns_at_once_and_attach_follows_the_turn() {
    let llm = FakeLlm::start(vec![
        streamed("hello from the model, streamed in pieces", 6, 80),
        Reply::Text("the second turn".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let web = GrpcWeb::new(&stack.orchestrator);

    let started = web
        .start_turn(ChatRequest {
            message: "say hello".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!started.session_id.is_empty() && !started.turn_id.is_empty());
    assert_eq!(started.start_seq, 1, "a new session's first event");
    // StartTurn did not wait for the turn: the model is still streaming.
    let events = web
        .attach_until_done(&started.session_id, started.start_seq - 1, &started.turn_id)
        .await;
    match &events[0].kind {
        Some(chat_event::Kind::TurnStarted(t)) => assert_eq!(t.message, "say hello"),
        k => panic!("the first event is not TurnStarted: {k:?}"),
    }
    assert_eq!(events[0].event_seq, started.start_seq);
    omicos_e2e::assert_gap_free(&events, started.start_seq - 1);
    assert!(
        events
            .iter()
            .filter(|e| matches!(e.kind, Some(chat_event::Kind::TextDelta(_))))
            .count()
            >= 3,
        "the text arrives in pieces"
    );
    assert_eq!(text_of(&events), "hello from the model, streamed in pieces");
    assert_eq!(done_of(&events), TurnDoneReason::Completed);

    // The next turn of the same session, over native gRPC this time.
    let mut native = native_web_client(&stack.orchestrator).await;
    let second = native
        .start_turn(ChatRequest {
            session_id: started.session_id.clone(),
            message: "again".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.session_id, started.session_id);
    assert_eq!(second.start_seq, events.last().unwrap().event_seq + 1);
    let more = web
        .attach_until_done(&second.session_id, second.start_seq - 1, &second.turn_id)
        .await;
    assert_eq!(text_of(&more), "the second turn");
    // A reload: the whole log from 0, nothing lost or doubled.
    let all = web
        .attach_until_done(&started.session_id, 0, &second.turn_id)
        .await;
    assert_eq!(all.len(), events.len() + more.len());
    omicos_e2e::assert_gap_free(&all, 0);
    llm.assert_invariants();
}

#[tokio::test]
async fn a_message_steered_over_grpc_web_joins_the_running_turn() {
    let llm = FakeLlm::start(vec![
        streamed("a long answer, streamed in many pieces", 10, 80),
        Reply::Text("answering the steer too".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let web = GrpcWeb::new(&stack.orchestrator);
    let started = web
        .start_turn(ChatRequest {
            message: "say something long".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!started.steered);
    let steered = web
        .start_turn(ChatRequest {
            session_id: started.session_id.clone(),
            message: "STEER-NOTE: shorter please".into(),
            steer: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(steered.steered, "{steered:?}");
    assert_eq!(steered.turn_id, started.turn_id, "the running turn took it");
    let events = web
        .attach_until_done(&started.session_id, started.start_seq - 1, &started.turn_id)
        .await;
    let steer_at = events
        .iter()
        .position(|e| matches!(&e.kind, Some(chat_event::Kind::Steer(s)) if s.message == "STEER-NOTE: shorter please"))
        .expect("the Steer event");
    assert!(events[steer_at].event_seq >= steered.start_seq);
    assert_eq!(done_of(&events), TurnDoneReason::Completed);
    assert!(text_of(&events).ends_with("answering the steer too"));
    assert_eq!(llm.requests().len(), 2);
}

#[tokio::test]
async fn approve_and_cancel_over_grpc_web() {
    let llm = FakeLlm::start(vec![
        Reply::Streamed {
            text: "writing it".into(),
            chunks: 2,
            delay: Duration::from_millis(20),
            calls: vec![(
                "c_w".into(),
                "file_manager__write".into(),
                r#"{"path":"a.txt","content":"A"}"#.into(),
            )],
        },
        Reply::Text("written".into()),
        Reply::Slow("a very long answer ".repeat(40), Duration::from_millis(100)),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let web = GrpcWeb::new(&stack.orchestrator);

    // Auto mode: the write waits for an approval, which comes as ApproveTool.
    let t = web
        .start_turn(ChatRequest {
            message: "write a.txt".into(),
            permission_mode: "auto".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let attach = {
        let web = GrpcWeb::new(&stack.orchestrator);
        let (sid, tid) = (t.session_id.clone(), t.turn_id.clone());
        tokio::spawn(async move { web.attach_until_done(&sid, 0, &tid).await })
    };
    let mut approved = None;
    for _ in 0..200 {
        let r: Result<ApproveToolResponse, Failed> = web
            .unary(
                "/omicos.v1.Orchestrator/ApproveTool",
                &ApproveToolRequest {
                    session_id: t.session_id.clone(),
                    call_id: "c_w".into(),
                    decision: Decision::AllowOnce as i32,
                    rule: String::new(),
                },
            )
            .await;
        match r {
            Ok(ok) => {
                approved = Some(ok);
                break;
            }
            // NOT_FOUND until the call asks.
            Err(Failed(5, _)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("ApproveTool: {e:?}"),
        }
    }
    assert!(approved.is_some(), "the call never asked for an approval");
    let events = attach.await.unwrap();
    assert!(events.iter().any(
        |e| matches!(&e.kind, Some(chat_event::Kind::ToolApprovalRequest(a)) if a.call_id == "c_w")
    ));
    assert!(events.iter().any(|e| matches!(&e.kind, Some(chat_event::Kind::ToolApprovalResolved(r)) if r.decision == Decision::AllowOnce as i32)));
    assert_eq!(done_of(&events), TurnDoneReason::Completed);
    assert_eq!(
        std::fs::read_to_string(stack.workspace.join("a.txt")).unwrap(),
        "A"
    );

    // A long answer, cancelled with CancelTurn.
    let long = web
        .start_turn(ChatRequest {
            session_id: t.session_id.clone(),
            message: "talk for a long time".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The session is busy while it runs.
    let busy = web
        .start_turn(ChatRequest {
            session_id: t.session_id.clone(),
            message: "and meanwhile?".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(busy.0, 9, "FAILED_PRECONDITION: {busy:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c: CancelTurnResponse = web
        .unary(
            "/omicos.v1.Orchestrator/CancelTurn",
            &CancelTurnRequest {
                session_id: t.session_id.clone(),
            },
        )
        .await
        .unwrap();
    assert!(c.cancelled);
    let events = web
        .attach_until_done(&long.session_id, long.start_seq - 1, &long.turn_id)
        .await;
    assert_eq!(done_of(&events), TurnDoneReason::Cancelled);
    assert!(!text_of(&events).contains(&"a very long answer ".repeat(40)));
    llm.assert_invariants();
}

#[tokio::test]
async fn start_turn_failures_are_statuses() {
    let stack = Stack::start(FakeLlm::start(vec![]).await, StackOptions::default()).await;
    let web = GrpcWeb::new(&stack.orchestrator);
    let fail = |message: &str, session: &str, mode: &str| ChatRequest {
        message: message.into(),
        session_id: session.into(),
        permission_mode: mode.into(),
        ..Default::default()
    };
    let e = web.start_turn(fail("   ", "", "")).await.unwrap_err();
    assert_eq!(e.0, 3, "INVALID_ARGUMENT: {e:?}");
    let e = web.start_turn(fail("hi", "", "yolo")).await.unwrap_err();
    assert_eq!(e.0, 3, "INVALID_ARGUMENT: {e:?}");
    assert!(e.1.contains("yolo"), "{e:?}");
    let e = web
        .start_turn(fail("hi", "no-such-session", ""))
        .await
        .unwrap_err();
    assert_eq!(e.0, 5, "NOT_FOUND: {e:?}");
    // Attach to a session that does not exist is NOT_FOUND too, not a hang.
    let r = web
        .post(
            "/omicos.v1.Orchestrator/Attach",
            &AttachRequest {
                session_id: "no-such-session".into(),
                since_seq: 0,
            },
        )
        .await;
    let code = r
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(code.as_deref(), Some("5"), "{:?}", r.headers());
}

/// OrchestratorWeb over native gRPC (HTTP/2), with the test stacks' token.
async fn native_web_client(url: &str) -> OrchestratorWebClient<omicos_auth::AuthedChannel> {
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    OrchestratorWebClient::new(
        omicos_auth::Credentials::bearer(omicos_e2e::TEST_TOKEN)
            .unwrap()
            .channel(ch),
    )
}
