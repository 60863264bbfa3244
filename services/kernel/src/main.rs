//! `omicos-kernel`: the kernel provider as its own gRPC service.

use clap::Parser;
use omicos_kernel::{Config, KernelProvider};
use omicos_servicekit::{Shutdown, load_config};
use omicos_toolkit::{ProviderHosting, serve_provider};
use std::{path::PathBuf, time::Duration};

/// Serves per-session Jupyter kernels over omicos.v1.ToolProvider.
#[derive(Parser, Debug)]
#[command(name = "omicos-kernel", version)]
struct Args {
    /// YAML config file (keys: see services/kernel/README.md).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env = omicos_servicekit::config::process_env();
    let cfg: Config = load_config(args.config.as_deref(), &env)?;
    cfg.kernel.validate().map_err(anyhow::Error::msg)?;
    let _telemetry = omicos_servicekit::telemetry::init("omicos-kernel", "info");
    let workspace = PathBuf::from(&cfg.workspace);
    let workspace = workspace
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("workspace {}: {e}", workspace.display()))?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    let provider = KernelProvider::new(cfg.kernel.clone(), workspace.clone(), env)
        .map_err(anyhow::Error::msg)?;
    println!("listening on http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new(Duration::from_secs(cfg.grace_seconds));
    shutdown.on_signals();
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace,
        ttl_seconds: cfg.ttl_seconds,
    };
    let served = serve_provider(provider.clone(), listener, hosting, shutdown).await;
    // Kernels are separate process groups: stop them before exiting.
    provider.close().await;
    served?;
    Ok(())
}
