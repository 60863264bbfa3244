//! The memory provider service: `omicos-memory [--config FILE]`.

use anyhow::Context;
use omicos_memory::{Config, MemoryProvider, MemoryStore};
use omicos_servicekit::config::whole_secs_u32;
use omicos_servicekit::{Binary, Started, run_main};
use omicos_toolkit::{ProviderHosting, serve_provider_tls};
use std::process::ExitCode;
use std::sync::Arc;

const BINARY: Binary = Binary {
    name: "omicos-memory",
    about: "Serves the memory tools over gRPC and registers with the registry",
};

fn main() -> ExitCode {
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let cfg = started.config;
    // Read before anything starts: a bad file is a config error naming its key.
    let tls = cfg.tls.load("tls")?;
    let url = cfg.store_url();
    let store = MemoryStore::open(&url)
        .await
        .with_context(|| format!("opening {}", redact(&url)))?;
    tracing::info!(backend = store.backend(), "memory store ready");
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace: cfg.workspace.clone(),
        ttl_seconds: whole_secs_u32(cfg.registry_ttl),
    };
    serve_provider_tls(
        Arc::new(MemoryProvider::new(store.clone())),
        listener,
        hosting,
        tls,
        started.shutdown,
    )
    .await?;
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
