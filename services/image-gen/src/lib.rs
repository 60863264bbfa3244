//! The `image_gen` provider: `image_gen__generate {prompt, size?, n?}` asks an
//! OpenAI-compatible images endpoint (`POST {base_url}/images/generations`)
//! for pictures and saves them under `<workspace>/.omicos/outputs/<session>/`.
//! The model gets their paths, never the image bytes.
//!
//! Both answer forms are handled (`b64_json` and `url`, the latter downloaded
//! with a size cap); rate limits and server errors are retried with backoff,
//! honouring `Retry-After`; a missing configuration is an error result that
//! says how to configure it.

pub mod client;
pub mod save;

use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, tool};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
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
    /// Registry TTL in seconds (0: the registry's default).
    pub registry_ttl_seconds: u32,
    /// Drain period on SIGTERM, in seconds.
    pub grace_seconds: u64,
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
            registry_ttl_seconds: 0,
            grace_seconds: 10,
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
    /// Time one HTTP request may take, in seconds (generation is slow).
    pub timeout_secs: u64,
    /// Retries after a 429 or 5xx answer or a connection failure.
    pub max_retries: u32,
    /// First backoff, in milliseconds; doubled at each retry.
    pub retry_base_ms: u64,
    /// Longest single wait before a retry, in seconds; a `Retry-After` beyond
    /// it ends the call with an error that says when to try again.
    pub max_retry_wait_secs: u64,
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
            timeout_secs: 180,
            max_retries: 4,
            retry_base_ms: 1000,
            max_retry_wait_secs: 60,
            max_image_mb: 32,
        }
    }
}

/// OpenAI's API, used when only a key is configured.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

impl ImageGenConfig {
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

/// What the model reads when nothing is configured.
pub const NOT_CONFIGURED: &str = "image generation is not configured. Set OMICOS_IMAGE_GEN_BASE_URL to an \
    OpenAI-compatible endpoint (e.g. https://api.openai.com/v1) and OMICOS_IMAGE_GEN_API_KEY (or OPENAI_API_KEY), \
    optionally OMICOS_IMAGE_GEN_MODEL (e.g. gpt-image-1), or the `image_gen:` section (base_url, api_key, model) of \
    the omicos-image-gen config file, then restart omicos-image-gen. Tell the user; do not retry this call.";

/// Longest prompt accepted, in characters (OpenAI's limit for gpt-image-1).
pub const MAX_PROMPT_CHARS: usize = 32_000;

/// The `image_gen` provider (toolset `image_gen`, risk FileWrite).
#[derive(Clone, Debug)]
pub struct ImageGenProvider {
    config: ImageGenConfig,
    http: reqwest::Client,
}

impl ImageGenProvider {
    /// A provider for `config` (use [`ImageGenConfig::with_env_fallbacks`] first
    /// to honour `OPENAI_API_KEY`).
    pub fn new(config: ImageGenConfig) -> Result<Self, ToolError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("omicos-image-gen/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ToolError::Unavailable(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { config, http })
    }

    /// Same as [`ImageGenProvider::new`]; the name the other providers use.
    pub fn from_config(config: &ImageGenConfig) -> Result<Self, ToolError> {
        Self::new(config.clone())
    }

