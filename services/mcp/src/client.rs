//! One running MCP server (a spawned stdio process or a streamable-HTTP
//! session): starting it within a deadline, listing its tools, and calling a
//! tool with progress, cancellation (`notifications/cancelled`) and a per-call
//! timeout. A server that dies fails the call in flight; the owner restarts it.

use crate::config::{ServerConfig, Transport};
use omicos_proto::ToolProgress;
use omicos_toolkit::{EventSink, ToolError};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest,
    Implementation, ProgressNotificationParam, ProgressToken, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Lines of a stdio server's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 20;

/// How long a failed start waits for the server's stderr to end, so the
/// error carries what the server said before it died (its last words are
/// often still in the pipe when the handshake fails).
const STDERR_DRAIN_ON_FAILURE: Duration = Duration::from_secs(2);

/// What the client side of a connection shares with the calls: where progress goes.
#[derive(Default)]
struct Shared {
    progress: Mutex<HashMap<ProgressToken, (EventSink, Instant)>>,
    list_changed: Option<mpsc::UnboundedSender<()>>,
}

/// The rmcp client handler: routes progress notifications to the call that
/// asked, and `tools/list_changed` to the owner.
#[derive(Clone)]
pub struct Handler {
    shared: Arc<Shared>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        p: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let sink = self
            .shared
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p.progress_token)
            .cloned();
        if let Some((sink, started)) = sink {
            sink.progress(progress_event(&p, started.elapsed())).await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(tx) = &self.shared.list_changed {
            let _ = tx.send(());
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("omicos", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// An MCP progress notification as a tool_progress event.
pub fn progress_event(p: &ProgressNotificationParam, elapsed: Duration) -> ToolProgress {
    let total = p.total.unwrap_or(0.0);
    let percent = if total > 0.0 {
        (p.progress / total * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    ToolProgress {
        bar_id: format!("mcp:{}", token_text(&p.progress_token)),
        label: p.message.clone().unwrap_or_default(),
        current: p.progress,
        total,
        percent,
        elapsed_s: elapsed.as_secs_f64(),
        done: total > 0.0 && p.progress >= total,
        message: p.message.clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn token_text(t: &ProgressToken) -> String {
    serde_json::to_value(t)
        .map(|v| match v {
            Value::String(s) => s,
            other => other.to_string(),
        })
        .unwrap_or_default()
}

/// Where a stdio server's process runs.
pub enum Launch<'a> {
    /// On the host, as the runner (an HTTP server ignores it).
    Host,
    /// In a sandbox box: the session's, or one of the server's own.
    Boxed {
        /// The runner's sandbox.
        sandbox: &'a omicos_sandbox::Sandbox,
        /// Whose box, which workspace, which policy.
        place: omicos_sandbox::Placement,
    },
}

/// A started server.
pub struct Live {
    server: String,
    /// A boxed server's process: dropping it (with the `Live`) kills the
    /// server and everything it started in the box.
    process: Mutex<Option<omicos_sandbox::Process>>,
    service: RunningService<RoleClient, Handler>,
    shared: Arc<Shared>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Its tools, as last listed.
    pub tools: Vec<Tool>,
    call_timeout: Duration,
}

/// Why a call failed, so the owner knows whether to restart the server.
#[derive(Debug)]
pub enum CallFailure {
    /// The server is gone (exited, connection lost): restart it next time.
    Dead(String),
    /// Anything else: the server stays.
    Tool(ToolError),
}

impl Live {
    /// Starts the server of `cfg` (cwd defaults to `workspace`), waits for
    /// `initialize` and the tool list within `startup_timeout`.
    pub async fn start(
        cfg: &ServerConfig,
        workspace: &Path,
        list_changed: Option<mpsc::UnboundedSender<()>>,
        launch: Launch<'_>,
    ) -> Result<Live, String> {
        let shared = Arc::new(Shared {
            progress: Mutex::default(),
            list_changed,
        });
        let handler = Handler {
            shared: shared.clone(),
        };
        let stderr: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let reader: Mutex<Option<tokio::task::JoinHandle<()>>> = Mutex::default();
        let name = cfg.name.clone();
        let process: Mutex<Option<omicos_sandbox::Process>> = Mutex::default();
        let connect = async {
            match (cfg.transport(), launch) {
                (
                    Transport::Stdio {
                        command,
                        args,
                        env,
                        cwd,
                    },
                    Launch::Boxed { sandbox, place },
                ) => {
                    use omicos_sandbox::Stdio;
                    let mut cmd = omicos_sandbox::Command::new(command.clone());
                    cmd.args(args.iter().cloned())
                        .cwd(cwd.clone().unwrap_or_else(|| place.workspace.clone()))
                        .stdin(Stdio::Piped)
                        .stdout(Stdio::Piped)
                        .stderr(Stdio::Piped);
                    for (k, v) in &env {
                        cmd.env(k.clone(), v.clone());
                    }
                    let mut proc = sandbox
                        .spawn(&place, cmd)
                        .await
                        .map_err(|e| format!("cannot start `{command}` in the sandbox: {e}"))?;
                    let (Some(stdin), Some(stdout)) = (proc.stdin.take(), proc.stdout.take())
                    else {
                        return Err("the sandbox gave no pipes for stdin and stdout".to_owned());
                    };
                    if let Some(err) = proc.stderr.take() {
                        *reader.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(spawn_stderr_reader(name.clone(), err, stderr.clone()));
                    }
                    *process.lock().unwrap_or_else(|e| e.into_inner()) = Some(proc);
                    handler
                        .clone()
                        .serve((stdout, stdin))
                        .await
                        .map_err(|e| format!("the MCP handshake failed: {e}"))
                }
                (
                    Transport::Stdio {
                        command,
                        args,
                        env,
                        cwd,
                    },
                    Launch::Host,
                ) => {
                    let mut cmd = tokio::process::Command::new(&command);
                    cmd.args(&args)
                        .envs(&env)
                        .current_dir(cwd.as_deref().unwrap_or(workspace))
                        .kill_on_drop(true);
                    let (proc, err) = TokioChildProcess::builder(cmd)
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .map_err(|e| format!("cannot start `{command}`: {e}"))?;
                    if let Some(err) = err {
                        *reader.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(spawn_stderr_reader(name.clone(), err, stderr.clone()));
                    }
                    handler
                        .clone()
                        .serve(proc)
                        .await
                        .map_err(|e| format!("the MCP handshake failed: {e}"))
                }
                (
                    Transport::Http {
                        url,
                        headers,
                        bearer_token,
                    },
                    _,
                ) => {
                    let mut map = HashMap::new();
                    for (k, v) in headers {
                        let k = http::HeaderName::from_bytes(k.as_bytes())
                            .map_err(|e| format!("header `{k}`: {e}"))?;
                        let v = http::HeaderValue::from_str(&v)
                            .map_err(|e| format!("header `{k}`: {e}"))?;
                        map.insert(k, v);
                    }
                    let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone())
                        .custom_headers(map);
                    if let Some(t) = bearer_token {
                        config = config.auth_header(t);
                    }
                    let transport = StreamableHttpClientTransport::from_config(config);
                    handler
                        .clone()
                        .serve(transport)
                        .await
                        .map_err(|e| format!("cannot connect to {url}: {e}"))
                }
            }
        };
        let deadline = Instant::now() + cfg.startup_timeout;
        // A failed start: let the stderr reader reach EOF (bounded) first.
        let tail = async |stderr: &Arc<Mutex<VecDeque<String>>>| {
            let handle = reader.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(h) = handle {
                let _ = tokio::time::timeout(STDERR_DRAIN_ON_FAILURE, h).await;
            }
            stderr_note(stderr)
        };
        let started = tokio::time::timeout(cfg.startup_timeout, connect).await;
        let service = match started {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(format!(
                    "MCP server `{name}` did not start: {e}{}",
                    tail(&stderr).await
                ));
            }
            Err(_) => {
                return Err(format!(
                    "MCP server `{name}` did not start within {} (no answer to `initialize`){}",
                    omicos_servicekit::config::duration::format(cfg.startup_timeout),
                    tail(&stderr).await
                ));
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let tools = match tokio::time::timeout(left, service.peer().list_all_tools()).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                return Err(format!(
                    "MCP server `{name}`: tools/list failed: {e}{}",
                    tail(&stderr).await
                ));
            }
            Err(_) => {
                return Err(format!(
                    "MCP server `{name}` did not list its tools within {}",
                    omicos_servicekit::config::duration::format(cfg.startup_timeout)
                ));
            }
        };
        tracing::info!(server = %name, tools = tools.len(), "MCP server started");
        Ok(Live {
            server: name,
            process,
            service,
            shared,
            stderr,
            tools,
            call_timeout: cfg.call_timeout,
        })
    }

    /// Whether the connection is gone (the process exited, the session closed).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
    }

    /// Lists the tools again (after `tools/list_changed`).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, String> {
        tokio::time::timeout(self.call_timeout, self.service.peer().list_all_tools())
            .await
            .map_err(|_| format!("MCP server `{}`: tools/list timed out", self.server))?
            .map_err(|e| format!("MCP server `{}`: tools/list failed: {e}", self.server))
    }

    /// Calls `tool` (the server's name for it). Progress goes to `events`;
    /// `cancel` sends `notifications/cancelled` and returns Cancelled; past
    /// the call timeout the request is cancelled too.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<rmcp::model::CallToolResult, CallFailure> {
        let arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                return Err(CallFailure::Tool(ToolError::invalid(format!(
                    "MCP tools take an object of arguments, got {other}"
                ))));
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Some(a) = arguments {
            params = params.with_arguments(a);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut handle = self
            .service
            .peer()
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .map_err(|e| self.failure(e))?;
        let token = handle.progress_token.clone();
        self.shared
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), (events, Instant::now()));
        let _unregister = Unregister(&self.shared, token);
        let timeout = tokio::time::sleep(self.call_timeout);
        tokio::pin!(timeout);
        let answer = tokio::select! {
            r = &mut handle.rx => r,
            _ = cancel.cancelled() => {
                let _ = handle.cancel(Some("cancelled by the omicos user".into())).await;
                return Err(CallFailure::Tool(ToolError::Cancelled));
            }
            _ = &mut timeout => {
                let _ = handle.cancel(Some("omicos call_timeout reached".into())).await;
                return Err(CallFailure::Tool(ToolError::failed(format!(
                    "the MCP tool `{tool}` of server `{}` did not answer within {} (call_timeout); the request was cancelled",
                    self.server,
                    omicos_servicekit::config::duration::format(self.call_timeout)
                ))));
            }
        };
        match answer {
            Err(_) => Err(self.failure(ServiceError::TransportClosed)),
            Ok(Err(e)) => Err(self.failure(e)),
            Ok(Ok(ServerResult::CallToolResult(r))) => Ok(r),
            Ok(Ok(other)) => Err(CallFailure::Tool(ToolError::failed(format!(
                "the MCP server `{}` answered tools/call with an unexpected result: {}",
                self.server,
                serde_json::to_string(&other).unwrap_or_default()
            )))),
        }
    }

    fn failure(&self, e: ServiceError) -> CallFailure {
        match e {
            ServiceError::McpError(e) => CallFailure::Tool(ToolError::failed(format!(
                "the MCP server `{}` refused the call: {} (code {})",
                self.server, e.message, e.code.0
            ))),
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                CallFailure::Dead(format!(
                    "the MCP server `{}` exited or lost its connection during the call, which did not finish; it will be restarted on the next call{}",
                    self.server,
                    stderr_note(&self.stderr)
                ))
            }
            other => CallFailure::Tool(ToolError::failed(format!(
                "MCP server `{}`: {other}",
                self.server
            ))),
        }
    }

    /// Closes the connection (a stdio child is killed).
    pub fn shutdown(&self) {
        self.service.cancellation_token().cancel();
        // A boxed server: kill it and whatever it started in its box.
        if let Some(p) = self
            .process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            p.signaller().kill();
        }
    }
}

struct Unregister<'a>(&'a Shared, ProgressToken);

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.0
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

fn spawn_stderr_reader(
    server: String,
    err: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(err).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(server = %server, "mcp stderr: {line}");
            let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == STDERR_TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    })
}

fn stderr_note(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    let t = tail.lock().unwrap_or_else(|e| e.into_inner());
    if t.is_empty() {
        String::new()
    } else {
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        format!("; its stderr ended with:\n{}", lines.join("\n"))
    }
}
