//! Who is calling, in one place.
//!
//! - At the client edge (the orchestrator): a bearer token in `authorization`
//!   metadata, either an API key from config (kept as its sha256, compared in
//!   constant time) or an OIDC JWT verified against a JWKS (issuer, audience,
//!   expiry; the JWKS is fetched over HTTP, cached and refreshed; verified
//!   tokens are cached until they expire). The result is a [`Principal`]:
//!   subject, tenant, tier and the most permissive mode it may use.
//! - Between services: a shared service secret in metadata ([`ServiceAuth`]),
//!   with the caller's role in a header, or, under mutual TLS, a client
//!   certificate the handshake verified (`omicos_servicekit::tls`) that names
//!   the caller's role itself (`spiffe://omicos/<role>`,
//!   [`service::ROLE_URI_PREFIX`]); the orchestrator forwards the principal it
//!   authenticated, and only a caller proved to be the orchestrator is believed.
//! - [`Guard`] wraps one tonic service (a tower `Service` that keeps the
//!   service's name) and puts what it admitted into the request's extensions;
//!   [`Credentials`] is the client side, a tonic interceptor.
//! - [`token`]: the laptop token `omicos up` keeps in `<workspace>/.omicos/token`.
//!
//! Errors: UNAUTHENTICATED when the credential is missing or wrong,
//! PERMISSION_DENIED when the caller is known but not allowed.

pub mod client;
pub mod config;
pub mod credentials;
pub mod error;
pub mod guard;
pub mod jwks;
pub mod principal;
pub mod service;
pub mod token;

pub use client::ClientAuth;
pub use config::{ApiKeyConfig, ClientAuthConfig, JwtConfig};
pub use credentials::{AuthedChannel, Credentials};
pub use error::AuthError;
pub use guard::{Admitted, Gate, Guard, guarded_router, guarded_routes};
pub use principal::Principal;
pub use service::{ServiceAuth, ServiceCaller, ServiceRole};

/// The sha256 of `text`, in lowercase hex: how API keys are written in config.
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}
