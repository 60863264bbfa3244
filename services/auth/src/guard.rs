//! [`Guard`]: a tower service around one tonic service that admits a request
//! (or answers the gRPC error itself) before the service sees it, and puts
//! what it admitted in the request's extensions ([`crate::principal::of`],
//! [`crate::service::caller_of`]).

use crate::service::{ServiceAuth, ServiceCaller, ServiceRole};
use crate::{AuthError, ClientAuth, Principal};
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::NamedService;

/// What a gate admitted.
#[derive(Clone, Debug)]
pub enum Admitted {
    /// Nothing to record (an open path).
    Open,
    /// A client principal.
    Principal(Principal),
    /// A service caller.
    Service(ServiceCaller),
}

/// Decides whether a request comes in.
#[async_trait::async_trait]
pub trait Gate: Send + Sync + 'static {
    /// `path` is the gRPC method path (`/omicos.v1.Orchestrator/Chat`).
    async fn admit(&self, path: &str, headers: &http::HeaderMap) -> Result<Admitted, AuthError>;

    /// [`Gate::admit`] knowing the connection's peer (its verified client
    /// certificate under mutual TLS); by default the peer does not matter.
    async fn admit_peer(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        _peer: Option<&omicos_servicekit::PeerInfo>,
    ) -> Result<Admitted, AuthError> {
        self.admit(path, headers).await
    }
}

#[async_trait::async_trait]
impl Gate for ClientAuth {
    async fn admit(&self, path: &str, headers: &http::HeaderMap) -> Result<Admitted, AuthError> {
        let auth = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match self.authenticate(auth).await {
            Ok(p) => Ok(Admitted::Principal(p)),
            Err(e) => {
                tracing::warn!(target: "omicos::audit", event = "authentication_failed", path, principal = "-", code = ?e.status().code(), error = %e, "authentication failed");
                Err(e)
            }
        }
    }
}

/// The service secret (or, under mutual TLS, the peer's verified client
/// certificate and the role it names), with the roles each method path
/// allows (first matching prefix wins; no match: any authenticated part).
pub struct ServiceGate {
    auth: ServiceAuth,
    rules: Vec<(&'static str, &'static [ServiceRole])>,
}

impl ServiceGate {
    /// A gate over `auth`; `rules` pair a method-path prefix with the roles it allows.
    pub fn new(auth: ServiceAuth, rules: Vec<(&'static str, &'static [ServiceRole])>) -> Self {
        Self::with_mutual_tls(auth, rules, false)
    }

    /// [`ServiceGate::new`] on a server whose TLS asks every client for a
    /// certificate from its `client_ca` (`mutual_tls`): the handshake has
    /// already refused anyone else, so no secret is needed; the role is the
    /// one the certificate names ([`ServiceAuth::check_peer`]).
    pub fn with_mutual_tls(
        auth: ServiceAuth,
        rules: Vec<(&'static str, &'static [ServiceRole])>,
        mutual_tls: bool,
    ) -> Self {
        if !auth.required() && !mutual_tls {
            tracing::warn!(
                "neither a service secret (service_secret / OMICOS_SERVICE_SECRET) nor mutual TLS (tls.client_ca) is configured: this service trusts any caller"
            );
        }
        Self { auth, rules }
    }
}

#[async_trait::async_trait]
impl Gate for ServiceGate {
    async fn admit(&self, path: &str, headers: &http::HeaderMap) -> Result<Admitted, AuthError> {
        self.admit_peer(path, headers, None).await
    }

    async fn admit_peer(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        peer: Option<&omicos_servicekit::PeerInfo>,
    ) -> Result<Admitted, AuthError> {
        let caller = self.auth.check_peer(headers, peer).inspect_err(|e| {
            let cert_uris = peer.map(|p| p.client_uris.join(" ")).unwrap_or_default();
            tracing::warn!(target: "omicos::audit", event = "service_authentication_failed", path, principal = "-", cert_uris, error = %e, "service authentication failed");
        })?;
        if caller.authenticated
            && let Some((_, roles)) = self.rules.iter().find(|(p, _)| path.starts_with(p))
            && !caller.role.is_some_and(|r| roles.contains(&r))
        {
            let e = AuthError::Denied(format!(
                "{path} takes calls only from {}",
                roles
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            tracing::warn!(target: "omicos::audit", event = "service_call_denied", path, role = ?caller.role, "service call refused: wrong role");
            return Err(e);
        }
        Ok(Admitted::Service(caller))
    }
}

/// A tonic service behind a gate. Keeps the inner service's name, so it is
/// added to a server like the service itself.
pub struct Guard<S> {
    inner: S,
    gate: Arc<dyn Gate>,
}

impl<S: Clone> Clone for Guard<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<S> Guard<S> {
    /// `inner` behind `gate`.
    pub fn new(inner: S, gate: Arc<dyn Gate>) -> Self {
        Self { inner, gate }
    }
}

impl<S: NamedService> NamedService for Guard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for Guard<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // The ready service goes with this call; the clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            let peer = omicos_servicekit::PeerInfo::of(&req);
            match gate.admit_peer(req.uri().path(), req.headers(), peer).await {
                Ok(Admitted::Open) => {}
                Ok(Admitted::Principal(p)) => {
                    req.extensions_mut().insert(p);
                }
                Ok(Admitted::Service(c)) => {
                    if let Some(p) = &c.principal {
                        req.extensions_mut().insert(p.clone());
                    }
                    req.extensions_mut().insert(c);
                }
                Err(e) => return Ok(e.status().into_http()),
            }
            inner.call(req).await
        })
    }
}

/// A host's router with health and reflection, each behind `gate` unless open.
pub fn guarded_router(
    host: &omicos_servicekit::Host,
    gate: Arc<dyn Gate>,
    open_health: bool,
    open_reflection: bool,
) -> tonic::transport::server::Router {
    let v1 = omicos_servicekit::host::reflection()
        .build_v1()
        .expect("embedded descriptor set is valid");
    let v1alpha = omicos_servicekit::host::reflection()
        .build_v1alpha()
        .expect("embedded descriptor set is valid");
    let mut server = host.server_builder();
    let router = if open_health {
        server.add_service(host.health())
    } else {
        server.add_service(Guard::new(host.health(), gate.clone()))
    };
    if open_reflection {
        router.add_service(v1).add_service(v1alpha)
    } else {
        router
            .add_service(Guard::new(v1, gate.clone()))
            .add_service(Guard::new(v1alpha, gate))
    }
}

/// [`guarded_router`]'s health and reflection as [`tonic::service::Routes`],
/// for a server that composes them further (the orchestrator's one port,
/// with gRPC-web and the page).
pub fn guarded_routes(
    host: &omicos_servicekit::Host,
    gate: Arc<dyn Gate>,
    open_health: bool,
    open_reflection: bool,
) -> tonic::service::Routes {
    let v1 = omicos_servicekit::host::reflection()
        .build_v1()
        .expect("embedded descriptor set is valid");
    let v1alpha = omicos_servicekit::host::reflection()
        .build_v1alpha()
        .expect("embedded descriptor set is valid");
    let routes = if open_health {
        tonic::service::Routes::new(host.health())
    } else {
        tonic::service::Routes::new(Guard::new(host.health(), gate.clone()))
    };
    if open_reflection {
        routes.add_service(v1).add_service(v1alpha)
    } else {
        routes
            .add_service(Guard::new(v1, gate.clone()))
            .add_service(Guard::new(v1alpha, gate))
    }
}
