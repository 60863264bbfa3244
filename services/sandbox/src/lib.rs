//! Confines what the `shell` tool, the Python kernels, kernel_install's pip
//! and per-session MCP servers run: code a model wrote, treated as hostile.
//!
//! Each session's code runs in a **box**, built once per session and reused
//! by every call of it:
//! - an unprivileged identity: a uid of its own from a configured range when
//!   the service is root, or the service's own uid behind a user namespace;
//! - mount, pid, ipc, uts and cgroup namespaces, and a network namespace
//!   with only its own loopback unless the policy allows the network;
//! - a filesystem view built the way bubblewrap builds one: system
//!   directories read-only, the session's workspace read-write (omicos's
//!   own `.omicos/` hidden), a private `/tmp` and home, a minimal `/dev`
//!   with a pty namespace of its own, `/proc` of its own pid namespace, and
//!   nothing of `/run`, the host's `/tmp`, host sockets or other sessions;
//! - a clean environment (an allowlist, never the service's variables);
//! - no capabilities, no_new_privs, a seccomp filter (no namespaces, mounts,
//!   keyrings, terminal injection, ptrace, io_uring, …), and per call a
//!   Landlock domain as the second layer;
//! - a cgroup bounding its memory, processes and CPU, ending everything in
//!   it when the box ends (session deleted, idle, or the service stopped).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use omicos_sandbox::{Command, Placement, Sandbox, SandboxConfig, SandboxPolicy};
//! let sandbox = Sandbox::new(SandboxConfig::default())?;     // once per service
//! let place = Placement::new("tenant", "session-1", "/srv/ws", SandboxPolicy::WorkspaceWrite);
//! let mut cmd = Command::new("bash");
//! cmd.args(["-c", "echo hi > out.txt"]).cwd("/srv/ws");
//! let mut p = sandbox.spawn(&place, cmd).await?;
//! let status = p.wait().await?;
//! p.end().await;                                                // kills what it left behind
//! sandbox.end_session("tenant", "session-1");                   // ends the box
//! # Ok(()) }
//! ```

mod box_cgroup;
mod boxes;
pub mod config;
mod disk;
mod filesystem;
mod ids;
mod plan;
pub mod policy;
mod process;
pub mod run;
mod sandbox;
mod syscalls;
pub mod wire;
mod zygote;

pub use boxes::SessionBox;
pub use config::{
    ConfigError, ProcessCgroup, Rlimits, SandboxConfig, SessionLimits, WhenLandlockMissing,
    WhenMissing,
};
pub use disk::{
    DiskMeasure, OWN_STATE, usage as disk_usage, usage_excluding as disk_usage_excluding,
};
pub use filesystem::LandlockSupport;
pub use policy::{SandboxPolicy, UnknownPolicy};
pub use process::{Command, Placement, Process, Signaller, Stdio, describe_status};
pub use sandbox::{Mode, Report, Sandbox};

use std::path::PathBuf;

/// Why a command cannot be sandboxed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Landlock is missing and the config says refuse.
    #[error(
        "the sandbox refuses to run this command under `{policy}`: the kernel offers no Landlock, so file access cannot be confined \
         (set sandbox.when_landlock_missing: warn to run without it, or use policy danger-full-access)"
    )]
    LandlockMissing {
        /// The policy asked for.
        policy: SandboxPolicy,
    },
    /// Namespaces are missing and the config says refuse.
    #[error(
        "the sandbox refuses to run this command under `{policy}`: {why}; the code would run without a filesystem view, \
         pid namespace and identity of its own (run the service as root, or enable unprivileged user namespaces: \
         sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces; or set sandbox.when_namespaces_missing: warn)"
    )]
    NamespacesMissing {
        /// The policy asked for.
        policy: SandboxPolicy,
        /// What the probe found.
        why: String,
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
    /// The session's box could not be started.
    #[error("the sandbox box for this session could not start: {0}")]
    Box(String),
    /// The process could not be started in the box.
    #[error("{0}")]
    Spawn(std::io::Error),
    /// The config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}
