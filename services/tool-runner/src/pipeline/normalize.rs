//! Stage 8: every failure, at any stage, becomes `{"status":"error","result":"<clear message>"}`;
//! success is `"done"`. A tool error never ends the turn.

use serde_json::json;

/// The stage a call failed in; recorded in the trajectory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The permission mode string was not understood.
    Mode,
    /// The tool name did not resolve.
    Resolve,
    /// The argument string was not usable JSON.
    Parse,
    /// The schema or the tool's own checks refused the arguments.
    Validate,
    /// The permission mode, the user or a PermissionRequest hook refused.
    Permission,
    /// A hook blocked the call.
    Hook,
    /// The provider failed, was unreachable, or the call was cancelled.
    Dispatch,
    /// The result could not be shaped (spool write failed).
    Shape,
}

impl Stage {
    /// The name used in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Mode => "mode",
            Stage::Resolve => "resolve",
            Stage::Parse => "parse",
            Stage::Validate => "validate",
            Stage::Permission => "permission",
            Stage::Hook => "hook",
            Stage::Dispatch => "dispatch",
            Stage::Shape => "shape",
        }
    }
}

/// A failed call: where, and the message the model reads.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Where it failed.
    pub stage: Stage,
    /// What the model reads.
    pub message: String,
}

impl Failure {
    /// A failure at `stage`.
    pub fn new(stage: Stage, message: impl Into<String>) -> Self {
        Self {
            stage,
            message: message.into(),
        }
    }
}

/// `"done"` or `"error"`.
pub fn status(ok: bool) -> &'static str {
    if ok { "done" } else { "error" }
}

/// The tool message content the model receives: `{"status": ..., "result": ...}`.
/// The orchestrator uses this for the `role: "tool"` message.
pub fn model_message(status: &str, result: &str) -> String {
    json!({ "status": status, "result": result }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_is_json_with_status_and_result() {
        let m = model_message(status(false), "denied by user");
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v, json!({"status": "error", "result": "denied by user"}));
        assert_eq!(status(true), "done");
    }
}
