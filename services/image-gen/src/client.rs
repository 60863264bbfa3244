//! The OpenAI images API as a client: one generation request with retries,
//! and the bytes of each returned image (inline base64 or a URL to fetch).

use crate::ImageGenConfig;
use base64::Engine;
use futures::StreamExt;
use omicos_toolkit::{CallCtx, ToolError};
use reqwest::{StatusCode, header::HeaderMap};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// What the tool asks the endpoint for.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: String,
    /// `WIDTHxHEIGHT` or `auto`.
    pub size: String,
    /// Number of images.
    pub n: u32,
}

/// One image of an answer: inline or by URL.
#[derive(Clone, Debug, Deserialize)]
pub struct ImageData {
    /// The image, base64-encoded.
    #[serde(default)]
    pub b64_json: Option<String>,
    /// Where the image can be downloaded (valid for a short while).
    #[serde(default)]
    pub url: Option<String>,
    /// The prompt as the model rewrote it (dall-e-3).
    #[serde(default)]
    pub revised_prompt: Option<String>,
}

/// The answer of `POST /images/generations`.
#[derive(Clone, Debug, Deserialize)]
pub struct ImagesResponse {
    /// The images.
    #[serde(default)]
    pub data: Vec<ImageData>,
}

/// Calls `POST {base}/images/generations`, retrying 429, 5xx and connection
/// failures with exponential backoff (or the server's `Retry-After`).
pub async fn generate(
    http: &reqwest::Client,
    cfg: &ImageGenConfig,
    base: &str,
    req: &GenerateRequest,
    ctx: &CallCtx,
) -> Result<ImagesResponse, ToolError> {
    let url = format!("{base}/images/generations");
    let mut body = json!({"prompt": req.prompt, "n": req.n, "size": req.size});
    if !cfg.model.trim().is_empty() {
        body["model"] = Value::String(cfg.model.trim().to_owned());
    }
    if !cfg.response_format.trim().is_empty() {
        body["response_format"] = Value::String(cfg.response_format.trim().to_owned());
    }
    let max_wait = cfg.retry_max_delay;
    // Room for n inline images at the size cap (base64 is 4/3 larger), plus the JSON around them.
    let body_limit = (cfg.max_image_mb << 20)
        .saturating_mul(u64::from(req.n.max(1)))
        .saturating_mul(4)
        / 3
        + (1 << 20);
    let mut attempt = 0u32;
    loop {
        let mut rb = http.post(&url).json(&body);
        if !cfg.api_key.trim().is_empty() {
            rb = rb.bearer_auth(cfg.api_key.trim());
        }
        let sent = tokio::select! {
            r = rb.send() => r,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        // Either a reason to retry (with the server's wish for the wait), or the outcome.
        let (why, asked_wait) = match sent {
            Err(e) if e.is_timeout() => {
                return Err(ToolError::failed(format!(
                    "the images endpoint did not answer within {}",
                    omicos_servicekit::config::duration::format(cfg.timeout)
                )));
            }
            Err(e) if e.is_builder() => {
                return Err(ToolError::Unavailable(format!(
                    "the images base URL `{base}` is not usable ({}); fix OMICOS_IMAGE_GEN_BASE_URL (e.g. https://api.openai.com/v1)",
                    error_chain(&e)
                )));
            }
            Err(e) => (
                format!(
                    "cannot reach the images endpoint at {base}: {}",
                    error_chain(&e)
                ),
                None,
            ),
            Ok(resp) => {
                let status = resp.status();
                let headers = resp.headers().clone();
                let text = tokio::select! {
                    t = read_capped(resp, body_limit) => t,
                    _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
                };
                if status.is_success() {
                    let text = text.map_err(|e| {
                        ToolError::failed(format!("reading the images endpoint's answer: {e}"))
                    })?;
                    return serde_json::from_slice::<ImagesResponse>(&text).map_err(|e| {
                        ToolError::failed(format!("the images endpoint answered with something that is not an images response: {e}"))
                    });
                }
                let detail = text.ok().map(|t| api_message(&t)).unwrap_or_default();
                if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                    (
                        format!("the images endpoint answered {status}{detail}"),
                        retry_after(&headers),
                    )
                } else {
                    return Err(ToolError::failed(match status {
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => format!(
                            "the images endpoint refused the API key ({status}{detail}); check OMICOS_IMAGE_GEN_API_KEY or OPENAI_API_KEY"
                        ),
                        StatusCode::NOT_FOUND => format!(
                            "{url} does not exist ({status}{detail}); OMICOS_IMAGE_GEN_BASE_URL should end with the API version, e.g. /v1"
                        ),
                        _ => format!("the images endpoint refused the request ({status}{detail})"),
                    }));
                }
            }
        };
        if attempt >= cfg.max_retries {
            return Err(ToolError::failed(format!(
                "{why}; gave up after {} attempts",
                attempt + 1
            )));
        }
        let backoff = cfg.retry_base_delay.saturating_mul(1u32 << attempt.min(16));
        let wait = asked_wait.unwrap_or(backoff);
        if wait > max_wait {
            return Err(ToolError::failed(format!(
                "{why}; the endpoint asks to wait {} s before retrying, longer than this tool waits: try again later",
                wait.as_secs()
            )));
        }
        attempt += 1;
        tracing::info!(attempt, wait_ms = wait.as_millis() as u64, %why, "image generation: retrying");
        ctx.events
            .output(
                "stderr",
                format!(
                    "{why}; retrying in {:.1} s (attempt {attempt} of {})\n",
                    wait.as_secs_f64(),
                    cfg.max_retries
                ),
            )
            .await;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        }
    }
}

