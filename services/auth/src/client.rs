//! Client authentication: a bearer token is an API key or a JWT, and becomes a [`Principal`].

use crate::config::{ClientAuthConfig, DEFAULT_TENANT, parse_mode};
use crate::jwks::Jwks;
use crate::principal::Via;
use crate::{AuthError, Principal};
use sha2::Digest;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// Verified JWTs kept at most: past this the cache starts over (a flood of
/// distinct valid tokens costs verifications, never memory).
const TOKEN_CACHE_MAX: usize = 10_000;

struct Key {
    digest: [u8; 32],
    principal: Principal,
}

/// Verifies bearer tokens against the configured API keys and JWKS.
pub struct ClientAuth {
    enabled: bool,
    keys: Vec<Key>,
    jwt: Option<JwtVerifier>,
    /// sha256(token) → (principal, when the token stops being valid).
    cache: Mutex<HashMap<[u8; 32], (Principal, Instant)>>,
}

struct JwtVerifier {
    cfg: crate::config::JwtConfig,
    jwks: Jwks,
    default_max_mode: omicos_proto::PermissionMode,
}

/// The example client key deploy/ ships (its hash is in the Secret).
pub const EXAMPLE_CLIENT_KEY: &str = "CHANGE-ME-example-client-key";

impl ClientAuth {
    /// From validated config ([`ClientAuthConfig::validate`]).
    pub fn new(cfg: &ClientAuthConfig) -> Result<Self, String> {
        let mut keys = vec![];
        for k in &cfg.api_keys {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(&k.sha256, &mut digest)
                .map_err(|e| format!("api key of {}: sha256: {e}", k.principal))?;
            if k.sha256
                .eq_ignore_ascii_case(&crate::sha256_hex(EXAMPLE_CLIENT_KEY))
            {
                tracing::error!(
                    principal = %k.principal,
                    "an api key is deploy/'s example key ({EXAMPLE_CLIENT_KEY}), public in the repository: anyone can sign in as `{}`; replace its sha256 with your own key's (deploy/README.md)",
                    k.principal
                );
            }
            keys.push(Key {
                digest,
                principal: Principal {
                    subject: k.principal.clone(),
                    tenant: if k.tenant.is_empty() {
                        DEFAULT_TENANT.into()
                    } else {
                        k.tenant.clone()
                    },
                    tier: k.tier.clone(),
                    max_mode: parse_mode(&k.max_mode)?,
                    via: Via::ApiKey,
                },
            });
        }
        let jwt = if cfg.jwt.jwks_url.is_empty() {
            None
        } else {
            Some(JwtVerifier {
                jwks: Jwks::new(
                    &cfg.jwt.jwks_url,
                    cfg.jwt.refresh_interval,
                    cfg.jwt.min_refetch_interval,
                )?,
                default_max_mode: parse_mode(&cfg.jwt.default_max_mode)?,
                cfg: cfg.jwt.clone(),
            })
        };
        if cfg.enabled && keys.is_empty() && jwt.is_none() {
            tracing::warn!(
                "auth is on and no API key or JWKS is configured: every call is refused"
            );
        }
        if !cfg.enabled {
            tracing::warn!(
                "auth is OFF: anyone who reaches this port acts as the anonymous principal with any mode"
            );
        }
        Ok(Self {
            enabled: cfg.enabled,
            keys,
            jwt,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Whether credentials are checked at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The principal of a request's `authorization` header value (None: absent).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        if !self.enabled {
            return Ok(Principal::anonymous());
        }
        let token = bearer(authorization)?;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        // Every key is compared, in constant time, whichever matches.
        let mut found: Option<&Principal> = None;
        for k in &self.keys {
            if bool::from(k.digest.ct_eq(&digest)) {
                found = Some(&k.principal);
            }
        }
        if let Some(p) = found {
            return Ok(p.clone());
        }
        let Some(jwt) = &self.jwt else {
            return Err(AuthError::Invalid("unknown token".into()));
        };
        if !looks_like_jwt(token) {
            return Err(AuthError::Invalid("unknown token".into()));
        }
        if let Some(p) = self.cached(&digest) {
            return Ok(p);
        }
        let (p, exp) = jwt.verify(token).await?;
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= TOKEN_CACHE_MAX {
            c.clear();
        }
        c.insert(digest, (p.clone(), exp));
        Ok(p)
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Principal> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match c.get(digest) {
            Some((p, exp)) if Instant::now() < *exp => Some(p.clone()),
            Some(_) => {
                c.remove(digest);
                None
            }
            None => None,
        }
    }
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(v: Option<&str>) -> Result<&str, AuthError> {
    let v = v
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or(AuthError::Missing)?;
    let (scheme, token) = v
        .split_once(' ')
        .ok_or_else(|| AuthError::Invalid("expected `Bearer <token>`".into()))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthError::Invalid("expected `Bearer <token>`".into()));
    }
    Ok(token.trim())
}

