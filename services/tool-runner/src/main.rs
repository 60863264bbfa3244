//! `omicos-tool-runner`: the ToolRunner and Registry services with the
//! built-in file_manager and shell providers.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "omicos-tool-runner",
    about = "Runs every tool call through the governed pipeline"
)]
struct Args {
    /// YAML config file (then OMICOS_* environment variables override it).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let _telemetry = omicos_servicekit::telemetry::init("omicos-tool-runner", "info");
    let config: omicos_tool_runner::Config = match omicos_servicekit::load_config(
        args.config.as_deref(),
        &omicos_servicekit::config::process_env(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("omicos-tool-runner: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = config.validate() {
        eprintln!("omicos-tool-runner: {e}");
        return std::process::ExitCode::from(2);
    }
    let listener = match omicos_servicekit::host::bind(&config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("omicos-tool-runner: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("listening on http://{a}"),
        Err(e) => eprintln!("omicos-tool-runner: {e}"),
    }
    let shutdown =
        omicos_servicekit::Shutdown::new(Duration::from_secs(config.shutdown_grace_secs));
    shutdown.on_signals();
    match omicos_tool_runner::run(config, listener, shutdown, Vec::new()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omicos-tool-runner: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
