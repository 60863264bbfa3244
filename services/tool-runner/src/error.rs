//! The runner's errors outside a tool call, and their one mapping to a gRPC
//! status. A failure inside a call is not one of these: it is a
//! [`crate::pipeline::normalize::Failure`] that the model reads as an error
//! result, and the call itself succeeds on the wire.

use omicos_proto::UnknownMode;
use std::path::PathBuf;
use tonic::{Code, Status};

/// Why the runner could not start, or refused a request outside a tool call.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The configuration is not usable; the message names the key.
    #[error(transparent)]
    Config(#[from] omicos_servicekit::ConfigError),
    /// The workspace cannot be created or resolved.
    #[error("config key `workspace`: cannot {action} {}: {source}", path.display())]
    Workspace {
        /// "create" or "resolve".
        action: &'static str,
        /// The configured path.
        path: PathBuf,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// A hook matcher is not a valid regex.
    #[error("hook matcher `{matcher}` is not a valid regex: {source}")]
    HookMatcher {
        /// The matcher as written.
        matcher: String,
        /// The regex compiler's error.
        #[source]
        source: Box<regex::Error>,
    },
    /// A request names a permission mode this build does not know.
    #[error(transparent)]
    Mode(#[from] UnknownMode),
    /// A request carries a permission rule that does not parse; the message
    /// names its source and the rule.
    #[error("{0}")]
    Rules(String),
    /// A provider registration is missing a field or has a bad endpoint.
    #[error("cannot register: {0}")]
    Registration(String),
    /// A registration, heartbeat or deregistration the caller may not make
    /// (another's instance id or tool name, a static entry).
    #[error("registration refused: {0}")]
    RegistrationDenied(String),
    /// The shared registry's store (PostgreSQL) did not take or give an answer.
    #[error("the shared registry store: {0}")]
    RegistryStore(String),
}

impl RunnerError {
    /// A short stable name for logs and events.
    pub fn kind(&self) -> &'static str {
        match self {
            RunnerError::Config(_) => "config",
            RunnerError::Workspace { .. } => "workspace",
            RunnerError::HookMatcher { .. } => "hook_matcher",
            RunnerError::Mode(_) => "permission_mode",
            RunnerError::Rules(_) => "permission_rules",
            RunnerError::Registration(_) => "registration",
            RunnerError::RegistrationDenied(_) => "registration_denied",
            RunnerError::RegistryStore(_) => "registry_store",
        }
    }

    /// The gRPC code: the caller's mistakes are INVALID_ARGUMENT; a runner
    /// that is misconfigured is FAILED_PRECONDITION.
    pub fn code(&self) -> Code {
        match self {
            RunnerError::Mode(_) | RunnerError::Rules(_) | RunnerError::Registration(_) => {
                Code::InvalidArgument
            }
            RunnerError::Config(_)
            | RunnerError::Workspace { .. }
            | RunnerError::HookMatcher { .. } => Code::FailedPrecondition,
            RunnerError::RegistrationDenied(_) => Code::PermissionDenied,
            RunnerError::RegistryStore(_) => Code::Unavailable,
        }
    }
}

impl From<RunnerError> for Status {
    fn from(e: RunnerError) -> Self {
        tracing::debug!(kind = e.kind(), error = %e, "request refused");
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code() {
        let mode = omicos_proto::PermissionMode::from_wire(99).unwrap_err();
        let e = RunnerError::from(mode);
        assert_eq!(
            (e.kind(), e.code()),
            ("permission_mode", Code::InvalidArgument)
        );
        let e = RunnerError::Registration("instance_id is empty".into());
        let s = Status::from(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "cannot register: instance_id is empty");
        let e = RunnerError::Workspace {
            action: "create",
            path: "/nope".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            (e.kind(), e.code()),
            ("workspace", Code::FailedPrecondition)
        );
        assert!(
            e.to_string()
                .starts_with("config key `workspace`: cannot create /nope")
        );
        assert!(
            std::error::Error::source(&e).is_some(),
            "the io error is kept"
        );
    }
}
