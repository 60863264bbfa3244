//! The memory provider service: `omicos-memory [--config FILE]`.

use clap::Parser;
use omicos_memory::{Config, MemoryProvider, MemoryStore};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{ProviderHosting, serve_provider};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// Serves the memory tools over gRPC and registers with the registry.
#[derive(Parser)]
#[command(name = "omicos-memory", version)]
struct Args {
    /// A YAML config file; `OMICOS_*` environment variables override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let cfg: Config = match omicos_servicekit::load_config(
        args.config.as_deref(),
        &omicos_servicekit::config::process_env(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("omicos-memory: {e}");
            std::process::exit(2);
        }
    };
    let _telemetry = omicos_servicekit::telemetry::init("omicos-memory", &cfg.log);
    if let Err(e) = run(cfg).await {
        eprintln!("omicos-memory: {e}");
        std::process::exit(1);
    }
}

async fn run(cfg: Config) -> Result<(), String> {
    let url = cfg.store_url();
    let store = MemoryStore::open(&url)
        .await
        .map_err(|e| format!("opening {}: {e}", redact(&url)))?;
    tracing::info!(backend = store.backend(), "memory store ready");
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{addr}");
    let shutdown = Shutdown::new(Duration::from_secs(cfg.grace_seconds));
    shutdown.on_signals();
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace: cfg.workspace.clone(),
        ttl_seconds: 0,
    };
    serve_provider(
        Arc::new(MemoryProvider::new(store.clone())),
        listener,
        hosting,
        shutdown,
    )
    .await
    .map_err(|e| e.to_string())?;
    store.close().await;
    Ok(())
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
