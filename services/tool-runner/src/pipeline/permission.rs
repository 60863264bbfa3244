//! Stage 4: risk class × permission mode, with the legacy switches.
//!
//! | mode      | Read | FileWrite | Python | Shell |
//! |-----------|------|-----------|--------|-------|
//! | read_only | run  | refuse    | refuse | refuse|
//! | auto      | run  | ask       | ask    | ask   |
//! | full      | run  | run       | run    | run   |
//!
//! Legacy `allow_shell` / `allow_file_write`, when present, decide Shell /
//! FileWrite outright (true: run, false: refuse) and win over the mode: the
//! conservative compatibility rule of the original design. A tool marked
//! `always_ask` is asked whatever the mode (unless refused). A tool the session
//! already allowed runs without asking again.

use super::normalize::{Failure, Stage};
use omicos_proto::{PermissionMode, Risk, ToolSpec};

/// The mode of a call: the wire value, or `default` when unspecified.
/// Unknown values are refused (stage `mode`), never guessed.
pub fn mode_for_call(wire: i32, default: PermissionMode) -> Result<PermissionMode, Failure> {
    PermissionMode::from_wire(wire)
        .map(|m| m.or(default))
        .map_err(|e| Failure::new(Stage::Mode, e.to_string()))
}

/// The legacy switches of old clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Legacy {
    /// Shell allowed (true) or refused (false); None: the mode decides.
    pub allow_shell: Option<bool>,
    /// File writes allowed or refused; None: the mode decides.
    pub allow_file_write: Option<bool>,
}

/// Why a call may run without asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunBecause {
    /// The permission mode allows its risk class.
    Mode,
    /// A legacy switch allows it.
    Legacy,
    /// The session already allowed the tool.
    Session,
    /// A PreToolUse hook allowed it.
    Hook,
}

/// What the permission stage decided before hooks and the user had a say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Run without asking, and why.
    Run {
        /// Why it may run.
        source: RunBecause,
    },
    /// Ask the user first; `reason` goes into ApprovalRequired.reason.
    Ask {
        /// "permission_mode=auto", "always_ask", "hook".
        reason: String,
    },
    /// Refused; the message is what the model reads.
    Refuse(String),
}

/// The risk class name used in messages and records.
pub fn risk_name(r: Risk) -> &'static str {
    match r {
        Risk::Read => "read",
        Risk::FileWrite => "file_write",
        Risk::Python => "python",
        Risk::Shell => "shell",
        Risk::MemoryWrite => "memory_write",
    }
}

/// Decides how `spec` may run under `mode` and `legacy`.
pub fn gate(
    mode: PermissionMode,
    legacy: Legacy,
    spec: &ToolSpec,
    session_allowed: &[String],
) -> Gate {
    let risk = Risk::try_from(spec.risk).unwrap_or(Risk::Read);
    let legacy_switch = match risk {
        Risk::Shell => legacy.allow_shell.map(|b| (b, "allow_shell")),
        Risk::FileWrite => legacy.allow_file_write.map(|b| (b, "allow_file_write")),
        _ => None,
    };
    let base = match (legacy_switch, risk, mode) {
        (Some((true, _)), _, _) => Gate::Run {
            source: RunBecause::Legacy,
        },
        (Some((false, field)), _, _) => {
            return Gate::Refuse(format!(
                "refused: `{}` is a {} tool and {field}=false",
                spec.name,
                risk_name(risk)
            ));
        }
        (None, Risk::Read, _) => Gate::Run {
            source: RunBecause::Mode,
        },
        (None, _, PermissionMode::ReadOnly | PermissionMode::Unspecified) => {
            return Gate::Refuse(format!(
                "refused: permission mode read_only allows only read tools, and `{}` is a {} tool",
                spec.name,
                risk_name(risk)
            ));
        }
        // A memory write stays in the agent's own scope and keeps history:
        // auto runs it without asking, read_only refuses it (below).
        (None, Risk::MemoryWrite, PermissionMode::Auto) => Gate::Run {
            source: RunBecause::Mode,
        },
        (None, _, PermissionMode::Auto) => Gate::Ask {
            reason: "permission_mode=auto".into(),
        },
        (None, _, PermissionMode::Full) => Gate::Run {
            source: RunBecause::Mode,
        },
    };
    if spec.always_ask {
        return Gate::Ask {
            reason: "always_ask".into(),
        };
    }
    match base {
        Gate::Ask { .. } if session_allowed.iter().any(|t| t == &spec.name) => Gate::Run {
            source: RunBecause::Session,
        },
        other => other,
    }
}

