//! The audit log of the runner's decisions (tracing target `omicos::audit`).
//!
//! Every call that needed a decision — an approval (asked or not: the
//! session's grant, a hook's allow), a refusal at the permission or rule
//! stage, a hook's verdict — is logged once when it ends, with the principal
//! it acted for. The same facts are in the call's trajectory record
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
    if rec.approval.is_none() && refused_at.is_none() && verdicts.is_empty() {
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
        hooks = %verdicts.join(","),
        "tool call decided"
    );
}
