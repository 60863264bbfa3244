//! The OpenTelemetry GenAI semantic conventions (semconv 1.37, the
//! `gen_ai.*` namespace, still marked Development upstream): one place that
//! names the spans and attributes, so a tracing backend that knows the
//! conventions (Jaeger, Langfuse, Phoenix, Datadog LLM Observability, ...)
//! shows omicos turns as agent, chat and tool spans without a mapping.
//!
//! - `invoke_agent {agent}` (INTERNAL: the agent runs in this process) around
//!   a root turn and around each `call_agent` sub-turn;
//! - `chat {model}` (CLIENT) around each model request;
//! - `execute_tool {tool}` (INTERNAL) around each tool call.
//!
//! Spans are `tracing` spans; tracing-opentelemetry turns the `otel.name`,
//! `otel.kind` and `otel.status_code` fields into the OTLP span's name, kind
//! and status, and every other field into an attribute. Fields recorded
//! after the fact are declared `Empty` up front (tracing drops undeclared ones).
//!
//! Message content is never recorded unless `telemetry.capture_content` is
//! on: prompts and answers are the users' data.

use crate::llm::{LlmError, LlmTurn};
use tracing::field::Empty;

/// The semconv version these names follow (docs/observability.md says which).
pub const SEMCONV_VERSION: &str = "1.37.0";

/// `gen_ai.provider.name` of a configured backend: the well-known values for
/// the hosted APIs, the backend's own name otherwise (a replay script).
pub fn provider_name(backend: &str) -> &str {
    match backend {
        "openai" => "openai",
        "anthropic" => "anthropic",
        other => other,
    }
}

/// The span of one agent run (a root turn, or a `call_agent` sub-turn):
/// `gen_ai.conversation.id` is the omicos session id.
pub fn agent_span(agent: &str, session: &str) -> tracing::Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format!("invoke_agent {agent}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %agent,
        gen_ai.agent.id = %agent,
        gen_ai.conversation.id = %session,
        error.type = Empty,
    )
}

/// Marks an agent span as failed, with why (`reason` is the turn's done reason).
pub fn agent_failed(span: &tracing::Span, reason: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", reason);
}

/// The span of one model request. `model` is the model asked for.
pub fn chat_span(provider: &str, model: &str, session: &str) -> tracing::Span {
    tracing::info_span!(
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %provider_name(provider),
        gen_ai.request.model = %model,
        gen_ai.conversation.id = %session,
        gen_ai.response.model = Empty,
        gen_ai.response.id = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.system_instructions = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
    )
}

/// Records what a model request answered on its span. `input` and `output`
/// are the tokens as counted (the backend's usage, else the estimate).
pub fn chat_answered(span: &tracing::Span, turn: &LlmTurn, input: u64, output: u64) {
    if !turn.model.is_empty() {
        span.record("gen_ai.response.model", turn.model.as_str());
    }
    if !turn.response_id.is_empty() {
        span.record("gen_ai.response.id", turn.response_id.as_str());
    }
    // A string array in the conventions; tracing has no array values, so the
    // JSON text of the array (what other tracing-based exporters send too).
    let reason = finish_reason(turn);
    span.record(
        "gen_ai.response.finish_reasons",
        serde_json::json!([reason]).to_string().as_str(),
    );
    span.record("gen_ai.usage.input_tokens", input);
    span.record("gen_ai.usage.output_tokens", output);
}

/// The finish reason a model gave, or the one its answer implies when the
/// server sent none (a replay script, a stream that ended at `[DONE]`).
pub fn finish_reason(turn: &LlmTurn) -> &str {
    if !turn.finish_reason.is_empty() {
        &turn.finish_reason
    } else if turn.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

/// Records the content of a model request and answer (only when
/// `telemetry.capture_content` is on), in the conventions' JSON shapes.
pub fn chat_content(
    span: &tracing::Span,
    system: &str,
    messages: &[omicos_history::HistoryItem],
    turn: &LlmTurn,
) {
    let system = serde_json::json!([{"type": "text", "content": system}]);
    span.record("gen_ai.system_instructions", system.to_string().as_str());
    if let Ok(input) = serde_json::to_string(messages) {
        span.record("gen_ai.input.messages", input.as_str());
    }
    let mut parts = vec![serde_json::json!({"type": "text", "content": turn.text})];
    for c in &turn.tool_calls {
        parts.push(serde_json::json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}));
    }
    let output = serde_json::json!([{"role": "assistant", "parts": parts, "finish_reason": finish_reason(turn)}]);
    span.record("gen_ai.output.messages", output.to_string().as_str());
}

/// Marks a model request's span as failed: `error.type` is the error's kind
/// (`context_overflow`, `llm_unavailable`, ...), a low-cardinality name.
pub fn chat_failed(span: &tracing::Span, e: &LlmError) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", e.kind().as_str());
}

/// The span of one tool call. `gen_ai.tool.type` is `function` for every
/// omicos tool: each is a function the model calls with JSON arguments.
pub fn tool_span(name: &str, call_id: &str) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {name}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = "function",
        error.type = Empty,
    )
}

/// Marks a tool call's span as failed (the tool answered `error`).
pub fn tool_failed(span: &tracing::Span) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", "tool_error");
}
