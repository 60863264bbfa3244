//! Session kernels: one kernel per chat session, a warm pool so a new
//! session does not wait for a start, idle culling, a per-instance cap, and
//! the markers that tell "new session" from "state lost on another instance".

use crate::config::KernelConfig;
use crate::interpreter::{self, Interpreter};
use crate::kernel::{Kernel, KernelError, StartOptions};
use crate::sandboxing::{KernelSandbox, SessionRef};
use omicos_toolkit::ToolError;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

/// A session's kernel state. Held (locked) for the whole of a cell, so one
/// session runs one cell at a time.
#[derive(Default)]
pub struct SessionState {
    /// The session's kernel, if it has one.
    pub kernel: Option<Arc<Kernel>>,
    /// Something the next call must tell the model (state lost, restarted).
    pub notice: Option<String>,
    /// The session had a kernel on this instance before.
    had_kernel: bool,
}

struct Slot {
    state: Arc<AsyncMutex<SessionState>>,
    last_used: Mutex<Instant>,
    /// The session's kernel, reachable while a cell holds `state`.
    live: Mutex<Option<std::sync::Weak<Kernel>>>,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, Arc<Slot>>,
    /// Started for no session yet: each in a box of its own under a
    /// placeholder session, which the session taking it adopts.
    warm: Vec<(Arc<Kernel>, SessionRef)>,
    /// Kernels starting, for the pool or for a session.
    starting: usize,
    /// Of `starting`, those the pool is starting (they will be warm).
    pool_starting: usize,
}

impl Inner {
    /// Sessions with a kernel; a slot in use (its state locked) counts as one.
    fn session_kernels(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| {
                s.state
                    .try_lock()
                    .map(|st| st.kernel.is_some())
                    .unwrap_or(true)
            })
            .count()
    }
}

/// All kernels of this instance.
pub struct Kernels {
    cfg: KernelConfig,
    env: Vec<(String, String)>,
    workspace: PathBuf,
    instance_id: String,
    inner: Mutex<Inner>,
    refill: Notify,
    /// Woken when a pool start ends (a warm kernel is ready, or the start failed).
    pool_started: Notify,
    stop: CancellationToken,
    sandbox: Arc<KernelSandbox>,
}

/// A session's kernel, locked for one call.
pub struct Lease {
    /// The locked state; `kernel` is Some.
    pub state: OwnedMutexGuard<SessionState>,
    /// Notices for this call's result.
    pub notices: Vec<String>,
}

impl Lease {
    /// The kernel.
    pub fn kernel(&self) -> Arc<Kernel> {
        self.state.kernel.clone().expect("a lease holds a kernel")
    }
}

/// A session id as a file name: safe characters kept, others hex-escaped.
pub fn session_file_name(session: &str) -> Result<String, ToolError> {
    let s = if session.is_empty() {
        "default"
    } else {
        session
    };
    if s.len() > 200 {
        return Err(ToolError::invalid(
            "the session id is longer than 200 bytes",
        ));
    }
    let mut out = String::new();
    for (i, b) in s.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    Ok(out)
}

