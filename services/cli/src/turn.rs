//! One turn over the Chat stream: print events as they come, answer approval
//! requests, cancel on Ctrl-C (a second Ctrl-C exits), and re-attach with
//! `since_seq` when the stream drops so no event is missed or repeated.

use crate::error::CliError;
use crate::input::{Input, Line};
use crate::render::{Renderer, decision_words};
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelRequest, CancelTurnRequest, ChatClientMessage,
    ChatEvent, ChatRequest, Decision, ToolApprovalRequest, chat_client_message, chat_event::Kind,
    orchestrator_client::OrchestratorClient, orchestrator_web_client::OrchestratorWebClient,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

/// A client of the orchestrator; its calls carry the bearer token.
pub type Client = OrchestratorClient<omicos_auth::AuthedChannel>;

/// A client of the orchestrator's unary turn API (StartTurn), which the
/// REPL uses to steer a running turn without a second bidi stream.
pub type WebClient = OrchestratorWebClient<omicos_auth::AuthedChannel>;

/// The token `connect` sends, once found ([`set_token`], or [`find_token`]).
static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the token every later [`connect`] sends (empty: none).
pub fn set_token(token: String) {
    let _ = TOKEN.set(token);
}

/// The token to send: `OMICOS_TOKEN`, else the first of `files` that holds one
/// (`<workspace>/.omicos/token` of `omicos up`), else none.
pub fn find_token(explicit: Option<&str>, files: &[std::path::PathBuf]) -> String {
    if let Some(t) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return t.to_owned();
    }
    for f in files {
        if let Ok(t) = std::fs::read_to_string(f)
            && !t.trim().is_empty()
        {
            return t.trim().to_owned();
        }
    }
    String::new()
}

/// The CA file `--ca` named (empty: the system's roots for `https://`).
static CA: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the CA bundle every later `https://` connection verifies the server
/// with (`--ca`, `OMICOS_CA`); empty: the system's roots.
pub fn set_ca(path: String) {
    let _ = CA.set(path);
}

/// The client certificate and key `--cert`/`--key` named.
static CLIENT_CERT: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();

/// Sets the client certificate and key (PEM files) every later `https://`
/// connection presents when the server asks for one (`--cert`, `--key`).
pub fn set_client_cert(cert: String, key: String) {
    let _ = CLIENT_CERT.set((cert, key));
}

/// What to do about a TLS failure, from the error's text (its chain).
fn tls_hint(chain: &str) -> Option<&'static str> {
    if chain.contains("UnknownIssuer") || chain.contains("invalid peer certificate") {
        Some(
            "the server's certificate is not signed by a CA this client trusts: pass --ca <file> (OMICOS_CA) with the CA that signed it",
        )
    } else if chain.contains("CertificateRequired") {
        Some(
            "the server asks for a client certificate (mutual TLS): pass --cert <file> --key <file> with one from the CA in its tls.client_ca",
        )
    } else if chain.contains("alert: UnknownCA")
        || chain.contains("alert: BadCertificate")
        || chain.contains("alert: CertificateUnknown")
        || chain.contains("alert: AccessDenied")
    {
        Some(
            "the server refused this client's certificate: --cert must be signed by the CA in the server's tls.client_ca",
        )
    } else if chain.contains("TLS handshake") || chain.contains("InvalidContentType") {
        Some("the TLS handshake failed: check that the server speaks https and --ca names its CA")
    } else {
        None
    }
}

/// A failed call's status as an error: a TLS refusal that only shows on
/// the first request says what to do, like a failed connect. TLS 1.3 sends
/// the alert that refuses a client certificate (or its absence) after the
/// handshake, so the call fails instead; and when the connection is gone
/// before the call was written, the call says only `operation was canceled`
/// (or a closed connection), without the alert. An `https://` call that
/// fails that way right after a good handshake is then read as that refusal.
pub fn call_error(url: &str, status: tonic::Status) -> CliError {
    let chain = error_chain(&status);
    let hint = tls_hint(&chain).or_else(|| {
        let closed = matches!(
            status.code(),
            tonic::Code::Cancelled | tonic::Code::Unavailable | tonic::Code::Unknown
        ) && ["canceled", "cancelled", "transport error", "connection", "broken pipe"]
            .iter()
            .any(|w| chain.to_lowercase().contains(w));
        (closed && url.starts_with("https://")).then(|| {
            if CLIENT_CERT.get().is_some() {
                "the server closed the connection right after the TLS handshake, as one that refused this client's certificate does: --cert must be signed by the CA in the server's tls.client_ca"
            } else {
                "the server closed the connection right after the TLS handshake, as one that asks for a client certificate (mutual TLS) does: pass --cert <file> --key <file> with one from the CA in its tls.client_ca"
            }
        })
    });
    match hint {
        Some(hint) => CliError::Connect(format!("{url}: {chain} ({hint})")),
        None => CliError::Rpc(status),
    }
}

