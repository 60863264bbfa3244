//! Hosting a gRPC service: health (NOT_SERVING until ready, NOT_SERVING again
//! when draining), reflection v1 and v1alpha, and a drain bounded by the grace period.

use crate::Shutdown;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Router;

/// Accepted connections (TCP_NODELAY set, TLS handshake done when
/// configured), as the tonic server takes them.
type Incoming =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = std::io::Result<ServedIo>> + Send>>;
use crate::tls::{ServedIo, ServerTls};
use tonic_health::server::HealthReporter;

/// Options for [`Host`].
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Name used in logs.
    pub name: &'static str,
    /// The gRPC service names to report in health (e.g. `omicos.v1.ToolRunner`).
    pub services: Vec<&'static str>,
}

/// The health and reflection services of one gRPC server, and its lifecycle.
pub struct Host {
    opts: HostOptions,
    reporter: HealthReporter,
    tls: Option<ServerTls>,
}

impl Host {
    /// A host whose health starts NOT_SERVING.
    pub async fn new(opts: HostOptions) -> Self {
        let reporter = HealthReporter::new();
        for s in &opts.services {
            reporter
                .set_service_status(*s, tonic_health::ServingStatus::NotServing)
                .await;
        }
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        Self {
            opts,
            reporter,
            tls: None,
        }
    }

    /// Serves over TLS with `tls` (None: plain TCP, as without this call).
    /// Each handshake uses the files as they are then, so rotated
    /// certificates apply to new connections without a restart.
    pub fn tls(mut self, tls: Option<ServerTls>) -> Self {
        self.tls = tls;
        self
    }

    /// The reporter, to flip health when dependencies come and go.
    pub fn reporter(&self) -> HealthReporter {
        self.reporter.clone()
    }

    /// A tonic server builder with health and reflection already added.
    pub fn router(&self) -> Router {
        self.server_builder().add_routes(self.routes())
    }

    /// Health and reflection as [`Routes`], for a server that composes them
    /// with more (the orchestrator adds gRPC-web and its page, then calls
    /// [`Host::serve_http`]).
    pub fn routes(&self) -> Routes {
        let v1 = reflection()
            .build_v1()
            .expect("embedded descriptor set is valid");
        let v1alpha = reflection()
            .build_v1alpha()
            .expect("embedded descriptor set is valid");
        Routes::new(self.health())
            .add_service(v1)
            .add_service(v1alpha)
    }

    /// The server builder every router starts from (keepalive, a span per
    /// RPC), for a router that puts health or reflection behind a guard.
    pub fn server_builder(&self) -> Server {
        let service = self.opts.name;
        Server::builder()
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(20)))
            // A span per RPC, parented on the caller's trace context.
            .trace_fn(move |req| {
                let span = tracing::info_span!("rpc", service, path = %req.uri().path());
                crate::telemetry::set_parent_from(
                    &span,
                    &tonic::metadata::MetadataMap::from_headers(req.headers().clone()),
                );
                span
            })
    }

    /// The health service, fed by this host's reporter.
    pub fn health(
        &self,
    ) -> tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService> {
        tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(self.reporter.clone()),
        )
    }

    /// Marks every service SERVING.
    pub async fn set_serving(&self) {
        set_all(
            &self.reporter,
            &self.opts.services,
            tonic_health::ServingStatus::Serving,
        )
        .await;
    }

    /// Serves `router` on `listener` until the drain ends. Health flips to
    /// NOT_SERVING when the drain starts; in-flight RPCs get the grace period.
    pub async fn serve(
        self,
        router: Router,
        listener: TcpListener,
        shutdown: Shutdown,
    ) -> std::io::Result<()> {
        self.run(listener, shutdown, |incoming, signal| async move {
            router.serve_with_incoming_shutdown(incoming, signal).await
        })
        .await
    }

    /// Serves `app` (gRPC routes from [`Host::routes`] and plain HTTP routes
    /// beside them) on `listener`, HTTP/1.1 and HTTP/2 on one port: what
    /// gRPC-web from a browser needs. Health, drain and grace as [`Host::serve`].
    pub async fn serve_http(
        self,
        app: axum::Router,
        listener: TcpListener,
        shutdown: Shutdown,
    ) -> std::io::Result<()> {
        let server = self.server_builder().accept_http1(true);
        self.run(listener, shutdown, |incoming, signal| async move {
            server
                .serve_with_incoming_shutdown(app, incoming, signal)
                .await
        })
        .await
    }

    async fn run<F, Fut>(
        self,
        listener: TcpListener,
        shutdown: Shutdown,
        serve: F,
    ) -> std::io::Result<()>
    where
        F: FnOnce(Incoming, futures::future::BoxFuture<'static, ()>) -> Fut,
        Fut: std::future::Future<Output = Result<(), tonic::transport::Error>>,
    {
        let addr: Option<SocketAddr> = listener.local_addr().ok();
        let reporter = self.reporter.clone();
        let services = self.opts.services.clone();
        let name = self.opts.name;
        let sd = shutdown.clone();
        let signal = async move {
            sd.draining().await;
            set_all(
                &reporter,
                &services,
                tonic_health::ServingStatus::NotServing,
            )
            .await;
            tracing::info!(service = name, "draining");
        };
        let tls = self.tls.clone();
        let incoming: Incoming = match &tls {
            // Without TCP_NODELAY every small gRPC message waits for Nagle + delayed ACK (~40 ms a hop).
            None => Box::pin(TcpListenerStream::new(listener).map(|conn| {
                conn.map(|s| {
                    let _ = s.set_nodelay(true);
                    ServedIo::Plain(s)
                })
            })),
            Some(tls) => tls_incoming(listener, tls.clone(), name),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(
            service = name,
            ?addr,
            scheme,
            mutual_tls = tls.as_ref().is_some_and(|t| t.mutual()),
            "serving"
        );
        let serve = serve(incoming, Box::pin(signal));
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => r.map_err(std::io::Error::other),
            _ = async { shutdown.draining().await; tokio::time::sleep(shutdown.grace() + std::time::Duration::from_millis(500)).await } => {
                tracing::warn!(service = name, "grace period over: dropping remaining connections");
                Ok(())
            }
        }
    }
}

/// Accepts on `listener` and runs each TLS handshake in its own task (a slow
/// or silent peer holds up no other); a refused handshake (a client
/// certificate from another CA, none where `client_ca` asks for one) is
/// logged and the connection dropped. Ends when the server drops the stream.
fn tls_incoming(listener: TcpListener, tls: ServerTls, name: &'static str) -> Incoming {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<ServedIo>>(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // EMFILE and the like: pause rather than spin.
                        tracing::warn!(service = name, error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                match tls.accept(tcp).await {
                    Ok(io) => {
                        let _ = tx.send(Ok(io)).await;
                    }
                    Err(e) => {
                        tracing::warn!(target: "omicos::audit", event = "tls_handshake_refused", service = name, %peer, error = %e, "TLS handshake failed");
                    }
                }
            });
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A reflection builder over the omicos and health descriptors: `.build_v1()`
/// and `.build_v1alpha()` give the two services [`Host::router`] adds.
pub fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(omicos_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

async fn set_all(
    reporter: &HealthReporter,
    services: &[&'static str],
    status: tonic_health::ServingStatus,
) {
    for s in services {
        reporter.set_service_status(*s, status).await;
    }
    reporter.set_service_status("", status).await;
}

/// Binds a TCP listener, with a message that names the address on failure.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
