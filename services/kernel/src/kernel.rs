//! One Jupyter kernel process: launch over IPC in a private 0700 directory,
//! in its own process group; the channels, read continuously by their own
//! tasks; death detection (process exit, heartbeat); executing a cell with
//! the timeout → interrupt_request → SIGINT → kill escalation.

use crate::interpreter::{Interpreter, SETUP_HINT};
use crate::output::{CellOutput, StreamSplitter};
use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, ExecutionState, InterruptRequest, JupyterMessage,
    JupyterMessageContent, KernelInfoRequest, ReplyStatus, ShutdownRequest, Transport,
};
use jupyter_zmq_client as jzc;
use omicos_toolkit::EventSink;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

/// A kernel could not be started or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// The interpreter lacks ipykernel.
    #[error("the interpreter {python} (chosen by {chosen_by}) cannot start a kernel: ipykernel is not installed. To fix it, {hint}", hint = SETUP_HINT)]
    NoIpykernel {
        /// The interpreter.
        python: String,
        /// The rule that chose it.
        chosen_by: String,
    },
    /// The kernel did not start.
    #[error("the kernel did not start: {0}")]
    Start(String),
    /// The kernel is dead.
    #[error("the kernel is dead: {0}")]
    Dead(String),
    /// A channel failed.
    #[error("kernel channel error: {0}")]
    Channel(String),
}

/// Which channel a routed message came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chan {
    Shell,
    IoPub,
    Control,
}

type Routes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<(Chan, JupyterMessage)>>>>;

/// What ended a cell that ran past its timeout or was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Interruption {
    /// A Jupyter `interrupt_request` stopped it; state kept.
    InterruptRequest,
    /// SIGINT to the kernel's process group stopped it; state kept.
    Sigint,
    /// Nothing stopped it: the kernel was killed; state lost.
    Killed,
}

/// Limits of one execution.
#[derive(Debug, Clone)]
pub struct ExecLimits {
    /// The cell's timeout.
    pub timeout: Duration,
    /// How long each interrupt step waits before the next.
    pub grace: Duration,
    /// Cap on kept stdout/stderr bytes (each).
    pub max_output: usize,
}

/// How a cell ended.
#[derive(Debug, Default)]
pub struct ExecOutcome {
    /// Everything it produced, in order.
    pub out: CellOutput,
    /// The cell ran past its timeout.
    pub timed_out: bool,
    /// The client cancelled the call.
    pub cancelled: bool,
    /// How a timeout or cancel was carried out.
    pub interruption: Option<Interruption>,
    /// The kernel died while the cell ran (why).
    pub died: Option<String>,
}

/// A running kernel.
pub struct Kernel {
    /// Short id for logs and messages.
    pub id: String,
    /// The interpreter it runs on.
    pub interpreter: Interpreter,
    pid: i32,
    /// Signals the kernel's process group, or ends every process it started.
    signaller: omicos_sandbox::Signaller,
    /// The session's box (None on the host): its disk bound interrupts cells.
    sbox: Option<Arc<omicos_sandbox::SessionBox>>,
    dir: PathBuf,
    shell: tokio::sync::Mutex<jzc::DealerSendConnection>,
    control: tokio::sync::Mutex<jzc::DealerSendConnection>,
    routes: Routes,
    dead: watch::Receiver<Option<String>>,
    dead_tx: Arc<watch::Sender<Option<String>>>,
    cwd: Mutex<PathBuf>,
    workspace: PathBuf,
    tasks: Vec<JoinHandle<()>>,
    stop: CancellationToken,
}

/// How kernels are started.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Time allowed to become ready.
    pub startup_timeout: Duration,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// The sandbox the kernel runs in: its session's box (or, under
    /// danger-full-access, the host).
    pub sandbox: Arc<crate::sandboxing::KernelSandbox>,
}

fn route(routes: &Routes, chan: Chan, msg: JupyterMessage) {
    let Some(parent) = msg.parent_header.as_ref().map(|h| h.msg_id.clone()) else {
        return;
    };
    let tx = routes.lock().expect("routes lock").get(&parent).cloned();
    if let Some(tx) = tx {
        let _ = tx.send((chan, msg));
    }
}

