//! `omicos sandbox [--policy P] -- CMD`: run one command under a policy, by
//! hand, in a box of its own (the terminal's streams passed in; the box
//! still has no controlling terminal).

use crate::{Command, Placement, Sandbox, SandboxError, SandboxPolicy, Stdio};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

/// What to run and how.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The policy.
    pub policy: SandboxPolicy,
    /// The workspace (writable under workspace-write and network) and working directory.
    pub workspace: PathBuf,
    /// The program and its arguments.
    pub argv: Vec<OsString>,
}

/// Why the command did not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Nothing to run.
    #[error("no command given: omicos sandbox [--policy P] -- CMD [ARGS...]")]
    NoCommand,
    /// An argument is not UTF-8.
    #[error("the arguments must be UTF-8: {0:?}")]
    NotUtf8(OsString),
    /// The sandbox could not be prepared or the program not started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: SandboxError,
    },
    /// Waiting failed.
    #[error("waiting for {program} failed: {source}")]
    Wait {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Exit code of a process: its own, or 128 + the signal that ended it (as shells do).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> Stdio {
    fd.try_clone_to_owned()
        .map(Stdio::Fd)
        .unwrap_or(Stdio::Null)
}

/// Runs `req` in a box of its own and returns its exit code. Warnings (a
/// layer missing under `warn`) go to stderr.
pub async fn run(sandbox: &Sandbox, req: &RunRequest) -> Result<i32, RunError> {
    let argv: Vec<String> = req
        .argv
        .iter()
        .map(|a| a.clone().into_string().map_err(RunError::NotUtf8))
        .collect::<Result<_, _>>()?;
    let (program, args) = argv.split_first().ok_or(RunError::NoCommand)?;
    let session = format!("cli-{}", std::process::id());
    let place = Placement::new("", session.clone(), &req.workspace, req.policy);
    let mut cmd = Command::new(program.clone());
    cmd.args(args.iter().cloned()).cwd(&req.workspace);
    cmd.stdin(dup(std::io::stdin().as_fd()))
        .stdout(dup(std::io::stdout().as_fd()))
        .stderr(dup(std::io::stderr().as_fd()));
    let spawned = sandbox.spawn(&place, cmd).await;
    let mut child = match spawned {
        Ok(c) => c,
        Err(source) => {
            return Err(RunError::Spawn {
                program: program.clone(),
                source,
            });
        }
    };
    for w in child.warnings() {
        eprintln!("omicos sandbox: {w}");
    }
    // Like system(3): ^C and ^\ are for the child; we wait and clean up.
    // SAFETY: signal(2) with SIG_IGN, restored right after the wait.
    let (old_int, old_quit) = unsafe {
        (
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        )
    };
    let status = child.wait().await;
    // SAFETY: restores the dispositions saved above.
    unsafe {
        libc::signal(libc::SIGINT, old_int);
        libc::signal(libc::SIGQUIT, old_quit);
    }
    child.end().await;
    drop(child);
    sandbox.end_session("", &session);
    status.map(exit_code).map_err(|source| RunError::Wait {
        program: program.clone(),
        source,
    })
}
