//! The trajectory record of one call (ToolCallInfo). It travels as JSON in
//! `ToolResult.record_json`; the orchestrator appends it to
//! `<workspace>/.omicos/trajectories/<session>/` so a conversation can be replayed.

use crate::pipeline::normalize::Stage;
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
    /// Who the call acted for (`subject@tenant`), as an authenticated
    /// orchestrator forwarded it; empty when none was.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub principal: String,
    /// "root" or "root/<call_id>" for a delegation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub execution_context_id: String,
    /// The raw argument string exactly as the model produced it; when it is
    /// as large as the spool threshold, only its head (see `arguments_spool`).
    pub arguments: String,
    /// The arguments as run (after repair and hook rewrites); None if it never
    /// got that far, or when they were large (see `arguments_spool`).
    pub arguments_run: Option<Value>,
    /// Where large arguments went instead of the record (so that a call with
    /// a whole file in its arguments still has a record that fits a message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_spool: Option<SpooledArguments>,
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
    pub error_stage: Option<Stage>,
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
    /// What the permission stage decided and the rule that matched, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<PermissionRecord>,
}

/// The permission stage's decision (before hooks and the user): the mode,
/// the legacy switches and the first matching rule, in that interplay
/// (`pipeline::permission::gate`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PermissionRecord {
    /// `run`, `ask` or `refuse`.
    pub gate: String,
    /// Why: "permission mode", "allow rule", "ask rule `…` (deployment)",
    /// or the refusal the model read.
    pub reason: String,
    /// The rule that matched (text, source and list), if one did; with
    /// `gate: refuse` and an allow rule, the mode's ceiling decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<omicos_rules::Decision>,
}

/// Large arguments, kept out of the record in the workspace's spool
/// (`.omicos/tool_outputs/`, next to the spooled results).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SpooledArguments {
    /// Workspace-relative path of the raw argument string (byte-exact), when it was large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_path: Option<String>,
    /// Size of the raw argument string in bytes.
    pub raw_bytes: usize,
    /// The call ran with the raw arguments as they parse (no repair, no
    /// rewrite): `raw_path` holds the arguments as run too.
    pub run_is_raw: bool,
    /// Workspace-relative path of the arguments as run (JSON), when a repair
    /// or a hook changed them and they were large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_path: Option<String>,
    /// Why a spool file could not be written, if one could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The hook events, named as in the hook contract (and in the payload a hook reads).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum HookEvent {
    /// Before the call, after the permission gate.
    #[default]
    PreToolUse,
    /// When the call needs the user's approval.
    PermissionRequest,
    /// After a call that succeeded.
    PostToolUse,
    /// After a call that failed.
    PostToolUseFailure,
}

impl HookEvent {
    /// The name as in the contract.
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PermissionRequest => "PermissionRequest",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::PostToolUseFailure => "PostToolUseFailure",
        }
    }
}

/// What one hook run decided.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HookResult {
    /// No opinion.
    #[default]
    None,
    /// Allowed the call.
    Allow,
    /// Denied the call.
    Deny,
    /// Asked for the user's approval.
    Ask,
    /// Blocked the call (exit 2, or a block decision).
    Block,
    /// Rewrote the input.
    UpdatedInput,
    /// Replaced the output.
    UpdatedOutput,
    /// Added context for the model.
    Context,
    /// Failed without blocking (could not start, bad exit, bad output).
    Error,
    /// Ran out of time.
    Timeout,
}

/// One hook run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HookOutcome {
    /// Which event it ran for.
    pub event: HookEvent,
    /// The command.
    pub command: String,
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// What it decided.
    pub outcome: HookResult,
    /// The reason, stderr, or error text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// How long it ran.
    pub elapsed_ms: u64,
}

/// The decision an approval ended with.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Nothing was decided.
    #[default]
    None,
    /// Allowed for this call.
    AllowOnce,
    /// Allowed for the rest of the session.
    AllowSession,
    /// Refused.
    Deny,
}

/// Who (or what) decided an approval.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalSource {
    /// Not decided yet.
    #[default]
    None,
    /// The user, through the client.
    Client,
    /// Nobody answered in time.
    Timeout,
    /// The session already allowed the tool.
    Session,
    /// A PreToolUse or PermissionRequest hook.
    Hook,
    /// No client could answer (none connected, or it stopped sending).
    Closed,
    /// The call was cancelled while waiting.
    Cancelled,
}

/// How the call was allowed (or not).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ApprovalRecord {
    /// Whether the user was asked.
    pub asked: bool,
    /// What was decided.
    pub decision: ApprovalDecision,
    /// Who decided.
    pub source: ApprovalSource,
    /// Why approval was needed.
    pub reason: String,
    /// The allow rule the user granted for the session with the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_rule: Option<String>,
    /// Why the rule sent with the approval was not kept (then the call ran once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_refused: Option<String>,
}