fn mark_dead(tx: &watch::Sender<Option<String>>, why: String) {
    tx.send_if_modified(|v| {
        if v.is_none() {
            *v = Some(why);
            true
        } else {
            false
        }
    });
}

impl Kernel {
    /// Starts a kernel with `interpreter`, in `cwd`, for `who`'s session
    /// (in its box), and waits until it answers.
    pub async fn start(
        interpreter: &Interpreter,
        cwd: &Path,
        opts: &StartOptions,
        who: &crate::sandboxing::SessionRef,
    ) -> Result<Arc<Kernel>, KernelError> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let (place, sbox, packages) = opts
            .sandbox
            .for_kernel(&interpreter.python, cwd, who)
            .await
            .map_err(|e| KernelError::Start(e.to_string()))?;
        // Its connection file and sockets: in the box's private directory,
        // which only the box's uid enters (and the service, from outside).
        let dir = match &sbox {
            Some(b) => b.private_dir().join(format!("k-{id}")),
            None => std::env::temp_dir().join(format!("omicos-k-{id}")),
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| KernelError::Start(format!("cannot create {}: {e}", dir.display())))?;
        }
        let cleanup = DirGuard(Some(dir.clone()));
        let info = ConnectionInfo {
            ip: dir.join("k").display().to_string(),
            transport: Transport::IPC,
            shell_port: 1,
            iopub_port: 2,
            stdin_port: 3,
            control_port: 4,
            hb_port: 5,
            key: uuid::Uuid::new_v4().to_string(),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: None,
        };
        let conn_file = dir.join("connection.json");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&conn_file)
                .and_then(|mut f| {
                    f.write_all(&serde_json::to_vec(&info).expect("connection info serializes"))
                })
                .map_err(|e| {
                    KernelError::Start(format!("cannot write the connection file: {e}"))
                })?;
        }
        if let Some(b) = &sbox {
            for p in [&dir, &conn_file] {
                std::os::unix::fs::chown(p, Some(b.uid()), Some(b.gid())).map_err(|e| {
                    KernelError::Start(format!("cannot hand {} to the box: {e}", p.display()))
                })?;
            }
        }
        let program = crate::sandboxing::program_path(&interpreter.python);
        let mut cmd = omicos_sandbox::Command::new(program.display().to_string());
        cmd.args([
            "-m",
            "ipykernel_launcher",
            "-f",
            &conn_file.display().to_string(),
            // No history database: faster start, no writes outside the workspace.
            "--HistoryManager.enabled=False",
            "--InteractiveShell.colors=nocolor",
        ])
        .cwd(cwd)
        .stderr(omicos_sandbox::Stdio::Piped)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONPATH", packages.display().to_string())
        // A kernel lives for its session; each cell has its own timeout.
        .cpu_seconds(None)
        // Past the disk bound, the cell that writes is interrupted; the
        // kernel and its state stay.
        .interrupt_on_bound();
        if let Some(bin) = program.parent().filter(|b| b.is_absolute()) {
            cmd.env(
                "PATH",
                format!("{}:{}", bin.display(), omicos_sandbox::config::DEFAULT_PATH),
            );
        }
        if sbox.is_none() {
            // Unconfined: ipykernel's parent poller ends the kernel within a
            // second once this process is gone. In a box, the box's end does.
            cmd.env("JPY_PARENT_PID", std::process::id().to_string());
        }
        let spawned = opts.sandbox.spawn(&place, cmd).await;
        let mut child = spawned.map_err(|e| {
            if e.0.contains("No such file") || e.0.contains("not found") {
                KernelError::Start(format!(
                    "the interpreter {} (chosen by {}) does not exist (or is not visible in the sandbox: {e}); {SETUP_HINT}",
                    interpreter.python.display(),
                    interpreter.source
                ))
            } else {
                KernelError::Start(format!("cannot run {}: {e}", interpreter.python.display()))
            }
        })?;
        let signaller = child.signaller();
        let sbox = child.sandbox_box().cloned();
        // The host's pid (markers, operators); in a box its own pid differs.
        let pid = child.host_pid().unwrap_or_else(|| child.pid());
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let mut tasks = Vec::new();
        if let Some(mut err) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tasks.push(tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut t = tail.lock().expect("stderr lock");
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if t.len() > 8192 {
                        let cut = t.len() - 8192;
                        let cut = (cut..t.len())
                            .find(|i| t.is_char_boundary(*i))
                            .unwrap_or(t.len());
                        t.drain(..cut);
                    }
                }
            }));
        }
        let fail = |child_status: Option<std::process::ExitStatus>,
                    stderr_tail: &Arc<Mutex<String>>|
         -> KernelError {
            let text = stderr_tail.lock().expect("stderr lock").clone();
            if text.contains("No module named ipykernel") {
                return KernelError::NoIpykernel {
                    python: interpreter.python.display().to_string(),
                    chosen_by: interpreter.source.clone(),
                };
            }
            let last: Vec<&str> = text
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            KernelError::Start(format!(
                "{} ({}) exited{}: {}",
                interpreter.python.display(),
                interpreter.source,
                child_status
                    .map(|s| format!(" with {s}"))
                    .unwrap_or_default(),
                last.join("\n")
            ))
        };
        let deadline = Instant::now() + opts.startup_timeout;
        // The IPC sockets exist once the kernel bound them; connecting earlier fails.
        loop {
            if (1..=5).all(|p| dir.join(format!("k-{p}")).exists()) {
                break;
            }
            if let Some(status) = child.try_wait() {
                // Let the stderr reader catch the last words.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Err(fail(Some(status), &stderr_tail));
            }
            if Instant::now() > deadline {
                child.end().await;
                return Err(KernelError::Start(format!(
                    "not ready after {:?}",
                    opts.startup_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let session = uuid::Uuid::new_v4().to_string();
        let chan_err = |e: jzc::RuntimeError| KernelError::Channel(e.to_string());
        // Connecting runs the ZMTP handshake, which a wedged kernel never completes.
        let connect = async {
            let iopub = jzc::create_client_iopub_connection(&info, "", &session).await?;
            let identity = jzc::peer_identity_for_session(&session)?;
            let shell =
                jzc::create_client_shell_connection_with_identity(&info, &session, identity)
                    .await?;
            let control = jzc::create_client_control_connection(&info, &session).await?;
            Ok::<_, jzc::RuntimeError>((iopub, shell, control))
        };
        let (iopub, shell, control) = tokio::time::timeout_at(deadline.into(), connect)
            .await
            .map_err(|_| {
                KernelError::Start(format!(
                    "the kernel's sockets did not answer within {:?}",
                    opts.startup_timeout
                ))
            })?
            .map_err(chan_err)?;
        let (shell_tx, shell_rx) = shell.split();
        let (control_tx, control_rx) = control.split();
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let (dead_tx, dead_rx) = watch::channel(None);
        let dead_tx = Arc::new(dead_tx);
        let stop = CancellationToken::new();
        tasks.push(tokio::spawn(read_loop(iopub, Chan::IoPub, routes.clone())));
        tasks.push(tokio::spawn(read_loop(
            shell_rx,
            Chan::Shell,
            routes.clone(),
        )));
        tasks.push(tokio::spawn(read_loop(
            control_rx,
            Chan::Control,
            routes.clone(),
        )));
        // Process exit is the surest sign of death.
        {
            let dead_tx = dead_tx.clone();
            let tail = stderr_tail.clone();
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    status = child.wait() => {
                        let what = match status {
                            Ok(s) => describe_exit(s),
                            Err(e) => format!("could not be waited for: {e}"),
                        };
                        let last = tail.lock().expect("stderr lock").lines().last().unwrap_or("").to_owned();
                        let why = if last.is_empty() { format!("the kernel process {what}") } else { format!("the kernel process {what} (last stderr line: {last})") };
                        mark_dead(&dead_tx, why);
                    }
                    _ = stop.cancelled() => {
                        child.end().await;
                    }
                }
            }));
        }
        let kernel = Kernel {
            id,
            interpreter: interpreter.clone(),
            pid,
            signaller: signaller.clone(),
            sbox,
            dir: cleanup.keep(),
            shell: tokio::sync::Mutex::new(shell_tx),
            control: tokio::sync::Mutex::new(control_tx),
            routes,
            dead: dead_rx,
            dead_tx,
            cwd: Mutex::new(cwd.to_path_buf()),
            workspace: cwd.to_path_buf(),
            tasks,
            stop,
        };
        if let Err(e) = kernel.wait_ready(deadline).await {
            let dead = kernel.dead.borrow().clone();
            drop(kernel);
            return Err(match dead {
                Some(_) => fail(None, &stderr_tail),
                None => e,
            });
        }
        let mut kernel = kernel;
        // A hung kernel (stuck in C code with signals blocked) still has its process:
        // the heartbeat catches it.
        kernel.tasks.push(tokio::spawn(heartbeat_loop(
            info,
            opts.heartbeat,
            kernel.dead_tx.clone(),
            signaller,
            kernel.stop.clone(),
        )));
        Ok(Arc::new(kernel))
    }

    /// Sends kernel_info until both its reply and its iopub status arrive:
    /// only then is the iopub subscription known to be live.
    async fn wait_ready(&self, deadline: Instant) -> Result<(), KernelError> {
        loop {
            let msg: JupyterMessage = KernelInfoRequest {}.into();
            let mid = msg.header.msg_id.clone();
            let mut rx = self.register(&mid);
            self.shell
                .lock()
                .await
                .send(msg)
                .await
                .map_err(|e| KernelError::Channel(e.to_string()))?;
            let (mut replied, mut on_iopub) = (false, false);
            let attempt_end = (Instant::now() + Duration::from_millis(250)).min(deadline);
            while !(replied && on_iopub) {
                let mut dead = self.dead.clone();
                tokio::select! {
                    m = rx.recv() => match m {
                        Some((Chan::Shell, _)) => replied = true,
                        Some((Chan::IoPub, _)) => on_iopub = true,
                        _ => {}
                    },
                    _ = async { let _ = dead.wait_for(|d| d.is_some()).await; } => {
                        self.unregister(&mid);
                        return Err(KernelError::Dead(self.death().unwrap_or_default()));
                    }
                    _ = tokio::time::sleep_until(attempt_end.into()) => break,
                }
            }
            self.unregister(&mid);
            if replied && on_iopub {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(KernelError::Start(
                    "the kernel did not answer kernel_info in time".into(),
                ));
            }
        }
    }

    fn register(&self, msg_id: &str) -> mpsc::UnboundedReceiver<(Chan, JupyterMessage)> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes
            .lock()
            .expect("routes lock")
            .insert(msg_id.to_owned(), tx);
        rx
    }

    fn unregister(&self, msg_id: &str) {
        self.routes.lock().expect("routes lock").remove(msg_id);
    }

    /// Why the kernel died, or None while it lives.
    pub fn death(&self) -> Option<String> {
        self.dead.borrow().clone()
    }

    /// Its Jupyter connection file (ipc sockets beside it): another client,
    /// such as jupyter_client in the benches, can talk to the same kernel.
    pub fn connection_file(&self) -> PathBuf {
        self.dir.join("connection.json")
    }

    /// The kernel's process id on the host (signals go through the sandbox).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The workspace the kernel was started in: its sandbox's roots.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The directory the kernel's Python runs in.
    pub fn cwd(&self) -> PathBuf {
        self.cwd.lock().expect("cwd lock").clone()
    }

    /// Moves the kernel's working directory (a warm kernel handed to a session
    /// of another workspace).
    pub async fn chdir(&self, dir: &Path) -> Result<(), KernelError> {
        let path = serde_json::to_string(&dir.display().to_string()).expect("string serializes");
        let code = format!("__import__('os').chdir({path})");
        let limits = ExecLimits {
            timeout: Duration::from_secs(10),
            grace: Duration::from_secs(1),
            max_output: 4096,
        };
        let r = self
            .execute(
                &code,
                true,
                &limits,
                &EventSink::discard(),
                &CancellationToken::new(),
            )
            .await;
        if let Some(d) = r.died {
            return Err(KernelError::Dead(d));
        }
        if let Some(e) = r.out.error {
            return Err(KernelError::Channel(format!(
                "cannot change directory to {}: {}",
                dir.display(),
                e.evalue
            )));
        }
        *self.cwd.lock().expect("cwd lock") = dir.to_path_buf();
        Ok(())
    }

    /// Runs `code`. Output streams to `events` while it runs. On timeout or
    /// cancel: interrupt_request, then SIGINT to the group, then kill.
    pub async fn execute(
        &self,
        code: &str,
        silent: bool,
        limits: &ExecLimits,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> ExecOutcome {
        let mut outcome = ExecOutcome::default();
        outcome.out.set_cap(limits.max_output);
        if let Some(d) = self.death() {
            outcome.died = Some(d);
            return outcome;
        }
        let trips_before = self.sbox.as_ref().map(|b| b.disk_trips().0);
        let mut req = ExecuteRequest::new(code.to_owned());
        req.silent = silent;
        req.store_history = !silent;
        req.stop_on_error = false;
        let msg: JupyterMessage = req.into();
        let mid = msg.header.msg_id.clone();
        let mut rx = self.register(&mid);
        if let Err(e) = self.shell.lock().await.send(msg).await {
            self.unregister(&mid);
            outcome.died = Some(format!("the shell channel failed: {e}"));
            return outcome;
        }
        let mut splitter = StreamSplitter::default();
        let (mut replied, mut idle) = (false, false);
        // 0: running; 1: interrupt_request sent; 2: SIGINT sent; 3: killed.
        let mut phase = 0u8;
        let mut next_step = Instant::now() + limits.timeout;
        let mut dead = self.dead.clone();
        while !(replied && idle) {
            tokio::select! {
                m = rx.recv() => {
                    let Some((chan, m)) = m else { break };
                    match (chan, m.content) {
                        (Chan::Shell, JupyterMessageContent::ExecuteReply(r)) => {
                            replied = true;
                            outcome.out.execution_count = Some(r.execution_count.value() as i64);
                            if r.status == ReplyStatus::Error
                                && outcome.out.error.is_none()
                                && let Some(e) = r.error
                            {
                                outcome.out.set_error(&e.ename, &e.evalue, &e.traceback);
                            }
                        }
                        (Chan::IoPub, JupyterMessageContent::Status(s)) if s.execution_state == ExecutionState::Idle => idle = true,
                        (Chan::IoPub, JupyterMessageContent::StreamContent(s)) => {
                            let name = match s.name { jupyter_protocol::Stdio::Stdout => "stdout", jupyter_protocol::Stdio::Stderr => "stderr" };
                            outcome.out.stream(name, &s.text);
                            let (text, bars) = splitter.feed(name, &s.text);
                            if !text.is_empty() {
                                events.output(name, text).await;
                            }
                            for b in bars {
                                events.progress(b).await;
                            }
                        }
                        (Chan::IoPub, JupyterMessageContent::DisplayData(d)) => outcome.out.display(&d.data, &d.metadata),
                        (Chan::IoPub, JupyterMessageContent::UpdateDisplayData(d)) => outcome.out.display(&d.data, &d.metadata),
                        (Chan::IoPub, JupyterMessageContent::ExecuteResult(r)) => outcome.out.execute_result(&r.data, &r.metadata),
                        (Chan::IoPub, JupyterMessageContent::ErrorOutput(e)) => outcome.out.set_error(&e.ename, &e.evalue, &e.traceback),
                        (Chan::IoPub, JupyterMessageContent::ClearOutput(_)) => outcome.out.clear(),
                        _ => {}
                    }
                }
                _ = async { let _ = dead.wait_for(|d| d.is_some()).await; } => {
                    if phase < 3 {
                        outcome.died = self.death();
                    }
                    break;
                }
                _ = tokio::time::sleep_until(next_step.into()), if phase < 3 => {
                    if phase == 0 {
                        outcome.timed_out = true;
                    }
                    phase = self.escalate(phase).await;
                    next_step = Instant::now() + limits.grace;
                    if phase == 3 {
                        break;
                    }
                }
                _ = cancel.cancelled(), if phase == 0 => {
                    outcome.cancelled = true;
                    phase = self.escalate(phase).await;
                    next_step = Instant::now() + limits.grace;
                }
            }
        }
        self.unregister(&mid);
        for b in splitter.finish() {
            events.progress(b).await;
        }
        outcome.interruption = match phase {
            0 => None,
            1 => Some(Interruption::InterruptRequest),
            2 => Some(Interruption::Sigint),
            _ => Some(Interruption::Killed),
        };
        if let (Some(b), Some(before)) = (&self.sbox, trips_before) {
            let (after, note) = b.disk_trips();
            if after > before {
                outcome
                    .out
                    .stream("stderr", &format!("\n[omicos] {note}\n"));
            }
        }
        outcome
    }

    async fn escalate(&self, phase: u8) -> u8 {
        match phase {
            0 => {
                let msg: JupyterMessage = InterruptRequest {}.into();
                if self.control.lock().await.send(msg).await.is_err() {
                    self.signaller.signal_group(libc::SIGINT);
                    return 2;
                }
                1
            }
            1 => {
                self.signaller.signal_group(libc::SIGINT);
                2
            }
            _ => {
                mark_dead(
                    &self.dead_tx,
                    "killed: neither interrupt_request nor SIGINT stopped the cell".into(),
                );
                self.signaller.kill();
                3
            }
        }
    }

    /// Asks the kernel to shut down, then kills its group.
    pub async fn shutdown(&self) {
        if self.death().is_none() {
            let msg: JupyterMessage = ShutdownRequest { restart: false }.into();
            let _ = self.control.lock().await.send(msg).await;
            let mut dead = self.dead.clone();
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                let _ = dead.wait_for(|d| d.is_some()).await;
            })
            .await;
        }
        mark_dead(&self.dead_tx, "shut down".into());
        self.signaller.kill();
    }

    /// Kills the kernel and everything it started at once (tests use it to simulate OOM kills).
    pub fn kill(&self) {
        self.signaller.kill();
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.signaller.kill();
        self.stop.cancel();
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(9)) => "was killed (SIGKILL, e.g. out of memory)".into(),
        (None, Some(11)) => "crashed (segmentation fault)".into(),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "exited".into(),
    }
}

