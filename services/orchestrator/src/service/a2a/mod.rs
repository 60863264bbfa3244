//! omicos as an A2A agent (issue 41), on the orchestrator's one port:
//!
//! - `GET /.well-known/agent-card.json`: the Agent Card ([`card`]);
//! - `POST /a2a`: the JSON-RPC binding. A2A 1.0's methods (`SendMessage`,
//!   `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask`,
//!   `ListTasks`) are answered in 1.0's ProtoJSON, and 0.3's
//!   (`message/send`, `message/stream`, `tasks/get`, `tasks/cancel`,
//!   `tasks/resubscribe`) in 0.3's shapes ([`task::Dialect`]);
//! - `lf.a2a.v1.A2AService`: the gRPC binding ([`grpc`]), next to Orchestrator.
//!
//! A task is one turn, its id `<session>:<turn>`; a context is one session.
//! Both bindings take the gRPC API's credentials (the same [`Gate`]), and a
//! context or task of another owner answers as one that does not exist
//! ([`super::guard::own`]): A2A reaches no session the gRPC API would not.
//! Turns start through [`OrchestratorService::start_turn`], as Chat's and
//! StartTurn's do, so limits, hooks and approvals apply unchanged. What a
//! method does is written once, in [`A2a`]; the bindings only read their
//! requests and write the [`TaskView`]s it returns.

pub mod card;
pub mod grpc;
pub mod task;

use super::OrchestratorService;
use super::chat::Started;
use crate::error::{ErrorKind, OrchestratorError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use omicos_auth::{Admitted, Gate, Principal};
use omicos_proto::{ChatEvent, ChatRequest};
use prost::Message as _;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use task::{Dialect, TaskState, TaskView};
use tokio::sync::broadcast::error::RecvError;

/// Where the Agent Card is served (A2A's well-known URI).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The JSON-RPC endpoint.
pub const RPC_PATH: &str = "/a2a";

/// `ListTasks`' page size when the request names none, and the largest (A2A 1.0's).
const LIST_PAGE_DEFAULT: usize = 50;
const LIST_PAGE_MAX: usize = 100;

/// How long `CancelTask` waits for the turn to end before it answers with
/// the task as it is (a turn ends at its next await point; a tool call is
/// interrupted first).
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// How an A2A route is guarded.
#[derive(Clone, Copy, Debug)]
pub enum RouteAccess {
    /// A credential (the gRPC API's), then ownership of every context and task named.
    Authenticated,
    /// Open to anyone; why that is safe.
    Open(&'static str),
}

/// Every A2A route with how it is guarded; [`router`] is built from this
/// table, so a route cannot exist without an entry.
pub const ROUTES: &[(&str, RouteAccess)] = &[
    (
        CARD_PATH,
        RouteAccess::Open(
            "A2A clients read the card before they hold a credential (it says which one to get); \
             it names the deployment's unlocked agents and the auth schemes, no session or workspace data",
        ),
    ),
    (RPC_PATH, RouteAccess::Authenticated),
];

/// JSON-RPC 2.0 and A2A error codes.
mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const PUSH_NOT_SUPPORTED: i64 = -32003;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
    pub const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
}

/// An A2A error: a JSON-RPC error as the JSON-RPC binding answers it, and
/// mapped to a gRPC status by [`grpc::status`]. `kind` keeps an omicos
/// error's kind (a busy session, a store down) for the gRPC code.
#[derive(Debug)]
pub struct RpcError {
    code: i64,
    message: String,
    kind: Option<ErrorKind>,
}

impl RpcError {
    /// The one place an A2A error's message is made: bounded
    /// ([`crate::bound::error_message`]), since it often quotes what the
    /// caller sent (a task id, a role, a method name) and both bindings
    /// send it back (the JSON-RPC body; gRPC's message and its details).
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: crate::bound::error_message(&message.into()),
            kind: None,
        }
    }

    fn task_not_found(id: &str) -> Self {
        Self::new(code::TASK_NOT_FOUND, format!("task {id} not found"))
    }
}

