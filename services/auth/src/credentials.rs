//! The client side: metadata every call on a channel carries.

use crate::Principal;
use crate::service::{
    MAX_MODE_HEADER, ROLE_HEADER, SECRET_HEADER, SUBJECT_HEADER, ServiceRole, TENANT_HEADER,
    TIER_HEADER,
};
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A channel whose calls carry [`Credentials`].
pub type AuthedChannel = InterceptedService<Channel, Credentials>;

/// Metadata added to every call: a bearer token, a service secret and role.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    headers: Vec<(MetadataKey<tonic::metadata::Ascii>, AsciiMetadataValue)>,
}

/// A credential that cannot travel in metadata (not visible ASCII).
#[derive(Debug, thiserror::Error)]
#[error("the credential cannot be sent in gRPC metadata: {0}")]
pub struct BadCredential(String);

fn value(v: &str) -> Result<AsciiMetadataValue, BadCredential> {
    let mut m: AsciiMetadataValue = v
        .parse()
        .map_err(|_| BadCredential("not visible ASCII".into()))?;
    m.set_sensitive(true);
    Ok(m)
}

impl Credentials {
    /// Nothing added.
    pub fn none() -> Self {
        Self::default()
    }

    /// `authorization: Bearer <token>`; an empty token adds nothing.
    pub fn bearer(token: &str) -> Result<Self, BadCredential> {
        let mut c = Self::default();
        if !token.is_empty() {
            c.headers.push((
                MetadataKey::from_static("authorization"),
                value(&format!("Bearer {}", token.trim()))?,
            ));
        }
        Ok(c)
    }

    /// The service secret and the caller's role; an empty secret adds nothing.
    pub fn service(secret: &str, role: ServiceRole) -> Result<Self, BadCredential> {
        Self::service_over(secret, role, false)
    }

    /// [`Credentials::service`] for a part whose calls may go over mutual
    /// TLS (`client_cert`: it presents a client certificate): the role then
    /// travels even without a secret, since the certificate is the proof.
    pub fn service_over(
        secret: &str,
        role: ServiceRole,
        client_cert: bool,
    ) -> Result<Self, BadCredential> {
        let mut c = Self::default();
        if !secret.is_empty() {
            c.headers
                .push((MetadataKey::from_static(SECRET_HEADER), value(secret)?));
        }
        if !secret.is_empty() || client_cert {
            c.headers.push((
                MetadataKey::from_static(ROLE_HEADER),
                AsciiMetadataValue::from_static(role.as_str()),
            ));
        }
        Ok(c)
    }

    /// Adds these headers to `md` (for a call whose metadata is built by hand).
    pub fn apply(&self, md: &mut tonic::metadata::MetadataMap) {
        for (k, v) in &self.headers {
            md.insert(k.clone(), v.clone());
        }
    }

    /// Wraps `ch`.
    pub fn channel(self, ch: Channel) -> AuthedChannel {
        InterceptedService::new(ch, self)
    }
}

/// Adds the principal an orchestrator forwards to a runner (believed only
/// with the service secret and the orchestrator role).
pub fn forward_principal(md: &mut tonic::metadata::MetadataMap, p: &Principal) {
    let mut put = |k: &'static str, v: &str| {
        if let Ok(v) = v.parse::<AsciiMetadataValue>() {
            md.insert(k, v);
        }
    };
    put(SUBJECT_HEADER, &p.subject);
    put(TENANT_HEADER, &p.tenant);
    put(TIER_HEADER, &p.tier);
    put(MAX_MODE_HEADER, p.max_mode.as_str());
}

impl Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.apply(req.metadata_mut());
        Ok(req)
    }
}