    /// The configuration in force.
    pub fn config(&self) -> &ImageGenConfig {
        &self.config
    }
}

/// Whether `size` looks like `WIDTHxHEIGHT` or `auto`.
fn valid_size(size: &str) -> bool {
    if size == "auto" {
        return true;
    }
    match size.split_once('x') {
        Some((w, h)) => [w, h]
            .iter()
            .all(|d| !d.is_empty() && d.len() <= 5 && d.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

#[async_trait]
impl Provider for ImageGenProvider {
    fn name(&self) -> &str {
        "image_gen"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "image_gen__generate",
                "Generate images from a text prompt with the configured image model. The images are saved in the \
                 workspace under .omicos/outputs/<session>/ and their paths are returned.",
                json!({
                    "type": "object",
                    "properties": {
                        "prompt": {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS,
                                   "description": "What to draw, in detail."},
                        "size": {"type": "string", "description": format!(
                            "WIDTHxHEIGHT in pixels, e.g. 1024x1024, 1536x1024, 1024x1536, or auto (default {}).",
                            self.config.default_size)},
                        "n": {"type": "integer", "minimum": 1, "maximum": self.config.max_n.max(1),
                              "description": "How many images (default 1)."}
                    },
                    "required": ["prompt"],
                    "additionalProperties": false
                }),
            )
            .toolset("image_gen")
            .provider("image_gen")
            .risk(Risk::FileWrite)
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        if tool != "image_gen__generate" {
            return Err(ToolError::UnknownTool(tool.into()));
        }
        let prompt = args
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if prompt.trim().is_empty() {
            return Err(ToolError::invalid("`prompt` must describe the image"));
        }
        if prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(ToolError::invalid(format!(
                "`prompt` is longer than {MAX_PROMPT_CHARS} characters"
            )));
        }
        match args.get("size") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if valid_size(s) => {}
            Some(v) => {
                return Err(ToolError::invalid(format!(
                    "`size` must be WIDTHxHEIGHT (e.g. 1024x1024) or auto, got {v}"
                )));
            }
        }
        match args.get("n") {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 && n <= u64::from(self.config.max_n.max(1)) => {}
                _ => {
                    return Err(ToolError::invalid(format!(
                        "`n` must be a whole number from 1 to {}, got {v}",
                        self.config.max_n.max(1)
                    )));
                }
            },
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        self.validate_input(tool, &args, &ctx)?;
        let Some(base) = self.config.endpoint() else {
            return Err(ToolError::Unavailable(NOT_CONFIGURED.into()));
        };
        let prompt = args
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let size = args
            .get("size")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| self.config.default_size.clone());
        let n = args.get("n").and_then(Value::as_u64).unwrap_or(1) as u32;
        let dir = save::output_dir(&ctx.workspace, &ctx.session_id)?;
        let request = client::GenerateRequest {
            prompt,
            size: size.clone(),
            n,
        };
        let answer = client::generate(&self.http, &self.config, &base, &request, &ctx).await?;
        let limit = self.config.max_image_mb.saturating_mul(1 << 20);
        let mut saved = Vec::new();
        let mut failed = Vec::new();
        // An endpoint that sends more than asked does not get to fill the disk.
        for (i, item) in answer.data.iter().take(n as usize).enumerate() {
            let bytes = match client::image_bytes(&self.http, item, limit, &ctx).await {
                Ok(b) => b,
                Err(e) => {
                    failed.push(format!("image {}: {e}", i + 1));
                    continue;
                }
            };
            match save::write_image(&ctx.workspace, &dir, &ctx.call_id, i + 1, &bytes) {
                Ok(s) => saved.push(s),
                Err(e) => failed.push(format!("image {}: {e}", i + 1)),
            }
        }
        if saved.is_empty() {
            return Err(ToolError::failed(if failed.is_empty() {
                "the images endpoint answered without any image".to_owned()
            } else {
                format!("no image could be saved: {}", failed.join("; "))
            }));
        }
        let mut v = json!({
            "images": saved.iter().map(|s| json!({"path": s.path, "format": s.format, "bytes": s.bytes})).collect::<Vec<_>>(),
            "size": size,
        });
        let m = v.as_object_mut().expect("object literal");
        if !self.config.model.is_empty() {
            m.insert("model".into(), Value::String(self.config.model.clone()));
        }
        if let Some(r) = answer.data.iter().find_map(|d| d.revised_prompt.clone()) {
            m.insert("revised_prompt".into(), Value::String(r));
        }
        if !failed.is_empty() {
            m.insert("errors".into(), json!(failed));
        }
        if (saved.len() as u32) < n {
            m.insert(
                "note".into(),
                Value::String(format!(
                    "{n} images were asked for; {} were saved",
                    saved.len()
                )),
            );
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for ok in ["1024x1024", "auto", "256x256", "1536x1024"] {
            assert!(valid_size(ok), "{ok}");
        }
        for bad in [
            "1024",
            "x1024",
            "1024x",
            "big",
            "1024x1024x2",
            "99999999x1",
            "-1x5",
        ] {
            assert!(!valid_size(bad), "{bad}");
        }
    }

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
