//! A real stack on loopback ports: the tool-runner (with its registry) and the
//! orchestrator, each on its own 127.0.0.1 port, sharing a temporary workspace.

use crate::fake_llm::FakeLlm;
use omicos_orchestrator::{Parts, agents::AgentDirectory, config::Config};
use omicos_proto::{
    ApprovalDecision, CancelRequest, ChatClientMessage, ChatEvent, ChatRequest, Decision,
    ToolCallFinished, ToolCallStarted, chat_client_message, chat_event,
    orchestrator_client::OrchestratorClient,
};
use omicos_servicekit::Shutdown;
use omicos_sessionstore::SessionStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The bearer token every test stack accepts (principal `tester`, tenant
/// `default`, any mode); [`Stack::client`] sends it.
pub const TEST_TOKEN: &str = "omicos-e2e-test-token";

/// A client of a test stack's orchestrator, sending a credential.
pub type Client = OrchestratorClient<omicos_auth::AuthedChannel>;

/// A client of the orchestrator at `url` that sends `token` (empty: none).
pub async fn client_with(url: &str, token: &str) -> Client {
    let ch = Channel::from_shared(url.to_owned())
        .expect("orchestrator URL")
        .connect()
        .await
        .expect("connect orchestrator");
    OrchestratorClient::new(
        omicos_auth::Credentials::bearer(token)
            .expect("token")
            .channel(ch),
    )
}

/// A client of the orchestrator at `url` with [`TEST_TOKEN`].
pub async fn client_at(url: &str) -> Client {
    client_with(url, TEST_TOKEN).await
}

/// An API key entry for `token`.
pub fn api_key(
    token: &str,
    principal: &str,
    tenant: &str,
    max_mode: &str,
) -> omicos_auth::ApiKeyConfig {
    omicos_auth::ApiKeyConfig {
        sha256: omicos_auth::sha256_hex(token),
        principal: principal.into(),
        tenant: tenant.into(),
        tier: String::new(),
        max_mode: max_mode.into(),
    }
}

/// A change to the orchestrator's config before it starts.
pub type ConfigTweak = Box<dyn FnOnce(&mut Config) + Send>;

/// How to start a stack.
pub struct StackOptions {
    /// `openai`, `anthropic` or `replay`.
    pub backend: String,
    /// Replay script path (replay backend).
    pub replay_file: String,
    /// Agents; None: the single default agent.
    pub agents: Option<Arc<dyn AgentDirectory>>,
    /// Extra in-process providers for the runner.
    pub providers: Vec<Arc<dyn omicos_toolkit::Provider>>,
    /// Runner config overrides (JSON object merged over the defaults).
    pub runner_overrides: serde_json::Value,
    /// Orchestrator config tweak.
    pub tweak: Option<ConfigTweak>,
    /// Conversation store URL; empty (the default): SQLite in the
    /// workspace, `.omicos/sessions.db`, the store users get by default.
    pub store_url: String,
    /// A store to use instead of opening `store_url` (a [`crate::FlakyStore`]).
    pub store: Option<Arc<dyn SessionStore>>,
    /// Workspace to use; None: a new temporary directory.
    pub workspace: Option<std::path::PathBuf>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            backend: "openai".into(),
            replay_file: String::new(),
            agents: None,
            providers: vec![],
            runner_overrides: serde_json::json!({}),
            tweak: None,
            store_url: String::new(),
            store: None,
            workspace: None,
        }
    }
}

/// A running stack.
pub struct Stack {
    /// Orchestrator URL.
    pub orchestrator: String,
    /// Tool-runner URL (also the registry).
    pub runner: String,
    /// Workspace root.
    pub workspace: std::path::PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The fake LLM.
    pub llm: FakeLlm,
    /// Stops the orchestrator.
    pub orch_shutdown: Shutdown,
    /// Stops the runner.
    pub runner_shutdown: Shutdown,
    orch_cfg: Config,
    agents: Arc<dyn AgentDirectory>,
    store: Option<Arc<dyn SessionStore>>,
}

fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    if let (Some(b), serde_json::Value::Object(o)) = (base.as_object_mut(), over) {
        for (k, v) in o {
            b.insert(k, v);
        }
    }
}

