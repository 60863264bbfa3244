//! A scripted fake LLM server speaking the real wire formats: OpenAI Chat
//! Completions SSE (`/v1/chat/completions`) and Anthropic Messages SSE
//! (`/v1/messages`). Each request takes the next scripted reply; every request
//! body is recorded so tests can check the conversation invariants.

use axum::{
    Router, body::Body, extract::State, http::StatusCode, response::Response, routing::post,
};
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::stream_shapes::{Reasoning, Shape};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Plain text.
    Text(String),
    /// Optional text, then tool calls (id, name, raw argument string).
    Tools(String, Vec<(String, String, String)>),
    /// An HTTP error with a body (and optional Retry-After seconds).
    Status(u16, String, Option<u32>),
    /// Starts a tool call and closes the stream in the middle of it.
    CutMidToolCall,
    /// Streams text slowly: (text, delay between chunks).
    Slow(String, Duration),
    /// Text in `chunks` pieces with `delay` before each, then tool calls
    /// (id, name, raw argument string), as a model that thinks aloud and then acts.
    Streamed {
        /// The text.
        text: String,
        /// How many pieces the text is sent in.
        chunks: usize,
        /// The pause before each piece.
        delay: Duration,
        /// The tool calls after the text (none: the model is done).
        calls: Vec<(String, String, String)>,
    },
    /// An answer streamed the way one real server streams it (OpenAI side;
    /// the Anthropic side sends it as [`Reply::Tools`]).
    Shaped {
        /// The server's shape.
        shape: Shape,
        /// Reasoning before the answer.
        reasoning: Option<Reasoning>,
        /// The answer text.
        text: String,
        /// The tool calls (id, name, raw argument string); the id is the
        /// server's own (see [`crate::stream_shapes::call_id`]).
        calls: Vec<(String, String, String)>,
    },
    /// A stream captured from a real server or gateway, sent byte for byte
    /// as `text/event-stream` (tests/stream-captures/).
    Raw(String),
}

/// A captured SSE body, sent as it was captured.
fn raw_sse(body: String) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(body))
        .expect("a raw SSE response")
}

/// Decides the reply to a request from its body, once the script is used up.
pub type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// The replies of a script file in the format of `ui/tests/stack-script.json`:
/// `{"replies": [{"text", "chunks", "chunk_delay_ms", "tool_calls": [{"id",
/// "name", "arguments"}]}]}`, where `arguments` is a JSON value (sent as its
/// text) or a string (sent as it is).
pub fn script_from_json(script: &Value) -> Result<Vec<Reply>, String> {
    let replies = script["replies"]
        .as_array()
        .ok_or("the script has no `replies` array")?;
    replies
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let text = r["text"].as_str().unwrap_or_default().to_owned();
            let chunks = r["chunks"].as_u64().unwrap_or(1).max(1) as usize;
            let delay = Duration::from_millis(r["chunk_delay_ms"].as_u64().unwrap_or(0));
            let calls = r["tool_calls"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    let field = |k: &str| {
                        c[k].as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("reply {i}: a tool call without `{k}`"))
                    };
                    let args = match &c["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".to_owned(),
                        v => v.to_string(),
                    };
                    let args = expand_repeats(&args).map_err(|e| format!("reply {i}: {e}"))?;
                    Ok((field("id")?, field("name")?, args))
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(Reply::Streamed {
                text,
                chunks,
                delay,
                calls,
            })
        })
        .collect()
}

