//! Confines what the `shell` tool and the Python kernels run, the way codex's
//! Linux sandbox does: Landlock limits the paths a process may read, write and
//! execute; seccomp refuses network sockets (and ptrace, io_uring, module
//! loading, …); `PR_SET_NO_NEW_PRIVS` and a full capability drop make root
//! inside an ordinary user; rlimits and a pids cgroup bound CPU time, memory
//! and processes per call.
//!
//! Everything is computed in the parent ([`Sandbox::prepare`]); the child only
//! applies it between fork and exec ([`Prepared::spawn`]), with raw,
//! async-signal-safe syscalls. As root on cgroup v1 the fork happens on a
//! launcher thread parked in the call's pids cgroup, so that the child is
//! born there instead of migrating into it (see `launcher`).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use omicos_sandbox::{Roots, Sandbox, SandboxConfig, SandboxPolicy};
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let roots = Roots::new("/srv/workspace").tmp(sandbox.session_tmp_dir("s1")?);
//! let prepared = sandbox.prepare(SandboxPolicy::WorkspaceWrite, &roots)?;
//! let mut cmd = tokio::process::Command::new("bash");
//! cmd.arg("-c").arg("echo hi > out.txt");
//! let status = prepared.spawn(&mut cmd)?.wait().await?;
//! drop(prepared); // kills what the command left behind
//! # Ok(()) }
//! ```

mod cgroup;
mod child;
pub mod config;
mod filesystem;
mod launcher;
pub mod policy;
pub mod run;
mod syscalls;

pub use config::{ConfigError, ProcessCgroup, Rlimits, SandboxConfig, WhenLandlockMissing};
pub use filesystem::LandlockSupport;
pub use policy::{SandboxPolicy, UnknownPolicy};

use cgroup::{CallCgroup, CgroupBase};
use child::{ChildSetup, Limit, NetNs};
use filesystem::{CallRoots, SystemRoots};
use seccompiler::BpfProgram;
use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Why a command cannot be sandboxed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Landlock is missing and the config says refuse.
    #[error(
        "the sandbox refuses to run this command under `{policy}`: the kernel offers no Landlock, so file access cannot be confined \
         (set sandbox.when_landlock_missing: warn to run with seccomp and limits only, or use policy danger-full-access)"
    )]
    LandlockMissing {
        /// The policy asked for.
        policy: SandboxPolicy,
    },
    /// The Landlock ruleset could not be built.
    #[error("cannot build the Landlock ruleset: {0}")]
    Landlock(#[from] landlock::RulesetError),
    /// Landlock answered a version but created no ruleset.
    #[error("cannot build the Landlock ruleset: the kernel created none")]
    LandlockRuleset,
    /// The seccomp program could not be built.
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
    /// A directory the sandbox needs could not be made or is unsafe.
    #[error("sandbox directory {path}: {reason}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The directories of one call: its workspace, its temporary directory, and any more.
#[derive(Clone, Debug, Default)]
pub struct Roots {
    /// The workspace (writable under workspace-write and network, readable always).
    pub workspace: PathBuf,
    /// The per-session temporary directory: writable under every confined
    /// policy, and `TMPDIR` of the command.
    pub tmp: Option<PathBuf>,
    /// More readable directories for this call (an interpreter's prefix, a venv).
    pub read: Vec<PathBuf>,
    /// Directories this call cannot work without writing (a kernel's socket
    /// directory): writable under every confined policy, like `tmp`.
    pub write: Vec<PathBuf>,
}

impl Roots {
    /// Roots with this workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self {
            workspace: workspace.into(),
            ..Self::default()
        }
    }

    /// With a temporary directory.
    pub fn tmp(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tmp = Some(dir.into());
        self
    }

    /// With more readable directories.
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