/// The one place an omicos error becomes a JSON-RPC error.
impl From<OrchestratorError> for RpcError {
    fn from(e: OrchestratorError) -> Self {
        let code = match e.kind() {
            ErrorKind::SessionNotFound => code::TASK_NOT_FOUND,
            ErrorKind::InvalidArgument => code::INVALID_PARAMS,
            _ => code::INTERNAL,
        };
        Self {
            kind: Some(e.kind()),
            ..Self::new(code, e.to_string())
        }
    }
}

/// What every A2A method does, whichever binding asked: each returns
/// [`TaskView`]s (or a stream of [`Update`]s) that the binding writes.
#[derive(Clone)]
pub struct A2a {
    svc: Arc<OrchestratorService>,
}

impl A2a {
    /// The methods over `svc`.
    pub fn new(svc: Arc<OrchestratorService>) -> Self {
        Self { svc }
    }
}

/// What the HTTP routes share.
#[derive(Clone)]
struct Http {
    a2a: A2a,
    gate: Arc<dyn Gate>,
    /// The port serves TLS: the card's URLs are `https://`.
    tls: bool,
}

/// The A2A routes of [`ROUTES`], over `svc`, behind `gate`.
pub fn router(svc: Arc<OrchestratorService>, gate: Arc<dyn Gate>, tls: bool) -> axum::Router {
    let mut r = axum::Router::new();
    for (path, _) in ROUTES {
        r = match *path {
            CARD_PATH => r.route(path, axum::routing::get(agent_card)),
            RPC_PATH => r.route(path, axum::routing::post(rpc)),
            other => unreachable!("{other} is in ROUTES without a handler"),
        };
    }
    r.with_state(Http {
        a2a: A2a::new(svc),
        gate,
        tls,
    })
}

async fn agent_card(State(h): State<Http>, headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    let base = format!("{}://{host}", if h.tls { "https" } else { "http" });
    let e = &h.a2a.svc.engine;
    axum::Json(card::card(&base, host, e.agents.as_ref(), &e.config.auth)).into_response()
}

/// The caller, or the HTTP answer that refuses it (401 without a valid
/// credential, as every other route of the port answers).
async fn caller(h: &Http, headers: &HeaderMap) -> Result<Principal, Response> {
    match h.gate.admit(RPC_PATH, headers).await {
        Ok(Admitted::Principal(p)) => Ok(p),
        Ok(_) => Ok(Principal::anonymous()),
        Err(e) if e.status().code() == tonic::Code::Unauthenticated => Err((
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            e.status().message().to_owned(),
        )
            .into_response()),
        Err(e) => Err((StatusCode::FORBIDDEN, e.status().message().to_owned()).into_response()),
    }
}

fn answer(id: &Value, result: Result<Value, RpcError>) -> Response {
    axum::Json(envelope(id, result)).into_response()
}

fn envelope(id: &Value, result: Result<Value, RpcError>) -> Value {
    match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})
        }
    }
}

