//! The OpenTelemetry GenAI conventions on a real turn: a team turn with a
//! `call_agent` sub-turn and a tool call exports `invoke_agent`, `chat` and
//! `execute_tool` spans over OTLP/gRPC to a receiver in this test, with the
//! conventions' names, kinds, attributes and nesting; the
//! `gen_ai.client.*` histograms appear on the scrape endpoint. Each nextest
//! test runs in its own process, so this one owns the process's tracer and
//! meter providers.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_orchestrator::agents::CatalogAgents;
use omicos_proto::ChatRequest;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One exported span, as the receiver decoded it.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    kind: i32,
    id: Vec<u8>,
    parent: Vec<u8>,
    trace: Vec<u8>,
    status: i32,
    attrs: HashMap<String, String>,
}

impl Seen {
    fn attr(&self, k: &str) -> &str {
        self.attrs.get(k).map(String::as_str).unwrap_or_default()
    }
}

/// An OTLP trace receiver that keeps every span.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Seen>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let attrs = s
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(Any::StringValue(s)) => s.clone(),
                                Some(Any::IntValue(i)) => i.to_string(),
                                Some(Any::BoolValue(b)) => b.to_string(),
                                Some(Any::DoubleValue(d)) => d.to_string(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), v)
                        })
                        .collect();
                    seen.push(Seen {
                        name: s.name,
                        kind: s.kind,
                        id: s.span_id,
                        parent: s.parent_span_id,
                        trace: s.trace_id,
                        status: s.status.map(|st| st.code).unwrap_or_default(),
                        attrs,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The sum of the samples of `metric` whose line contains every one of `labels`.
fn value(body: &str, metric: &str, labels: &[&str]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn agent(id: &str, toolsets: &[&str]) -> String {
    format!(
        "---\nid: {id}\nname: {id} agent\ndescription: the {id} of the team\ntoolsets: [{}]\n---\nYou are {id}.\n",
        toolsets.join(", ")
    )
}

/// A stack whose catalog is two workspace agents: lead and helper.
async fn team_stack(llm: FakeLlm) -> (Stack, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".omicos/agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lead.md"), agent("lead", &["file_manager"])).unwrap();
    std::fs::write(dir.join("helper.md"), agent("helper", &["file_manager"])).unwrap();
    let mut cc = omicos_catalog::CatalogConfig::new(tmp.path(), omicos_catalog::Tier::Community);
    cc.builtin_agents = false;
    cc.agent_cache_dir = None;
    cc.skill_cache_dir = None;
    let (catalog, warnings) = omicos_catalog::Catalog::load(cc);
    assert!(warnings.is_empty(), "{warnings:?}");
    let stack = Stack::start(
        llm,
        StackOptions {
            agents: Some(Arc::new(CatalogAgents::from_catalog(catalog))),
            workspace: Some(tmp.path().to_path_buf()),
            ..Default::default()
        },
    )
    .await;
    (stack, tmp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_turn_exports_genai_spans_and_metrics() {
    let rx = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(rx.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    // Installed before the stack's own init, which then only returns a guard.
    let telemetry =
        omicos_servicekit::telemetry::init_with("omicos-orchestrator", "info", Some(&otlp));
    let metrics = omicos_servicekit::metrics::init("omicos-e2e", Some("127.0.0.1:0"))
        .await
        .unwrap();
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c1".into(),
                "call_agent".into(),
                serde_json::json!({"agent_name": "helper", "instruction": "list the workspace"})
                    .to_string(),
            )],
        ),
        Reply::Tools(
            String::new(),
            vec![(
                "c2".into(),
                "file_manager__list".into(),
                r#"{"path":"."}"#.into(),
            )],
        ),
        Reply::Text("HELPER-ANSWER".into()),
        Reply::Text("LEAD-ANSWER".into()),
    ])
    .await;
    let (stack, _tmp) = team_stack(llm).await;
    let mut chat = stack
        .chat(ChatRequest {
            message: "SECRET-PROMPT".into(),
            agent: "lead".into(),
            team_members: vec!["lead".into(), "helper".into()],
            permission_mode: "auto".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    let session = events[0].session_id.clone();
    assert!(!session.is_empty());

    // The turn's spans ended before its TurnDone; the flush sends them now.
    tokio::task::spawn_blocking(move || telemetry.flush())
        .await
        .unwrap();
    let spans = rx.0.lock().unwrap().clone();
    let named = |n: &str| -> Vec<Seen> { spans.iter().filter(|s| s.name == n).cloned().collect() };
    let one = |n: &str| -> Seen {
        let v = named(n);
        assert_eq!(v.len(), 1, "one `{n}` span: {spans:#?}");
        v[0].clone()
    };
    let lead = one("invoke_agent lead");
    let helper = one("invoke_agent helper");
    let delegate = one("execute_tool call_agent");
    let list = one("execute_tool file_manager__list");
    let chats = named("chat fake-model");
    assert_eq!(chats.len(), 4, "four model requests: {spans:#?}");

    // Kinds: the agents run in this process, the model is a remote client call.
    for s in [&lead, &helper, &delegate, &list] {
        assert_eq!(s.kind, SpanKind::Internal as i32, "{s:?}");
    }
    for c in &chats {
        assert_eq!(c.kind, SpanKind::Client as i32, "{c:?}");
    }

    // Nesting: lead > (chat, execute_tool call_agent > invoke_agent helper > (chat, execute_tool list)).
    let trace = lead.trace.clone();
    assert!(
        spans
            .iter()
            .filter(|s| s.name.contains(' '))
            .all(|s| s.trace == trace)
    );
    assert_eq!(delegate.parent, lead.id);
    assert_eq!(helper.parent, delegate.id);
    assert_eq!(list.parent, helper.id);
    let under = |p: &Seen| chats.iter().filter(|c| c.parent == p.id).count();
    assert_eq!(under(&lead), 2, "{chats:#?}");
    assert_eq!(under(&helper), 2, "{chats:#?}");

    // Attributes.
    assert_eq!(lead.attr("gen_ai.operation.name"), "invoke_agent");
    assert_eq!(lead.attr("gen_ai.agent.name"), "lead");
    assert_eq!(lead.attr("gen_ai.conversation.id"), session);
    assert_eq!(helper.attr("gen_ai.agent.name"), "helper");
    assert_eq!(helper.attr("gen_ai.conversation.id"), session);
    for c in &chats {
        assert_eq!(c.attr("gen_ai.operation.name"), "chat");
        assert_eq!(c.attr("gen_ai.provider.name"), "openai");
        assert_eq!(c.attr("gen_ai.request.model"), "fake-model");
        assert_eq!(c.attr("gen_ai.response.model"), "fake-gpt");
        assert_eq!(c.attr("gen_ai.response.id"), "chatcmpl-1");
        assert_eq!(c.attr("gen_ai.usage.output_tokens"), "7");
        assert!(c.attr("gen_ai.usage.input_tokens").parse::<u64>().unwrap() > 0);
        // Content is opt-in: none of it by default.
        for k in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
        ] {
            assert!(!c.attrs.contains_key(k), "{k} recorded by default: {c:?}");
        }
        assert!(
            c.attrs.values().all(|v| !v.contains("SECRET-PROMPT")),
            "{c:?}"
        );
    }
    let reasons: Vec<&str> = chats
        .iter()
        .map(|c| c.attr("gen_ai.response.finish_reasons"))
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == r#"["stop"]"#).count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == r#"["tool_calls"]"#)
            .count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(delegate.attr("gen_ai.tool.name"), "call_agent");
    assert_eq!(delegate.attr("gen_ai.tool.call.id"), "c1");
    assert_eq!(delegate.attr("gen_ai.tool.type"), "function");
    assert_eq!(list.attr("gen_ai.tool.name"), "file_manager__list");
    assert_eq!(list.attr("gen_ai.tool.call.id"), "c2");
    // Nothing failed: no span has an error status or error.type.
    for s in spans.iter().filter(|s| s.name.contains(' ')) {
        assert_ne!(s.status, 2, "{s:?}");
        assert!(!s.attrs.contains_key("error.type"), "{s:?}");
    }

    // The GenAI client metrics, by token type and for every request.
    let body = scrape(metrics.local_addr().unwrap()).await;
    let labels = [
        r#"gen_ai_operation_name="chat""#,
        r#"gen_ai_provider_name="openai""#,
        r#"gen_ai_request_model="fake-model""#,
        r#"gen_ai_response_model="fake-gpt""#,
    ];
    let with = |extra: &'static str| -> Vec<&'static str> {
        let mut l = labels.to_vec();
        l.push(extra);
        l
    };
    assert_eq!(
        value(
            &body,
            "gen_ai_client_token_usage_count",
            &with(r#"gen_ai_token_type="output""#)
        ),
        4.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "gen_ai_client_token_usage_sum",
            &with(r#"gen_ai_token_type="output""#)
        ),
        28.0,
        "{body}"
    );
    assert!(
        value(
            &body,
            "gen_ai_client_token_usage_sum",
            &with(r#"gen_ai_token_type="input""#)
        ) > 0.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "gen_ai_client_operation_duration_seconds_count",
            &labels
        ),
        4.0,
        "{body}"
    );
}

/// A receiver on a loopback port, and this process's tracer exporting to it.
async fn receiver() -> (Receiver, omicos_servicekit::telemetry::TelemetryGuard) {
    let rx = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(rx.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let guard = omicos_servicekit::telemetry::init_with("omicos-orchestrator", "info", Some(&otlp));
    (rx, guard)
}

/// Runs one single-agent turn and answers its spans once exported.
async fn one_turn(
    rx: &Receiver,
    guard: omicos_servicekit::telemetry::TelemetryGuard,
    replies: Vec<Reply>,
    tweak: Option<omicos_e2e::stack::ConfigTweak>,
) -> (Vec<Seen>, String, Option<String>) {
    let stack = Stack::start(
        FakeLlm::start(replies).await,
        StackOptions {
            tweak,
            ..Default::default()
        },
    )
    .await;
    let mut chat = stack
        .chat(ChatRequest {
            message: "SECRET-PROMPT".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let events = chat.until_done().await;
    tokio::task::spawn_blocking(move || guard.flush())
        .await
        .unwrap();
    let spans = rx.0.lock().unwrap().clone();
    (spans, events[0].session_id.clone(), done_reason(&events))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_recorded_only_when_asked_for() {
    let (rx, guard) = receiver().await;
    let (spans, _, reason) = one_turn(
        &rx,
        guard,
        vec![Reply::Text("SECRET-ANSWER".into())],
        Some(Box::new(|c| c.telemetry.capture_content = true)),
    )
    .await;
    assert_eq!(reason.as_deref(), Some("completed"));
    let chat = spans
        .iter()
        .find(|s| s.name == "chat fake-model")
        .unwrap_or_else(|| panic!("no chat span: {spans:#?}"));
    let input: serde_json::Value =
        serde_json::from_str(chat.attr("gen_ai.input.messages")).unwrap();
    assert!(input.to_string().contains("SECRET-PROMPT"), "{input}");
    let output: serde_json::Value =
        serde_json::from_str(chat.attr("gen_ai.output.messages")).unwrap();
    assert_eq!(output[0]["role"], "assistant", "{output}");
    assert_eq!(
        output[0]["parts"][0]["content"], "SECRET-ANSWER",
        "{output}"
    );
    assert_eq!(output[0]["finish_reason"], "stop", "{output}");
    assert!(
        !chat.attr("gen_ai.system_instructions").is_empty(),
        "{chat:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_model_request_is_an_error_span() {
    let (rx, guard) = receiver().await;
    let (spans, session, reason) = one_turn(
        &rx,
        guard,
        vec![Reply::Status(400, "no such model".into(), None)],
        None,
    )
    .await;
    assert_eq!(reason.as_deref(), Some("error"));
    let chat = spans
        .iter()
        .find(|s| s.name == "chat fake-model")
        .unwrap_or_else(|| panic!("no chat span: {spans:#?}"));
    // Status code 2 is ERROR in OTLP.
    assert_eq!(chat.status, 2, "{chat:?}");
    assert_eq!(chat.attr("error.type"), "bad_request", "{chat:?}");
    let agent = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent "))
        .unwrap_or_else(|| panic!("no agent span: {spans:#?}"));
    assert_eq!(agent.status, 2, "{agent:?}");
    assert_eq!(agent.attr("error.type"), "error", "{agent:?}");
    assert_eq!(agent.attr("gen_ai.conversation.id"), session);
    assert_eq!(chat.parent, agent.id);
}
