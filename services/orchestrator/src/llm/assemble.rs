//! Assembles streamed tool calls from OpenAI-compatible chunks, whatever the
//! server's shape:
//!
//! - a name and id in the first fragment only, arguments split over many
//!   (OpenAI, vLLM);
//! - the name and id repeated in every fragment (llama-cpp-python), in
//!   `tool_calls` and in `function_call` alike: a repeat is not appended;
//! - a whole call in one fragment, arguments as a string or an object
//!   (Ollama), several calls even under the same index: a fragment with a new
//!   id for a call that is already complete starts a new call;
//! - several calls whose fragments interleave by index, even calls that start
//!   out of index order: the calls come out in index order;
//! - the legacy `function_call` beside `tool_calls`: the two are assembled
//!   apart and one is taken (`tool_calls` when it named a call), never both.

use super::ToolCall;
use serde_json::Value;
use std::collections::HashMap;

/// One call being assembled.
#[derive(Default, Debug)]
struct PartialCall {
    /// The server's index, when it sent one.
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
}

impl PartialCall {
    /// The arguments are a whole JSON value already (nothing more can follow).
    fn complete(&self) -> bool {
        !self.arguments.is_empty() && serde_json::from_str::<Value>(&self.arguments).is_ok()
    }

    fn add_name(&mut self, name: &str) {
        if name.is_empty() || name == self.name {
            // Absent, or repeated in every chunk (llama-cpp-python).
            return;
        }
        if self.name.is_empty() || self.arguments.is_empty() {
            // The first name, or a name split over fragments before any argument.
            self.name.push_str(name);
        }
    }

    fn add_arguments(&mut self, a: &Value) {
        let piece = match a {
            Value::String(s) => s.clone(),
            Value::Null => return,
            // Some servers send the arguments as an object, already parsed.
            other => other.to_string(),
        };
        if piece.is_empty() {
            return;
        }
        // Compared before parsing: parsing the arguments so far at every
        // piece made a long argument quadratic (a 2 MiB argument streamed in
        // small deltas took minutes).
        if piece == self.arguments && self.complete() {
            // The whole arguments sent again (a final summary chunk).
            return;
        }
        self.arguments.push_str(&piece);
    }
}

/// Calls of one channel (`tool_calls` or `function_call`), in first-seen order.
#[derive(Default, Debug)]
struct Channel {
    calls: Vec<PartialCall>,
    by_index: HashMap<u64, usize>,
}

impl Channel {
    /// The call a fragment belongs to, created when it starts a new one.
    fn slot(&mut self, index: Option<u64>, id: &str) -> usize {
        if let Some(idx) = index {
            if let Some(&at) = self.by_index.get(&idx) {
                let c = &self.calls[at];
                let new_call = !id.is_empty() && !c.id.is_empty() && id != c.id && c.complete();
                if !new_call {
                    return at;
                }
            }
            self.calls.push(PartialCall {
                index: Some(idx),
                ..Default::default()
            });
            let at = self.calls.len() - 1;
            self.by_index.insert(idx, at);
            return at;
        }
        // No index: an id names its call; no id continues the last one.
        if !id.is_empty() {
            if let Some(at) = self.calls.iter().position(|c| c.id == id) {
                return at;
            }
            if let Some(last) = self.calls.last()
                && last.id.is_empty()
                && !last.complete()
            {
                return self.calls.len() - 1;
            }
            self.calls.push(PartialCall::default());
            return self.calls.len() - 1;
        }
        if self.calls.is_empty() {
            self.calls.push(PartialCall::default());
        }
        self.calls.len() - 1
    }

    fn fragment(&mut self, index: Option<u64>, id: Option<&Value>, function: Option<&Value>) {
        let id = id.and_then(id_string).unwrap_or_default();
        let at = self.slot(index, &id);
        let c = &mut self.calls[at];
        if c.id.is_empty() && !id.is_empty() {
            c.id = id;
        }
        if let Some(f) = function {
            if let Some(n) = f.get("name").and_then(Value::as_str) {
                c.add_name(n);
            }
            if let Some(a) = f.get("arguments") {
                c.add_arguments(a);
            }
        }
    }

    fn named(&self) -> bool {
        self.calls.iter().any(|c| !c.name.is_empty())
    }
}

/// The tool calls of one streamed answer.
#[derive(Default, Debug)]
pub struct ToolCallAssembler {
    tool_calls: Channel,
    function_call: Channel,
}

impl ToolCallAssembler {
    /// Takes one chunk's `delta` (its `tool_calls` and `function_call`).
    pub fn delta(&mut self, delta: &Value) {
        if let Some(tcs) = delta.get("tool_calls").and_then(Value::as_array) {
            for tc in tcs {
                self.tool_calls.fragment(
                    tc.get("index").and_then(Value::as_u64),
                    tc.get("id"),
                    tc.get("function"),
                );
            }
        }
        if let Some(fc) = delta.get("function_call").filter(|f| f.is_object()) {
            // The legacy field carries one call at a time and no index.
            self.function_call.fragment(None, fc.get("id"), Some(fc));
        }
    }

