//! Running one tool call through the tool-runner's `Execute` stream, relaying
//! progress, output and approvals to the session.

use crate::error::{OrchestratorError, RunnerStatus};
use crate::hub::SessionState;
use omicos_auth::Credentials;
use omicos_proto::{
    ChatEvent, Decision, ExecuteApproval, ExecuteCancel, ExecuteClientMessage, ExecuteStart,
    ListToolsRequest, ListToolsResponse, ToolApprovalRequest, ToolApprovalResolved,
    ToolOutputChunkEvent, ToolProgressEvent, ToolResult, chat_event, execute_client_message,
    execute_server_message, tool_runner_client::ToolRunnerClient,
};
use omicos_servicekit::ClientTls;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, channel::Change};
use tower::discover::Change as TowerChange;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The balanced channel over the runners: tonic's own for plain HTTP, one
/// over [`omicos_servicekit::TlsConnector`] connections when TLS is configured.
type RunnerChannel = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    ChannelError,
>;

/// A failure of the runner channel: the error as it came, under a concrete
/// type (a boxed `dyn Error` as the service's error trips rustc's
/// higher-ranked `Send` check of the futures that call through it).
#[derive(Debug)]
pub struct ChannelError(BoxError);

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ChannelError {
    // The error itself is the source, so tonic still finds a connect error
    // (UNAVAILABLE) or a Status down the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// The message of a call whose runner went away after it had started.
pub const RUNNER_LOST: &str = "the tool-runner running this call was lost";

/// The response metadata key a runner names itself under (the tool-runner's
/// `service::RUNNER_NAME_KEY`).
pub const RUNNER_NAME_KEY: &str = "omicos-runner";

/// How long a call waits for a runner to take it (none healthy: an error after this).
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of Execute over the runners while no connection is made (the
/// call cannot have run), all within [`START_TIMEOUT`].
const START_ATTEMPTS: u32 = 4;
/// Attempts of ListTools over the runners (it has no side effects).
const LIST_ATTEMPTS: u32 = 3;
/// How long one runner health check may take.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of the tool-runners: calls are spread over the healthy ones
/// (tower's power-of-two-choices balancer inside tonic's balanced channel).
#[derive(Clone)]
pub struct Runner {
    client: ToolRunnerClient<InterceptedService<RunnerChannel, Credentials>>,
    /// Every runner address discovery knows, with a channel to that runner
    /// alone: a call is re-attached on the runner that holds it, which the
    /// balancer cannot pick.
    members: Members,
    creds: Credentials,
}

/// The runners by address, each with its own channel ([`discover`] keeps it).
type Members = std::sync::Arc<std::sync::Mutex<Vec<(SocketAddr, Channel)>>>;

// RestoreFiles (RewindSession, ForkSession with files).
mod restore;

/// One configured runner entry: `http(s)://host:port`. Its host is resolved
/// again every refresh, and each address it resolves to is one runner (a
/// Kubernetes headless Service lists every pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerTarget {
    /// The entry as configured.
    pub url: String,
    /// `http` or `https`.
    pub scheme: String,
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// Port (80/443 by default).
    pub port: u16,
}

/// Parses the `tool_runner` list (comma-separated); a malformed entry is an
/// error that names it.
pub fn parse_targets(list: &str) -> Result<Vec<RunnerTarget>, String> {
    let mut out = vec![];
    for entry in list.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!("`{list}` has an empty entry"));
        }
        let uri: http::Uri = entry
            .parse()
            .map_err(|e| format!("`{entry}` is not a URL: {e}"))?;
        let scheme = match uri.scheme_str() {
            Some(s @ ("http" | "https")) => s.to_owned(),
            _ => return Err(format!("`{entry}` is not an http(s) URL")),
        };
        let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
            return Err(format!("`{entry}` has no host"));
        };
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(format!(
                "`{entry}` has a path; give scheme://host:port only"
            ));
        }
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        out.push(RunnerTarget {
            url: entry.to_owned(),
            scheme,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
        });
    }
    Ok(out)
}

