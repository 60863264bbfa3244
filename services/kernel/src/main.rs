//! `omicos-kernel`: the kernel provider as its own gRPC service.

use anyhow::Context;
use omicos_kernel::{Config, KernelProvider};
use omicos_servicekit::config::whole_secs_u32;
use omicos_servicekit::{Binary, Started, run_main};
use omicos_toolkit::{ProviderHosting, serve_provider_tls};
use std::path::PathBuf;
use std::process::ExitCode;

const BINARY: Binary = Binary {
    name: "omicos-kernel",
    about: "Serves per-session Jupyter kernels over omicos.v1.ToolProvider",
};

fn main() -> ExitCode {
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let cfg = started.config;
    // Read before anything starts: a bad file is a config error naming its key.
    let tls = cfg.tls.load("tls")?;
    let workspace = PathBuf::from(&cfg.workspace);
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("workspace {}", workspace.display()))?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    let provider = KernelProvider::new(cfg.kernel.clone(), workspace.clone(), started.env)?;
    let _gauge = omicos_kernel::metrics::kernels_gauge(provider.kernels());
    println!("listening on http://{}", listener.local_addr()?);
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace,
        ttl_seconds: whole_secs_u32(cfg.registry_ttl),
    };
    let served =
        serve_provider_tls(provider.clone(), listener, hosting, tls, started.shutdown).await;
    // Kernels are separate process groups: stop them before exiting.
    provider.close().await;
    served?;
    Ok(())
}