/// A channel to `url`: plain for `http://`; for `https://`, TLS verified
/// with the `--ca` file ([`set_ca`]), or with `ca` when given, presenting
/// the `--cert`/`--key` client certificate ([`set_client_cert`]) when set.
/// Errors say what to do, a certificate from an unknown CA among them;
/// `what` names the server in them (`the orchestrator`).
pub async fn channel(
    url: &str,
    ca: Option<&str>,
    what: &str,
    connect_timeout: Duration,
) -> Result<tonic::transport::Channel, CliError> {
    let ep = Endpoint::from_shared(url.to_owned())
        .map_err(|e| CliError::Usage(format!("`{url}` is not a valid server URL: {e}")))?
        .connect_timeout(connect_timeout);
    let connected = if ep.uri().scheme_str() == Some("https") {
        let ca = ca
            .map(str::to_owned)
            .unwrap_or_else(|| CA.get().cloned().unwrap_or_default());
        let (cert, key) = CLIENT_CERT.get().cloned().unwrap_or_default();
        let tls = omicos_servicekit::tls::client_with_identity(&ca, &cert, &key)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let connector = tls.connector().with_connect_timeout(connect_timeout);
        tonic::transport::Channel::connect(connector, ep).await
    } else {
        ep.connect().await
    };
    connected.map_err(|e| {
        let chain = error_chain(&e);
        let hint = tls_hint(&chain)
            .unwrap_or("start it with `omicos up`, or point --server / OMICOS_SERVER at it");
        CliError::Connect(format!("cannot reach {what} at {url}: {chain} ({hint})"))
    })
}

/// Connects to the orchestrator at `url` with the token [`set_token`] gave.
pub async fn connect(url: &str) -> Result<Client, CliError> {
    let token = TOKEN.get().cloned().unwrap_or_default();
    connect_with(url, &token).await
}

/// Connects to the orchestrator at `url`, sending `token` (empty: none), with
/// a message that says what to do when nothing answers there.
pub async fn connect_with(url: &str, token: &str) -> Result<Client, CliError> {
    connect_with_ca(url, token, None).await
}

/// [`connect_with`], an `https://` server verified with the CA bundle in
/// the file `ca` (None: the one `--ca` set; `Some("")`: the system's roots).
pub async fn connect_with_ca(url: &str, token: &str, ca: Option<&str>) -> Result<Client, CliError> {
    let creds = omicos_auth::Credentials::bearer(token)
        .map_err(|e| CliError::Usage(format!("the token: {e}")))?;
    let ch = channel(url, ca, "the orchestrator", Duration::from_secs(5)).await?;
    Ok(OrchestratorClient::new(creds.channel(ch)))
}

/// Connects the StartTurn client to the orchestrator at `url`, with the
/// token [`set_token`] gave.
pub async fn connect_web(url: &str) -> Result<WebClient, CliError> {
    let token = TOKEN.get().cloned().unwrap_or_default();
    let creds = omicos_auth::Credentials::bearer(&token)
        .map_err(|e| CliError::Usage(format!("the token: {e}")))?;
    let ch = channel(url, None, "the orchestrator", Duration::from_secs(5)).await?;
    Ok(OrchestratorWebClient::new(creds.channel(ch)))
}

/// A line typed while a turn streams is steered into it: the REPL's input
/// (the same line editor as its prompt, so the two never compete for stdin),
/// the client it sends the message with (StartTurn with `steer`), and the
/// turn's request (its agent, team and mode go with the message).
pub struct Steering<'a> {
    /// The terminal's line editor.
    pub input: &'a Input,
    /// StartTurn.
    pub web: WebClient,
    /// The request that started the turn.
    pub request: ChatRequest,
}

