//! The `omicos` binary: parses the command line and runs one command.

use clap::{Parser, Subcommand};
use omicos_cli::error::{CliError, EXIT_FAILURE};
use omicos_cli::{chat, commands, demo, style::Style, turn, up};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "omicos",
    version,
    about = "omicos: an agent runtime. Start with `omicos demo`, then `omicos up` and `omicos chat`."
)]
struct Cli {
    /// The orchestrator to talk to.
    #[arg(
        long,
        global = true,
        env = "OMICOS_SERVER",
        default_value = "http://127.0.0.1:7000"
    )]
    server: String,
    /// The bearer token (default: the first of --token-file that exists).
    #[arg(long, global = true, env = "OMICOS_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Where `omicos up` keeps the token (`<workspace>/.omicos/token`).
    #[arg(
        long,
        global = true,
        env = "OMICOS_TOKEN_FILE",
        default_value = "omicos-workspace/.omicos/token"
    )]
    token_file: PathBuf,
    /// The CA bundle (PEM) that an `https://` --server's certificate must
    /// chain to (default: the system's roots).
    #[arg(long, global = true, env = "OMICOS_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to an `https://` server that
    /// asks for one (mutual TLS: a runner or provider with `tls.client_ca`,
    /// for `omicos health` probes). Needs --key.
    #[arg(
        long,
        global = true,
        env = "OMICOS_CLIENT_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(
        long,
        global = true,
        env = "OMICOS_CLIENT_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    key: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole stack in this process, every service on its own loopback port.
    Up {
        /// Workspace directory (created if missing).
        #[arg(long, default_value = "omicos-workspace")]
        workspace: PathBuf,
        /// Whole-stack YAML config (sections: orchestrator, tool_runner, kernel, web, memory, pdf).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Orchestrator port; the others follow (+1 tool-runner, +2 kernel, +3 web, +4 memory). 0: ephemeral ports.
        #[arg(long, default_value = "7000", value_parser = commands::parse_port_base)]
        port_base: u16,
        /// Let anyone who reaches the ports in, without a token (prints a warning).
        #[arg(long)]
        no_auth: bool,
    },
    /// Chat with the agents: a REPL on a terminal; with piped stdin, one turn that prints the answer.
    Chat {
        /// Continue this session.
        #[arg(long)]
        session: Option<String>,
        /// The active agent.
        #[arg(long)]
        agent: Option<String>,
        /// The team, comma-separated (default: the whole catalog).
        #[arg(long, value_delimiter = ',')]
        team: Vec<String>,
        /// Permission mode: read_only, auto (ask before side effects) or full.
        #[arg(long, value_parser = commands::parse_mode)]
        mode: Option<String>,
        /// Print every event as a JSON line.
        #[arg(long)]
        json: bool,
        /// Attach a file to the first message (repeatable): it is uploaded
        /// into the session's workspace (uploads/) and the message names it.
        #[arg(long, value_name = "FILE")]
        attach: Vec<std::path::PathBuf>,
    },
    /// List the agents of the catalog.
    Agents,
    /// List the tools an agent's model sees.
    Tools {
        /// The agent (default: the default agent).
        #[arg(long)]
        agent: Option<String>,
        /// Permission mode (read_only, auto, full).
        #[arg(long, value_parser = commands::parse_mode)]
        mode: Option<String>,
    },
    /// List sessions, or show one.
    Sessions {
        #[command(subcommand)]
        show: Option<SessionsCommand>,
    },
    /// Answer a pending tool approval.
    Approve {
        /// Session id.
        session: String,
        /// Tool call id.
        call: String,
        /// allow (this call), session (this tool for the rest of the session) or deny.
        decision: String,
    },
    /// The Python kernel's environment.
    Kernel {
        #[command(subcommand)]
        command: KernelCommand,
    },
    /// Run one command under a sandbox policy (as shell and the kernels run).
    Sandbox(omicos_cli::sandbox::SandboxArgs),
    /// Ask a service's grpc.health.v1 whether it is serving (exit 0) or not (exit 1): for container healthchecks.
    Health {
        /// The service's address (default: --server).
        addr: Option<String>,
        /// The service name to ask about ("" is the whole server).
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Serve omicos's tools to MCP clients (Claude Code, codex, goose, ...).
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// Run the scripted offline demo end to end (exits 0 only if every step happened).
    Demo {
        /// Workspace directory (default: a fresh one under the temp dir).
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SessionsCommand {
    /// Show a session's conversation.
    Show {
        /// Session id.
        id: String,
    },
    /// A new session with this one's history up to a turn (default: all of it).
    Fork {
        /// Session id.
        id: String,
        /// Up to and including this turn.
        #[arg(long, conflicts_with = "event")]
        turn: Option<String>,
        /// Up to and including the turn that holds this event seq.
        #[arg(long)]
        event: Option<u64>,
        /// Also put back the files the session's file tools changed after
        /// that point (the workspace is shared by the tenant's sessions).
        #[arg(long)]
        files: bool,
    },
    /// Take the last turns out of what the model sees and restore the files
    /// their file tools changed (shell and kernel changes are not tracked).
    Rewind {
        /// Session id.
        id: String,
        /// How many turns, from the last (default: 1).
        #[arg(long, conflicts_with = "to")]
        turns: Option<u32>,
        /// This turn and every later one.
        #[arg(long)]
        to: Option<String>,
        /// Leave the files as they are.
        #[arg(long)]
        keep_files: bool,
    },
    /// Set a session's title (1 to 200 characters).
    Rename {
        /// Session id.
        id: String,
        /// The new title.
        title: String,
    },
    /// Write a value that `sessions show` or an event shows cut (`… [omicos:
    /// N more bytes of M not shown; …]`) whole to stdout, as the model sent it.
    Value {
        /// Session id.
        id: String,
        /// The event that carries it (its event_seq) ...
        #[arg(long, requires = "field", conflicts_with_all = ["message", "pointer"])]
        event: Option<u64>,
        /// ... and its field, e.g. tool_call_started.arguments.
        #[arg(long, requires = "event")]
        field: Option<String>,
        /// The history message that carries it (its index, as `sessions show` prints it) ...
        #[arg(long, requires = "pointer")]
        message: Option<u32>,
        /// ... and where in it, a JSON pointer, e.g. /tool_calls/0/function/arguments.
        #[arg(long, requires = "message")]
        pointer: Option<String>,
        /// Start this many bytes in, to finish a read that broke off:
        /// `omicos sessions value … --offset $(stat -c %s part) >> part`.
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
}

#[derive(Subcommand)]
enum McpCommand {
    /// Serve over stdio, each call through the runner's pipeline.
    Serve(omicos_cli::mcp::ServeArgs),
}

#[derive(Subcommand)]
enum KernelCommand {
    /// Create a project-local .venv with ipykernel (and requirements.txt when present).
    Setup {
        /// Directory to create .venv in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

/// Prints a command's output, or its error with the error's exit code.
fn print_result(r: Result<String, CliError>, what: &str) -> ExitCode {
    match r {
        Ok(s) => {
            print!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => e.report(what),
    }
}

async fn with_client<F, Fut>(server: &str, what: &str, f: F) -> ExitCode
where
    F: FnOnce(turn::Client) -> Fut,
    Fut: std::future::Future<Output = Result<String, CliError>>,
{
    match turn::connect(server).await {
        Ok(c) => print_result(f(c).await, what),
        Err(e) => e.report(what),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `up` is a server: its logs matter. The demo is a transcript: only errors may interrupt it.
    let level = match cli.command {
        Command::Up { .. } => "info",
        Command::Demo { .. } | Command::Mcp { .. } => "error",
        _ => "warn",
    };
    let _telemetry = omicos_servicekit::telemetry::init("omicos", level);
    let st = Style::for_stdout();
    let server = cli.server;
    turn::set_token(turn::find_token(cli.token.as_deref(), &[cli.token_file]));
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    turn::set_ca(path(&cli.ca).unwrap_or_default());
    if let (Some(cert), Some(key)) = (path(&cli.cert), path(&cli.key)) {
        turn::set_client_cert(cert, key);
    }
    match cli.command {
        Command::Up {
            workspace,
            config,
            port_base,
            no_auth,
        } => {
            up::run(up::UpArgs {
                workspace,
                config,
                port_base,
                no_auth,
            })
            .await
        }
        Command::Chat {
            session,
            agent,
            team,
            mode,
            json,
            attach,
        } => {
            chat::run(chat::ChatOptions {
                server,
                session,
                agent,
                team,
                mode,
                json,
                attach,
            })
            .await
        }
        Command::Agents => {
            with_client(&server, "agents", |mut c| async move {
                commands::agents(&mut c, st).await
            })
            .await
        }
        Command::Tools { agent, mode } => {
            with_client(&server, "tools", |mut c| async move {
                commands::tools(
                    &mut c,
                    agent.as_deref().unwrap_or_default(),
                    mode.as_deref().unwrap_or_default(),
                    st,
                )
                .await
            })
            .await
        }
        Command::Sessions { show: None } => {
            with_client(&server, "sessions", |mut c| async move {
                commands::sessions(&mut c, st).await
            })
            .await
        }
        Command::Sessions {
            show: Some(SessionsCommand::Show { id }),
        } => {
            with_client(&server, "sessions show", |mut c| async move {
                commands::session_show(&mut c, &id, st).await
            })
            .await
        }
        Command::Sessions {
            show:
                Some(SessionsCommand::Fork {
                    id,
                    turn,
                    event,
                    files,
                }),
        } => {
            with_client(&server, "sessions fork", |mut c| async move {
                commands::session_fork(&mut c, &id, turn, event, files, st).await
            })
            .await
        }
        Command::Sessions {
            show:
                Some(SessionsCommand::Rewind {
                    id,
                    turns,
                    to,
                    keep_files,
                }),
        } => {
            with_client(&server, "sessions rewind", |mut c| async move {
                commands::session_rewind(&mut c, &id, turns, to, keep_files, st).await
            })
            .await
        }
        Command::Sessions {
            show:
                Some(SessionsCommand::Value {
                    id,
                    event,
                    field,
                    message,
                    pointer,
                    offset,
                }),
        } => {
            let at = match (event, field, message, pointer) {
                (Some(e), Some(f), None, None) => commands::ValueAt::Event(e, f),
                (None, None, Some(m), Some(p)) => commands::ValueAt::Message(m, p),
                _ => {
                    return CliError::Usage(
                        "name the value: --event N --field F, or --message I --pointer P".into(),
                    )
                    .report("sessions value");
                }
            };
            with_client(&server, "sessions value", |mut c| async move {
                commands::session_value(&mut c, &id, at, offset, &mut std::io::stdout().lock())
                    .await
            })
            .await
        }
        Command::Sessions {
            show: Some(SessionsCommand::Rename { id, title }),
        } => {
            with_client(&server, "sessions rename", |mut c| async move {
                commands::session_rename(&mut c, &id, &title).await
            })
            .await
        }
        Command::Approve {
            session,
            call,
            decision,
        } => {
            let d = match commands::parse_decision(&decision) {
                Ok(d) => d,
                Err(e) => return e.report("approve"),
            };
            with_client(&server, "approve", |mut c| async move {
                commands::approve(&mut c, &session, &call, d).await
            })
            .await
        }
        Command::Kernel {
            command: KernelCommand::Setup { dir },
        } => {
            let r = tokio::task::spawn_blocking(move || commands::kernel_setup(&dir))
                .await
                .unwrap_or_else(|e| Err(CliError::KernelSetup(format!("setup task failed: {e}"))));
            print_result(r, "kernel setup")
        }
        Command::Sandbox(args) => omicos_cli::sandbox::run(args).await,
        Command::Health { addr, service } => {
            let addr = addr.unwrap_or(server);
            print_result(commands::health(&addr, &service).await, "health")
        }
        Command::Mcp {
            command: McpCommand::Serve(args),
        } => omicos_cli::mcp::serve(args).await,
        Command::Demo { workspace } => {
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            let opts = demo::DemoOptions {
                workspace,
                env: omicos_servicekit::config::process_env(),
                cwd,
            };
            match demo::run(opts).await {
                Ok(report) if report.passed() => {
                    println!(
                        "{}",
                        st.green(&format!(
                            "demo passed · workspace {}",
                            report.workspace.display()
                        ))
                    );
                    ExitCode::SUCCESS
                }
                Ok(report) => {
                    let failed = report.checks.iter().filter(|c| !c.ok).count();
                    eprintln!(
                        "omicos demo: {failed} step(s) did not happen · workspace {}",
                        report.workspace.display()
                    );
                    ExitCode::from(EXIT_FAILURE)
                }
                Err(e) => e.report("demo"),
            }
        }
    }
}