impl Stack {
    /// Starts the runner and the orchestrator against `llm`.
    pub async fn start(llm: FakeLlm, opts: StackOptions) -> Stack {
        let _ = omicos_servicekit::telemetry::init("omicos-tests", "warn");
        let (tmp, workspace) = match opts.workspace {
            Some(w) => (None, w),
            None => {
                let t = tempfile::tempdir().expect("tempdir");
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let runner_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runner_url = format!("http://{}", runner_listener.local_addr().unwrap());
        let mut rc = serde_json::json!({"workspace": workspace, "approval_timeout": 5});
        merge(&mut rc, opts.runner_overrides);
        let runner_cfg: omicos_tool_runner::Config =
            serde_json::from_value(rc).expect("runner config");
        let runner_shutdown = Shutdown::new(Duration::from_secs(2));
        tokio::spawn(omicos_tool_runner::run(
            runner_cfg,
            runner_listener,
            runner_shutdown.clone(),
            opts.providers,
        ));

        let mut cfg = Config {
            workspace: workspace.clone(),
            tool_runner: runner_url.clone(),
            store_url: opts.store_url.clone(),
            heartbeat_interval: Duration::from_secs(30),
            ..Default::default()
        };
        cfg.llm.backend = opts.backend.clone();
        cfg.llm.base_url = match opts.backend.as_str() {
            "anthropic" => llm.base.clone(),
            _ => llm.openai_url(),
        };
        cfg.llm.api_key = "test-key".into();
        cfg.llm.model = "fake-model".into();
        cfg.llm.replay_file = opts.replay_file;
        cfg.llm.retry_base_delay = Duration::from_millis(20);
        cfg.llm.retry_max_delay = Duration::from_millis(200);
        cfg.llm.idle_timeout = Duration::from_secs(5);
        cfg.auth
            .api_keys
            .push(api_key(TEST_TOKEN, "tester", "default", "full"));
        if let Some(t) = opts.tweak {
            t(&mut cfg);
        }
        let agents = opts.agents.unwrap_or_else(|| {
            Arc::new(
                omicos_orchestrator::agents::SingleAgent::from_config(&cfg)
                    .expect("the configured tier"),
            )
        });
        let (orch_url, orch_shutdown) =
            start_orchestrator(cfg.clone(), agents.clone(), opts.store.clone()).await;
        let stack = Stack {
            orchestrator: orch_url,
            runner: runner_url,
            workspace,
            _tmp: tmp,
            llm,
            orch_shutdown,
            runner_shutdown,
            orch_cfg: cfg,
            agents,
            store: opts.store,
        };
        stack.wait_serving(&stack.orchestrator).await;
        stack
    }

    /// Stops the orchestrator and starts a new one (new port, same store,
    /// workspace and runner), as a restart or a second replica would.
    pub async fn restart_orchestrator(&mut self) {
        self.orch_shutdown.trigger();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (url, sd) = start_orchestrator(
            self.orch_cfg.clone(),
            self.agents.clone(),
            self.store.clone(),
        )
        .await;
        self.orchestrator = url;
        self.orch_shutdown = sd;
        self.wait_serving(&self.orchestrator.clone()).await;
    }

    /// Starts one more orchestrator replica on the same store; returns its URL.
    pub async fn add_replica(&self) -> String {
        let (url, _sd) = start_orchestrator(
            self.orch_cfg.clone(),
            self.agents.clone(),
            self.store.clone(),
        )
        .await;
        self.wait_serving(&url).await;
        url
    }

    /// Waits until the health service at `url` says SERVING.
    pub async fn wait_serving(&self, url: &str) {
        for _ in 0..200 {
            if let Ok(ch) = Channel::from_shared(url.to_owned())
                .unwrap()
                .connect()
                .await
            {
                // With the token: a stack may close health too.
                let mut h = tonic_health::pb::health_client::HealthClient::new(
                    omicos_auth::Credentials::bearer(TEST_TOKEN)
                        .unwrap()
                        .channel(ch),
                );
                if let Ok(r) = h
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    && r.into_inner().status
                        == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{url} never became SERVING");
    }

    /// A client of the orchestrator.
    pub async fn client(&self) -> Client {
        client_at(&self.orchestrator).await
    }

    /// Opens a Chat with `req`.
    pub async fn chat(&self, req: ChatRequest) -> Result<ChatHandle, tonic::Status> {
        ChatHandle::open(self.client().await, req).await
    }

    /// Opens a Chat whose call carries a deadline (`grpc-timeout`).
    pub async fn chat_with_deadline(
        &self,
        req: ChatRequest,
        deadline: Duration,
    ) -> Result<ChatHandle, tonic::Status> {
        ChatHandle::open_with(self.client().await, req, Some(deadline)).await
    }
}

async fn start_orchestrator(
    cfg: Config,
    agents: Arc<dyn AgentDirectory>,
    store: Option<Arc<dyn SessionStore>>,
) -> (String, Shutdown) {
    let backends = omicos_orchestrator::build_backends(&cfg.llm).expect("backends");
    let store = match store {
        Some(s) => s,
        None => omicos_orchestrator::open_store(&cfg).await.expect("store"),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sd = Shutdown::new(Duration::from_secs(2));
    tokio::spawn(omicos_orchestrator::serve(
        Parts {
            config: cfg,
            agents,
            store,
            backends,
        },
        listener,
        sd.clone(),
    ));
    (url, sd)
}

/// An open Chat stream.
pub struct ChatHandle {
    tx: mpsc::Sender<ChatClientMessage>,
    stream: tonic::Streaming<ChatEvent>,
    /// Events received so far.
    pub events: Vec<ChatEvent>,
}

impl ChatHandle {
    /// Opens a Chat.
    pub async fn open(client: Client, req: ChatRequest) -> Result<Self, tonic::Status> {
        Self::open_with(client, req, None).await
    }

    /// Opens a Chat, with a deadline on the call when given.
    pub async fn open_with(
        mut client: Client,
        req: ChatRequest,
        deadline: Option<Duration>,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(ChatClientMessage {
            msg: Some(chat_client_message::Msg::Request(req)),
        })
        .await
        .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        let stream = client.chat(request).await?.into_inner();
        Ok(Self {
            tx,
            stream,
            events: vec![],
        })
    }

    /// The next non-heartbeat event (None at the end), within 30 s.
    pub async fn next(&mut self) -> Option<ChatEvent> {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), self.stream.message())
                .await
                .expect("no chat event within 30 s")
                .ok()??;
            if matches!(m.kind, Some(chat_event::Kind::Heartbeat(_))) {
                continue;
            }
            self.events.push(m.clone());
            return Some(m);
        }
    }

    /// Reads until turn_done or the end; returns all events read so far.
    pub async fn until_done(&mut self) -> Vec<ChatEvent> {
        while let Some(ev) = self.next().await {
            if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
                break;
            }
        }
        self.events.clone()
    }

    /// Reads until turn_done or the end, allowing each approval the turn
    /// asks for once; returns all events read so far.
    pub async fn until_done_allowing(&mut self) -> Vec<ChatEvent> {
        while let Some(ev) = self.next().await {
            match ev.kind {
                Some(chat_event::Kind::ToolApprovalRequest(a)) => {
                    self.approve(&a.call_id, Decision::AllowOnce).await
                }
                Some(chat_event::Kind::TurnDone(_)) => break,
                _ => {}
            }
        }
        self.events.clone()
    }

    /// Reads until an approval request; returns its call id.
    pub async fn until_approval(&mut self) -> String {
        while let Some(ev) = self.next().await {
            if let Some(chat_event::Kind::ToolApprovalRequest(a)) = ev.kind {
                return a.call_id;
            }
        }
        panic!(
            "stream ended without an approval request: {:#?}",
            self.events
        );
    }

    /// Answers an approval on the stream.
    pub async fn approve(&self, call_id: &str, decision: Decision) {
        self.tx
            .send(ChatClientMessage {
                msg: Some(chat_client_message::Msg::Approval(ApprovalDecision {
                    call_id: call_id.into(),
                    decision: decision as i32,
                    rule: String::new(),
                })),
            })
            .await
            .unwrap();
    }

    /// Cancels the turn on the stream.
    pub async fn cancel(&self) {
        self.tx
            .send(ChatClientMessage {
                msg: Some(chat_client_message::Msg::Cancel(CancelRequest {
                    reason: "test".into(),
                })),
            })
            .await
            .unwrap();
    }
}

/// The streamed text of these events.
pub fn events_text(events: &[ChatEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::TextDelta(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// The started tool calls among these events.
pub fn started_calls(events: &[ChatEvent]) -> Vec<ToolCallStarted> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolCallStarted(s)) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// The finished tool calls among these events.
pub fn finished_calls(events: &[ChatEvent]) -> Vec<ToolCallFinished> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolCallFinished(f)) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// One tool call as `token`, in a new session, through a model answering
/// with [`crate::fake_llm::call_per_message`] (`CALL <tool> <args>`), allowed
/// by mode `full`: the session and the call's finish (exactly one call).
pub async fn one_call(
    url: &str,
    token: &str,
    tool: &str,
    args: &serde_json::Value,
) -> (String, ToolCallFinished) {
    let mut h = ChatHandle::open(
        client_with(url, token).await,
        ChatRequest {
            message: format!("CALL {tool} {args}"),
            permission_mode: "full".into(),
            ..Default::default()
        },
    )
    .await
    .expect("chat");
    let events = h.until_done().await;
    let mut calls = finished_calls(&events);
    assert_eq!(calls.len(), 1, "one call: {events:?}");
    (events[0].session_id.clone(), calls.remove(0))
}

/// The turn_done reason, if any.
pub fn done_reason(events: &[ChatEvent]) -> Option<String> {
    events.iter().find_map(|e| match &e.kind {
        Some(chat_event::Kind::TurnDone(d)) => Some(d.reason().as_str().to_owned()),
        _ => None,
    })
}

/// The one TurnMoved event of a resumed turn (panics unless there is exactly one).
pub fn turn_moved(events: &[ChatEvent]) -> omicos_proto::TurnMoved {
    let moved: Vec<&omicos_proto::TurnMoved> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::TurnMoved(m)) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(moved.len(), 1, "exactly one TurnMoved: {events:#?}");
    moved[0].clone()
}

/// Asserts that seqs are consecutive, starting after `from`.
pub fn assert_gap_free(events: &[ChatEvent], from: u64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.event_seq,
            from + 1 + i as u64,
            "event {i} out of sequence: {:#?}",
            e
        );
    }
}
