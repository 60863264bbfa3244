//! omicos as an MCP server: the runner's tools, each call through the same
//! governed pipeline (`ToolBackend`, implemented by the runner's Pipeline),
//! for any MCP client over stdio (`omicos mcp serve`) or streamable HTTP
//! (`mcp.serve.listen`, `POST /mcp`).
//!
//! The permission mode comes from config. When the pipeline asks for an
//! approval (auto mode), the client is asked with an MCP elicitation if it
//! declared the capability; a client that cannot be asked gets a clear
//! refusal as the tool's error. On protocol 2026-07-28, where a server may
//! not send requests, the form goes back as an input-required result and
//! the parked call resumes when the client retries it with the answer.

use crate::config::ServeConfig;
use async_trait::async_trait;
use omicos_proto::{
    Decision, ExecuteApproval, ExecuteServerMessage, ExecuteStart, PermissionMode, Risk,
    ToolResult, ToolSpec, ToolStatus, execute_server_message,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequest,
    ElicitRequestParams, ElicitationAction, Implementation, InitializeResult, InputRequest,
    InputRequests, InputRequiredResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::{ElicitationMode, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The text a client reads when a call needs an approval it cannot give.
pub const NO_ELICITATION_REFUSAL: &str = "refused: this call needs the user's approval (permission mode auto), and this MCP client cannot be asked (it did not declare the `elicitation` capability). Ask the operator to allow the tool, or run the server with mcp.serve.permission_mode: full";

/// How long an elicitation waits for the user.
pub const ELICITATION_TIMEOUT: Duration = Duration::from_secs(300);

/// What the bridge needs from the runner: the tools a mode allows, and one
/// call through the whole pipeline (the ToolRunner/Execute contract, in process).
#[async_trait]
pub trait ToolBackend: Send + Sync + 'static {
    /// The tools visible under `toolsets` (empty: all) and `mode`.
    async fn list_tools(
        &self,
        toolsets: &[String],
        mode: PermissionMode,
    ) -> Result<Vec<ToolSpec>, String>;
    /// Runs one call: events (progress, output, approval requests) go to
    /// `events`, decisions come from `approvals`, `cancel` stops it.
    async fn execute(
        &self,
        start: ExecuteStart,
        events: mpsc::Sender<ExecuteServerMessage>,
        approvals: mpsc::Receiver<ExecuteApproval>,
        cancel: CancellationToken,
    ) -> ToolResult;
}

/// The MCP server handler over a [`ToolBackend`]. One per MCP session.
#[derive(Clone)]
pub struct Bridge {
    backend: Arc<dyn ToolBackend>,
    mode: PermissionMode,
    toolsets: Vec<String>,
    session_id: String,
    calls: Arc<AtomicU64>,
    /// The tools with an output schema, as last listed to this session.
    structured: Arc<std::sync::Mutex<Option<HashSet<String>>>>,
    /// Calls waiting for a 2026-07-28 client's retry.
    parked: ParkedCalls,
}

static SESSIONS: AtomicU64 = AtomicU64::new(1);

impl Bridge {
    /// A bridge for one MCP session (its omicos session id is `mcp-<pid>-<n>`).
    pub fn new(backend: Arc<dyn ToolBackend>, cfg: &ServeConfig) -> Result<Self, String> {
        let mode = PermissionMode::parse(&cfg.permission_mode)
            .map_err(|e| format!("config key `mcp.serve.permission_mode`: {e}"))?
            .or(PermissionMode::ReadOnly);
        Ok(Self {
            backend,
            mode,
            toolsets: cfg.toolsets.clone(),
            session_id: format!(
                "mcp-{}-{}",
                std::process::id(),
                SESSIONS.fetch_add(1, Ordering::Relaxed)
            ),
            calls: Arc::new(AtomicU64::new(0)),
            structured: Arc::default(),
            parked: Arc::default(),
        })
    }

    /// The permission mode of its calls.
    pub fn mode(&self) -> PermissionMode {
        self.mode
    }
}

/// A runner tool spec as an MCP tool (read tools are annotated read-only;
/// a tool with an output schema carries it as `outputSchema`).
pub fn mcp_tool(spec: &ToolSpec) -> Tool {
    let schema = match serde_json::from_str::<Value>(&spec.input_schema_json) {
        Ok(Value::Object(m)) => m,
        _ => json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    let read = spec.risk == Risk::Read as i32;
    let tool = Tool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(schema),
    )
    .with_annotations(ToolAnnotations::new().read_only(read).destructive(!read));
    match output_schema(spec) {
        Some(out) => tool.with_raw_output_schema(Arc::new(out)),
        None => tool,
    }
}

/// The output schema of `spec`, when it has one (an object schema, as MCP requires).
fn output_schema(spec: &ToolSpec) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_str::<Value>(&spec.output_schema_json) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// The structured content of a tool's result text: the JSON object it is,
/// or the `structured_content` an MCP tool's result carries inside it
/// (see [`crate::result`]).
pub fn structured_content(text: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(mut m)) => Some(match m.remove("structured_content") {
            Some(s) if m.contains_key("content") => s,
            Some(s) => {
                m.insert("structured_content".into(), s);
                Value::Object(m)
            }
            None => Value::Object(m),
        }),
        _ => None,
    }
}

