//! Trust between services: who a calling part is, and in which role.
//!
//! Two proofs, one per deployment style:
//! - **Mutual TLS.** The handshake verified a client certificate from the
//!   server's `client_ca`; the certificate also names the part's role, as a
//!   URI SAN `spiffe://omicos/<role>` ([`ROLE_URI_PREFIX`]). That role is
//!   authoritative: a role header the certificate does not carry is refused
//!   (PERMISSION_DENIED), so a runner's certificate cannot call as the
//!   orchestrator, nor an orchestrator's as a runner. A certificate that
//!   names no role is refused too, unless the call also carries the service
//!   secret (then it is a secret call over TLS) or the server's
//!   `tls.allow_roleless_client_certs` says to believe its header (one CA,
//!   one trust domain).
//! - **A shared secret** in metadata (`service_secret`,
//!   `OMICOS_SERVICE_SECRET`), where TLS is not configured: every part holds
//!   the same one, so it proves that a call comes from inside, and the role
//!   header is believed only as far as a shared secret goes (one trust
//!   domain).
//!
//! The orchestrator forwards the principal it authenticated; a runner
//! believes the forwarded principal only from a caller proved to be the
//! orchestrator.

use crate::principal::Via;
use crate::{AuthError, Principal};
use http::HeaderMap;
use omicos_servicekit::PeerInfo;
use sha2::Digest;
use subtle::ConstantTimeEq;

/// The service secret's header.
pub const SECRET_HEADER: &str = "x-omicos-service-secret";
/// A provider instance's own key, sent with Register, Heartbeat and
/// Deregister: the registry binds an instance id to the key (and endpoint)
/// that first registered it, so another holder of the service secret cannot
/// take the id over, keep it alive or remove it.
pub const INSTANCE_KEY_HEADER: &str = "x-omicos-instance-key";
/// The calling part's role (under mutual TLS a claim its certificate must carry).
pub const ROLE_HEADER: &str = "x-omicos-service-role";
/// How a client certificate names its part's role: a URI SAN of this
/// prefix and the role (`spiffe://omicos/runner`), in SPIFFE ID form (trust
/// domain `omicos`). A certificate may name several roles.
pub const ROLE_URI_PREFIX: &str = "spiffe://omicos/";
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

    /// Every role, in the order messages list them.
    pub const ALL: [ServiceRole; 4] = [
        Self::Orchestrator,
        Self::Runner,
        Self::Provider,
        Self::Operator,
    ];

    /// The URI SAN a client certificate names this role with
    /// (`spiffe://omicos/runner`).
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.as_str())
    }

    /// The role a certificate's URI SAN names, if it is one of
    /// `spiffe://omicos/<role>` exactly.
    pub fn from_uri(uri: &str) -> Option<Self> {
        uri.strip_prefix(ROLE_URI_PREFIX).and_then(Self::parse)
    }
}

/// The roles a certificate's URI SANs name (other URIs are ignored).
pub fn roles_in(uris: &[String]) -> Vec<ServiceRole> {
    let mut roles = Vec::new();
    for r in uris.iter().filter_map(|u| ServiceRole::from_uri(u)) {
        if !roles.contains(&r) {
            roles.push(r);
        }
    }
    roles
}

fn role_list(roles: &[ServiceRole]) -> String {
    roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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

/// Checks the service secret, or a verified client certificate and its role.
#[derive(Clone)]
pub struct ServiceAuth {
    digest: Option<[u8; 32]>,
    allow_roleless_client_certs: bool,
}

impl std::fmt::Debug for ServiceAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAuth")
            .field("required", &self.required())
            .field(
                "allow_roleless_client_certs",
                &self.allow_roleless_client_certs,
            )
            .finish()
    }
}

/// deploy/'s placeholders start so: a secret anybody can read in the repository.
pub const PLACEHOLDER_PREFIX: &str = "CHANGE-ME";

/// Whether `secret` is a shipped placeholder rather than the operator's own.
pub fn is_placeholder_secret(secret: &str) -> bool {
    secret.starts_with(PLACEHOLDER_PREFIX)
}

impl ServiceAuth {
    /// Requires `secret`; an empty secret checks nothing (a warning says so once at start).
    pub fn new(secret: &str) -> Self {
        if is_placeholder_secret(secret) {
            tracing::error!(
                "the service secret is deploy/'s placeholder (CHANGE-ME…), public in the repository: anyone who reads it can call this service as any part; set a random one (openssl rand -hex 32) in the Secret"
            );
        }
        Self {
            digest: (!secret.is_empty()).then(|| sha2::Sha256::digest(secret.as_bytes()).into()),
            allow_roleless_client_certs: false,
        }
    }

    /// Lets a verified client certificate that names no role in as the part
    /// its role header says (`tls.allow_roleless_client_certs`); off by
    /// default, where such a certificate needs the secret as well.
    pub fn allow_roleless_client_certs(mut self, allow: bool) -> Self {
        self.allow_roleless_client_certs = allow;
        self
    }

