//! `omicos-web`: the web provider as its own gRPC service, registered with the registry.

use clap::Parser;
use omicos_servicekit::Shutdown;
use omicos_toolkit::{ProviderHosting, serve_provider};
use omicos_web::{Config, WebProvider};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// The web provider service (web_search, web_fetch).
#[derive(Parser)]
#[command(name = "omicos-web", version)]
struct Args {
    /// YAML config file; environment variables OMICOS_* override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg: Config = omicos_servicekit::load_config(
        args.config.as_deref(),
        &omicos_servicekit::config::process_env(),
    )?;
    let _telemetry = omicos_servicekit::telemetry::init("omicos-web", "info");
    let provider =
        WebProvider::from_config(&cfg.web).map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new(Duration::from_secs(cfg.grace_seconds));
    shutdown.on_signals();
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace: std::env::current_dir()?,
        ttl_seconds: cfg.registry_ttl_seconds,
    };
    serve_provider(Arc::new(provider), listener, hosting, shutdown).await?;
    Ok(())
}
