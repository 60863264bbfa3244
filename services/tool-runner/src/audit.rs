//! The audit log of the runner's decisions (tracing target `omicos::audit`).
//!
//! Every call that needed a decision — an approval (asked or not: the
//! session's grant, a hook's allow), a permission rule that matched (allow,
//! ask or deny), a refusal at the permission or rule stage, a hook's
//! verdict — is logged once when it ends, with the principal it acted for. The same facts are in the call's trajectory record
//! ([`ToolCallInfo`]: `principal`, `approval`, `hooks`, `error_stage`), which
//! the orchestrator keeps with the session.

use crate::pipeline::normalize::Stage;
use crate::record::{HookResult, ToolCallInfo};

/// The target every audit event is logged under.
pub const TARGET: &str = "omicos::audit";

/// Logs what was decided about `rec`'s call, if anything was.
pub fn call(rec: &ToolCallInfo) {
    let refused_at = rec
        .error_stage
        .filter(|s| matches!(s, Stage::Permission | Stage::Hook))
        .map(|s| s.as_str());
    let verdicts: Vec<String> = rec
        .hooks
        .iter()
        .filter(|h| h.outcome != HookResult::None)
        .map(|h| format!("{}:{:?}", h.event.as_str(), h.outcome))
        .collect();
    let rule = rec
        .permission
        .as_ref()
        .and_then(|p| p.rule.as_ref())
        .map(ToString::to_string);
    if rec.approval.is_none() && refused_at.is_none() && verdicts.is_empty() && rule.is_none() {
        return;
    }
    let principal = if rec.principal.is_empty() {
        "-"
    } else {
        rec.principal.as_str()
    };
    let (decision, source, asked) = match &rec.approval {
        Some(a) => (
            format!("{:?}", a.decision),
            format!("{:?}", a.source),
            a.asked,
        ),
        None => (String::new(), String::new(), false),
    };
    tracing::info!(
        target: "omicos::audit",
        event = "tool_call_decision",
        principal,
        session = %rec.session_id,
        call_id = %rec.id,
        tool = %rec.name,
        risk = %rec.risk,
        mode = %rec.permission_mode,
        approval = %decision,
        approval_source = %source,
        asked,
        refused_at = refused_at.unwrap_or(""),
        rule = rule.as_deref().unwrap_or(""),
        hooks = %verdicts.join(","),
        "tool call decided"
    );
}

/// Logs that a session ended and what was stopped with it.
pub fn session_ended(tenant: &str, session: &str, stopped: u32) {
    tracing::info!(
        target: "omicos::audit",
        event = "session_ended",
        tenant = if tenant.is_empty() { "default" } else { tenant },
        session,
        stopped,
        "session ended: its boxes, kernels and per-session servers stopped"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ApprovalDecision, ApprovalRecord, ApprovalSource, PermissionRecord};
    use std::sync::{Arc, Mutex};

    /// What `f` logs under the audit target, as text.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    fn rec() -> ToolCallInfo {
        ToolCallInfo {
            id: "call_7".into(),
            name: "shell".into(),
            session_id: "s1".into(),
            principal: "acme/alice".into(),
            ..Default::default()
        }
    }

    #[test]
    fn approvals_rules_and_refusals_are_logged_with_the_principal() {
        let mut approved = rec();
        approved.approval = Some(ApprovalRecord {
            asked: true,
            decision: ApprovalDecision::AllowSession,
            source: ApprovalSource::Client,
            ..Default::default()
        });
        let out = logged(|| call(&approved));
        assert!(
            out.contains("omicos::audit")
                && out.contains("tool_call_decision")
                && out.contains("principal=\"acme/alice\"")
                && out.contains("AllowSession")
                && out.contains("call_id=call_7"),
            "{out}"
        );

        let mut by_rule = rec();
        by_rule.permission = Some(PermissionRecord {
            gate: "refuse".into(),
            reason: "deny rule".into(),
            rule: Some(omicos_rules::Decision {
                behavior: omicos_rules::Behavior::Deny,
                rule: "shell(rm *)".into(),
                source: omicos_rules::Source::Deployment,
            }),
        });
        by_rule.error_stage = Some(Stage::Permission);
        let out = logged(|| call(&by_rule));
        assert!(
            out.contains("shell(rm *)")
                && out.contains("refused_at=\"permission\"")
                && out.contains("acme/alice"),
            "{out}"
        );
    }

    #[test]
    fn a_call_nothing_had_to_decide_is_not_logged() {
        assert_eq!(logged(|| call(&rec())), "");
    }
}
