//! OpenAI-compatible Chat Completions with streaming tool calls (OpenAI,
//! Ollama, vLLM, llama.cpp's server).

use super::assemble::ToolCallAssembler;
use super::retry::{RetryPolicy, send};
use super::sse::SseReader;
use super::{LlmBackend, LlmDelta, LlmError, LlmRequest, LlmTurn};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The OpenAI-compatible backend.
pub struct OpenAiBackend {
    http: reqwest::Client,
    base_url: String,
    api_key: String,
    model: String,
    retry: RetryPolicy,
    idle_timeout: Duration,
}

impl OpenAiBackend {
    /// `base_url` ends before `/chat/completions` (e.g. `https://api.openai.com/v1`).
    pub fn new(
        base_url: &str,
        api_key: &str,
        model: &str,
        retry: RetryPolicy,
        idle_timeout: Duration,
    ) -> Self {
        let http = super::http_client();
        Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key: api_key.to_owned(),
            model: model.to_owned(),
            retry,
            idle_timeout,
        }
    }

    /// The request body, serialized (the tools' JSON is the set's, made once).
    fn body(&self, req: &LlmRequest) -> String {
        let mut messages = vec![json!({"role": "system", "content": req.system})];
        messages.extend(req.messages.iter().cloned());
        let body = json!({
            "model": self.model(req),
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if req.tools.is_empty() {
            body.to_string()
        } else {
            super::with_tools(&body, req.tools.openai_json())
        }
    }

    fn model<'a>(&'a self, req: &'a LlmRequest) -> &'a str {
        if req.model.is_empty() {
            &self.model
        } else {
            &req.model
        }
    }
}

/// The OpenAI `tools[]` array for these tools.
pub fn tools_json(tools: &[super::ToolDef]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect(),
    )
}

#[async_trait]
impl LlmBackend for OpenAiBackend {
    async fn complete(
        &self,
        req: &LlmRequest,
        deltas: mpsc::Sender<LlmDelta>,
        cancel: &CancellationToken,
    ) -> Result<LlmTurn, LlmError> {
        let url = format!("{}/chat/completions", self.base_url);
        let body = self.body(req);
        let resp = send(&self.retry, cancel, || {
            let mut b = self
                .http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if !self.api_key.is_empty() {
                b = b.bearer_auth(&self.api_key);
            }
            b
        })
        .await?;
        let mut reader = SseReader::new(Box::pin(resp.bytes_stream()));
        let mut turn = LlmTurn {
            model: self.model(req).to_owned(),
            ..Default::default()
        };
        // Every server shape of streamed calls is handled in one place.
        let mut calls = ToolCallAssembler::default();
        let mut finished = false;
        loop {
            let Some(ev) = super::next_event(&mut reader, self.idle_timeout, cancel).await? else {
                break;
            };
            let data = ev.data.trim();
            if data == "[DONE]" {
                finished = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => {
                    return Err(LlmError::StreamBroken(format!(
                        "bad JSON chunk: {e}: {}",
                        trunc(data)
                    )));
                }
            };
            if let Some(err) = chunk.get("error") {
                let msg = err
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| err.to_string());
                if super::is_context_overflow(&msg) {
                    return Err(LlmError::ContextOverflow(msg));
                }
                return Err(LlmError::StreamBroken(msg));
            }
            if let Some(m) = chunk.get("model").and_then(Value::as_str) {
                turn.model = m.to_owned();
            }
            if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
                turn.input_tokens = u
                    .get("prompt_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(turn.input_tokens);
                turn.output_tokens = u
                    .get("completion_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(turn.output_tokens);
            }
            let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
                continue;
            };
            if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
                finished = true;
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                turn.text.push_str(text);
                let _ = deltas.send(LlmDelta::Text(text.to_owned())).await;
            }
            // Reasoning (DeepSeek, vLLM, Ollama, llama.cpp): never part of the
            // answer text. One field only: some servers send both with the same text.
            if let Some(r) = ["reasoning_content", "reasoning"]
                .iter()
                .find_map(|f| delta.get(*f).and_then(Value::as_str))
            {
                turn.reasoning.push_str(r);
            }
            calls.delta(delta);
        }
        if !finished && !calls.is_empty() {
            return Err(LlmError::StreamBroken(
                "the stream ended in the middle of a tool call".into(),
            ));
        }
        if !finished && turn.text.is_empty() {
            return Err(LlmError::StreamBroken(
                "the stream ended before any answer".into(),
            ));
        }
        turn.tool_calls = calls.finish();
        Ok(turn)
    }
}

fn trunc(s: &str) -> String {
    s.chars().take(200).collect()
}
