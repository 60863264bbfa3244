//! The image_gen service's configuration (YAML file, then `OMICOS_*`
//! environment; see docs/configuration.md).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The service's configuration (YAML file, then `OMICOS_*` environment).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (`OMICOS_LISTEN`).
    pub listen: String,
    /// Registry to announce to, e.g. `http://127.0.0.1:7002`; empty: do not register.
    pub registry: String,
    /// Endpoint to announce; empty: `http://<bound address>`.
    pub advertise: String,
    /// TLS (`tls.cert`, `tls.key`, `tls.client_ca`, `tls.ca`): the port
    /// serves TLS with `cert`/`key`; with `client_ca` only peers presenting a
    /// certificate from that CA get in (mutual TLS); `ca` verifies an
    /// `https://` registry, `cert`/`key` is also the client certificate to it.
    pub tls: omicos_servicekit::TlsConfig,
    /// The TTL asked of the registry (whole seconds; 0: the registry's default).
    #[serde(with = "duration")]
    pub registry_ttl: Duration,
    /// Drain period on SIGTERM.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Workspace root used when a call carries none; empty: the current directory.
    pub workspace: String,
    /// The images endpoint (`OMICOS_IMAGE_GEN_*`).
    pub image_gen: ImageGenConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            registry: String::new(),
            advertise: String::new(),
            tls: Default::default(),
            registry_ttl: Duration::ZERO,
            shutdown_grace: Duration::from_secs(10),
            workspace: String::new(),
            image_gen: ImageGenConfig::default(),
        }
    }
}

/// The OpenAI-compatible images endpoint and the limits of a call.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ImageGenConfig {
    /// Base URL, e.g. `https://api.openai.com/v1` (`OMICOS_IMAGE_GEN_BASE_URL`).
    /// Empty with a key set: OpenAI's.
    pub base_url: String,
    /// Model name (`OMICOS_IMAGE_GEN_MODEL`); empty: the endpoint's default.
    pub model: String,
    /// API key (`OMICOS_IMAGE_GEN_API_KEY`; `OPENAI_API_KEY` when empty).
    pub api_key: String,
    /// Size asked for when the call names none.
    pub default_size: String,
    /// `response_format` sent with each request (`b64_json` or `url`); empty:
    /// not sent, since some models (gpt-image-1) refuse the field.
    pub response_format: String,
    /// Most images one call may ask for.
    pub max_n: u32,
    /// Time one HTTP request may take (generation is slow).
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Retries after a 429 or 5xx answer or a connection failure.
    pub max_retries: u32,
    /// First backoff; doubled at each retry.
    #[serde(with = "duration")]
    pub retry_base_delay: Duration,
    /// Longest single wait before a retry; a `Retry-After` beyond it ends
    /// the call with an error that says when to try again.
    #[serde(with = "duration")]
    pub retry_max_delay: Duration,
    /// Largest image accepted, in MiB (decoded base64 or download).
    pub max_image_mb: u64,
}

impl Default for ImageGenConfig {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            model: String::new(),
            api_key: String::new(),
            default_size: "1024x1024".into(),
            response_format: String::new(),
            max_n: 4,
            timeout: Duration::from_secs(180),
            max_retries: 4,
            retry_base_delay: Duration::from_secs(1),
            retry_max_delay: Duration::from_secs(60),
            max_image_mb: 32,
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[
        Renamed::to("registry_ttl_seconds", "registry_ttl"),
        Renamed::to("grace_seconds", "shutdown_grace"),
        Renamed::to("image_gen.timeout_secs", "image_gen.timeout"),
        Renamed::millis("image_gen.retry_base_ms", "image_gen.retry_base_delay"),
        Renamed::to("image_gen.max_retry_wait_secs", "image_gen.retry_max_delay"),
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        omicos_servicekit::config::require_registry_ttl("registry_ttl", self.registry_ttl)?;
        self.image_gen.validate()
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }
}

/// OpenAI's API, used when only a key is configured.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

impl ImageGenConfig {
    /// Refuses values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        require_nonzero("image_gen.timeout", self.timeout)
    }

    /// Fills the key from `OPENAI_API_KEY` when none is configured, as the
    /// OpenAI tools do.
    pub fn with_env_fallbacks(mut self, env: &[(String, String)]) -> Self {
        if self.api_key.trim().is_empty()
            && let Some((_, v)) = env
                .iter()
                .find(|(k, v)| k == "OPENAI_API_KEY" && !v.trim().is_empty())
        {
            self.api_key = v.trim().to_owned();
        }
        self
    }

    /// The base URL to call, or None when image generation is not configured.
    pub fn endpoint(&self) -> Option<String> {
        let base = self.base_url.trim().trim_end_matches('/');
        if !base.is_empty() {
            Some(base.to_owned())
        } else if !self.api_key.trim().is_empty() {
            Some(OPENAI_BASE_URL.to_owned())
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_and_key_fallbacks() {
        let c = ImageGenConfig::default();
        assert_eq!(c.endpoint(), None);
        let env = vec![("OPENAI_API_KEY".to_string(), "sk-test".to_string())];
        let c = c.with_env_fallbacks(&env);
        assert_eq!(c.api_key, "sk-test");
        assert_eq!(c.endpoint().as_deref(), Some(OPENAI_BASE_URL));
        let c = ImageGenConfig {
            base_url: "http://127.0.0.1:9/v1/".into(),
            api_key: "mine".into(),
            ..Default::default()
        }
        .with_env_fallbacks(&env);
        assert_eq!(c.api_key, "mine");
        assert_eq!(c.endpoint().as_deref(), Some("http://127.0.0.1:9/v1"));
    }

    #[test]
    fn env_names_follow_the_key_paths() {
        let env = vec![
            (
                "OMICOS_IMAGE_GEN_BASE_URL".to_string(),
                "http://x/v1".to_string(),
            ),
            (
                "OMICOS_IMAGE_GEN_MODEL".to_string(),
                "gpt-image-1".to_string(),
            ),
            ("OMICOS_IMAGE_GEN_MAX_N".to_string(), "2".to_string()),
        ];
        let c: Config = omicos_servicekit::load_config(None, &env).unwrap();
        assert_eq!(c.image_gen.base_url, "http://x/v1");
        assert_eq!(c.image_gen.model, "gpt-image-1");
        assert_eq!(c.image_gen.max_n, 2);
    }
}