/// The form that asks the user for an approval.
fn approval_form(req: &omicos_proto::ApprovalRequired) -> Result<ElicitRequestParams, ErrorData> {
    let schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "approve": {"type": "boolean", "title": "Run it", "description": "true runs this call once; false refuses it"}
        },
        "required": ["approve"]
    }))
    .map_err(|e| ErrorData::internal_error(format!("cannot build the approval form: {e}"), None))?;
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "omicos asks before running `{}` ({}): {}",
            req.tool_name, req.reason, req.summary
        ),
        requested_schema: schema,
    })
}

async fn ask(
    peer: &rmcp::Peer<RoleServer>,
    req: &omicos_proto::ApprovalRequired,
) -> Result<Decision, String> {
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        return Err(NO_ELICITATION_REFUSAL.into());
    }
    let params = approval_form(req).map_err(|e| e.message.to_string())?;
    let r = peer
        .create_elicitation_with_timeout(params, Some(ELICITATION_TIMEOUT))
        .await
        .map_err(|e| format!("refused: the approval request to the MCP client failed: {e}"))?;
    let approved = r.action == ElicitationAction::Accept
        && r.content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(Value::as_bool)
            == Some(true);
    Ok(if approved {
        Decision::AllowOnce
    } else {
        Decision::Deny
    })
}

impl Bridge {
    fn remember_structured(&self, specs: &[ToolSpec]) {
        let names = specs
            .iter()
            .filter(|s| output_schema(s).is_some())
            .map(|s| s.name.clone())
            .collect();
        *self.structured.lock().unwrap_or_else(|e| e.into_inner()) = Some(names);
    }

