//! A real identity provider for tests: an Ed25519 key, its JWKS served over
//! HTTP on 127.0.0.1 (counting fetches), and JWTs signed with it.

use base64::Engine;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The issuer every test JWT names.
pub const ISSUER: &str = "https://idp.omicos.test";
/// The audience every test JWT names.
pub const AUDIENCE: &str = "omicos";

/// A signing key and the JWKS server that publishes it.
pub struct Idp {
    /// `http://127.0.0.1:PORT/jwks.json`
    pub jwks_url: String,
    key: jsonwebtoken::EncodingKey,
    kid: String,
    fetches: Arc<AtomicUsize>,
}

impl Idp {
    /// Makes a key and serves its JWKS.
    pub async fn start() -> Self {
        use aws_lc_rs::signature::KeyPair;
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = aws_lc_rs::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
        let pair = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key");
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        let kid = "test-key-1".to_owned();
        let jwks = serde_json::json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"
        }]});
        let fetches = Arc::new(AtomicUsize::new(0));
        let f = fetches.clone();
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let jwks = jwks.clone();
                let f = f.clone();
                async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    axum::Json(jwks)
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        Self {
            jwks_url: format!("http://{addr}/jwks.json"),
            key: jsonwebtoken::EncodingKey::from_ed_der(pkcs8.as_ref()),
            kid,
            fetches,
        }
    }

    /// How many times the JWKS was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A JWT with `claims` over the defaults (iss, aud, sub, exp in an hour).
    pub fn token(&self, claims: serde_json::Value) -> String {
        let now = jsonwebtoken::get_current_timestamp();
        let mut c = serde_json::json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": "jwt-user", "iat": now, "exp": now + 3600,
        });
        for (k, v) in claims.as_object().cloned().unwrap_or_default() {
            c[k] = v;
        }
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, &c, &self.key).expect("sign")
    }

    /// A JWT that expired an hour ago (beyond any leeway).
    pub fn expired(&self, claims: serde_json::Value) -> String {
        let now = jsonwebtoken::get_current_timestamp();
        let mut c = claims;
        c["exp"] = (now - 3600).into();
        c["iat"] = (now - 7200).into();
        self.token(c)
    }

    /// The `auth.jwt` config that trusts this provider.
    pub fn config(&self) -> omicos_auth::JwtConfig {
        omicos_auth::JwtConfig {
            jwks_url: self.jwks_url.clone(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            ..Default::default()
        }
    }
}
