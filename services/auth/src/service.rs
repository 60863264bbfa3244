//! Trust between services: a shared secret in metadata, with the caller's role.
//!
//! Every part of one deployment holds the same secret (`service_secret`,
//! `OMICOS_SERVICE_SECRET`): it proves that a call comes from inside. The role
//! header says which part is calling; it is believed only with the secret, and
//! only as far as a shared secret goes (one trust domain: mTLS gives each part
//! its own identity). The orchestrator forwards the principal it
//! authenticated; a runner believes the forwarded principal only from a
//! caller that holds the secret and says it is the orchestrator.

use crate::principal::Via;
use crate::{AuthError, Principal};
use http::HeaderMap;
use sha2::Digest;
use subtle::ConstantTimeEq;

/// The service secret's header.
pub const SECRET_HEADER: &str = "x-omicos-service-secret";
/// A provider instance's own key, sent with Register, Heartbeat and
/// Deregister: the registry binds an instance id to the key (and endpoint)
/// that first registered it, so another holder of the service secret cannot
/// take the id over, keep it alive or remove it.
pub const INSTANCE_KEY_HEADER: &str = "x-omicos-instance-key";
/// The calling part's role.
pub const ROLE_HEADER: &str = "x-omicos-service-role";
/// The forwarded principal's subject.
pub const SUBJECT_HEADER: &str = "x-omicos-principal-subject";
/// The forwarded principal's tenant.
pub const TENANT_HEADER: &str = "x-omicos-principal-tenant";
/// The forwarded principal's tier.
pub const TIER_HEADER: &str = "x-omicos-principal-tier";
/// The forwarded principal's ceiling.
pub const MAX_MODE_HEADER: &str = "x-omicos-principal-max-mode";

/// Which part of the system is calling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceRole {
    /// The orchestrator (calls runners).
    Orchestrator,
    /// A tool-runner (calls providers).
    Runner,
    /// A provider (registers with a runner's registry).
    Provider,
    /// An operator's tool or the stack itself (lists the registry).
    Operator,
}

impl ServiceRole {
    /// The header spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Orchestrator => "orchestrator",
            Self::Runner => "runner",
            Self::Provider => "provider",
            Self::Operator => "operator",
        }
    }

    /// The role a header names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "orchestrator" => Self::Orchestrator,
            "runner" => Self::Runner,
            "provider" => Self::Provider,
            "operator" => Self::Operator,
            _ => return None,
        })
    }
}

/// What a service call proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCaller {
    /// The caller held the secret or a verified client certificate (always
    /// false when neither a secret nor mutual TLS is configured).
    pub authenticated: bool,
    /// The role it said, believed only when authenticated.
    pub role: Option<ServiceRole>,
    /// The principal an authenticated orchestrator forwarded.
    pub principal: Option<Principal>,
}

impl ServiceCaller {
    /// Whether this caller is an authenticated `role`.
    pub fn is(&self, role: ServiceRole) -> bool {
        self.authenticated && self.role == Some(role)
    }

    /// Whether the request's identity, mode and grants come from an
    /// authenticated orchestrator (or no secret is configured at all, where
    /// nothing is checked: `open`).
    pub fn trusted_orchestrator(&self, open: bool) -> bool {
        open || self.is(ServiceRole::Orchestrator)
    }
}

/// The caller a request carries, set by the service guard; None when the
/// service was built without one.
pub fn caller_of<T>(req: &tonic::Request<T>) -> Option<ServiceCaller> {
    req.extensions().get::<ServiceCaller>().cloned()
}

/// Checks the service secret.
#[derive(Clone)]
pub struct ServiceAuth {
    digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for ServiceAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAuth")
            .field("required", &self.required())
            .finish()
    }
}

impl ServiceAuth {
    /// Requires `secret`; an empty secret checks nothing (a warning says so once at start).
    pub fn new(secret: &str) -> Self {
        Self {
            digest: (!secret.is_empty()).then(|| sha2::Sha256::digest(secret.as_bytes()).into()),
        }
    }

    /// Whether a secret is required.
    pub fn required(&self) -> bool {
        self.digest.is_some()
    }

    /// What the headers prove. Without a configured secret nothing is proved
    /// and nothing refused; with one, a missing or wrong secret is UNAUTHENTICATED.
    pub fn check(&self, headers: &HeaderMap) -> Result<ServiceCaller, AuthError> {
        self.check_peer(headers, false)
    }

    /// [`ServiceAuth::check`], for a connection whose peer may have proved
    /// itself at the TLS handshake: `verified_client_cert` is true when it
    /// presented a client certificate from the server's `client_ca` (mutual
    /// TLS). Such a peer is a part of the system without the secret; its role
    /// header is then believed as it is with the secret (one CA, one trust
    /// domain).
    pub fn check_peer(
        &self,
        headers: &HeaderMap,
        verified_client_cert: bool,
    ) -> Result<ServiceCaller, AuthError> {
        if verified_client_cert {
            return Ok(proven(headers));
        }
        let Some(want) = &self.digest else {
            return Ok(ServiceCaller {
                authenticated: false,
                role: None,
                principal: None,
            });
        };
        let got = headers
            .get(SECRET_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or(AuthError::Missing)?;
        let got: [u8; 32] = sha2::Sha256::digest(got.as_bytes()).into();
        if !bool::from(got.ct_eq(want)) {
            return Err(AuthError::Invalid("wrong service secret".into()));
        }
        Ok(proven(headers))
    }
}

/// The caller of a request that proved it is a part of the system (the
/// secret, or a client certificate): its role and forwarded principal.
fn proven(headers: &HeaderMap) -> ServiceCaller {
    let text = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let role = text(ROLE_HEADER).as_deref().and_then(ServiceRole::parse);
    let principal = match (role, text(TENANT_HEADER), text(SUBJECT_HEADER)) {
        (Some(ServiceRole::Orchestrator), Some(tenant), Some(subject)) => Some(Principal {
            subject,
            tenant,
            tier: text(TIER_HEADER).unwrap_or_default(),
            max_mode: text(MAX_MODE_HEADER)
                .and_then(|m| omicos_proto::PermissionMode::parse(&m).ok())
                // A ceiling that does not parse is the lowest one.
                .unwrap_or(omicos_proto::PermissionMode::ReadOnly),
            via: Via::Forwarded,
        }),
        _ => None,
    };
    ServiceCaller {
        authenticated: true,
        role,
        principal,
    }
}
