//! The MCP servers of the config as one in-process [`Provider`] of the
//! runner: tools `mcp__<server>__<tool>` with their risk, each call routed to
//! the server's instance (one shared, or one per session), a dead instance
//! restarted on the next call, and `tools/list_changed` re-listing the tools
//! and telling the runner (`on_change`) so its catalog version moves.

use crate::client::{CallFailure, Launch, Live};
use crate::config::{McpConfig, ServerConfig};
use crate::naming;
use async_trait::async_trait;
use omicos_proto::ToolSpec;
use omicos_toolkit::{CallCtx, Provider, ToolError};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use tokio::sync::{Mutex, mpsc};

/// Called when the tool list of a server changed.
pub type OnChange = Arc<dyn Fn() + Send + Sync>;

/// The provider name of every MCP tool.
pub const PROVIDER: &str = "mcp";

/// A `per_session` instance's key: the tenant and the session (two tenants'
/// sessions never share an instance, whatever their ids).
type SessionKey = (String, String);

struct Tools {
    /// Qualified name → the server's own name.
    by_name: HashMap<String, String>,
    specs: Vec<ToolSpec>,
}

/// A `per_session` server's instance for one session, and when it was last used.
struct SessionSlot {
    live: Arc<Live>,
    last_used: std::time::Instant,
}

/// One configured server and its running instances.
pub struct Server {
    cfg: ServerConfig,
    workspace: PathBuf,
    /// The runner's sandbox, for servers whose policy confines them.
    sandbox: Result<Arc<omicos_sandbox::Sandbox>, String>,
    tools: RwLock<Tools>,
    /// The shared instance; for `per_session` servers, the one that lists tools.
    shared: Mutex<Option<Arc<Live>>>,
    sessions: Mutex<HashMap<SessionKey, SessionSlot>>,
    list_changed: mpsc::UnboundedSender<()>,
    status: RwLock<Result<(), String>>,
}

impl Server {
    /// The server's name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The last load error, if the server could not be loaded.
    pub fn status(&self) -> Result<(), String> {
        self.status
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .specs
            .clone()
    }

    fn own_name(&self, qualified: &str) -> Option<String> {
        self.tools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(qualified)
            .cloned()
    }

    /// Builds the tool index from `tools`, refusing collisions.
    fn set_tools(&self, tools: &[rmcp::model::Tool]) -> Result<(), naming::Collision> {
        let offered: Vec<&rmcp::model::Tool> = tools
            .iter()
            .filter(|t| !self.cfg.disabled_tools.iter().any(|d| d == t.name.as_ref()))
            .collect();
        let names = naming::qualify_all(&self.cfg.name, offered.iter().map(|t| t.name.as_ref()))?;
        let mut by_name = HashMap::new();
        let mut specs = Vec::new();
        for (t, (own, q)) in offered.iter().zip(names) {
            let hint = t.annotations.as_ref().and_then(|a| a.read_only_hint);
            let risk = self.cfg.risk_of(&own, hint);
            let description = t.description.as_deref().unwrap_or("").to_owned();
            let mut spec =
                omicos_toolkit::tool(&q, &description, Value::Object((*t.input_schema).clone()))
                    .risk(risk)
                    .toolset(&format!(
                        "{}{}",
                        omicos_toolkit::toolsets::MCP_SERVER_TOOLSET,
                        self.cfg.name
                    ))
                    .provider(PROVIDER);
            if let Some(out) = &t.output_schema {
                spec = spec.output_schema(Value::Object((**out).clone()));
            }
            specs.push(spec.build());
            by_name.insert(q, own);
        }
        *self.tools.write().unwrap_or_else(|e| e.into_inner()) = Tools { by_name, specs };
        Ok(())
    }

    /// Starts an instance: for `session` (a per-session one, in that
    /// session's box and tenant workspace), or the shared one (`None`: in a
    /// box of the server's own when its policy confines it).
    async fn start_live(&self, session: Option<(&SessionKey, &Path)>) -> Result<Arc<Live>, String> {
        let policy = self.cfg.sandbox_policy();
        let confined = self.cfg.command.is_some() && policy.is_confined();
        let workspace = session.map_or(self.workspace.as_path(), |(_, w)| w);
        let launch = if confined {
            let sandbox = self.sandbox.as_ref().map_err(|e| {
                format!(
                    "MCP server `{}` runs under the sandbox policy `{}`, but {e}",
                    self.cfg.name,
                    policy.as_str()
                )
            })?;
            let (tenant, session) = match session {
                Some(((t, s), _)) => (t.clone(), s.clone()),
                None => (String::new(), format!("mcp-server-{}", self.cfg.name)),
            };
            Launch::Boxed {
                sandbox,
                place: omicos_sandbox::Placement::new(tenant, session, workspace, policy)
                    .read(self.cfg.sandbox_read.iter().cloned()),
            }
        } else {
            Launch::Host
        };
        Live::start(
            &self.cfg,
            workspace,
            Some(self.list_changed.clone()),
            launch,
        )
        .await
        .map(Arc::new)
    }

