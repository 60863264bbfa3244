//! The `sandbox` config section shared by the runner (shell) and the kernel
//! provider.

use crate::SandboxPolicy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

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

/// What to do when the kernel has no Landlock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenLandlockMissing {
    /// Refuse to run confined commands (the safe default).
    #[default]
    Refuse,
    /// Run with seccomp, no_new_privs and limits only, and say so in a warning.
    Warn,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    pub when_landlock_missing: WhenLandlockMissing,
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
            when_landlock_missing: WhenLandlockMissing::default(),
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
        if let Some(t) = &self.tmp_root
            && !t.is_absolute()
        {
            return Err(err(
                "tmp_root",
                format!("`{}` must be an absolute path", t.display()),
            ));
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
