//! How real OpenAI-compatible servers stream one answer: the chunk sequences
//! of tool calls and reasoning that differ from server to server. The fake
//! LLM ([`crate::Reply::Shaped`]) sends them, so each shape can be tested
//! through Chat. Each shape follows the server's own streaming code:
//!
//! - [`Shape::OpenAi`] (OpenAI, vLLM): the id and name in the first fragment
//!   of a call only, the arguments in many small fragments after it; usage in
//!   a last chunk with no choices.
//! - [`Shape::LlamaCppPython`] (llama-cpp-python's server with
//!   `--chat_format chatml-function-calling`,
//!   `llama_chat_format._stream_response_to_function_stream`): every chunk
//!   repeats the call's name and id, in `tool_calls` and in the legacy
//!   `function_call` alike, with `role` and `content` null; no usage.
//! - [`Shape::Ollama`] (Ollama's `/v1/chat/completions`): each call whole in
//!   one chunk, every one under index 0 as older releases send them, with
//!   `content: ""` beside it.
//! - [`Shape::FunctionCallBeside`]: OpenAI-style fragments, each mirrored in
//!   a `function_call` field (servers and proxies that fill both).
//! - [`Shape::LegacyFunctionCall`]: the functions API (`function_call` only,
//!   no id, no index).
//! - [`Shape::Interleaved`]: several calls started together and their
//!   argument fragments sent round-robin by index, several calls per chunk.
//!
//! Reasoning goes in its own field before the answer: `reasoning_content`
//! (DeepSeek, vLLM, llama.cpp's server) or `reasoning` (Ollama, newer vLLM),
//! or both with the same text (servers in transition send both).

use serde_json::{Value, json};

/// A server's way of streaming tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI, vLLM: id and name once, arguments in pieces.
    OpenAi,
    /// llama-cpp-python: name and id in every chunk, `tool_calls` and `function_call` both.
    LlamaCppPython,
    /// Ollama: a whole call per chunk, all under index 0.
    Ollama,
    /// OpenAI-style `tool_calls` with each fragment mirrored in `function_call`.
    FunctionCallBeside,
    /// The legacy functions API: `function_call` only.
    LegacyFunctionCall,
    /// Several calls whose fragments interleave by index.
    Interleaved,
}

/// Reasoning sent before the answer, in these delta fields.
#[derive(Clone, Debug)]
pub struct Reasoning {
    /// `reasoning_content`, `reasoning`, or both.
    pub fields: Vec<&'static str>,
    /// The text (sent in a few pieces).
    pub text: String,
}

