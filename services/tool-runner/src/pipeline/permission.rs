//! Stage 4: risk class × permission mode, with the legacy switches and the
//! permission rules (see [`gate`] for how a rule and the mode combine).
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
//! `always_ask` is asked whatever the mode (unless refused). A tool (or a
//! rule) the session already allowed is an allow rule of source `session`.

use super::normalize::{Failure, Stage};
use super::rules::{Behavior, Call, Decision as RuleDecision, Rules};
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
    /// An allow rule (deployment, agent, or one the session was granted)
    /// answered the question the mode would have asked.
    Rule,
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
        /// "permission_mode=auto", "always_ask", "ask rule `…` (source)", "hook".
        reason: String,
    },
    /// Refused; the message is what the model reads.
    Refuse(String),
}

impl Gate {
    /// `run`, `ask` or `refuse`, as in the record.
    pub fn as_str(&self) -> &'static str {
        match self {
            Gate::Run { .. } => "run",
            Gate::Ask { .. } => "ask",
            Gate::Refuse(_) => "refuse",
        }
    }
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

/// Decides how `spec` may run under `mode` and `legacy`, given the rule
/// that matched the call (deny, then ask, then allow; see [`rules`]):
///
/// 1. a deny rule refuses, whatever the mode (`full` too) or a legacy switch;
/// 2. the ceiling: what the mode (or a legacy `false`) refuses stays refused:
///    no rule makes a write run in `read_only`;
/// 3. an ask rule asks, even where the mode (or a legacy `true`) would run;
/// 4. a tool marked `always_ask` asks;
/// 5. an allow rule runs what the mode would ask about (`auto`);
/// 6. otherwise the mode table.
///
/// [`rules`]: super::rules
pub fn gate(
    mode: PermissionMode,
    legacy: Legacy,
    spec: &ToolSpec,
    rule: Option<&RuleDecision>,
) -> Gate {
    if let Some(d) = rule.filter(|d| d.behavior == Behavior::Deny) {
        return Gate::Refuse(format!("refused: `{}` is denied by the {d}", spec.name));
    }
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
    if let Some(d) = rule.filter(|d| d.behavior == Behavior::Ask) {
        return Gate::Ask {
            reason: d.to_string(),
        };
    }
    if spec.always_ask {
        return Gate::Ask {
            reason: "always_ask".into(),
        };
    }
    match base {
        Gate::Ask { .. } if rule.is_some_and(|d| d.behavior == Behavior::Allow) => Gate::Run {
            source: RunBecause::Rule,
        },
        other => other,
    }
}

