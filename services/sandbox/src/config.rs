//! The `sandbox` config section shared by the runner (shell) and the kernel
//! provider.

use crate::SandboxPolicy;
use omicos_servicekit::config::duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Default CPU seconds of one shell call's processes (each process has its own count).
pub const DEFAULT_CPU_SECONDS: u64 = 600;
/// Default address space of one process: large enough for runtimes that reserve
/// big virtual ranges (JVM, V8), small enough to stop a runaway allocation.
pub const DEFAULT_ADDRESS_SPACE_BYTES: u64 = 8 << 30;
/// Default number of processes (threads count too) of one call or kernel.
pub const DEFAULT_PROCESSES: u64 = 512;

/// Default launcher threads parked in fresh call cgroups (root on cgroup v1):
/// enough for a few calls starting at once; each is a sleeping thread and an
/// empty cgroup. A call that finds none parked still gets its cgroup, slower.
pub const DEFAULT_PROCESS_CGROUP_LAUNCHERS: usize = 4;

/// System directories readable (and executable) under every confined policy.
/// `/etc` minus [`DEFAULT_HIDDEN`]; `/proc` is safe to read because Landlock
/// denies ptrace-class access (`/proc/<pid>/environ`, `mem`) to processes
/// outside the sandbox.
pub const DEFAULT_SYSTEM_READ_ROOTS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys",
];

/// Paths under the system roots that stay unreadable: secrets root could read.
pub const DEFAULT_HIDDEN: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
];

/// The first uid (and gid) of the range boxes run as when the service is
/// root: far above the ids of people and system accounts, and above the
/// ranges `/etc/subuid` hands out for rootless containers.
pub const DEFAULT_UID_START: u32 = 2_000_000_000;
/// How many ids the range holds: one box holds one.
pub const DEFAULT_UID_COUNT: u32 = 1_000_000;
/// Memory of one session's box: enough for a data-science kernel and its
/// shell, small enough that one session cannot take a shared host.
pub const DEFAULT_SESSION_MEMORY_BYTES: u64 = 4 << 30;
/// Processes and threads in one session's box.
pub const DEFAULT_SESSION_PROCESSES: u64 = 1024;
/// The box's `/tmp` (a tmpfs: bounded, and charged to the box's memory).
pub const DEFAULT_TMP_BYTES: u64 = 1 << 30;
/// The box's `/dev/shm` (multiprocessing's semaphores and shared arrays).
pub const DEFAULT_SHM_BYTES: u64 = 256 << 20;
/// A tenant's workspace may hold this much while its sandboxed code runs.
pub const DEFAULT_WORKSPACE_BYTES: u64 = 50 << 30;
/// Sandboxed code stops before the workspace's filesystem has less free.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 512 << 20;
/// A box that ran nothing for this long is ended (its session's kernel
/// has its own idle timeout and ends its box with it).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(1800);
/// What boxed processes find on PATH.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to do when a confinement layer (Landlock, namespaces) is missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenMissing {
    /// Refuse to run confined commands (the safe default).
    #[default]
    Refuse,
    /// Run with the layers there are, and say what is missing in a warning.
    Warn,
}

/// The earlier name of [`WhenMissing`].
pub type WhenLandlockMissing = WhenMissing;

/// The bounds of one session's box.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionLimits {
    /// Memory of the box, its tmpfs directories included (a cgroup); the
    /// process the kernel's OOM killer ends is reported as over this bound.
    pub memory_bytes: Option<u64>,
    /// Processes and threads in the box (a pids cgroup).
    pub processes: Option<u64>,
    /// CPUs the box may keep busy at once (a CPU quota); null: no quota.
    pub cpus: Option<f64>,
    /// Size of the box's `/tmp`.
    pub tmp_bytes: u64,
    /// Size of the box's `/dev/shm`.
    pub shm_bytes: u64,
    /// The most a tenant's workspace may hold while its sandboxed code runs:
    /// a call that grows it past this is stopped with an error saying so.
    pub workspace_bytes: Option<u64>,
    /// Sandboxed code is stopped before the workspace's filesystem has less free space.
    pub min_free_bytes: Option<u64>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            memory_bytes: Some(DEFAULT_SESSION_MEMORY_BYTES),
            processes: Some(DEFAULT_SESSION_PROCESSES),
            cpus: None,
            tmp_bytes: DEFAULT_TMP_BYTES,
            shm_bytes: DEFAULT_SHM_BYTES,
            workspace_bytes: Some(DEFAULT_WORKSPACE_BYTES),
            min_free_bytes: Some(DEFAULT_MIN_FREE_BYTES),
        }
    }
}