fn looks_like_jwt(t: &str) -> bool {
    t.split('.').count() == 3 && t.starts_with("eyJ")
}

impl JwtVerifier {
    async fn verify(&self, token: &str) -> Result<(Principal, Instant), AuthError> {
        use jsonwebtoken::{Validation, decode, decode_header, errors::ErrorKind};
        let header =
            decode_header(token).map_err(|e| AuthError::Invalid(format!("not a JWT: {e}")))?;
        let kid = header
            .kid
            .as_deref()
            .ok_or_else(|| AuthError::Invalid("the JWT names no key (kid)".into()))?;
        if matches!(
            header.alg,
            jsonwebtoken::Algorithm::HS256
                | jsonwebtoken::Algorithm::HS384
                | jsonwebtoken::Algorithm::HS512
        ) {
            // A JWKS holds public keys: a shared-secret signature is never one of its.
            return Err(AuthError::Invalid(format!(
                "the JWT is signed with {:?}, not a public-key algorithm",
                header.alg
            )));
        }
        let key = self.jwks.key(kid, header.alg).await?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.cfg.issuer]);
        v.set_audience(&[&self.cfg.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = self.cfg.leeway.as_secs();
        let data =
            decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &v).map_err(|e| {
                match e.kind() {
                    ErrorKind::ExpiredSignature => AuthError::Invalid("the JWT has expired".into()),
                    ErrorKind::InvalidIssuer => {
                        AuthError::Invalid("the JWT's issuer is not trusted".into())
                    }
                    ErrorKind::InvalidAudience => {
                        AuthError::Invalid("the JWT is for another audience".into())
                    }
                    ErrorKind::InvalidSignature => {
                        AuthError::Invalid("the JWT's signature does not verify".into())
                    }
                    _ => AuthError::Invalid(format!("the JWT does not verify: {e}")),
                }
            })?;
        let c = data.claims;
        let text = |name: &str| c.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let subject = text("sub")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| AuthError::Invalid("the JWT has no subject".into()))?;
        let tenant = match text(&self.cfg.tenant_claim).filter(|t| !t.is_empty()) {
            Some(t) => t,
            None if !self.cfg.default_tenant.is_empty() => self.cfg.default_tenant.clone(),
            None => {
                return Err(AuthError::Denied(format!(
                    "the token names no tenant (claim `{}`)",
                    self.cfg.tenant_claim
                )));
            }
        };
        let max_mode = match text(&self.cfg.max_mode_claim) {
            Some(m) => parse_mode(&m).map_err(|e| {
                AuthError::Denied(format!("claim `{}`: {e}", self.cfg.max_mode_claim))
            })?,
            None => self.default_max_mode,
        };
        let exp = c.get("exp").and_then(|v| v.as_u64()).unwrap_or(0);
        let now = jsonwebtoken::get_current_timestamp();
        let left = Duration::from_secs(exp.saturating_sub(now));
        Ok((
            Principal {
                subject,
                tenant,
                tier: text(&self.cfg.tier_claim).unwrap_or_default(),
                max_mode,
                via: Via::Jwt,
            },
            Instant::now() + left,
        ))
    }
}

#[cfg(test)]
mod example_key {
    use super::*;

    /// The key whose use is logged as an error is the one deploy/ ships:
    /// its hash is the one in the k8s Secret (compose.yaml ships none: it
    /// makes the operator set both).
    #[test]
    fn the_example_key_is_the_one_deploy_ships() {
        let hash = crate::sha256_hex(EXAMPLE_CLIENT_KEY);
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("deploy/k8s/omicos.yaml")).unwrap();
        assert!(text.contains(&hash), "deploy/ ships another example key");
        assert!(crate::service::is_placeholder_secret(
            "CHANGE-ME-to-32-random-bytes"
        ));
        assert!(text.contains("CHANGE-ME-to-32-random-bytes"));
        assert!(!crate::service::is_placeholder_secret("9f2c0d1e-random"));
    }
}
