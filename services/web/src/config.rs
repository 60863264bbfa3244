//! Configuration of the web service. Every key of the provider lives under
//! `web:`, so its environment names read `OMICOS_WEB_...` (see README.md).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The whole `omicos-web` service: where it listens and registers, and the provider.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// The registry to announce to (`http://127.0.0.1:7002`); empty: do not register.
    pub registry: String,
    /// Endpoint announced to the registry; empty: `http://<bound address>`.
    pub advertise: String,
    /// TLS (`tls.cert`, `tls.key`, `tls.client_ca`, `tls.ca`): the port
    /// serves TLS with `cert`/`key`; with `client_ca` only peers presenting a
    /// certificate from that CA get in (mutual TLS); `ca` verifies an
    /// `https://` registry, `cert`/`key` is also the client certificate to it.
    pub tls: omicos_servicekit::TlsConfig,
    /// The TTL asked of the registry (whole seconds; 0: the registry's default).
    #[serde(with = "duration")]
    pub registry_ttl: Duration,
    /// How long in-flight calls get to finish on SIGTERM.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// The provider.
    pub web: WebConfig,
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
            web: WebConfig::default(),
        }
    }
}

/// The web provider: fetch limits, SSRF policy and search backends.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Refuse private, loopback, link-local and other internal addresses.
    pub ssrf_protection: bool,
    /// Allowed despite the SSRF rules: host names (`*.corp.example` for
    /// subdomains), IP addresses or CIDRs (`127.0.0.1/32`).
    pub allow: Vec<String>,
    /// Read each site's robots.txt and refuse what it disallows.
    pub robots_txt: bool,
    /// User-Agent header (its first token is matched against robots.txt groups).
    pub user_agent: String,
    /// TCP + TLS connect timeout.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response.
    #[serde(with = "duration")]
    pub read_timeout: Duration,
    /// Whole fetch, redirects and body included.
    #[serde(with = "duration")]
    pub total_timeout: Duration,
    /// Redirects followed, each one checked again (at most 5).
    pub max_redirects: u32,
    /// Bytes of body read at most (decompressed); larger bodies are refused.
    pub max_body_bytes: u64,
    /// Fetches running at once; more wait for a slot.
    pub max_concurrent_fetches: usize,
    /// Elements a page may have before it is refused.
    pub max_elements: usize,
    /// Deeper pages are returned as plain text, without the recursive stages.
    pub max_depth: usize,
    /// Characters returned when a call gives no `max_length`.
    pub default_max_length: usize,
    /// web_search.
    pub search: SearchConfig,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            ssrf_protection: true,
            allow: Vec::new(),
            robots_txt: false,
            user_agent: format!("omicos-web/{}", env!("CARGO_PKG_VERSION")),
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(15),
            total_timeout: Duration::from_secs(30),
            max_redirects: 5,
            max_body_bytes: 10 << 20,
            max_concurrent_fetches: 8,
            max_elements: 200_000,
            max_depth: 1_000,
            default_max_length: 20_000,
            search: SearchConfig::default(),
        }
    }
}

/// web_search backends.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// `searxng` (default), `brave` or `tavily`.
    pub backend: String,
    /// Base URL of a SearxNG instance with the json format enabled.
    pub searxng_url: String,
    /// Brave Search API endpoint.
    pub brave_url: String,
    /// Brave key; empty: the `BRAVE_API_KEY` environment variable.
    pub brave_api_key: String,
    /// Tavily search endpoint.
    pub tavily_url: String,
    /// Tavily key; empty: the `TAVILY_API_KEY` environment variable.
    pub tavily_api_key: String,
    /// Timeout of one search request.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Retries after a rate-limit answer (429).
    pub max_retries: u32,
    /// Longest wait before a retry, Retry-After included.
    #[serde(with = "duration")]
    pub retry_max_delay: Duration,
    /// Results when a call gives no `max_results`.
    pub default_max_results: u32,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            backend: "searxng".into(),
            searxng_url: String::new(),
            brave_url: "https://api.search.brave.com/res/v1/web/search".into(),
            brave_api_key: String::new(),
            tavily_url: "https://api.tavily.com/search".into(),
            tavily_api_key: String::new(),
            timeout: Duration::from_secs(15),
            max_retries: 3,
            retry_max_delay: Duration::from_secs(10),
            default_max_results: 8,
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[
        Renamed::to("registry_ttl_seconds", "registry_ttl"),
        Renamed::to("grace_seconds", "shutdown_grace"),
        Renamed::millis("web.connect_timeout_ms", "web.connect_timeout"),
        Renamed::millis("web.read_timeout_ms", "web.read_timeout"),
        Renamed::millis("web.total_timeout_ms", "web.total_timeout"),
        Renamed::millis("web.search.timeout_ms", "web.search.timeout"),
        Renamed::millis("web.search.max_backoff_ms", "web.search.retry_max_delay"),
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        omicos_servicekit::config::require_registry_ttl("registry_ttl", self.registry_ttl)?;
        self.web.validate()
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }
}

