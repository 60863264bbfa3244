//! [`Sandbox`]: one per service; probes what the host offers, keeps the
//! sessions' boxes, and starts every confined process in its session's box.

use crate::box_cgroup;
use crate::boxes::{BoxKey, Launch, SessionBox, SpawnRequest};
use crate::config::{ProcessCgroup, WhenMissing};
use crate::disk::{self, DiskMeasure};
use crate::filesystem::{self, LandlockSupport};
use crate::process::{Command, Inner, Placement, Process, Stdio};
use crate::wire::{BoxSpec, Identity, Mount, Rlimit};
use crate::{SandboxConfig, SandboxError, SandboxPolicy, plan};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::OnceCell;

/// How boxes get their namespaces and identity here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The service is root: the namespaces are made as root, and each box
    /// runs as a uid of its own from the configured range.
    Privileged,
    /// Root without the right to make namespaces (a container without
    /// CAP_SYS_ADMIN) but with user namespaces: each box becomes a uid of the
    /// range first, then makes a user namespace over it.
    RootUserNamespace,
    /// An ordinary user: a user namespace maps the service's own ids.
    UserNamespace,
    /// No namespaces can be made (`when_namespaces_missing: warn`): Landlock,
    /// seccomp and limits only, and the range's uids where the service is root.
    NoNamespaces,
}

/// What the sandbox found at start: say it when the service starts.
#[derive(Clone, Debug)]
pub struct Report {
    /// How boxes are made.
    pub mode: Mode,
    /// Why namespaces are missing (NoNamespaces).
    pub namespaces_missing: Option<String>,
    /// Landlock's ABI, if any.
    pub landlock: LandlockSupport,
    /// The cgroup directories boxes are made under, or why there are none.
    pub cgroups: Result<(), String>,
    /// Lines to log at start.
    pub lines: Vec<String>,
}

type Cell = Arc<OnceCell<Arc<SessionBox>>>;
type Boxes = Mutex<HashMap<BoxKey, Cell>>;
/// A session's uid, shared by its boxes (with and without the network),
/// released when the last of them ends.
type Uids = Mutex<HashMap<(String, String), std::sync::Weak<crate::ids::UidLease>>>;