async fn rpc(State(h): State<Http>, headers: HeaderMap, body: Bytes) -> Response {
    let who = match caller(&h, &headers).await {
        Ok(p) => p,
        Err(res) => return res,
    };
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return answer(
                &Value::Null,
                Err(RpcError::new(
                    code::PARSE_ERROR,
                    format!("the body is not JSON: {e}"),
                )),
            );
        }
    };
    let Some(obj) = req.as_object() else {
        return answer(
            &Value::Null,
            Err(RpcError::new(
                code::INVALID_REQUEST,
                "a request is one JSON-RPC 2.0 object (batches are not supported)",
            )),
        );
    };
    let id = obj.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return answer(
            &Value::Null,
            Err(RpcError::new(
                code::INVALID_REQUEST,
                "`id` must be a string, a number or null",
            )),
        );
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return answer(
            &id,
            Err(RpcError::new(
                code::INVALID_REQUEST,
                "`jsonrpc` must be \"2.0\"",
            )),
        );
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return answer(
            &id,
            Err(RpcError::new(
                code::INVALID_REQUEST,
                "`method` must be a string",
            )),
        );
    };
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    if !matches!(params, Value::Object(_) | Value::Null) {
        return answer(
            &id,
            Err(RpcError::new(
                code::INVALID_PARAMS,
                "`params` must be an object",
            )),
        );
    }
    let (v1, v03) = (Dialect::V1, Dialect::V03);
    let a = &h.a2a;
    match method {
        "SendMessage" => answer(&id, a.send_json(&who, v1, &params).await),
        "message/send" => answer(&id, a.send_json(&who, v03, &params).await),
        "SendStreamingMessage" => a.stream_sse(who, v1, id, params).await,
        "message/stream" => a.stream_sse(who, v03, id, params).await,
        "GetTask" => answer(&id, a.get_json(&who, v1, &params).await),
        "tasks/get" => answer(&id, a.get_json(&who, v03, &params).await),
        "CancelTask" => answer(&id, a.cancel_json(&who, v1, &params).await),
        "tasks/cancel" => answer(&id, a.cancel_json(&who, v03, &params).await),
        "SubscribeToTask" => a.subscribe_sse(who, v1, id, params).await,
        "tasks/resubscribe" => a.subscribe_sse(who, v03, id, params).await,
        "ListTasks" => answer(&id, a.list_json(&who, &params).await),
        m if m.contains("ushNotification") => answer(&id, Err(push_not_supported())),
        "GetExtendedAgentCard" | "agent/getAuthenticatedExtendedCard" => {
            answer(&id, Err(extended_card_not_configured()))
        }
        other => answer(
            &id,
            Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("no method `{other}`"),
            )),
        ),
    }
}

/// The extended card: there is none (the public card is the whole card).
fn extended_card_not_configured() -> RpcError {
    RpcError::new(
        code::EXTENDED_CARD_NOT_CONFIGURED,
        "omicos has no extended agent card: the public card at /.well-known/agent-card.json \
         is the whole card (capabilities.extendedAgentCard is false)",
    )
}

/// Push notifications: not served by either binding.
fn push_not_supported() -> RpcError {
    RpcError::new(
        code::PUSH_NOT_SUPPORTED,
        "push notifications are not supported: follow a task with SendStreamingMessage or \
         SubscribeToTask, or poll GetTask",
    )
}

/// What a SendMessage asks for.
pub struct Send {
    request: ChatRequest,
    /// Wait for the turn to end (or to need input) before answering.
    blocking: bool,
}

fn str_at<'a>(v: &'a Value, key: &str) -> Result<Option<&'a str>, RpcError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("`{key}` must be a string"),
        )),
    }
}

/// A SendMessage as either binding reads it, before [`SendParts::check`].
pub struct SendParts {
    /// The message's role is the user's.
    pub from_user: bool,
    /// The role as sent, for the error.
    pub role: String,
    /// The text of each part; None when a part is not text.
    pub texts: Option<Vec<String>>,
    /// `contextId`, if given.
    pub context: Option<String>,
    /// `taskId`, if given.
    pub task: Option<String>,
    /// The agent (metadata `agent`).
    pub agent: Option<String>,
    /// The permission mode (metadata `permissionMode`).
    pub mode: Option<String>,
    /// Wait for the turn to end.
    pub blocking: bool,
}

impl SendParts {
    /// The checks both bindings make, and the turn they ask for.
    pub fn check(self) -> Result<Send, RpcError> {
        if !self.from_user {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("`message.role` must be the user's, not {:?}", self.role),
            ));
        }
        let texts = self.texts.ok_or_else(|| {
            RpcError::new(
                code::CONTENT_TYPE_NOT_SUPPORTED,
                "only text parts are accepted (text/plain)",
            )
        })?;
        let text = texts.join("\n");
        if text.trim().is_empty() {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "the message has no text",
            ));
        }
        let mut session = self.context.filter(|c| !c.is_empty());
        if let Some(task) = self.task.as_deref().filter(|t| !t.is_empty()) {
            let (s, _) = task::parse_task_id(task).ok_or_else(|| RpcError::task_not_found(task))?;
            if session.as_deref().is_some_and(|c| c != s) {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "`taskId` belongs to another context than `contextId`",
                ));
            }
            session = Some(s.to_owned());
        }
        Ok(Send {
            request: ChatRequest {
                session_id: session.unwrap_or_default(),
                message: text,
                agent: self.agent.unwrap_or_default(),
                permission_mode: self.mode.unwrap_or_default(),
                ..Default::default()
            },
            blocking: self.blocking,
        })
    }
}

