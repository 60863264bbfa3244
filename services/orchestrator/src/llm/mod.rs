//! LLM backends behind one trait: OpenAI-compatible Chat Completions, Anthropic
//! Messages, and a replay backend for tests and offline runs.

pub mod anthropic;
pub mod assemble;
pub mod openai;
pub mod replay;
pub mod retry;
pub mod sse;

use crate::error::ErrorKind;
use async_trait::async_trait;
use omicos_history::HistoryItem;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A function the model may call.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolDef {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// The tools of a request, with their JSON for each wire format made on
/// first use: the engine caches one set per agent tool list and catalog
/// version, so a tool schema is serialized once, not at every model request.
#[derive(Clone, Debug, Default)]
pub struct ToolSet {
    defs: Vec<ToolDef>,
    openai: std::sync::OnceLock<String>,
    anthropic: std::sync::OnceLock<String>,
}

impl ToolSet {
    /// A set of `defs`.
    pub fn new(defs: Vec<ToolDef>) -> Self {
        Self {
            defs,
            ..Default::default()
        }
    }

    /// The OpenAI `tools` array, serialized.
    pub fn openai_json(&self) -> &str {
        self.openai
            .get_or_init(|| openai::tools_json(&self.defs).to_string())
    }

    /// The Anthropic `tools` array, serialized.
    pub fn anthropic_json(&self) -> &str {
        self.anthropic
            .get_or_init(|| anthropic::tools_json(&self.defs).to_string())
    }
}

impl std::ops::Deref for ToolSet {
    type Target = [ToolDef];
    fn deref(&self) -> &[ToolDef] {
        &self.defs
    }
}

impl PartialEq for ToolSet {
    fn eq(&self, other: &Self) -> bool {
        self.defs == other.defs
    }
}

impl From<Vec<ToolDef>> for ToolSet {
    fn from(defs: Vec<ToolDef>) -> Self {
        Self::new(defs)
    }
}

/// `body` (a serialized JSON object) with `"tools": <tools_json>` added
/// last, without parsing or copying the pre-serialized tools again.
pub fn with_tools(body: String, tools_json: &str) -> String {
    let mut s = body;
    if s.len() >= 2 && s.ends_with('}') {
        s.pop();
        if s.len() > 1 {
            s.push(',');
        }
        s.push_str("\"tools\":");
        s.push_str(tools_json);
        s.push('}');
    }
    s
}

/// One request to a model.
#[derive(Clone, Debug)]
pub struct LlmRequest {
    /// The system prompt.
    pub system: String,
    /// The conversation as the model sees it (no markers; each backend
    /// converts it to its wire format).
    pub messages: Vec<HistoryItem>,
    /// Tools the model may call.
    pub tools: std::sync::Arc<ToolSet>,
    /// Model override ("" = the backend's configured model).
    pub model: String,
    /// The active agent (the replay backend uses it to pick the scripted step).
    pub agent_id: String,
}

/// A tool call the model asked for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    /// Call id (generated when the server sent none).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Raw argument string as the model produced it.
    pub arguments: String,
}

/// What a model turn produced.
#[derive(Clone, Debug, Default)]
pub struct LlmTurn {
    /// The text.
    pub text: String,
    /// The model's reasoning (`reasoning_content`, `reasoning`, Anthropic
    /// thinking): kept out of the text and the history, kept in the trajectory.
    pub reasoning: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Input tokens, if reported.
    pub input_tokens: u64,
    /// Output tokens, if reported.
    pub output_tokens: u64,
    /// The model that answered.
    pub model: String,
    /// Why the model stopped, as the server said it (`stop`, `tool_calls`,
    /// `end_turn`, ...); empty when it said nothing.
    pub finish_reason: String,
    /// The server's id of this answer (`chatcmpl-...`, `msg_...`); empty when none.
    pub response_id: String,
}

/// Streamed while the model answers.
#[derive(Clone, Debug)]
pub enum LlmDelta {
    /// More text.
    Text(String),
}

/// Why a model call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    /// The conversation is longer than the model's context.
    #[error("context too long for the model: {0}")]
    ContextOverflow(String),
    /// The server refused the request (4xx other than 429).
    #[error("the LLM server refused the request: {0}")]
    BadRequest(String),
    /// Retries ran out on 429/5xx/connection errors.
    #[error("the LLM server is unavailable after {attempts} attempts: {last}")]
    Unavailable {
        /// How many attempts were made.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// The stream broke or went idle after text or tool calls had streamed.
    #[error("the LLM stream broke: {0}")]
    StreamBroken(String),
    /// Cancelled by the client.
    #[error("cancelled")]
    Cancelled,
    /// Misconfiguration.
    #[error("LLM backend not configured: {0}")]
    Config(String),
}

impl LlmError {
    /// The kind of this error (its spelling and gRPC code live in [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            LlmError::ContextOverflow(_) => ErrorKind::ContextOverflow,
            LlmError::BadRequest(_) => ErrorKind::BadRequest,
            LlmError::Unavailable { .. } => ErrorKind::LlmUnavailable,
            LlmError::StreamBroken(_) => ErrorKind::LlmStreamBroken,
            LlmError::Cancelled => ErrorKind::Cancelled,
            LlmError::Config(_) => ErrorKind::LlmConfig,
        }
    }
}

/// A model backend.
#[async_trait]
pub trait LlmBackend: Send + Sync {
    /// Streams one answer; text deltas go to `deltas` as they come.
    async fn complete(
        &self,
        req: &LlmRequest,
        deltas: mpsc::Sender<LlmDelta>,
        cancel: &CancellationToken,
    ) -> Result<LlmTurn, LlmError>;
}

/// The HTTP client a backend streams with (no total timeout: streams are
/// bounded by the idle timeout instead).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("reqwest client builds")
}

/// The next SSE event, or a broken-stream error when nothing arrives within
/// `idle`; Ok(None) at the end of the stream.
pub async fn next_event<S, E>(
    reader: &mut sse::SseReader<S>,
    idle: std::time::Duration,
    cancel: &CancellationToken,
) -> Result<Option<sse::SseEvent>, LlmError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    tokio::select! {
        r = tokio::time::timeout(idle, reader.next_event()) => match r {
            Err(_) => Err(LlmError::StreamBroken(format!("no data for {idle:?}"))),
            Ok(r) => r.map_err(|e| LlmError::StreamBroken(e.to_string())),
        },
        _ = cancel.cancelled() => Err(LlmError::Cancelled),
    }
}

/// Detects a context-length refusal in an error body.
pub fn is_context_overflow(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "maximum context",
        "too many tokens",
        "prompt is too long",
        "context window",
    ]
    .iter()
    .any(|p| b.contains(p))
}
