//! Sending a model request with retries: backoff with jitter on 429, 5xx and
//! connection errors, honouring Retry-After.

use super::{LlmError, is_context_overflow};
use rand::Rng;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How hard to try.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// First backoff.
    pub base_delay: Duration,
    /// Longest backoff (Retry-After is capped by it too).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(ra) = retry_after {
            return ra.min(self.max_delay);
        }
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(10))
            .min(self.max_delay);
        // Full jitter in [exp/2, exp].
        let half = exp / 2;
        let jitter = rand::rng().random_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(jitter)
    }
}

fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let v = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Sends the request built by `build` until it succeeds or retries run out.
pub async fn send(
    policy: &RetryPolicy,
    cancel: &CancellationToken,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, LlmError> {
    let mut last = String::new();
    for attempt in 0..policy.max_attempts.max(1) {
        let outcome = tokio::select! {
            r = build().send() => r,
            _ = cancel.cancelled() => return Err(LlmError::Cancelled),
        };
        let wait = match outcome {
            Ok(resp) if resp.status().is_success() => return Ok(resp),
            Ok(resp) => {
                let status = resp.status();
                let ra = retry_after(&resp);
                let body = resp.text().await.unwrap_or_default();
                let body: String = body.chars().take(2000).collect();
                if status.as_u16() == 429 || status.is_server_error() {
                    last = format!("HTTP {status}: {body}");
                    tracing::warn!(%status, attempt, "LLM request failed; retrying");
                    crate::metrics::get().llm_retry(if status.as_u16() == 429 {
                        "http_429"
                    } else {
                        "http_5xx"
                    });
                    policy.backoff(attempt, ra)
                } else if is_context_overflow(&body) {
                    return Err(LlmError::ContextOverflow(format!("HTTP {status}: {body}")));
                } else {
                    return Err(LlmError::BadRequest(format!("HTTP {status}: {body}")));
                }
            }
            Err(e) => {
                last = format!("{e}");
                if let Some(src) = std::error::Error::source(&e) {
                    last = format!("{last}: {src}");
                }
                tracing::warn!(error = %last, attempt, "LLM request failed; retrying");
                crate::metrics::get().llm_retry("connection");
                policy.backoff(attempt, None)
            }
        };
        if attempt + 1 < policy.max_attempts {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
            }
        }
    }
    Err(LlmError::Unavailable {
        attempts: policy.max_attempts.max(1),
        last,
    })
}
