//! The four policies, from the most confined to none at all.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a sandboxed command may touch.
///
/// | policy               | reads                    | writes                          | network |
/// |----------------------|--------------------------|---------------------------------|---------|
/// | `read-only`          | system, workspace, roots | session tmp, `/dev/null`…       | no      |
/// | `workspace-write`    | system, workspace, roots | workspace, session tmp, roots   | no      |
/// | `network`            | as workspace-write       | as workspace-write              | yes     |
/// | `danger-full-access` | everything               | everything                      | yes     |
///
/// Every policy but `danger-full-access` also sets no_new_privs, drops every
/// capability (so root inside is an ordinary user) and denies ptrace,
/// io_uring, module loading, reboot and a few other syscalls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxPolicy {
    /// Reads only; the per-session temporary directory stays writable.
    ReadOnly,
    /// Writes to the workspace and the per-session temporary directory.
    #[default]
    WorkspaceWrite,
    /// workspace-write plus network sockets.
    Network,
    /// No confinement at all (resource limits still apply).
    DangerFullAccess,
}

impl SandboxPolicy {
    /// Every policy, most confined first.
    pub const ALL: [SandboxPolicy; 4] = [
        SandboxPolicy::ReadOnly,
        SandboxPolicy::WorkspaceWrite,
        SandboxPolicy::Network,
        SandboxPolicy::DangerFullAccess,
    ];

    /// The name used in config and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxPolicy::ReadOnly => "read-only",
            SandboxPolicy::WorkspaceWrite => "workspace-write",
            SandboxPolicy::Network => "network",
            SandboxPolicy::DangerFullAccess => "danger-full-access",
        }
    }

    /// Landlock, seccomp and the capability drop apply.
    pub fn is_confined(self) -> bool {
        self != SandboxPolicy::DangerFullAccess
    }

    /// Network sockets (anything but AF_UNIX) may be created.
    pub fn allows_network(self) -> bool {
        matches!(
            self,
            SandboxPolicy::Network | SandboxPolicy::DangerFullAccess
        )
    }

    /// The workspace (and the configured write roots) may be written.
    pub fn writes_workspace(self) -> bool {
        self != SandboxPolicy::ReadOnly
    }

    /// The same policy with the network allowed (what kernel_install uses).
    pub fn with_network(self) -> SandboxPolicy {
        match self {
            SandboxPolicy::DangerFullAccess => SandboxPolicy::DangerFullAccess,
            _ => SandboxPolicy::Network,
        }
    }
}

impl fmt::Display for SandboxPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown sandbox policy `{0}`: expected read-only, workspace-write, network or danger-full-access"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for SandboxPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        SandboxPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == norm)
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for p in SandboxPolicy::ALL {
            assert_eq!(p.as_str().parse::<SandboxPolicy>().unwrap(), p);
            let yaml = serde_yaml::to_string(&p).unwrap();
            assert_eq!(yaml.trim(), p.as_str());
        }
        assert_eq!(
            "workspace_write".parse::<SandboxPolicy>().unwrap(),
            SandboxPolicy::WorkspaceWrite
        );
        let e = "yolo".parse::<SandboxPolicy>().unwrap_err();
        assert!(e.to_string().contains("read-only, workspace-write"), "{e}");
        assert_eq!(SandboxPolicy::default(), SandboxPolicy::WorkspaceWrite);
    }

    #[test]
    fn what_each_policy_grants() {
        use SandboxPolicy::*;
        assert!(!ReadOnly.writes_workspace() && !ReadOnly.allows_network());
        assert!(WorkspaceWrite.writes_workspace() && !WorkspaceWrite.allows_network());
        assert!(Network.writes_workspace() && Network.allows_network());
        assert!(!DangerFullAccess.is_confined() && ReadOnly.is_confined());
        assert_eq!(ReadOnly.with_network(), Network);
        assert_eq!(DangerFullAccess.with_network(), DangerFullAccess);
    }
}
