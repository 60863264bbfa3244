//! `omicos-image-gen`: the image_gen provider as its own gRPC service,
//! registered with the registry.

use clap::Parser;
use omicos_image_gen::{Config, ImageGenProvider};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{ProviderHosting, serve_provider};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// The image generation provider service (image_gen__generate).
#[derive(Parser)]
#[command(name = "omicos-image-gen", version)]
struct Args {
    /// YAML config file; environment variables OMICOS_* override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env = omicos_servicekit::config::process_env();
    let cfg: Config = omicos_servicekit::load_config(args.config.as_deref(), &env)?;
    let _telemetry = omicos_servicekit::telemetry::init("omicos-image-gen", "info");
    let image_cfg = cfg.image_gen.clone().with_env_fallbacks(&env);
    if image_cfg.endpoint().is_none() {
        // Still serve: the tool then answers with how to configure it, which
        // the model can relay, instead of the tool silently missing.
        tracing::warn!(
            "image generation is not configured (OMICOS_IMAGE_GEN_BASE_URL / OMICOS_IMAGE_GEN_API_KEY / OPENAI_API_KEY)"
        );
    }
    let provider = ImageGenProvider::new(image_cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let listener = omicos_servicekit::host::bind(&cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new(Duration::from_secs(cfg.grace_seconds));
    shutdown.on_signals();
    let workspace = if cfg.workspace.is_empty() {
        std::env::current_dir()?
    } else {
        PathBuf::from(&cfg.workspace)
    };
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace,
        ttl_seconds: cfg.registry_ttl_seconds,
    };
    serve_provider(Arc::new(provider), listener, hosting, shutdown).await?;
    Ok(())
}