/// Whether ListTools shows `spec` (hidden = refused whatever its
/// arguments: by the mode, a legacy switch, or a deny rule without a
/// specifier such as `deny: [shell]`).
pub fn visible(mode: PermissionMode, legacy: Legacy, spec: &ToolSpec, rules: &Rules) -> bool {
    // Only a rule without a specifier matches a call without arguments.
    let bare = rules.decide(&Call {
        tool: &spec.name,
        args: &serde_json::Value::Null,
        workspace: std::path::Path::new("/"),
    });
    !matches!(gate(mode, legacy, spec, bare.as_ref()), Gate::Refuse(_))
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
                let g = gate(mode, Legacy::default(), &spec("t", risk), None);
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
                    visible(mode, Legacy::default(), &spec("t", risk), &Rules::default()),
                    want != "refuse"
                );
            }
        }
    }

    fn rule(behavior: Behavior) -> RuleDecision {
        RuleDecision {
            behavior,
            rule: "shell(git:*)".into(),
            source: super::super::rules::Source::Deployment,
        }
    }

    #[test]
    fn rules_against_the_mode_deny_beats_all_ask_forces_allow_stays_under_the_ceiling() {
        use Behavior::*;
        let shell = spec("shell", Risk::Shell);
        let read = spec("file_manager__read", Risk::Read);
        let (ro, auto, full) = (
            PermissionMode::ReadOnly,
            PermissionMode::Auto,
            PermissionMode::Full,
        );
        let table = [
            // (mode, tool, rule, want)
            (full, &shell, Some(Deny), "refuse"),
            (auto, &shell, Some(Deny), "refuse"),
            (full, &read, Some(Deny), "refuse"),
            (full, &shell, Some(Ask), "ask"),
            (auto, &read, Some(Ask), "ask"),
            (ro, &read, Some(Ask), "ask"),
            (ro, &shell, Some(Ask), "refuse"),
            (auto, &shell, Some(Allow), "run"),
            (ro, &shell, Some(Allow), "refuse"),
            (full, &shell, Some(Allow), "run"),
            (auto, &shell, None, "ask"),
            (ro, &shell, None, "refuse"),
        ];
        for (mode, tool, behavior, want) in table {
            let d = behavior.map(rule);
            let g = gate(mode, Legacy::default(), tool, d.as_ref());
            assert_eq!(
                g.as_str(),
                want,
                "{mode:?} {} {behavior:?}: {g:?}",
                tool.name
            );
        }
        // The message and the reason name the rule and its source.
        assert!(matches!(
            gate(full, Legacy::default(), &shell, Some(&rule(Deny))),
            Gate::Refuse(m) if m.contains("deny rule `shell(git:*)` (deployment)")
        ));
        assert!(matches!(
            gate(full, Legacy::default(), &shell, Some(&rule(Ask))),
            Gate::Ask { reason } if reason == "ask rule `shell(git:*)` (deployment)"
        ));
        assert_eq!(
            gate(auto, Legacy::default(), &shell, Some(&rule(Allow))),
            Gate::Run {
                source: RunBecause::Rule
            }
        );
        // A deny beats a legacy switch; an ask rule asks where it would run.
        let legacy = Legacy {
            allow_shell: Some(true),
            allow_file_write: None,
        };
        assert_eq!(
            gate(ro, legacy, &shell, Some(&rule(Deny))).as_str(),
            "refuse"
        );
        assert_eq!(gate(ro, legacy, &shell, Some(&rule(Ask))).as_str(), "ask");
        // always_ask is not lifted by an allow rule.
        let mut plan = spec("plan", Risk::Read);
        plan.always_ask = true;
        assert_eq!(
            gate(full, Legacy::default(), &plan, Some(&rule(Allow))).as_str(),
            "ask"
        );
        assert_eq!(gate(full, Legacy::default(), &plan, None).as_str(), "ask");
    }

    #[test]
    fn a_bare_deny_rule_hides_the_tool() {
        let rules = Rules::parse(
            &super::super::rules::RuleLists {
                deny: vec!["shell".into(), "file_manager__write(secrets/**)".into()],
                ..Default::default()
            },
            super::super::rules::Source::Deployment,
        )
        .unwrap();
        let full = PermissionMode::Full;
        assert!(!visible(
            full,
            Legacy::default(),
            &spec("shell", Risk::Shell),
            &rules
        ));
        // A deny with a specifier refuses some calls only: the tool stays.
        assert!(visible(
            full,
            Legacy::default(),
            &spec("file_manager__write", Risk::FileWrite),
            &rules
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
            matches!(gate(PermissionMode::Full, deny, &shell, None), Gate::Refuse(m) if m.contains("allow_shell=false"))
        );
        assert!(
            matches!(gate(PermissionMode::Full, deny, &write, None), Gate::Refuse(m) if m.contains("allow_file_write=false"))
        );
        // read_only + legacy true → runs.
        assert_eq!(
            gate(PermissionMode::ReadOnly, allow, &shell, None),
            Gate::Run {
                source: RunBecause::Legacy
            }
        );
        assert_eq!(
            gate(PermissionMode::Auto, allow, &write, None),
            Gate::Run {
                source: RunBecause::Legacy
            }
        );
        // Python has no legacy switch: the mode decides.
        assert!(matches!(
            gate(PermissionMode::ReadOnly, allow, &py, None),
            Gate::Refuse(_)
        ));
        // Only one legacy field present: the other class follows the mode.
        let only_shell = Legacy {
            allow_shell: Some(true),
            allow_file_write: None,
        };
        assert!(matches!(
            gate(PermissionMode::Auto, only_shell, &write, None),
            Gate::Ask { .. }
        ));
        assert!(!visible(
            PermissionMode::Full,
            deny,
            &shell,
            &Rules::default()
        ));
        assert!(visible(
            PermissionMode::ReadOnly,
            allow,
            &shell,
            &Rules::default()
        ));
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
                gate(PermissionMode::ReadOnly, l, &save, None),
                Gate::Refuse(m) if m.contains("memory_write")
            ));
            assert!(!visible(
                PermissionMode::ReadOnly,
                l,
                &save,
                &Rules::default()
            ));
            for mode in [PermissionMode::Auto, PermissionMode::Full] {
                assert!(matches!(gate(mode, l, &save, None), Gate::Run { .. }));
            }
        }
    }
}