    /// The instance for `session`: started, or restarted when it died.
    async fn instance(
        &self,
        session: Option<(&SessionKey, &Path)>,
    ) -> Result<Arc<Live>, ToolError> {
        if let Some((key, _)) = session {
            let mut map = self.sessions.lock().await;
            if let Some(slot) = map.get_mut(key).filter(|s| !s.live.is_closed()) {
                slot.last_used = std::time::Instant::now();
                return Ok(slot.live.clone());
            }
            let live = self
                .start_live(session)
                .await
                .map_err(ToolError::Unavailable)?;
            map.insert(
                key.clone(),
                SessionSlot {
                    live: live.clone(),
                    last_used: std::time::Instant::now(),
                },
            );
            return Ok(live);
        }
        let mut slot = self.shared.lock().await;
        if let Some(l) = slot.as_ref().filter(|l| !l.is_closed()) {
            return Ok(l.clone());
        }
        if slot.is_some() {
            tracing::warn!(server = %self.cfg.name, "MCP server is gone; restarting it");
        }
        let live = self
            .start_live(None)
            .await
            .map_err(ToolError::Unavailable)?;
        *slot = Some(live.clone());
        Ok(live)
    }

    /// Drops `live` if it is still the instance for `session`.
    async fn forget(&self, live: &Arc<Live>, session: Option<&SessionKey>) {
        if let Some(key) = session {
            let mut map = self.sessions.lock().await;
            if map.get(key).is_some_and(|s| Arc::ptr_eq(&s.live, live)) {
                map.remove(key);
            }
        } else {
            let mut slot = self.shared.lock().await;
            if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
                *slot = None;
            }
        }
        live.shutdown();
    }

    async fn call(&self, qualified: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let own = self
            .own_name(qualified)
            .ok_or_else(|| ToolError::UnknownTool(qualified.to_owned()))?;
        let key = (ctx.tenant.clone(), ctx.session_id.clone());
        let session = self
            .cfg
            .per_session
            .then_some((&key, ctx.workspace.as_path()));
        let live = self.instance(session).await?;
        match live
            .call(&own, args, ctx.events.clone(), ctx.cancel.clone())
            .await
        {
            Ok(r) => crate::result::convert(r, &ctx),
            Err(CallFailure::Dead(msg)) => {
                self.forget(&live, session.map(|(k, _)| k)).await;
                Err(ToolError::Failed(msg))
            }
            Err(CallFailure::Tool(e)) => Err(e),
        }
    }

    /// Stops the per-session instances unused for `session_idle_timeout` and
    /// not in a call (a call holds its own reference); returns how many.
    pub async fn reap_idle(&self) -> usize {
        let idle = self.cfg.session_idle_timeout;
        if !self.cfg.per_session || idle.is_zero() {
            return 0;
        }
        let mut map = self.sessions.lock().await;
        let before = map.len();
        map.retain(|(_, session), s| {
            let keep = !s.live.is_closed()
                && (Arc::strong_count(&s.live) > 1 || s.last_used.elapsed() < idle);
            if !keep {
                tracing::info!(server = %self.cfg.name, %session, "stopping an idle per-session MCP server");
                s.live.shutdown();
            }
            keep
        });
        before - map.len()
    }

    /// Stops the per-session instance of `tenant`'s `session` (the session
    /// ended); true when there was one.
    pub async fn end_session(&self, tenant: &str, session: &str) -> bool {
        let key = (tenant.to_owned(), session.to_owned());
        let Some(slot) = self.sessions.lock().await.remove(&key) else {
            return false;
        };
        tracing::info!(server = %self.cfg.name, %session, "session ended: stopping its MCP server");
        slot.live.shutdown();
        true
    }

    /// Per-session instances running now.
    pub async fn session_instances(&self) -> usize {
        self.sessions.lock().await.len()
    }

    /// Re-lists the tools from the listing instance; true when they changed.
    async fn refresh(&self) -> Result<bool, String> {
        let live = {
            let slot = self.shared.lock().await;
            slot.clone()
        };
        let Some(live) = live else { return Ok(false) };
        let tools = live.list_tools().await?;
        let before = self.specs();
        self.set_tools(&tools).map_err(|e| e.to_string())?;
        Ok(before != self.specs())
    }
}

