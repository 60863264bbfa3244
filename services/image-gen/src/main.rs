//! `omicos-image-gen`: the image_gen provider as its own gRPC service,
//! registered with the registry.

use omicos_image_gen::{Config, ImageGenProvider};
use omicos_servicekit::config::whole_secs_u32;
use omicos_servicekit::{Binary, Started, run_main};
use omicos_toolkit::{ProviderHosting, serve_provider_tls};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const BINARY: Binary = Binary {
    name: "omicos-image-gen",
    about: "The image generation provider service (image_gen__generate)",
};

fn main() -> ExitCode {
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let cfg = started.config;
    // Read before anything starts: a bad file is a config error naming its key.
    let tls = cfg.tls.load("tls")?;
    let image_cfg = cfg.image_gen.clone().with_env_fallbacks(&started.env);
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
    let workspace = if cfg.workspace.is_empty() {
        std::env::current_dir()?
    } else {
        PathBuf::from(&cfg.workspace)
    };
    let hosting = ProviderHosting {
        registry: Some(cfg.registry.clone()).filter(|r| !r.is_empty()),
        advertise: Some(cfg.advertise.clone()).filter(|a| !a.is_empty()),
        workspace,
        ttl_seconds: whole_secs_u32(cfg.registry_ttl),
    };
    serve_provider_tls(Arc::new(provider), listener, hosting, tls, started.shutdown).await?;
    Ok(())
}