    /// Whether a secret is required.
    pub fn required(&self) -> bool {
        self.digest.is_some()
    }

    /// What the headers prove. Without a configured secret nothing is proved
    /// and nothing refused; with one, a missing or wrong secret is UNAUTHENTICATED.
    pub fn check(&self, headers: &HeaderMap) -> Result<ServiceCaller, AuthError> {
        self.check_peer(headers, None)
    }

    /// [`ServiceAuth::check`], for a connection whose peer may have proved
    /// itself at the TLS handshake (`peer`: the connection's [`PeerInfo`];
    /// it proved itself when it presented a client certificate from the
    /// server's `client_ca`, mutual TLS). Such a peer is a part of the
    /// system without the secret, in the role its certificate names:
    ///
    /// - the role header, when sent, must be one the certificate names,
    ///   else PERMISSION_DENIED (a secret sent beside it does not widen it);
    ///   without a header, a certificate naming one role is that role;
    /// - a certificate that names no role is refused (PERMISSION_DENIED)
    ///   unless the call carries the right secret (a secret call that
    ///   happens to come over TLS) or [`ServiceAuth::allow_roleless_client_certs`]
    ///   is set (the header is believed, as with the secret).
    pub fn check_peer(
        &self,
        headers: &HeaderMap,
        peer: Option<&PeerInfo>,
    ) -> Result<ServiceCaller, AuthError> {
        if let Some(p) = peer.filter(|p| p.verified_client()) {
            let roles = roles_in(&p.client_uris);
            if !roles.is_empty() {
                return certified(headers, &roles);
            }
            if self.allow_roleless_client_certs {
                return Ok(proven(headers, header_role(headers)));
            }
            if self.digest.is_none() || headers.get(SECRET_HEADER).is_none() {
                return Err(AuthError::Denied(format!(
                    "the client certificate names no omicos role: give the part a certificate \
                     with the URI SAN {ROLE_URI_PREFIX}<role> (<role>: {}), send the service \
                     secret, or set tls.allow_roleless_client_certs on this server",
                    role_list(&ServiceRole::ALL)
                )));
            }
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
        Ok(proven(headers, header_role(headers)))
    }
}

/// The role header as sent (None: absent or not text).
fn header_text(headers: &HeaderMap) -> Option<&str> {
    headers.get(ROLE_HEADER).and_then(|v| v.to_str().ok())
}

/// The role the header names (None: absent or no role).
fn header_role(headers: &HeaderMap) -> Option<ServiceRole> {
    header_text(headers).and_then(ServiceRole::parse)
}

/// The caller whose verified certificate names `roles` (not empty): the
/// role the header claims if the certificate carries it, the certificate's
/// one role without a header; any other claim is refused.
fn certified(headers: &HeaderMap, roles: &[ServiceRole]) -> Result<ServiceCaller, AuthError> {
    let role = match header_text(headers) {
        None => (roles.len() == 1).then(|| roles[0]),
        Some(claim) => match ServiceRole::parse(claim).filter(|r| roles.contains(r)) {
            Some(r) => Some(r),
            None => {
                return Err(AuthError::Denied(format!(
                    "the call claims the role `{claim}` but its client certificate is for {} \
                     ({}): a part calls only in a role its certificate names",
                    role_list(roles),
                    roles.iter().map(|r| r.uri()).collect::<Vec<_>>().join(", ")
                )));
            }
        },
    };
    Ok(proven(headers, role))
}

/// The caller of a request that proved it is a part of the system (the
/// secret, or a client certificate) in `role`: with its forwarded principal
/// when that role is the orchestrator.
fn proven(headers: &HeaderMap, role: Option<ServiceRole>) -> ServiceCaller {
    let text = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A connection whose handshake verified a client certificate with these URI SANs.
    fn cert(uris: &[&str]) -> PeerInfo {
        PeerInfo {
            remote_addr: None,
            // The gate looks only at whether a chain was verified and at its URIs.
            client_certs: Some(Arc::from(vec![rustls::pki_types::CertificateDer::from(
                vec![0u8],
            )])),
            client_uris: uris.iter().map(|u| (*u).to_owned()).collect(),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    const PRINCIPAL: [(&str, &str); 2] = [(TENANT_HEADER, "acme"), (SUBJECT_HEADER, "alice")];

    #[test]
    fn a_certificate_names_the_role_and_a_header_cannot_claim_another() {
        let auth = ServiceAuth::new("");
        let runner = cert(&["spiffe://omicos/runner"]);
        let mut claim = headers(&[(ROLE_HEADER, "orchestrator")]);
        for (k, v) in PRINCIPAL {
            claim.insert(k, v.parse().unwrap());
        }
        let e = auth.check_peer(&claim, Some(&runner)).unwrap_err();
        assert!(matches!(e, AuthError::Denied(_)), "{e}");
        assert_eq!(e.status().code(), tonic::Code::PermissionDenied);
        assert!(e.to_string().contains("spiffe://omicos/runner"), "{e}");
        // A secret beside it widens nothing.
        let with_secret = ServiceAuth::new("s");
        claim.insert(SECRET_HEADER, "s".parse().unwrap());
        assert!(matches!(
            with_secret.check_peer(&claim, Some(&runner)),
            Err(AuthError::Denied(_))
        ));
        // Its own role, claimed or not; no forwarded principal for a runner.
        for h in [headers(&[(ROLE_HEADER, "runner")]), HeaderMap::new()] {
            let c = auth.check_peer(&h, Some(&runner)).unwrap();
            assert!(c.is(ServiceRole::Runner), "{c:?}");
        }
        let c = auth
            .check_peer(&headers(&PRINCIPAL), Some(&runner))
            .unwrap();
        assert_eq!(c.principal, None);
        // An orchestrator's certificate forwards the principal.
        let orch = cert(&["spiffe://omicos/orchestrator"]);
        let c = auth.check_peer(&headers(&PRINCIPAL), Some(&orch)).unwrap();
        assert!(c.is(ServiceRole::Orchestrator));
        assert_eq!(c.principal.unwrap().tenant, "acme");
        // An unknown role claimed is refused, not ignored.
        let e = auth
            .check_peer(&headers(&[(ROLE_HEADER, "root")]), Some(&orch))
            .unwrap_err();
        assert!(e.to_string().contains("`root`"), "{e}");
    }

    #[test]
    fn several_roles_any_of_them_and_without_a_header_none() {
        let auth = ServiceAuth::new("");
        let both = cert(&[
            "spiffe://omicos/operator",
            "https://example.org/x",
            "spiffe://omicos/orchestrator",
        ]);
        for r in [ServiceRole::Operator, ServiceRole::Orchestrator] {
            let c = auth
                .check_peer(&headers(&[(ROLE_HEADER, r.as_str())]), Some(&both))
                .unwrap();
            assert!(c.is(r));
        }
        let c = auth.check_peer(&HeaderMap::new(), Some(&both)).unwrap();
        assert!(c.authenticated && c.role.is_none(), "{c:?}");
        assert!(
            auth.check_peer(&headers(&[(ROLE_HEADER, "runner")]), Some(&both))
                .is_err()
        );
    }

    #[test]
    fn a_roleless_certificate_needs_the_secret_or_config() {
        let claim = headers(&[(ROLE_HEADER, "runner")]);
        for uris in [
            &[][..],
            &["spiffe://example.org/runner"][..],
            &["spiffe://omicos/runner/extra"][..],
            &["spiffe://omicos/admin"][..],
        ] {
            let roleless = cert(uris);
            let e = ServiceAuth::new("")
                .check_peer(&claim, Some(&roleless))
                .unwrap_err();
            assert!(
                matches!(&e, AuthError::Denied(m) if m.contains("names no omicos role")),
                "{uris:?}: {e}"
            );
            // With the secret configured: without it sent, refused the same way;
            // sent and right, a secret call; sent and wrong, UNAUTHENTICATED.
            let secret = ServiceAuth::new("s");
            assert!(matches!(
                secret.check_peer(&claim, Some(&roleless)),
                Err(AuthError::Denied(_))
            ));
            let mut with = claim.clone();
            with.insert(SECRET_HEADER, "s".parse().unwrap());
            assert!(
                secret
                    .check_peer(&with, Some(&roleless))
                    .unwrap()
                    .is(ServiceRole::Runner)
            );
            with.insert(SECRET_HEADER, "t".parse().unwrap());
            assert!(matches!(
                secret.check_peer(&with, Some(&roleless)),
                Err(AuthError::Invalid(_))
            ));
            // Config lets it in as its header's role.
            let lenient = ServiceAuth::new("").allow_roleless_client_certs(true);
            assert!(
                lenient
                    .check_peer(&claim, Some(&roleless))
                    .unwrap()
                    .is(ServiceRole::Runner)
            );
        }
    }

    #[test]
    fn without_a_verified_certificate_the_secret_decides() {
        let plain = PeerInfo::default();
        let auth = ServiceAuth::new("s");
        let claim = headers(&[(ROLE_HEADER, "orchestrator"), (SECRET_HEADER, "s")]);
        assert!(
            auth.check_peer(&claim, Some(&plain))
                .unwrap()
                .is(ServiceRole::Orchestrator)
        );
        assert_eq!(
            auth.check_peer(&HeaderMap::new(), Some(&plain)),
            Err(AuthError::Missing)
        );
        // URIs without a verified chain prove nothing.
        let unverified = PeerInfo {
            client_uris: vec!["spiffe://omicos/orchestrator".to_owned()].into(),
            ..PeerInfo::default()
        };
        assert_eq!(
            auth.check_peer(&HeaderMap::new(), Some(&unverified)),
            Err(AuthError::Missing)
        );
        let open = ServiceAuth::new("").check_peer(&claim, None).unwrap();
        assert!(!open.authenticated);
    }
}
