//! Ownership as one layer (issue 39): [`SessionGuard`] sits between the
//! credential check ([`omicos_auth::Guard`]) and the Orchestrator and
//! OrchestratorWeb services, and decides every call by its method path
//! before a handler runs:
//!
//! - [`Access::Session`]: the request names a session (`session_id` of its
//!   first message); the call goes on only when the caller's tenant and
//!   subject created it, and then carries an [`Owned`] in its extensions,
//!   the one value through which a handler reaches that session.
//! - [`Access::MaybeSession`]: the same when a session is named (Chat's
//!   first message, StartTurn); empty starts a new session.
//! - [`Access::Task`]: an A2A method (`lf.a2a.v1.A2AService`) that names a
//!   task (`<session>:<turn>`) or a context (a session); the same check, and
//!   refusals are A2A's TaskNotFound (the SDKs' typed error).
//! - [`Access::Caller`]: reaches only the caller's own data (listing by owner).
//! - [`Access::Open`]: reaches no session (the catalog, the client config).
//!
//! A method missing from [`METHODS`] is refused (UNIMPLEMENTED): a new RPC is
//! closed until it is classified, and a test walks the proto descriptors to
//! hold the table complete. Another owner's session answers exactly as a
//! session that does not exist (NOT_FOUND, `session_not_found`; Chat in-band,
//! as for an unknown id), so ids cannot be probed; every cross-owner attempt
//! is written to the audit log (`omicos::audit`, `session_denied`).

use crate::error::OrchestratorError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::future::BoxFuture;
use http_body::Frame;
use http_body_util::BodyExt;
use omicos_auth::Principal;
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelTurnRequest, ChatClientMessage, ChatEvent,
    ChatRequest, CompactRequest, DeleteSessionRequest, GetSessionRequest, a2a, chat_client_message,
};
use omicos_sessionstore::{SessionMeta, SessionStore};
use prost::Message;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::NamedService;

