//! The orchestrator's errors and their one mapping to gRPC.
//!
//! Every failure the orchestrator reports is an [`OrchestratorError`]. Its
//! [`ErrorKind`] is the one spelling clients and logs see (`ErrorEvent.kind`,
//! the `omicos-error-kind` metadata of a `Status`), and
//! [`ErrorKind::grpc_code`] is the only place a kind becomes a `tonic::Code`
//! (as quickwit's `ServiceErrorCode::grpc_status_code`). A wrong gRPC status
//! is fixed here, nowhere else.

use crate::llm::LlmError;
use omicos_proto::UnknownMode;
use omicos_sessionstore::StoreError;
use std::error::Error as StdError;
use std::fmt;
use tonic::{Code, Status};

/// The metadata key that carries [`ErrorKind::as_str`] on every error status,
/// so a client can tell a missing session from a busy one without parsing text.
pub const ERROR_KIND_METADATA: &str = "omicos-error-kind";

/// What went wrong, as clients see it. One variant per way a client should react.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed (an unknown mode, an empty message).
    InvalidArgument,
    /// The session does not exist.
    SessionNotFound,
    /// No approval is waiting for that call.
    ApprovalNotPending,
    /// The turn or event a fork or rewind names is not in the session's history.
    TurnNotFound,
    /// The event, message, field or pointer a ReadValue names holds no
    /// string in the session.
    ValueNotFound,
    /// A ReadValue's offset is past the end of the value.
    OffsetPastEnd,
    /// The runner refused to restore a checkpoint's files (a path outside
    /// the workspace or in `.omicos/`): nothing was rewound.
    FilesNotRestored,
    /// A turn is already running in the session.
    SessionBusy,
    /// Attached files over a size limit or the workspace's disk bound:
    /// nothing was written.
    UploadTooLarge,
    /// The requested agent is locked above the deployment's tier.
    AgentLocked,
    /// The conversation store failed.
    StoreUnavailable,
    /// The session's history could not be read, so the turn cannot run.
    HistoryUnavailable,
    /// The tool-runner did not answer.
    ToolRunnerUnavailable,
    /// The model server stayed unavailable through the retries.
    LlmUnavailable,
    /// The conversation is longer than the model's context.
    ContextOverflow,
    /// The model server refused the request (4xx other than 429).
    BadRequest,
    /// The model's stream broke or went idle mid-answer.
    LlmStreamBroken,
    /// The requested model backend is not configured.
    LlmConfig,
    /// The client cancelled.
    Cancelled,
    /// The orchestrator is draining; the client should attach elsewhere.
    ShuttingDown,
    /// The configuration is not usable (at start).
    Config,
    /// A bug or an invariant broken inside the orchestrator.
    Internal,
}

impl ErrorKind {
    /// The kind's one spelling (`ErrorEvent.kind`, metadata, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::SessionNotFound => "session_not_found",
            Self::ApprovalNotPending => "approval_not_pending",
            Self::TurnNotFound => "turn_not_found",
            Self::ValueNotFound => "value_not_found",
            Self::OffsetPastEnd => "offset_past_end",
            Self::FilesNotRestored => "files_not_restored",
            Self::SessionBusy => "session_busy",
            Self::UploadTooLarge => "upload_too_large",
            Self::AgentLocked => "agent_locked",
            Self::StoreUnavailable => "store_unavailable",
            Self::HistoryUnavailable => "history_unavailable",
            Self::ToolRunnerUnavailable => "tool_runner_unavailable",
            Self::LlmUnavailable => "llm_unavailable",
            Self::ContextOverflow => "context_overflow",
            Self::BadRequest => "bad_request",
            Self::LlmStreamBroken => "llm_stream_broken",
            Self::LlmConfig => "llm_config",
            Self::Cancelled => "cancelled",
            Self::ShuttingDown => "shutting_down",
            Self::Config => "config",
            Self::Internal => "internal",
        }
    }

    /// The gRPC code of this kind: the only mapping from an orchestrator
    /// error to a `tonic::Code`.
    pub fn grpc_code(self) -> Code {
        match self {
            Self::InvalidArgument => Code::InvalidArgument,
            Self::SessionNotFound
            | Self::ApprovalNotPending
            | Self::TurnNotFound
            | Self::ValueNotFound => Code::NotFound,
            // The request is fine; the session or deployment is not in a state to run it.
            Self::SessionBusy
            | Self::AgentLocked
            | Self::LlmConfig
            | Self::BadRequest
            | Self::FilesNotRestored => Code::FailedPrecondition,
            // Transient: the same request may succeed later (or on another replica).
            Self::StoreUnavailable
            | Self::HistoryUnavailable
            | Self::ToolRunnerUnavailable
            | Self::LlmUnavailable
            | Self::LlmStreamBroken
            | Self::ShuttingDown => Code::Unavailable,
            Self::ContextOverflow | Self::UploadTooLarge => Code::ResourceExhausted,
            Self::OffsetPastEnd => Code::OutOfRange,
            Self::Cancelled => Code::Cancelled,
            Self::Config | Self::Internal => Code::Internal,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status the tool-runner answered, shown as its code and message (the
/// transport error under it stays reachable through `source()`).
#[derive(Debug)]
pub struct RunnerStatus(pub Status);

impl fmt::Display for RunnerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.0.code(), self.0.message())
    }
}