/// A script's tool-call arguments may hold `{{repeat:N:TEXT}}` (TEXT without
/// `}`): TEXT N times, so a script can send a huge argument without holding
/// it (the browser tests' cut value).
fn expand_repeats(args: &str) -> Result<String, String> {
    const OPEN: &str = "{{repeat:";
    let mut out = String::with_capacity(args.len());
    let mut rest = args;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let body = &rest[at + OPEN.len()..];
        let end = body
            .find("}}")
            .ok_or("`{{repeat:` without its closing `}}`")?;
        let (n, text) = body[..end]
            .split_once(':')
            .ok_or("`{{repeat:N:TEXT}}` needs N and TEXT")?;
        let n: usize = n
            .parse()
            .map_err(|_| format!("`{{{{repeat:{n}:…}}}}`: {n} is not a count"))?;
        if n.saturating_mul(text.len()) > 64 << 20 {
            return Err("`{{repeat:…}}` over 64 MiB".into());
        }
        out.push_str(&text.repeat(n));
        rest = &body[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What a scripted text may ask to be filled in from the request it answers,
/// so a test that sees only the answer (the browser tests) can check what
/// the model was sent: `{{user_messages}}` becomes the request's user
/// messages, oldest first, joined with ` | `.
const USER_MESSAGES: &str = "{{user_messages}}";

fn fill_in(reply: Reply, body: &Value) -> Reply {
    match reply {
        Reply::Streamed {
            text,
            chunks,
            delay,
            calls,
        } if text.contains(USER_MESSAGES) => Reply::Streamed {
            text: text.replace(USER_MESSAGES, &user_messages(body).join(" | ")),
            chunks,
            delay,
            calls,
        },
        r => r,
    }
}

/// A responder for [`FakeLlm::with_responder`]: a user message `CALL <tool>
/// <json>` becomes that one tool call (ids `call_0`, `call_1`, …); after its
/// result, or for any other message, the model says "done". For tests that
/// drive tools from the message they send.
pub fn call_per_message() -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let n = std::sync::atomic::AtomicUsize::new(0);
    move |body: &Value| {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        let text = last["content"].as_str().unwrap_or_default().to_owned();
        if last["role"] != "user" {
            return Reply::Text("done".into());
        }
        let id = format!(
            "call_{}",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        match text
            .strip_prefix("CALL ")
            .and_then(|rest| rest.split_once(' '))
        {
            Some((tool, args)) => Reply::Tools(String::new(), vec![(id, tool.into(), args.into())]),
            None => Reply::Text("done".into()),
        }
    }
}

/// The text of a request's user messages, oldest first (OpenAI: `content`
/// as a string or text parts; Anthropic: text blocks, tool results left out).
pub fn user_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| match &m["content"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => {
                let t: Vec<&str> = parts
                    .iter()
                    .filter(|p| p["type"] == "text")
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                (!t.is_empty()).then(|| t.join(""))
            }
            _ => None,
        })
        .collect()
}

/// A recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `openai` or `anthropic`.
    pub format: &'static str,
    /// The JSON body.
    pub body: Value,
    /// Its size in the fake's tokens ([`count_tokens`]).
    pub tokens: u64,
    /// Refused as longer than the window.
    pub refused: bool,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    requests: Vec<Recorded>,
    responder: Option<Responder>,
    window: Option<u64>,
}

/// The fake's tokenizer: one token per 3.5 bytes of the JSON of the request's
/// system prompt, messages and tools (denser than the orchestrator's own
/// estimate, so it must learn from the reported usage).
pub fn count_tokens(body: &Value) -> u64 {
    let bytes: usize = ["system", "messages", "tools"]
        .iter()
        .filter_map(|k| body.get(*k))
        .map(|v| v.to_string().len())
        .sum();
    (bytes as u64 * 2).div_ceil(7)
}

