//! The tool-runner: every tool call goes through one governed pipeline
//! (resolve → parse/repair → validate → permission → hooks → dispatch → shape
//! → normalize), served as `omicos.v1.ToolRunner`, with the provider
//! `omicos.v1.Registry` hosted in the same process and the in-process
//! `file_manager` and `shell` providers.

pub mod allocator;
pub mod audit;
pub mod calls;
pub mod catalog;
pub mod config;
pub mod error;
pub mod mcp;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
pub mod providers;
pub mod record;
pub mod registry;
pub mod restore;
pub mod service;
pub mod shared_registry;
pub mod upload;

pub use config::Config;
pub use error::RunnerError;
pub use omicos_rules::RuleLists;
pub use pipeline::{CallIo, CallOutcome, CallRequest, Pipeline};
pub use record::ToolCallInfo;
pub use registry::Registry;

use omicos_servicekit::{Host, HostOptions, Shutdown};
use omicos_toolkit::Provider;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The built-in providers for `config`: file_manager and shell.
pub fn builtin_providers(config: &Config) -> Vec<Arc<dyn Provider>> {
    vec![
        Arc::new(providers::FileManager),
        Arc::new(
            providers::Shell::new(config.shell_timeout, config.shell_output_cap_bytes)
                .with_sandbox(config.sandbox.clone()),
        ),
    ]
}