/// Resolves when stdin holds a line: between prompts the terminal is in
/// cooked mode, so stdin turns readable only once Enter is pressed. Nothing
/// is read here (the line editor reads it); without `fd` it never resolves.
///
/// The reactor's readiness can be stale: a line answered at the approval
/// prompt made stdin readable, and the editor consumed it since. So stdin is
/// asked again (poll with no wait) before the line counts as typed; else the
/// loop would sit in a steer prompt nobody types into while the turn's
/// events wait.
async fn line_typed(fd: Option<&tokio::io::unix::AsyncFd<std::io::Stdin>>) {
    let Some(fd) = fd else {
        return std::future::pending::<()>().await;
    };
    loop {
        let Ok(mut g) = fd.readable().await else {
            return std::future::pending::<()>().await;
        };
        g.clear_ready();
        if holds_input(fd.get_ref()) {
            return;
        }
    }
}

/// Whether a read of `fd` would return at once (data or end of input).
fn holds_input(fd: impl std::os::fd::AsFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
        }),
        // Interrupted or refused: count it as typed, as the reactor said.
        Err(_) => true,
        Ok(_) => false,
    }
}

/// What became of a line typed while the turn ran.
enum Steered {
    /// Sent (or nothing to send).
    Done,
    /// The turn had ended, so the message started the next one; its
    /// TurnStarted is at this seq.
    NewTurn(u64),
    /// Ctrl-C at the line editor: a cancel, as a Ctrl-C signal is.
    Interrupted,
}

/// Reads the typed line and steers it into the running turn of `session_id`.
async fn steer_line(st: &Steering<'_>, session_id: &str, r: &mut Renderer) -> Steered {
    let prompt = r.style().bold("steer> ");
    let text = match st.input.read(&prompt, true).await {
        Line::Text(t) => t,
        Line::Interrupted => return Steered::Interrupted,
        Line::Eof => return Steered::Done,
    };
    let text = text.trim();
    if text.is_empty() {
        return Steered::Done;
    }
    if session_id.is_empty() {
        r.notice("  (not sent: the turn has not started yet; type it again in a moment)");
        return Steered::Done;
    }
    let req = ChatRequest {
        session_id: session_id.to_owned(),
        message: text.to_owned(),
        steer: true,
        ..st.request.clone()
    };
    match st.web.clone().start_turn(req).await {
        Ok(resp) if resp.get_ref().steered => {
            r.notice("  (sent to the running turn: it reads it at its next step)");
            Steered::Done
        }
        Ok(resp) => {
            r.notice("  (the turn was ending, so the message starts the next turn; shown after this one)");
            Steered::NewTurn(resp.get_ref().start_seq)
        }
        Err(s) => {
            r.notice(&format!(
                "  the message did not reach the running turn: {}",
                status_text(&s)
            ));
            Steered::Done
        }
    }
}

/// An error and its sources on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// A gRPC status as a short sentence.
pub fn status_text(s: &tonic::Status) -> String {
    let msg = s.message();
    if s.code() == tonic::Code::Unauthenticated {
        return format!(
            "{msg} (Unauthenticated): pass the token `omicos up` printed with --token or OMICOS_TOKEN, \
             or --token-file <workspace>/.omicos/token"
        );
    }
    if msg.is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{msg} ({:?})", s.code())
    }
}

/// Ctrl-C presses, delivered as messages while a turn runs (the REPL's line
/// editor reads its own Ctrl-C in raw mode).
pub struct Interrupts {
    rx: mpsc::UnboundedReceiver<()>,
}