impl Runner {
    /// A client over the runners of `list`, kept current by a task that
    /// resolves every entry and health-checks (grpc.health.v1) every address
    /// each `refresh`: healthy addresses join the balancer, others leave it.
    /// Every call carries the service secret (role orchestrator); empty: none.
    /// With `tls` (`runner_tls`), `https://` runners are reached over TLS,
    /// each verified as its configured host name, the client certificate of
    /// the moment presented on every new connection.
    pub fn new(
        list: &str,
        refresh: Duration,
        secret: &str,
        tls: Option<ClientTls>,
    ) -> Result<Self, OrchestratorError> {
        let targets =
            parse_targets(list).map_err(|m| OrchestratorError::config("tool_runner", m))?;
        if tls.is_none()
            && let Some(t) = targets.iter().find(|t| t.scheme == "https")
        {
            return Err(OrchestratorError::config(
                "tool_runner",
                format!("`{}` is https but `runner_tls` is not configured", t.url),
            ));
        }
        let creds = Credentials::service_over(
            secret,
            omicos_auth::ServiceRole::Orchestrator,
            tls.as_ref().is_some_and(ClientTls::has_cert),
        )
        .map_err(|e| OrchestratorError::config("service_secret", e.to_string()))?;
        let members = Members::default();
        let ch: RunnerChannel = match tls {
            None => {
                let (ch, changes) = Channel::balance_channel::<SocketAddr>(64);
                tokio::spawn(discover(
                    targets,
                    refresh,
                    Balancer::Plain(changes),
                    members.clone(),
                ));
                RunnerChannel::new(tower::ServiceExt::map_err(
                    ch,
                    transport_error as fn(_) -> _,
                ))
            }
            Some(tls) => {
                let (changes, rx) = mpsc::channel(64);
                tokio::spawn(discover(
                    targets,
                    refresh,
                    Balancer::Tls(changes, tls),
                    members.clone(),
                ));
                RunnerChannel::new(tower::ServiceExt::map_err(
                    tower::buffer::Buffer::new(
                        tower::balance::p2c::Balance::new(tls_members(rx)),
                        1024,
                    ),
                    ChannelError as fn(_) -> _,
                ))
            }
        };
        Ok(Self {
            members,
            creds: creds.clone(),
            client: ToolRunnerClient::new(InterceptedService::new(ch, creds))
                .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES),
        })
    }

    /// The tools for these toolsets under a mode. It has no side effects, so
    /// a runner lost on the way is retried on another.
    pub async fn list_tools(
        &self,
        req: ListToolsRequest,
    ) -> Result<ListToolsResponse, OrchestratorError> {
        let mut last = Status::unavailable("no tool-runner is reachable");
        for attempt in 0..LIST_ATTEMPTS {
            let mut c = self.client.clone();
            let call = c.list_tools(omicos_servicekit::telemetry::traced_request(req.clone()));
            match tokio::time::timeout(START_TIMEOUT, call).await {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) if retriable(&s) && attempt + 1 < LIST_ATTEMPTS => last = s,
                Ok(Err(s)) => return Err(OrchestratorError::ToolRunner(RunnerStatus(s))),
                Err(_) => {
                    last = Status::unavailable(format!(
                        "no tool-runner answered within {START_TIMEOUT:?}"
                    ))
                }
            }
        }
        Err(OrchestratorError::ToolRunner(RunnerStatus(last)))
    }
}

impl Runner {
    /// Tells the runners the session ended (DeleteSession): they stop its
    /// sandbox boxes and per-session servers and pass it on to every
    /// provider (its kernel). Best effort: a failure is logged and returned.
    pub async fn end_session(
        &self,
        session: &str,
        principal: &omicos_auth::Principal,
    ) -> Result<u32, OrchestratorError> {
        let mut c = self.client.clone();
        let mut req =
            omicos_servicekit::telemetry::traced_request(omicos_proto::EndSessionRequest {
                session_id: session.to_owned(),
                tenant: String::new(),
            });
        // The runner takes the tenant from the forwarded principal.
        omicos_auth::credentials::forward_principal(req.metadata_mut(), principal);
        match tokio::time::timeout(END_SESSION_TIMEOUT, c.end_session(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner().stopped),
            Ok(Err(s)) => Err(OrchestratorError::ToolRunner(RunnerStatus(s))),
            Err(_) => Err(OrchestratorError::ToolRunner(RunnerStatus(
                Status::deadline_exceeded(format!(
                    "no tool-runner ended the session within {END_SESSION_TIMEOUT:?}"
                )),
            ))),
        }
    }
}

/// How long DeleteSession waits for the runners to end the session's boxes and kernel.
const END_SESSION_TIMEOUT: Duration = Duration::from_secs(15);

/// What the event builder needs to tag events.
#[derive(Clone, Debug)]
pub struct EventTag {
    /// Turn id.
    pub turn_id: String,
    /// Execution context ("root", "root/call_x", ...).
    pub context: String,
    /// The agent.
    pub agent_id: String,
}