impl Kernels {
    /// The manager; `workspace` is the default workspace (warm kernels start there).
    /// Call [`Kernels::spawn_background`] to run the pool refill and the culler.
    pub fn new(cfg: KernelConfig, workspace: PathBuf, env: Vec<(String, String)>) -> Arc<Self> {
        Arc::new(Self {
            sandbox: Arc::new(KernelSandbox::new(&cfg.sandbox)),
            cfg,
            env,
            workspace,
            instance_id: format!(
                "kernel-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            inner: Mutex::new(Inner::default()),
            refill: Notify::new(),
            pool_started: Notify::new(),
            stop: CancellationToken::new(),
        })
    }

    /// This instance's id (written in session markers).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The configuration.
    pub fn config(&self) -> &KernelConfig {
        &self.cfg
    }

    /// The interpreter for `workspace`.
    pub fn interpreter(&self, workspace: &Path) -> Interpreter {
        interpreter::resolve(&self.cfg.python, workspace, &self.env)
    }

    fn start_options(&self) -> StartOptions {
        StartOptions {
            startup_timeout: self.cfg.startup_timeout,
            heartbeat: self.cfg.heartbeat_interval,
            sandbox: self.sandbox.clone(),
        }
    }

    /// The sandbox kernels and installs run in.
    pub fn sandbox(&self) -> &KernelSandbox {
        &self.sandbox
    }

    /// Starts the warm pool and the idle culler. They stop with [`Kernels::close`].
    pub fn spawn_background(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let Some(k) = me.upgrade() else { return };
                k.fill_pool().await;
                tokio::select! {
                    _ = k.refill.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        if !self.cfg.idle_timeout.is_zero() {
            let me = Arc::downgrade(self);
            let stop = self.stop.clone();
            let every =
                (self.cfg.idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = stop.cancelled() => return,
                    }
                    let Some(k) = me.upgrade() else { return };
                    k.cull_idle(k.cfg.idle_timeout).await;
                }
            });
        }
    }

    /// Kernels running or starting, warm ones included.
    pub fn count(&self) -> usize {
        let inner = self.inner.lock().expect("kernels lock");
        inner.warm.len() + inner.starting + inner.session_kernels()
    }

    /// Kernels serving a session now (started, not warm).
    pub fn session_count(&self) -> usize {
        self.inner.lock().expect("kernels lock").session_kernels()
    }

    /// Warm kernels ready now.
    pub fn warm_count(&self) -> usize {
        self.inner.lock().expect("kernels lock").warm.len()
    }

    async fn fill_pool(&self) {
        loop {
            {
                let mut inner = self.inner.lock().expect("kernels lock");
                inner.warm.retain(|(k, _)| k.death().is_none());
                let total = inner.warm.len() + inner.starting + inner.session_kernels();
                if inner.warm.len() + inner.starting >= self.cfg.pool_size
                    || total >= self.cfg.max_kernels
                    || self.stop.is_cancelled()
                {
                    return;
                }
                inner.starting += 1;
                inner.pool_starting += 1;
            }
            let py = self.interpreter(&self.workspace);
            let who = SessionRef {
                tenant: String::new(),
                session: format!("warm-{}", uuid::Uuid::new_v4().simple()),
            };
            let r = Kernel::start(&py, &self.workspace, &self.start_options(), &who).await;
            let ok = {
                let mut inner = self.inner.lock().expect("kernels lock");
                inner.starting -= 1;
                inner.pool_starting -= 1;
                match r {
                    Ok(k) => {
                        inner.warm.push((k, who));
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "warm kernel did not start; the pool stays short");
                        false
                    }
                }
            };
            self.pool_started.notify_waiters();
            if !ok {
                return;
            }
        }
    }

    async fn cull_idle(&self, idle: Duration) {
        let slots: Vec<(String, Arc<Slot>)> = {
            let inner = self.inner.lock().expect("kernels lock");
            inner
                .sessions
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (session, slot) in slots {
            if slot.last_used.lock().expect("slot lock").elapsed() < idle {
                continue;
            }
            // A session running a cell is not idle.
            let Ok(mut st) = slot.state.clone().try_lock_owned() else {
                continue;
            };
            if let Some(k) = st.kernel.take() {
                tracing::info!(%session, kernel = %k.id, "culling idle kernel");
                k.shutdown().await;
                st.notice = Some(format!(
                    "this session's kernel was stopped after {} s without use; its variables are lost and a fresh kernel was started",
                    idle.as_secs()
                ));
                self.refill.notify_one();
            }
        }
    }

    /// Stops every kernel.
    pub async fn close(&self) {
        self.stop.cancel();
        let (warm, slots): (Vec<_>, Vec<_>) = {
            let mut inner = self.inner.lock().expect("kernels lock");
            (
                std::mem::take(&mut inner.warm),
                inner.sessions.values().cloned().collect(),
            )
        };
        for (k, who) in warm {
            k.shutdown().await;
            self.sandbox.end_session(&who);
        }
        for s in slots {
            if let Some(k) = s.state.lock().await.kernel.take() {
                k.shutdown().await;
            }
        }
    }

    /// The session's kernel, locked for one call: started (or taken from the
    /// pool) when the session has none, with notices when state was lost.
    pub async fn lease(
        &self,
        tenant: &str,
        session: &str,
        workspace: &Path,
    ) -> Result<Lease, ToolError> {
        let file = session_file_name(session)?;
        let slot = {
            let mut inner = self.inner.lock().expect("kernels lock");
            inner
                .sessions
                .entry(session.to_owned())
                .or_insert_with(|| {
                    Arc::new(Slot {
                        state: Arc::new(AsyncMutex::new(SessionState::default())),
                        last_used: Mutex::new(Instant::now()),
                        live: Mutex::new(None),
                    })
                })
                .clone()
        };
        let mut state = slot.state.clone().lock_owned().await;
        *slot.last_used.lock().expect("slot lock") = Instant::now();
        let mut notices = Vec::new();
        if let Some(n) = state.notice.take() {
            notices.push(n);
        }
        if let Some(why) = state.kernel.as_ref().and_then(|k| k.death()) {
            notices.push(format!("kernel restarted, variables lost: the previous kernel died ({why}). This call ran in a fresh kernel."));
            state.kernel = None;
            self.refill.notify_one();
        }
        if state.kernel.is_none() {
            if !state.had_kernel
                && let Some(n) = self.foreign_marker(workspace, &file)
            {
                notices.push(n);
            }
            let who = SessionRef {
                tenant: tenant.to_owned(),
                session: session.to_owned(),
            };
            let kernel = self.obtain(workspace, &who).await?;
            if kernel.cwd() != workspace {
                kernel
                    .chdir(workspace)
                    .await
                    .map_err(|e| ToolError::failed(e.to_string()))?;
            }
            self.write_marker(workspace, &file, &kernel);
            *slot.live.lock().expect("slot lock") = Some(Arc::downgrade(&kernel));
            state.kernel = Some(kernel);
            state.had_kernel = true;
        }
        Ok(Lease { state, notices })
    }

    /// Marks the end of a call (for idle culling).
    pub fn touch(&self, session: &str) {
        if let Some(s) = self
            .inner
            .lock()
            .expect("kernels lock")
            .sessions
            .get(session)
        {
            *s.last_used.lock().expect("slot lock") = Instant::now();
        }
    }

    /// The live kernel of a session, if any (without locking it for a call).
    pub fn session_kernel(&self, session: &str) -> Option<Arc<Kernel>> {
        let slot = self
            .inner
            .lock()
            .expect("kernels lock")
            .sessions
            .get(session)
            .cloned()?;
        slot.state.try_lock().ok().and_then(|s| s.kernel.clone())
    }

    async fn obtain(&self, workspace: &Path, who: &SessionRef) -> Result<Arc<Kernel>, ToolError> {
        let py = self.interpreter(workspace);
        // A session with packages of its own needs a kernel whose box binds
        // them: a warm kernel's box binds its own (empty) directory.
        let has_packages = KernelSandbox::packages_dir(workspace, &who.session)
            .ok()
            .and_then(|d| std::fs::read_dir(d).ok())
            .is_some_and(|mut d| d.next().is_some());
        loop {
            // Registered before the lock is released, so a pool start that ends
            // in between still wakes this call.
            let pool_started = self.pool_started.notified();
            tokio::pin!(pool_started);
            pool_started.as_mut().enable();
            {
                let mut inner = self.inner.lock().expect("kernels lock");
                inner.warm.retain(|(k, _)| k.death().is_none());
                if let Some(i) = inner
                    .warm
                    .iter()
                    // The sandbox's roots were fixed at start: only a kernel of this workspace fits.
                    .position(|(k, _)| {
                        !has_packages
                            && k.interpreter.python == py.python
                            && k.workspace() == workspace
                    })
                {
                    let (k, from) = inner.warm.remove(i);
                    drop(inner);
                    self.adopt(workspace, &from, who);
                    self.refill.notify_one();
                    return Ok(k);
                }
                // The session asking holds its own (kernel-less) lock: it counts as busy.
                let busy = inner.session_kernels().saturating_sub(1);
                let total = inner.warm.len() + inner.starting + busy;
                if total < self.cfg.max_kernels {
                    inner.starting += 1;
                    break;
                }
                if !inner.warm.is_empty() {
                    // A warm kernel of another interpreter or workspace gives way to a session.
                    inner.warm.remove(0);
                    inner.starting += 1;
                    break;
                }
                if inner.pool_starting == 0 {
                    return Err(ToolError::Unavailable(format!(
                        "this kernel instance already runs {total} kernels, its cap (kernel.max_kernels = {}); \
                         wait for idle sessions to be culled, or raise kernel.max_kernels",
                        self.cfg.max_kernels
                    )));
                }
            }
            // At the cap, but the pool is starting a kernel: it serves this
            // session (or gives way to it) once it is up.
            pool_started.await;
        }
        // Counted down even when the caller is cancelled mid-start.
        let _counted = StartingGuard(self);
        let r = Kernel::start(&py, workspace, &self.start_options(), who).await;
        r.map_err(|e| match e {
            KernelError::NoIpykernel { .. } => ToolError::Unavailable(e.to_string()),
            other => ToolError::failed(other.to_string()),
        })
    }

    /// A warm kernel becomes `to`'s: its boxes and its package directory
    /// (renamed: the box binds the directory, not its name).
    fn adopt(&self, workspace: &Path, from: &SessionRef, to: &SessionRef) {
        self.sandbox.adopt(from, to);
        if let (Ok(old), Ok(new)) = (
            KernelSandbox::packages_dir(workspace, &from.session),
            KernelSandbox::packages_dir(workspace, &to.session),
        ) && let (Some(old), Some(new)) = (old.parent(), new.parent())
        {
            let _ = std::fs::remove_dir_all(new);
            if let Err(e) = std::fs::rename(old, new) {
                tracing::warn!(error = %e, "cannot hand a warm kernel's package directory to its session");
            }
        }
    }

    /// Ends `who`'s kernel and everything it started (its box, the
    /// session's installs): DeleteSession and session expiry.
    pub async fn end_session(&self, who: &SessionRef) -> bool {
        let slot = self
            .inner
            .lock()
            .expect("kernels lock")
            .sessions
            .remove(&who.session);
        let mut stopped = false;
        if let Some(slot) = slot {
            // A cell running now holds the state: its kernel dies under it.
            let live = slot.live.lock().expect("slot lock").take();
            if let Some(k) = live.and_then(|w| w.upgrade()) {
                k.shutdown().await;
                stopped = true;
            }
            if let Ok(mut st) = slot.state.try_lock() {
                st.kernel = None;
            }
        }
        if self.sandbox.end_session(who) > 0 {
            stopped = true;
        }
        self.refill.notify_one();
        stopped
    }

    fn marker_path(workspace: &Path, file: &str) -> PathBuf {
        workspace
            .join(".omicos/kernels")
            .join(format!("{file}.json"))
    }

    fn foreign_marker(&self, workspace: &Path, file: &str) -> Option<String> {
        let text = std::fs::read_to_string(Self::marker_path(workspace, file)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let owner = v["instance"].as_str()?;
        (owner != self.instance_id).then(|| {
            format!(
                "this session's previous kernel (instance {owner}) is gone: its variables, imports and definitions are lost. \
                 This call ran in a fresh kernel; re-run the setup cells you need."
            )
        })
    }

    fn write_marker(&self, workspace: &Path, file: &str, kernel: &Kernel) {
        let path = Self::marker_path(workspace, file);
        let body = serde_json::json!({"instance": self.instance_id, "kernel": kernel.id, "pid": kernel.pid(), "started_ms": omicos_proto::now_ms()});
        let r = std::fs::create_dir_all(path.parent().expect("marker has a parent"))
            .and_then(|_| std::fs::write(&path, body.to_string()));
        if let Err(e) = r {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the session marker");
        }
    }
}

struct StartingGuard<'a>(&'a Kernels);
impl Drop for StartingGuard<'_> {
    fn drop(&mut self) {
        self.0.inner.lock().expect("kernels lock").starting -= 1;
    }
}
