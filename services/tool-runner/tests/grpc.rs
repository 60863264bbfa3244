//! The runner as a gRPC service on 127.0.0.1: Execute streams, ListTools, the
//! Registry, real provider services that register, panic, vanish, or never answer.

mod support;

use omicos_proto::{
    Decision, ExecuteApproval, ExecuteCancel, ExecuteClientMessage, ExecuteStart,
    ListProvidersRequest, ListToolsRequest, ProviderInstance, RegisterRequest, ToolResult,
    execute_client_message::Msg as In, execute_server_message::Msg as Out,
    registry_client::RegistryClient, tool_runner_client::ToolRunnerClient,
};
use omicos_servicekit::Shutdown;
use omicos_tool_runner::Config;
use omicos_toolkit::{ProviderHosting, serve_provider};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::TestKit;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

struct Runner {
    addr: String,
    shutdown: Shutdown,
    _dir: tempfile::TempDir,
    workspace: std::path::PathBuf,
}

async fn start_runner(f: impl FnOnce(&mut Config)) -> Runner {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    let mut cfg = Config {
        workspace: workspace.clone(),
        approval_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    f(&mut cfg);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new(Duration::from_secs(1));
    tokio::spawn(omicos_tool_runner::run(
        cfg,
        listener,
        shutdown.clone(),
        vec![],
    ));
    let r = Runner {
        addr,
        shutdown,
        _dir: dir,
        workspace,
    };
    // Ready when health answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(ch) = Channel::from_shared(r.addr.clone())
            .unwrap()
            .connect()
            .await
        {
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
            if let Ok(resp) = h
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "omicos.v1.ToolRunner".into(),
                })
                .await
                && resp.into_inner().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            {
                return r;
            }
        }
        assert!(Instant::now() < deadline, "runner did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Runner {
    async fn client(&self) -> ToolRunnerClient<Channel> {
        ToolRunnerClient::connect(self.addr.clone()).await.unwrap()
    }
    async fn registry(&self) -> RegistryClient<Channel> {
        RegistryClient::connect(self.addr.clone()).await.unwrap()
    }
    /// Opens an Execute stream; returns the sender for later messages and the response stream.
    async fn open(
        &self,
        start: ExecuteStart,
    ) -> (
        mpsc::Sender<ExecuteClientMessage>,
        tonic::Streaming<omicos_proto::ExecuteServerMessage>,
    ) {
        let (tx, rx) = mpsc::channel(8);
        tx.send(ExecuteClientMessage {
            msg: Some(In::Start(start)),
        })
        .await
        .unwrap();
        let resp = self
            .client()
            .await
            .execute(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        (tx, resp)
    }
    /// Runs one call to completion (no approvals answered).
    async fn call(&self, tool: &str, args: Value, mode: &str, session: &str) -> ToolResult {
        let (_tx, mut resp) = self.open(start(tool, args, mode, session)).await;
        while let Some(m) = resp.message().await.unwrap() {
            if let Some(Out::Result(r)) = m.msg {
                return r;
            }
        }
        panic!("stream ended without a result");
    }
    async fn wait_for_tool(&self, tool: &str, present: bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let tools = self
                .client()
                .await
                .list_tools(ListToolsRequest {
                    permission_mode: wire_mode("full"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .tools;
            if tools.iter().any(|t| t.name == tool) == present {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tool {tool} present={present} never happened"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn start(tool: &str, args: Value, mode: &str, session: &str) -> ExecuteStart {
    ExecuteStart {
        call_id: format!("call_{tool}"),
        tool_name: tool.into(),
        arguments: if args.is_string() {
            args.as_str().unwrap().to_owned()
        } else {
            args.to_string()
        },
        session_id: session.into(),
        agent_id: "tester".into(),
        permission_mode: wire_mode(mode),
        ..Default::default()
    }
}

/// A TestKit provider service on its own port; registers with `registry` when given.
async fn start_provider(kit: TestKit, registry: Option<String>) -> (String, Shutdown) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new(Duration::from_millis(200));
    let hosting = ProviderHosting {
        registry,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(
        Arc::new(kit),
        listener,
        hosting,
        shutdown.clone(),
    ));
    (addr, shutdown)
}

#[tokio::test]
async fn health_reflection_and_list_tools() {
    let r = start_runner(|_| {}).await;
    // Reflection (v1) lists both services.
    let ch = Channel::from_shared(r.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut refl =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(ch);
    let req = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(
        tonic_reflection::pb::v1::server_reflection_response::MessageResponse::ListServicesResponse(
            list,
        ),
    ) = resp.message_response
    else {
        panic!("no service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"omicos.v1.ToolRunner".to_string())
            && names.contains(&"omicos.v1.Registry".to_string()),
        "{names:?}"
    );

    let mut c = r.client().await;
    let resp = c
        .list_tools(ListToolsRequest {
            toolsets: vec!["file_manager".into(), "shell".into(), "bogus".into()],
            permission_mode: wire_mode("readonly"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = resp.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "file_manager__list",
            "file_manager__read",
            "file_manager__glob",
            "file_manager__grep"
        ]
    );
    assert_eq!(resp.unknown_toolsets, ["bogus"]);
    let e = c
        .list_tools(ListToolsRequest {
            permission_mode: wire_mode("bogus"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("unknown permission mode"));
}

#[tokio::test]
async fn write_then_read_through_execute() {
    let r = start_runner(|_| {}).await;
    let w = r
        .call(
            "file_manager__write",
            json!({"path":"notes/a.md","content":"# hi\n"}),
            "full",
            "s",
        )
        .await;
    assert_eq!(w.status().as_str(), "done", "{}", w.result);
    assert_eq!(
        std::fs::read_to_string(r.workspace.join("notes/a.md")).unwrap(),
        "# hi\n"
    );
    let rd = r
        .call(
            "file_manager__read",
            json!({"path":"notes/a.md"}),
            "read_only",
            "s",
        )
        .await;
    assert_eq!(
        (
            rd.status().as_str(),
            rd.result.as_str(),
            rd.tool_name.as_str()
        ),
        ("done", "# hi\n", "file_manager__read")
    );
    let rec: Value = serde_json::from_str(&rd.record_json).unwrap();
    assert_eq!(rec["arguments"], r#"{"path":"notes/a.md"}"#);
    assert_eq!(rec["status"], "done");
    // Bad input gives clear results and the service keeps serving.
    let bad = r
        .call("file_manager__read", json!("{not json"), "full", "s")
        .await;
    assert!(
        bad.status().as_str() == "error" && bad.result.contains("not valid JSON"),
        "{}",
        bad.result
    );
    let esc = r
        .call(
            "file_manager__read",
            json!({"path":"../../etc/passwd"}),
            "full",
            "s",
        )
        .await;
    assert!(
        esc.result.contains("outside the workspace"),
        "{}",
        esc.result
    );
    let unknown = r.call("flie_manager__read", json!({}), "full", "s").await;
    assert!(
        unknown
            .result
            .contains("closest known names: file_manager__read"),
        "{}",
        unknown.result
    );
    let big = r
        .call("shell", json!({"command":"seq 1 40000"}), "full", "s")
        .await;
    assert!(
        big.status().as_str() == "done" && big.spool_path.starts_with(".omicos/tool_outputs/"),
        "{}",
        big.spool_path
    );
}

#[tokio::test]
async fn approval_on_the_same_stream() {
    let r = start_runner(|_| {}).await;
    for (decision, status) in [
        (Decision::AllowOnce, "done"),
        (Decision::AllowSession, "done"),
        (Decision::Deny, "error"),
    ] {
        let (tx, mut resp) = r
            .open(start(
                "shell",
                json!({"command":"echo approved"}),
                "auto",
                "s",
            ))
            .await;
        let mut result = None;
        while let Some(m) = resp.message().await.unwrap() {
            match m.msg {
                Some(Out::ApprovalRequired(a)) => {
                    assert_eq!(a.summary, "shell: echo approved");
                    // A decision for another call is refused; the right one is taken.
                    tx.send(ExecuteClientMessage {
                        msg: Some(In::Approval(ExecuteApproval {
                            call_id: "other".into(),
                            decision: Decision::AllowOnce as i32,
                            rule: String::new(),
                        })),
                    })
                    .await
                    .unwrap();
                    tx.send(ExecuteClientMessage {
                        msg: Some(In::Approval(ExecuteApproval {
                            call_id: a.call_id,
                            decision: decision as i32,
                            rule: String::new(),
                        })),
                    })
                    .await
                    .unwrap();
                }
                Some(Out::Result(res)) => result = Some(res),
                _ => {}
            }
        }
        let res = result.expect("a result");
        assert_eq!(
            res.status().as_str(),
            status,
            "{decision:?}: {}",
            res.result
        );
        assert_eq!(res.approval, decision as i32);
        if decision == Decision::Deny {
            assert_eq!(res.result, "denied by user");
        } else {
            assert!(res.result.contains("approved"));
        }
    }
}

#[tokio::test]
async fn cancel_message_and_dropped_stream_stop_the_call() {
    // A dropped stream stops the call once the reattach grace period ends.
    let r = start_runner(|c| c.reattach_grace = Duration::from_secs(1)).await;
    // ExecuteCancel mid-call.
    let (tx, mut resp) = r
        .open(start(
            "shell",
            json!({"command":"echo started; sleep 30"}),
            "full",
            "s",
        ))
        .await;
    let started = Instant::now();
    let mut result = None;
    while let Some(m) = resp.message().await.unwrap() {
        match m.msg {
            Some(Out::Output(o)) if o.text.contains("started") => {
                tx.send(ExecuteClientMessage {
                    msg: Some(In::Cancel(ExecuteCancel {})),
                })
                .await
                .unwrap();
            }
            Some(Out::Result(res)) => result = Some(res),
            _ => {}
        }
    }
    let res = result.unwrap();
    assert_eq!(
        (res.status().as_str(), res.result.as_str()),
        ("error", "cancelled")
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // A dropped stream: the shell's process is killed.
    let (tx, mut resp) = r
        .open(start(
            "shell",
            // A heartbeat in the workspace: the pid bash would print is its
            // box's own number, not the host's.
            json!({"command":"echo beating; while :; do date +%s%N > beat; sleep 0.05; done"}),
            "full",
            "s",
        ))
        .await;
    while let Some(m) = resp.message().await.unwrap() {
        if let Some(Out::Output(o)) = m.msg
            && o.text.contains("beating")
        {
            break;
        }
    }
    let beat = r.workspace.join("beat");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !beat.exists() {
        assert!(Instant::now() < deadline, "the heartbeat never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(resp);
    drop(tx);
    // Once the call is killed, the heartbeat stops changing.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = std::fs::read_to_string(&beat).unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(300)).await;
        if std::fs::read_to_string(&beat).unwrap_or_default() == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the shell survived the dropped stream"
        );
    }
    // Still serving.
    assert_eq!(
        r.call("file_manager__list", json!({}), "read_only", "s")
            .await
            .status()
            .as_str(),
        "done"
    );
}

#[tokio::test]
async fn registered_provider_panic_vanish_and_unreachable() {
    let r = start_runner(|_| {}).await;
    let (_paddr, psd) = start_provider(TestKit::new(), Some(r.addr.clone())).await;
    r.wait_for_tool("echo", true).await;
    let res = r.call("echo", json!({"packages":"a"}), "full", "s").await;
    assert_eq!(res.status().as_str(), "done", "{}", res.result);
    let v: Value = serde_json::from_str(res.result.split("\n\n[note").next().unwrap()).unwrap();
    assert_eq!(v["args"], json!({"packages":["a"]}));
    // Progress/output of a remote tool streams through; a panic is an error result.
    let boom = r.call("boom", json!({}), "full", "s").await;
    assert!(
        boom.status().as_str() == "error" && boom.result.contains("panic"),
        "{}",
        boom.result
    );
    assert_eq!(
        r.call("noop", json!({}), "full", "s")
            .await
            .status()
            .as_str(),
        "done"
    );

    // Output of a remote tool streams through as it comes; a cancel stops the remote call.
    let (tx, mut resp) = r.open(start("slow", json!({}), "full", "s")).await;
    let started = Instant::now();
    let mut result = None;
    while let Some(m) = resp.message().await.unwrap() {
        match m.msg {
            Some(Out::Output(o)) => {
                assert_eq!(o.text, "started\n");
                tx.send(ExecuteClientMessage {
                    msg: Some(In::Cancel(ExecuteCancel {})),
                })
                .await
                .unwrap();
            }
            Some(Out::Result(res)) => result = Some(res),
            _ => {}
        }
    }
    assert_eq!(result.unwrap().result, "cancelled");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The provider stops: it deregisters, and its tools answer clearly.
    psd.trigger();
    r.wait_for_tool("echo", false).await;
    let gone = r.call("echo", json!({}), "full", "s").await;
    assert!(gone.result.contains("unknown tool"), "{}", gone.result);

    // Registered but unreachable (nothing listens on the port).
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut reg = r.registry().await;
    reg.register(RegisterRequest {
        instance: Some(ProviderInstance {
            instance_id: "ghost-1".into(),
            provider: "ghost".into(),
            endpoint: dead_addr,
            tools: vec![omicos_toolkit::tool("ghost_tool", "", json!({"type":"object"})).build()],
            ..Default::default()
        }),
        ttl_seconds: 60,
    })
    .await
    .unwrap();
    let res = r.call("ghost_tool", json!({}), "full", "s").await;
    assert!(
        res.status().as_str() == "error" && res.result.contains("provider unavailable"),
        "{}",
        res.result
    );
    assert_eq!(
        r.call("file_manager__list", json!({}), "read_only", "s")
            .await
            .status()
            .as_str(),
        "done"
    );
}

#[tokio::test]
async fn registry_ttl_expiry_and_heartbeat() {
    let r = start_runner(|c| c.registry_ttl = Duration::from_secs(30)).await;
    let mut reg = r.registry().await;
    let resp = reg
        .register(RegisterRequest {
            instance: Some(ProviderInstance {
                instance_id: "i1".into(),
                provider: "p".into(),
                endpoint: "http://127.0.0.1:9".into(),
                ..Default::default()
            }),
            ttl_seconds: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.ttl_seconds, resp.heartbeat_seconds), (1, 1));
    assert!(
        reg.heartbeat(omicos_proto::HeartbeatRequest {
            instance_id: "i1".into()
        })
        .await
        .unwrap()
        .into_inner()
        .known
    );
    assert_eq!(
        reg.list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances
            .len(),
        1
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        reg.list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances
            .is_empty()
    );
    assert!(
        !reg.heartbeat(omicos_proto::HeartbeatRequest {
            instance_id: "i1".into()
        })
        .await
        .unwrap()
        .into_inner()
        .known
    );
    let e = reg
        .register(RegisterRequest {
            instance: None,
            ttl_seconds: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn static_providers_are_described_with_retry() {
    // Reserve a port, start the runner pointing at it, and only then start the provider.
    let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let endpoint = format!("http://127.0.0.1:{port}");
    let ep = endpoint.clone();
    let r = start_runner(move |c| {
        c.providers = vec![omicos_tool_runner::config::StaticProvider {
            name: "testkit".into(),
            endpoint: ep,
        }]
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let sd = Shutdown::new(Duration::from_millis(200));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(
        Arc::new(TestKit::new()),
        listener,
        hosting,
        sd.clone(),
    ));
    r.wait_for_tool("echo", true).await;
    let list = r
        .registry()
        .await
        .list(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances;
    assert!(
        list.iter()
            .any(|i| i.static_entry && i.endpoint == endpoint)
    );
    assert_eq!(
        r.call("noop", json!({}), "full", "s")
            .await
            .status()
            .as_str(),
        "done"
    );
    sd.trigger();
}

#[tokio::test]
async fn kernel_sessions_stay_pinned_and_lost_state_is_said_plainly() {
    let r = start_runner(|_| {}).await;
    let mut shutdowns = std::collections::HashMap::new();
    for tag in ["kernel-a", "kernel-b"] {
        let kit = TestKit {
            name: "kernel".into(),
            affinity: true,
            tag: tag.into(),
            ..TestKit::new()
        };
        let (_, sd) = start_provider(kit, Some(r.addr.clone())).await;
        shutdowns.insert(tag.to_string(), sd);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while r
        .registry()
        .await
        .list(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances
        .len()
        < 2
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let instance = |res: &ToolResult| -> String {
        assert_eq!(res.status().as_str(), "done", "{}", res.result);
        serde_json::from_str::<Value>(&res.result).unwrap()["instance"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let first = instance(&r.call("echo", json!({}), "full", "sess-1").await);
    for _ in 0..5 {
        assert_eq!(
            instance(&r.call("echo", json!({}), "full", "sess-1").await),
            first
        );
    }
    shutdowns[&first].trigger();
    let deadline = Instant::now() + Duration::from_secs(10);
    while r
        .registry()
        .await
        .list(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances
        .len()
        > 1
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost = r.call("echo", json!({}), "full", "sess-1").await;
    assert!(
        lost.status().as_str() == "error"
            && lost.result.contains("kernel state")
            && lost.result.contains("lost"),
        "{}",
        lost.result
    );
    let second = instance(&r.call("echo", json!({}), "full", "sess-1").await);
    assert_ne!(second, first);
    r.shutdown.trigger();
}

#[tokio::test]
async fn execute_must_start_with_execute_start() {
    let r = start_runner(|_| {}).await;
    let msg = ExecuteClientMessage {
        msg: Some(In::Cancel(ExecuteCancel {})),
    };
    let e = r
        .client()
        .await
        .execute(tokio_stream::iter(vec![msg]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("ExecuteStart"), "{}", e.message());
}

/// A mode's wire value from its text; an unknown spelling becomes a value no build knows.
fn wire_mode(text: &str) -> i32 {
    omicos_proto::PermissionMode::parse(text).map_or(99, |m| m as i32)
}

#[path = "../../toolkit/tests/support/raw_wire.rs"]
mod raw_wire;

#[tokio::test]
async fn invalid_utf8_in_a_string_field_is_invalid_argument_on_the_runner_and_the_registry() {
    use raw_wire::{NOT_UTF8, field};
    let r = start_runner(|_| {}).await;
    // The hand encoding is right: with valid UTF-8, ExecuteStart { tool_name } decodes.
    let good = field(1, &field(2, b"file_manager__read"));
    let decoded = <ExecuteClientMessage as prost::Message>::decode(good.as_slice()).unwrap();
    assert!(matches!(decoded.msg, Some(In::Start(ref s)) if s.tool_name == "file_manager__read"));

    // Execute: ExecuteStart.tool_name is not UTF-8.
    let s = raw_wire::stream_status(
        &r.addr,
        "/omicos.v1.ToolRunner/Execute",
        field(1, &field(2, NOT_UTF8)),
    )
    .await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("UTF-8"), "{s:?}");
    // ListTools: a toolset name.
    let s = raw_wire::unary_status(
        &r.addr,
        "/omicos.v1.ToolRunner/ListTools",
        field(1, NOT_UTF8),
    )
    .await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    // Registry: RegisterRequest.instance.instance_id, and a heartbeat's instance_id.
    let s = raw_wire::unary_status(
        &r.addr,
        "/omicos.v1.Registry/Register",
        field(1, &field(1, NOT_UTF8)),
    )
    .await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let s =
        raw_wire::unary_status(&r.addr, "/omicos.v1.Registry/Heartbeat", field(1, NOT_UTF8)).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    // Nothing was registered, and the runner still serves.
    let listed = r
        .registry()
        .await
        .list(ListProvidersRequest {})
        .await
        .unwrap();
    assert!(listed.into_inner().instances.is_empty());
    let w = r
        .call(
            "file_manager__write",
            json!({"path":"ok.txt","content":"ok"}),
            "full",
            "s",
        )
        .await;
    assert_eq!(w.status().as_str(), "done", "{}", w.result);
    // A registration that decodes but is incomplete is refused with its reason.
    let e = r
        .registry()
        .await
        .register(RegisterRequest {
            instance: None,
            ttl_seconds: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("instance is missing"),
        "{}",
        e.message()
    );
}

/// An Execute call whose ExecuteClientMessage encodes to exactly `size` bytes:
/// a file_manager__write of `path` with a content of 'x's.
fn write_of_encoded_size(path: &str, size: usize) -> (ExecuteClientMessage, usize) {
    let build = |n: usize| {
        let args = json!({"path": path, "content": "x".repeat(n)}).to_string();
        ExecuteClientMessage {
            msg: Some(In::Start(ExecuteStart {
                arguments: args,
                ..start("file_manager__write", json!("{}"), "full", "s")
            })),
        }
    };
    let probe = prost::Message::encoded_len(&build(size - 1024));
    let n = size - 1024 + (size - probe);
    let m = build(n);
    assert_eq!(
        prost::Message::encoded_len(&m),
        size,
        "the message is exactly {size} bytes"
    );
    (m, n)
}

#[tokio::test]
async fn a_write_at_the_message_limit_is_done_and_just_past_it_is_refused_before_it_runs() {
    use omicos_proto::MAX_MESSAGE_BYTES;
    let r = start_runner(|_| {}).await;
    let client = || async {
        let ch = Channel::from_shared(r.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        ToolRunnerClient::new(ch)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            // Past the limit on purpose: the runner must be the one to refuse.
            .max_encoding_message_size(2 * MAX_MESSAGE_BYTES)
    };

    // At the limit: the write is done and its result (with the record) comes back.
    let (m, n) = write_of_encoded_size("at_limit.txt", MAX_MESSAGE_BYTES);
    let mut resp = client()
        .await
        .execute(tokio_stream::iter(vec![m]))
        .await
        .expect("a message at the limit is accepted")
        .into_inner();
    let mut result = None;
    while let Some(msg) = resp
        .message()
        .await
        .expect("no transport error for a call that succeeded")
    {
        if let Some(Out::Result(res)) = msg.msg {
            result = Some(res);
        }
    }
    let res = result.expect("a result");
    assert_eq!(res.status().as_str(), "done", "{}", res.result);
    assert_eq!(
        std::fs::metadata(r.workspace.join("at_limit.txt"))
            .unwrap()
            .len(),
        n as u64
    );
    assert!(
        res.record_json.len() < 16 * 1024,
        "record of {} bytes",
        res.record_json.len()
    );
    let rec: Value = serde_json::from_str(&res.record_json).unwrap();
    let raw_path = rec["arguments_spool"]["raw_path"]
        .as_str()
        .expect("spooled");
    assert_eq!(
        std::fs::metadata(r.workspace.join(raw_path)).unwrap().len() as usize,
        n + r#"{"content":"","path":"at_limit.txt"}"#.len(),
        "the spooled arguments are the whole argument string"
    );
    assert_eq!(rec["arguments_spool"]["run_is_raw"], true);
    assert_eq!(rec["arguments_run"], Value::Null);

    // One byte past it: refused as too large, and nothing ran.
    let (m, _) = write_of_encoded_size("past_limit.txt", MAX_MESSAGE_BYTES + 1);
    let status = match client().await.execute(tokio_stream::iter(vec![m])).await {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.expect_err("refused"),
    };
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    assert!(status.message().contains("too large"), "{status:?}");
    assert!(
        !r.workspace.join("past_limit.txt").exists(),
        "a refused call did not run"
    );
    // Still serving.
    let w = r
        .call(
            "file_manager__write",
            json!({"path":"after.txt","content":"ok"}),
            "full",
            "s",
        )
        .await;
    assert_eq!(w.status().as_str(), "done", "{}", w.result);
}

/// ListTools' catalog_version: a caller holding the current version gets a
/// small `unchanged` answer; a provider registering or leaving changes it,
/// and the stale version then gets the full list; two runners with the same
/// tools agree on it (what lets an orchestrator cache across many runners).
#[tokio::test]
async fn catalog_version_confirms_a_cached_list_until_the_registry_changes() {
    let r = start_runner(|_| {}).await;
    let other = start_runner(|_| {}).await;
    let ask = |c: &mut ToolRunnerClient<Channel>, v: &str| {
        let req = ListToolsRequest {
            permission_mode: wire_mode("full"),
            if_version: v.to_owned(),
            ..Default::default()
        };
        let mut c = c.clone();
        async move { c.list_tools(req).await.unwrap().into_inner() }
    };
    let mut c = r.client().await;
    let first = ask(&mut c, "").await;
    assert!(!first.unchanged && !first.tools.is_empty());
    assert!(!first.catalog_version.is_empty());
    let mut oc = other.client().await;
    assert_eq!(
        ask(&mut oc, "").await.catalog_version,
        first.catalog_version,
        "same tools, same version on another runner"
    );
    let same = ask(&mut c, &first.catalog_version).await;
    assert!(same.unchanged && same.tools.is_empty() && same.unknown_toolsets.is_empty());
    assert_eq!(same.catalog_version, first.catalog_version);

    let (_paddr, psd) = start_provider(TestKit::new(), Some(r.addr.clone())).await;
    r.wait_for_tool("echo", true).await;
    let grown = ask(&mut c, &first.catalog_version).await;
    assert!(
        !grown.unchanged,
        "a registered provider makes the cached list stale"
    );
    assert_ne!(grown.catalog_version, first.catalog_version);
    assert!(grown.tools.iter().any(|t| t.name == "echo"));

    psd.trigger();
    r.wait_for_tool("echo", false).await;
    let back = ask(&mut c, &grown.catalog_version).await;
    assert!(!back.unchanged && back.tools.iter().all(|t| t.name != "echo"));
    assert_eq!(
        back.catalog_version, first.catalog_version,
        "the same tools again"
    );
}
