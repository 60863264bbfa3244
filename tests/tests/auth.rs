//! Nobody gets in without a credential (issue 14): every orchestrator RPC ×
//! {no token, a bad token, an expired JWT, another tenant, the right
//! principal (API key and JWT)}, over real gRPC, with the JWKS served by a
//! real local HTTP server; sessions belong to their creator; the principal's
//! ceiling caps the mode, legacy flags included.

use omicos_e2e::idp::Idp;
use omicos_e2e::stack::{ChatHandle, client_with};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelTurnRequest, ChatRequest, CompactRequest, Decision,
    DeleteSessionRequest, GetSessionRequest, ListAgentToolsRequest, ListAgentsRequest,
    ListSessionsRequest, RefreshCatalogRequest, chat_event,
};
use tonic::Code;

const ALICE: &str = "alice-api-key-0123456789";
const MALLORY: &str = "mallory-api-key-0123456789";
const READER: &str = "reader-api-key-0123456789";

async fn start(idp: &Idp, replies: usize) -> Stack {
    let llm = FakeLlm::start(vec![Reply::Text("hello".into()); replies]).await;
    let jwt = idp.config();
    Stack::start(
        llm,
        StackOptions {
            tweak: Some(Box::new(move |c| {
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                    api_key(READER, "reader", "acme", "read_only"),
                ];
                c.auth.jwt = jwt;
            })),
            ..Default::default()
        },
    )
    .await
}