/// Reads SendMessage's params (either dialect's: the fields that matter
/// have the same names in both).
fn parse_send(d: Dialect, params: &Value) -> Result<Send, RpcError> {
    let msg = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "`message` (an object) is missing"))?;
    let role = msg.get("role").and_then(Value::as_str).unwrap_or_default();
    let from_user = match d {
        Dialect::V1 => role == "ROLE_USER",
        Dialect::V03 => role == "user",
    };
    let parts = msg.get("parts").and_then(Value::as_array).ok_or_else(|| {
        RpcError::new(code::INVALID_PARAMS, "`message.parts` (a list) is missing")
    })?;
    let texts = parts
        .iter()
        .map(|p| p.get("text").and_then(Value::as_str).map(str::to_owned))
        .collect();
    // The agent and the mode ride in metadata (the request's or the message's).
    let meta = |k: &str| -> Result<Option<String>, RpcError> {
        for m in [params.get("metadata"), msg.get("metadata")]
            .into_iter()
            .flatten()
        {
            if let Some(v) = str_at(m, k)? {
                return Ok(Some(v.to_owned()));
            }
        }
        Ok(None)
    };
    let config = params.get("configuration");
    let blocking = match d {
        Dialect::V1 => !config
            .and_then(|c| c.get("returnImmediately"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        Dialect::V03 => config
            .and_then(|c| c.get("blocking"))
            .and_then(Value::as_bool)
            .unwrap_or(true),
    };
    SendParts {
        from_user,
        role: role.to_owned(),
        texts,
        context: str_at(msg, "contextId")?.map(str::to_owned),
        task: str_at(msg, "taskId")?.map(str::to_owned),
        agent: meta("agent")?,
        mode: meta("permissionMode")?,
        blocking,
    }
    .check()
}

/// What ListTasks asks for (either binding's request, read).
#[derive(Debug, Default)]
pub struct ListQuery {
    /// Only this context's tasks.
    pub context: Option<String>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks whose status changed after this (ms since the epoch).
    pub after_ms: Option<i64>,
    /// The page size asked for (None: the default).
    pub page_size: Option<i64>,
    /// Where the page starts (the previous page's `next_page_token`).
    pub page_token: String,
}

/// One page of the caller's tasks.
pub struct ListPage {
    /// The tasks, most recently updated first.
    pub tasks: Vec<TaskView>,
    /// The next page's token; empty on the last page.
    pub next_page_token: String,
    /// The page size used.
    pub page_size: usize,
    /// How many tasks match, over all pages.
    pub total_size: usize,
}

/// ListTasks' params (1.0 ProtoJSON names).
fn parse_list(params: &Value) -> Result<ListQuery, RpcError> {
    let state = match str_at(params, "status")? {
        None => None,
        Some(s) => {
            let p = omicos_proto::a2a::TaskState::from_str_name(s).ok_or_else(|| {
                RpcError::new(
                    code::INVALID_PARAMS,
                    format!("`status` {s:?} is not a task state"),
                )
            })?;
            if p == omicos_proto::a2a::TaskState::Unspecified {
                None
            } else {
                // A state omicos never reaches matches no task.
                Some(TaskState::from_proto(p).ok_or_else(|| {
                    RpcError::new(code::INVALID_PARAMS, format!("omicos tasks are never {s}"))
                })?)
            }
        }
    };
    let after_ms = match str_at(params, "statusTimestampAfter")? {
        None => None,
        Some(t) => Some(
            humantime::parse_rfc3339_weak(t)
                .map_err(|e| {
                    RpcError::new(
                        code::INVALID_PARAMS,
                        format!("`statusTimestampAfter` is not an RFC 3339 time: {e}"),
                    )
                })?
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        ),
    };
    let page_size =
        match params.get("pageSize") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| {
                RpcError::new(code::INVALID_PARAMS, "`pageSize` must be an integer")
            })?),
        };
    Ok(ListQuery {
        context: str_at(params, "contextId")?.map(str::to_owned),
        state,
        after_ms,
        page_size,
        page_token: str_at(params, "pageToken")?.unwrap_or_default().to_owned(),
    })
}