/// The sandbox of one service.
pub struct Sandbox {
    config: SandboxConfig,
    landlock: LandlockSupport,
    report: Report,
    instance: String,
    runtime: PathBuf,
    uid_dir: PathBuf,
    cgroups: Option<box_cgroup::Base>,
    system: (Vec<Mount>, Vec<PathBuf>),
    idmap: AtomicBool,
    boxes: Arc<Boxes>,
    uids: Uids,
    sweeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    disk_watch: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Held for the instance's life: a later instance sweeps our runtime
    /// directory only once we are gone.
    _lock: std::fs::File,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("mode", &self.report.mode)
            .field("landlock", &self.landlock)
            .field("instance", &self.instance)
            .field("boxes", &self.boxes.lock().map(|b| b.len()).unwrap_or(0))
            .finish()
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Forks a child that runs `setup` and exits 0 when it returned true.
fn probe(setup: impl Fn() -> bool + Send + Sync + 'static) -> bool {
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: `setup` only makes raw syscalls (unshare, setres*id).
        unsafe {
            cmd.pre_exec(move || {
                if setup() {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    cmd.status().is_ok_and(|s| s.success())
}

const BOX_NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWNET;

/// Which mode this host allows (and, when none, why).
fn detect_mode(config: &SandboxConfig) -> (Mode, Option<String>) {
    if is_root() {
        // SAFETY: unshare(2) in a forked child.
        if probe(|| unsafe { libc::unshare(BOX_NAMESPACES) } == 0) {
            return (Mode::Privileged, None);
        }
        let uid = config.uid_start;
        if probe(move || {
            let g = [uid];
            // SAFETY: raw id changes and unshare(2) in a forked child.
            unsafe {
                libc::setgroups(1, g.as_ptr()) == 0
                    && libc::setresgid(uid, uid, uid) == 0
                    && libc::setresuid(uid, uid, uid) == 0
                    && libc::unshare(libc::CLONE_NEWUSER | BOX_NAMESPACES) == 0
            }
        }) {
            return (Mode::RootUserNamespace, None);
        }
        return (
            Mode::NoNamespaces,
            Some(
                "as root, neither making namespaces (CAP_SYS_ADMIN) nor user namespaces work here"
                    .into(),
            ),
        );
    }
    // SAFETY: unshare(2) in a forked child.
    if probe(|| unsafe { libc::unshare(libc::CLONE_NEWUSER | BOX_NAMESPACES) } == 0) {
        return (Mode::UserNamespace, None);
    }
    (
        Mode::NoNamespaces,
        Some("the service is not root and unprivileged user namespaces are refused".into()),
    )
}

/// The runtime directory's default: `/run/omicos-sandbox` as root, else the
/// user's runtime directory or the temp directory.
fn default_runtime(config: &SandboxConfig) -> PathBuf {
    if let Some(d) = &config.runtime_dir {
        return d.clone();
    }
    if let Some(t) = &config.tmp_root {
        return t.clone();
    }
    if is_root() && Path::new("/run").is_dir() {
        return PathBuf::from("/run/omicos-sandbox");
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && x.is_dir()
    {
        return x.join("omicos-sandbox");
    }
    // SAFETY: geteuid has no preconditions.
    std::env::temp_dir().join(format!("omicos-sandbox-{}", unsafe { libc::geteuid() }))
}

/// A directory owned by us, mode 0700, and not a symlink (the system temp
/// dir is shared: someone else may have made the name first).
fn private_dir(path: &Path) -> Result<(), SandboxError> {
    let err = |reason: String| SandboxError::Dir {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me {
        return Err(err(format!(
            "exists but is not a directory owned by uid {me}; remove it or set sandbox.runtime_dir"
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err(e.to_string()))?;
    }
    Ok(())
}

/// Removes runtime directories of instances that are gone (their lock is
/// free) and names them: only their cgroups may be swept too.
fn sweep_runtime(runtime_root: &Path, keep: &str) -> Vec<String> {
    let mut gone = Vec::new();
    let Ok(entries) = std::fs::read_dir(runtime_root) else {
        return gone;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("i-") || name == keep {
            continue;
        }
        let lock = e.path().join("lock");
        let Ok(f) = std::fs::File::open(&lock) else {
            continue;
        };
        // SAFETY: flock(2) on a file we opened.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_dir_all(e.path());
            gone.push(name.to_string());
        }
    }
    gone
}

/// A sandbox made for a config, held weakly: gone with its last user.
type SharedEntry = (SandboxConfig, std::sync::Weak<Sandbox>);

/// The sandboxes of this process, by config: see [`Sandbox::shared`].
static SHARED: std::sync::LazyLock<Mutex<Vec<SharedEntry>>> =
    std::sync::LazyLock::new(Mutex::default);

impl Sandbox {
    /// The process's sandbox for `config`: made on first use, then the same
    /// one for every part of the process that asks with an equal config (the
    /// shell and the MCP servers of a runner). One sandbox means one box and
    /// one uid per session, whichever tool started it, so a file one tool
    /// wrote in the workspace is the other's too, and ending the session ends
    /// all of it.
    pub fn shared(config: SandboxConfig) -> Result<Arc<Self>, SandboxError> {
        let mut all = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        if let Some(s) = all
            .iter()
            .find(|(c, _)| *c == config)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(s);
        }
        let s = Arc::new(Self::new(config.clone())?);
        all.push((config, Arc::downgrade(&s)));
        Ok(s)
    }

    /// Validates `config`, probes Landlock, namespaces and cgroups, and
    /// prepares the runtime directory. Boxes start on first use.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        config.validate()?;
        // The zygote's entry must be linked into this binary (see `zygote`).
        std::hint::black_box(&crate::zygote::ENTRY);
        let landlock = if config.simulate_landlock_missing {
            LandlockSupport::Missing
        } else {
            filesystem::probe()
        };
        let (mode, ns_why) = detect_mode(&config);
        let instance = format!("i-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let runtime_root = default_runtime(&config);
        private_dir(&runtime_root)?;
        let gone = sweep_runtime(&runtime_root, &instance);
        let runtime = runtime_root.join(&instance);
        private_dir(&runtime)?;
        let lock = std::fs::File::create(runtime.join("lock")).map_err(|e| SandboxError::Dir {
            path: runtime.clone(),
            reason: e.to_string(),
        })?;
        // SAFETY: flock(2) on a file we just made.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        let mut cg_why = String::new();
        let cgroups = match &config.process_cgroup {
            ProcessCgroup::Off => {
                cg_why = "sandbox.process_cgroup is off".into();
                None
            }
            ProcessCgroup::Auto => {
                box_cgroup::Base::detect(Path::new("/sys/fs/cgroup"), &instance, &mut cg_why)
            }
            ProcessCgroup::Dir(d) => box_cgroup::Base::detect(d, &instance, &mut cg_why),
        };
        if let Some(c) = &cgroups {
            c.sweep_gone(&gone);
        }
        let mut lines = Vec::new();
        lines.push(match mode {
            Mode::Privileged => format!(
                "sandbox: boxes run as uids {}..{} in namespaces of their own (root)",
                config.uid_start,
                config.uid_start as u64 + config.uid_count as u64
            ),
            Mode::RootUserNamespace => format!(
                "sandbox: boxes run as uids {}..{} behind user namespaces (root without CAP_SYS_ADMIN)",
                config.uid_start,
                config.uid_start as u64 + config.uid_count as u64
            ),
            Mode::UserNamespace => "sandbox: boxes run as this user behind user namespaces (not root: no uid of their own)".into(),
            Mode::NoNamespaces => format!(
                "sandbox: NO namespaces ({}); confined tools are {}",
                ns_why.clone().unwrap_or_default(),
                match config.when_namespaces_missing {
                    WhenMissing::Refuse => "refused (sandbox.when_namespaces_missing: refuse)",
                    WhenMissing::Warn => "run with Landlock, seccomp and limits only (when_namespaces_missing: warn)",
                }
            ),
        });
        match landlock {
            LandlockSupport::Available(v) => lines.push(format!("sandbox: Landlock ABI {v}")),
            LandlockSupport::Missing => lines.push(format!(
                "sandbox: NO Landlock; confined tools are {}",
                match config.when_landlock_missing {
                    WhenMissing::Refuse => "refused",
                    WhenMissing::Warn => "run without it (when_landlock_missing: warn)",
                }
            )),
        }
        lines.push(match &cgroups {
            Some(_) => "sandbox: each box gets a cgroup (memory, pids, cpu)".into(),
            None => format!(
                "sandbox: NO cgroup for boxes ({cg_why}): memory and process bounds per session fall back to per-process rlimits"
            ),
        });
        let report = Report {
            mode,
            namespaces_missing: ns_why,
            landlock,
            cgroups: if cgroups.is_some() {
                Ok(())
            } else {
                Err(cg_why)
            },
            lines,
        };
        Ok(Self {
            system: plan::system_mounts(&config),
            idmap: AtomicBool::new(config.idmap && mode == Mode::Privileged),
            uid_dir: runtime_root.join("uids"),
            config,
            landlock,
            report,
            instance,
            runtime,
            cgroups,
            boxes: Arc::new(Mutex::new(HashMap::new())),
            uids: Mutex::new(HashMap::new()),
            sweeper: Mutex::new(None),
            disk_watch: Mutex::new(None),
            _lock: lock,
        })
    }

    /// The config it was made with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// What the kernel offers.
    pub fn landlock(&self) -> LandlockSupport {
        self.landlock
    }

    /// What was found at start (log its `lines`).
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// How a workspace is measured against `session_limits.workspace_bytes`
    /// (by the disk watchdog, and by whoever else holds writes to the bound):
    /// without omicos's own state where boxes' views hide it, everything
    /// where they have no view of their own.
    pub fn disk_measure(&self) -> DiskMeasure {
        if self.report.mode == Mode::NoNamespaces {
            DiskMeasure::Everything
        } else {
            DiskMeasure::WithoutOwnState
        }
    }

    /// Logs the report (services call this once at start).
    pub fn log_report(&self) {
        for l in &self.report.lines {
            if l.contains("NO ") {
                tracing::warn!("{l}");
            } else {
                tracing::info!("{l}");
            }
        }
    }

    /// The boxes running now.
    pub fn boxes(&self) -> Vec<Arc<SessionBox>> {
        self.boxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|c| c.get().cloned())
            .collect()
    }

    /// Ends every box of `session` (its processes die with it); returns how many.
    pub fn end_session(&self, tenant: &str, session: &str) -> usize {
        let ended: Vec<Cell> = {
            let mut map = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<BoxKey> = map
                .keys()
                .filter(|k| k.tenant == tenant && k.session == session)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        let mut n = 0;
        for c in ended {
            if let Some(b) = c.get() {
                b.end();
                n += 1;
            }
        }
        if n > 0 {
            tracing::info!(
                tenant,
                session,
                boxes = n,
                "ended the session's sandbox boxes"
            );
        }
        n
    }

    /// Hands the boxes of `(from_tenant, from_session)` (a warm kernel's) to
    /// `(tenant, session)`.
    pub fn adopt(&self, from: (&str, &str), to: (&str, &str)) {
        {
            let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = uids.remove(&(from.0.to_owned(), from.1.to_owned())) {
                uids.insert((to.0.to_owned(), to.1.to_owned()), l);
            }
        }
        let mut map = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<BoxKey> = map
            .keys()
            .filter(|k| k.tenant == from.0 && k.session == from.1)
            .cloned()
            .collect();
        for k in keys {
            if let Some(c) = map.remove(&k) {
                let mut nk = k;
                nk.tenant = to.0.to_owned();
                nk.session = to.1.to_owned();
                map.insert(nk, c);
            }
        }
    }

    /// Ends boxes that ran nothing for `idle_timeout`; returns how many.
    pub fn end_idle(&self) -> usize {
        end_idle(&self.boxes, self.config.idle_timeout)
    }

    fn refuse(&self, policy: SandboxPolicy) -> Result<Vec<String>, SandboxError> {
        let mut warnings = Vec::new();
        if self.landlock == LandlockSupport::Missing {
            match self.config.when_landlock_missing {
                WhenMissing::Refuse => return Err(SandboxError::LandlockMissing { policy }),
                WhenMissing::Warn => warnings.push(format!(
                    "sandbox: the kernel offers no Landlock, so this `{policy}` command ran without its second layer of file-access confinement"
                )),
            }
        }
        if self.report.mode == Mode::NoNamespaces {
            let why = self.report.namespaces_missing.clone().unwrap_or_default();
            match self.config.when_namespaces_missing {
                WhenMissing::Refuse => return Err(SandboxError::NamespacesMissing { policy, why }),
                WhenMissing::Warn => warnings.push(format!(
                    "sandbox: no namespaces here ({why}), so this `{policy}` command ran without a filesystem view or pid namespace of its own"
                )),
            }
        }
        Ok(warnings)
    }

    /// The environment of every process: the allowlist, the deployment's
    /// declared variables, then the command's own.
    fn environment(&self, cmd: &Command, namespaces: bool, private: &Path) -> Vec<String> {
        let (tmp, home) = if namespaces {
            (PathBuf::from(plan::BOX_TMP), PathBuf::from(plan::BOX_HOME))
        } else {
            (private.join("tmp"), private.join("tmp/home"))
        };
        let lang = std::env::var("LANG")
            .ok()
            .filter(|l| !l.is_empty() && l.len() < 64 && !l.contains('\n'))
            .unwrap_or_else(|| "C.UTF-8".into());
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), crate::config::DEFAULT_PATH.into()),
            ("LANG".into(), lang),
            ("HOME".into(), home.display().to_string()),
            ("TMPDIR".into(), tmp.display().to_string()),
            ("TMP".into(), tmp.display().to_string()),
            ("TEMP".into(), tmp.display().to_string()),
            ("TERM".into(), "dumb".into()),
            ("USER".into(), "sandbox".into()),
            ("LOGNAME".into(), "sandbox".into()),
        ];
        for (k, v) in self
            .config
            .env
            .iter()
            .chain(cmd.env.iter().map(|(k, v)| (k, v)))
        {
            if let Some(e) = env.iter_mut().find(|(ek, _)| ek == k) {
                e.1 = v.clone();
            } else {
                env.push((k.clone(), v.clone()));
            }
        }
        env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    fn rlimits(&self, cmd: &Command) -> Vec<Rlimit> {
        let r = &self.config.rlimits;
        let mut out = Vec::new();
        let mut push = |resource: libc::__rlimit_resource_t, value: u64| {
            let mut cur = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit(2) into a valid struct.
            let hard = if unsafe { libc::getrlimit(resource, &mut cur) } == 0 {
                cur.rlim_max
            } else {
                libc::RLIM_INFINITY
            };
            // Never above the current hard limit: raising it needs a capability.
            out.push(Rlimit {
                resource: resource as i32,
                value: value.min(hard),
            });
        };
        let cpu = cmd.cpu_seconds.unwrap_or(r.cpu_seconds);
        if let Some(s) = cpu {
            push(libc::RLIMIT_CPU, s);
        }
        if let Some(b) = r.address_space_bytes {
            push(libc::RLIMIT_AS, b);
        }
        if let Some(n) = r.processes {
            push(libc::RLIMIT_NPROC, n);
        }
        if let Some(b) = r.file_size_bytes {
            push(libc::RLIMIT_FSIZE, b);
        }
        // No core files in the workspace.
        push(libc::RLIMIT_CORE, 0);
        out
    }

    /// Starts `cmd` for `place`: in the session's box (started on first
    /// use), or on the host under `danger-full-access`.
    pub async fn spawn(
        &self,
        place: &Placement,
        mut cmd: Command,
    ) -> Result<Process, SandboxError> {
        let workspace = place
            .workspace
            .canonicalize()
            .map_err(|e| SandboxError::Dir {
                path: place.workspace.clone(),
                reason: format!("the workspace cannot be used: {e}"),
            })?;
        if !place.policy.is_confined() {
            return self.spawn_on_host(&workspace, cmd);
        }
        let warnings = self.refuse(place.policy)?;
        let sbox = self.session_box(self.key(place, &workspace)).await?;
        let namespaces = self.report.mode != Mode::NoNamespaces;
        let env = self.environment(&cmd, namespaces, sbox.private_dir());
        let rlimits = self.rlimits(&cmd);
        let mut argv = vec![cmd.program.clone()];
        argv.append(&mut cmd.args);
        let req = SpawnRequest {
            argv,
            env,
            cwd: cmd.cwd.clone().unwrap_or_else(|| workspace.clone()),
            read_only: !place.policy.writes_workspace(),
            stdio: std::mem::take(&mut cmd.stdio),
            rlimits,
            interrupt_on_bound: cmd.interrupt_on_bound,
        };
        let (child, [stdin, stdout, stderr]) =
            sbox.spawn(req).await.map_err(SandboxError::Spawn)?;
        Ok(Process {
            inner: Inner::Boxed(child),
            stdin: stdin
                .map(tokio::net::unix::pipe::Sender::from_owned_fd)
                .transpose()
                .map_err(SandboxError::Spawn)?,
            stdout: stdout
                .map(tokio::net::unix::pipe::Receiver::from_owned_fd)
                .transpose()
                .map_err(SandboxError::Spawn)?,
            stderr: stderr
                .map(tokio::net::unix::pipe::Receiver::from_owned_fd)
                .transpose()
                .map_err(SandboxError::Spawn)?,
            warnings,
        })
    }

    fn key(&self, place: &Placement, workspace: &Path) -> BoxKey {
        BoxKey {
            tenant: place.tenant.clone(),
            session: place.session.clone(),
            network: place.policy.allows_network(),
            writable: place.policy.writes_workspace(),
            workspace: workspace.to_path_buf(),
            read: place.read.clone(),
            write: place.write.clone(),
            bind: place.bind.clone(),
        }
    }

    /// The box `place` runs in, started if there is none yet (None under
    /// `danger-full-access`): for files a call needs in the box's private
    /// directory before it starts (a kernel's connection file).
    pub async fn prepare_box(
        &self,
        place: &Placement,
    ) -> Result<Option<Arc<SessionBox>>, SandboxError> {
        if !place.policy.is_confined() {
            return Ok(None);
        }
        self.refuse(place.policy)?;
        let workspace = place
            .workspace
            .canonicalize()
            .map_err(|e| SandboxError::Dir {
                path: place.workspace.clone(),
                reason: format!("the workspace cannot be used: {e}"),
            })?;
        self.session_box(self.key(place, &workspace))
            .await
            .map(Some)
    }

    /// `danger-full-access`: no box, but the clean environment and a process
    /// group of its own.
    fn spawn_on_host(&self, workspace: &Path, mut cmd: Command) -> Result<Process, SandboxError> {
        let private = self.runtime.join("host");
        private_dir(&private)?;
        let _ = std::fs::create_dir_all(private.join("tmp/home"));
        let env = self.environment(&cmd, false, &private);
        let mut c = tokio::process::Command::new(&cmd.program);
        c.args(&cmd.args)
            .env_clear()
            .current_dir(cmd.cwd.clone().unwrap_or_else(|| workspace.to_path_buf()))
            .process_group(0)
            .kill_on_drop(true);
        for kv in env {
            if let Some((k, v)) = kv.split_once('=') {
                c.env(k, v);
            }
        }
        let stdio = std::mem::take(&mut cmd.stdio);
        let [i, o, e] = stdio.map(|s| match s {
            Stdio::Null => std::process::Stdio::null(),
            Stdio::Piped => std::process::Stdio::piped(),
            Stdio::Fd(fd) => std::process::Stdio::from(fd),
        });
        c.stdin(i).stdout(o).stderr(e);
        let mut child = c.spawn().map_err(|e| {
            SandboxError::Spawn(std::io::Error::new(
                e.kind(),
                format!("cannot run {}: {e}", cmd.program),
            ))
        })?;
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        let to_fd = |fd: std::io::Result<OwnedFd>| fd.map_err(SandboxError::Spawn);
        let stdin = child
            .stdin
            .take()
            .map(|s| {
                to_fd(s.into_owned_fd()).and_then(|f| {
                    tokio::net::unix::pipe::Sender::from_owned_fd(f).map_err(SandboxError::Spawn)
                })
            })
            .transpose()?;
        let stdout = child
            .stdout
            .take()
            .map(|s| {
                to_fd(s.into_owned_fd()).and_then(|f| {
                    tokio::net::unix::pipe::Receiver::from_owned_fd(f).map_err(SandboxError::Spawn)
                })
            })
            .transpose()?;
        let stderr = child
            .stderr
            .take()
            .map(|s| {
                to_fd(s.into_owned_fd()).and_then(|f| {
                    tokio::net::unix::pipe::Receiver::from_owned_fd(f).map_err(SandboxError::Spawn)
                })
            })
            .transpose()?;
        Ok(Process {
            inner: Inner::Host {
                child,
                pgid,
                status: None,
            },
            stdin,
            stdout,
            stderr,
            warnings: Vec::new(),
        })
    }

    /// The session's box for `key`, started when there is none (one start
    /// at a time per key; a dead box is replaced).
    async fn session_box(&self, key: BoxKey) -> Result<Arc<SessionBox>, SandboxError> {
        self.start_sweeper();
        self.start_disk_watch();
        loop {
            let cell = {
                let mut map = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
                map.entry(key.clone()).or_default().clone()
            };
            let b = cell
                .get_or_try_init(|| self.start_box(key.clone()))
                .await?
                .clone();
            if b.death().is_none() {
                return Ok(b);
            }
            let mut map = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
            if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                map.remove(&key);
            }
        }
    }

    fn start_sweeper(&self) {
        let mut s = self.sweeper.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_some() || self.config.idle_timeout.is_zero() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let boxes: Weak<Boxes> = Arc::downgrade(&self.boxes);
        let idle = self.config.idle_timeout;
        let every = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(60));
        *s = Some(rt.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(b) = boxes.upgrade() else { return };
                end_idle(&b, idle);
            }
        }));
    }

