//! Anthropic Messages with streaming `tool_use` (`input_json_delta`).

use super::retry::{RetryPolicy, send};
use super::sse::SseReader;
use super::{LlmBackend, LlmDelta, LlmError, LlmRequest, LlmTurn, ToolCall, ToolDef};
use async_trait::async_trait;
use omicos_history::HistoryItem;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The Anthropic backend.
pub struct AnthropicBackend {
    http: reqwest::Client,
    base_url: String,
    api_key: String,
    model: String,
    max_tokens: u32,
    retry: RetryPolicy,
    idle_timeout: Duration,
}

impl AnthropicBackend {
    /// `base_url` like `https://api.anthropic.com` (with or without `/v1`).
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
            max_tokens: 8192,
            retry,
            idle_timeout,
        }
    }

    fn url(&self) -> String {
        if self.base_url.ends_with("/v1") {
            format!("{}/messages", self.base_url)
        } else {
            format!("{}/v1/messages", self.base_url)
        }
    }
}

/// The Anthropic `tools` array for these tools.
pub fn tools_json(tools: &[ToolDef]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect(),
    )
}

/// Converts the history into Anthropic messages: tool calls become
/// `tool_use` blocks, tool results `tool_result` blocks in a user message,
/// and consecutive messages of one role are merged (Anthropic wants
/// alternation). Compaction markers are never sent; a system message or a
/// row of no known shape goes as user text.
pub fn to_anthropic_messages(items: &[HistoryItem]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        let (role, blocks) = match item {
            HistoryItem::Assistant(m) => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"type": "text", "text": m.content}));
                }
                for tc in m.calls() {
                    let args = tc.arguments();
                    let input = serde_json::from_str::<Value>(args)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({"_raw_arguments": args}));
                    blocks.push(
                        json!({"type": "tool_use", "id": tc.id, "name": tc.name(), "input": input}),
                    );
                }
                ("assistant", blocks)
            }
            HistoryItem::Tool(m) => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content,
                })],
            ),
            HistoryItem::Compaction(_) => continue,
            other => {
                let text = other.content().unwrap_or_default();
                ("user", vec![json!({"type": "text", "text": text})])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(content) = last["content"].as_array_mut() {
                    content.extend(blocks);
                }
            }
            _ => out.push(json!({"role": role, "content": blocks})),
        }
    }
    out
}

