//! The web provider: `web_search` (SearxNG, Brave or Tavily) and `web_fetch`
//! (a page's main content as markdown or text), with SSRF protection on by
//! default, bounded reads and a cap on concurrent fetches.
//!
//! Run it as its own service with the `omicos-web` binary, or serve
//! [`WebProvider`] with [`omicos_toolkit::serve_provider`].

#![warn(missing_docs)]

pub mod config;
pub mod extract;
pub mod fetch;
pub mod robots;
pub mod search;
pub mod ssrf;

pub use config::{Config, SearchConfig, WebConfig};

/// Why the web provider cannot be built. Errors of a fetch or a search are
/// not this type: they are text the model reads in the tool result.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// A value of the `web:` config cannot be used (the error names the key).
    #[error(transparent)]
    Config(#[from] omicos_servicekit::ConfigError),
    /// reqwest refused to build the HTTP client.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

impl WebError {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Client(_) => "http_client",
        }
    }
}
pub use extract::Format;

use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, tool};
use serde_json::{Value, json};
use std::sync::Arc;

/// Longest `max_length` a call may ask for (characters).
const MAX_LENGTH_LIMIT: u64 = 1_000_000;
/// Most results a search may ask for.
const MAX_RESULTS_LIMIT: u64 = 20;

/// The `web` provider.
pub struct WebProvider {
    fetcher: fetch::Fetcher,
    search: Result<Arc<dyn search::SearchBackend>, String>,
    cfg: WebConfig,
}

impl WebProvider {
    /// The provider for `cfg`, with the system resolver and search keys
    /// from the process environment when the config has none.
    pub fn from_config(cfg: &WebConfig) -> Result<Self, WebError> {
        Self::with_parts(
            cfg,
            &omicos_servicekit::config::process_env(),
            Arc::new(ssrf::SystemLookup),
        )
    }

    /// The provider with an explicit environment (for search keys) and name lookup.
    pub fn with_parts(
        cfg: &WebConfig,
        env: &[(String, String)],
        lookup: Arc<dyn ssrf::Lookup>,
    ) -> Result<Self, WebError> {
        let fetcher = fetch::Fetcher::new(cfg, lookup)?;
        // A missing search backend is not fatal: web_fetch still works, and
        // web_search answers how to configure one.
        let search = search::backend_from_config(&cfg.search, env);
        Ok(Self {
            fetcher,
            search,
            cfg: cfg.clone(),
        })
    }

    async fn web_fetch(&self, args: &Value) -> Result<Value, ToolError> {
        let url = args
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::invalid("`url` is required"))?;
        let format = match args
            .get("format")
            .and_then(Value::as_str)
            .unwrap_or("markdown")
        {
            "markdown" => Format::Markdown,
            "text" => Format::Text,
            other => {
                return Err(ToolError::invalid(format!(
                    "`format` is `{other}`: use markdown or text"
                )));
            }
        };
        let max_length = uint(args, "max_length")?.unwrap_or(self.cfg.default_max_length as u64);
        if max_length == 0 || max_length > MAX_LENGTH_LIMIT {
            return Err(ToolError::invalid(format!(
                "`max_length` must be between 1 and {MAX_LENGTH_LIMIT}"
            )));
        }
        let fetch_args = fetch::FetchArgs {
            url: url.to_owned(),
            max_length: max_length as usize,
            start_index: uint(args, "start_index")?.unwrap_or(0) as usize,
            raw: args.get("raw").and_then(Value::as_bool).unwrap_or(false),
            format,
        };
        self.fetcher
            .fetch(fetch_args)
            .await
            .map_err(ToolError::Failed)
    }

    async fn web_search(&self, args: &Value) -> Result<Value, ToolError> {
        let backend = self
            .search
            .as_ref()
            .map_err(|e| ToolError::Unavailable(e.clone()))?;
        let query = args
            .get("query")
            .and_then(Value::as_str)
            .map(str::trim)
            .unwrap_or("");
        if query.is_empty() {
            return Err(ToolError::invalid("`query` must not be empty"));
        }
        let max_results =
            uint(args, "max_results")?.unwrap_or(self.cfg.search.default_max_results as u64);
        if max_results == 0 || max_results > MAX_RESULTS_LIMIT {
            return Err(ToolError::invalid(format!(
                "`max_results` must be between 1 and {MAX_RESULTS_LIMIT}"
            )));
        }
        let time_range = match args
            .get("time_range")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            None => None,
            Some(t) => Some(search::TimeRange::parse(t).ok_or_else(|| {
                ToolError::invalid(format!(
                    "`time_range` is `{t}`: use day, week, month or year"
                ))
            })?),
        };
        let site = args
            .get("site")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let q = search::SearchQuery {
            query: query.to_owned(),
            max_results: max_results as usize,
            time_range,
            site,
        };
        let hits = backend.search(&q).await.map_err(ToolError::Failed)?;
        Ok(json!({ "backend": backend.name(), "query": query, "results": hits }))
    }
}

/// An optional non-negative integer argument.
fn uint(args: &Value, key: &str) -> Result<Option<u64>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ToolError::invalid(format!("`{key}` must be a non-negative integer, not {v}"))
        }),
    }
}

#[async_trait]
impl Provider for WebProvider {
    fn name(&self) -> &str {
        "web"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "web_search",
                "Search the web. Returns results with title, url, snippet and, when known, the publication date. \
                 Use web_fetch to read a result.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1, "description": "What to search for."},
                        "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS_LIMIT, "description": "Results wanted (default 8)."},
                        "time_range": {"type": "string", "enum": ["day", "week", "month", "year"], "description": "Only results this recent."},
                        "site": {"type": "string", "description": "Only results from this site, e.g. docs.rs."}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::Read)
            .toolset("web")
            .provider("web")
            .build(),
            tool(
                "web_fetch",
                "Fetch a web page (http or https) and return its main content as markdown (or text), with the title \
                 and the final URL after redirects. Text, JSON, XML and markdown come back as they are; other types \
                 give metadata only. A long page comes in parts: call again with start_index = next_start_index.",
                json!({
                    "type": "object",
                    "properties": {
                        "url": {"type": "string", "minLength": 1, "description": "The http(s) URL."},
                        "max_length": {"type": "integer", "minimum": 1, "maximum": MAX_LENGTH_LIMIT, "description": "Characters returned at most (default 20000)."},
                        "start_index": {"type": "integer", "minimum": 0, "description": "First character returned (default 0)."},
                        "raw": {"type": "boolean", "description": "Return the page as received (HTML source), without extraction."},
                        "format": {"type": "string", "enum": ["markdown", "text"], "description": "Output of HTML pages (default markdown)."}
                    },
                    "required": ["url"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::Read)
            .toolset("web")
            .provider("web")
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        if tool == "web_fetch"
            && let Some(u) = args.get("url").and_then(Value::as_str)
        {
            let url = url::Url::parse(u.trim())
                .map_err(|e| ToolError::invalid(format!("`{u}` is not a valid URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ToolError::invalid(format!(
                    "only http and https URLs can be fetched, not {}",
                    url.scheme()
                )));
            }
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let run = async {
            match tool {
                "web_fetch" => self.web_fetch(&args).await,
                "web_search" => self.web_search(&args).await,
                other => Err(ToolError::UnknownTool(other.to_owned())),
            }
        };
        tokio::select! {
            r = run => r,
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }
}
