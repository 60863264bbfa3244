//! A session's conversation as the engine, the store and the CLI share it:
//! one [`HistoryItem`] per stored message.
//!
//! An item serializes to the JSON the store has always held (the OpenAI
//! chat shape, plus the compaction marker and the private keys `usage`,
//! `interrupted` and `spool_path`), field for field and in the same order,
//! so stored rows need no migration. Keys this type does not know are kept
//! in each item's `extra` and written back after the known ones; a row that
//! does not fit any known shape becomes [`HistoryItem::Other`] and is
//! written back as it was read. Nothing read is lost.
//!
//! The shapes a model server reads are made from these items inside each
//! LLM backend, never here.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Number, Value};

/// Keys of a stored message that this type does not know, in their order.
pub type Extra = Map<String, Value>;

/// One message of a session's history.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum HistoryItem {
    /// What the user wrote (or a task a caller agent gave a callee).
    User(UserMessage),
    /// The model's answer: its text and the tool calls it asked for.
    Assistant(AssistantMessage),
    /// A tool call's result, as the model reads it.
    Tool(ToolResult),
    /// A system message (never written by the engine; read and sent as it is).
    System(SystemMessage),
    /// A compaction marker: the summary of everything before `kept_from`.
    /// Never sent to a model as it is.
    Compaction(CompactionMarker),
    /// A stored row of no known shape, kept whole.
    #[serde(untagged)]
    Other(Value),
}

/// A user message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    /// The text.
    pub content: String,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A system message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemMessage {
    /// The text.
    pub content: String,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// An assistant message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The answer's text ("" when it only called tools).
    pub content: String,
    /// What the model call that produced it cost (private: never sent to a
    /// model), so a session's totals can be summed from its history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The calls the model asked for, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The answer was cut by a cancel: `content` is what the client saw (private).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A tool call's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call it answers.
    pub tool_call_id: String,
    /// The envelope the model reads (`{"status", "result"}`).
    pub content: String,
    /// Where the whole result is when it was spooled (private: a trimmed
    /// preview names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spool_path: Option<String>,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A compaction marker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompactionMarker {
    /// The summary of the folded messages (and of the summary before it).
    pub summary: String,
    /// History index where the part kept verbatim starts.
    pub kept_from: u64,
    /// Estimated tokens of a request before the compaction.
    pub tokens_before: u64,
    /// Estimated tokens of a request after it.
    pub tokens_after: u64,
    /// How many messages the summary replaced.
    pub messages_summarized: u64,
    /// `auto`, `overflow` or `manual`.
    pub trigger: String,
    /// When it was made (unix ms).
    pub at_ms: u64,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A model call's usage as an assistant message keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// Cost in the units of the price table (a JSON number kept as written).
    pub cost: Number,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Usage {
    /// A call's usage.
    pub fn new(input_tokens: u64, output_tokens: u64, cost: f64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            // Not finite: nothing was priced.
            cost: Number::from_f64(cost).unwrap_or_else(|| Number::from(0u64)),
            extra: Extra::new(),
        }
    }

    /// The cost as a float.
    pub fn cost(&self) -> f64 {
        self.cost.as_f64().unwrap_or(0.0)
    }
}