#[async_trait]
impl LlmBackend for AnthropicBackend {
    async fn complete(
        &self,
        req: &LlmRequest,
        deltas: mpsc::Sender<LlmDelta>,
        cancel: &CancellationToken,
    ) -> Result<LlmTurn, LlmError> {
        let model = if req.model.is_empty() {
            self.model.clone()
        } else {
            req.model.clone()
        };
        let body = json!({
            "model": model,
            "max_tokens": self.max_tokens,
            "system": req.system,
            "messages": to_anthropic_messages(&req.messages),
            "stream": true,
        });
        let body = if req.tools.is_empty() {
            body.to_string()
        } else {
            super::with_tools(body.to_string(), req.tools.anthropic_json())
        };
        let url = self.url();
        let resp = send(&self.retry, cancel, || {
            self.http
                .post(&url)
                .header("x-api-key", &self.api_key)
                .header("anthropic-version", "2023-06-01")
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
        })
        .await?;
        let mut reader = SseReader::new(Box::pin(resp.bytes_stream()));
        let mut turn = LlmTurn {
            model,
            ..Default::default()
        };
        // index → (id, name, partial json); kept in block order.
        let mut tools: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
        let mut open_tool_blocks = 0usize;
        let mut whole_input = std::collections::HashSet::new();
        let mut stopped = false;
        loop {
            let Some(ev) = super::next_event(&mut reader, self.idle_timeout, cancel).await? else {
                break;
            };
            let data: Value = match serde_json::from_str(&ev.data) {
                Ok(v) => v,
                Err(_) => continue,
            };
            let kind = data
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or(ev.event.as_str());
            match kind {
                "message_start" => {
                    let m = &data["message"];
                    if let Some(n) = m["usage"]["input_tokens"].as_u64() {
                        turn.input_tokens = n;
                    }
                    if let Some(model) = m["model"].as_str() {
                        turn.model = model.to_owned();
                    }
                    if let Some(id) = m["id"].as_str() {
                        turn.response_id = id.to_owned();
                    }
                }
                "content_block_start" => {
                    let idx = data["index"].as_u64().unwrap_or(0);
                    let block = &data["content_block"];
                    if block["type"] == "tool_use" {
                        open_tool_blocks += 1;
                        // A whole input in the start block (no deltas follow) counts too.
                        let input = block
                            .get("input")
                            .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()))
                            .map(Value::to_string)
                            .unwrap_or_default();
                        if !input.is_empty() {
                            whole_input.insert(idx);
                        }
                        tools.insert(
                            idx,
                            (
                                block["id"].as_str().unwrap_or_default().to_owned(),
                                block["name"].as_str().unwrap_or_default().to_owned(),
                                input,
                            ),
                        );
                    } else if block["type"] == "thinking" {
                        if let Some(t) = block["thinking"].as_str() {
                            turn.reasoning.push_str(t);
                        }
                    } else if let Some(t) = block["text"].as_str().filter(|t| !t.is_empty()) {
                        turn.text.push_str(t);
                        let _ = deltas.send(LlmDelta::Text(t.to_owned())).await;
                    }
                }
                "content_block_delta" => {
                    let idx = data["index"].as_u64().unwrap_or(0);
                    let d = &data["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => {
                            if let Some(t) = d["text"].as_str() {
                                turn.text.push_str(t);
                                let _ = deltas.send(LlmDelta::Text(t.to_owned())).await;
                            }
                        }
                        Some("input_json_delta") => {
                            if let Some(entry) = tools.get_mut(&idx) {
                                let piece = d["partial_json"].as_str().unwrap_or_default();
                                if !piece.is_empty() && whole_input.remove(&idx) {
                                    // The start block carried the input: the deltas restate it.
                                    entry.2.clear();
                                }
                                entry.2.push_str(piece);
                            }
                        }
                        Some("thinking_delta") => {
                            if let Some(t) = d["thinking"].as_str() {
                                turn.reasoning.push_str(t);
                            }
                        }
                        _ => {}
                    }
                }
                "content_block_stop" => {
                    let idx = data["index"].as_u64().unwrap_or(0);
                    if tools.contains_key(&idx) {
                        open_tool_blocks = open_tool_blocks.saturating_sub(1);
                    }
                }
                "message_delta" => {
                    if let Some(r) = data["delta"]["stop_reason"].as_str() {
                        turn.finish_reason = r.to_owned();
                    }
                    if let Some(n) = data["usage"]["output_tokens"].as_u64() {
                        turn.output_tokens = n;
                    }
                    // Gateways (LiteLLM) that learn the prompt's size only at
                    // the end send it here; message_start had 0.
                    if let Some(n) = data["usage"]["input_tokens"].as_u64().filter(|n| *n > 0) {
                        turn.input_tokens = n;
                    }
                }
                "message_stop" => {
                    stopped = true;
                    break;
                }
                "error" => {
                    let msg = data["error"]["message"]
                        .as_str()
                        .unwrap_or("unknown error")
                        .to_owned();
                    if super::is_context_overflow(&msg) {
                        return Err(LlmError::ContextOverflow(msg));
                    }
                    return Err(LlmError::StreamBroken(msg));
                }
                _ => {}
            }
        }
        if !stopped && (open_tool_blocks > 0 || !tools.is_empty()) {
            return Err(LlmError::StreamBroken(
                "the stream ended in the middle of a tool call".into(),
            ));
        }
        if !stopped && turn.text.is_empty() {
            return Err(LlmError::StreamBroken(
                "the stream ended before any answer".into(),
            ));
        }
        turn.tool_calls = merge_split_blocks(tools)
            .into_iter()
            .map(|(id, name, args)| ToolCall {
                id: if id.is_empty() {
                    format!("toolu_{}", uuid::Uuid::new_v4().simple())
                } else {
                    id
                },
                name,
                arguments: if args.trim().is_empty() {
                    "{}".into()
                } else {
                    args
                },
            })
            .collect();
        Ok(turn)
    }
}