/// Where per-call process-count cgroups are made.
///
/// RLIMIT_NPROC is not enforced for root (the kernel exempts uid 0), so the
/// process limit also lives in a pids cgroup when one can be created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ProcessCgroup {
    /// As root (where RLIMIT_NPROC does not hold), find a writable pids
    /// hierarchy (cgroup v1 `pids`, or v2 with `pids` in
    /// `cgroup.subtree_control`); otherwise, or when none is found,
    /// RLIMIT_NPROC only. Joining a cgroup costs the call an RCU grace period
    /// (a few ms on cgroup v1), so it is used only where it is needed.
    #[default]
    Auto,
    /// RLIMIT_NPROC only.
    Off,
    /// Make per-call cgroups under this directory (a delegated cgroup).
    Dir(PathBuf),
}

impl TryFrom<String> for ProcessCgroup {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "auto" | "" => Ok(ProcessCgroup::Auto),
            "off" => Ok(ProcessCgroup::Off),
            p if p.starts_with('/') => Ok(ProcessCgroup::Dir(PathBuf::from(p))),
            other => Err(format!(
                "`{other}`: expected auto, off or an absolute cgroup directory"
            )),
        }
    }
}

impl From<ProcessCgroup> for String {
    fn from(c: ProcessCgroup) -> String {
        match c {
            ProcessCgroup::Auto => "auto".into(),
            ProcessCgroup::Off => "off".into(),
            ProcessCgroup::Dir(p) => p.display().to_string(),
        }
    }
}

/// Resource limits of one call (or one kernel). `None`: not limited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rlimits {
    /// RLIMIT_CPU of each process, in seconds (SIGXCPU, then SIGKILL a second later).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_AS of each process, in bytes: allocations beyond it fail.
    pub address_space_bytes: Option<u64>,
    /// Processes and threads: a pids cgroup per call where one can be made,
    /// and RLIMIT_NPROC (which counts every process of the user and is
    /// ignored for root).
    pub processes: Option<u64>,
    /// RLIMIT_FSIZE: the largest file a process may write, in bytes.
    pub file_size_bytes: Option<u64>,
}

impl Default for Rlimits {
    fn default() -> Self {
        Self {
            cpu_seconds: Some(DEFAULT_CPU_SECONDS),
            address_space_bytes: Some(DEFAULT_ADDRESS_SPACE_BYTES),
            processes: Some(DEFAULT_PROCESSES),
            file_size_bytes: None,
        }
    }
}