async fn read_loop<S: jzc_recv::Recv>(mut conn: S, chan: Chan, routes: Routes) {
    loop {
        match conn.read_msg().await {
            Ok(m) => route(&routes, chan, m),
            // A bad signature or an undecodable message is skipped; a closed socket ends the loop.
            Err(jzc::RuntimeError::ZmqError(_)) => break,
            Err(e) => tracing::debug!(?chan, error = %e, "unreadable kernel message skipped"),
        }
    }
}

/// Uniform read over the receiving connection types.
mod jzc_recv {
    use super::jzc;
    use jupyter_protocol::JupyterMessage;

    /// A receiving half.
    pub trait Recv: Send + 'static {
        /// Reads the next message.
        fn read_msg(
            &mut self,
        ) -> impl std::future::Future<Output = jzc::Result<JupyterMessage>> + Send;
    }
    impl Recv for jzc::ClientIoPubConnection {
        async fn read_msg(&mut self) -> jzc::Result<JupyterMessage> {
            self.read().await
        }
    }
    impl Recv for jzc::DealerRecvConnection {
        async fn read_msg(&mut self) -> jzc::Result<JupyterMessage> {
            self.read().await
        }
    }
}

async fn heartbeat_loop(
    info: ConnectionInfo,
    every: Duration,
    dead_tx: Arc<watch::Sender<Option<String>>>,
    signaller: omicos_sandbox::Signaller,
    stop: CancellationToken,
) {
    let mut misses = 0u32;
    let mut hb = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        if dead_tx.borrow().is_some() {
            return;
        }
        if hb.is_none() {
            // The ZMTP handshake waits for the peer: a hung kernel never answers it.
            hb = tokio::time::timeout(every, jzc::create_client_heartbeat_connection(&info))
                .await
                .ok()
                .and_then(Result::ok);
        }
        let ok = match hb.as_mut() {
            Some(c) => matches!(
                tokio::time::timeout(every, c.single_heartbeat()).await,
                Ok(Ok(()))
            ),
            None => false,
        };
        if ok {
            misses = 0;
        } else {
            // A REQ socket that missed its reply cannot send again: start over.
            hb = None;
            misses += 1;
            if misses >= 3 {
                mark_dead(
                    &dead_tx,
                    format!("the kernel missed {misses} heartbeats and was killed"),
                );
                signaller.kill();
                return;
            }
        }
    }
}

struct DirGuard(Option<PathBuf>);
impl DirGuard {
    fn keep(mut self) -> PathBuf {
        self.0.take().expect("dir guard holds a path")
    }
}
impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