/// `Retry-After` (seconds or an HTTP date) or OpenAI's `retry-after-ms`.
pub fn retry_after(h: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = h
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(s) = v.parse::<f64>() {
        return (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(1e9)));
    }
    let when = httpdate_parse(v)?;
    Some(
        when.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form HTTP requires.
fn httpdate_parse(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, mon, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == mon)? as u64
        + 1;
    let year: u64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, mi, se] = hms.as_slice() else {
        return None;
    };
    if !(1970..=9999).contains(&year) || !(1..=31).contains(&day) || *h > 23 || *mi > 59 || *se > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + mi * 60 + se))
}

/// `: <message>` from an OpenAI-style error body, or a short excerpt.
fn api_message(body: &[u8]) -> String {
    let msg = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&body[..body.len().min(300)])
                .trim()
                .to_owned()
        });
    if msg.is_empty() {
        String::new()
    } else {
        format!(": {}", msg.chars().take(500).collect::<String>())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Reads a body, refusing more than `limit` bytes (checked as it streams).
async fn read_capped(resp: reqwest::Response, limit: u64) -> Result<Vec<u8>, String> {
    if let Some(len) = resp.content_length()
        && len > limit
    {
        return Err(format!(
            "{} MiB is more than the {} MiB limit",
            len.div_ceil(1 << 20),
            limit >> 20
        ));
    }
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| error_chain(&e))?;
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(format!(
                "more than the {} MiB limit",
                limit.div_ceil(1 << 20)
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The bytes of one image, decoded or downloaded, at most `limit` bytes.
pub async fn image_bytes(
    http: &reqwest::Client,
    item: &ImageData,
    limit: u64,
    ctx: &CallCtx,
) -> Result<Vec<u8>, String> {
    if let Some(b64) = item.b64_json.as_deref().filter(|s| !s.is_empty()) {
        // Refuse before decoding: base64 is 4 characters per 3 bytes.
        if (b64.len() as u64) / 4 * 3 > limit {
            return Err(format!(
                "the image is larger than the {} MiB limit",
                limit >> 20
            ));
        }
        let cleaned: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        return base64::engine::general_purpose::STANDARD
            .decode(cleaned.as_bytes())
            .map_err(|e| format!("the endpoint's b64_json is not valid base64: {e}"));
    }
    let Some(url) = item.url.as_deref().filter(|s| !s.is_empty()) else {
        return Err("the endpoint gave neither b64_json nor url".into());
    };
    let parsed = url::Url::parse(url)
        .map_err(|e| format!("the endpoint's image url `{url}` is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "the endpoint's image url uses `{}`, not http(s)",
            parsed.scheme()
        ));
    }
    let fetch = async {
        let resp = http
            .get(parsed)
            .send()
            .await
            .map_err(|e| format!("downloading the image failed: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("downloading the image answered {}", resp.status()));
        }
        read_capped(resp, limit)
            .await
            .map_err(|e| format!("the image download is too large or broke off: {e}"))
    };
    tokio::select! {
        r = fetch => r,
        _ = ctx.cancel.cancelled() => Err("cancelled".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn http_dates() {
        let t = httpdate_parse("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            784_111_777
        );
        assert!(httpdate_parse("Sun, 06 Nov 1994 08:49:37 PST").is_none());
        assert!(httpdate_parse("Sun, 32 Nov 1994 08:49:37 GMT").is_none());
    }

    #[test]
    fn api_messages() {
        assert_eq!(
            api_message(br#"{"error":{"message":"Rate limit reached"}}"#),
            ": Rate limit reached"
        );
        assert_eq!(api_message(b""), "");
        assert_eq!(api_message(b"oops"), ": oops");
    }
}
