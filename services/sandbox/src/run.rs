//! `omicos sandbox [--policy P] -- CMD`: run one command under a policy, by hand.

use crate::{Roots, Sandbox, SandboxError, SandboxPolicy};
use std::ffi::OsString;
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
    /// The sandbox could not be prepared.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The program could not be started (inside the sandbox too: a step of
    /// the confinement failing shows up here with its errno).
    #[error("cannot run {program}: {source}")]
    Spawn {
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

/// Runs `req` under `sandbox`, in a fresh temporary directory, and returns its exit code.
/// Warnings (Landlock missing under `warn`) go to stderr.
pub fn run(sandbox: &Sandbox, req: &RunRequest) -> Result<i32, RunError> {
    let (program, args) = req.argv.split_first().ok_or(RunError::NoCommand)?;
    let tmp = sandbox.session_tmp_dir(&format!("cli-{}", std::process::id()))?;
    let roots = Roots::new(&req.workspace).tmp(&tmp);
    let prepared = sandbox.prepare(req.policy, &roots)?;
    for w in prepared.warnings() {
        eprintln!("omicos sandbox: {w}");
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).current_dir(&req.workspace);
    let spawned = prepared.spawn_std(&mut cmd);
    let result = match spawned {
        Ok(mut child) => {
            // Like system(3): ^C and ^\ are for the child; we wait and clean up.
            // SAFETY: signal(2) with SIG_IGN, restored right after the wait.
            let (old_int, old_quit) = unsafe {
                (
                    libc::signal(libc::SIGINT, libc::SIG_IGN),
                    libc::signal(libc::SIGQUIT, libc::SIG_IGN),
                )
            };
            let status = child.wait();
            // SAFETY: restores the dispositions saved above.
            unsafe {
                libc::signal(libc::SIGINT, old_int);
                libc::signal(libc::SIGQUIT, old_quit);
            }
            status.map(exit_code).map_err(|source| RunError::Spawn {
                program: program.to_string_lossy().into_owned(),
                source,
            })
        }
        Err(source) => Err(RunError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        }),
    };
    drop(prepared);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}
