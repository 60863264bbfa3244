//! `omicos up`: the whole stack in this process, every service on its own
//! loopback port (printed); Ctrl-C drains and stops, a second Ctrl-C exits at once.

use crate::error::CliError;
use crate::style::Style;
use std::path::PathBuf;
use std::process::ExitCode;

/// What `omicos up` was asked.
#[derive(Clone, Debug)]
pub struct UpArgs {
    /// Workspace root.
    pub workspace: PathBuf,
    /// Whole-stack YAML config.
    pub config: Option<PathBuf>,
    /// First port (0: ephemeral ports).
    pub port_base: u16,
    /// No token required (`--no-auth`).
    pub no_auth: bool,
}

/// Runs the stack until Ctrl-C or SIGTERM.
pub async fn run(args: UpArgs) -> ExitCode {
    let st = Style::for_stdout();
    let mut opts = omicos_stack::UpOptions::new(&args.workspace);
    opts.config_file = args.config;
    opts.port_base = args.port_base;
    opts.auth = !args.no_auth;
    let stack = match omicos_stack::up(opts).await {
        Ok(s) => s,
        Err(e) => return CliError::from(e).report("up"),
    };
    // Caught before anything is printed: a Ctrl-C right after the URLs drains.
    let mut signals = omicos_servicekit::shutdown::Signals::install();
    let shutdown = stack.shutdown.clone();
    tokio::spawn(async move {
        signals.recv().await;
        println!("draining… (Ctrl-C again to stop at once)");
        shutdown.trigger();
        signals.recv().await;
        eprintln!("omicos up: stopped without draining");
        std::process::exit(130);
    });
    println!("{}", st.bold("omicos is up"));
    println!("  workspace     {}", stack.workspace.display());
    println!("  llm backend   {}", stack.llm_backend);
    if let Some(py) = &stack.kernel_python {
        println!("  kernel python {} ({})", py.python.display(), py.source);
        if py.is_fallback() {
            println!(
                "{}",
                st.yellow(
                    "  no .venv with ipykernel in the workspace or here (or a parent): the kernels use python3 from PATH, \
                     and run_python_code needs ipykernel there. Run ./scripts/bootstrap.sh or `omicos kernel setup` here, \
                     or set OMICOS_KERNEL_PYTHON"
                )
            );
        }
    }
    for (name, url) in &stack.endpoints {
        println!("  {name:<13} {url}");
    }
    // The orchestrator serves the page on its own port (works offline on the replay backend).
    println!("  {:<13} {}", "page", st.bold(&stack.page_url()));
    match &stack.token {
        Some(_) => {
            let file = omicos_auth::token::path(&stack.workspace);
            let made = if stack.token_created { " (made now)" } else { "" };
            println!("  token         {}{made}", file.display());
            println!(
                "{}",
                st.dim(&format!(
                    "  every call needs it: omicos chat reads it by itself from omicos-workspace/ (else --token-file {0}); \
                     grpcurl -H \"authorization: Bearer $(cat {0})\" …",
                    file.display()
                ))
            );
        }
        None => println!(
            "{}",
            st.yellow(
                "  --no-auth: NO credential is checked; anyone who reaches these ports acts as you, with any mode"
            )
        ),
    }
    let hint = if args.port_base == 7000 {
        "talk to it: omicos chat · Ctrl-C stops".to_owned()
    } else {
        format!(
            "talk to it: omicos chat --server {} · Ctrl-C stops",
            stack.orchestrator
        )
    };
    println!("{}", st.dim(&hint));
    match stack.wait().await {
        Ok(()) => {
            println!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => CliError::from(e).report("up"),
    }
}