impl EventTag {
    /// An event of `kind` with these tags.
    pub fn event(&self, kind: chat_event::Kind) -> ChatEvent {
        ChatEvent {
            turn_id: self.turn_id.clone(),
            execution_context_id: self.context.clone(),
            agent_id: self.agent_id.clone(),
            kind: Some(kind),
            ..Default::default()
        }
    }
}

impl Runner {
    /// Runs one call. Never fails: a broken runner becomes an error result.
    pub async fn execute(
        &self,
        start: ExecuteStart,
        principal: &omicos_auth::Principal,
        session: &SessionState,
        tag: &EventTag,
        cancel: &CancellationToken,
    ) -> ToolResult {
        let call_id = start.call_id.clone();
        let error = |msg: String| ToolResult {
            call_id: call_id.clone(),
            status: omicos_proto::ToolStatus::Error as i32,
            result: msg,
            ..Default::default()
        };
        // Which runner took the call (the balancer does not say): the runner
        // names itself in the response metadata, so a loss can name it.
        let mut runner = String::from("unnamed");
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let mut attempt = 0;
        let (tx, stream) = loop {
            attempt += 1;
            let (tx, rx) = mpsc::channel::<ExecuteClientMessage>(8);
            let _ = tx
                .send(ExecuteClientMessage {
                    msg: Some(execute_client_message::Msg::Start(start.clone())),
                })
                .await;
            let mut client = self.client.clone();
            let mut req = omicos_servicekit::telemetry::traced_request(ReceiverStream::new(rx));
            // The runner believes these only with the service secret and the orchestrator role.
            omicos_auth::credentials::forward_principal(req.metadata_mut(), principal);
            match tokio::time::timeout_at(deadline, client.execute(req)).await {
                Ok(Ok(r)) => {
                    if let Some(n) = r
                        .metadata()
                        .get(RUNNER_NAME_KEY)
                        .and_then(|v| v.to_str().ok())
                    {
                        runner = n.to_owned();
                    }
                    break (tx, r.into_inner());
                }
                // No connection was made: no runner saw the call, so another
                // may take it. (A runner that died, or died and came back,
                // between two health checks is still in the balancer, and its
                // connection reports the failed connect once.)
                Ok(Err(e)) if never_sent(&e) && attempt < START_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "no connection to a tool-runner; trying another");
                    continue;
                }
                Ok(Err(e)) => {
                    return error(format!(
                        "the tool-runner is unreachable: {} (the call was not run again)",
                        e.message()
                    ));
                }
                Err(_) => {
                    return error(format!(
                        "no tool-runner took the call within {START_TIMEOUT:?}"
                    ));
                }
            }
        };
        follow(tx, stream, &runner, &call_id, session, tag, cancel, false).await
    }

    /// Finds the runner that holds call `call_id` of the session (after the
    /// orchestrator that started it was lost) and follows the call there
    /// again; [`Attached::follow`] relays it to the session. Err: no runner
    /// holds it (it was lost with its runner, or ended longer ago than the
    /// runners' reattach grace period), in words.
    pub async fn reattach(
        &self,
        call_id: &str,
        principal: &omicos_auth::Principal,
        session: &SessionState,
    ) -> Result<Attached, String> {
        let members = self.members.lock().expect("members").clone();
        let mut why = Vec::new();
        for (addr, ch) in members {
            let (tx, rx) = mpsc::channel::<ExecuteClientMessage>(8);
            let _ = tx
                .send(ExecuteClientMessage {
                    msg: Some(execute_client_message::Msg::Reattach(
                        omicos_proto::ExecuteReattach {
                            session_id: session.id.clone(),
                            call_id: call_id.to_owned(),
                        },
                    )),
                })
                .await;
            let mut client = ToolRunnerClient::new(InterceptedService::new(ch, self.creds.clone()))
                .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES);
            let mut req = omicos_servicekit::telemetry::traced_request(ReceiverStream::new(rx));
            omicos_auth::credentials::forward_principal(req.metadata_mut(), principal);
            match tokio::time::timeout(START_TIMEOUT, client.execute(req)).await {
                Ok(Ok(r)) => {
                    let runner = r
                        .metadata()
                        .get(RUNNER_NAME_KEY)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("unnamed")
                        .to_owned();
                    tracing::info!(session = %session.id, call_id, %runner, "re-attached to a call");
                    return Ok(Attached {
                        tx,
                        stream: r.into_inner(),
                        runner,
                        call_id: call_id.to_owned(),
                    });
                }
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {}
                Ok(Err(s)) => why.push(format!("{addr}: {}", s.message())),
                Err(_) => why.push(format!("{addr}: no answer within {START_TIMEOUT:?}")),
            }
        }
        Err(if why.is_empty() {
            "no tool-runner holds the call".into()
        } else {
            format!("no tool-runner holds the call ({})", why.join("; "))
        })
    }
}

