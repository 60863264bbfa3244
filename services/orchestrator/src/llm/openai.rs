//! OpenAI-compatible Chat Completions with streaming tool calls (OpenAI,
//! Ollama, vLLM, llama.cpp's server).

use super::assemble::ToolCallAssembler;
use super::retry::{RetryPolicy, send};
use super::sse::SseReader;
use super::{LlmBackend, LlmDelta, LlmError, LlmRequest, LlmTurn};
use async_trait::async_trait;
use omicos_history::{HistoryItem, ToolCall as HistoryToolCall};
use serde::Serialize;
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
        let body = Body {
            model: self.model(req),
            messages: to_openai_messages(&req.system, &req.messages),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
        };
        // Borrowed strings and numbers only: it cannot fail.
        let body = serde_json::to_string(&body).unwrap_or_default();
        if req.tools.is_empty() {
            body
        } else {
            super::with_tools(body, req.tools.openai_json())
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

/// A Chat Completions request body (`tools` is added to it serialized).
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One message of the Chat Completions `messages` array: the chat fields of
/// a history item, borrowed (the private keys stay in the history).
#[derive(Debug, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum WireMessage<'a> {
    /// The system prompt.
    System {
        /// Its text.
        content: &'a str,
    },
    /// A user message.
    User {
        /// Its text.
        content: &'a str,
    },
    /// An answer, with the calls it asked for.
    Assistant {
        /// Its text.
        content: &'a str,
        /// Its calls, already in the chat shape.
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        tool_calls: &'a [HistoryToolCall],
    },
    /// A tool result.
    Tool {
        /// The call it answers.
        tool_call_id: &'a str,
        /// The envelope.
        content: &'a str,
    },
    /// A stored row of no known shape: its chat fields, as they are.
    #[serde(untagged)]
    Raw(serde_json::Map<String, Value>),
}

/// The fields of the chat format an unknown row may carry to the model.
const CHAT_FIELDS: [&str; 5] = ["role", "content", "tool_calls", "tool_call_id", "name"];

/// The `messages` array of a request: the system prompt, then the history
/// (compaction markers are never sent).
pub fn to_openai_messages<'a>(system: &'a str, items: &'a [HistoryItem]) -> Vec<WireMessage<'a>> {
    let mut out = Vec::with_capacity(items.len() + 1);
    out.push(WireMessage::System { content: system });
    for item in items {
        out.push(match item {
            HistoryItem::User(m) => WireMessage::User {
                content: &m.content,
            },
            HistoryItem::System(m) => WireMessage::System {
                content: &m.content,
            },
            HistoryItem::Assistant(m) => WireMessage::Assistant {
                content: &m.content,
                tool_calls: m.calls(),
            },
            HistoryItem::Tool(m) => WireMessage::Tool {
                tool_call_id: &m.tool_call_id,
                content: &m.content,
            },
            HistoryItem::Compaction(_) => continue,
            HistoryItem::Other(v) => WireMessage::Raw(
                CHAT_FIELDS
                    .iter()
                    .filter_map(|k| v.get(*k).map(|f| ((*k).to_owned(), f.clone())))
                    .collect(),
            ),
        });
    }
    out
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
            if let Some(id) = chunk.get("id").and_then(Value::as_str)
                && turn.response_id.is_empty()
            {
                turn.response_id = id.to_owned();
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
            if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
                finished = true;
                turn.finish_reason = f.as_str().unwrap_or_default().to_owned();
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

#[cfg(test)]
mod tests {
    use super::*;
    use omicos_history::AssistantMessage;
    use serde_json::json;

    #[test]
    fn history_converts_to_chat_messages_without_private_keys() {
        let items = vec![
            HistoryItem::user("hi"),
            HistoryItem::Assistant(AssistantMessage {
                content: "".into(),
                usage: Some(omicos_history::Usage::new(3, 4, 0.5)),
                tool_calls: Some(vec![HistoryToolCall::function("a", "t", "{\"x\":1}")]),
                ..Default::default()
            }),
            HistoryItem::tool_result("a", "r1", Some("spool/a.txt".into())),
            HistoryItem::from_value(json!({"role": "compaction", "summary": "s", "kept_from": 0,
                "tokens_before": 1, "tokens_after": 1, "messages_summarized": 0, "trigger": "auto", "at_ms": 1})),
            HistoryItem::Assistant(AssistantMessage {
                content: "cut".into(),
                interrupted: Some(true),
                ..Default::default()
            }),
            HistoryItem::from_value(json!({"role": "developer", "content": "x", "secret": 1})),
        ];
        let wire = serde_json::to_value(to_openai_messages("sys", &items)).unwrap();
        assert_eq!(
            wire,
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "t", "arguments": "{\"x\":1}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "r1"},
                {"role": "assistant", "content": "cut"},
                {"role": "developer", "content": "x"},
            ])
        );
    }
}
