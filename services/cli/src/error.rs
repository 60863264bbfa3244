//! The CLI's errors, and the one place they become exit codes.

use crate::turn::status_text;

/// Exit code of a command whose input was refused before anything ran (a bad
/// mode, decision, port, empty message, or an unusable config file).
pub const EXIT_USAGE: u8 = omicos_servicekit::startup::EXIT_CONFIG;
/// Exit code of a command that failed while running.
pub const EXIT_FAILURE: u8 = omicos_servicekit::startup::EXIT_RUNTIME;
/// Exit code when the user leaves with Ctrl-C (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Why a command failed. The message is what the user reads after
/// `omicos <command>: `.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Input refused before anything ran; the message says what works.
    #[error("{0}")]
    Usage(String),
    /// Nothing answers at the server URL (or it is not a URL).
    #[error("{0}")]
    Connect(String),
    /// The orchestrator answered with an error status.
    #[error("{}", status_text(.0))]
    Rpc(tonic::Status),
    /// A turn could not be started or followed to its end.
    #[error("{0}")]
    Turn(String),
    /// The in-process stack did not start or stopped with errors.
    #[error(transparent)]
    Stack(#[from] omicos_stack::StackError),
    /// `omicos health`: the service answered, and is not serving.
    #[error("{0}")]
    NotServing(String),
    /// `omicos kernel setup` could not make the venv, or pip failed.
    #[error("{0}")]
    KernelSetup(String),
    /// The demo's interpreter cannot run the demo's kernel.
    #[error("{0}")]
    Python(String),
    /// A local file or terminal operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        Self::Rpc(s)
    }
}

impl CliError {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Usage(_) => "usage",
            Self::Connect(_) => "connect",
            Self::Rpc(_) => "rpc",
            Self::Turn(_) => "turn",
            Self::Stack(e) => e.kind(),
            Self::NotServing(_) => "not_serving",
            Self::KernelSetup(_) => "kernel_setup",
            Self::Python(_) => "python",
            Self::Io { .. } => "io",
        }
    }

    /// The process exit code for this error: [`EXIT_USAGE`] for input and
    /// config refused up front, [`EXIT_FAILURE`] for the rest.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Stack(omicos_stack::StackError::Config(_)) => EXIT_USAGE,
            _ => EXIT_FAILURE,
        }
    }

    /// Prints `omicos <what>: <error>` on stderr and returns the exit code.
    pub fn report(&self, what: &str) -> std::process::ExitCode {
        eprintln!("omicos {what}: {self}");
        std::process::ExitCode::from(self.exit_code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_and_config_errors_exit_2_the_rest_1() {
        assert_eq!(CliError::Usage("bad".into()).exit_code(), EXIT_USAGE);
        let cfg = omicos_servicekit::ConfigError::key("kernel.timeout", "must be more than 0");
        let e = CliError::from(omicos_stack::StackError::from(cfg));
        assert_eq!((e.exit_code(), e.kind()), (EXIT_USAGE, "config"));
        assert!(e.to_string().contains("config key `kernel.timeout`"), "{e}");
        let e = CliError::from(tonic::Status::not_found("no session x"));
        assert_eq!((e.exit_code(), e.kind()), (EXIT_FAILURE, "rpc"));
        assert_eq!(e.to_string(), "no session x (NotFound)");
    }
}