    /// Whether `tool` declares an output schema (listing the tools first
    /// if this session has not).
    async fn has_output_schema(&self, tool: &str) -> bool {
        let known = self
            .structured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.contains(tool));
        match known {
            Some(k) => k,
            None => match self.backend.list_tools(&self.toolsets, self.mode).await {
                Ok(specs) => {
                    self.remember_structured(&specs);
                    specs
                        .iter()
                        .any(|s| s.name == tool && output_schema(s).is_some())
                }
                Err(_) => false,
            },
        }
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("omicos", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "omicos's tools (kernel, notebooks, files, memory, web fetch, ...), each call run through omicos's governed pipeline (permission mode, hooks, approvals).",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let specs = self
            .backend
            .list_tools(&self.toolsets, self.mode)
            .await
            .map_err(|e| ErrorData::internal_error(e, None))?;
        self.remember_structured(&specs);
        Ok(ListToolsResult::with_all_items(
            specs.iter().map(mcp_tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request
            .arguments
            .clone()
            .map(|m| Value::Object(m).to_string())
            .unwrap_or_else(|| "{}".into());
        let mut call = match &request.request_state {
            // 2026-07-28: the client retries a parked call with its answer.
            Some(state) => self.resume(state, &request, &arguments).await?,
            None => self.start(&request, arguments.clone()),
        };
        let modern = context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let token = context.meta.get_progress_token();
        let mut refusal: Option<String> = None;
        loop {
            let msg = tokio::select! {
                m = call.events.recv() => m,
                // A client's notifications/cancelled cancels the call all the way down.
                _ = context.ct.cancelled(), if !call.cancel.is_cancelled() => {
                    call.cancel.cancel();
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            match msg.msg {
                Some(execute_server_message::Msg::Progress(p)) => {
                    if let Some(t) = &token {
                        let mut n = ProgressNotificationParam::new(t.clone(), p.current);
                        if p.total > 0.0 {
                            n = n.with_total(p.total);
                        }
                        if !p.message.is_empty() {
                            n = n.with_message(p.message.clone());
                        }
                        let _ = context.peer.notify_progress(n).await;
                    }
                }
                Some(execute_server_message::Msg::ApprovalRequired(req)) if modern => {
                    // A server may not send requests to a 2026-07-28 client:
                    // the form goes back as an input-required result, and the
                    // call waits here until the client retries with the answer.
                    if declares_form_elicitation(&context) {
                        let state = self.park(request.name.to_string(), arguments, call);
                        let mut inputs = InputRequests::new();
                        inputs.insert(
                            APPROVAL_INPUT.into(),
                            InputRequest::Elicitation(ElicitRequest::new(approval_form(&req)?)),
                        );
                        return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
                            Some(inputs),
                            Some(state),
                        )));
                    }
                    refusal = Some(NO_ELICITATION_REFUSAL.into());
                    call.decide(Decision::Deny).await;
                }
                Some(execute_server_message::Msg::ApprovalRequired(req)) => {
                    let decision = match ask(&context.peer, &req).await {
                        Ok(d) => d,
                        Err(msg) => {
                            refusal = Some(msg);
                            Decision::Deny
                        }
                    };
                    call.decide(decision).await;
                }
                _ => {}
            }
        }
        let result = call
            .run
            .await
            .map_err(|e| ErrorData::internal_error(format!("the call crashed: {e}"), None))?;
        let ok = result.status == ToolStatus::Done as i32;
        let text = match (ok, refusal) {
            (false, Some(r)) => r,
            _ => result.result,
        };
        let structured = if ok && self.has_output_schema(&request.name).await {
            structured_content(&text)
        } else {
            None
        };
        let content = vec![ContentBlock::text(text)];
        let mut result = if ok {
            CallToolResult::success(content)
        } else {
            CallToolResult::error(content)
        };
        result.structured_content = structured;
        Ok(CallToolResponse::Complete(result))
    }
}

/// The key of the approval form in an input-required result's `inputRequests`.
pub const APPROVAL_INPUT: &str = "approval";

/// How long a parked call waits for its client's retry before it is refused.
pub const PARKED_CALL_TIMEOUT: Duration = ELICITATION_TIMEOUT;

/// One call running through the backend: its events, where its approval
/// decisions go, its result, and its cancellation.
struct Running {
    call_id: String,
    events: mpsc::Receiver<ExecuteServerMessage>,
    approvals: mpsc::Sender<ExecuteApproval>,
    run: tokio::task::JoinHandle<ToolResult>,
    cancel: CancellationToken,
}

impl Running {
    async fn decide(&self, decision: Decision) {
        let _ = self
            .approvals
            .send(ExecuteApproval {
                call_id: self.call_id.clone(),
                decision: decision as i32,
                rule: String::new(),
            })
            .await;
    }
}

/// A call waiting for the client's answer to an input-required result,
/// found again by its `requestState` (a random handle: the state stays here).
struct Parked {
    tool: String,
    arguments: String,
    call: Running,
}

/// The parked calls of an endpoint, shared by its sessions (a 2026-07-28
/// client's retry may arrive on any of them).
type ParkedCalls = Arc<std::sync::Mutex<HashMap<String, Parked>>>;

impl Bridge {
    /// Shares `parked` with the other sessions of the same endpoint.
    fn with_parked_calls(mut self, parked: ParkedCalls) -> Self {
        self.parked = parked;
        self
    }

    fn start(&self, request: &CallToolRequestParams, arguments: String) -> Running {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let call_id = format!("{}-call-{n}", self.session_id);
        let start = ExecuteStart {
            call_id: call_id.clone(),
            tool_name: request.name.to_string(),
            arguments,
            session_id: self.session_id.clone(),
            agent_id: "mcp-client".into(),
            permission_mode: self.mode as i32,
            toolsets: self.toolsets.clone(),
            execution_context_id: "root".into(),
            ..Default::default()
        };
        let (ev_tx, events) = mpsc::channel(256);
        let (approvals, ap_rx) = mpsc::channel(4);
        // Not the request's token: a parked call outlives its first request.
        let cancel = CancellationToken::new();
        let backend = self.backend.clone();
        let c = cancel.clone();
        let run = tokio::spawn(async move { backend.execute(start, ev_tx, ap_rx, c).await });
        Running {
            call_id,
            events,
            approvals,
            run,
            cancel,
        }
    }

    /// Parks `call` until its client retries; unanswered, it is cancelled
    /// after [`PARKED_CALL_TIMEOUT`]. Returns its `requestState`.
    fn park(&self, tool: String, arguments: String, call: Running) -> String {
        let state = uuid::Uuid::new_v4().simple().to_string();
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                state.clone(),
                Parked {
                    tool,
                    arguments,
                    call,
                },
            );
        let parked = Arc::downgrade(&self.parked);
        let key = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PARKED_CALL_TIMEOUT).await;
            let left = parked
                .upgrade()
                .and_then(|p| p.lock().unwrap_or_else(|e| e.into_inner()).remove(&key));
            if let Some(p) = left {
                p.call.cancel.cancel();
            }
        });
        state
    }

    /// The parked call a retry names, given the client's answer.
    async fn resume(
        &self,
        state: &str,
        request: &CallToolRequestParams,
        arguments: &str,
    ) -> Result<Running, ErrorData> {
        let parked = {
            let mut map = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(state) {
                Some(p) if p.tool == request.name && p.arguments == arguments => map.remove(state),
                Some(_) => {
                    return Err(ErrorData::invalid_params(
                        "requestState belongs to another call (a different tool or arguments)",
                        None,
                    ));
                }
                None => None,
            }
        };
        let Some(parked) = parked else {
            return Err(ErrorData::invalid_params(
                "unknown or expired requestState: call the tool again",
                None,
            ));
        };
        let answer = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get(APPROVAL_INPUT));
        let approved = answer.and_then(|a| a.get("action")).and_then(Value::as_str)
            == Some("accept")
            && answer
                .and_then(|a| a.get("content"))
                .and_then(|c| c.get("approve"))
                .and_then(Value::as_bool)
                == Some(true);
        parked
            .call
            .decide(if approved {
                Decision::AllowOnce
            } else {
                Decision::Deny
            })
            .await;
        Ok(parked.call)
    }
}