/// `s` in pieces of at most `n` characters.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// The `delta` objects of one streamed answer of `shape`: reasoning, text,
/// then the calls (id, name, raw arguments), then the finishing delta's
/// `finish_reason`. The caller wraps each delta in a chunk.
pub fn deltas(
    shape: Shape,
    reasoning: Option<&Reasoning>,
    text: &str,
    calls: &[(String, String, String)],
) -> (Vec<Value>, &'static str) {
    let mut out = vec![];
    out.push(match shape {
        Shape::LlamaCppPython => {
            json!({"role": "assistant", "content": null, "function_call": null, "tool_calls": null})
        }
        _ => json!({"role": "assistant", "content": ""}),
    });
    if let Some(r) = reasoning {
        for p in pieces(&r.text, 7) {
            let mut d = json!({});
            for f in &r.fields {
                d[*f] = json!(p);
            }
            if shape == Shape::Ollama {
                d["content"] = json!("");
            }
            out.push(d);
        }
    }
    for p in pieces(text, 6) {
        out.push(json!({"content": p}));
    }
    let finish = if calls.is_empty() {
        "stop"
    } else if shape == Shape::LegacyFunctionCall {
        "function_call"
    } else {
        "tool_calls"
    };
    match shape {
        Shape::OpenAi => {
            for (i, (id, name, args)) in calls.iter().enumerate() {
                out.push(
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                                "function": {"name": name, "arguments": ""}}]}),
                );
                for p in pieces(args, 5) {
                    out.push(json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}));
                }
            }
        }
        Shape::LlamaCppPython => {
            for (i, (id, name, args)) in calls.iter().enumerate() {
                for p in pieces(args, 4) {
                    out.push(json!({
                        "role": null, "content": null,
                        "function_call": {"name": name, "arguments": p},
                        "tool_calls": [{"index": i, "id": id, "type": "function",
                                        "function": {"name": name, "arguments": p}}]}));
                }
            }
        }
        Shape::Ollama => {
            for (id, name, args) in calls {
                out.push(json!({"role": "assistant", "content": "",
                    "tool_calls": [{"id": id, "index": 0, "type": "function",
                                    "function": {"name": name, "arguments": args}}]}));
            }
        }
        Shape::FunctionCallBeside => {
            for (i, (id, name, args)) in calls.iter().enumerate() {
                out.push(json!({
                    "function_call": {"name": name, "arguments": ""},
                    "tool_calls": [{"index": i, "id": id, "type": "function",
                                    "function": {"name": name, "arguments": ""}}]}));
                for p in pieces(args, 5) {
                    out.push(json!({
                        "function_call": {"arguments": p},
                        "tool_calls": [{"index": i, "function": {"arguments": p}}]}));
                }
            }
        }
        Shape::LegacyFunctionCall => {
            // The functions API names one call per answer.
            if let Some((_, name, args)) = calls.first() {
                out.push(json!({"function_call": {"name": name, "arguments": ""}}));
                for p in pieces(args, 5) {
                    out.push(json!({"function_call": {"arguments": p}}));
                }
            }
        }
        Shape::Interleaved => {
            // Every call starts in one chunk, in reverse index order.
            let starts: Vec<Value> = calls
                .iter()
                .enumerate()
                .rev()
                .map(|(i, (id, name, _))| {
                    json!({"index": i, "id": id, "type": "function",
                           "function": {"name": name, "arguments": ""}})
                })
                .collect();
            out.push(json!({"tool_calls": starts}));
            let split: Vec<Vec<String>> = calls.iter().map(|(_, _, a)| pieces(a, 3)).collect();
            let rounds = split.iter().map(Vec::len).max().unwrap_or(0);
            for r in 0..rounds {
                // One round: a fragment of every call that has one left,
                // alternately one chunk per fragment and all in one chunk.
                let frags: Vec<Value> = split
                    .iter()
                    .enumerate()
                    .filter_map(|(i, ps)| {
                        ps.get(r)
                            .map(|p| json!({"index": i, "function": {"arguments": p}}))
                    })
                    .collect();
                if r % 2 == 0 {
                    out.push(json!({"tool_calls": frags}));
                } else {
                    for f in frags {
                        out.push(json!({"tool_calls": [f]}));
                    }
                }
            }
        }
    }
    (out, finish)
}

/// Whether the server of `shape` reports usage at the end of a stream.
pub fn reports_usage(shape: Shape) -> bool {
    shape != Shape::LlamaCppPython
}

/// An id as the server of `shape` makes it for call `i` of `name`.
pub fn call_id(shape: Shape, i: usize, name: &str) -> String {
    match shape {
        Shape::LlamaCppPython => {
            format!("call__{i}_{name}_cmpl-6e1d2c4f-0a3b-4c55-9d6e-7f8a9b0c1d2e")
        }
        Shape::Ollama => format!("call_{}", ["k3x9q2", "p7m4w1", "z8c5v6"][i % 3]),
        Shape::OpenAi | Shape::FunctionCallBeside | Shape::Interleaved => {
            format!("call_Qm8ZcJxT1vYwLk{i}")
        }
        // The functions API has no ids: the orchestrator makes one.
        Shape::LegacyFunctionCall => String::new(),
    }
}