/// One call's blocks joined: tool_use blocks that share an id are one call
/// (LiteLLM's `/v1/messages` before an OpenAI-compatible model splits one
/// streamed call over several blocks, some holding only whitespace or
/// nothing). Their arguments are the blocks' `partial_json` joined in index
/// order; the first name given wins. Blocks without an id stay apart.
fn merge_split_blocks(
    tools: std::collections::BTreeMap<u64, (String, String, String)>,
) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::with_capacity(tools.len());
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for (id, name, args) in tools.into_values() {
        match (!id.is_empty()).then(|| by_id.get(&id).copied()).flatten() {
            Some(at) => {
                let call = &mut out[at];
                if call.1.is_empty() {
                    call.1 = name;
                }
                call.2.push_str(&args);
            }
            None => {
                if !id.is_empty() {
                    by_id.insert(id.clone(), out.len());
                }
                out.push((id, name, args));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_that_share_an_id_are_one_call() {
        let mut tools = std::collections::BTreeMap::new();
        tools.insert(0, ("t1".into(), "shell".into(), "{\"command\":".into()));
        tools.insert(1, ("t1".into(), String::new(), "  ".into()));
        tools.insert(2, ("t1".into(), "shell".into(), String::new()));
        tools.insert(3, ("t1".into(), "shell".into(), " \"ls\"}".into()));
        tools.insert(4, ("t2".into(), "think".into(), "{}".into()));
        tools.insert(5, (String::new(), "a".into(), "{}".into()));
        tools.insert(6, (String::new(), "b".into(), "{}".into()));
        let calls = merge_split_blocks(tools);
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert_eq!(calls[0].0, "t1");
        assert_eq!(calls[0].1, "shell");
        let v: Value = serde_json::from_str(&calls[0].2).unwrap();
        assert_eq!(v["command"], "ls");
        assert_eq!(calls[1], ("t2".into(), "think".into(), "{}".into()));
        assert_eq!((calls[2].1.as_str(), calls[3].1.as_str()), ("a", "b"));
    }

    #[test]
    fn history_converts_and_merges() {
        let msgs: Vec<HistoryItem> = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "", "usage": {"input_tokens": 1, "output_tokens": 2, "cost": 0.0}, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "t", "arguments": "{\"x\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "t", "arguments": "not json"}}]}),
            json!({"role": "tool", "tool_call_id": "a", "content": "r1", "spool_path": "s/a.txt"}),
            json!({"role": "tool", "tool_call_id": "b", "content": "r2"}),
            json!({"role": "compaction", "summary": "s", "kept_from": 0, "tokens_before": 1,
                   "tokens_after": 1, "messages_summarized": 0, "trigger": "auto", "at_ms": 1}),
            json!({"role": "user", "content": "next"}),
            json!({"role": "assistant", "content": "cut", "interrupted": true}),
        ]
        .into_iter()
        .map(HistoryItem::from_value)
        .collect();
        let out = to_anthropic_messages(&msgs);
        assert_eq!(out.len(), 4);
        assert_eq!(out[1]["content"][0]["type"], "tool_use");
        assert_eq!(out[1]["content"][0]["input"]["x"], 1);
        assert_eq!(out[1]["content"][1]["input"]["_raw_arguments"], "not json");
        assert_eq!(out[2]["role"], "user");
        assert_eq!(out[2]["content"].as_array().unwrap().len(), 3);
        assert_eq!(
            out[2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "a", "content": "r1"}),
            "private keys stay in the history"
        );
        assert_eq!(
            out[3],
            json!({"role": "assistant", "content": [{"type": "text", "text": "cut"}]})
        );
    }
}