/// The fake server.
#[derive(Clone)]
pub struct FakeLlm {
    inner: Arc<Mutex<Inner>>,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

impl FakeLlm {
    /// Starts on 127.0.0.1:0 with `script`.
    pub async fn start(script: Vec<Reply>) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            script: script.into(),
            ..Default::default()
        }));
        let app = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake llm");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            inner,
            base: format!("http://{addr}"),
        }
    }

    /// Answers every request after the script with `f(body)`.
    pub fn with_responder(self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        self.inner.lock().unwrap().responder = Some(Arc::new(f));
        self
    }

    /// Refuses every request longer than `tokens` ([`count_tokens`]) with a
    /// real 400 context-length error (OpenAI's body, or Anthropic's), and
    /// reports each request's counted size as its usage.
    pub fn with_window(self, tokens: u64) -> Self {
        self.inner.lock().unwrap().window = Some(tokens);
        self
    }

    /// The OpenAI base URL (`…/v1`).
    pub fn openai_url(&self) -> String {
        format!("{}/v1", self.base)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Checks, for every recorded request, that each tool call is answered
    /// exactly once and no tool result is an orphan. Panics with details.
    pub fn assert_invariants(&self) {
        for (i, r) in self.requests().iter().enumerate() {
            let (calls, results) = match r.format {
                "openai" => openai_ids(&r.body),
                _ => anthropic_ids(&r.body),
            };
            for c in &calls {
                let n = results.iter().filter(|x| *x == c).count();
                assert_eq!(
                    n, 1,
                    "request {i}: tool call {c} answered {n} times\n{}",
                    r.body
                );
            }
            for x in &results {
                assert!(
                    calls.contains(x),
                    "request {i}: orphan tool result {x}\n{}",
                    r.body
                );
            }
        }
    }
}

fn openai_ids(body: &Value) -> (Vec<String>, Vec<String>) {
    let mut calls = vec![];
    let mut results = vec![];
    for m in body["messages"].as_array().into_iter().flatten() {
        for tc in m["tool_calls"].as_array().into_iter().flatten() {
            calls.push(tc["id"].as_str().unwrap_or_default().to_owned());
        }
        if m["role"] == "tool" {
            results.push(m["tool_call_id"].as_str().unwrap_or_default().to_owned());
        }
    }
    (calls, results)
}

fn anthropic_ids(body: &Value) -> (Vec<String>, Vec<String>) {
    let mut calls = vec![];
    let mut results = vec![];
    for m in body["messages"].as_array().into_iter().flatten() {
        for b in m["content"].as_array().into_iter().flatten() {
            match b["type"].as_str() {
                Some("tool_use") => calls.push(b["id"].as_str().unwrap_or_default().to_owned()),
                Some("tool_result") => {
                    results.push(b["tool_use_id"].as_str().unwrap_or_default().to_owned())
                }
                _ => {}
            }
        }
    }
    (calls, results)
}

type Shared = State<Arc<Mutex<Inner>>>;

/// What to answer a request with, and its counted size (a usage to report
/// when a window is set).
struct Next {
    reply: Reply,
    prompt_tokens: Option<u64>,
}

fn next(inner: &Arc<Mutex<Inner>>, format: &'static str, body: Value) -> Next {
    let mut g = inner.lock().unwrap();
    let tokens = count_tokens(&body);
    if let Some(w) = g.window
        && tokens > w
    {
        g.requests.push(Recorded {
            format,
            body,
            tokens,
            refused: true,
        });
        let msg = format!(
            "This model's maximum context length is {w} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."
        );
        let body = match format {
            "openai" => json!({"error": {"message": msg, "type": "invalid_request_error",
                                         "param": "messages", "code": "context_length_exceeded"}}),
            _ => json!({"type": "error", "error": {"type": "invalid_request_error",
                        "message": format!("prompt is too long: {tokens} tokens > {w} maximum")}}),
        };
        return Next {
            reply: Reply::Status(400, body.to_string(), None),
            prompt_tokens: None,
        };
    }
    let reply = match g.script.pop_front() {
        Some(r) => fill_in(r, &body),
        None => match &g.responder {
            Some(f) => f(&body),
            None => Reply::Text("(fake LLM script exhausted)".into()),
        },
    };
    g.requests.push(Recorded {
        format,
        body,
        tokens,
        refused: false,
    });
    Next {
        reply,
        prompt_tokens: g.window.map(|_| tokens),
    }
}