fn req(session: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: "hi".into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

/// What a call answered: Ok, or the code and the error kind.
type Outcome = Result<(), (Code, String)>;

fn of_status(s: tonic::Status) -> (Code, String) {
    let kind = s
        .metadata()
        .get(ERROR_KIND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (s.code(), kind)
}

fn unit<T>(r: Result<T, tonic::Status>) -> Outcome {
    r.map(|_| ()).map_err(of_status)
}

/// A Chat: refused at the call, refused in-band (an unknown session), or a turn that runs.
async fn chat(url: &str, token: &str, session: &str) -> Outcome {
    let mut h = ChatHandle::open(client_with(url, token).await, req(session))
        .await
        .map_err(of_status)?;
    let events = h.until_done().await;
    for e in &events {
        if let Some(chat_event::Kind::Error(err)) = &e.kind
            && err.kind == "session_not_found"
        {
            return Err((Code::NotFound, err.kind.clone()));
        }
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, Some(chat_event::Kind::TurnDone(_)))),
        "{events:?}"
    );
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rpc {
    ChatNew,
    ChatExisting,
    Attach,
    CancelTurn,
    ApproveTool,
    ListAgents,
    ListSessions,
    GetSession,
    RefreshCatalog,
    ListAgentTools,
    Compact,
    DeleteSession,
}

const RPCS: [Rpc; 12] = [
    Rpc::ChatNew,
    Rpc::ChatExisting,
    Rpc::Attach,
    Rpc::CancelTurn,
    Rpc::ApproveTool,
    Rpc::ListAgents,
    Rpc::ListSessions,
    Rpc::GetSession,
    Rpc::RefreshCatalog,
    Rpc::ListAgentTools,
    Rpc::Compact,
    Rpc::DeleteSession,
];

/// Calls `rpc` as `token` against alice's session `sid`; ListSessions answers
/// whether `sid` was listed as a NOT_FOUND when it was not.
async fn call(url: &str, token: &str, rpc: Rpc, sid: &str) -> Outcome {
    let mut c = client_with(url, token).await;
    let s = sid.to_owned();
    match rpc {
        Rpc::ChatNew => chat(url, token, "").await,
        Rpc::ChatExisting => chat(url, token, sid).await,
        Rpc::Attach => {
            let mut stream = c
                .attach(AttachRequest {
                    session_id: s,
                    since_seq: 0,
                })
                .await
                .map_err(of_status)?
                .into_inner();
            // The first event is alice's history: it is really served.
            let first = stream.message().await.map_err(of_status)?;
            assert!(first.is_some());
            Ok(())
        }
        Rpc::CancelTurn => unit(c.cancel_turn(CancelTurnRequest { session_id: s }).await),
        Rpc::ApproveTool => unit(
            c.approve_tool(ApproveToolRequest {
                session_id: s,
                call_id: "call_1".into(),
                decision: Decision::AllowOnce as i32,
                rule: String::new(),
            })
            .await,
        ),
        Rpc::ListAgents => unit(c.list_agents(ListAgentsRequest {}).await),
        Rpc::ListSessions => {
            let r = c
                .list_sessions(ListSessionsRequest::default())
                .await
                .map_err(of_status)?
                .into_inner();
            if r.sessions.iter().any(|x| x.session_id == sid) {
                Ok(())
            } else {
                Err((Code::NotFound, "not listed".into()))
            }
        }
        Rpc::GetSession => unit(c.get_session(GetSessionRequest { session_id: s }).await),
        Rpc::RefreshCatalog => unit(c.refresh_catalog(RefreshCatalogRequest {}).await),
        Rpc::ListAgentTools => unit(c.list_agent_tools(ListAgentToolsRequest::default()).await),
        Rpc::Compact => unit(c.compact(CompactRequest { session_id: s }).await),
        Rpc::DeleteSession => unit(
            c.delete_session(DeleteSessionRequest { session_id: s })
                .await,
        ),
    }
}

/// What another tenant gets: the session RPCs find nothing (exactly as for a
/// session that does not exist); the catalog RPCs and its own new chats work.
fn other_tenant_expects(rpc: Rpc) -> Outcome {
    match rpc {
        Rpc::ChatNew | Rpc::ListAgents | Rpc::RefreshCatalog | Rpc::ListAgentTools => Ok(()),
        Rpc::ListSessions => Err((Code::NotFound, "not listed".into())),
        _ => Err((Code::NotFound, "session_not_found".into())),
    }
}

/// What alice gets (ApproveTool: her session is found, no call waits).
fn right_expects(rpc: Rpc) -> Outcome {
    match rpc {
        Rpc::ApproveTool => Err((Code::NotFound, "approval_not_pending".into())),
        _ => Ok(()),
    }
}

async fn alice_session(url: &str) -> (String, usize) {
    let mut h = ChatHandle::open(client_with(url, ALICE).await, req(""))
        .await
        .unwrap();
    let events = h.until_done().await;
    let sid = events[0].session_id.clone();
    let s = client_with(url, ALICE)
        .await
        .get_session(GetSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    (sid, s.messages_json.len())
}

#[tokio::test]
async fn every_rpc_needs_the_right_credential() {
    let idp = Idp::start().await;
    let stack = start(&idp, 40).await;
    let url = stack.orchestrator.clone();
    let (sid, messages) = alice_session(&url).await;

    let expired = idp.expired(serde_json::json!({"sub": "alice", "tenant": "acme"}));
    let wrong_audience =
        idp.token(serde_json::json!({"sub": "alice", "tenant": "acme", "aud": "someone-else"}));
    let unauth = Err((Code::Unauthenticated, String::new()));
    for rpc in RPCS {
        for (who, token) in [
            ("no token", ""),
            ("bad token", "not-a-key"),
            ("expired JWT", expired.as_str()),
            ("JWT for another audience", wrong_audience.as_str()),
            ("bad JWT", "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln"),
        ] {
            assert_eq!(
                call(&url, token, rpc, &sid).await,
                unauth,
                "{rpc:?} with {who}"
            );
        }
        assert_eq!(
            call(&url, MALLORY, rpc, &sid).await,
            other_tenant_expects(rpc),
            "{rpc:?} from another tenant"
        );
    }
    // Nothing the others did changed alice's session.
    let after = client_with(&url, ALICE)
        .await
        .get_session(GetSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .expect("alice's session survived")
        .into_inner();
    assert_eq!(after.messages_json.len(), messages);

    // The right principal, by API key and by JWT (the same subject and tenant).
    let jwt = idp.token(serde_json::json!({"sub": "alice", "tenant": "acme"}));
    for rpc in RPCS {
        if rpc == Rpc::DeleteSession {
            continue;
        }
        for (how, token) in [("api key", ALICE), ("JWT", jwt.as_str())] {
            assert_eq!(
                call(&url, token, rpc, &sid).await,
                right_expects(rpc),
                "{rpc:?} by {how}"
            );
        }
    }
    // The JWKS was fetched once for all of those calls: keys and verified tokens are cached.
    assert_eq!(idp.fetches(), 1);
    assert_eq!(call(&url, &jwt, Rpc::DeleteSession, &sid).await, Ok(()));
    assert_eq!(
        call(&url, ALICE, Rpc::GetSession, &sid).await,
        Err((Code::NotFound, "session_not_found".into()))
    );
}

#[tokio::test]
async fn a_jwt_without_a_tenant_is_denied_and_health_and_reflection_stay_open() {
    let idp = Idp::start().await;
    let stack = start(&idp, 2).await;
    let url = stack.orchestrator.clone();
    let no_tenant = idp.token(serde_json::json!({"sub": "alice"}));
    let r = call(&url, &no_tenant, Rpc::ListAgents, "").await;
    assert_eq!(r.map_err(|e| e.0), Err(Code::PermissionDenied));
    let bad_mode = idp.token(serde_json::json!({"sub": "a", "tenant": "acme", "max_mode": "root"}));
    let r = call(&url, &bad_mode, Rpc::ListAgents, "").await;
    assert_eq!(r.map_err(|e| e.0), Err(Code::PermissionDenied));

    // Health and reflection answer without any credential (probes, grpcurl list).
    let ch = tonic::transport::Channel::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    h.check(tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    })
    .await
    .expect("health is open");
    let mut r = tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(ch);
    let q = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut answers = r
        .server_reflection_info(tokio_stream::iter(vec![q]))
        .await
        .expect("reflection is open")
        .into_inner();
    assert!(answers.message().await.unwrap().is_some());
}

#[tokio::test]
async fn health_can_be_closed_too() {
    let llm = FakeLlm::start(vec![]).await;
    let stack = Stack::start(
        llm,
        StackOptions {
            tweak: Some(Box::new(|c| {
                c.auth.open_health = false;
                c.auth.open_reflection = false;
            })),
            ..Default::default()
        },
    )
    .await;
    // The stack's own readiness check sent its token; without one, the door is shut.
    let ch = tonic::transport::Channel::from_shared(stack.orchestrator.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let e = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
}

/// The tool names the model was offered in the last model request.
fn offered_tools(llm: &FakeLlm) -> Vec<String> {
    let last = llm.requests().pop().expect("a model request");
    last.body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|x| x["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_principals_ceiling_caps_the_mode_and_the_legacy_flags() {
    let idp = Idp::start().await;
    let stack = start(&idp, 4).await;
    let url = stack.orchestrator.clone();
    let ask = ChatRequest {
        message: "hi".into(),
        permission_mode: "full".into(),
        allow_shell: Some(true),
        allow_file_write: Some(true),
        ..Default::default()
    };
    // A full principal asking for full with the switches: shell is offered.
    let mut h = ChatHandle::open(client_with(&url, ALICE).await, ask.clone())
        .await
        .unwrap();
    h.until_done().await;
    let full = offered_tools(&stack.llm);
    assert!(full.iter().any(|t| t == "shell"), "{full:?}");
    // A read_only principal asking the same: only read tools.
    let mut h = ChatHandle::open(client_with(&url, READER).await, ask.clone())
        .await
        .unwrap();
    h.until_done().await;
    let capped = offered_tools(&stack.llm);
    assert!(!capped.is_empty());
    assert!(
        !capped
            .iter()
            .any(|t| t == "shell" || t == "file_manager__write"),
        "{capped:?}"
    );
    // Nor does leaving the mode empty lift it to the service default.
    let mut h = ChatHandle::open(
        client_with(&url, READER).await,
        ChatRequest {
            permission_mode: String::new(),
            ..ask
        },
    )
    .await
    .unwrap();
    h.until_done().await;
    let empty = offered_tools(&stack.llm);
    assert!(!empty.iter().any(|t| t == "shell"), "{empty:?}");
}

// ---- Service-to-service trust: the issue's attacks on the runner, the
// registry and a provider, replayed against a real stack (`omicos up`'s).

use omicos_auth::{Credentials, ServiceRole};
use omicos_proto::{
    CallToolRequest, DeregisterRequest, ListProvidersRequest, ListToolsRequest, ProviderInstance,
    RegisterRequest, registry_client::RegistryClient, tool_provider_client::ToolProviderClient,
    tool_runner_client::ToolRunnerClient,
};

async fn channel(url: &str, creds: Credentials) -> omicos_auth::AuthedChannel {
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    creds.channel(ch)
}

async fn instances(runner: &str, secret: &str) -> Vec<ProviderInstance> {
    let mut r = RegistryClient::new(
        channel(
            runner,
            Credentials::service(secret, ServiceRole::Operator).unwrap(),
        )
        .await,
    );
    let mut v = r
        .list(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances;
    v.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    for i in &mut v {
        i.last_seen_ms = 0;
    }
    v
}

#[tokio::test]
async fn runner_registry_and_providers_take_calls_only_from_the_system() {
    let ws = tempfile::tempdir().unwrap();
    let mut o = omicos_stack::UpOptions::new(ws.path());
    o.port_base = 0;
    o.kernel = false;
    o.web = false;
    o.image_gen = false;
    o.env = vec![];
    let stack = omicos_stack::up(o).await.expect("stack up");
    let secret = stack.service_secret.clone();
    assert_eq!(secret.len(), 64, "the stack made a secret");
    let memory = stack
        .endpoints
        .iter()
        .find(|(n, _)| *n == "memory")
        .map(|(_, u)| u.clone())
        .unwrap();
    let before = instances(&stack.runner, &secret).await;
    let real = before
        .iter()
        .find(|i| i.provider == "memory")
        .expect("memory registered")
        .clone();

    let none = Credentials::none();
    let wrong = Credentials::service("not-the-secret", ServiceRole::Orchestrator).unwrap();
    let as_orchestrator = Credentials::service(&secret, ServiceRole::Orchestrator).unwrap();

    // The runner: no Execute/ListTools without the secret.
    for creds in [none.clone(), wrong.clone()] {
        let mut r = ToolRunnerClient::new(channel(&stack.runner, creds).await);
        let e = r.list_tools(ListToolsRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let mut r = ToolRunnerClient::new(channel(&stack.runner, as_orchestrator.clone()).await);
    r.list_tools(ListToolsRequest::default())
        .await
        .expect("the orchestrator may");

    // The registry: an evil tool, a take-over of the real instance id, a
    // static entry with a 126-year TTL, a Deregister of the real kernel.
    let evil = |id: &str, static_entry: bool| RegisterRequest {
        instance: Some(ProviderInstance {
            instance_id: id.into(),
            provider: "evil".into(),
            endpoint: "http://127.0.0.1:9".into(),
            tools: vec![omicos_proto::ToolSpec {
                name: "evil_tool".into(),
                ..Default::default()
            }],
            static_entry,
            ..Default::default()
        }),
        ttl_seconds: 4_000_000_000,
    };
    for (creds, code) in [
        (none.clone(), Code::Unauthenticated),
        (wrong.clone(), Code::Unauthenticated),
        (as_orchestrator.clone(), Code::PermissionDenied),
    ] {
        let mut reg = RegistryClient::new(channel(&stack.runner, creds).await);
        for req in [
            evil("evil-1", false),
            evil(&real.instance_id, false),
            evil("forever", true),
        ] {
            let e = reg.register(req).await.unwrap_err();
            assert_eq!(e.code(), code, "{e:?}");
        }
        let e = reg
            .deregister(DeregisterRequest {
                instance_id: real.instance_id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
    }
    assert_eq!(
        instances(&stack.runner, &secret).await,
        before,
        "the registry is unchanged"
    );

    // The same attacks from inside (a part holding the secret, as a provider):
    // the registry's own rules refuse each one (PERMISSION_DENIED).
    let as_provider = Credentials::service(&secret, ServiceRole::Provider).unwrap();
    let mut reg = RegistryClient::new(channel(&stack.runner, as_provider).await);
    fn keyed<T>(body: T, key: &str) -> tonic::Request<T> {
        let mut r = tonic::Request::new(body);
        r.metadata_mut().insert(
            omicos_auth::service::INSTANCE_KEY_HEADER,
            key.parse().unwrap(),
        );
        r
    }
    let takeover = |tool: &str| RegisterRequest {
        instance: Some(ProviderInstance {
            instance_id: "evil-2".into(),
            provider: "evil".into(),
            endpoint: "http://127.0.0.1:9".into(),
            tools: vec![omicos_proto::ToolSpec {
                name: tool.into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ttl_seconds: 0,
    };
    let mut hijack = real.clone();
    hijack.endpoint = "http://127.0.0.1:9".into();
    let attacks = [
        // A replacement for a tool another provider serves.
        (
            takeover(&real.tools[0].name),
            "belongs to the provider `memory`",
        ),
        // A built-in tool of the runner.
        (takeover("shell"), "built-in"),
        // The real instance's id at another endpoint.
        (
            RegisterRequest {
                instance: Some(hijack),
                ttl_seconds: 0,
            },
            "belongs to another registrant",
        ),
        // A static entry.
        (evil("forever", true), "static entries"),
    ];
    for (req, why) in attacks {
        let e = reg.register(keyed(req, "attacker-key")).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains(why), "{why}: {}", e.message());
    }
    // The real instance's heartbeats and Deregister need its own key.
    for key in [None, Some("attacker-key")] {
        let hb = omicos_proto::HeartbeatRequest {
            instance_id: real.instance_id.clone(),
        };
        let dr = DeregisterRequest {
            instance_id: real.instance_id.clone(),
        };
        let (hb, dr) = match key {
            Some(k) => (keyed(hb, k), keyed(dr, k)),
            None => (tonic::Request::new(hb), tonic::Request::new(dr)),
        };
        let e = reg.heartbeat(hb).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        let e = reg.deregister(dr).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    }
    assert_eq!(
        instances(&stack.runner, &secret).await,
        before,
        "the registry is unchanged"
    );
    // A new tool of its own is a provider's right, with the TTL capped (not 126 years).
    let r = reg
        .register(keyed(evil("evil-3", false), "attacker-key"))
        .await
        .expect("a new tool name is free")
        .into_inner();
    assert!(r.ttl_seconds <= 300, "{r:?}");
    reg.deregister(keyed(
        DeregisterRequest {
            instance_id: "evil-3".into(),
        },
        "attacker-key",
    ))
    .await
    .expect("its own instance");
    assert_eq!(
        instances(&stack.runner, &secret).await,
        before,
        "the registry is back as it was"
    );

    // A provider: CallTool around the pipeline is refused, from outside and
    // from any part but a runner.
    let call = CallToolRequest {
        tool: "memory__list".into(),
        arguments_json: r#"{"scope":"someone-else"}"#.into(),
        context: None,
    };
    for (creds, code) in [
        (none, Code::Unauthenticated),
        (wrong, Code::Unauthenticated),
        (as_orchestrator, Code::PermissionDenied),
    ] {
        let mut p = ToolProviderClient::new(channel(&memory, creds).await);
        let e = p.call_tool(call.clone()).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
    }
    // And the stack itself still works end to end: the runner reaches the provider.
    let mut p = ToolProviderClient::new(
        channel(
            &memory,
            Credentials::service(&secret, ServiceRole::Runner).unwrap(),
        )
        .await,
    );
    let _ = p.call_tool(call).await.expect("a runner may call");
    stack.stop().await.unwrap();
}

// ---- Tenants: each works in `<root>/<tenant>/`, learnt by the runner only
// from the orchestrator it authenticated (the service secret).

#[tokio::test]
async fn each_tenant_works_in_its_own_workspace() {
    const SECRET: &str = "tenant-test-service-secret";
    let write = r#"{"path":"note.txt","content":"acme only"}"#;
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![("c1".into(), "file_manager__write".into(), write.into())],
        ),
        Reply::Text("written".into()),
        Reply::Tools(
            String::new(),
            vec![
                (
                    "c2".into(),
                    "file_manager__read".into(),
                    r#"{"path":"../acme/note.txt"}"#.into(),
                ),
                (
                    "c3".into(),
                    "file_manager__read".into(),
                    r#"{"path":"note.txt"}"#.into(),
                ),
            ],
        ),
        Reply::Text("read".into()),
    ])
    .await;
    let stack = Stack::start(
        llm,
        StackOptions {
            runner_overrides: serde_json::json!({"service_secret": SECRET}),
            tweak: Some(Box::new(|c| {
                c.service_secret = SECRET.into();
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    chat(&url, ALICE, "").await.expect("alice's turn");
    let ws = &stack.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join(".omicos/tenants/acme/note.txt")).unwrap(),
        "acme only",
        "alice's file is in her tenant's workspace"
    );
    assert!(!ws.join("note.txt").exists(), "not in the root");

    chat(&url, MALLORY, "").await.expect("mallory's turn");
    let last = stack.llm.requests().pop().unwrap();
    let results: Vec<String> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool" && (m["tool_call_id"] == "c2" || m["tool_call_id"] == "c3"))
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(results.len(), 2, "{last:?}");
    for r in &results {
        assert!(
            !r.contains("acme only"),
            "another tenant's file leaked: {r}"
        );
        assert!(r.contains("error"), "{r}");
    }
    assert!(
        ws.join(".omicos/tenants/evil").is_dir(),
        "mallory works in her own directory"
    );
}

// ---- /files/: the page's output files need the same credential, and only
// the session's owner gets its outputs (another owner's: 404, as missing).

#[tokio::test]
async fn files_need_the_token_and_belong_to_the_sessions_owner() {
    let idp = Idp::start().await;
    let stack = start(&idp, 2).await;
    let url = stack.orchestrator.clone();
    let (sid, _) = alice_session(&url).await;
    // Alice's tenant is acme: her outputs are in <root>/.omicos/tenants/acme/.
    let dir = stack
        .workspace
        .join(".omicos/tenants/acme/.omicos/outputs")
        .join(&sid);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plot.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    let http = reqwest::Client::new();
    let get = |auth: Option<(&'static str, String)>| {
        let mut r = http.get(format!("{url}/files/.omicos/outputs/{sid}/plot.png"));
        if let Some((k, v)) = auth {
            r = r.header(k, v);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let bearer = |t: &str| Some(("authorization", format!("Bearer {t}")));
    assert_eq!(get(None).await, 401, "no token");
    assert_eq!(get(bearer("wrong-token")).await, 401, "a bad token");
    assert_eq!(get(bearer(MALLORY)).await, 404, "another tenant");
    assert_eq!(
        get(bearer(READER)).await,
        404,
        "another subject of the same tenant"
    );
    assert_eq!(get(bearer(ALICE)).await, 200, "the owner");
    assert_eq!(
        get(Some(("cookie", format!("other=1; omicos_token={ALICE}")))).await,
        200,
        "the owner, through the page's cookie"
    );
    assert_eq!(
        get(Some(("cookie", format!("omicos_token={MALLORY}")))).await,
        404
    );

    // Resolve, then authorize (issue 39): the reader (acme, another subject)
    // has a session of its own, and reaches alice's file through it with
    // `..`, `%2e%2e` and a symlink. The raw request line is sent as written
    // (an HTTP client would normalize the dot segments away).
    let mut h = ChatHandle::open(client_with(&url, READER).await, req(""))
        .await
        .unwrap();
    let own = h.until_done().await[0].session_id.clone();
    let own_dir = stack
        .workspace
        .join(".omicos/tenants/acme/.omicos/outputs")
        .join(&own);
    std::fs::create_dir_all(&own_dir).unwrap();
    std::fs::write(own_dir.join("mine.png"), b"\x89PNG\r\n\x1a\nmine").unwrap();
    std::os::unix::fs::symlink(dir.join("plot.png"), own_dir.join("link.png")).unwrap();
    let addr = url.trim_start_matches("http://").to_owned();
    let raw = |path: String, token: &'static str| {
        let addr = addr.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let r = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
            );
            s.write_all(r.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            let text = String::from_utf8_lossy(&out);
            text.split(' ').nth(1).unwrap_or("").parse::<u16>().unwrap()
        }
    };
    assert_eq!(
        raw(format!("/files/.omicos/outputs/{own}/mine.png"), READER).await,
        200,
        "the reader's own file"
    );
    for path in [
        format!("/files/.omicos/outputs/{own}/../{sid}/plot.png"),
        format!("/files/.omicos/outputs/{own}/%2e%2e/{sid}/plot.png"),
        format!("/files/.omicos/outputs/{own}/%2E%2E/{sid}/plot.png"),
        format!("/files/.omicos/outputs/{own}/..%2f{sid}/plot.png"),
        format!("/files/.omicos/outputs/{own}/link.png"),
        format!("/files/.omicos/outputs/{own}/./../../outputs/{sid}/plot.png"),
    ] {
        assert_eq!(raw(path.clone(), READER).await, 404, "{path}");
    }
    // The owner still reads hers by the same detours (they resolve to her file).
    assert_eq!(
        raw(
            format!("/files/.omicos/outputs/{own}/%2e%2e/{sid}/plot.png"),
            ALICE
        )
        .await,
        200
    );
}

// ---- Memory is per principal by default (issue 39): one person's memories
// never reach a colleague's agent in the same tenant.

#[tokio::test]
async fn memory_is_per_principal_by_default() {
    let (reader, alice) = memory_between_colleagues(serde_json::json!({})).await;
    assert!(
        !reader.contains("zebra"),
        "a colleague read alice's memory: {reader}"
    );
    assert!(
        alice.contains("zebra"),
        "alice lost her own memory: {alice}"
    );
}

/// A tenant-wide memory is an explicit choice per agent: the agent named
/// in `memory_sharing_agents` shares one memory among the tenant's
/// principals while the deployment's default stays `principal`.
#[tokio::test]
async fn memory_shared_by_a_tenant_is_a_choice_per_agent() {
    let mut agents = serde_json::Map::new();
    agents.insert(
        omicos_orchestrator::agents::SINGLE_AGENT_ID.into(),
        "tenant".into(),
    );
    agents.insert("someone-else".into(), "principal".into());
    let (reader, alice) =
        memory_between_colleagues(serde_json::json!({ "memory_sharing_agents": agents })).await;
    assert!(reader.contains("zebra"), "the shared memory: {reader}");
    assert!(alice.contains("zebra"), "{alice}");
}

/// alice saves a memory, her colleague (same tenant) searches for it, then
/// alice does: what each search answered.
async fn memory_between_colleagues(runner_overrides: serde_json::Value) -> (String, String) {
    const SECRET: &str = "memory-test-service-secret";
    let call = |id: &str, tool: &str, args: serde_json::Value| {
        Reply::Tools(
            String::new(),
            vec![(id.into(), tool.into(), args.to_string())],
        )
    };
    let llm = FakeLlm::start(vec![
        call(
            "c_save",
            "memory__save",
            serde_json::json!({"content": "alice's private plan is zebra", "category": "project"}),
        ),
        Reply::Text("saved".into()),
        call(
            "c_reader",
            "memory__search",
            serde_json::json!({"query": "private plan zebra"}),
        ),
        Reply::Text("searched".into()),
        call(
            "c_alice",
            "memory__search",
            serde_json::json!({"query": "private plan zebra"}),
        ),
        Reply::Text("searched".into()),
    ])
    .await;
    let mut overrides = serde_json::json!({"service_secret": SECRET});
    overrides
        .as_object_mut()
        .unwrap()
        .extend(runner_overrides.as_object().cloned().unwrap_or_default());
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            runner_overrides: overrides,
            tweak: Some(Box::new(|c| {
                c.service_secret = SECRET.into();
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(READER, "reader", "acme", "read_only"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    // The memory provider, registered with the secret.
    let db = format!("sqlite://{}", stack.workspace.join("memory.db").display());
    let store = omicos_memory::MemoryStore::open(&db).await.unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sd = omicos_servicekit::Shutdown::new(std::time::Duration::from_secs(1));
    tokio::spawn(omicos_toolkit::serve_provider_with(
        std::sync::Arc::new(omicos_memory::MemoryProvider::new(store)),
        l,
        omicos_toolkit::ProviderHosting {
            registry: Some(stack.runner.clone()),
            advertise: None,
            workspace: stack.workspace.clone(),
            ttl_seconds: 0,
        },
        SECRET,
        sd.clone(),
    ));
    for _ in 0..100 {
        if instances(&stack.runner, SECRET)
            .await
            .iter()
            .any(|i| i.provider == "memory")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let url = stack.orchestrator.clone();
    for token in [ALICE, READER, ALICE] {
        chat(&url, token, "").await.expect("a turn");
    }
    let result_of = |id: &str| {
        llm.requests()
            .iter()
            .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("no result for {id}"))
    };
    assert!(
        result_of("c_save").contains("saved"),
        "{}",
        result_of("c_save")
    );
    sd.trigger();
    (result_of("c_reader"), result_of("c_alice"))
}
