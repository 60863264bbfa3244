//! omicos as an A2A agent (issue 41), on the orchestrator's HTTP port:
//!
//! - `GET /.well-known/agent-card.json`: the Agent Card ([`card`]);
//! - `POST /a2a`: the JSON-RPC binding. A2A 1.0's methods (`SendMessage`,
//!   `SendStreamingMessage`, `GetTask`, `CancelTask`) are answered in 1.0's
//!   ProtoJSON, and 0.3's (`message/send`, `message/stream`, `tasks/get`,
//!   `tasks/cancel`) in 0.3's shapes ([`task::Dialect`]).
//!
//! A task is one turn, its id `<session>:<turn>`; a context is one session.
//! The endpoint takes the gRPC API's credentials (the same [`Gate`]), and a
//! context or task of another owner answers as one that does not exist
//! ([`super::guard::own`]): A2A reaches no session the gRPC API would not.
//! Turns start through [`OrchestratorService::start_turn`], as Chat's and
//! StartTurn's do, so limits, hooks and approvals apply unchanged.

pub mod card;
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
}

/// A JSON-RPC error answer.
#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
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
        Self::new(code, e.to_string())
    }
}

/// What the A2A routes share.
#[derive(Clone)]
struct A2a {
    svc: Arc<OrchestratorService>,
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
    r.with_state(A2a { svc, gate, tls })
}

async fn agent_card(State(a): State<A2a>, headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    let base = format!("{}://{host}", if a.tls { "https" } else { "http" });
    let e = &a.svc.engine;
    axum::Json(card::card(&base, e.agents.as_ref(), &e.config.auth)).into_response()
}

/// The caller, or the HTTP answer that refuses it (401 without a valid
/// credential, as every other route of the port answers).
async fn caller(a: &A2a, headers: &HeaderMap) -> Result<Principal, Response> {
    match a.gate.admit(RPC_PATH, headers).await {
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

async fn rpc(State(a): State<A2a>, headers: HeaderMap, body: Bytes) -> Response {
    let who = match caller(&a, &headers).await {
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
    match method {
        "SendMessage" => answer(&id, a.send(&who, v1, &params).await),
        "message/send" => answer(&id, a.send(&who, v03, &params).await),
        "SendStreamingMessage" => a.stream(who, v1, id, params).await,
        "message/stream" => a.stream(who, v03, id, params).await,
        "GetTask" => answer(&id, a.get(&who, v1, &params).await),
        "tasks/get" => answer(&id, a.get(&who, v03, &params).await),
        "CancelTask" => answer(&id, a.cancel(&who, v1, &params).await),
        "tasks/cancel" => answer(&id, a.cancel(&who, v03, &params).await),
        m if m.contains("ushNotification") => answer(
            &id,
            Err(RpcError::new(
                code::PUSH_NOT_SUPPORTED,
                "push notifications are not supported: follow a task with SendStreamingMessage or poll GetTask",
            )),
        ),
        "ListTasks"
        | "tasks/list"
        | "SubscribeToTask"
        | "tasks/resubscribe"
        | "GetExtendedAgentCard"
        | "agent/getAuthenticatedExtendedCard" => answer(
            &id,
            Err(RpcError::new(
                code::UNSUPPORTED_OPERATION,
                format!("{method} is not supported by omicos yet"),
            )),
        ),
        other => answer(
            &id,
            Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("no method `{other}`"),
            )),
        ),
    }
}

/// What a SendMessage asks for.
struct Send {
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

/// Reads SendMessage's params (either dialect's: the fields that matter
/// have the same names in both).
fn parse_send(d: Dialect, params: &Value) -> Result<Send, RpcError> {
    let msg = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "`message` (an object) is missing"))?;
    let role = msg.get("role").and_then(Value::as_str).unwrap_or_default();
    let user = match d {
        Dialect::V1 => role == "ROLE_USER",
        Dialect::V03 => role == "user",
    };
    if !user {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("`message.role` must be the user's, not {role:?}"),
        ));
    }
    let parts = msg.get("parts").and_then(Value::as_array).ok_or_else(|| {
        RpcError::new(code::INVALID_PARAMS, "`message.parts` (a list) is missing")
    })?;
    let mut texts = vec![];
    for p in parts {
        match p.get("text").and_then(Value::as_str) {
            Some(t) => texts.push(t),
            None => {
                return Err(RpcError::new(
                    code::CONTENT_TYPE_NOT_SUPPORTED,
                    "only text parts are accepted (text/plain)",
                ));
            }
        }
    }
    let text = texts.join("\n");
    if text.trim().is_empty() {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            "the message has no text",
        ));
    }
    let mut session = str_at(msg, "contextId")?.map(str::to_owned);
    if let Some(task) = str_at(msg, "taskId")? {
        let (s, _) = task::parse_task_id(task).ok_or_else(|| RpcError::task_not_found(task))?;
        if session.as_deref().is_some_and(|c| c != s) {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "`taskId` belongs to another context than `contextId`",
            ));
        }
        session = Some(s.to_owned());
    }
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
    Ok(Send {
        request: ChatRequest {
            session_id: session.unwrap_or_default(),
            message: text,
            agent: meta("agent")?.unwrap_or_default(),
            permission_mode: meta("permissionMode")?.unwrap_or_default(),
            ..Default::default()
        },
        blocking,
    })
}

