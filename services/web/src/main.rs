//! `omicos-web`: the web provider as its own gRPC service, registered with the registry.

use omicos_servicekit::config::whole_secs_u32;
use omicos_servicekit::{Binary, Started, run_main};
use omicos_toolkit::{ProviderHosting, serve_provider_tls};
use omicos_web::{Config, WebProvider, ssrf::SystemLookup};
use std::process::ExitCode;
use std::sync::Arc;

const BINARY: Binary = Binary {
    name: "omicos-web",
    about: "The web provider service (web_search, web_fetch)",
};

fn main() -> ExitCode {
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let cfg = started.config;
    // Read before anything starts: a bad file is a config error naming its key.
    let tls = cfg.tls.load("tls")?;
    let provider = WebProvider::with_parts(&cfg.web, &started.env, Arc::new(SystemLookup))?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace: std::env::current_dir()?,
        ttl_seconds: whole_secs_u32(cfg.registry_ttl),
    };
    serve_provider_tls(Arc::new(provider), listener, hosting, tls, started.shutdown).await?;
    Ok(())
}