/// The sandbox of one service: its config, what the kernel offers, and the
/// parts shared by every call (opened system roots, compiled seccomp programs).
pub struct Sandbox {
    config: SandboxConfig,
    landlock: LandlockSupport,
    system: SystemRoots,
    seccomp_offline: Arc<BpfProgram>,
    seccomp_online: Arc<BpfProgram>,
    seccomp_loopback: Arc<BpfProgram>,
    netns: Option<NetNs>,
    cgroup: Option<CgroupBase>,
    launchers: Option<launcher::Pool>,
    drop_caps_upto: Option<u32>,
    root: bool,
    tmp_root: PathBuf,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("policy", &self.config.policy)
            .field("landlock", &self.landlock)
            .field("system_rules", &self.system.rule_count())
            .field(
                "cgroup",
                &self.cgroup.as_ref().map(|c| c.dir().to_path_buf()),
            )
            .field("parked_launchers", &self.parked_launchers())
            .finish()
    }
}

/// This process holds capabilities (root, or file capabilities): drop them in children.
fn holds_capabilities() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps != 0)
}

/// A private network namespace if this process can make one (tried once, on `true`).
fn probe_netns(root: bool) -> Option<NetNs> {
    let ns = NetNs {
        user: (!root).then(|| {
            // SAFETY: getuid/getgid have no preconditions.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            (
                format!("{uid} {uid} 1\n").into_bytes(),
                format!("{gid} {gid} 1\n").into_bytes(),
            )
        }),
    };
    let setup = Arc::new(ChildSetup {
        netns: Some(ns.clone()),
        ..ChildSetup::default()
    });
    let mut cmd = std::process::Command::new("true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: ChildSetup::enter is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || setup.enter(true));
        }
    }
    match cmd.status() {
        Ok(s) if s.success() => Some(ns),
        other => {
            tracing::warn!(result = ?other, "no private network namespace here: network-off commands get no sockets but unix ones");
            None
        }
    }
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// A directory owned by us, mode 0700, and not a symlink (the system temp
/// dir is shared: someone else may have made the name first).
fn private_dir(path: &Path) -> Result<(), SandboxError> {
    let err = |reason: String| SandboxError::Dir {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me {
        return Err(err(format!(
            "exists but is not a directory owned by uid {me}; remove it or set sandbox.tmp_root"
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err(e.to_string()))?;
    }
    Ok(())
}

/// A session id as one safe path component.
fn component(session: &str) -> String {
    let s = if session.is_empty() {
        "default"
    } else {
        session
    };
    let mut out = String::new();
    for b in s.bytes().take(120) {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

impl Sandbox {
    /// Validates `config`, probes Landlock, opens the system roots and
    /// compiles the seccomp programs.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        config.validate()?;
        let landlock = if config.simulate_landlock_missing {
            LandlockSupport::Missing
        } else {
            filesystem::probe()
        };
        let system = SystemRoots::open(&config.system_read_roots, &config.hidden);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        // `auto` makes a cgroup only where RLIMIT_NPROC cannot hold (root):
        // joining one costs an RCU grace period per call on cgroup v1.
        let cgroup = match config.rlimits.processes {
            None => None,
            Some(_) if !root && config.process_cgroup == ProcessCgroup::Auto => None,
            Some(_) => CgroupBase::detect(&config.process_cgroup),
        };
        let tmp_root = config.tmp_root.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("omicos-sandbox-{}", unsafe { libc::geteuid() }))
        });
        // cgroup v1 only: v2 has no per-thread membership outside threaded subtrees.
        let launchers = match (&cgroup, config.rlimits.processes) {
            (Some(base), Some(max))
                if base.version() == cgroup::Version::V1 && config.process_cgroup_launchers > 0 =>
            {
                Some(launcher::Pool::new(
                    base.clone(),
                    max,
                    config.process_cgroup_launchers,
                ))
            }
            _ => None,
        };
        let netns = if config.private_loopback {
            probe_netns(root)
        } else {
            None
        };
        let sandbox = Self {
            seccomp_offline: Arc::new(syscalls::program(syscalls::Sockets::UnixOnly)?),
            seccomp_online: Arc::new(syscalls::program(syscalls::Sockets::Any)?),
            seccomp_loopback: Arc::new(syscalls::program(syscalls::Sockets::PrivateLoopback)?),
            netns,
            drop_caps_upto: holds_capabilities().then(last_cap),
            landlock,
            system,
            cgroup,
            launchers,
            root,
            tmp_root,
            config,
        };
        if sandbox.landlock == LandlockSupport::Missing {
            tracing::warn!(
                when_missing = ?sandbox.config.when_landlock_missing,
                "the kernel offers no Landlock: confined policies are {}",
                match sandbox.config.when_landlock_missing {
                    WhenLandlockMissing::Refuse => "refused",
                    WhenLandlockMissing::Warn => "run with seccomp and limits only",
                }
            );
        }
        if root && sandbox.cgroup.is_none() && sandbox.config.rlimits.processes.is_some() {
            tracing::warn!(
                "running as root without a writable pids cgroup: the process limit is not enforced (the kernel ignores RLIMIT_NPROC for root)"
            );
        }
        Ok(sandbox)
    }

    /// The config it was made with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// What the kernel offers.
    pub fn landlock(&self) -> LandlockSupport {
        self.landlock
    }

    /// Network-off commands get a private loopback (see `SandboxConfig::private_loopback`).
    pub fn private_loopback(&self) -> bool {
        self.netns.is_some()
    }

    /// The process limit holds for this service's calls: a pids cgroup is in
    /// use, or we are not root (RLIMIT_NPROC then applies).
    pub fn process_limit_enforced(&self) -> bool {
        self.config.rlimits.processes.is_some() && (self.cgroup.is_some() || !self.root)
    }

    /// Launcher threads parked in fresh call cgroups now, ready to fork a
    /// call's process inside its cgroup (see [`Prepared::spawn`]); 0 when
    /// the pool is off (not root, cgroup v2, `process_cgroup_launchers: 0`).
    pub fn parked_launchers(&self) -> usize {
        self.launchers.as_ref().map_or(0, launcher::Pool::parked)
    }

    /// Waits up to `timeout` for the launcher pool to be full (or to give
    /// up); returns the launchers parked. For tests and benchmarks.
    pub fn wait_for_launchers(&self, timeout: std::time::Duration) -> usize {
        self.launchers
            .as_ref()
            .map_or(0, |p| p.wait_filled(timeout))
    }

    /// The per-session temporary directory (made 0700 if missing), under `sandbox.tmp_root`.
    pub fn session_tmp_dir(&self, session: &str) -> Result<PathBuf, SandboxError> {
        private_dir(&self.tmp_root)?;
        let dir = self.tmp_root.join(component(session));
        private_dir(&dir)?;
        Ok(dir)
    }

    /// Everything a child needs to run `policy` over `roots`. Keep the result
    /// alive while the process runs: dropping it kills what is left of the
    /// call's processes (when a pids cgroup is in use).
    pub fn prepare(&self, policy: SandboxPolicy, roots: &Roots) -> Result<Prepared, SandboxError> {
        let mut warnings = Vec::new();
        let mut setup = ChildSetup::default();
        let (cgroup, procs, launcher) = self.process_cgroup(&mut warnings);
        setup.cgroup_procs = procs;
        setup.limits = self.limits();
        if policy.is_confined() {
            setup.drop_caps_upto = self.drop_caps_upto;
            setup.no_new_privs = true;
            setup.landlock = match self.landlock {
                LandlockSupport::Available(_) => Some(self.ruleset(policy, roots)?),
                LandlockSupport::Missing => match self.config.when_landlock_missing {
                    WhenLandlockMissing::Refuse => {
                        return Err(SandboxError::LandlockMissing { policy });
                    }
                    WhenLandlockMissing::Warn => {
                        warnings.push(format!(
                            "sandbox: the kernel offers no Landlock, so this `{policy}` command ran without file-access confinement (seccomp and limits still applied)"
                        ));
                        None
                    }
                },
            };
            setup.seccomp = Some(match (policy.allows_network(), &self.netns) {
                (true, _) => self.seccomp_online.clone(),
                (false, None) => self.seccomp_offline.clone(),
                (false, Some(ns)) => {
                    setup.netns = Some(ns.clone());
                    // A user namespace grants capabilities inside it: drop those too.
                    if ns.user.is_some() {
                        setup.drop_caps_upto = Some(last_cap());
                    }
                    self.seccomp_loopback.clone()
                }
            });
        }
        let mut env = Vec::new();
        if let Some(tmp) = &roots.tmp {
            for k in ["TMPDIR", "TMP", "TEMP"] {
                env.push((OsString::from(k), tmp.clone().into_os_string()));
            }
            if policy.is_confined() {
                // The real home holds credentials and is not readable: the
                // command gets a fresh one in its tmp (login shells then read
                // only /etc/profile; caches and dotfiles land in the tmp).
                let home = tmp.join("home");
                std::fs::create_dir_all(&home).map_err(|e| SandboxError::Dir {
                    path: home.clone(),
                    reason: e.to_string(),
                })?;
                env.push((OsString::from("HOME"), home.into_os_string()));
            }
        }
        Ok(Prepared {
            policy,
            setup: Arc::new(setup),
            cgroup,
            launcher: Mutex::new(launcher),
            env,
            warnings,
        })
    }

    /// The call's cgroup, the fd by which its child joins it, and a launcher
    /// parked inside it when the pool has one (the child is then born inside).
    fn process_cgroup(
        &self,
        warnings: &mut Vec<String>,
    ) -> (
        Option<CallCgroup>,
        Option<std::os::fd::OwnedFd>,
        Option<launcher::Launcher>,
    ) {
        let (Some(base), Some(max)) = (&self.cgroup, self.config.rlimits.processes) else {
            return (None, None, None);
        };
        if let Some((c, l)) = self.launchers.as_ref().and_then(launcher::Pool::take) {
            // The fd is for apply_to, whose child is not forked by the launcher.
            match c.open_procs() {
                Ok(fd) => return (Some(c), Some(fd), Some(l)),
                Err(e) => {
                    tracing::warn!(dir = %c.dir().display(), error = %e, "cannot open a parked call cgroup; making another");
                    drop(l);
                }
            }
        }
        match base.create_call(max) {
            Ok((c, fd)) => (Some(c), Some(fd), None),
            Err(e) => {
                tracing::warn!(dir = %base.dir().display(), error = %e, "cannot make a pids cgroup for this call");
                if self.root {
                    warnings.push(format!(
                        "sandbox: no pids cgroup for this call ({e}); the process limit is not enforced for root"
                    ));
                }
                (None, None, None)
            }
        }
    }

    fn limits(&self) -> Vec<Limit> {
        let r = &self.config.rlimits;
        let mut out = Vec::new();
        let mut push = |resource: libc::__rlimit_resource_t, soft: u64, hard: u64| {
            let mut cur = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit(2) into a valid struct.
            let hard_now = if unsafe { libc::getrlimit(resource, &mut cur) } == 0 {
                cur.rlim_max
            } else {
                libc::RLIM_INFINITY
            };
            // Never above the current hard limit: raising it needs a capability.
            let hard = hard.min(hard_now);
            out.push(Limit {
                resource,
                value: libc::rlimit {
                    rlim_cur: soft.min(hard),
                    rlim_max: hard,
                },
            });
        };
        if let Some(s) = r.cpu_seconds {
            // SIGXCPU at the soft limit, SIGKILL one second later.
            push(libc::RLIMIT_CPU, s, s + 1);
        }
        if let Some(b) = r.address_space_bytes {
            push(libc::RLIMIT_AS, b, b);
        }
        if let Some(n) = r.processes {
            push(libc::RLIMIT_NPROC, n, n);
        }
        if let Some(b) = r.file_size_bytes {
            push(libc::RLIMIT_FSIZE, b, b);
        }
        // No core files in the workspace.
        push(libc::RLIMIT_CORE, 0, 0);
        out
    }

    fn ruleset(
        &self,
        policy: SandboxPolicy,
        roots: &Roots,
    ) -> Result<std::os::fd::OwnedFd, SandboxError> {
        let mut call = CallRoots::default();
        let writable_workspace = policy.writes_workspace();
        let ws: &Path = &roots.workspace;
        let configured = self.config.write_roots.iter().map(PathBuf::as_path);
        if writable_workspace {
            call.write.push(ws);
            call.write.extend(configured);
        } else {
            call.read.push(ws);
            call.read.extend(configured);
        }
        // The call's own tmp and infrastructure directories are writable under every policy.
        call.write.extend(roots.tmp.as_deref());
        call.write.extend(roots.write.iter().map(PathBuf::as_path));
        call.read.extend(roots.read.iter().map(PathBuf::as_path));
        call.read
            .extend(self.config.read_roots.iter().map(PathBuf::as_path));
        filesystem::build_ruleset(&self.system, &call)
    }
}

/// A sandbox ready for one process (and what it starts). Spawn a command
/// with it ([`Prepared::spawn`]) and keep it until the process ends.
pub struct Prepared {
    policy: SandboxPolicy,
    setup: Arc<ChildSetup>,
    cgroup: Option<CallCgroup>,
    /// A thread parked in `cgroup` that forks the call's process there.
    launcher: Mutex<Option<launcher::Launcher>>,
    env: Vec<(OsString, OsString)>,
    warnings: Vec<String>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // The launcher leaves the cgroup before the cgroup is removed.
        drop(
            self.launcher
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

/// Why a job on a launcher did not come back (its thread died).
fn launcher_gone() -> std::io::Error {
    std::io::Error::other("the sandbox's launcher thread ended before spawning the command")
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("policy", &self.policy)
            .field("landlock", &self.setup.landlock.is_some())
            .field("seccomp", &self.setup.seccomp.is_some())
            .field(
                "cgroup",
                &self.cgroup.as_ref().map(|c| c.dir().to_path_buf()),
            )
            .field("launcher", &self.has_launcher())
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl Prepared {
    /// The policy it applies.
    pub fn policy(&self) -> SandboxPolicy {
        self.policy
    }

    /// What the caller should tell the user (e.g. Landlock missing under `warn`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Landlock will be enforced.
    pub fn confines_files(&self) -> bool {
        self.setup.landlock.is_some()
    }

    /// Processes and threads in the call's pids cgroup now (None: no cgroup).
    pub fn processes_now(&self) -> Option<u64> {
        self.cgroup.as_ref().and_then(CallCgroup::current)
    }

    /// Kills every process of the call that is still alive (pids cgroup only;
    /// dropping the `Prepared` does the same).
    pub fn kill_all(&self) {
        if let Some(c) = &self.cgroup {
            c.kill_all();
        }
    }

    /// The call's pids cgroup (None: no cgroup).
    pub fn cgroup_dir(&self) -> Option<&Path> {
        self.cgroup.as_ref().map(CallCgroup::dir)
    }

    /// A launcher parked in the call's cgroup is waiting to fork the
    /// command there ([`Prepared::spawn`] uses it).
    pub fn has_launcher(&self) -> bool {
        self.launcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(launcher::Launcher::ready)
    }

    /// Applies the sandbox to `cmd` and spawns it: the way to start a call's
    /// process. Where a launcher is parked in the call's cgroup (root on
    /// cgroup v1), that thread forks the process, so it is born in its
    /// cgroup instead of joining it, which costs a migration and an RCU grace
    /// period (milliseconds); this thread waits meanwhile, as for any spawn.
    /// Otherwise the same as [`Prepared::apply_to`] then `cmd.spawn()`.
    /// Call it instead of `apply_to`, once per `Prepared`.
    pub fn spawn(
        &self,
        cmd: &mut tokio::process::Command,
    ) -> std::io::Result<tokio::process::Child> {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let on_launcher = self.on_launcher(cmd, tokio::process::Command::new("/"), |cmd| {
                self.hook(cmd.as_std_mut(), false);
                move |mut cmd: tokio::process::Command| {
                    // tokio registers the child with the caller's runtime.
                    let _in_runtime = rt.enter();
                    let child = cmd.spawn();
                    (cmd, child)
                }
            });
            if let Some(spawned) = on_launcher {
                return spawned;
            }
            // Without a launcher: the environment is set; add the confinement.
            self.release_launcher();
            self.hook(cmd.as_std_mut(), true);
            return cmd.spawn();
        }
        self.apply_to(cmd);
        cmd.spawn()
    }

    /// [`Prepared::spawn`] for a std command.
    pub fn spawn_std(
        &self,
        cmd: &mut std::process::Command,
    ) -> std::io::Result<std::process::Child> {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let on_launcher = self.on_launcher(cmd, std::process::Command::new("/"), |cmd| {
            self.hook(cmd, false);
            |mut cmd: std::process::Command| {
                let child = cmd.spawn();
                (cmd, child)
            }
        });
        if let Some(spawned) = on_launcher {
            return spawned;
        }
        self.release_launcher();
        self.hook(cmd, true);
        cmd.spawn()
    }

    /// Runs the spawn on the parked launcher: `prepare` adds the child hook
    /// to `cmd` and returns the spawn, which gets `cmd` by value (swapped for
    /// `placeholder` meanwhile) and gives it back. None when there is no
    /// launcher; `prepare` is then not called.
    fn on_launcher<C, R, S>(
        &self,
        cmd: &mut C,
        placeholder: C,
        prepare: impl FnOnce(&mut C) -> S,
    ) -> Option<std::io::Result<R>>
    where
        C: Send + 'static,
        R: Send + 'static,
        S: FnOnce(C) -> (C, std::io::Result<R>) + Send + 'static,
    {
        let mut guard = self.launcher.lock().unwrap_or_else(|e| e.into_inner());
        let launcher = guard.as_mut().filter(|l| l.ready())?;
        let spawn = prepare(cmd);
        let owned = std::mem::replace(cmd, placeholder);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job: launcher::Job = Box::new(move || {
            let _ = tx.send(spawn(owned));
        });
        if launcher.run(job).is_err() {
            return Some(Err(launcher_gone()));
        }
        Some(match rx.recv() {
            Ok((back, spawned)) => {
                *cmd = back;
                spawned
            }
            Err(_) => Err(launcher_gone()),
        })
    }

    /// Lets an unused launcher go: the child will join the cgroup itself,
    /// and the launcher must not count in the cgroup's pids meanwhile.
    fn release_launcher(&self) {
        if let Some(l) = self
            .launcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            l.release();
        }
    }

    fn hook(&self, cmd: &mut std::process::Command, join_cgroup: bool) {
        use std::os::unix::process::CommandExt;
        let setup = self.setup.clone();
        // SAFETY: ChildSetup::enter only makes async-signal-safe syscalls on
        // data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || setup.enter(join_cgroup));
        }
    }

    /// Applies the sandbox to a tokio command: environment now, confinement
    /// in the child after fork, before exec; the child joins the call's
    /// cgroup itself. Prefer [`Prepared::spawn`], which spares it that.
    pub fn apply_to(&self, cmd: &mut tokio::process::Command) {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.release_launcher();
        self.hook(cmd.as_std_mut(), true);
    }

    /// [`Prepared::apply_to`] for a std command.
    pub fn apply_to_std(&self, cmd: &mut std::process::Command) {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.release_launcher();
        self.hook(cmd, true);
    }
}
