//! Configuration of the web service. Every key of the provider lives under
//! `web:`, so its environment names read `OMICOS_WEB_...` (see README.md).

use serde::{Deserialize, Serialize};

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
    /// Registry TTL in seconds (0: the registry's default).
    pub registry_ttl_seconds: u32,
    /// Seconds in-flight calls get to finish on SIGTERM.
    pub grace_seconds: u64,
    /// The provider.
    pub web: WebConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            registry: String::new(),
            advertise: String::new(),
            registry_ttl_seconds: 0,
            grace_seconds: 10,
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
    pub connect_timeout_ms: u64,
    /// Longest wait for the next bytes of a response.
    pub read_timeout_ms: u64,
    /// Whole fetch, redirects and body included.
    pub total_timeout_ms: u64,
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
            connect_timeout_ms: 5_000,
            read_timeout_ms: 15_000,
            total_timeout_ms: 30_000,
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
    pub timeout_ms: u64,
    /// Retries after a rate-limit answer (429).
    pub max_retries: u32,
    /// Longest wait before a retry, Retry-After included.
    pub max_backoff_ms: u64,
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
            timeout_ms: 15_000,
            max_retries: 3,
            max_backoff_ms: 10_000,
            default_max_results: 8,
        }
    }
}

impl WebConfig {
    /// Checks values that serde cannot: ranges and allowlist entries.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_redirects > 5 {
            return Err(format!(
                "web.max_redirects is {}: at most 5 redirects are followed",
                self.max_redirects
            ));
        }
        for (key, v) in [
            ("web.connect_timeout_ms", self.connect_timeout_ms),
            ("web.read_timeout_ms", self.read_timeout_ms),
            ("web.total_timeout_ms", self.total_timeout_ms),
            ("web.max_body_bytes", self.max_body_bytes),
            ("web.search.timeout_ms", self.search.timeout_ms),
        ] {
            if v == 0 {
                return Err(format!("{key} must be greater than 0"));
            }
        }
        if self.max_concurrent_fetches == 0
            || self.max_elements == 0
            || self.max_depth == 0
            || self.default_max_length == 0
        {
            return Err("web.max_concurrent_fetches, web.max_elements, web.max_depth and web.default_max_length must be greater than 0".into());
        }
        if !matches!(self.search.backend.as_str(), "searxng" | "brave" | "tavily") {
            return Err(format!(
                "web.search.backend is `{}`: use searxng, brave or tavily",
                self.search.backend
            ));
        }
        crate::ssrf::Policy::new(self.ssrf_protection, &self.allow)
            .map(|_| ())
            .map_err(|e| format!("web.allow: {e}"))
    }
}