/// The task id a GetTask, CancelTask or SubscribeToTask names.
fn task_param(params: &Value) -> Result<&str, RpcError> {
    str_at(params, "id")?.ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "`id` is missing"))
}

/// A turn being followed: its view, the last event applied, and the
/// session's live events.
pub struct Follow {
    view: TaskView,
    last_seq: u64,
    rx: tokio::sync::broadcast::Receiver<ChatEvent>,
}

/// One item of a followed task's stream, whichever binding writes it.
pub enum Update {
    /// The whole task: the stream's first item.
    Task(TaskView),
    /// The task's status changed; `last`: the stream ends after it.
    Status(TaskView, bool),
    /// The answer, whole (before the last status of a completed task).
    Artifact(TaskView),
    /// Following failed; the stream ends.
    Failed(RpcError),
}

impl A2a {
    /// The stored events of `session` since `since`, decoded.
    async fn stored(&self, session: &str, since: u64) -> Result<Vec<ChatEvent>, RpcError> {
        let rows = self
            .svc
            .hub
            .store()
            .events_since(session, since)
            .await
            .map_err(|e| RpcError::from(OrchestratorError::from(e)))?;
        Ok(rows
            .into_iter()
            .filter_map(|(_, bytes)| ChatEvent::decode(bytes.as_slice()).ok())
            .collect())
    }

    /// Catches `f` up with the store (after a lag, or before following).
    async fn catch_up(&self, f: &mut Follow) -> Result<(), RpcError> {
        for ev in self.stored(&f.view.session, f.last_seq).await? {
            if ev.event_seq > f.last_seq {
                f.last_seq = ev.event_seq;
                f.view.apply(&ev);
            }
        }
        Ok(())
    }

    /// The next state change of the followed turn; None once the session's
    /// live events end (read the rest from the store).
    async fn next_change(&self, f: &mut Follow) -> Result<Option<TaskState>, RpcError> {
        let before = (f.view.state, f.view.note.clone());
        loop {
            match f.rx.recv().await {
                Ok(ev) => {
                    if ev.event_seq <= f.last_seq {
                        continue;
                    }
                    f.last_seq = ev.event_seq;
                    f.view.apply(&ev);
                }
                Err(RecvError::Lagged(_)) => self.catch_up(f).await?,
                Err(RecvError::Closed) => {
                    self.catch_up(f).await?;
                    return Ok(None);
                }
            }
            if (f.view.state, &f.view.note) != (before.0, &before.1) {
                return Ok(Some(f.view.state));
            }
        }
    }

    /// Starts the turn a SendMessage asks for, after the ownership check of
    /// the context it names.
    pub async fn start(&self, who: &Principal, send: Send) -> Result<Follow, RpcError> {
        let owned = if send.request.session_id.is_empty() {
            None
        } else {
            Some(
                super::guard::own(
                    self.svc.hub.store().as_ref(),
                    who,
                    &send.request.session_id,
                    RPC_PATH,
                )
                .await?,
            )
        };
        let prompt = send.request.message.clone();
        let Started {
            state,
            turn_id,
            start_seq,
            events,
            steered,
        } = self.svc.start_turn(who, owned, send.request, None).await?;
        let mut f = Follow {
            view: TaskView::submitted(&state.id, &turn_id, &prompt),
            last_seq: 0,
            rx: events,
        };
        if steered {
            // The message joined a running turn: that turn is the task, from its start.
            self.catch_up(&mut f).await?;
        } else {
            f.last_seq = start_seq;
        }
        Ok(f)
    }