/// The task id a GetTask or CancelTask names.
fn task_param(params: &Value) -> Result<&str, RpcError> {
    str_at(params, "id")?.ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "`id` is missing"))
}

/// A turn being followed: its view, the last event applied, and the
/// session's live events.
struct Follow {
    view: TaskView,
    last_seq: u64,
    rx: tokio::sync::broadcast::Receiver<ChatEvent>,
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
    async fn start(&self, who: &Principal, send: Send) -> Result<Follow, RpcError> {
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

    async fn send(&self, who: &Principal, d: Dialect, params: &Value) -> Result<Value, RpcError> {
        let send = parse_send(d, params)?;
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
        Ok(d.send_result(&f.view))
    }

    async fn stream(&self, who: Principal, d: Dialect, id: Value, params: Value) -> Response {
        let send = match parse_send(d, &params) {
            Ok(s) => s,
            Err(e) => return answer(&id, Err(e)),
        };
        let mut f = match self.start(&who, send).await {
            Ok(f) => f,
            Err(e) => return answer(&id, Err(e)),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(16);
        let this = self.clone();
        let event =
            move |v: Result<Value, RpcError>| Event::default().data(envelope(&id, v).to_string());
        tokio::spawn(async move {
            // The task as accepted, then each change; the answer before the last status.
            if tx.send(event(Ok(d.task_event(&f.view)))).await.is_err() {
                return;
            }
            if f.view.state != TaskState::Submitted {
                let _ = tx.send(event(Ok(d.status_event(&f.view, false)))).await;
            }
            loop {
                if f.view.state.is_terminal() {
                    break;
                }
                match this.next_change(&mut f).await {
                    Ok(Some(state)) if state.is_terminal() => break,
                    Ok(Some(_)) => {
                        if tx
                            .send(event(Ok(d.status_event(&f.view, false))))
                            .await
                            .is_err()
                        {
                            // The client left; the turn goes on (as after a Chat client leaves).
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(event(Err(e))).await;
                        return;
                    }
                }
            }
            if f.view.state == TaskState::Completed {
                let _ = tx.send(event(Ok(d.artifact_event(&f.view)))).await;
            }
            let _ = tx.send(event(Ok(d.status_event(&f.view, true)))).await;
        });
        Sse::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
        )
        .keep_alive(KeepAlive::default())
        .into_response()
    }

    /// The task `id` names, when the caller owns its context.
    async fn find(&self, who: &Principal, id: &str) -> Result<TaskView, RpcError> {
        let (session, turn) =
            task::parse_task_id(id).ok_or_else(|| RpcError::task_not_found(id))?;
        super::guard::own(self.svc.hub.store().as_ref(), who, session, RPC_PATH)
            .await
            .map_err(|e| match e {
                OrchestratorError::SessionNotFound(_) => RpcError::task_not_found(id),
                e => e.into(),
            })?;
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

    async fn get(&self, who: &Principal, d: Dialect, params: &Value) -> Result<Value, RpcError> {
        let view = self.find(who, task_param(params)?).await?;
        Ok(d.task(&view))
    }

    async fn cancel(&self, who: &Principal, d: Dialect, params: &Value) -> Result<Value, RpcError> {
        let id = task_param(params)?;
        let view = self.find(who, id).await?;
        if view.state.is_terminal() {
            return Err(RpcError::new(
                code::TASK_NOT_CANCELABLE,
                format!("task {id} is already {:?}", view.state),
            ));
        }
        let state = self.svc.hub.state(&view.session).await?;
        let mut f = Follow {
            rx: state.subscribe(),
            last_seq: 0,
            view: TaskView::submitted(&view.session, &view.turn, ""),
        };
        self.catch_up(&mut f).await?;
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
        Ok(d.task(&f.view))
    }
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