impl WebConfig {
    /// Checks values that serde cannot: ranges and allowlist entries. The
    /// error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_redirects > 5 {
            return Err(ConfigError::key(
                "web.max_redirects",
                format!(
                    "{} is more than the 5 redirects that are followed",
                    self.max_redirects
                ),
            ));
        }
        for (key, v) in [
            ("web.connect_timeout", self.connect_timeout),
            ("web.read_timeout", self.read_timeout),
            ("web.total_timeout", self.total_timeout),
            ("web.search.timeout", self.search.timeout),
        ] {
            require_nonzero(key, v)?;
        }
        for (key, zero) in [
            ("web.max_body_bytes", self.max_body_bytes == 0),
            (
                "web.max_concurrent_fetches",
                self.max_concurrent_fetches == 0,
            ),
            ("web.max_elements", self.max_elements == 0),
            ("web.max_depth", self.max_depth == 0),
            ("web.default_max_length", self.default_max_length == 0),
        ] {
            if zero {
                return Err(ConfigError::key(key, "must be greater than 0"));
            }
        }
        if !matches!(self.search.backend.as_str(), "searxng" | "brave" | "tavily") {
            return Err(ConfigError::key(
                "web.search.backend",
                format!("`{}`: use searxng, brave or tavily", self.search.backend),
            ));
        }
        crate::ssrf::Policy::new(self.ssrf_protection, &self.allow)
            .map(|_| ())
            .map_err(|e| ConfigError::key("web.allow", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, yaml).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        omicos_servicekit::load_config(Some(&file), &env)
    }

    #[test]
    fn old_millisecond_keys_read_as_milliseconds() {
        let c = load(
            "web:\n  connect_timeout_ms: 1500\n  search: {max_backoff_ms: 250}\n",
            &[("OMICOS_WEB_TOTAL_TIMEOUT_MS", "45000")],
        )
        .unwrap();
        assert_eq!(c.web.connect_timeout, Duration::from_millis(1500));
        assert_eq!(c.web.search.retry_max_delay, Duration::from_millis(250));
        assert_eq!(c.web.total_timeout, Duration::from_secs(45));
        let c = load(
            "web: {read_timeout: 2m, search: {timeout: 3}}\n",
            &[("OMICOS_WEB_CONNECT_TIMEOUT", "750ms")],
        )
        .unwrap();
        assert_eq!(c.web.read_timeout, Duration::from_secs(120));
        assert_eq!(c.web.search.timeout, Duration::from_secs(3));
        assert_eq!(c.web.connect_timeout, Duration::from_millis(750));
    }

    #[test]
    fn bad_values_name_their_key() {
        for (yaml, key) in [
            ("web: {total_timeout: 0}\n", "web.total_timeout"),
            ("web: {max_redirects: 9}\n", "web.max_redirects"),
            ("web: {allow: [\"10.0.0.0/40\"]}\n", "web.allow"),
            ("web: {search: {backend: bing}}\n", "web.search.backend"),
            ("web: {max_depth: 0}\n", "web.max_depth"),
        ] {
            let e = load(yaml, &[]).unwrap_err();
            assert_eq!(e.key_path(), Some(key), "{yaml}: {e}");
        }
    }
}