/// The `sandbox` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Policy of a call that names none.
    pub policy: SandboxPolicy,
    /// Policy per agent id, overriding `policy` (e.g. `{data-fetcher: network}`).
    pub agent_policies: BTreeMap<String, SandboxPolicy>,
    /// Readable and executable system directories (missing ones are skipped).
    pub system_read_roots: Vec<PathBuf>,
    /// Paths under the read roots that stay unreadable.
    pub hidden: Vec<PathBuf>,
    /// More readable directories (interpreters, toolchains, venvs outside the workspace).
    pub read_roots: Vec<PathBuf>,
    /// More writable directories (under workspace-write and network).
    pub write_roots: Vec<PathBuf>,
    /// Parent of the per-session temporary directories; empty: the system
    /// temp dir (`$TMPDIR` or /tmp) + `omicos-sandbox-<uid>`.
    pub tmp_root: Option<PathBuf>,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// Where the process-count cgroups go.
    pub process_cgroup: ProcessCgroup,
    /// Threads kept parked, each in a fresh call cgroup, to fork calls'
    /// processes inside their cgroups (cgroup v1, where the pids cgroup is in
    /// use): a process that joins its cgroup instead waits for an RCU grace
    /// period. 0: every call's process joins its cgroup itself.
    pub process_cgroup_launchers: usize,
    /// Refuse or warn when the kernel has no Landlock.
    pub when_landlock_missing: WhenMissing,
    /// Refuse or warn when boxes cannot get namespaces of their own (neither
    /// root nor unprivileged user namespaces). Under `warn` they run with
    /// Landlock, seccomp and limits in the host's namespaces.
    pub when_namespaces_missing: WhenMissing,
    /// First uid (and gid) of the range boxes run as when the service is root.
    pub uid_start: u32,
    /// How many ids the range holds.
    pub uid_count: u32,
    /// Idmap the workspace into boxes when the service is root, so that the
    /// service's files are the box user's inside and the box's writes land
    /// as the service's on disk (the filesystem must support idmapped
    /// mounts: ext4, xfs, btrfs, tmpfs; refused otherwise, with a warning).
    pub idmap: bool,
    /// Where boxes keep their private directories and the uid leases
    /// (default: `/run/omicos-sandbox` as root, else `$XDG_RUNTIME_DIR` or the
    /// system temp directory + `omicos-sandbox-<uid>`).
    pub runtime_dir: Option<PathBuf>,
    /// Bounds of each session's box.
    pub session_limits: SessionLimits,
    /// Variables boxed processes get beyond PATH, LANG, HOME, TMPDIR and
    /// TERM: what the deployment declares for its tools. Boxed processes
    /// never inherit the service's environment.
    pub env: BTreeMap<String, String>,
    /// A box that ran nothing for this long is ended.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Bind `/sys` read-only into boxes (some libraries read CPU topology there).
    pub mount_sys: bool,
    /// Without the network, give commands a private network namespace whose
    /// only interface is its own loopback, instead of refusing every non-unix
    /// socket: 127.0.0.1 works inside (ipykernel needs it) and reaches nothing
    /// outside. Costs a namespace per call; where namespaces are unavailable,
    /// non-unix sockets are refused as without it.
    pub private_loopback: bool,
    /// Test hook: behave as if the kernel had no Landlock.
    #[serde(skip)]
    pub simulate_landlock_missing: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            policy: SandboxPolicy::default(),
            agent_policies: BTreeMap::new(),
            system_read_roots: DEFAULT_SYSTEM_READ_ROOTS
                .iter()
                .map(PathBuf::from)
                .collect(),
            hidden: DEFAULT_HIDDEN.iter().map(PathBuf::from).collect(),
            read_roots: Vec::new(),
            write_roots: Vec::new(),
            tmp_root: None,
            rlimits: Rlimits::default(),
            process_cgroup: ProcessCgroup::default(),
            process_cgroup_launchers: DEFAULT_PROCESS_CGROUP_LAUNCHERS,
            when_landlock_missing: WhenMissing::default(),
            when_namespaces_missing: WhenMissing::default(),
            uid_start: DEFAULT_UID_START,
            uid_count: DEFAULT_UID_COUNT,
            idmap: true,
            runtime_dir: None,
            session_limits: SessionLimits::default(),
            env: BTreeMap::new(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            mount_sys: true,
            private_loopback: false,
            simulate_landlock_missing: false,
        }
    }
}

/// A config value that cannot work; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `sandbox.{key}`: {reason}")]
pub struct ConfigError {
    /// The key under `sandbox`.
    pub key: String,
    /// Why it is refused.
    pub reason: String,
}

impl SandboxConfig {
    /// The defaults for kernels: no CPU-time limit, because RLIMIT_CPU counts
    /// the whole life of the process and a kernel lives for the session (each
    /// cell has its own timeout); a private loopback, because ipykernel binds
    /// 127.0.0.1 for the output of forked subprocesses.
    pub fn for_kernels() -> Self {
        Self {
            rlimits: Rlimits {
                cpu_seconds: None,
                ..Rlimits::default()
            },
            private_loopback: true,
            ..Self::default()
        }
    }

    /// The policy for a call by `agent_id`.
    pub fn policy_for_agent(&self, agent_id: &str) -> SandboxPolicy {
        self.agent_policies
            .get(agent_id)
            .copied()
            .unwrap_or(self.policy)
    }