fn sse(frames: Vec<(Option<&'static str>, Value)>, done: bool) -> Vec<String> {
    let mut out: Vec<String> = frames
        .into_iter()
        .map(|(ev, data)| match ev {
            Some(e) => format!("event: {e}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect();
    if done {
        out.push("data: [DONE]\n\n".into());
    }
    out
}

fn stream_response(chunks: Vec<String>, delay: Duration) -> Response {
    let s = futures::stream::unfold(chunks.into_iter(), move |mut it| async move {
        let c = it.next()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(c)), it))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

/// Like [`stream_response`], each chunk after its own pause.
fn timed_response(chunks: Vec<(String, Duration)>) -> Response {
    let s = futures::stream::unfold(chunks.into_iter(), |mut it| async move {
        let (c, delay) = it.next()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(c)), it))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

/// `text` cut into `n` pieces of about the same length (fewer when it is short).
fn n_pieces(text: &str, n: usize) -> Vec<String> {
    let len = text.chars().count();
    if len == 0 {
        return vec![];
    }
    pieces(text, len.div_ceil(n.max(1)))
}

fn error_response(status: u16, body: String, retry_after: Option<u32>) -> Response {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json");
    if let Some(s) = retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(Body::from(body)).unwrap()
}

fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

async fn openai(state: Shared, body: axum::Json<Value>) -> Response {
    let Next {
        reply,
        prompt_tokens,
    } = next(&state.0, "openai", body.0);
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-gpt",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let prompt = prompt_tokens.unwrap_or(11);
    let usage = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-gpt", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}});
    match reply {
        Reply::Raw(body) => raw_sse(body),
        Reply::Shaped {
            shape,
            reasoning,
            text,
            calls,
        } => {
            let (deltas, finish) =
                crate::stream_shapes::deltas(shape, reasoning.as_ref(), &text, &calls);
            let mut frames: Vec<(Option<&'static str>, Value)> = deltas
                .into_iter()
                .map(|d| (None, chunk(d, Value::Null)))
                .collect();
            frames.push((None, chunk(json!({}), json!(finish))));
            if crate::stream_shapes::reports_usage(shape) {
                frames.push((None, usage));
            }
            stream_response(sse(frames, true), Duration::ZERO)
        }
        Reply::Text(t) => {
            let mut frames = vec![(
                None,
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            )];
            for p in pieces(&t, 5) {
                frames.push((None, chunk(json!({"content": p}), Value::Null)));
            }
            frames.push((None, chunk(json!({}), json!("stop"))));
            frames.push((None, usage));
            stream_response(sse(frames, true), Duration::ZERO)
        }
        Reply::Slow(t, d) => {
            let mut frames = vec![];
            for p in pieces(&t, 3) {
                frames.push((None, chunk(json!({"content": p}), Value::Null)));
            }
            frames.push((None, chunk(json!({}), json!("stop"))));
            stream_response(sse(frames, true), d)
        }
        Reply::Tools(text, calls) => {
            let mut frames = vec![];
            if !text.is_empty() {
                frames.push((
                    None,
                    chunk(json!({"role": "assistant", "content": text}), Value::Null),
                ));
            }
            for (i, (id, name, args)) in calls.iter().enumerate() {
                frames.push((
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                        Value::Null,
                    ),
                ));
                // Arguments split over many chunks, as real servers do (a
                // few characters each; at most about 4,096 chunks, so a huge
                // argument is not gigabytes of frames).
                for p in pieces(args, (args.len() / 4096).max(4)) {
                    frames.push((
                        None,
                        chunk(
                            json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                            Value::Null,
                        ),
                    ));
                }
            }
            frames.push((None, chunk(json!({}), json!("tool_calls"))));
            frames.push((None, usage));
            stream_response(sse(frames, true), Duration::ZERO)
        }
        Reply::Streamed {
            text,
            chunks,
            delay,
            calls,
        } => {
            let mut timed = vec![];
            for p in n_pieces(&text, chunks) {
                timed.extend(
                    sse(
                        vec![(None, chunk(json!({"content": p}), Value::Null))],
                        false,
                    )
                    .into_iter()
                    .map(|f| (f, delay)),
                );
            }
            let mut frames = vec![];
            for (i, (id, name, args)) in calls.iter().enumerate() {
                frames.push((
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                    "function": {"name": name, "arguments": args}}]}),
                        Value::Null,
                    ),
                ));
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            frames.push((None, chunk(json!({}), json!(finish))));
            frames.push((None, usage));
            timed.extend(sse(frames, true).into_iter().map(|f| (f, Duration::ZERO)));
            timed_response(timed)
        }
        Reply::Status(code, body, ra) => error_response(code, body, ra),
        Reply::CutMidToolCall => {
            let frames = vec![
                (
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": 0, "id": "call_cut", "type": "function",
                    "function": {"name": "file_manager__read", "arguments": ""}}]}),
                        Value::Null,
                    ),
                ),
                (
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}),
                        Value::Null,
                    ),
                ),
            ];
            stream_response(sse(frames, false), Duration::ZERO)
        }
    }
}

