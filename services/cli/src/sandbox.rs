//! `omicos sandbox [--policy P] -- CMD`: run one command under a sandbox
//! policy by hand, to see what the shell tool and the kernels may do.

use omicos_sandbox::run::{RunRequest, run as run_sandboxed};
use omicos_sandbox::{Sandbox, SandboxConfig, SandboxPolicy, WhenMissing};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// The command line of `omicos sandbox`.
#[derive(clap::Args, Debug)]
pub struct SandboxArgs {
    /// read-only, workspace-write, network or danger-full-access.
    #[arg(long, default_value = "workspace-write")]
    pub policy: SandboxPolicy,
    /// The workspace and working directory (default: the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// More readable directories (repeatable).
    #[arg(long = "read", value_name = "DIR")]
    pub read_roots: Vec<PathBuf>,
    /// More writable directories (repeatable).
    #[arg(long = "write", value_name = "DIR")]
    pub write_roots: Vec<PathBuf>,
    /// Accepted for compatibility: a box without the network always has a
    /// private loopback of its own.
    #[arg(long, hide = true)]
    pub private_loopback: bool,
    /// Run even where the kernel has no Landlock (with a warning).
    #[arg(long)]
    pub warn_without_landlock: bool,
    /// Run even where no namespaces can be made (with a warning).
    #[arg(long)]
    pub warn_without_namespaces: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn absolute(p: PathBuf) -> PathBuf {
    std::path::absolute(&p).unwrap_or(p)
}

/// Runs the command and exits with its code (126 when it could not run).
pub async fn run(args: SandboxArgs) -> ExitCode {
    let workspace = args
        .workspace
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."));
    let config = SandboxConfig {
        read_roots: args.read_roots.into_iter().map(absolute).collect(),
        write_roots: args.write_roots.into_iter().map(absolute).collect(),
        when_landlock_missing: if args.warn_without_landlock {
            WhenMissing::Warn
        } else {
            WhenMissing::Refuse
        },
        when_namespaces_missing: if args.warn_without_namespaces {
            WhenMissing::Warn
        } else {
            WhenMissing::Refuse
        },
        ..SandboxConfig::default()
    };
    let sandbox = match Sandbox::new(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("omicos sandbox: {e}");
            return ExitCode::from(2);
        }
    };
    let req = RunRequest {
        policy: args.policy,
        workspace: absolute(workspace),
        argv: args.command,
    };
    match run_sandboxed(&sandbox, &req).await {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("omicos sandbox: {e}");
            ExitCode::from(126)
        }
    }
}
