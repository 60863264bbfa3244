//! What callers hand the sandbox ([`Placement`], [`Command`]) and get back
//! ([`Process`]): the same for a boxed process and for one run unconfined
//! under `danger-full-access`.

use crate::SandboxPolicy;
use crate::boxes::BoxedChild;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// Where a call runs: whose session, in which workspace, under which policy.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The tenant (empty: the root tenant).
    pub tenant: String,
    /// The chat session: its calls share one box.
    pub session: String,
    /// The workspace, writable under workspace-write and network.
    pub workspace: PathBuf,
    /// The policy.
    pub policy: SandboxPolicy,
    /// More read-only directories in the view (an interpreter's prefix).
    pub read: Vec<PathBuf>,
    /// More writable directories in the view.
    pub write: Vec<PathBuf>,
    /// Host directories bound elsewhere in the view: (host, box path,
    /// writable), e.g. a session's package directory at a fixed path.
    pub bind: Vec<(PathBuf, PathBuf, bool)>,
}

impl Placement {
    /// A placement with no extra directories.
    pub fn new(
        tenant: impl Into<String>,
        session: impl Into<String>,
        workspace: impl Into<PathBuf>,
        policy: SandboxPolicy,
    ) -> Self {
        Self {
            tenant: tenant.into(),
            session: session.into(),
            workspace: workspace.into(),
            policy,
            read: Vec::new(),
            write: Vec::new(),
            bind: Vec::new(),
        }
    }

    /// With a host directory bound at `at` in the view.
    pub fn bind(
        mut self,
        host: impl Into<PathBuf>,
        at: impl Into<PathBuf>,
        writable: bool,
    ) -> Self {
        self.bind.push((host.into(), at.into(), writable));
        self
    }

    /// With more read-only directories.
    pub fn read(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.read.extend(dirs);
        self
    }

    /// With more writable directories.
    pub fn write(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.write.extend(dirs);
        self
    }
}

/// One of a process's standard streams.
#[derive(Debug, Default)]
pub enum Stdio {
    /// `/dev/null`.
    #[default]
    Null,
    /// A pipe to the caller ([`Process::stdin`], `stdout`, `stderr`).
    Piped,
    /// This descriptor (the CLI's own terminal for `omicos sandbox`).
    Fd(OwnedFd),
}

/// A program to run, with what it gets. The environment is the sandbox's
/// allowlist plus what is set here: nothing is inherited from the service.
#[derive(Debug)]
pub struct Command {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) stdio: [Stdio; 3],
    pub(crate) cpu_seconds: Option<Option<u64>>,
    pub(crate) interrupt_on_bound: bool,
}