    /// SendMessage: the task once the turn ended or needs an approval
    /// (blocking), or once it started.
    pub async fn send(&self, who: &Principal, send: Send) -> Result<TaskView, RpcError> {
        let blocking = send.blocking;
        let mut f = self.start(who, send).await?;
        // Blocking: until the turn ends or needs an approval (an interrupted
        // state: the caller decides). Else until it started (its TurnStarted
        // is in the log, as StartTurn answers), so the task reads as working.
        let done = |s: TaskState| {
            if blocking {
                s.is_terminal() || s == TaskState::InputRequired
            } else {
                s != TaskState::Submitted
            }
        };
        while !done(f.view.state) {
            if self.next_change(&mut f).await?.is_none() {
                break;
            }
        }
        Ok(f.view)
    }

    /// Follows `f` to its end: the task, each change, the answer once
    /// completed, the last status. The turn goes on when the receiver is
    /// dropped (as after a Chat client leaves).
    pub fn follow(&self, mut f: Follow) -> tokio::sync::mpsc::Receiver<Update> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            if tx.send(Update::Task(f.view.clone())).await.is_err() {
                return;
            }
            if f.view.state != TaskState::Submitted && !f.view.state.is_terminal() {
                let _ = tx.send(Update::Status(f.view.clone(), false)).await;
            }
            loop {
                if f.view.state.is_terminal() {
                    break;
                }
                match this.next_change(&mut f).await {
                    Ok(Some(state)) if state.is_terminal() => break,
                    Ok(Some(_)) => {
                        if tx
                            .send(Update::Status(f.view.clone(), false))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Update::Failed(e)).await;
                        return;
                    }
                }
            }
            if f.view.state == TaskState::Completed {
                let _ = tx.send(Update::Artifact(f.view.clone())).await;
            }
            let _ = tx.send(Update::Status(f.view, true)).await;
        });
        rx
    }

    /// The task `id` names, when the caller owns its context.
    pub async fn find(&self, who: &Principal, id: &str) -> Result<TaskView, RpcError> {
        let (session, turn) =
            task::parse_task_id(id).ok_or_else(|| RpcError::task_not_found(id))?;
        self.own(who, session, id).await?;
        let mut view = TaskView::submitted(session, turn, "");
        let mut seen = false;
        for ev in self.stored(session, 0).await? {
            seen |= ev.turn_id == turn;
            view.apply(&ev);
        }
        if !seen {
            return Err(RpcError::task_not_found(id));
        }
        Ok(view)
    }

    /// The ownership check of `session`, whose task `id` was asked for.
    async fn own(&self, who: &Principal, session: &str, id: &str) -> Result<(), RpcError> {
        super::guard::own(self.svc.hub.store().as_ref(), who, session, RPC_PATH)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                OrchestratorError::SessionNotFound(_) => RpcError::task_not_found(id),
                e => e.into(),
            })
    }

    /// The live events of the task's session, caught up with the store.
    async fn follow_existing(&self, view: &TaskView) -> Result<Follow, RpcError> {
        let state = self.svc.hub.state(&view.session).await?;
        let mut f = Follow {
            rx: state.subscribe(),
            last_seq: 0,
            view: TaskView::submitted(&view.session, &view.turn, ""),
        };
        // Subscribed first, then read: nothing committed in between is missed.
        self.catch_up(&mut f).await?;
        Ok(f)
    }

    /// CancelTask: the task once its turn ended (or after [`CANCEL_WAIT`]).
    pub async fn cancel(&self, who: &Principal, id: &str) -> Result<TaskView, RpcError> {
        let view = self.find(who, id).await?;
        if view.state.is_terminal() {
            return Err(RpcError::new(
                code::TASK_NOT_CANCELABLE,
                format!("task {id} is already {:?}", view.state),
            ));
        }
        let state = self.svc.hub.state(&view.session).await?;
        let mut f = self.follow_existing(&view).await?;
        match state.running() {
            Some(t) if t.turn_id == view.turn => t.cancel.cancel(),
            // Running on another replica: the store's notice reaches it.
            _ => {
                self.svc
                    .hub
                    .store()
                    .request_cancel(&view.session)
                    .await
                    .map_err(|e| RpcError::from(OrchestratorError::from(e)))?;
            }
        }
        let _ = tokio::time::timeout(CANCEL_WAIT, async {
            while !f.view.state.is_terminal() {
                if !matches!(self.next_change(&mut f).await, Ok(Some(_))) {
                    break;
                }
            }
        })
        .await;
        Ok(f.view)
    }

    /// SubscribeToTask: the task's stream from now to its end. A task that
    /// already ended has nothing to follow (A2A: UnsupportedOperationError).
    pub async fn subscribe(
        &self,
        who: &Principal,
        id: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<Update>, RpcError> {
        let view = self.find(who, id).await?;
        if view.state.is_terminal() {
            return Err(RpcError::new(
                code::UNSUPPORTED_OPERATION,
                format!(
                    "task {id} is already {:?}: nothing to subscribe to (read it with GetTask)",
                    view.state
                ),
            ));
        }
        let f = self.follow_existing(&view).await?;
        Ok(self.follow(f))
    }

    /// ListTasks: the caller's tasks (turns of the sessions they own), most
    /// recently updated first, one page.
    pub async fn list(&self, who: &Principal, q: ListQuery) -> Result<ListPage, RpcError> {
        let page_size = match q.page_size {
            None | Some(0) => LIST_PAGE_DEFAULT,
            Some(n) if n < 0 => {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "`pageSize` must be positive",
                ));
            }
            Some(n) => (n as usize).min(LIST_PAGE_MAX),
        };
        let offset: usize = if q.page_token.is_empty() {
            0
        } else {
            q.page_token.parse().map_err(|_| {
                RpcError::new(
                    code::INVALID_PARAMS,
                    "`pageToken` is not one this server gave",
                )
            })?
        };
        let store = self.svc.hub.store();
        let sessions = store
            .list_sessions_of(&who.tenant, &who.subject, usize::MAX)
            .await
            .map_err(|e| RpcError::from(OrchestratorError::from(e)))?;
        let mut tasks = vec![];
        for s in sessions {
            if q.context.as_deref().is_some_and(|c| c != s.id) {
                continue;
            }
            let events = self.stored(&s.id, 0).await?;
            tasks.extend(task::tasks_of(&s.id, &events).into_iter().filter(|t| {
                q.state.is_none_or(|st| t.state == st)
                    && q.after_ms.is_none_or(|after| t.timestamp_ms > after)
            }));
        }
        tasks.sort_by(|a, b| {
            b.timestamp_ms
                .cmp(&a.timestamp_ms)
                .then_with(|| a.session.cmp(&b.session))
                .then_with(|| a.turn.cmp(&b.turn))
        });
        let total_size = tasks.len();
        let tasks: Vec<TaskView> = tasks.into_iter().skip(offset).take(page_size).collect();
        let end = offset + tasks.len();
        Ok(ListPage {
            tasks,
            next_page_token: if end < total_size {
                end.to_string()
            } else {
                String::new()
            },
            page_size,
            total_size,
        })
    }

    // The JSON-RPC binding's reading and writing.

    async fn send_json(
        &self,
        who: &Principal,
        d: Dialect,
        params: &Value,
    ) -> Result<Value, RpcError> {
        let view = self.send(who, parse_send(d, params)?).await?;
        Ok(d.send_result(&view))
    }

    async fn get_json(
        &self,
        who: &Principal,
        d: Dialect,
        params: &Value,
    ) -> Result<Value, RpcError> {
        let view = self.find(who, task_param(params)?).await?;
        Ok(d.task(&view))
    }

    async fn cancel_json(
        &self,
        who: &Principal,
        d: Dialect,
        params: &Value,
    ) -> Result<Value, RpcError> {
        let view = self.cancel(who, task_param(params)?).await?;
        Ok(d.task(&view))
    }

    async fn list_json(&self, who: &Principal, params: &Value) -> Result<Value, RpcError> {
        let page = self.list(who, parse_list(params)?).await?;
        let d = Dialect::V1;
        Ok(json!({
            "tasks": page.tasks.iter().map(|t| d.task(t)).collect::<Vec<_>>(),
            "nextPageToken": page.next_page_token,
            "pageSize": page.page_size,
            "totalSize": page.total_size,
        }))
    }

    async fn stream_sse(&self, who: Principal, d: Dialect, id: Value, params: Value) -> Response {
        let send = match parse_send(d, &params) {
            Ok(s) => s,
            Err(e) => return answer(&id, Err(e)),
        };
        match self.start(&who, send).await {
            Ok(f) => sse(d, id, self.follow(f)),
            Err(e) => answer(&id, Err(e)),
        }
    }

    async fn subscribe_sse(
        &self,
        who: Principal,
        d: Dialect,
        id: Value,
        params: Value,
    ) -> Response {
        let task = match task_param(&params) {
            Ok(t) => t,
            Err(e) => return answer(&id, Err(e)),
        };
        match self.subscribe(&who, task).await {
            Ok(rx) => sse(d, id, rx),
            Err(e) => answer(&id, Err(e)),
        }
    }
}

