//! The `auth` section of the orchestrator's config.

use omicos_servicekit::config::{ConfigError, duration};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The tenant of a principal whose credential names none.
pub const DEFAULT_TENANT: &str = "default";
/// The subject of the laptop principal (`omicos up`'s token, `--no-auth`),
/// which also owns sessions from before sessions had owners.
pub const LOCAL_SUBJECT: &str = "local";
/// How often the JWKS is fetched again even when every `kid` is known
/// (keys rotate; an hour is what most identity providers cache for).
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(3600);
/// The least time between two fetches of the JWKS for an unknown `kid`: a
/// stream of tokens with made-up `kid`s must not turn into a stream of fetches.
pub const DEFAULT_JWKS_MIN_REFETCH: Duration = Duration::from_secs(10);

/// Client authentication at the orchestrator.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientAuthConfig {
    /// false: every caller is the anonymous principal (tenant `default`, any
    /// mode), with a warning at start. Only for a laptop that nobody else reaches.
    pub enabled: bool,
    /// API keys, each stored as the sha256 of the key.
    pub api_keys: Vec<ApiKeyConfig>,
    /// OIDC JWTs; off while `jwt.jwks_url` is empty.
    pub jwt: JwtConfig,
    /// Health answers without a credential (probes).
    pub open_health: bool,
    /// Reflection answers without a credential (`grpcurl list`).
    pub open_reflection: bool,
}

impl Default for ClientAuthConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            api_keys: vec![],
            jwt: JwtConfig::default(),
            open_health: true,
            open_reflection: true,
        }
    }
}

/// One API key.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The sha256 of the key, 64 hex digits (`printf %s KEY | sha256sum`).
    pub sha256: String,
    /// The principal's name (the sessions' subject).
    pub principal: String,
    /// The tenant; empty: `default`.
    pub tenant: String,
    /// The tier; empty: the deployment's.
    pub tier: String,
    /// The most permissive mode: read_only, auto or full; empty: auto.
    pub max_mode: String,
}

/// JWT verification against an OIDC issuer's JWKS.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// Where the JWKS is (`https://issuer/.well-known/jwks.json`); empty: JWTs are not accepted.
    pub jwks_url: String,
    /// The `iss` a token must carry (required when `jwks_url` is set).
    pub issuer: String,
    /// The `aud` a token must carry (required when `jwks_url` is set).
    pub audience: String,
    /// The claim that names the tenant; a token without it is refused
    /// (PERMISSION_DENIED) unless `default_tenant` is set.
    pub tenant_claim: String,
    /// The tenant of a token without the tenant claim; empty: refuse such tokens.
    pub default_tenant: String,
    /// The claim that names the tier (missing: the deployment's tier).
    pub tier_claim: String,
    /// The claim that names the most permissive mode (missing: `default_max_mode`).
    pub max_mode_claim: String,
    /// The ceiling of a token without the max-mode claim.
    pub default_max_mode: String,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(with = "duration")]
    pub leeway: Duration,
    /// How old the cached JWKS may get before it is fetched again.
    #[serde(with = "duration")]
    pub refresh_interval: Duration,
    /// The least time between fetches caused by an unknown `kid`.
    #[serde(with = "duration")]
    pub min_refetch_interval: Duration,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            jwks_url: String::new(),
            issuer: String::new(),
            audience: String::new(),
            tenant_claim: "tenant".into(),
            default_tenant: String::new(),
            tier_claim: "tier".into(),
            max_mode_claim: "max_mode".into(),
            default_max_mode: "auto".into(),
            leeway: Duration::from_secs(30),
            refresh_interval: DEFAULT_JWKS_REFRESH,
            min_refetch_interval: DEFAULT_JWKS_MIN_REFETCH,
        }
    }
}

impl ClientAuthConfig {
    /// Checks what serde cannot; `section` prefixes the key (`auth`).
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{section}.{k}");
        for (i, k) in self.api_keys.iter().enumerate() {
            let at = |f: &str| key(&format!("api_keys[{i}].{f}"));
            if k.sha256.len() != 64 || !k.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::key(
                    at("sha256"),
                    "must be the key's sha256 in 64 hex digits (printf %s KEY | sha256sum), never the key itself",
                ));
            }
            if k.principal.trim().is_empty() {
                return Err(ConfigError::key(
                    at("principal"),
                    "names nobody: give the key's owner",
                ));
            }
            parse_mode(&k.max_mode).map_err(|e| ConfigError::key(at("max_mode"), e))?;
        }
        if !self.jwt.jwks_url.is_empty() {
            if !self.jwt.jwks_url.starts_with("http://")
                && !self.jwt.jwks_url.starts_with("https://")
            {
                return Err(ConfigError::key(
                    key("jwt.jwks_url"),
                    "is not an http(s) URL",
                ));
            }
            if self.jwt.issuer.is_empty() {
                return Err(ConfigError::key(
                    key("jwt.issuer"),
                    "is required with jwt.jwks_url",
                ));
            }
            if self.jwt.audience.is_empty() {
                return Err(ConfigError::key(
                    key("jwt.audience"),
                    "is required with jwt.jwks_url",
                ));
            }
            parse_mode(&self.jwt.default_max_mode)
                .map_err(|e| ConfigError::key(key("jwt.default_max_mode"), e))?;
        }
        Ok(())
    }
}

/// A ceiling's spelling; empty is `auto`, unspecified is refused.
pub(crate) fn parse_mode(text: &str) -> Result<omicos_proto::PermissionMode, String> {
    use omicos_proto::PermissionMode as M;
    match M::parse(text).map_err(|e| e.to_string())? {
        M::Unspecified => Ok(M::Auto),
        m => Ok(m),
    }
}
