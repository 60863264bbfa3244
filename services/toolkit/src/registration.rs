//! Self-registration of a provider instance with the registry: register,
//! heartbeat, register again when forgotten, deregister on shutdown.

use omicos_auth::Credentials;
use omicos_proto::{
    DeregisterRequest, HeartbeatRequest, ProviderInstance, RegisterRequest,
    registry_client::RegistryClient,
};
use omicos_servicekit::ClientTls;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Keeps `instance` registered at `registry` until `shutdown` fires, then deregisters.
pub async fn keep_registered(
    registry: String,
    instance: ProviderInstance,
    ttl_seconds: u32,
    shutdown: CancellationToken,
) {
    keep_registered_with(
        registry,
        instance,
        ttl_seconds,
        Credentials::none(),
        shutdown,
    )
    .await
}

/// [`keep_registered`], each call carrying `creds` (the service secret, role provider).
pub async fn keep_registered_with(
    registry: String,
    instance: ProviderInstance,
    ttl_seconds: u32,
    creds: Credentials,
    shutdown: CancellationToken,
) {
    keep_registered_over(registry, instance, ttl_seconds, creds, None, shutdown).await
}

/// [`keep_registered_with`], an `https://` registry reached with `tls`
/// (its CA, and the provider's certificate for mutual TLS), each new
/// connection with the files of the moment.
pub async fn keep_registered_over(
    registry: String,
    instance: ProviderInstance,
    ttl_seconds: u32,
    creds: Credentials,
    tls: Option<ClientTls>,
    shutdown: CancellationToken,
) {
    // This process's proof that the instance id is its own (see
    // `omicos_auth::service::INSTANCE_KEY_HEADER`); never leaves the process otherwise.
    let key = uuid::Uuid::new_v4().simple().to_string();
    let mut registered = false;
    let mut interval = Duration::from_secs(1);
    loop {
        let client = tonic::transport::Endpoint::from_shared(registry.clone())
            .map(|e| e.connect_timeout(Duration::from_secs(2)));
        let Ok(endpoint) = client else {
            tracing::error!(%registry, "registry endpoint is not a URL; not registering");
            return;
        };
        let connected = match &tls {
            Some(tls) => {
                let connector = tls.connector().with_connect_timeout(Duration::from_secs(2));
                tonic::transport::Channel::connect(connector, endpoint).await
            }
            None => endpoint.connect().await,
        };
        if let Ok(ch) = connected {
            let mut c = RegistryClient::new(creds.clone().channel(ch));
            loop {
                let ok = if registered {
                    match c
                        .heartbeat(keyed(
                            &key,
                            HeartbeatRequest {
                                instance_id: instance.instance_id.clone(),
                            },
                        ))
                        .await
                    {
                        Ok(r) => {
                            registered = r.into_inner().known;
                            true
                        }
                        Err(_) => false,
                    }
                } else {
                    match c
                        .register(keyed(
                            &key,
                            RegisterRequest {
                                instance: Some(instance.clone()),
                                ttl_seconds,
                            },
                        ))
                        .await
                    {
                        Ok(r) => {
                            let r = r.into_inner();
                            registered = true;
                            interval = Duration::from_secs(r.heartbeat_seconds.max(1) as u64);
                            tracing::info!(%registry, provider = %instance.provider, "registered");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(%registry, error = %e.message(), "register failed");
                            false
                        }
                    }
                };
                if !ok {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = shutdown.cancelled() => {
                        let _ = c.deregister(keyed(&key, DeregisterRequest { instance_id: instance.instance_id.clone() })).await;
                        return;
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// `body` carrying this instance's key.
fn keyed<T>(key: &str, body: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(body);
    if let Ok(v) = key.parse() {
        r.metadata_mut()
            .insert(omicos_auth::service::INSTANCE_KEY_HEADER, v);
    }
    r
}
