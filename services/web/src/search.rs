//! web_search: one trait, three backends (SearxNG, Brave, Tavily), and the
//! rate-limit retry they share.

use crate::config::SearchConfig;
use async_trait::async_trait;
use reqwest::{RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};

/// One search result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SearchHit {
    /// Page title.
    pub title: String,
    /// Page URL.
    pub url: String,
    /// A short extract.
    pub snippet: String,
    /// Publication date as the backend gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<String>,
}

/// How recent results must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeRange {
    /// The last day.
    Day,
    /// The last week.
    Week,
    /// The last month.
    Month,
    /// The last year.
    Year,
}

impl TimeRange {
    /// Parses `day`, `week`, `month` or `year`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            "year" => Some(Self::Year),
            _ => None,
        }
    }
    fn word(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }
}

/// A search request.
#[derive(Clone, Debug)]
pub struct SearchQuery {
    /// The words.
    pub query: String,
    /// Results wanted.
    pub max_results: usize,
    /// Recency filter.
    pub time_range: Option<TimeRange>,
    /// Restrict to one site (`example.com`).
    pub site: Option<String>,
}

impl SearchQuery {
    /// The query with a `site:` operator, for backends without a domain filter.
    fn with_site(&self) -> String {
        match &self.site {
            Some(s) => format!("{} site:{s}", self.query),
            None => self.query.clone(),
        }
    }
}

/// A search backend.
#[async_trait]
pub trait SearchBackend: Send + Sync + 'static {
    /// Backend name for messages.
    fn name(&self) -> &'static str;
    /// Runs a search.
    async fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>, String>;
}

/// The configured backend, or the message that says how to configure one.
pub fn backend_from_config(
    cfg: &SearchConfig,
    env: &[(String, String)],
) -> Result<Arc<dyn SearchBackend>, String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(cfg.timeout)
        .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
        .user_agent(concat!("omicos-web/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the search HTTP client: {e}"))?;
    let retry = Retry {
        max_retries: cfg.max_retries,
        max_backoff: cfg.retry_max_delay,
    };
    let from_env = |name: &str| {
        env.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    const HOW: &str = "configure a search backend: set web.search.searxng_url (env OMICOS_WEB_SEARCH_SEARXNG_URL) to a SearxNG instance whose settings enable the json format, or set web.search.backend (OMICOS_WEB_SEARCH_BACKEND) to brave with BRAVE_API_KEY, or to tavily with TAVILY_API_KEY";
    match cfg.backend.as_str() {
        "searxng" => {
            if cfg.searxng_url.trim().is_empty() {
                return Err(format!("web_search is not configured: {HOW}"));
            }
            Ok(Arc::new(Searxng {
                client,
                base: cfg.searxng_url.trim_end_matches('/').to_owned(),
                retry,
            }))
        }
        "brave" => {
            let key = Some(cfg.brave_api_key.clone())
                .filter(|k| !k.is_empty())
                .or_else(|| from_env("BRAVE_API_KEY"));
            let Some(key) = key else {
                return Err(format!(
                    "web_search uses Brave but BRAVE_API_KEY is not set; {HOW}"
                ));
            };
            Ok(Arc::new(Brave {
                client,
                url: cfg.brave_url.clone(),
                key,
                retry,
            }))
        }
        "tavily" => {
            let key = Some(cfg.tavily_api_key.clone())
                .filter(|k| !k.is_empty())
                .or_else(|| from_env("TAVILY_API_KEY"));
            let Some(key) = key else {
                return Err(format!(
                    "web_search uses Tavily but TAVILY_API_KEY is not set; {HOW}"
                ));
            };
            Ok(Arc::new(Tavily {
                client,
                url: cfg.tavily_url.clone(),
                key,
                retry,
            }))
        }
        other => Err(format!("web.search.backend `{other}` is unknown; {HOW}")),
    }
}

/// Rate-limit retries.
#[derive(Clone, Copy, Debug)]
struct Retry {
    max_retries: u32,
    max_backoff: Duration,
}

