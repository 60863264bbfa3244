//! The orchestrator binary.

use omicos_orchestrator::{
    Parts, agents::CatalogAgents, build_backends, config::Config, open_store, serve,
};
use omicos_servicekit::{Binary, Started, run_main};
use std::process::ExitCode;
use std::sync::Arc;

const BINARY: Binary = Binary {
    name: "omicos-orchestrator",
    about: "The omicos orchestrator service",
};

fn main() -> ExitCode {
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let cfg = started.config;
    let backends = build_backends(&cfg.llm).map_err(anyhow::Error::msg)?;
    let store = open_store(&cfg).await.map_err(anyhow::Error::msg)?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let (agents, warnings) = CatalogAgents::load(&cfg).map_err(anyhow::Error::msg)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    let parts = Parts {
        agents: Arc::new(agents),
        store,
        backends,
        config: cfg,
    };
    serve(parts, listener, started.shutdown).await?;
    Ok(())
}