/// Builds the registry and the pipeline over the built-in providers plus
/// `extra_providers` (pdf, skill, think/task/plan, ... from other crates).
/// Background tasks (TTL sweeper, static provider discovery) stop with `stop`.
pub fn build(
    config: &Config,
    extra_providers: Vec<Arc<dyn Provider>>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Pipeline, RunnerError> {
    build_on(
        config,
        Arc::new(
            Registry::new(config.registry_ttl).with_policy(ownership::RegistryPolicy::of(config)),
        ),
        extra_providers,
        stop,
    )
}

/// The registry for `config`: in memory, or the cached view of the shared
/// store (`registry_store_url`), read once before this returns and then
/// followed through notifications until `stop`.
pub async fn open_registry(
    config: &Config,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Arc<Registry>, shared_registry::StoreError> {
    let registry = Arc::new(
        Registry::new(config.registry_ttl).with_policy(ownership::RegistryPolicy::of(config)),
    );
    let url = config.registry_store_url.trim();
    if !url.is_empty() {
        let store = shared_registry::SharedStore::connect(url).await?;
        store.load_into(&registry).await?;
        let _ = registry.attach_store(store.clone());
        store.spawn_follower(Arc::downgrade(&registry), config.registry_resync, stop);
        tracing::info!("registry: shared through PostgreSQL");
    }
    Ok(registry)
}

/// [`build`] over a given registry (see [`open_registry`]).
pub fn build_on(
    config: &Config,
    registry: Arc<Registry>,
    extra_providers: Vec<Arc<dyn Provider>>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Pipeline, RunnerError> {
    registry.spawn_sweeper(stop.clone());
    registry.spawn_static(config.providers.clone(), stop);
    let mut providers = builtin_providers(config);
    providers.extend(extra_providers);
    // In-process tools win in the catalog anyway; reserving their names also
    // refuses a registration that tries to take one over.
    registry.reserve_builtin(providers.iter().flat_map(|p| {
        p.tools().into_iter().flat_map(|t| {
            std::iter::once(t.name)
                .chain(t.aliases)
                .chain(t.deprecated_names)
        })
    }));
    Pipeline::new(config, registry, providers)
}

/// Serves ToolRunner + Registry + health + reflection on `listener` until
/// `shutdown` drains. The Registry endpoint is the runner's own address.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: Shutdown,
    extra_providers: Vec<Arc<dyn Provider>>,
) -> std::io::Result<()> {
    let stop = shutdown.streams_token();
    let name = service::runner_name(listener.local_addr()?);
    let tls = config
        .tls
        .load("tls")
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // Before the registry opens: the shared store may already list providers
    // (a replaced runner), and their clients take the credentials they are
    // built with — set later, those calls went out with none.
    omicos_toolkit::remote::set_service_credentials(
        omicos_auth::Credentials::service_over(
            &config.service_secret,
            omicos_auth::ServiceRole::Runner,
            tls.client_cert(),
        )
        .map_err(std::io::Error::other)?,
    );
    omicos_toolkit::remote::set_client_tls(tls.client.clone());
    let registry = open_registry(&config, stop.clone())
        .await
        .map_err(std::io::Error::other)?;
    let _registry_gauge = metrics::registry_gauge(&registry);
    let pipeline = mcp::build_with_mcp_on(&config, registry, extra_providers, stop.clone())
        .await
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    if !config.mcp.serve.listen.is_empty() {
        // omicos's tools for MCP clients, over streamable HTTP, through this pipeline.
        let l = TcpListener::bind(&config.mcp.serve.listen).await?;
        tracing::info!(addr = %l.local_addr()?, "MCP endpoint listening on /mcp");
        let backend = Arc::new(mcp::PipelineBackend(pipeline.clone()));
        let (serve, stop) = (config.mcp.serve.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = omicos_mcp::serve::serve_http(backend, &serve, l, stop).await {
                tracing::error!(error = %e, "MCP endpoint stopped");
            }
        });
    }
    // The Registry on its own port when configured (providers reach only
    // that one), else beside ToolRunner.
    let registry_listener = match config.registry_listen.trim() {
        "" => None,
        addr => Some(omicos_servicekit::host::bind(addr).await?),
    };
    let host = Host::new(HostOptions {
        name: "tool-runner",
        services: if registry_listener.is_some() {
            vec!["omicos.v1.ToolRunner"]
        } else {
            vec!["omicos.v1.ToolRunner", "omicos.v1.Registry"]
        },
    })
    .await
    .tls(tls.server.clone());
    let registry = registry::RegistryService::new(pipeline.registry().clone());
    // The shell's sandbox (the pipeline holds it, so this is the same one):
    // uploads are measured as its watchdog measures boxed code's writes.
    let disk_measure = omicos_sandbox::Sandbox::shared(config.sandbox.clone())
        .map(|s| s.disk_measure())
        .unwrap_or(omicos_sandbox::DiskMeasure::Everything);
    // Only the parts of the system get in: the orchestrator runs tools,
    // providers register; the runner's calls to providers carry the secret too.
    use omicos_auth::ServiceRole::{Operator, Orchestrator, Provider as ProviderRole};
    // Under mutual TLS the handshake already refused anyone without a
    // certificate from `tls.client_ca`, and the role is the one the
    // certificate names (`spiffe://omicos/<role>`).
    let gate: Arc<dyn omicos_auth::Gate> =
        Arc::new(omicos_auth::guard::ServiceGate::with_mutual_tls(
            omicos_auth::ServiceAuth::new(&config.service_secret)
                .allow_roleless_client_certs(tls.allows_roleless_client_certs()),
            vec![
                ("/omicos.v1.ToolRunner/", &[Orchestrator, Operator]),
                ("/omicos.v1.Registry/Register", &[ProviderRole]),
                ("/omicos.v1.Registry/Heartbeat", &[ProviderRole]),
                ("/omicos.v1.Registry/Deregister", &[ProviderRole]),
            ],
            tls.mutual(),
        ));
    let router = host.router().add_service(omicos_auth::Guard::new(
        service::ToolRunnerService::new(pipeline, stop, config.reattach_grace)
            .named(&name)
            .with_disk_bound(&config.sandbox.session_limits, disk_measure)
            .into_server(),
        gate.clone(),
    ));
    let registry = omicos_auth::Guard::new(registry.into_server(), gate);
    let Some(registry_listener) = registry_listener else {
        // In-process providers are ready now; remote ones come and go through the registry.
        host.set_serving().await;
        return host
            .serve(router.add_service(registry), listener, shutdown)
            .await;
    };
    tracing::info!(
        addr = %registry_listener.local_addr()?,
        "the registry listens apart from ToolRunner (registry_listen)"
    );
    let registry_host = Host::new(HostOptions {
        name: "tool-runner-registry",
        services: vec!["omicos.v1.Registry"],
    })
    .await
    .tls(tls.server.clone());
    let registry_router = registry_host.router().add_service(registry);
    host.set_serving().await;
    registry_host.set_serving().await;
    tokio::try_join!(
        host.serve(router, listener, shutdown.clone()),
        registry_host.serve(registry_router, registry_listener, shutdown),
    )
    .map(|_| ())
}
