//! The orchestrator binary.

use clap::Parser;
use omicos_orchestrator::{
    Parts, agents::CatalogAgents, build_backends, config::Config, open_store, serve,
};
use omicos_servicekit::{Shutdown, load_config};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "omicos-orchestrator",
    about = "The omicos orchestrator service"
)]
struct Args {
    /// YAML config file.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let _telemetry = omicos_servicekit::telemetry::init("omicos-orchestrator", "info");
    let cfg: Config = match load_config(
        args.config.as_deref(),
        &omicos_servicekit::config::process_env(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("omicos-orchestrator: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = cfg.validate() {
        eprintln!("omicos-orchestrator: {e}");
        return std::process::ExitCode::from(2);
    }
    let result = async {
        let backends = build_backends(&cfg.llm)?;
        let store = open_store(&cfg).await?;
        let listener = omicos_servicekit::host::bind(&cfg.listen)
            .await
            .map_err(|e| e.to_string())?;
        println!(
            "listening on http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let shutdown = Shutdown::new(Duration::from_secs(cfg.grace_secs));
        shutdown.on_signals();
        let (agents, warnings) = CatalogAgents::load(&cfg)?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        let parts = Parts {
            agents: Arc::new(agents),
            store,
            backends,
            config: cfg,
        };
        serve(parts, listener, shutdown)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omicos-orchestrator: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