impl Retry {
    /// Sends the request built by `build`; on 429 waits (Retry-After when the
    /// backend says, else an exponential backoff) and tries again.
    async fn send(
        &self,
        backend: &str,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Value, String> {
        let mut attempt = 0u32;
        loop {
            let resp = build()
                .send()
                .await
                .map_err(|e| format!("{backend} search request failed: {}", chain(&e)))?;
            let status = resp.status();
            if status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE
                    && resp.headers().contains_key("retry-after")
            {
                if attempt >= self.max_retries {
                    return Err(format!(
                        "{backend} search is rate limited (HTTP {}) and still was after {} retries; try again later or lower the request rate",
                        status.as_u16(),
                        self.max_retries
                    ));
                }
                let asked = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(Duration::from_secs_f64);
                let backoff = Duration::from_millis(250u64 << attempt.min(10));
                let wait = asked.unwrap_or(backoff).min(self.max_backoff);
                tracing::info!(backend, attempt, ?wait, "search rate limited; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
                continue;
            }
            let text = resp
                .text()
                .await
                .map_err(|e| format!("{backend} search answer could not be read: {}", chain(&e)))?;
            if !status.is_success() {
                let excerpt: String = text.chars().take(300).collect();
                return Err(format!(
                    "{backend} search answered HTTP {}: {excerpt}",
                    status.as_u16()
                ));
            }
            return serde_json::from_str(&text).map_err(|e| {
                let excerpt: String = text.chars().take(120).collect();
                format!("{backend} search answered something that is not JSON ({e}): {excerpt}")
            });
        }
    }
}

/// `base` with `params` appended as a query string (reqwest's `query` needs a feature we leave off).
fn with_query(base: &str, params: &[(&str, String)]) -> String {
    match url::Url::parse(base) {
        Ok(mut u) => {
            u.query_pairs_mut()
                .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
            u.into()
        }
        // reqwest reports the bad URL when the request is sent.
        Err(_) => base.to_owned(),
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn str_field(v: &Value, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| {
        v.get(*k)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .filter(|s| !s.is_empty())
    })
}

fn hits(items: Option<&Value>, snippet: &[&str], published: &[&str], max: usize) -> Vec<SearchHit> {
    items
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some(SearchHit {
                        url: str_field(r, &["url"])?,
                        title: str_field(r, &["title"]).unwrap_or_default(),
                        snippet: str_field(r, snippet).unwrap_or_default(),
                        published: str_field(r, published),
                    })
                })
                .take(max)
                .collect()
        })
        .unwrap_or_default()
}

/// SearxNG's JSON API (`/search?format=json`).
struct Searxng {
    client: reqwest::Client,
    base: String,
    retry: Retry,
}

#[async_trait]
impl SearchBackend for Searxng {
    fn name(&self) -> &'static str {
        "searxng"
    }
    async fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>, String> {
        let url = format!("{}/search", self.base);
        let query = q.with_site();
        let v = self
            .retry
            .send("SearxNG", || {
                let mut params = vec![("q", query.clone()), ("format", "json".into()), ("pageno", "1".into())];
                if let Some(t) = q.time_range {
                    params.push(("time_range", t.word().into()));
                }
                self.client.get(with_query(&url, &params))
            })
            .await
            .map_err(|e| {
                if e.contains("HTTP 403") || e.contains("not JSON") {
                    format!("{e} (SearxNG answers JSON only when `search.formats` in its settings.yml includes json)")
                } else {
                    e
                }
            })?;
        Ok(hits(
            v.get("results"),
            &["content"],
            &["publishedDate", "published_date"],
            q.max_results,
        ))
    }
}

/// The Brave Search API.
struct Brave {
    client: reqwest::Client,
    url: String,
    key: String,
    retry: Retry,
}

#[async_trait]
impl SearchBackend for Brave {
    fn name(&self) -> &'static str {
        "brave"
    }
    async fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>, String> {
        let query = q.with_site();
        let count = q.max_results.clamp(1, 20).to_string();
        let v = self
            .retry
            .send("Brave", || {
                let mut params = vec![("q", query.clone()), ("count", count.clone())];
                if let Some(t) = q.time_range {
                    let f = match t {
                        TimeRange::Day => "pd",
                        TimeRange::Week => "pw",
                        TimeRange::Month => "pm",
                        TimeRange::Year => "py",
                    };
                    params.push(("freshness", f.into()));
                }
                self.client
                    .get(with_query(&self.url, &params))
                    .header("Accept", "application/json")
                    .header("X-Subscription-Token", &self.key)
            })
            .await?;
        Ok(hits(
            v.get("web").and_then(|w| w.get("results")),
            &["description"],
            &["page_age", "age"],
            q.max_results,
        ))
    }
}

/// The Tavily search API.
struct Tavily {
    client: reqwest::Client,
    url: String,
    key: String,
    retry: Retry,
}

#[async_trait]
impl SearchBackend for Tavily {
    fn name(&self) -> &'static str {
        "tavily"
    }
    async fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>, String> {
        let mut body = json!({
            "query": q.query,
            "max_results": q.max_results.clamp(1, 20),
            "search_depth": "basic",
        });
        if let Some(t) = q.time_range {
            body["time_range"] = json!(t.word());
        }
        if let Some(site) = &q.site {
            body["include_domains"] = json!([site]);
        }
        let v = self
            .retry
            .send("Tavily", || {
                self.client
                    .post(&self.url)
                    .bearer_auth(&self.key)
                    .json(&body)
            })
            .await?;
        Ok(hits(
            v.get("results"),
            &["content"],
            &["published_date"],
            q.max_results,
        ))
    }
}
