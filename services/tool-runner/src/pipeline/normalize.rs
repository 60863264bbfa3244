//! Stage 8: every failure, at any stage, becomes an error result with a clear
//! message, and success is done ([`omicos_proto::ToolStatus`]); the model reads
//! them through [`omicos_proto::model_envelope`]. A tool error never ends the turn.

/// The stage a call failed in; recorded in the trajectory (by its name, `as_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