/// How a method reaches sessions.
#[derive(Clone, Copy)]
pub enum Access {
    /// Names one session in its first message; only its owner gets through.
    Session(fn(&[u8]) -> Result<String, prost::DecodeError>),
    /// May name a session in its first message (empty: a new session); a
    /// named one must be the caller's. Refusals are answered in-band when
    /// `in_band` (Chat: a client resuming a lost session reads why in its stream).
    MaybeSession {
        /// The session the first message names.
        session: fn(&[u8]) -> Result<String, prost::DecodeError>,
        /// Refusals as an Error event and TurnDone(ERROR) instead of a status.
        in_band: bool,
    },
    /// Names an A2A task or context in its first message (the session its
    /// id starts with); only its owner gets through, and a refusal is A2A's
    /// TaskNotFound. Naming none (a new context, or an empty id the handler
    /// refuses) reaches no session.
    Task(fn(&[u8]) -> Result<String, prost::DecodeError>),
    /// Reaches only the caller's own data; why that is so.
    Caller(&'static str),
    /// Reaches no session; why it may be open to every authenticated caller.
    Open(&'static str),
}

/// A request message that names a session.
trait NamesSession: Message + Default {
    fn session(self) -> String;
}

macro_rules! names_session {
    ($($t:ty),*) => {$(
        impl NamesSession for $t {
            fn session(self) -> String {
                self.session_id
            }
        }
    )*};
}
names_session!(
    AttachRequest,
    CancelTurnRequest,
    ApproveToolRequest,
    GetSessionRequest,
    DeleteSessionRequest,
    CompactRequest,
    omicos_proto::ForkSessionRequest,
    omicos_proto::RewindSessionRequest,
    omicos_proto::RenameSessionRequest,
    omicos_proto::UploadFilesRequest,
    omicos_proto::ReadValueRequest,
    ChatRequest
);

fn session_of<T: NamesSession>(payload: &[u8]) -> Result<String, prost::DecodeError> {
    Ok(T::decode(payload)?.session())
}

/// Chat's first message: a ChatRequest (anything else names no session, and
/// the handler refuses it).
fn chat_session(payload: &[u8]) -> Result<String, prost::DecodeError> {
    Ok(match ChatClientMessage::decode(payload)?.msg {
        Some(chat_client_message::Msg::Request(r)) => r.session_id,
        _ => String::new(),
    })
}

/// The session an A2A task id names: the part before the turn; an id that
/// is not one of ours is looked up whole, and so found nowhere.
fn task_session(id: &str) -> String {
    match crate::service::a2a::task::parse_task_id(id) {
        Some((session, _)) => session.to_owned(),
        None => id.to_owned(),
    }
}

/// A request message of A2A's that names a task by `id`.
trait NamesTask: Message + Default {
    fn task(self) -> String;
}

macro_rules! names_task {
    ($($t:ty),*) => {$(
        impl NamesTask for $t {
            fn task(self) -> String {
                self.id
            }
        }
    )*};
}
names_task!(
    a2a::GetTaskRequest,
    a2a::CancelTaskRequest,
    a2a::SubscribeToTaskRequest
);

fn task_of<T: NamesTask>(payload: &[u8]) -> Result<String, prost::DecodeError> {
    let id = T::decode(payload)?.task();
    Ok(if id.is_empty() { id } else { task_session(&id) })
}

/// SendMessage's context: `contextId`, else the session of `taskId`.
fn a2a_send_session(payload: &[u8]) -> Result<String, prost::DecodeError> {
    let m = a2a::SendMessageRequest::decode(payload)?
        .message
        .unwrap_or_default();
    Ok(if !m.context_id.is_empty() {
        m.context_id
    } else if !m.task_id.is_empty() {
        task_session(&m.task_id)
    } else {
        String::new()
    })
}

/// Why the push notification methods are open: they answer
/// PushNotificationNotSupported without reading their request.
const PUSH_UNSUPPORTED: &str =
    "answers A2A's PushNotificationNotSupportedError without reading the request; no session";

/// Every method of Orchestrator, OrchestratorWeb and A2AService, and how it reaches sessions.
pub const METHODS: &[(&str, Access)] = &[
    (
        "/omicos.v1.Orchestrator/Chat",
        Access::MaybeSession {
            session: chat_session,
            in_band: true,
        },
    ),
    (
        "/omicos.v1.Orchestrator/Attach",
        Access::Session(session_of::<AttachRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/CancelTurn",
        Access::Session(session_of::<CancelTurnRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/ApproveTool",
        Access::Session(session_of::<ApproveToolRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/ListAgents",
        Access::Open("the agent catalog, filtered by the caller's tier; no session"),
    ),
    (
        "/omicos.v1.Orchestrator/ListSessions",
        Access::Caller("lists only the sessions of the caller's tenant and subject"),
    ),
    (
        "/omicos.v1.Orchestrator/GetSession",
        Access::Session(session_of::<GetSessionRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/DeleteSession",
        Access::Session(session_of::<DeleteSessionRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/RefreshCatalog",
        Access::Open("re-reads the deployment's agent files; no session"),
    ),
    (
        "/omicos.v1.Orchestrator/ListAgentTools",
        Access::Caller("the tools of an agent as the caller's tier sees them; no session"),
    ),
    (
        "/omicos.v1.Orchestrator/Compact",
        Access::Session(session_of::<CompactRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/ForkSession",
        Access::Session(session_of::<omicos_proto::ForkSessionRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/RewindSession",
        Access::Session(session_of::<omicos_proto::RewindSessionRequest>),
    ),
    (
        "/omicos.v1.Orchestrator/RenameSession",
        Access::Session(session_of::<omicos_proto::RenameSessionRequest>),
    ),
    (
        // Empty session_id: the caller's own workspace, for the new session
        // its next StartTurn or Chat starts.
        "/omicos.v1.Orchestrator/UploadFiles",
        Access::MaybeSession {
            session: session_of::<omicos_proto::UploadFilesRequest>,
            in_band: false,
        },
    ),
    (
        "/omicos.v1.Orchestrator/ReadValue",
        Access::Session(session_of::<omicos_proto::ReadValueRequest>),
    ),
    (
        "/omicos.v1.OrchestratorWeb/StartTurn",
        Access::MaybeSession {
            session: session_of::<ChatRequest>,
            in_band: false,
        },
    ),
    (
        "/omicos.v1.OrchestratorWeb/GetClientConfig",
        Access::Open("the deployment's providers, default model and mode; no session"),
    ),
    (
        "/lf.a2a.v1.A2AService/SendMessage",
        Access::Task(a2a_send_session),
    ),
    (
        "/lf.a2a.v1.A2AService/SendStreamingMessage",
        Access::Task(a2a_send_session),
    ),
    (
        "/lf.a2a.v1.A2AService/GetTask",
        Access::Task(task_of::<a2a::GetTaskRequest>),
    ),
    (
        "/lf.a2a.v1.A2AService/CancelTask",
        Access::Task(task_of::<a2a::CancelTaskRequest>),
    ),
    (
        "/lf.a2a.v1.A2AService/SubscribeToTask",
        Access::Task(task_of::<a2a::SubscribeToTaskRequest>),
    ),
    (
        "/lf.a2a.v1.A2AService/ListTasks",
        Access::Caller("lists only the tasks of the sessions of the caller's tenant and subject"),
    ),
    (
        "/lf.a2a.v1.A2AService/GetExtendedAgentCard",
        Access::Open(
            "answers ExtendedAgentCardNotConfiguredError (the public card is the whole card); no session",
        ),
    ),
    (
        "/lf.a2a.v1.A2AService/CreateTaskPushNotificationConfig",
        Access::Open(PUSH_UNSUPPORTED),
    ),
    (
        "/lf.a2a.v1.A2AService/GetTaskPushNotificationConfig",
        Access::Open(PUSH_UNSUPPORTED),
    ),
    (
        "/lf.a2a.v1.A2AService/ListTaskPushNotificationConfigs",
        Access::Open(PUSH_UNSUPPORTED),
    ),
    (
        "/lf.a2a.v1.A2AService/DeleteTaskPushNotificationConfig",
        Access::Open(PUSH_UNSUPPORTED),
    ),
];

/// How `path` reaches sessions; None: not classified (refused).
pub fn access_of(path: &str) -> Option<Access> {
    METHODS.iter().find(|(p, _)| *p == path).map(|(_, a)| *a)
}

/// A session the caller owns, put in the request by [`SessionGuard`]: the
/// only way a handler learns which session it works on. Its fields are
/// private, so nothing but the guard makes one.
#[derive(Clone, Debug)]
pub struct Owned {
    meta: SessionMeta,
    principal: Principal,
}

impl Owned {
    /// The session's id.
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The session as the guard read it.
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// Its owner, the caller.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }
}

/// The guard's decision for a route that is not a gRPC method (the A2A
/// endpoint names sessions as `contextId`): the session `id` when `who`
/// owns it. Another owner's session is [`OrchestratorError::SessionNotFound`]
/// exactly as one that does not exist, and the attempt is audited as the
/// guard audits it (`session_denied`).
pub async fn own(
    store: &dyn SessionStore,
    who: &Principal,
    id: &str,
    route: &str,
) -> Result<Owned, OrchestratorError> {
    match store.get_session(id).await {
        Ok(Some(meta)) if who.owns(&meta.tenant, &meta.subject) => Ok(Owned {
            meta,
            principal: who.clone(),
        }),
        Ok(Some(_)) => {
            tracing::warn!(
                target: "omicos::audit",
                event = "session_denied",
                principal = %who.label(),
                session = %id,
                method = %route,
                "a session of another owner was asked for; answered as not found"
            );
            Err(OrchestratorError::SessionNotFound(id.to_owned()))
        }
        Ok(None) => Err(OrchestratorError::SessionNotFound(id.to_owned())),
        Err(e) => Err(OrchestratorError::from(e)),
    }
}

/// The session a request was admitted to. A request without one reached a
/// handler that is not behind [`SessionGuard`]: refused, never guessed.
pub fn owned_of<T>(req: &tonic::Request<T>) -> Result<Owned, tonic::Status> {
    req.extensions().get::<Owned>().cloned().ok_or_else(|| {
        tonic::Status::internal("no owned session: this service is not behind its session guard")
    })
}

/// The session a request may carry ([`Access::MaybeSession`]).
pub fn maybe_owned<T>(req: &tonic::Request<T>) -> Option<Owned> {
    req.extensions().get::<Owned>().cloned()
}

/// The tower service that decides by [`METHODS`]; wraps one tonic service
/// and keeps its name.
pub struct SessionGuard<S> {
    inner: S,
    store: Arc<dyn SessionStore>,
}

impl<S: Clone> Clone for SessionGuard<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: self.store.clone(),
        }
    }
}

impl<S> SessionGuard<S> {
    /// `inner`, with owners read from `store`.
    pub fn new(inner: S, store: Arc<dyn SessionStore>) -> Self {
        Self { inner, store }
    }
}

impl<S: NamedService> NamedService for SessionGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for SessionGuard<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = self.store.clone();
        Box::pin(async move {
            match admit(store.as_ref(), req).await {
                Ok(req) => inner.call(req).await,
                Err(res) => Ok(res),
            }
        })
    }
}

/// How a session the caller does not own is refused.
#[derive(Clone, Copy)]
enum Refusal {
    /// NOT_FOUND, `session_not_found`.
    Status,
    /// In Chat's stream (an Error event and TurnDone).
    InBand,
    /// A2A's TaskNotFound (NOT_FOUND with its ErrorInfo).
    A2a,
}

/// The request, with its [`Owned`] when it names a session, or the answer
/// that refuses it.
async fn admit(
    store: &dyn SessionStore,
    req: http::Request<Body>,
) -> Result<http::Request<Body>, http::Response<Body>> {
    let path = req.uri().path().to_owned();
    let (session, optional, refusal) = match access_of(&path) {
        None => {
            // Bounded: the path is the caller's, and may be long.
            return Err(tonic::Status::unimplemented(format!(
                "{} is not classified by the session guard",
                crate::bound::cut(&path, 200, "")
            ))
            .into_http());
        }
        Some(Access::Open(_) | Access::Caller(_)) => return Ok(req),
        Some(Access::Session(f)) => (f, false, Refusal::Status),
        Some(Access::MaybeSession { session, in_band }) => (
            session,
            true,
            if in_band {
                Refusal::InBand
            } else {
                Refusal::Status
            },
        ),
        Some(Access::Task(f)) => (f, true, Refusal::A2a),
    };
    let Some(who) = req.extensions().get::<Principal>().cloned() else {
        return Err(tonic::Status::unauthenticated(
            "no principal: this service is not behind its guard",
        )
        .into_http());
    };
    let (parts, body) = req.into_parts();
    let (read, payload, rest) = first_message(body).await.map_err(|s| s.into_http())?;
    let rebuild = |parts: http::request::Parts, owned: Option<Owned>| {
        let head = futures::stream::iter(
            (!read.is_empty()).then(|| Ok::<_, tonic::Status>(Frame::data(read.clone()))),
        );
        let body = Body::new(http_body_util::StreamBody::new(
            head.chain(http_body_util::BodyStream::new(rest)),
        ));
        let mut req = http::Request::from_parts(parts, body);
        if let Some(o) = owned {
            req.extensions_mut().insert(o);
        }
        req
    };
    // No message at all: the handler answers that (and reaches no session).
    let Some(payload) = payload else {
        return Ok(rebuild(parts, None));
    };
    let id = session(&payload).map_err(|e| {
        tonic::Status::invalid_argument(format!("the request does not decode: {e}")).into_http()
    })?;
    if id.is_empty() && optional {
        return Ok(rebuild(parts, None));
    }
    let refuse = |id: &str| -> http::Response<Body> {
        let e = OrchestratorError::SessionNotFound(id.to_owned());
        match refusal {
            Refusal::InBand => in_band_refusal(id, &e),
            Refusal::Status => tonic::Status::from(e).into_http(),
            Refusal::A2a => crate::service::a2a::grpc::context_not_found(id).into_http(),
        }
    };
    match store.get_session(&id).await {
        Ok(Some(meta)) if who.owns(&meta.tenant, &meta.subject) => Ok(rebuild(
            parts,
            Some(Owned {
                meta,
                principal: who,
            }),
        )),
        Ok(Some(_)) => {
            tracing::warn!(
                target: "omicos::audit",
                event = "session_denied",
                principal = %who.label(),
                session = %id,
                method = %path,
                "a session of another owner was asked for; answered as not found"
            );
            Err(refuse(&id))
        }
        Ok(None) => Err(refuse(&id)),
        Err(e) => Err(tonic::Status::from(OrchestratorError::from(e)).into_http()),
    }
}

/// What was read of the body (to give back to the handler), the first
/// message's payload (None: the stream had none), and the rest of the body.
async fn first_message(mut body: Body) -> Result<(Bytes, Option<Bytes>, Body), tonic::Status> {
    let mut buf = BytesMut::new();
    loop {
        if buf.len() >= 5 {
            if buf[0] != 0 {
                return Err(tonic::Status::unimplemented(
                    "compressed requests are not accepted",
                ));
            }
            let len = (&buf[1..5]).get_u32() as usize;
            if len > omicos_proto::MAX_MESSAGE_BYTES {
                return Err(tonic::Status::out_of_range(format!(
                    "the request's message is {len} bytes, more than the limit of {}",
                    omicos_proto::MAX_MESSAGE_BYTES
                )));
            }
            if buf.len() >= 5 + len {
                let read = buf.freeze();
                let payload = read.slice(5..5 + len);
                return Ok((read, Some(payload), body));
            }
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    buf.put(data);
                }
                // Trailers before a whole message: the end comes next.
            }
            Some(Err(e)) => return Err(e),
            None if buf.is_empty() => return Ok((Bytes::new(), None, body)),
            None => {
                return Err(tonic::Status::invalid_argument(
                    "the request ends inside its first message",
                ));
            }
        }
    }
}

/// Chat's answer to a session it does not find: an Error event and a
/// TurnDone(ERROR), in-band, as a gRPC response stream.
fn in_band_refusal(id: &str, e: &OrchestratorError) -> http::Response<Body> {
    let mut buf = BytesMut::new();
    for ev in super::events::one_shot_events(id, e, "; leave session_id empty to start a new one") {
        let ev: ChatEvent = ev;
        buf.put_u8(0);
        buf.put_u32(ev.encoded_len() as u32);
        // A BytesMut grows as needed: encoding cannot run out of room.
        let _ = ev.encode(&mut buf);
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = futures::stream::iter([
        Ok::<_, Infallible>(Frame::data(buf.freeze())),
        Ok(Frame::trailers(trailers)),
    ]);
    let mut res = http::Response::new(Body::new(http_body_util::StreamBody::new(frames)));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every method the proto declares on the client-facing services is in
    /// [`METHODS`], and the table names nothing the proto does not declare.
    #[test]
    fn every_orchestrator_method_is_classified() {
        let mut declared = BTreeSet::new();
        for file in descriptors() {
            for svc in &file.service {
                let name = format!("{}.{}", file.package(), svc.name());
                if !matches!(
                    name.as_str(),
                    "omicos.v1.Orchestrator" | "omicos.v1.OrchestratorWeb" | "lf.a2a.v1.A2AService"
                ) {
                    continue;
                }
                for m in &svc.method {
                    declared.insert(format!("/{name}/{}", m.name()));
                }
            }
        }
        assert!(declared.len() >= 13 + 11, "{declared:?}");
        let classified: BTreeSet<String> = METHODS.iter().map(|(p, _)| p.to_string()).collect();
        let missing: Vec<_> = declared.difference(&classified).collect();
        assert!(
            missing.is_empty(),
            "methods neither guarded nor listed as open: {missing:?}; add them to METHODS"
        );
        let stale: Vec<_> = classified.difference(&declared).collect();
        assert!(
            stale.is_empty(),
            "METHODS names methods the proto lacks: {stale:?}"
        );
        for (p, a) in METHODS {
            if let Access::Open(why) | Access::Caller(why) = a {
                assert!(!why.trim().is_empty(), "{p} is open without a reason");
            }
        }
    }

    /// The files of the omicos and A2A descriptor sets.
    fn descriptors() -> Vec<prost_types::FileDescriptorProto> {
        [
            omicos_proto::FILE_DESCRIPTOR_SET,
            omicos_proto::A2A_FILE_DESCRIPTOR_SET,
        ]
        .into_iter()
        .flat_map(|b| {
            prost_types::FileDescriptorSet::decode(b)
                .expect("the embedded descriptor set decodes")
                .file
        })
        .collect()
    }

    /// Every method whose request message has a `session_id` field is guarded
    /// as naming a session, and every A2A method whose request names a task
    /// (`id`) or carries a message (its `context_id`, `task_id`) as naming a
    /// task (a new session-scoped RPC cannot be listed as open).
    #[test]
    fn every_request_with_a_session_id_is_guarded() {
        let files = descriptors();
        let fields_of = |type_name: &str| -> Vec<String> {
            files
                .iter()
                .flat_map(|f| {
                    f.message_type
                        .iter()
                        .filter(move |m| format!(".{}.{}", f.package(), m.name()) == type_name)
                })
                .flat_map(|m| m.field.iter().map(|x| x.name().to_owned()))
                .collect()
        };
        let has_session = |type_name: &str| fields_of(type_name).iter().any(|x| x == "session_id");
        let mut a2a_task_methods = 0;
        for file in &files {
            if file.package() != "lf.a2a.v1" {
                continue;
            }
            for svc in &file.service {
                for m in &svc.method {
                    let path = format!("/lf.a2a.v1.{}/{}", svc.name(), m.name());
                    let fields = fields_of(m.input_type());
                    // `id` names a task; `message` carries a context and a task.
                    // (The push methods' `id` names a config; they are open with
                    // PUSH_UNSUPPORTED: they refuse without reading.)
                    if m.name().contains("PushNotification") {
                        assert!(
                            matches!(access_of(&path), Some(Access::Open(w)) if w == PUSH_UNSUPPORTED),
                            "{path}"
                        );
                        continue;
                    }
                    if fields.iter().any(|x| x == "id" || x == "message") {
                        a2a_task_methods += 1;
                        assert!(
                            matches!(access_of(&path), Some(Access::Task(_))),
                            "{path} names a task but is not guarded as naming one"
                        );
                    }
                }
            }
        }
        // GetTask, CancelTask, SubscribeToTask, SendMessage, SendStreamingMessage.
        assert_eq!(a2a_task_methods, 5);
        for file in &files {
            for svc in &file.service {
                let name = format!("{}.{}", file.package(), svc.name());
                for m in &svc.method {
                    let path = format!("/{name}/{}", m.name());
                    let Some(access) = access_of(&path) else {
                        continue;
                    };
                    if has_session(m.input_type()) {
                        assert!(
                            matches!(access, Access::Session(_) | Access::MaybeSession { .. }),
                            "{path} takes a session_id but is not guarded as naming a session"
                        );
                    }
                }
            }
        }
    }

    fn frame(msg: &impl prost::Message) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(0);
        b.put_u32(msg.encoded_len() as u32);
        msg.encode(&mut b).unwrap();
        b.freeze()
    }

    /// The inner service: counts calls and answers what Owned it was given.
    #[derive(Clone, Default)]
    struct Counting(Arc<std::sync::Mutex<Vec<Option<String>>>>);

    impl NamedService for Counting {
        const NAME: &'static str = "omicos.v1.Orchestrator";
    }

    impl tower::Service<http::Request<Body>> for Counting {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<Body>) -> Self::Future {
            let calls = self.0.clone();
            Box::pin(async move {
                let owned = req.extensions().get::<Owned>().map(|o| o.id().to_owned());
                // The body is given back whole.
                let body = req.into_body().collect().await.unwrap().to_bytes();
                assert!(body.len() >= 5);
                calls.lock().unwrap().push(owned);
                Ok(tonic::Status::ok("").into_http())
            })
        }
    }

    fn principal(subject: &str, tenant: &str) -> Principal {
        Principal {
            subject: subject.into(),
            tenant: tenant.into(),
            ..Principal::anonymous()
        }
    }

    fn request(path: &str, who: &Principal, body: Bytes) -> http::Request<Body> {
        let mut r = http::Request::builder()
            .uri(format!("http://x{path}"))
            .header("content-type", "application/grpc")
            .body(Body::new(http_body_util::Full::new(body)))
            .unwrap();
        r.extensions_mut().insert(who.clone());
        r
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn another_owners_session_is_refused_as_missing_and_audited() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let store =
            omicos_sessionstore::open(&format!("sqlite://{}", dir.path().join("s.db").display()))
                .await
                .unwrap();
        let meta = SessionMeta {
            id: "s-alice".into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            ..Default::default()
        };
        store.put_session(&meta).await.unwrap();
        let alice = principal("alice", "acme");
        let bob = principal("bob", "acme");
        let mallory = principal("mallory", "evil");
        let inner = Counting::default();
        let guard = SessionGuard::new(inner.clone(), store);

        let out = Captured::default();
        let sub = tracing_subscriber_for(out.clone());
        let _g = tracing::subscriber::set_default(sub);

        let compact = |who: &Principal, id: &str| {
            request(
                "/omicos.v1.Orchestrator/Compact",
                who,
                frame(&CompactRequest {
                    session_id: id.into(),
                }),
            )
        };
        let code_and_message = |r: &http::Response<Body>| {
            (
                r.headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_owned()),
                r.headers()
                    .get("grpc-message")
                    .map(|v| v.to_str().unwrap().to_owned()),
            )
        };
        // Another principal of the same tenant, of another tenant, and an id
        // that does not exist: the same answer, and the handler never runs.
        let foreign = guard
            .clone()
            .oneshot(compact(&bob, "s-alice"))
            .await
            .unwrap();
        let other = guard
            .clone()
            .oneshot(compact(&mallory, "s-alice"))
            .await
            .unwrap();
        let missing = guard
            .clone()
            .oneshot(compact(&bob, "s-nobody"))
            .await
            .unwrap();
        let nf = Some((tonic::Code::NotFound as i32).to_string());
        assert_eq!(code_and_message(&foreign).0, nf);
        assert_eq!(code_and_message(&other), code_and_message(&foreign));
        let m = |r: &http::Response<Body>| {
            code_and_message(r)
                .1
                .unwrap()
                .replace("s-nobody", "s-alice")
        };
        assert_eq!(m(&missing), m(&foreign));
        assert!(inner.0.lock().unwrap().is_empty());
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.matches("session_denied").count(), 2, "{log}");
        assert!(
            log.contains("bob@acme") && log.contains("mallory@evil"),
            "{log}"
        );