/// A followed task as Server-Sent Events, each one JSON-RPC response.
fn sse(d: Dialect, id: Value, rx: tokio::sync::mpsc::Receiver<Update>) -> Response {
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |u| {
        let v = match u {
            Update::Task(t) => Ok(d.task_event(&t)),
            Update::Status(t, last) => Ok(d.status_event(&t, last)),
            Update::Artifact(t) => Ok(d.artifact_event(&t)),
            Update::Failed(e) => Err(e),
        };
        Ok::<_, std::convert::Infallible>(Event::default().data(envelope(&id, v).to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_authenticated_or_open_with_a_reason() {
        for (path, access) in ROUTES {
            if let RouteAccess::Open(why) = access {
                assert!(!why.trim().is_empty(), "{path} is open without a reason");
            }
        }
        // The endpoint that reaches sessions is never open.
        assert!(
            ROUTES
                .iter()
                .any(|(p, a)| *p == RPC_PATH && matches!(a, RouteAccess::Authenticated))
        );
    }

    #[test]
    fn send_params_are_read_in_both_dialects() {
        let v1 = json!({"message": {"messageId": "m", "role": "ROLE_USER", "contextId": "s1",
            "parts": [{"text": "hello"}], "metadata": {"agent": "lead"}},
            "configuration": {"returnImmediately": true}});
        let s = parse_send(Dialect::V1, &v1).unwrap();
        assert_eq!(s.request.session_id, "s1");
        assert_eq!(s.request.message, "hello");
        assert_eq!(s.request.agent, "lead");
        assert!(!s.blocking);
        let v03 = json!({"message": {"kind": "message", "messageId": "m", "role": "user",
            "parts": [{"kind": "text", "text": "hi"}]}});
        let s = parse_send(Dialect::V03, &v03).unwrap();
        assert!(s.blocking);
        assert!(s.request.session_id.is_empty());
        // A 0.3 role in a 1.0 request, a file part, no text, a bad task id.
        for (d, p, code) in [
            (
                Dialect::V1,
                json!({"message": {"role": "user", "parts": [{"text": "x"}]}}),
                code::INVALID_PARAMS,
            ),
            (
                Dialect::V1,
                json!({"message": {"role": "ROLE_USER", "parts": [{"url": "file:///etc/passwd"}]}}),
                code::CONTENT_TYPE_NOT_SUPPORTED,
            ),
            (
                Dialect::V03,
                json!({"message": {"role": "user", "parts": [{"kind": "text", "text": "  "}]}}),
                code::INVALID_PARAMS,
            ),
            (
                Dialect::V03,
                json!({"message": {"role": "user", "taskId": "nope", "parts": [{"kind": "text", "text": "x"}]}}),
                code::TASK_NOT_FOUND,
            ),
            (Dialect::V1, json!({}), code::INVALID_PARAMS),
            (
                Dialect::V1,
                json!({"message": {"role": "ROLE_USER", "contextId": 7, "parts": [{"text": "x"}]}}),
                code::INVALID_PARAMS,
            ),
        ] {
            let e = parse_send(d, &p)
                .err()
                .unwrap_or_else(|| panic!("{p} accepted"));
            assert_eq!(e.code, code, "{p}: {e:?}");
        }
    }
}
