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
pub mod config;
pub mod save;

pub use config::{Config, ImageGenConfig, OPENAI_BASE_URL};

use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, tool};
use serde_json::{Value, json};
use std::time::Duration;

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
            .timeout(config.timeout)
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
}