/// Whether a 2026-07-28 request's client capabilities (in its `_meta`)
/// declare form elicitation.
fn declares_form_elicitation(context: &RequestContext<RoleServer>) -> bool {
    context
        .meta
        .client_capabilities()
        .and_then(|c| c.elicitation)
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

/// Serves `backend` over stdin/stdout until the client closes it.
pub async fn serve_stdio(backend: Arc<dyn ToolBackend>, cfg: &ServeConfig) -> Result<(), String> {
    use rmcp::ServiceExt;
    let bridge = Bridge::new(backend, cfg)?;
    let running = bridge
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP stdio session failed to start: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP stdio session ended abnormally: {e}"))?;
    Ok(())
}

/// The streamable-HTTP endpoint as an axum router (`/mcp`), one MCP session per client.
pub fn http_router(
    backend: Arc<dyn ToolBackend>,
    cfg: &ServeConfig,
    stop: CancellationToken,
) -> Result<axum::Router, String> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    Bridge::new(backend.clone(), cfg)?;
    let cfg2 = cfg.clone();
    let parked = ParkedCalls::default();
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop;
    if !cfg.allowed_hosts.is_empty() {
        config.allowed_hosts = cfg.allowed_hosts.clone();
    }
    let service = StreamableHttpService::new(
        move || {
            Bridge::new(backend.clone(), &cfg2)
                .map(|b| b.with_parked_calls(parked.clone()))
                .map_err(std::io::Error::other)
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Ok(axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::map_response(delete_answers_no_content)))
}

/// rmcp answers a session DELETE with 202 Accepted; the spec's clients (the
/// Python SDK 2.x among them) take only 200 or 204 as "session closed".
async fn delete_answers_no_content(
    method: http::Method,
    mut response: axum::response::Response,
) -> axum::response::Response {
    if method == http::Method::DELETE && response.status() == http::StatusCode::ACCEPTED {
        *response.status_mut() = http::StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

/// Serves the streamable-HTTP endpoint on `listener` until `stop`.
pub async fn serve_http(
    backend: Arc<dyn ToolBackend>,
    cfg: &ServeConfig,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) -> Result<(), String> {
    let router = http_router(backend, cfg, stop.clone())?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| format!("MCP HTTP endpoint failed: {e}"))
}

/// A ToolRunner reached over gRPC as the backend: the same Execute stream
/// the orchestrator uses (for `omicos mcp serve` next to a running stack).
pub struct RunnerBackend {
    client: omicos_proto::tool_runner_client::ToolRunnerClient<omicos_auth::AuthedChannel>,
}

impl RunnerBackend {
    /// A lazily connected client of the runner at `url` (`http://host:port`).
    pub fn new(url: &str) -> Result<Self, String> {
        Self::with_secret(url, "")
    }

    /// A client whose calls carry the deployment's service secret as an
    /// operator tool (the runner takes Execute only from the parts of the
    /// system); empty: none.
    pub fn with_secret(url: &str, secret: &str) -> Result<Self, String> {
        let creds = omicos_auth::Credentials::service(secret, omicos_auth::ServiceRole::Operator)
            .map_err(|e| format!("the service secret: {e}"))?;
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("bad runner URL `{url}`: {e}"))?
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            client: omicos_proto::tool_runner_client::ToolRunnerClient::new(creds.channel(channel))
                .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES),
        })
    }
}