impl StdError for RunnerStatus {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// Everything that can go wrong in the orchestrator, with its cause kept.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// The request is malformed; the text says how.
    #[error("{0}")]
    InvalidArgument(String),
    /// The permission mode is not one of the accepted spellings.
    #[error(transparent)]
    Mode(#[from] UnknownMode),
    /// The session does not exist.
    #[error("session `{0}` does not exist")]
    SessionNotFound(String),
    /// No approval is waiting for that call.
    #[error("no approval is pending for call `{call_id}` in session `{session}`")]
    ApprovalNotPending {
        /// The session.
        session: String,
        /// The call.
        call_id: String,
    },
    /// A turn is already running in the session.
    #[error(
        "session `{0}` is busy: a turn is running. Wait for its turn_done (Attach follows it) or cancel it with CancelTurn"
    )]
    SessionBusy(String),
    /// The team cannot run (its active agent is locked).
    #[error(transparent)]
    Team(#[from] omicos_catalog::TeamError),
    /// A conversation-store call failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The session's history could not be read; running the turn with an
    /// empty history would answer out of context.
    #[error("the history of session `{session}` cannot be read")]
    History {
        /// The session.
        session: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The session's latest event seq could not be read; going on would
    /// restart the gap-free sequence at the wrong number.
    #[error("the event sequence of session `{session}` cannot be read")]
    Seq {
        /// The session.
        session: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The tool-runner did not list the tools.
    #[error("the tool-runner did not list tools")]
    ToolRunner(#[source] RunnerStatus),
    /// The tool-runner's endpoint is not a usable URI.
    #[error("config key `tool_runner`: `{endpoint}` is not a valid endpoint")]
    RunnerEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// Why it is not valid.
        #[source]
        source: tonic::transport::Error,
    },
    /// A model call failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// A configuration value is not usable.
    #[error("config key `{key}`")]
    Config {
        /// The key, dotted (`llm.replay_file`).
        key: &'static str,
        /// What is wrong with it.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The orchestrator is draining.
    #[error("the orchestrator is shutting down; attach again with since_seq")]
    ShuttingDown,
    /// A fork or rewind named a turn or event the session's history does
    /// not hold; the text says which and why.
    #[error("{0}")]
    TurnNotFound(String),
    /// What a ReadValue names is not in the session; the text says which.
    #[error("{0}")]
    ValueNotFound(String),
    /// A ReadValue's offset is past the value's end.
    #[error(
        "offset {offset} is past the end of the value ({size} bytes): resume from at most {size}"
    )]
    OffsetPastEnd {
        /// The offset asked for.
        offset: u64,
        /// The value's size in bytes.
        size: u64,
    },
    /// Attached files over a limit; the text says which and by how much.
    #[error("{0}")]
    UploadTooLarge(String),
    /// The runner refused a checkpoint's restore.
    #[error("the files of session `{session}` were not restored, and nothing was rewound")]
    FilesNotRestored {
        /// The session.
        session: String,
        /// The runner's answer.
        #[source]
        source: RunnerStatus,
    },
}

impl OrchestratorError {
    /// The kind clients and logs see.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidArgument(_) | Self::Mode(_) => ErrorKind::InvalidArgument,
            Self::SessionNotFound(_) => ErrorKind::SessionNotFound,
            Self::ApprovalNotPending { .. } => ErrorKind::ApprovalNotPending,
            Self::SessionBusy(_) => ErrorKind::SessionBusy,
            Self::Team(_) => ErrorKind::AgentLocked,
            Self::Store(StoreError::NotFound(_)) => ErrorKind::SessionNotFound,
            Self::Store(StoreError::Backend(_)) | Self::Seq { .. } => ErrorKind::StoreUnavailable,
            Self::History { .. } => ErrorKind::HistoryUnavailable,
            Self::ToolRunner(_) => ErrorKind::ToolRunnerUnavailable,
            Self::Llm(e) => e.kind(),
            Self::RunnerEndpoint { .. } | Self::Config { .. } => ErrorKind::Config,
            Self::ShuttingDown => ErrorKind::ShuttingDown,
            Self::TurnNotFound(_) => ErrorKind::TurnNotFound,
            Self::ValueNotFound(_) => ErrorKind::ValueNotFound,
            Self::OffsetPastEnd { .. } => ErrorKind::OffsetPastEnd,
            Self::FilesNotRestored { .. } => ErrorKind::FilesNotRestored,
            Self::UploadTooLarge(_) => ErrorKind::UploadTooLarge,
        }
    }

    /// The message with its causes, outermost first, joined by `: `.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut cause = self.source();
        while let Some(c) = cause {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cause = c.source();
        }
        out
    }

    /// A configuration error for `key` with a plain reason.
    pub fn config(key: &'static str, reason: impl Into<String>) -> Self {
        Self::Config {
            key,
            source: reason.into().into(),
        }
    }
}