impl Command {
    /// Runs `program` (a path, or a name looked up on the allowlisted PATH).
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            stdio: [Stdio::Null, Stdio::Null, Stdio::Null],
            cpu_seconds: None,
            interrupt_on_bound: false,
        }
    }

    /// Adds an argument.
    pub fn arg(&mut self, a: impl Into<String>) -> &mut Self {
        self.args.push(a.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable (over the allowlist's).
    pub fn env(&mut self, k: impl Into<String>, v: impl Into<String>) -> &mut Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// The working directory (default: the workspace).
    pub fn cwd(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Standard input.
    pub fn stdin(&mut self, s: Stdio) -> &mut Self {
        self.stdio[0] = s;
        self
    }

    /// Standard output.
    pub fn stdout(&mut self, s: Stdio) -> &mut Self {
        self.stdio[1] = s;
        self
    }

    /// Standard error.
    pub fn stderr(&mut self, s: Stdio) -> &mut Self {
        self.stdio[2] = s;
        self
    }

    /// Overrides `rlimits.cpu_seconds` for this process (None: no limit; a
    /// kernel lives for the session and each cell has its own timeout).
    pub fn cpu_seconds(&mut self, s: Option<u64>) -> &mut Self {
        self.cpu_seconds = Some(s);
        self
    }

    /// When the session's disk bound is passed, interrupt this process's
    /// group (SIGINT) instead of ending it: for a kernel, which loses its
    /// state if it is killed, and stops the cell that wrote.
    pub fn interrupt_on_bound(&mut self) -> &mut Self {
        self.interrupt_on_bound = true;
        self
    }

    /// The program as given.
    pub fn program(&self) -> &str {
        &self.program
    }
}

pub(crate) enum Inner {
    Boxed(BoxedChild),
    Host {
        child: tokio::process::Child,
        pgid: i32,
        status: Option<ExitStatus>,
    },
}

/// A running process of a call: in its session's box, or (under
/// `danger-full-access`) on the host in a process group of its own.
/// Dropping it kills everything the call started.
pub struct Process {
    pub(crate) inner: Inner,
    /// Its stdin, when [`Stdio::Piped`].
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    /// Its stdout, when [`Stdio::Piped`].
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    /// Its stderr, when [`Stdio::Piped`].
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    pub(crate) warnings: Vec<String>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Boxed(b) => f.debug_tuple("Process").field(b).finish(),
            Inner::Host { pgid, .. } => f.debug_struct("Process").field("host_pgid", pgid).finish(),
        }
    }
}

impl Process {
    /// Its pid: in its box's pid namespace, or on the host.
    pub fn pid(&self) -> i32 {
        match &self.inner {
            Inner::Boxed(b) => b.pid(),
            Inner::Host { pgid, .. } => *pgid,
        }
    }

    /// Its pid on the host (for operators and tests: signals go through
    /// [`Process::signal_group`]); None when it cannot be found (gone).
    pub fn host_pid(&self) -> Option<i32> {
        match &self.inner {
            Inner::Boxed(b) => b.host_pid(),
            Inner::Host { pgid, .. } => Some(*pgid),
        }
    }

    /// It runs in a box (false: `danger-full-access`).
    pub fn boxed(&self) -> bool {
        matches!(self.inner, Inner::Boxed(_))
    }

    /// The box it runs in.
    pub fn sandbox_box(&self) -> Option<&std::sync::Arc<crate::SessionBox>> {
        match &self.inner {
            Inner::Boxed(b) => Some(b.sandbox_box()),
            Inner::Host { .. } => None,
        }
    }

    /// A handle that signals or kills the process from elsewhere (a
    /// heartbeat task) while another task waits for it.
    pub fn signaller(&self) -> Signaller {
        match &self.inner {
            Inner::Boxed(b) => Signaller(SigInner::Boxed {
                sbox: b.sandbox_box().clone(),
                id: b.call_id(),
            }),
            Inner::Host { pgid, .. } => Signaller(SigInner::Host { pgid: *pgid }),
        }
    }

    /// What the caller should tell the user (a layer missing under `warn`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Waits for it to exit.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        match &mut self.inner {
            Inner::Boxed(b) => b.wait().await,
            Inner::Host { child, status, .. } => {
                let s = child.wait().await?;
                *status = Some(s);
                Ok(s)
            }
        }
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        match &mut self.inner {
            Inner::Boxed(b) => b.try_wait(),
            Inner::Host { child, status, .. } => {
                if status.is_none() {
                    *status = child.try_wait().ok().flatten();
                }
                *status
            }
        }
    }

    /// Sends `signal` to its process group.
    pub fn signal_group(&self, signal: i32) {
        match &self.inner {
            Inner::Boxed(b) => b.signal_group(signal),
            Inner::Host { pgid, .. } => {
                // SAFETY: killpg(2) of the group we made for this process.
                unsafe { libc::killpg(*pgid, signal) };
            }
        }
    }

    /// Kills every process the call started and waits until they are gone
    /// (on the host: its process group).
    pub async fn end(&mut self) {
        match &mut self.inner {
            Inner::Boxed(b) => b.end().await,
            Inner::Host {
                child,
                pgid,
                status,
                ..
            } => {
                // SAFETY: killpg(2) of the group we made for this process.
                unsafe { libc::killpg(*pgid, libc::SIGKILL) };
                if status.is_none() {
                    *status = child.wait().await.ok();
                }
            }
        }
    }

    /// The box's memory bound (bytes), when the kernel's OOM killer ended a
    /// process of the box since this one started.
    pub fn hit_memory_bound(&self) -> Option<u64> {
        match &self.inner {
            Inner::Boxed(b) => b.hit_memory_bound(),
            Inner::Host { .. } => None,
        }
    }

    /// How many times the session's disk bound stopped or interrupted the
    /// box's calls so far: a kernel compares it around a cell.
    pub fn disk_trips(&self) -> u64 {
        match &self.inner {
            Inner::Boxed(b) => b.disk_trips(),
            Inner::Host { .. } => 0,
        }
    }

    /// Why the session's disk bound stopped this call (the workspace grew
    /// past `session_limits.workspace_bytes`, or its filesystem fell below
    /// `min_free_bytes`), if it did.
    pub fn hit_disk_bound(&self) -> Option<String> {
        match &self.inner {
            Inner::Boxed(b) => b.hit_disk_bound(),
            Inner::Host { .. } => None,
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Inner::Host { pgid, status, .. } = &self.inner
            && status.is_none()
        {
            // SAFETY: killpg(2) of the group we made for this process.
            unsafe { libc::killpg(*pgid, libc::SIGKILL) };
        }
    }
}

/// Signals a [`Process`] (its group) or kills it and all it started.
#[derive(Clone, Debug)]
pub struct Signaller(SigInner);

#[derive(Clone, Debug)]
enum SigInner {
    Boxed {
        sbox: std::sync::Arc<crate::SessionBox>,
        id: u64,
    },
    Host {
        pgid: i32,
    },
}

impl Signaller {
    /// Sends `signal` to the process's group.
    pub fn signal_group(&self, signal: i32) {
        match &self.0 {
            SigInner::Boxed { sbox, id } => sbox.signal(*id, signal, true),
            // SAFETY: killpg(2) of the group made for this process.
            SigInner::Host { pgid } => unsafe {
                libc::killpg(*pgid, signal);
            },
        }
    }

    /// Kills every process of the call (in a box, those that left its group too).
    pub fn kill(&self) {
        match &self.0 {
            SigInner::Boxed { sbox, id } => sbox.end_call(*id),
            // SAFETY: killpg(2) of the group made for this process.
            SigInner::Host { pgid } => unsafe {
                libc::killpg(*pgid, libc::SIGKILL);
            },
        }
    }
}

/// How a process ended, in words a model can act on: the exit code, or the
/// signal and what usually sends it in a box.
pub fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    match status.signal() {
        Some(libc::SIGXCPU) => "killed: it used up its CPU-time limit (SIGXCPU)".into(),
        Some(libc::SIGXFSZ) => "killed: it wrote a file over the size limit (SIGXFSZ)".into(),
        Some(s) => format!("killed by signal {s}"),
        None => status.to_string(),
    }
}
