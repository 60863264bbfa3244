//! The identity provider's keys: fetched over HTTP, cached, fetched again when
//! old or when a token names a key the cache does not hold (at most every
//! `min_refetch`, so made-up `kid`s do not become a flood of fetches).

use crate::AuthError;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, RwLock};

/// How long one fetch of the JWKS may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, (Arc<DecodingKey>, Option<Algorithm>)>,
    fetched: Option<Instant>,
}

/// A cached JWKS.
pub struct Jwks {
    url: String,
    http: reqwest::Client,
    refresh: Duration,
    min_refetch: Duration,
    keys: RwLock<Keys>,
    /// One fetch at a time; holds when the last attempt was.
    fetching: Mutex<Option<Instant>>,
}

impl Jwks {
    /// A cache for the JWKS at `url` (nothing is fetched until a token needs it).
    pub fn new(url: &str, refresh: Duration, min_refetch: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| format!("jwks client: {e}"))?;
        Ok(Self {
            url: url.to_owned(),
            http,
            refresh,
            min_refetch,
            keys: RwLock::new(Keys::default()),
            fetching: Mutex::new(None),
        })
    }

    /// The key `kid` for a token signed with `alg`.
    pub async fn key(&self, kid: &str, alg: Algorithm) -> Result<Arc<DecodingKey>, AuthError> {
        {
            let k = self.keys.read().await;
            let fresh = k.fetched.is_some_and(|t| t.elapsed() < self.refresh);
            if fresh && let Some(found) = k.by_kid.get(kid) {
                return check_alg(found, alg);
            }
        }
        self.fetch().await?;
        let k = self.keys.read().await;
        match k.by_kid.get(kid) {
            Some(found) => check_alg(found, alg),
            None => Err(AuthError::Invalid(format!(
                "the JWT's key `{kid}` is not in the issuer's JWKS"
            ))),
        }
    }

    async fn fetch(&self) -> Result<(), AuthError> {
        let mut last = self.fetching.lock().await;
        if let Some(t) = *last
            && t.elapsed() < self.min_refetch
        {
            // Fetched a moment ago (perhaps while this call waited): use what came.
            let k = self.keys.read().await;
            return if k.fetched.is_some() {
                Ok(())
            } else {
                Err(AuthError::Unavailable(format!(
                    "the JWKS at {} could not be fetched",
                    self.url
                )))
            };
        }
        *last = Some(Instant::now());
        let set: JwkSet = async {
            let r = self.http.get(&self.url).send().await?.error_for_status()?;
            r.json::<JwkSet>().await
        }
        .await
        .map_err(|e| {
            tracing::warn!(url = %self.url, error = %e, "cannot fetch the JWKS");
            AuthError::Unavailable(format!(
                "the JWKS at {} could not be fetched: {e}",
                self.url
            ))
        })?;
        let mut by_kid = HashMap::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue;
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(k) => {
                    let alg = jwk
                        .common
                        .key_algorithm
                        .and_then(|a| a.to_string().parse::<Algorithm>().ok());
                    by_kid.insert(kid, (Arc::new(k), alg));
                }
                Err(e) => tracing::warn!(kid, error = %e, "JWKS key skipped"),
            }
        }
        tracing::debug!(url = %self.url, keys = by_kid.len(), "JWKS fetched");
        *self.keys.write().await = Keys {
            by_kid,
            fetched: Some(Instant::now()),
        };
        Ok(())
    }
}

fn check_alg(
    found: &(Arc<DecodingKey>, Option<Algorithm>),
    alg: Algorithm,
) -> Result<Arc<DecodingKey>, AuthError> {
    match found.1 {
        Some(a) if a != alg => Err(AuthError::Invalid(format!(
            "the JWT says {alg:?}, its key is for {a:?}"
        ))),
        _ => Ok(found.0.clone()),
    }
}
