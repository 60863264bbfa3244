//! Running a provider as its own gRPC service: health, reflection,
//! `omicos.v1.ToolProvider`, and self-registration with the registry.

use crate::{provider::Provider, registration::keep_registered_over, server::ProviderService};
use omicos_auth::guard::ServiceGate;
use omicos_auth::{Credentials, Guard, ServiceAuth, ServiceRole};
use omicos_proto::ProviderInstance;
use omicos_servicekit::tls::Tls;
use omicos_servicekit::{Host, HostOptions, Shutdown};
use std::{path::PathBuf, sync::Arc};
use tokio::net::TcpListener;

/// Where and how a provider service runs.
#[derive(Clone, Debug)]
pub struct ProviderHosting {
    /// The registry to announce to (`http://127.0.0.1:7002`); None: do not register.
    pub registry: Option<String>,
    /// The endpoint to announce; None: `http://<listener address>`.
    pub advertise: Option<String>,
    /// Workspace root (used when a call carries none).
    pub workspace: PathBuf,
    /// Registry TTL in seconds (0: the registry's default).
    pub ttl_seconds: u32,
}

/// Serves `provider` on `listener` until `shutdown` drains, requiring the
/// service secret of `OMICOS_SERVICE_SECRET` (none when unset).
pub async fn serve_provider<P: Provider>(
    provider: Arc<P>,
    listener: TcpListener,
    hosting: ProviderHosting,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let secret = std::env::var("OMICOS_SERVICE_SECRET").unwrap_or_default();
    serve_provider_with(provider, listener, hosting, &secret, shutdown).await
}

/// [`serve_provider`] with the provider's TLS (its `tls` config, read at
/// start with [`omicos_servicekit::TlsConfig::load`]).
pub async fn serve_provider_tls<P: Provider>(
    provider: Arc<P>,
    listener: TcpListener,
    hosting: ProviderHosting,
    tls: Tls,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let secret = std::env::var("OMICOS_SERVICE_SECRET").unwrap_or_default();
    serve_provider_over(provider, listener, hosting, &secret, tls, shutdown).await
}

/// Serves `provider` on `listener` until `shutdown` drains. With a non-empty
/// `service_secret`, every call must carry it, `CallTool` only from a runner
/// (nothing reaches a provider around the runner's pipeline), and the
/// registration carries it with the provider's role.
pub async fn serve_provider_with<P: Provider>(
    provider: Arc<P>,
    listener: TcpListener,
    hosting: ProviderHosting,
    service_secret: &str,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    serve_provider_over(
        provider,
        listener,
        hosting,
        service_secret,
        Tls::default(),
        shutdown,
    )
    .await
}

/// [`serve_provider_with`] over `tls`: the provider's port serves TLS with
/// its server certificate; with a `client_ca` (mutual TLS) only peers
/// presenting a certificate from that CA get in, `CallTool` still only
/// from a runner (a certificate naming `spiffe://omicos/runner`); the registration goes to an `https://` registry with its
/// client side. The advertised endpoint is `https://` when TLS is on.
pub async fn serve_provider_over<P: Provider>(
    provider: Arc<P>,
    listener: TcpListener,
    hosting: ProviderHosting,
    service_secret: &str,
    tls: Tls,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let host = Host::new(HostOptions {
        name: "provider",
        services: vec!["omicos.v1.ToolProvider"],
    })
    .await
    .tls(tls.server.clone());
    let service = ProviderService::new(
        provider.clone(),
        hosting.workspace.clone(),
        shutdown.streams_token(),
    );
    let tools = service_tools(provider.as_ref());
    let gate: Arc<dyn omicos_auth::Gate> = Arc::new(ServiceGate::with_mutual_tls(
        ServiceAuth::new(service_secret)
            .allow_roleless_client_certs(tls.allows_roleless_client_certs()),
        vec![("/omicos.v1.ToolProvider/CallTool", &[ServiceRole::Runner])],
        tls.mutual(),
    ));
    let router = host
        .router()
        .add_service(Guard::new(service.into_server(), gate));
    let creds = Credentials::service_over(service_secret, ServiceRole::Provider, tls.client_cert())
        .map_err(std::io::Error::other)?;
    host.set_serving().await;
    if let Some(registry) = hosting.registry.clone() {
        let endpoint = hosting.advertise.clone().unwrap_or_else(|| {
            let scheme = if tls.server.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{addr}")
        });
        let instance = ProviderInstance {
            instance_id: format!("{}-{}", provider.name(), uuid::Uuid::new_v4().simple()),
            provider: provider.name().into(),
            endpoint,
            tools,
            session_affinity: provider.session_affinity(),
            static_entry: false,
            last_seen_ms: 0,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let stop2 = stop.clone();
        let sd = shutdown.clone();
        tokio::spawn(async move {
            sd.draining().await;
            stop2.cancel();
        });
        tokio::spawn(keep_registered_over(
            registry,
            instance,
            hosting.ttl_seconds,
            creds,
            tls.client.clone(),
            stop,
        ));
    }
    host.serve(router, listener, shutdown).await
}

fn service_tools<P: Provider>(p: &P) -> Vec<omicos_proto::ToolSpec> {
    p.tools()
        .into_iter()
        .map(|mut t| {
            if t.provider.is_empty() {
                t.provider = p.name().into();
            }
            t
        })
        .collect()
}