impl Interrupts {
    /// Catches SIGINT from now on: it no longer kills the process.
    pub fn install() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        // One SIGINT stream for the whole run: a fresh `ctrl_c()` per press
        // would miss a press that lands between two calls.
        #[cfg(unix)]
        tokio::spawn(async move {
            let Ok(mut sig) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            else {
                return;
            };
            while sig.recv().await.is_some() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        #[cfg(not(unix))]
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        Self { rx }
    }

    /// Forgets presses made before the turn started.
    fn drain(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// The next press. A line editor in raw mode reads Ctrl-C itself, but on
    /// a dumb terminal it reads in cooked mode and Ctrl-C is a signal: prompts
    /// wait for this too.
    pub async fn pressed(&mut self) {
        if self.rx.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// Who answers approval requests.
pub enum Approver<'a> {
    /// Ask at the terminal: y = once, a = always this session, n = deny.
    Prompt(&'a Input),
    /// Answer every request with this decision and say so (the demo).
    Auto(Decision),
    /// Deny: nobody is there to ask (piped stdin).
    Deny,
}

impl Approver<'_> {
    /// The decision for `a`; None when the user pressed Ctrl-C (deny and cancel).
    async fn decide(
        &self,
        r: &mut Renderer,
        context: &str,
        a: &ToolApprovalRequest,
        ints: &mut Interrupts,
    ) -> Option<Decision> {
        match self {
            Approver::Auto(d) => {
                r.notice_in(
                    context,
                    &format!(
                        "  (demo) answering the approval for {}: {}",
                        a.tool_name,
                        decision_words(*d)
                    ),
                );
                Some(*d)
            }
            Approver::Deny => {
                r.notice_in(
                    context,
                    &format!(
                    "  approval needed for {} but stdin is not a terminal: denied (use --mode full to let tools with side effects run)",
                    a.tool_name
                ),
                );
                Some(Decision::Deny)
            }
            Approver::Prompt(input) => {
                let prompt = r
                    .style()
                    .yellow("  allow? [y] once  [a] always this session  [n] deny > ");
                loop {
                    let line = tokio::select! {
                        l = input.read(&prompt, false) => l,
                        _ = ints.pressed() => Line::Interrupted,
                    };
                    match line {
                        Line::Text(t) => match parse_answer(&t) {
                            Some(d) => return Some(d),
                            None => r.notice_in(context, "  please answer y, a or n"),
                        },
                        Line::Interrupted => return None,
                        Line::Eof => return Some(Decision::Deny),
                    }
                }
            }
        }
    }
}

/// y/yes/once → allow once; a/always/session → allow for the session; n/no/deny → deny.
pub fn parse_answer(t: &str) -> Option<Decision> {
    match t.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "once" | "allow" | "allow_once" => Some(Decision::AllowOnce),
        "a" | "always" | "session" | "allow_session" => Some(Decision::AllowSession),
        "n" | "no" | "deny" => Some(Decision::Deny),
        _ => None,
    }
}

/// How a turn went.
#[derive(Clone, Debug, Default)]
pub struct TurnResult {
    /// The session (new sessions get their id from the first event).
    pub session_id: String,
    /// How the turn ended (unspecified when the stream ended without turn_done).
    pub reason: omicos_proto::TurnDoneReason,
    /// Error events: (kind, message).
    pub errors: Vec<(String, String)>,
    /// Every event but heartbeats, in order.
    pub events: Vec<ChatEvent>,
    /// The root agent's text.
    pub answer: String,
    /// How many times the stream was re-attached.
    pub reattached: u32,
    /// A line typed during this turn reached the server after it ended and
    /// started the next turn, whose TurnStarted is at this seq: follow it.
    pub next_turn: Option<u64>,
}

/// Why a turn did not end with a TurnDone.
#[derive(Debug)]
pub enum TurnError {
    /// The turn could not start or be followed.
    Failed(CliError),
    /// Ctrl-C twice: the user wants out.
    Exit,
}

/// How long a silent stream is trusted (the server sends heartbeats every 15 s by default).
const IDLE: Duration = Duration::from_secs(60);
/// Consecutive re-attach attempts before giving up.
const REATTACH_TRIES: u32 = 20;

/// Runs one turn: sends `req` on a Chat stream and follows it to TurnDone.
/// With `steering`, a line typed meanwhile is steered into the turn.
pub async fn run_turn(
    client: &mut Client,
    req: ChatRequest,
    r: &mut Renderer,
    approver: &Approver<'_>,
    ints: &mut Interrupts,
    steering: Option<&Steering<'_>>,
) -> Result<TurnResult, TurnError> {
    r.begin_turn();
    ints.drain();
    let (tx, rx) = mpsc::channel(8);
    let first = ChatClientMessage {
        msg: Some(chat_client_message::Msg::Request(req.clone())),
    };
    tx.send(first).await.map_err(|_| {
        TurnError::Failed(CliError::Turn("chat stream closed before it opened".into()))
    })?;
    let stream = client
        .chat(ReceiverStream::new(rx))
        .await
        .map_err(|s| TurnError::Failed(CliError::Rpc(s)))?
        .into_inner();
    // Kept so the server keeps reading our side of the stream (cancel falls back to it).
    let res = TurnResult {
        session_id: req.session_id.clone(),
        ..Default::default()
    };
    follow(
        client,
        stream,
        Some(tx),
        res,
        0,
        r,
        approver,
        ints,
        steering,
    )
    .await
}

/// Follows a turn that started without this client's Chat stream (a line
/// steered in just after the turn it was meant for ended starts its own):
/// Attach from `since_seq`, then as [`run_turn`] does.
pub async fn follow_started(
    client: &mut Client,
    session_id: &str,
    since_seq: u64,
    r: &mut Renderer,
    approver: &Approver<'_>,
    ints: &mut Interrupts,
    steering: Option<&Steering<'_>>,
) -> Result<TurnResult, TurnError> {
    r.begin_turn();
    ints.drain();
    let stream = client
        .attach(AttachRequest {
            session_id: session_id.to_owned(),
            since_seq,
        })
        .await
        .map_err(|s| TurnError::Failed(CliError::Rpc(s)))?
        .into_inner();
    let res = TurnResult {
        session_id: session_id.to_owned(),
        ..Default::default()
    };
    follow(
        client, stream, None, res, since_seq, r, approver, ints, steering,
    )
    .await
}

/// The event loop of a turn: prints events, answers approvals, cancels on
/// Ctrl-C, steers typed lines in, re-attaches a dropped stream; ends at the
/// turn's TurnDone.
#[allow(clippy::too_many_arguments)]
async fn follow(
    client: &mut Client,
    mut stream: tonic::Streaming<ChatEvent>,
    mut chat_tx: Option<mpsc::Sender<ChatClientMessage>>,
    mut res: TurnResult,
    mut last_seq: u64,
    r: &mut Renderer,
    approver: &Approver<'_>,
    ints: &mut Interrupts,
    steering: Option<&Steering<'_>>,
) -> Result<TurnResult, TurnError> {
    let mut cancelling = false;
    // Watched for a typed line only while steering (a terminal: epoll takes it).
    let stdin = steering.and_then(|_| {
        // SAFETY: the fd is the process's stdin (0), which stays open and is
        // never replaced while the turn runs; the AsyncFd only watches it
        // (the line editor reads it) and is dropped when the turn ends.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                std::io::stdin(),
                tokio::io::Interest::READABLE,
            )
        }
        .ok()
    });
    loop {
        let next = tokio::select! {
            m = tokio::time::timeout(IDLE, stream.message()) => m,
            Some(()) = ints.rx.recv() => {
                if cancelling {
                    return Err(TurnError::Exit);
                }
                cancelling = true;
                r.notice("cancelling the turn… (Ctrl-C again to exit)");
                cancel(client, &res.session_id, chat_tx.as_ref()).await;
                continue;
            }
            () = line_typed(stdin.as_ref()), if !cancelling => {
                let Some(st) = steering else { continue };
                match steer_line(st, &res.session_id, r).await {
                    Steered::Done => {}
                    Steered::NewTurn(seq) => res.next_turn = Some(seq),
                    Steered::Interrupted => {
                        cancelling = true;
                        r.notice("cancelling the turn… (Ctrl-C again to exit)");
                        cancel(client, &res.session_id, chat_tx.as_ref()).await;
                    }
                }
                continue;
            }
        };
        let ev = match next {
            Ok(Ok(Some(ev))) => ev,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                let why = match next {
                    Ok(Err(s)) => status_text(&s),
                    Err(_) => format!("no event for {} s", IDLE.as_secs()),
                    _ => "the stream ended before the turn did".into(),
                };
                if res.session_id.is_empty() {
                    return Err(TurnError::Failed(CliError::Turn(format!(
                        "the chat stream broke before the session started: {why}"
                    ))));
                }
                stream = reattach(client, &res.session_id, last_seq, r, &why).await?;
                res.reattached += 1;
                chat_tx = None;
                continue;
            }
        };
        if matches!(ev.kind, Some(Kind::Heartbeat(_))) {
            continue;
        }
        // A re-attach may replay what we already have; one-shot errors carry seq 0.
        if ev.event_seq != 0 && ev.event_seq <= last_seq {
            continue;
        }
        last_seq = last_seq.max(ev.event_seq);
        if res.session_id.is_empty() {
            res.session_id = ev.session_id.clone();
        }
        r.event(&ev);
        res.events.push(ev.clone());
        match ev.kind {
            Some(Kind::Error(e)) => res.errors.push((e.kind, e.message)),
            Some(Kind::TurnDone(t)) => {
                res.reason = t.reason();
                res.answer = r.answer.clone();
                return Ok(res);
            }
            Some(Kind::ToolApprovalRequest(a)) => {
                let decision = match approver.decide(r, &ev.execution_context_id, &a, ints).await {
                    Some(d) => d,
                    None => {
                        cancelling = true;
                        r.notice("denied; cancelling the turn… (Ctrl-C again to exit)");
                        cancel(client, &res.session_id, chat_tx.as_ref()).await;
                        Decision::Deny
                    }
                };
                let ask = ApproveToolRequest {
                    session_id: res.session_id.clone(),
                    call_id: a.call_id.clone(),
                    decision: decision as i32,
                    rule: String::new(),
                };
                if let Err(s) = client.approve_tool(ask).await {
                    r.notice(&format!(
                        "  the approval was not taken: {}",
                        status_text(&s)
                    ));
                }
            }
            _ => {}
        }
    }
}