        // The owner gets through, with the session in hand.
        let ok = guard
            .clone()
            .oneshot(compact(&alice, "s-alice"))
            .await
            .unwrap();
        assert_eq!(code_and_message(&ok).0, Some("0".into()));
        assert_eq!(*inner.0.lock().unwrap(), vec![Some("s-alice".to_owned())]);

        // Chat refuses in-band, and a new session (no id) goes through.
        let chat = |who: &Principal, id: &str| {
            request(
                "/omicos.v1.Orchestrator/Chat",
                who,
                frame(&ChatClientMessage {
                    msg: Some(chat_client_message::Msg::Request(ChatRequest {
                        session_id: id.into(),
                        message: "hi".into(),
                        ..Default::default()
                    })),
                }),
            )
        };
        let r = guard.clone().oneshot(chat(&bob, "s-alice")).await.unwrap();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let ev = ChatEvent::decode(&body[5..5 + (&body[1..5]).get_u32() as usize]).unwrap();
        assert!(
            matches!(&ev.kind, Some(omicos_proto::chat_event::Kind::Error(e)) if e.kind == "session_not_found"),
            "{ev:?}"
        );
        guard.clone().oneshot(chat(&bob, "")).await.unwrap();
        assert_eq!(inner.0.lock().unwrap().len(), 2);