impl From<OrchestratorError> for Status {
    fn from(e: OrchestratorError) -> Self {
        let kind = e.kind();
        // Bounded: a quoted rule or argument must not come back whole.
        let mut status = Status::new(kind.grpc_code(), crate::bound::error_message(&e.report()));
        status.metadata_mut().insert(
            ERROR_KIND_METADATA,
            tonic::metadata::MetadataValue::from_static(kind.as_str()),
        );
        status
    }
}

/// Lets callers that still report errors as text (the binaries' start-up)
/// use `?`; the text keeps the whole cause chain.
impl From<OrchestratorError> for String {
    fn from(e: OrchestratorError) -> Self {
        e.report()
    }
}

/// Converts a result for a gRPC handler.
pub fn grpc<T>(r: Result<T, OrchestratorError>) -> Result<T, Status> {
    r.map_err(Status::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(e: OrchestratorError) -> Status {
        Status::from(e)
    }

    #[test]
    fn a_missing_session_is_not_found_and_a_broken_store_unavailable() {
        let s = status(StoreError::NotFound("s1".into()).into());
        assert_eq!(s.code(), Code::NotFound, "{s:?}");
        assert_eq!(
            s.metadata().get(ERROR_KIND_METADATA).unwrap(),
            "session_not_found"
        );
        let s = status(StoreError::Backend("disk I/O error".into()).into());
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(s.message().contains("disk I/O error"), "{}", s.message());
        let s = status(OrchestratorError::SessionNotFound("s2".into()));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "session `s2` does not exist");
    }

    #[test]
    fn the_cause_chain_reaches_the_status_message() {
        let e = OrchestratorError::History {
            session: "s1".into(),
            source: StoreError::Backend("connection refused".into()),
        };
        assert_eq!(e.kind(), ErrorKind::HistoryUnavailable);
        assert!(e.source().is_some(), "the source is kept");
        let s = status(e);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(
            s.message(),
            "the history of session `s1` cannot be read: conversation store: connection refused"
        );
        let e = OrchestratorError::ToolRunner(RunnerStatus(Status::unavailable("tcp connect")));
        assert_eq!(
            e.report(),
            "the tool-runner did not list tools: Unavailable: tcp connect"
        );
        assert_eq!(e.kind().as_str(), "tool_runner_unavailable");
    }

    #[test]
    fn each_request_error_has_its_code() {
        let mode = omicos_proto::PermissionMode::parse("yolo").unwrap_err();
        let cases: Vec<(OrchestratorError, Code, &str)> = vec![
            (mode.into(), Code::InvalidArgument, "invalid_argument"),
            (
                OrchestratorError::InvalidArgument("message is empty".into()),
                Code::InvalidArgument,
                "invalid_argument",
            ),
            (
                OrchestratorError::SessionBusy("s".into()),
                Code::FailedPrecondition,
                "session_busy",
            ),
            (
                OrchestratorError::ApprovalNotPending {
                    session: "s".into(),
                    call_id: "c".into(),
                },
                Code::NotFound,
                "approval_not_pending",
            ),
            (
                OrchestratorError::Seq {
                    session: "s".into(),
                    source: StoreError::Backend("x".into()),
                },
                Code::Unavailable,
                "store_unavailable",
            ),
            (
                OrchestratorError::ShuttingDown,
                Code::Unavailable,
                "shutting_down",
            ),
            (
                OrchestratorError::TurnNotFound("no turn t".into()),
                Code::NotFound,
                "turn_not_found",
            ),
            (
                OrchestratorError::ValueNotFound("no event 9".into()),
                Code::NotFound,
                "value_not_found",
            ),
            (
                OrchestratorError::OffsetPastEnd { offset: 9, size: 3 },
                Code::OutOfRange,
                "offset_past_end",
            ),
            (
                OrchestratorError::FilesNotRestored {
                    session: "s".into(),
                    source: RunnerStatus(Status::permission_denied(".omicos/")),
                },
                Code::FailedPrecondition,
                "files_not_restored",
            ),
            (
                LlmError::ContextOverflow("too long".into()).into(),
                Code::ResourceExhausted,
                "context_overflow",
            ),
            (
                OrchestratorError::config("llm.replay_file", "needs a script"),
                Code::Internal,
                "config",
            ),
        ];
        for (e, code, kind) in cases {
            let text = e.report();
            let s = status(e);
            assert_eq!(s.code(), code, "{text}");
            assert_eq!(s.metadata().get(ERROR_KIND_METADATA).unwrap(), kind);
        }
    }

    #[test]
    fn llm_kinds_keep_their_spelling() {
        let cases = [
            (LlmError::ContextOverflow(String::new()), "context_overflow"),
            (LlmError::BadRequest(String::new()), "bad_request"),
            (
                LlmError::Unavailable {
                    attempts: 2,
                    last: String::new(),
                },
                "llm_unavailable",
            ),
            (LlmError::StreamBroken(String::new()), "llm_stream_broken"),
            (LlmError::Cancelled, "cancelled"),
            (LlmError::Config(String::new()), "llm_config"),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind().as_str(), kind);
            assert_eq!(OrchestratorError::from(e).kind().as_str(), kind);
        }
    }
}