async fn cancel(
    client: &mut Client,
    session_id: &str,
    chat_tx: Option<&mpsc::Sender<ChatClientMessage>>,
) {
    if !session_id.is_empty()
        && client
            .cancel_turn(CancelTurnRequest {
                session_id: session_id.to_owned(),
            })
            .await
            .is_ok()
    {
        return;
    }
    if let Some(tx) = chat_tx {
        let msg = ChatClientMessage {
            msg: Some(chat_client_message::Msg::Cancel(CancelRequest {
                reason: "ctrl-c".into(),
            })),
        };
        let _ = tx.send(msg).await;
    }
}

async fn reattach(
    client: &mut Client,
    session_id: &str,
    since_seq: u64,
    r: &mut Renderer,
    why: &str,
) -> Result<tonic::Streaming<ChatEvent>, TurnError> {
    let mut delay = Duration::from_millis(100);
    let mut last_err = String::new();
    for _ in 0..REATTACH_TRIES {
        match client
            .attach(AttachRequest {
                session_id: session_id.to_owned(),
                since_seq,
            })
            .await
        {
            Ok(s) => {
                r.notice(&format!(
                    "(stream dropped: {why}; re-attached after event {since_seq})"
                ));
                return Ok(s.into_inner());
            }
            Err(s) if s.code() == tonic::Code::NotFound => {
                return Err(TurnError::Failed(CliError::Rpc(s)));
            }
            Err(s) => last_err = status_text(&s),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
    Err(TurnError::Failed(CliError::Turn(format!(
        "the stream dropped ({why}) and re-attaching failed {REATTACH_TRIES} times: {last_err}; the turn may still be running: \
         `omicos sessions show {session_id}`"
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_decisions() {
        assert_eq!(parse_answer("y"), Some(Decision::AllowOnce));
        assert_eq!(parse_answer(" A "), Some(Decision::AllowSession));
        assert_eq!(parse_answer("n"), Some(Decision::Deny));
        assert_eq!(parse_answer("maybe"), None);
    }

    /// A line the editor already consumed no longer counts as typed (the
    /// reactor's readiness for it is stale), a fresh one does, and so does
    /// the end of input.
    #[test]
    fn only_a_line_still_waiting_counts_as_typed() {
        use std::io::{Read, Write};
        let (mut rx, mut tx) = std::io::pipe().unwrap();
        assert!(!holds_input(&rx), "nothing written yet");
        tx.write_all(b"y\n").unwrap();
        assert!(holds_input(&rx), "a line waits");
        let mut buf = [0u8; 2];
        rx.read_exact(&mut buf).unwrap();
        assert!(!holds_input(&rx), "the line was read by someone else");
        drop(tx);
        assert!(holds_input(&rx), "the end of input is news too");
    }
}