    /// Refuses relative roots and zero limits, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &str, reason: String| ConfigError {
            key: key.into(),
            reason,
        };
        for (key, list) in [
            ("system_read_roots", &self.system_read_roots),
            ("hidden", &self.hidden),
            ("read_roots", &self.read_roots),
            ("write_roots", &self.write_roots),
        ] {
            for (i, p) in list.iter().enumerate() {
                if !p.is_absolute() {
                    return Err(err(
                        &format!("{key}[{i}]"),
                        format!("`{}` must be an absolute path", p.display()),
                    ));
                }
            }
        }
        for (key, dir) in [
            ("tmp_root", &self.tmp_root),
            ("runtime_dir", &self.runtime_dir),
        ] {
            if let Some(t) = dir
                && !t.is_absolute()
            {
                return Err(err(
                    key,
                    format!("`{}` must be an absolute path", t.display()),
                ));
            }
        }
        if self.uid_count == 0 || self.uid_start == 0 {
            return Err(err(
                "uid_start",
                "the range must hold at least one id, and uid 0 (root) is not one a box may run as"
                    .into(),
            ));
        }
        if (self.uid_start as u64) + (self.uid_count as u64) > u32::MAX as u64 {
            return Err(err(
                "uid_count",
                format!(
                    "uid_start + uid_count passes the largest uid ({})",
                    u32::MAX - 1
                ),
            ));
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(err(&format!("env.{k}"), "not a variable name".into()));
            }
        }
        let l = &self.session_limits;
        if l.cpus.is_some_and(|c| !(c.is_finite() && c >= 0.01)) {
            return Err(err(
                "session_limits.cpus",
                "at least 0.01 (one hundredth of a CPU)".into(),
            ));
        }
        for (key, v) in [
            ("session_limits.memory_bytes", l.memory_bytes),
            ("session_limits.processes", l.processes),
            ("session_limits.workspace_bytes", l.workspace_bytes),
        ] {
            if v == Some(0) {
                return Err(err(
                    key,
                    "0 would stop every command; leave the key out (or null) for no bound".into(),
                ));
            }
        }
        if l.memory_bytes.is_some_and(|m| m < 64 << 20) {
            return Err(err(
                "session_limits.memory_bytes",
                "below 64 MiB not even a kernel starts".into(),
            ));
        }
        if l.tmp_bytes < 1 << 20 || l.shm_bytes < 1 << 20 {
            return Err(err("session_limits.tmp_bytes", "at least 1 MiB".into()));
        }
        for (key, v) in [
            ("rlimits.cpu_seconds", self.rlimits.cpu_seconds),
            (
                "rlimits.address_space_bytes",
                self.rlimits.address_space_bytes,
            ),
            ("rlimits.processes", self.rlimits.processes),
            ("rlimits.file_size_bytes", self.rlimits.file_size_bytes),
        ] {
            if v == Some(0) {
                return Err(err(
                    key,
                    "0 would stop every command; leave the key out (or null) for no limit".into(),
                ));
            }
        }
        if self
            .rlimits
            .address_space_bytes
            .is_some_and(|b| b < 64 << 20)
        {
            return Err(err(
                "rlimits.address_space_bytes",
                "below 64 MiB not even bash starts".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_section_loads_and_bad_values_name_the_key() {
        let c: SandboxConfig = serde_yaml::from_str(
            "policy: network\nagent_policies: {fetcher: danger-full-access}\nread_roots: [/opt/conda]\nrlimits: {cpu_seconds: 5, processes: null}\nprocess_cgroup: off\nwhen_landlock_missing: warn\n",
        )
        .unwrap();
        assert_eq!(c.policy, SandboxPolicy::Network);
        assert_eq!(
            c.policy_for_agent("fetcher"),
            SandboxPolicy::DangerFullAccess
        );
        assert_eq!(c.policy_for_agent("other"), SandboxPolicy::Network);
        assert_eq!(c.rlimits.cpu_seconds, Some(5));
        assert_eq!(c.rlimits.processes, None);
        assert_eq!(
            c.rlimits.address_space_bytes,
            Some(DEFAULT_ADDRESS_SPACE_BYTES)
        );
        assert_eq!(c.process_cgroup, ProcessCgroup::Off);
        assert_eq!(c.when_landlock_missing, WhenLandlockMissing::Warn);
        c.validate().unwrap();

        let e = serde_yaml::from_str::<SandboxConfig>("polcy: read-only\n").unwrap_err();
        assert!(e.to_string().contains("polcy"), "{e}");
        let e = serde_yaml::from_str::<SandboxConfig>("process_cgroup: sometimes\n").unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
        let c: SandboxConfig = serde_yaml::from_str("read_roots: [relative/dir]\n").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "read_roots[0]");
        let c: SandboxConfig = serde_yaml::from_str("rlimits: {processes: 0}\n").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "rlimits.processes");
        assert_eq!(SandboxConfig::for_kernels().rlimits.cpu_seconds, None);
    }
}