/// A tool call the model asked for, in the OpenAI chat shape
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool and its arguments.
    pub function: FunctionCall,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The function part of a [`ToolCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (JSON text, not checked).
    pub arguments: String,
    /// Keys this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ToolCall {
    /// A call of `name` with `arguments`.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
                extra: Extra::new(),
            },
            extra: Extra::new(),
        }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.function.name
    }

    /// The raw arguments.
    pub fn arguments(&self) -> &str {
        &self.function.arguments
    }
}

impl AssistantMessage {
    /// An answer with `content` and nothing else.
    pub fn new(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            ..Default::default()
        }
    }

    /// The calls it asked for (none when it asked for none).
    pub fn calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or_default()
    }
}

impl HistoryItem {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        HistoryItem::User(UserMessage {
            content: content.into(),
            extra: Extra::new(),
        })
    }

    /// A tool result; `spool_path` only when the whole result was spooled.
    pub fn tool_result(
        call_id: impl Into<String>,
        content: impl Into<String>,
        spool_path: Option<String>,
    ) -> Self {
        HistoryItem::Tool(ToolResult {
            tool_call_id: call_id.into(),
            content: content.into(),
            spool_path,
            extra: Extra::new(),
        })
    }

    /// The stored `role` (`user`, `assistant`, `tool`, `system`,
    /// `compaction`, or whatever an unknown row holds; "" when it has none).
    pub fn role(&self) -> &str {
        match self {
            HistoryItem::User(_) => "user",
            HistoryItem::Assistant(_) => "assistant",
            HistoryItem::Tool(_) => "tool",
            HistoryItem::System(_) => "system",
            HistoryItem::Compaction(_) => "compaction",
            HistoryItem::Other(v) => v.get("role").and_then(Value::as_str).unwrap_or_default(),
        }
    }

    /// The text content (a tool result's envelope; none for a marker, or
    /// an unknown row without a string `content`).
    pub fn content(&self) -> Option<&str> {
        match self {
            HistoryItem::User(m) => Some(&m.content),
            HistoryItem::System(m) => Some(&m.content),
            HistoryItem::Assistant(m) => Some(&m.content),
            HistoryItem::Tool(m) => Some(&m.content),
            HistoryItem::Compaction(_) => None,
            HistoryItem::Other(v) => v.get("content").and_then(Value::as_str),
        }
    }

    /// The item as a stored row's JSON text.
    pub fn to_json(&self) -> String {
        // Every key is a string and every number finite: it cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The item a stored row's JSON value holds: the known shape it fits,
    /// else [`HistoryItem::Other`] with the value untouched.
    pub fn from_value(v: Value) -> Self {
        let Value::Object(mut map) = v else {
            return HistoryItem::Other(v);
        };
        let role = match map.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("system") => Role::System,
            Some("assistant") => Role::Assistant,
            Some("tool") => Role::Tool,
            Some("compaction") => Role::Compaction,
            _ => return HistoryItem::Other(Value::Object(map)),
        };
        let typed = match role {
            Role::User => user(&mut map).map(HistoryItem::User),
            Role::System => user(&mut map).map(|u| {
                HistoryItem::System(SystemMessage {
                    content: u.content,
                    extra: u.extra,
                })
            }),
            Role::Assistant => assistant(&mut map).map(HistoryItem::Assistant),
            Role::Tool => tool(&mut map).map(HistoryItem::Tool),
            Role::Compaction => compaction(&mut map).map(HistoryItem::Compaction),
        };
        typed.unwrap_or(HistoryItem::Other(Value::Object(map)))
    }
}

impl<'de> Deserialize<'de> for HistoryItem {
    /// Read into a JSON object first, then moved field by field into its
    /// variant: a row that fits no variant is kept whole, and large strings
    /// (tool results) are moved, not copied.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(HistoryItem::from_value)
    }
}

/// The known roles.
enum Role {
    User,
    System,
    Assistant,
    Tool,
    Compaction,
}

// Each reader below checks the whole row before it takes anything from it:
// a row that fails a check is left as it was (it becomes `Other`).

fn is_str(map: &Extra, k: &str) -> bool {
    matches!(map.get(k), Some(Value::String(_)))
}

fn is_u64(map: &Extra, k: &str) -> bool {
    map.get(k).is_some_and(Value::is_u64)
}

/// A key that may be absent; present, it must be a `T`.
fn optional<T: DeserializeOwned>(map: &Extra, k: &str) -> Result<Option<T>, ()> {
    match map.get(k) {
        None => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(drop),
    }
}

fn take_string(map: &mut Extra, k: &str) -> String {
    match map.shift_remove(k) {
        Some(Value::String(s)) => s,
        _ => String::new(),
    }
}

fn take_u64(map: &mut Extra, k: &str) -> u64 {
    map.shift_remove(k).and_then(|v| v.as_u64()).unwrap_or(0)
}

/// What is left of a row once its known keys were taken: its extra keys.
fn rest(map: &mut Extra) -> Extra {
    map.shift_remove("role");
    if map.is_empty() {
        // Not the parsed map's allocation: an item without extras holds none.
        return Extra::new();
    }
    std::mem::take(map)
}

/// A string field of an object.
fn has_str(v: &Value, k: &str) -> bool {
    matches!(v.get(k), Some(Value::String(_)))
}

/// Whether `v` is a list of [`ToolCall`]s, checked without copying it (it
/// is then moved into the typed list, arguments and all).
fn is_tool_calls(v: &Value) -> bool {
    v.as_array().is_some_and(|calls| {
        calls.iter().all(|c| {
            c.is_object()
                && has_str(c, "id")
                && has_str(c, "type")
                && c.get("function")
                    .is_some_and(|f| f.is_object() && has_str(f, "name") && has_str(f, "arguments"))
        })
    })
}

fn user(map: &mut Extra) -> Option<UserMessage> {
    if !is_str(map, "content") {
        return None;
    }
    let content = take_string(map, "content");
    Some(UserMessage {
        content,
        extra: rest(map),
    })
}

fn assistant(map: &mut Extra) -> Option<AssistantMessage> {
    if !is_str(map, "content") {
        return None;
    }
    let usage = optional::<Usage>(map, "usage").ok()?;
    if !map.get("tool_calls").is_none_or(is_tool_calls) {
        return None;
    }
    let interrupted = optional::<bool>(map, "interrupted").ok()?;
    let content = take_string(map, "content");
    // Checked above: moving it into the typed list cannot fail.
    let tool_calls = map
        .shift_remove("tool_calls")
        .and_then(|v| serde_json::from_value::<Vec<ToolCall>>(v).ok());
    for k in ["usage", "interrupted"] {
        map.shift_remove(k);
    }
    Some(AssistantMessage {
        content,
        usage,
        tool_calls,
        interrupted,
        extra: rest(map),
    })
}

fn tool(map: &mut Extra) -> Option<ToolResult> {
    if !is_str(map, "tool_call_id") || !is_str(map, "content") {
        return None;
    }
    let spool_path = optional::<String>(map, "spool_path").ok()?;
    let tool_call_id = take_string(map, "tool_call_id");
    let content = take_string(map, "content");
    map.shift_remove("spool_path");
    Some(ToolResult {
        tool_call_id,
        content,
        spool_path,
        extra: rest(map),
    })
}

fn compaction(map: &mut Extra) -> Option<CompactionMarker> {
    let counts = [
        "kept_from",
        "tokens_before",
        "tokens_after",
        "messages_summarized",
        "at_ms",
    ];
    if !is_str(map, "summary") || !is_str(map, "trigger") || !counts.iter().all(|k| is_u64(map, k))
    {
        return None;
    }
    Some(CompactionMarker {
        summary: take_string(map, "summary"),
        kept_from: take_u64(map, "kept_from"),
        tokens_before: take_u64(map, "tokens_before"),
        tokens_after: take_u64(map, "tokens_after"),
        messages_summarized: take_u64(map, "messages_summarized"),
        trigger: take_string(map, "trigger"),
        at_ms: take_u64(map, "at_ms"),
        extra: rest(map),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(text: &str) -> HistoryItem {
        let item: HistoryItem = serde_json::from_str(text).unwrap();
        assert_eq!(item.to_json(), text);
        item
    }

    #[test]
    fn known_shapes_read_typed_and_write_back_byte_for_byte() {
        let u = round_trip(r#"{"role":"user","content":"hi ünïcode 🙂"}"#);
        assert_eq!(u, HistoryItem::user("hi ünïcode 🙂"));
        let a = round_trip(
            r#"{"role":"assistant","content":"","usage":{"input_tokens":10,"output_tokens":2,"cost":0.5},"tool_calls":[{"id":"c1","type":"function","function":{"name":"shell","arguments":"{\"cmd\":\"ls\"}"}}]}"#,
        );
        let HistoryItem::Assistant(a) = a else {
            panic!("{a:?}")
        };
        assert_eq!(a.calls()[0].name(), "shell");
        assert_eq!(a.usage.unwrap().cost(), 0.5);
        round_trip(r#"{"role":"assistant","content":"partial","interrupted":true}"#);
        let t = round_trip(
            r#"{"role":"tool","tool_call_id":"c1","content":"{\"status\":\"done\",\"result\":\"x\"}","spool_path":".omicos/tool_outputs/1__c1.txt"}"#,
        );
        assert_eq!(t.role(), "tool");
        round_trip(
            r#"{"role":"compaction","summary":"s","kept_from":5,"tokens_before":100,"tokens_after":40,"messages_summarized":5,"trigger":"auto","at_ms":1700000000000}"#,
        );
        round_trip(r#"{"role":"system","content":"be brief"}"#);
    }

    #[test]
    fn unknown_keys_and_unknown_rows_survive() {
        // An extra key keeps its value (written after the known keys).
        let text = r#"{"role":"user","content":"x","name":"ann","meta":{"k":[1,2]}}"#;
        let item: HistoryItem = serde_json::from_str(text).unwrap();
        let HistoryItem::User(u) = &item else {
            panic!("{item:?}")
        };
        assert_eq!(u.extra["meta"], json!({"k": [1, 2]}));
        assert_eq!(item.to_json(), text);
        let nested = r#"{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"n","arguments":"{}","x":1},"index":0}],"usage":{"input_tokens":1,"output_tokens":1,"cost":0,"cached":3}}"#;
        let item: HistoryItem = serde_json::from_str(nested).unwrap();
        assert!(matches!(item, HistoryItem::Assistant(_)));
        assert_eq!(
            serde_json::from_str::<Value>(&item.to_json()).unwrap(),
            serde_json::from_str::<Value>(nested).unwrap()
        );
        // Rows of no known shape are kept whole, byte for byte.
        for text in [
            r#"{"role":"assistant","content":null,"tool_calls":[]}"#,
            r#"{"role":"tool","tool_call_id":7,"content":"x"}"#,
            r#"{"role":"developer","content":"x"}"#,
            r#"{"content":"no role"}"#,
            r#"{"role":"compaction","summary":"s"}"#,
            r#"[1,2]"#,
        ] {
            let item = round_trip(text);
            assert!(matches!(item, HistoryItem::Other(_)), "{text}: {item:?}");
        }
    }
}