    /// Starts the disk watchdog (once): while a box has calls running, the
    /// workspace it writes is measured, and its calls are stopped when the
    /// workspace grew past `session_limits.workspace_bytes` or its filesystem
    /// shrank below `min_free_bytes` (see [`disk`]).
    fn start_disk_watch(&self) {
        let limits = disk::Limits {
            workspace_bytes: self.config.session_limits.workspace_bytes,
            min_free_bytes: self.config.session_limits.min_free_bytes,
            measure: self.disk_measure(),
        };
        if limits.workspace_bytes.is_none() && limits.min_free_bytes.is_none() {
            return;
        }
        let mut s = self.disk_watch.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let boxes: Weak<Boxes> = Arc::downgrade(&self.boxes);
        *s = Some(rt.spawn(async move {
            let mut watch = disk::Watch::default();
            loop {
                tokio::time::sleep(disk::CHECK_EVERY).await;
                let busy: Vec<Arc<SessionBox>> = {
                    let Some(b) = boxes.upgrade() else { return };
                    let map = b.lock().unwrap_or_else(|e| e.into_inner());
                    map.values()
                        .filter_map(|c| c.get().cloned())
                        // A read-only box cannot grow the workspace: never stopped for it.
                        .filter(|b| b.busy() > 0 && b.key.writable)
                        .collect()
                };
                if busy.is_empty() {
                    watch.forget_all();
                    continue;
                }
                let workspaces: Vec<PathBuf> = {
                    let mut w: Vec<PathBuf> =
                        busy.iter().map(|b| b.workspace().to_path_buf()).collect();
                    w.sort();
                    w.dedup();
                    w
                };
                let checked = tokio::task::spawn_blocking(move || {
                    let notes: Vec<(PathBuf, String)> = workspaces
                        .into_iter()
                        .filter_map(|ws| watch.check(&ws, limits).map(|n| (ws, n)))
                        .collect();
                    (watch, notes)
                })
                .await;
                let Ok((w, notes)) = checked else { return };
                watch = w;
                for (ws, note) in notes {
                    for b in busy.iter().filter(|b| b.workspace() == ws) {
                        tracing::warn!(session = %b.key.session, workspace = %ws.display(), "{note}");
                        b.trip_disk(note.clone());
                    }
                }
            }
        }));
    }