/// Whether ListTools shows `spec` (hidden = refused if called).
pub fn visible(mode: PermissionMode, legacy: Legacy, spec: &ToolSpec) -> bool {
    !matches!(gate(mode, legacy, spec, &[]), Gate::Refuse(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(name: &str, risk: Risk) -> ToolSpec {
        omicos_toolkit::tool(name, "", json!({"type": "object"}))
            .risk(risk)
            .build()
    }

    #[test]
    fn mode_of_a_call() {
        let ro = PermissionMode::ReadOnly;
        assert_eq!(mode_for_call(0, ro).unwrap(), ro);
        assert_eq!(
            mode_for_call(PermissionMode::Full as i32, ro).unwrap(),
            PermissionMode::Full
        );
        assert_eq!(
            mode_for_call(42, PermissionMode::Full).unwrap_err().stage,
            Stage::Mode
        );
    }

    #[test]
    fn every_mode_times_every_risk() {
        use Gate::*;
        let risks = [Risk::Read, Risk::FileWrite, Risk::Python, Risk::Shell];
        for mode in [
            PermissionMode::ReadOnly,
            PermissionMode::Auto,
            PermissionMode::Full,
        ] {
            for risk in risks {
                let g = gate(mode, Legacy::default(), &spec("t", risk), &[]);
                let want = match (mode, risk) {
                    (_, Risk::Read) => "run",
                    (PermissionMode::ReadOnly, _) => "refuse",
                    (PermissionMode::Auto, _) => "ask",
                    _ => "run",
                };
                let got = match &g {
                    Run { .. } => "run",
                    Ask { .. } => "ask",
                    Refuse(_) => "refuse",
                };
                assert_eq!(got, want, "{mode:?} × {risk:?}: {g:?}");
                assert_eq!(
                    visible(mode, Legacy::default(), &spec("t", risk)),
                    want != "refuse"
                );
            }
        }
    }

    #[test]
    fn session_allow_and_always_ask() {
        let shell = spec("shell", Risk::Shell);
        assert_eq!(
            gate(
                PermissionMode::Auto,
                Legacy::default(),
                &shell,
                &["shell".into()]
            ),
            Gate::Run {
                source: RunBecause::Session
            }
        );
        // Allowing another tool does not allow this one.
        assert!(matches!(
            gate(
                PermissionMode::Auto,
                Legacy::default(),
                &shell,
                &["other".into()]
            ),
            Gate::Ask { .. }
        ));
        let mut plan = spec("plan", Risk::Read);
        plan.always_ask = true;
        assert!(matches!(
            gate(
                PermissionMode::Full,
                Legacy::default(),
                &plan,
                &["plan".into()]
            ),
            Gate::Ask { .. }
        ));
    }

    #[test]
    fn legacy_switches_win_over_the_mode() {
        let shell = spec("shell", Risk::Shell);
        let write = spec("file_manager__write", Risk::FileWrite);
        let py = spec("run_python_code", Risk::Python);
        let deny = Legacy {
            allow_shell: Some(false),
            allow_file_write: Some(false),
        };
        let allow = Legacy {
            allow_shell: Some(true),
            allow_file_write: Some(true),
        };
        // full + legacy false → refused.
        assert!(
            matches!(gate(PermissionMode::Full, deny, &shell, &[]), Gate::Refuse(m) if m.contains("allow_shell=false"))
        );
        assert!(
            matches!(gate(PermissionMode::Full, deny, &write, &[]), Gate::Refuse(m) if m.contains("allow_file_write=false"))
        );
        // read_only + legacy true → runs.
        assert_eq!(
            gate(PermissionMode::ReadOnly, allow, &shell, &[]),
            Gate::Run {
                source: RunBecause::Legacy
            }
        );
        assert_eq!(
            gate(PermissionMode::Auto, allow, &write, &[]),
            Gate::Run {
                source: RunBecause::Legacy
            }
        );
        // Python has no legacy switch: the mode decides.
        assert!(matches!(
            gate(PermissionMode::ReadOnly, allow, &py, &[]),
            Gate::Refuse(_)
        ));
        // Only one legacy field present: the other class follows the mode.
        let only_shell = Legacy {
            allow_shell: Some(true),
            allow_file_write: None,
        };
        assert!(matches!(
            gate(PermissionMode::Auto, only_shell, &write, &[]),
            Gate::Ask { .. }
        ));
        assert!(!visible(PermissionMode::Full, deny, &shell));
        assert!(visible(PermissionMode::ReadOnly, allow, &shell));
    }

    #[test]
    fn memory_writes_run_in_auto_and_full_never_in_read_only() {
        let save = spec("memory__save", Risk::MemoryWrite);
        let legacy = Legacy {
            allow_shell: Some(true),
            allow_file_write: Some(true),
        };
        for l in [Legacy::default(), legacy] {
            assert!(matches!(
                gate(PermissionMode::ReadOnly, l, &save, &[]),
                Gate::Refuse(m) if m.contains("memory_write")
            ));
            assert!(!visible(PermissionMode::ReadOnly, l, &save));
            for mode in [PermissionMode::Auto, PermissionMode::Full] {
                assert!(matches!(gate(mode, l, &save, &[]), Gate::Run { .. }));
            }
        }
    }
}