/// A call followed again on the runner that holds it ([`Runner::reattach`]).
pub struct Attached {
    tx: mpsc::Sender<ExecuteClientMessage>,
    stream: tonic::Streaming<omicos_proto::ExecuteServerMessage>,
    runner: String,
    call_id: String,
}

impl Attached {
    /// Relays the call to the session until its result, as a call started
    /// here is. `asked`: the log already holds the call's approval request
    /// (it is waited for, not asked again).
    pub async fn follow(
        self,
        session: &SessionState,
        tag: &EventTag,
        cancel: &CancellationToken,
        asked: bool,
    ) -> ToolResult {
        follow(
            self.tx,
            self.stream,
            &self.runner,
            &self.call_id,
            session,
            tag,
            cancel,
            asked,
        )
        .await
    }
}

/// Relays one call's stream to the session until its result: progress and
/// output as events, approvals asked of the client and its answers sent
/// back, a cancel passed on. A stream that breaks is a lost runner (the
/// call is never re-run here: it may have had side effects).
#[allow(clippy::too_many_arguments)]
async fn follow(
    tx: mpsc::Sender<ExecuteClientMessage>,
    mut stream: tonic::Streaming<omicos_proto::ExecuteServerMessage>,
    runner: &str,
    call_id: &str,
    session: &SessionState,
    tag: &EventTag,
    cancel: &CancellationToken,
    mut asked: bool,
) -> ToolResult {
    let call_id = call_id.to_owned();
    let error = |msg: String| ToolResult {
        call_id: call_id.clone(),
        status: omicos_proto::ToolStatus::Error as i32,
        result: msg,
        ..Default::default()
    };
    let mut pending: Option<tokio::sync::oneshot::Receiver<crate::hub::ApprovalAnswer>> = None;
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            d = async { pending.as_mut().expect("guarded").await }, if pending.is_some() => {
                pending = None;
                let answer = d.unwrap_or(crate::hub::ApprovalAnswer::plain(Decision::Deny));
                let decision = answer.decision;
                session.clear_stored_approval(&call_id).await;
                session.emit(tag.event(chat_event::Kind::ToolApprovalResolved(ToolApprovalResolved {
                    call_id: call_id.clone(), decision: decision as i32, source: "client".into() }))).await;
                let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Approval(
                    ExecuteApproval { call_id: call_id.clone(), decision: decision as i32, rule: answer.rule })) }).await;
                continue;
            }
            _ = cancel.cancelled() => {
                let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Cancel(ExecuteCancel {})) }).await;
                if session.drop_approval(&call_id) {
                    session.clear_stored_approval(&call_id).await;
                }
                // Give the runner a moment to report the cancelled result, then drop the stream.
                return match tokio::time::timeout(std::time::Duration::from_secs(2), drain_result(&mut stream)).await {
                    Ok(Some(r)) => r,
                    _ => error("cancelled by the user".into()),
                };
            }
        };
        let msg = match next {
            Ok(Some(m)) => m,
            Ok(None) => {
                return error(format!(
                    "{RUNNER_LOST} ({runner}): it closed the call without a result; the call was not re-run (it may have had side effects)"
                ));
            }
            // The stream broke mid-call: the runner died or its connection
            // dropped. Never re-run: the call may have had side effects.
            Err(e) => {
                return error(format!(
                    "{RUNNER_LOST} ({runner}: {}); the call was not re-run (it may have had side effects)",
                    e.message()
                ));
            }
        };
        match msg.msg {
            Some(execute_server_message::Msg::Progress(p)) => {
                session
                    .emit(tag.event(chat_event::Kind::ToolProgress(ToolProgressEvent {
                        call_id: call_id.clone(),
                        progress: Some(p),
                    })))
                    .await;
            }
            Some(execute_server_message::Msg::Output(o)) => {
                session
                    .emit(
                        tag.event(chat_event::Kind::ToolOutputChunk(ToolOutputChunkEvent {
                            call_id: call_id.clone(),
                            chunk: Some(o),
                        })),
                    )
                    .await;
            }
            Some(execute_server_message::Msg::ApprovalRequired(a)) => {
                let call = crate::hub::AskedCall {
                    tool: a.tool_name.clone(),
                    arguments: serde_json::from_str(&a.arguments)
                        .unwrap_or(serde_json::Value::Null),
                };
                // Re-attached to a call whose approval the log already
                // asks for: waited for again, not asked twice; an answer
                // given meanwhile (through any replica) is taken as it is.
                let rx = if asked {
                    session.wait_approval_again(&call_id, call).await
                } else {
                    let rx = session.wait_approval(&call_id, call).await;
                    session
                        .emit(tag.event(chat_event::Kind::ToolApprovalRequest(
                            ToolApprovalRequest {
                                call_id: call_id.clone(),
                                tool_name: a.tool_name,
                                risk: a.risk,
                                summary: a.summary,
                                arguments: a.arguments,
                            },
                        )))
                        .await;
                    rx
                };
                asked = false;
                pending = Some(rx);
            }
            Some(execute_server_message::Msg::Result(r)) => {
                if pending.is_some() && session.drop_approval(&call_id) {
                    session.clear_stored_approval(&call_id).await;
                    // The runner stopped waiting: its approval timeout counts as a denial.
                    session
                        .emit(tag.event(chat_event::Kind::ToolApprovalResolved(
                            ToolApprovalResolved {
                                call_id: call_id.clone(),
                                decision: Decision::Deny as i32,
                                source: "timeout".into(),
                            },
                        )))
                        .await;
                }
                return r;
            }
            None => {}
        }
    }
}