        // Open methods pass; an unclassified one is refused.
        let r = guard
            .clone()
            .oneshot(request(
                "/omicos.v1.Orchestrator/Nope",
                &alice,
                frame(&CompactRequest::default()),
            ))
            .await
            .unwrap();
        assert_eq!(
            code_and_message(&r).0,
            Some((tonic::Code::Unimplemented as i32).to_string())
        );
        assert_eq!(inner.0.lock().unwrap().len(), 2);
        // A long unclassified path is not echoed whole.
        let long = format!("/omicos.v1.Orchestrator/{}", "N".repeat(50_000));
        let r = guard
            .clone()
            .oneshot(request(&long, &alice, frame(&CompactRequest::default())))
            .await
            .unwrap();
        let (code, message) = code_and_message(&r);
        assert_eq!(code, Some((tonic::Code::Unimplemented as i32).to_string()));
        let message = message.expect("a message");
        assert!(message.len() < 1_000, "{} bytes", message.len());
        // grpc-message is percent-encoded.
        assert!(message.contains("not%20classified"), "{message}");
        assert_eq!(inner.0.lock().unwrap().len(), 2);

        // ReadValue (a cut value whole) the same: another owner hears what a
        // missing session answers, and is audited; the owner gets through.
        let read = |who: &Principal, id: &str| {
            request(
                "/omicos.v1.Orchestrator/ReadValue",
                who,
                frame(&omicos_proto::ReadValueRequest {
                    session_id: id.into(),
                    value: Some(omicos_proto::ValueRef {
                        at: Some(omicos_proto::value_ref::At::Event(
                            omicos_proto::EventValue {
                                event_seq: 3,
                                field: "tool_call_started.arguments".into(),
                            },
                        )),
                        size_bytes: 0,
                    }),
                    offset: 0,
                }),
            )
        };
        let foreign = guard
            .clone()
            .oneshot(read(&mallory, "s-alice"))
            .await
            .unwrap();
        let missing = guard
            .clone()
            .oneshot(read(&mallory, "s-nobody"))
            .await
            .unwrap();
        assert_eq!(code_and_message(&foreign).0, nf);
        assert_eq!(m(&missing), m(&foreign));
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.matches("session_denied").count(), 4, "{log}");
        assert!(log.contains("/omicos.v1.Orchestrator/ReadValue"), "{log}");
        assert_eq!(inner.0.lock().unwrap().len(), 2);
        let ok = guard
            .clone()
            .oneshot(read(&alice, "s-alice"))
            .await
            .unwrap();
        assert_eq!(code_and_message(&ok).0, Some("0".into()));
        assert_eq!(inner.0.lock().unwrap()[2], Some("s-alice".to_owned()));
    }

    fn tracing_subscriber_for(out: Captured) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .finish()
    }
}