#[async_trait]
impl ToolBackend for RunnerBackend {
    async fn list_tools(
        &self,
        toolsets: &[String],
        mode: PermissionMode,
    ) -> Result<Vec<ToolSpec>, String> {
        let r = self
            .client
            .clone()
            .list_tools(omicos_proto::ListToolsRequest {
                toolsets: toolsets.to_vec(),
                permission_mode: mode as i32,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("the tool-runner did not list its tools: {}", e.message()))?;
        Ok(r.into_inner().tools)
    }

    async fn execute(
        &self,
        start: ExecuteStart,
        events: mpsc::Sender<ExecuteServerMessage>,
        mut approvals: mpsc::Receiver<ExecuteApproval>,
        cancel: CancellationToken,
    ) -> ToolResult {
        use omicos_proto::{ExecuteClientMessage, execute_client_message};
        let call_id = start.call_id.clone();
        let failed = |msg: String| ToolResult {
            call_id: call_id.clone(),
            status: ToolStatus::Error as i32,
            result: msg,
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel::<ExecuteClientMessage>(8);
        let _ = tx
            .send(ExecuteClientMessage {
                msg: Some(execute_client_message::Msg::Start(start)),
            })
            .await;
        let mut inbound = match self
            .client
            .clone()
            .execute(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) => return failed(format!("the tool-runner refused the call: {}", e.message())),
        };
        loop {
            tokio::select! {
                m = inbound.message() => match m {
                    Ok(Some(ExecuteServerMessage { msg: Some(execute_server_message::Msg::Result(r)) })) => return r,
                    Ok(Some(other)) => { let _ = events.send(other).await; }
                    Ok(None) => return failed("the tool-runner closed the call without a result".into()),
                    Err(e) => return failed(format!("the tool-runner failed the call: {}", e.message())),
                },
                Some(a) = approvals.recv() => {
                    let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Approval(a)) }).await;
                }
                _ = cancel.cancelled() => {
                    let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Cancel(Default::default())) }).await;
                    return failed("cancelled".into());
                }
            }
        }
    }
}
