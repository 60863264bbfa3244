//! The states and modes that travel in the contracts, with their one parser
//! and their one spelling each: [`PermissionMode`], [`ToolStatus`],
//! [`TurnDoneReason`]. Code never compares these as strings.

use crate::v1::{PermissionMode, ToolStatus, TurnDoneReason};

/// An unknown permission-mode spelling; the message lists the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMode(pub String);

impl std::fmt::Display for UnknownMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown permission mode `{}`; use read_only (also readonly, read-only), auto, or full (also full_access, full-access)",
            self.0
        )
    }
}

impl std::error::Error for UnknownMode {}

impl PermissionMode {
    /// The one parser of the mode's text forms: read_only|readonly|read-only,
    /// auto, full|full_access|full-access, and the enum's own names
    /// (`PERMISSION_MODE_AUTO`), any case. Empty is `Unspecified` (the
    /// service's default applies).
    pub fn parse(text: &str) -> Result<Self, UnknownMode> {
        let t = text.trim().to_ascii_lowercase();
        let t = t.strip_prefix("permission_mode_").unwrap_or(&t);
        match t {
            "" | "unspecified" => Ok(Self::Unspecified),
            "read_only" | "readonly" | "read-only" => Ok(Self::ReadOnly),
            "auto" => Ok(Self::Auto),
            "full" | "full_access" | "full-access" => Ok(Self::Full),
            _ => Err(UnknownMode(text.trim().to_owned())),
        }
    }

    /// The mode carried in a message's enum field; values this build does not
    /// know are refused rather than guessed.
    pub fn from_wire(v: i32) -> Result<Self, UnknownMode> {
        Self::try_from(v).map_err(|_| UnknownMode(v.to_string()))
    }

    /// `self`, or `default` when unspecified.
    pub fn or(self, default: Self) -> Self {
        if self == Self::Unspecified {
            default
        } else {
            self
        }
    }

    /// The canonical spelling (`read_only`, `auto`, `full`; empty when unspecified).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::ReadOnly => "read_only",
            Self::Auto => "auto",
            Self::Full => "full",
        }
    }

    /// How permissive the mode is: read_only < auto < full (unspecified lowest).
    pub fn rank(self) -> u8 {
        match self {
            Self::Unspecified => 0,
            Self::ReadOnly => 1,
            Self::Auto => 2,
            Self::Full => 3,
        }
    }
}

impl ToolStatus {
    /// `done` or `error`: the word the model reads in its envelope.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Error | Self::Unspecified => "error",
        }
    }

    /// Done when `ok`, otherwise error.
    pub fn from_ok(ok: bool) -> Self {
        if ok { Self::Done } else { Self::Error }
    }
}

impl TurnDoneReason {
    /// The reason's name in logs and trajectories (`completed`, `interrupted`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
            Self::MaxIterations => "max_iterations",
            Self::Deadline => "deadline",
            Self::Interrupted => "interrupted",
            Self::Budget => "budget",
        }
    }
}

/// The content of the `tool` message the model receives for every call:
/// `{"status": "done"|"error", "result": "..."}`. The only place it is built.
pub fn model_envelope(status: ToolStatus, result: &str) -> String {
    serde_json::json!({ "status": status.as_str(), "result": result }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_the_mode() {
        for s in [
            "read_only",
            "readonly",
            "read-only",
            "READ_ONLY",
            " Read-Only ",
        ] {
            assert_eq!(PermissionMode::parse(s).unwrap(), PermissionMode::ReadOnly);
        }
        assert_eq!(PermissionMode::parse("auto").unwrap(), PermissionMode::Auto);
        for s in ["full", "full_access", "full-access", "PERMISSION_MODE_FULL"] {
            assert_eq!(PermissionMode::parse(s).unwrap(), PermissionMode::Full);
        }
        assert_eq!(
            PermissionMode::parse("").unwrap(),
            PermissionMode::Unspecified
        );
        let e = PermissionMode::parse("yolo").unwrap_err().to_string();
        assert!(e.contains("unknown permission mode `yolo`"), "{e}");
        assert!(PermissionMode::from_wire(99).is_err());
        assert_eq!(
            PermissionMode::Unspecified.or(PermissionMode::ReadOnly),
            PermissionMode::ReadOnly
        );
        assert!(PermissionMode::Full.rank() > PermissionMode::Auto.rank());
        assert!(PermissionMode::Auto.rank() > PermissionMode::ReadOnly.rank());
    }

    #[test]
    fn envelope_is_json_with_status_and_result() {
        let m = model_envelope(ToolStatus::from_ok(false), "denied by user");
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status": "error", "result": "denied by user"})
        );
        assert_eq!(ToolStatus::from_ok(true).as_str(), "done");
        assert_eq!(TurnDoneReason::Interrupted.as_str(), "interrupted");
    }
}
