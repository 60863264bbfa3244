//! The trajectory record of one call (ToolCallInfo). It travels as JSON in
//! `ToolResult.record_json`; the orchestrator appends it to
//! `<workspace>/.omicos/trajectories/<session>/` so a conversation can be replayed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything known about one tool call.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolCallInfo {
    /// The model's call id.
    pub id: String,
    /// The resolved tool name (the requested one when it did not resolve).
    pub name: String,
    /// The name the model used (an alias or deprecated name, perhaps).
    pub requested_name: String,
    /// Session, agent and execution context of the call.
    pub session_id: String,
    /// The agent that made the call.
    pub agent_id: String,
    /// "root" or "root/<call_id>" for a delegation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub execution_context_id: String,
    /// The raw argument string exactly as the model produced it.
    pub arguments: String,
    /// The arguments as run (after repair and hook rewrites); None if it never got that far.
    pub arguments_run: Option<Value>,
    /// What parse repaired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<String>,
    /// A hook or the user changed the input.
    pub user_modified: bool,
    /// The effective permission mode.
    pub permission_mode: String,
    /// Risk class of the resolved tool.
    pub risk: String,
    /// Provider that served it.
    pub provider: String,
    /// "done" | "error".
    pub status: String,
    /// The full result, or the preview when spooled (then see `spool_path`).
    pub result: String,
    /// Workspace-relative path of the spooled full result.
    pub spool_path: Option<String>,
    /// Size of the full result in bytes.
    pub result_bytes: usize,
    /// The stage that failed, if any.
    pub error_stage: Option<String>,
    /// Wall-clock start, unix ms.
    pub started_at_ms: i64,
    /// Total time in the runner.
    pub elapsed_ms: u64,
    /// Time spent waiting for the user's approval.
    pub approval_wait_ms: u64,
    /// Time in the provider.
    pub dispatch_ms: u64,
    /// Every hook that ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookOutcome>,
    /// The approval, when one was needed.
    pub approval: Option<ApprovalRecord>,
}

/// One hook run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HookOutcome {
    /// PreToolUse, PermissionRequest, PostToolUse, PostToolUseFailure.
    pub event: String,
    /// The command.
    pub command: String,
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// What it decided: allow, deny, ask, block, updated_input, updated_output, context, none, error, timeout.
    pub outcome: String,
    /// The reason, stderr, or error text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// How long it ran.
    pub elapsed_ms: u64,
}

/// How the call was allowed (or not).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ApprovalRecord {
    /// Whether the user was asked.
    pub asked: bool,
    /// allow_once, allow_session, deny, or none.
    pub decision: String,
    /// client, timeout, session, hook, closed.
    pub source: String,
    /// Why approval was needed.
    pub reason: String,
}