    async fn start_box(&self, key: BoxKey) -> Result<Arc<SessionBox>, SandboxError> {
        let first = self.launch(&key, self.idmap.load(Ordering::SeqCst))?;
        match SessionBox::start(first).await {
            Ok(b) => Ok(b),
            // A filesystem without idmapped mounts: go on without them, once.
            Err(why) if why.contains("idmap") && self.idmap.swap(false, Ordering::SeqCst) => {
                tracing::warn!(error = %why, "sandbox: idmapped mounts do not work here; boxes bind the workspace as is (the service's files are read-only to them)");
                SessionBox::start(self.launch(&key, false)?)
                    .await
                    .map_err(SandboxError::Box)
            }
            // The box's cgroup went away between its creation and the
            // zygote's join (ENODEV; an operator's or another service's
            // sweep): once more, in a new one.
            Err(why) if why.contains(&format!("(os error {})", libc::ENODEV)) => {
                tracing::warn!(error = %why, "sandbox: the box's cgroup was removed before the box joined it; starting it again");
                SessionBox::start(self.launch(&key, self.idmap.load(Ordering::SeqCst))?)
                    .await
                    .map_err(SandboxError::Box)
            }
            Err(why) => Err(SandboxError::Box(why)),
        }
    }

    fn launch(&self, key: &BoxKey, idmap: bool) -> Result<Launch, SandboxError> {
        let id = format!("b-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let dir = self.runtime.join(&id);
        let dir_err = |e: std::io::Error| SandboxError::Dir {
            path: dir.clone(),
            reason: e.to_string(),
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(dir_err)?;
        // omicos's own state in the workspace must be a real directory of
        // the service before a box starts: hidden in the view, never a
        // symlink the box made.
        ensure_state_dir(&key.workspace)?;
        let root = is_root();
        let lease = if root {
            let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
            uids.retain(|_, w| w.strong_count() > 0);
            let k = (key.tenant.clone(), key.session.clone());
            match uids.get(&k).and_then(std::sync::Weak::upgrade) {
                Some(l) => Some(l),
                None => {
                    let l = Arc::new(
                        crate::ids::lease(
                            &self.uid_dir,
                            self.config.uid_start,
                            self.config.uid_count,
                        )
                        .map_err(|e| SandboxError::Box(e.to_string()))?,
                    );
                    uids.insert(k, Arc::downgrade(&l));
                    Some(l)
                }
            }
        } else {
            None
        };
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = match &lease {
            Some(l) => (l.uid(), l.uid()),
            None => unsafe { (libc::getuid(), libc::getgid()) },
        };
        if root {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(dir_err)?;
        }
        let mode = self.report.mode;
        let namespaces = mode != Mode::NoNamespaces;
        let identity = match mode {
            Mode::Privileged => Identity::Privileged { uid, gid, idmap },
            _ => Identity::UserNamespace { uid, gid },
        };
        let setuid_first = (root && mode != Mode::Privileged).then_some((uid, gid));
        let landlock_on = matches!(self.landlock, LandlockSupport::Available(_));
        let (mounts, landlock) = if namespaces {
            let v = plan::view(
                &self.config,
                &self.system,
                &key.workspace,
                key.writable,
                &key.read,
                &key.write,
                &key.bind,
                &dir,
                landlock_on,
            );
            (v.mounts, v.landlock)
        } else {
            let tmp = dir.join("tmp");
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(tmp.join("home"))
                .map_err(dir_err)?;
            if root {
                for d in [&tmp, &tmp.join("home")] {
                    std::os::unix::fs::chown(d, Some(uid), Some(gid)).map_err(dir_err)?;
                }
            }
            (
                Vec::new(),
                plan::host_landlock(
                    &self.config,
                    &key.workspace,
                    &key.read,
                    &key.write,
                    &dir,
                    landlock_on,
                ),
            )
        };
        let mut domains = vec![libc::AF_UNIX];
        if key.network || namespaces {
            // In a box without the network, AF_INET reaches only its own loopback.
            // Netlink too: ZeroMQ (the kernels) lists interfaces with it; in
            // a box without the network it sees only the box's own loopback.
            domains.extend([libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]);
        }
        let limits = &self.config.session_limits;
        let cgroup = match &self.cgroups {
            Some(base) => match base.create(
                &id,
                &box_cgroup::Limits {
                    memory_bytes: limits.memory_bytes,
                    processes: limits.processes,
                    cpu_millis: limits.cpus.map(|c| (c * 1000.0) as u64),
                },
            ) {
                Ok(c) => Some(c),
                Err(e) => {
                    return Err(SandboxError::Box(format!(
                        "cannot make the box's cgroup: {e}"
                    )));
                }
            },
            None => None,
        };
        let spec = BoxSpec {
            identity,
            namespaces,
            private_net: namespaces && !key.network,
            mounts,
            passwd_line: format!(
                "sandbox:x:{uid}:{gid}:omicos sandbox:{}:/bin/bash",
                plan::BOX_HOME
            ),
            group_line: format!("sandbox:x:{gid}:"),
            landlock,
            socket_domains: domains,
            hostname: "omicos".into(),
        };
        Ok(Launch {
            key: key.clone(),
            id,
            dir,
            spec,
            cgroup,
            lease,
            setuid_first,
            memory_bound: limits.memory_bytes,
        })
    }
}

/// Makes `<workspace>/.omicos` a directory of the service (mode 0700),
/// refusing a symlink or someone else's directory there.
fn ensure_state_dir(workspace: &Path) -> Result<(), SandboxError> {
    let state = workspace.join(plan::STATE_DIR);
    let err = |reason: String| SandboxError::Dir {
        path: state.clone(),
        reason,
    };
    match std::fs::symlink_metadata(&state) {
        Ok(m) if m.file_type().is_symlink() || !m.is_dir() => {
            return Err(err(
                "is not a directory of the service (a symlink or a file): omicos's state cannot be kept apart here; remove it".into(),
            ));
        }
        Ok(m) => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me {
                return Err(err(format!(
                    "is owned by uid {}, not the service (uid {me}); remove it",
                    m.uid()
                )));
            }
        }
        Err(_) => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&state)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(())
}

fn end_idle(boxes: &Boxes, idle: Duration) -> usize {
    if idle.is_zero() {
        return 0;
    }
    let ended: Vec<Arc<SessionBox>> = {
        let mut map = boxes.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<BoxKey> = map
            .iter()
            .filter(|(_, c)| {
                c.get()
                    .is_some_and(|b| b.death().is_some() || (b.busy() == 0 && b.idle_for() >= idle))
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| map.remove(k))
            .filter_map(|c| c.get().cloned())
            .collect()
    };
    for b in &ended {
        tracing::debug!(box_id = b.id(), session = %b.key.session, "ending an idle sandbox box");
        b.end();
    }
    ended.len()
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for task in [&self.sweeper, &self.disk_watch] {
            if let Some(s) = task.lock().unwrap_or_else(|e| e.into_inner()).take() {
                s.abort();
            }
        }
        let all: Vec<Cell> = self
            .boxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, c)| c)
            .collect();
        for c in all {
            if let Some(b) = c.get() {
                b.end();
            }
        }
        if let Some(c) = &self.cgroups {
            c.remove();
        }
        let _ = std::fs::remove_dir_all(&self.runtime);
    }
}