    /// Nothing was received for any call.
    pub fn is_empty(&self) -> bool {
        self.tool_calls.calls.is_empty() && self.function_call.calls.is_empty()
    }

    /// The calls, in order; an id is generated for a call that had none.
    pub fn finish(self) -> Vec<ToolCall> {
        let mut channel = if self.tool_calls.named() {
            self.tool_calls
        } else {
            self.function_call
        };
        if channel.calls.iter().all(|c| c.index.is_some()) {
            // Index order; a stable sort keeps several calls under one index
            // (Ollama) in the order they came.
            channel.calls.sort_by_key(|c| c.index);
        }
        channel
            .calls
            .into_iter()
            .filter(|c| !c.name.is_empty())
            .map(|c| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{}", uuid::Uuid::new_v4().simple())
                } else {
                    c.id
                },
                name: c.name,
                arguments: if c.arguments.trim().is_empty() {
                    "{}".into()
                } else {
                    c.arguments
                },
            })
            .collect()
    }
}

fn id_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(deltas: &[Value]) -> Vec<(String, String, String)> {
        let mut a = ToolCallAssembler::default();
        for d in deltas {
            a.delta(d);
        }
        a.finish()
            .into_iter()
            .map(|c| (c.id, c.name, c.arguments))
            .collect()
    }

    fn t(id: &str, name: &str, args: &str) -> (String, String, String) {
        (id.into(), name.into(), args.into())
    }

    #[test]
    fn name_and_id_repeated_in_every_chunk_in_both_fields_count_once() {
        let piece = |p: &str| {
            json!({"function_call": {"name": "file_manager__list", "arguments": p},
                   "tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                   "function": {"name": "file_manager__list", "arguments": p}}]})
        };
        let got = run(&[piece("{\"pa"), piece("th\": "), piece("\".\"}")]);
        assert_eq!(
            got,
            [t("call_x", "file_manager__list", "{\"path\": \".\"}")]
        );
    }

    #[test]
    fn name_in_the_first_chunk_only_and_interleaved_indices() {
        let got = run(&[
            json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "x", "arguments": ""}}]}),
            json!({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "y", "arguments": "{\"k\""}}]}),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            json!({"tool_calls": [{"index": 1, "function": {"arguments": ":1}"}}]}),
        ]);
        assert_eq!(got, [t("a", "x", "{}"), t("b", "y", "{\"k\":1}")]);
    }

    #[test]
    fn calls_that_start_out_of_index_order_come_out_in_index_order() {
        let got = run(&[
            json!({"tool_calls": [
                {"index": 1, "id": "b", "function": {"name": "y", "arguments": ""}},
                {"index": 0, "id": "a", "function": {"name": "x", "arguments": ""}}]}),
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}},
                                  {"index": 0, "function": {"arguments": "{\"k\":1}"}}]}),
        ]);
        assert_eq!(got, [t("a", "x", "{\"k\":1}"), t("b", "y", "{}")]);
    }

    #[test]
    fn whole_calls_in_one_chunk_even_under_one_index() {
        let got = run(&[
            json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "x", "arguments": "{\"a\":1}"}}]}),
            json!({"tool_calls": [{"index": 0, "id": "c2", "function": {"name": "y", "arguments": {"b": 2}}}]}),
        ]);
        assert_eq!(got, [t("c1", "x", "{\"a\":1}"), t("c2", "y", "{\"b\":2}")]);
    }

    #[test]
    fn function_call_alone_is_taken_and_beside_tool_calls_is_ignored() {
        let legacy = run(&[
            json!({"function_call": {"name": "shell", "arguments": "{\"c\""}}),
            json!({"function_call": {"arguments": ":1}"}}),
        ]);
        assert_eq!(legacy.len(), 1);
        assert_eq!(
            (legacy[0].1.as_str(), legacy[0].2.as_str()),
            ("shell", "{\"c\":1}")
        );
        let both = run(&[json!({"function_call": {"name": "a", "arguments": "{}"},
             "tool_calls": [{"index": 0, "id": "i", "function": {"name": "a", "arguments": "{}"}},
                            {"index": 1, "id": "j", "function": {"name": "b", "arguments": "{}"}}]})]);
        assert_eq!(both, [t("i", "a", "{}"), t("j", "b", "{}")]);
    }

    #[test]
    fn a_repeated_whole_argument_string_is_not_doubled() {
        let got = run(&[
            json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "x", "arguments": "{\"q\":1}"}}]}),
            json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "x", "arguments": "{\"q\":1}"}}]}),
        ]);
        assert_eq!(got, [t("a", "x", "{\"q\":1}")]);
    }
}