async fn anthropic(state: Shared, body: axum::Json<Value>) -> Response {
    let Next {
        reply,
        prompt_tokens,
    } = next(&state.0, "anthropic", body.0);
    let start = (
        Some("message_start"),
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
        "role": "assistant", "model": "fake-claude", "content": [],
        "usage": {"input_tokens": prompt_tokens.unwrap_or(13), "output_tokens": 1}}}),
    );

    let stop = |reason: &str| {
        vec![
            (
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 9}}),
            ),
            (Some("message_stop"), json!({"type": "message_stop"})),
        ]
    };
    let text_block = |idx: usize, t: &str| {
        let mut f = vec![(
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": idx,
            "content_block": {"type": "text", "text": ""}}),
        )];
        for p in pieces(t, 5) {
            f.push((
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": idx,
                "delta": {"type": "text_delta", "text": p}}),
            ));
        }
        f.push((
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": idx}),
        ));
        f
    };
    match reply {
        Reply::Raw(body) => raw_sse(body),
        Reply::Text(t) | Reply::Slow(t, _) => {
            let mut frames = vec![start];
            frames.extend(text_block(0, &t));
            frames.extend(stop("end_turn"));
            stream_response(sse(frames, false), Duration::ZERO)
        }
        // The anthropic side of Streamed is not paced, nor Shaped shaped: no test needs it yet.
        Reply::Tools(text, calls)
        | Reply::Streamed { text, calls, .. }
        | Reply::Shaped { text, calls, .. } => {
            let reason = if calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            };
            let mut frames = vec![start];
            let mut idx = 0;
            if !text.is_empty() {
                frames.extend(text_block(0, &text));
                idx = 1;
            }
            for (id, name, args) in calls {
                frames.push((
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": idx,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                ));
                for p in pieces(&args, 4) {
                    frames.push((
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta", "index": idx,
                        "delta": {"type": "input_json_delta", "partial_json": p}}),
                    ));
                }
                frames.push((
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": idx}),
                ));
                idx += 1;
            }
            frames.extend(stop(reason));
            stream_response(sse(frames, false), Duration::ZERO)
        }
        Reply::Status(code, body, ra) => error_response(code, body, ra),
        Reply::CutMidToolCall => {
            let frames = vec![
                start,
                (
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_cut", "name": "file_manager__read", "input": {}}}),
                ),
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": "{\"pa"}}),
                ),
            ];
            stream_response(sse(frames, false), Duration::ZERO)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn repeats_expand_in_script_arguments_and_bad_ones_are_refused() {
        assert_eq!(
            super::expand_repeats(r#"{"p":"{{repeat:3:ab}}-{{repeat:2:c}}"}"#).unwrap(),
            r#"{"p":"ababab-cc"}"#
        );
        assert_eq!(super::expand_repeats("plain").unwrap(), "plain");
        assert!(super::expand_repeats("{{repeat:x:a}}").is_err());
        assert!(super::expand_repeats("{{repeat:3:a").is_err());
        assert!(super::expand_repeats("{{repeat:99999999999:abc}}").is_err());
    }

    use super::*;

    #[test]
    fn a_scripted_text_names_the_user_messages_it_was_sent() {
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]},
        ]});
        let r = fill_in(
            Reply::Streamed {
                text: "saw: {{user_messages}}".into(),
                chunks: 1,
                delay: Duration::ZERO,
                calls: vec![],
            },
            &body,
        );
        let Reply::Streamed { text, .. } = r else {
            panic!("still a streamed reply")
        };
        assert_eq!(text, "saw: first | second");
    }
}