/// Every configured MCP server, as one provider.
pub struct McpProvider {
    servers: Vec<Arc<Server>>,
}

impl McpProvider {
    /// Starts every server of `config` (in parallel, each within its startup
    /// timeout) and lists its tools. A server that fails to start or whose
    /// tool names collide is left out with its error (logged, and kept in
    /// [`Server::status`]); the others serve. `on_change` is called when a
    /// server's tool list changes.
    pub async fn start(config: &McpConfig, workspace: &Path, on_change: OnChange) -> Arc<Self> {
        let none = Err("the runner has no sandbox".to_owned());
        Self::start_with(config, workspace, none, on_change).await
    }

    /// [`McpProvider::start`] with the runner's sandbox, in which the servers
    /// whose policy confines them run (`per_session` ones by default). Without
    /// one, such a server is not loaded, and says why.
    pub async fn start_with(
        config: &McpConfig,
        workspace: &Path,
        sandbox: Result<Arc<omicos_sandbox::Sandbox>, String>,
        on_change: OnChange,
    ) -> Arc<Self> {
        let mut servers = Vec::new();
        let mut receivers = Vec::new();
        for cfg in &config.servers {
            let (tx, rx) = mpsc::unbounded_channel();
            servers.push(Arc::new(Server {
                cfg: cfg.clone(),
                workspace: workspace.to_owned(),
                sandbox: sandbox.clone(),
                tools: RwLock::new(Tools {
                    by_name: HashMap::new(),
                    specs: Vec::new(),
                }),
                shared: Mutex::new(None),
                sessions: Mutex::new(HashMap::new()),
                list_changed: tx,
                status: RwLock::new(Ok(())),
            }));
            receivers.push(rx);
        }
        futures::future::join_all(servers.iter().map(|s| load(s.clone()))).await;
        for (s, rx) in servers.iter().zip(receivers) {
            spawn_list_changed(Arc::downgrade(s), rx, on_change.clone());
            spawn_reaper(Arc::downgrade(s));
        }
        Arc::new(Self { servers })
    }

    /// The servers, in config order.
    pub fn servers(&self) -> &[Arc<Server>] {
        &self.servers
    }

    /// Load errors, one line per server that is not serving.
    pub fn errors(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|s| s.status().err())
            .collect()
    }

    fn server_of(&self, qualified: &str) -> Option<&Arc<Server>> {
        let rest = qualified.strip_prefix(naming::PREFIX)?;
        self.servers.iter().find(|s| {
            rest.strip_prefix(s.name())
                .is_some_and(|r| r.starts_with("__"))
        })
    }
}

async fn load(server: Arc<Server>) {
    let result = async {
        let live = server.start_live(None).await?;
        if let Err(e) = server.set_tools(&live.tools) {
            live.shutdown();
            return Err(e.to_string());
        }
        *server.shared.lock().await = Some(live);
        Ok(())
    }
    .await;
    if let Err(e) = &result {
        tracing::error!(server = %server.name(), error = %e, "MCP server not loaded");
    }
    *server.status.write().unwrap_or_else(|e| e.into_inner()) = result;
}

/// Reaps a `per_session` server's idle instances, checking every quarter of
/// its idle timeout (at least each second); stops with the server.
fn spawn_reaper(server: Weak<Server>) {
    let Some(s) = server.upgrade() else { return };
    let idle = s.cfg.session_idle_timeout;
    if !s.cfg.per_session || idle.is_zero() {
        return;
    }
    drop(s);
    let every = (idle / 4).max(std::time::Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(s) = server.upgrade() else { return };
            s.reap_idle().await;
        }
    });
}

fn spawn_list_changed(
    server: Weak<Server>,
    mut rx: mpsc::UnboundedReceiver<()>,
    on_change: OnChange,
) {
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Several notifications in a burst make one refresh.
            while rx.try_recv().is_ok() {}
            let Some(server) = server.upgrade() else {
                return;
            };
            match server.refresh().await {
                Ok(true) => {
                    tracing::info!(server = %server.name(), tools = server.specs().len(), "MCP tool list changed");
                    on_change();
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(server = %server.name(), error = %e, "MCP tools/list after list_changed failed")
                }
            }
        }
    });
}

#[async_trait]
impl Provider for McpProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.servers.iter().flat_map(|s| s.specs()).collect()
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let server = self
            .server_of(tool)
            .ok_or_else(|| ToolError::UnknownTool(tool.to_owned()))?;
        server.call(tool, args, ctx).await
    }

    async fn end_session(&self, tenant: &str, session: &str) -> u32 {
        let mut stopped = 0;
        for s in &self.servers {
            stopped += u32::from(s.end_session(tenant, session).await);
        }
        stopped
    }
}