async fn drain_result(
    stream: &mut tonic::Streaming<omicos_proto::ExecuteServerMessage>,
) -> Option<ToolResult> {
    while let Ok(Some(m)) = stream.message().await {
        if let Some(execute_server_message::Msg::Result(r)) = m.msg {
            return Some(r);
        }
    }
    None
}

/// Whether an Execute failed before any runner could have seen it: the
/// connection to the chosen runner was never made.
fn never_sent(s: &Status) -> bool {
    s.code() == tonic::Code::Unavailable && {
        let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
        let mut connect = s.message().contains("connect error");
        while let Some(e) = src {
            connect |= e.to_string().contains("connect error");
            src = e.source();
        }
        connect
    }
}

/// Whether a ListTools failure is the runner's absence rather than its answer.
fn retriable(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// Where discovery sends the healthy runners.
enum Balancer {
    /// tonic's balanced channel, which connects each endpoint itself.
    Plain(mpsc::Sender<Change<SocketAddr, Endpoint>>),
    /// [`tls_members`]: channels over the TLS connector.
    Tls(mpsc::Sender<TowerChange<SocketAddr, Channel>>, ClientTls),
}

impl Balancer {
    /// A channel to `ep`, verified as `host` over TLS.
    fn channel(&self, ep: &Endpoint, host: &str) -> Channel {
        match self {
            Self::Plain(_) => ep.connect_lazy(),
            Self::Tls(_, tls) => Channel::new(
                tls.connector()
                    .with_server_name(host)
                    .with_connect_timeout(Duration::from_secs(3)),
                ep.clone(),
            ),
        }
    }

    /// Adds a runner; false once the balancer is gone.
    async fn insert(&self, addr: SocketAddr, ep: &Endpoint, host: &str) -> bool {
        match self {
            Self::Plain(tx) => tx.send(Change::Insert(addr, ep.clone())).await.is_ok(),
            Self::Tls(tx, _) => tx
                .send(TowerChange::Insert(addr, self.channel(ep, host)))
                .await
                .is_ok(),
        }
    }

    /// Removes a runner; false once the balancer is gone.
    async fn remove(&self, addr: SocketAddr) -> bool {
        match self {
            Self::Plain(tx) => tx.send(Change::Remove(addr)).await.is_ok(),
            Self::Tls(tx, _) => tx.send(TowerChange::Remove(addr)).await.is_ok(),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Self::Plain(tx) => tx.is_closed(),
            Self::Tls(tx, _) => tx.is_closed(),
        }
    }
}

/// The runners as tower's power-of-two-choices balancer takes them (the
/// load of each is its requests in flight), as tonic's balanced channel does.
fn tls_members(rx: mpsc::Receiver<TowerChange<SocketAddr, Channel>>) -> TlsMembers {
    use futures::StreamExt;
    ReceiverStream::new(rx).map(member as fn(_) -> _)
}

type Member = tower::load::PendingRequests<Channel>;
type TlsMembers = futures::stream::Map<
    ReceiverStream<TowerChange<SocketAddr, Channel>>,
    fn(
        TowerChange<SocketAddr, Channel>,
    ) -> Result<TowerChange<SocketAddr, Member>, std::convert::Infallible>,
>;

fn member(
    c: TowerChange<SocketAddr, Channel>,
) -> Result<TowerChange<SocketAddr, Member>, std::convert::Infallible> {
    Ok(match c {
        TowerChange::Insert(k, ch) => TowerChange::Insert(
            k,
            tower::load::PendingRequests::new(ch, tower::load::CompleteOnResponse::default()),
        ),
        TowerChange::Remove(k) => TowerChange::Remove(k),
    })
}

fn transport_error(e: tonic::transport::Error) -> ChannelError {
    ChannelError(Box::new(e))
}

/// Keeps the balancer's set equal to the healthy runner addresses.
async fn discover(
    targets: Vec<RunnerTarget>,
    refresh: Duration,
    changes: Balancer,
    members: Members,
) {
    // address → (its endpoint, its target's host, a health client on it, whether it is in the balancer)
    let mut known: HashMap<SocketAddr, (Endpoint, String, Channel, bool)> = HashMap::new();
    loop {
        let mut addrs: HashMap<SocketAddr, RunnerTarget> = HashMap::new();
        for t in &targets {
            match tokio::net::lookup_host((t.host.as_str(), t.port)).await {
                Ok(found) => addrs.extend(found.map(|a| (a, t.clone()))),
                Err(e) => {
                    tracing::warn!(runner = %t.url, error = %e, "tool-runner name does not resolve")
                }
            }
        }
        for (addr, t) in &addrs {
            if known.contains_key(addr) {
                continue;
            }
            let url = format!("{}://{}", t.scheme, addr);
            let Ok(ep) = Endpoint::from_shared(url) else {
                continue;
            };
            let ep = ep
                .connect_timeout(Duration::from_secs(3))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5));
            let health = changes.channel(&ep, &t.host);
            known.insert(*addr, (ep, t.host.clone(), health, false));
        }
        let gone: Vec<SocketAddr> = known
            .keys()
            .filter(|a| !addrs.contains_key(a))
            .copied()
            .collect();
        for a in gone {
            if let Some((_, _, _, true)) = known.remove(&a) {
                let _ = changes.remove(a).await;
            }
        }
        for (addr, (ep, host, health, member)) in known.iter_mut() {
            let ok = healthy(health.clone()).await;
            if ok && !*member {
                tracing::info!(runner = %addr, "tool-runner joins the balancer");
                if !changes.insert(*addr, ep, host).await {
                    return;
                }
                *member = true;
            } else if !ok && *member {
                tracing::warn!(runner = %addr, "tool-runner leaves the balancer (health check failed)");
                if !changes.remove(*addr).await {
                    return;
                }
                *member = false;
            }
        }
        // Every address known, healthy or not: a runner that fails one
        // health check may still hold a call to re-attach to.
        *members.lock().expect("members") = known
            .iter()
            .map(|(a, (_, _, ch, _))| (*a, ch.clone()))
            .collect();
        if changes.is_closed() {
            return;
        }
        // Look again soon while none is healthy, so the first one is used at once.
        let wait = if known.values().any(|k| k.3) {
            refresh
        } else {
            refresh.min(Duration::from_millis(300))
        };
        tokio::time::sleep(wait).await;
    }
}

/// One grpc.health.v1 check of the runner as a whole.
async fn healthy(ch: Channel) -> bool {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let mut c = HealthClient::new(ch);
    matches!(
        tokio::time::timeout(HEALTH_TIMEOUT, c.check(HealthCheckRequest { service: String::new() })).await,
        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_lists_parse_and_a_bad_entry_is_named() {
        let t = parse_targets("http://a:7001, http://10.0.0.2:7001,https://[::1]").unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].host.as_str(), t[0].port), ("a", 7001));
        assert_eq!(
            (t[2].host.as_str(), t[2].port, t[2].scheme.as_str()),
            ("::1", 443, "https")
        );
        for (bad, named) in [
            ("http://a:7001,runner-b:7001", "runner-b:7001"),
            ("http://a:7001,,http://b", "empty entry"),
            ("http://a:7001,ftp://b", "ftp://b"),
            ("http://a:7001/x", "has a path"),
        ] {
            let e = parse_targets(bad).unwrap_err();
            assert!(e.contains(named), "{bad}: {e}");
        }
    }
}
