//! What comes back to a client is bounded (issue 39): an error message, an
//! event and a session read never carry a value whole when it is large. A
//! large value keeps its head and a marker that says how much was left out
//! and how to read it whole, and the event or read says where it is as
//! data too (`cut_values`: a [`ValueRef`] per cut value, which
//! Orchestrator/ReadValue follows, in chunks, to the whole value in the
//! conversation store). So a session stays readable by GetSession and
//! Attach whatever the model sent (a 70 MiB tool argument would otherwise
//! exceed the gRPC message limit on every later read), and nothing the
//! model sent is out of the owner's reach.

use omicos_proto::{ChatEvent, EventValue, MessageValue, ValueRef, chat_event, value_ref};
use serde_json::Value;

/// The longest error message a status carries: enough for any cause chain
/// a person reads; a rule or argument quoted inside it is cut.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 << 10;

/// The longest string an event or a session read carries inline: far above
/// any prose or ordinary tool argument, far below the 64 MiB message limit
/// even with many such values in one session read.
pub const MAX_INLINE_VALUE_BYTES: usize = 64 << 10;

/// The most bytes of a value one ReadValue chunk carries: far below the
/// message limit, few enough chunks for a value near it.
pub const VALUE_CHUNK_BYTES: usize = 1 << 20;

/// The event fields that may be cut, as [`EventValue::field`] names them.
pub const EVENT_FIELDS: &[&str] = &[
    "tool_call_started.arguments",
    "tool_approval_request.arguments",
    "tool_approval_request.summary",
    "error.message",
    "text_delta.text",
];

/// `text` cut to `max` bytes (at a char boundary) with a marker that says
/// how many bytes were left out and where the whole value is; unchanged
/// when it fits.
pub fn cut(text: &str, max: usize, whole_in: &str) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [omicos: {} more bytes of {} not shown{}]",
        &text[..end],
        text.len() - end,
        text.len(),
        if whole_in.is_empty() {
            String::new()
        } else {
            format!("; the whole value: {whole_in}")
        }
    )
}

/// An error message for a status.
pub fn error_message(text: &str) -> String {
    cut(text, MAX_ERROR_MESSAGE_BYTES, "")
}

const TRAJECTORY: &str = "the session's trajectory (.omicos/trajectories/<session>/)";

/// An event as a client gets it: the arguments and messages it carries cut
/// to [`MAX_INLINE_VALUE_BYTES`], each cut one named in `cut_values`.
pub fn event(mut ev: ChatEvent) -> ChatEvent {
    let seq = ev.event_seq;
    let mut refs = Vec::new();
    let mut c = |field: &str, s: &mut String| {
        if s.len() > MAX_INLINE_VALUE_BYTES {
            refs.push(ValueRef {
                at: Some(value_ref::At::Event(EventValue {
                    event_seq: seq,
                    field: field.to_owned(),
                })),
                size_bytes: s.len() as u64,
            });
            *s = cut(
                s,
                MAX_INLINE_VALUE_BYTES,
                &format!(
                    "ReadValue with event_seq {seq} and field {field} (this event's cut_values), or {TRAJECTORY}"
                ),
            );
        }
    };
    match ev.kind.as_mut() {
        Some(chat_event::Kind::ToolCallStarted(t)) => {
            c("tool_call_started.arguments", &mut t.arguments)
        }
        Some(chat_event::Kind::ToolApprovalRequest(t)) => {
            c("tool_approval_request.arguments", &mut t.arguments);
            c("tool_approval_request.summary", &mut t.summary);
        }
        Some(chat_event::Kind::Error(e)) => c("error.message", &mut e.message),
        Some(chat_event::Kind::TextDelta(t)) => c("text_delta.text", &mut t.text),
        _ => {}
    }
    ev.cut_values.extend(refs);
    ev
}

/// The whole value of `field` (one of [`EVENT_FIELDS`]) in a stored event;
/// None when the event is of another kind.
pub fn event_field(ev: ChatEvent, field: &str) -> Option<String> {
    use chat_event::Kind;
    match (ev.kind?, field) {
        (Kind::ToolCallStarted(t), "tool_call_started.arguments") => Some(t.arguments),
        (Kind::ToolApprovalRequest(t), "tool_approval_request.arguments") => Some(t.arguments),
        (Kind::ToolApprovalRequest(t), "tool_approval_request.summary") => Some(t.summary),
        (Kind::Error(e), "error.message") => Some(e.message),
        (Kind::TextDelta(t), "text_delta.text") => Some(t.text),
        _ => None,
    }
}

/// A stored history message, the `index`th of the session, as a session
/// read returns it: every string inside it cut to
/// [`MAX_INLINE_VALUE_BYTES`], with where each cut one is whole.
pub fn message(index: usize, item: &omicos_history::HistoryItem) -> (String, Vec<ValueRef>) {
    struct Walk {
        index: u32,
        pointer: String,
        refs: Vec<ValueRef>,
    }
    impl Walk {
        fn down(&mut self, key: &str, v: &mut Value) {
            let len = self.pointer.len();
            self.pointer.push('/');
            // RFC 6901: `~` and `/` in a key are escaped.
            self.pointer
                .push_str(&key.replace('~', "~0").replace('/', "~1"));
            self.walk(v);
            self.pointer.truncate(len);
        }
        fn walk(&mut self, v: &mut Value) {
            match v {
                Value::String(s) if s.len() > MAX_INLINE_VALUE_BYTES => {
                    self.refs.push(ValueRef {
                        at: Some(value_ref::At::Message(MessageValue {
                            index: self.index,
                            pointer: self.pointer.clone(),
                        })),
                        size_bytes: s.len() as u64,
                    });
                    *s = cut(
                        s,
                        MAX_INLINE_VALUE_BYTES,
                        &format!(
                            "ReadValue with message {} and pointer {} (the session's cut_values), or {TRAJECTORY}",
                            self.index, self.pointer
                        ),
                    );
                }
                Value::Array(a) => {
                    for (i, x) in a.iter_mut().enumerate() {
                        self.down(&i.to_string(), x);
                    }
                }
                Value::Object(o) => {
                    for (k, x) in o.iter_mut() {
                        self.down(k, x);
                    }
                }
                _ => {}
            }
        }
    }
    let whole = item.to_json();
    if whole.len() <= MAX_INLINE_VALUE_BYTES {
        return (whole, Vec::new());
    }
    // Serialized to a value only when something in it is cut.
    let Ok(mut v) = serde_json::to_value(item) else {
        return (whole, Vec::new());
    };
    let mut w = Walk {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        pointer: String::new(),
        refs: Vec::new(),
    };
    w.walk(&mut v);
    (v.to_string(), w.refs)
}

/// The whole string at `pointer` (RFC 6901) in a stored history message,
/// as [`message`] walked it; None when there is none or it is not a string.
pub fn message_value(item: &omicos_history::HistoryItem, pointer: &str) -> Option<String> {
    match serde_json::to_value(item)
        .ok()?
        .pointer_mut(pointer)?
        .take()
    {
        Value::String(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_huge_argument_keeps_its_head_and_says_what_was_left_out() {
        let huge = "é".repeat(35 << 20); // 70 MiB
        let ev_whole = ChatEvent {
            event_seq: 7,
            kind: Some(chat_event::Kind::ToolCallStarted(
                omicos_proto::ToolCallStarted {
                    call_id: "c1".into(),
                    name: "shell".into(),
                    arguments: huge.clone(),
                },
            )),
            ..Default::default()
        };
        let ev = event(ev_whole.clone());
        assert!(ev.encoded_len() < 2 * MAX_INLINE_VALUE_BYTES);
        let Some(chat_event::Kind::ToolCallStarted(t)) = &ev.kind else {
            panic!()
        };
        assert!(t.arguments.starts_with("éé"));
        assert!(
            t.arguments.contains("more bytes of 73400320 not shown"),
            "{}",
            &t.arguments[t.arguments.len() - 200..]
        );
        assert!(
            t.arguments
                .contains("ReadValue with event_seq 7 and field tool_call_started.arguments")
        );
        assert_eq!(
            ev.cut_values,
            [ValueRef {
                at: Some(value_ref::At::Event(EventValue {
                    event_seq: 7,
                    field: "tool_call_started.arguments".into()
                })),
                size_bytes: 73400320,
            }]
        );
        assert_eq!(
            event_field(ev_whole.clone(), "tool_call_started.arguments").as_deref(),
            Some(huge.as_str())
        );
        assert_eq!(event_field(ev_whole, "text_delta.text"), None);

        let msg = omicos_history::HistoryItem::from_value(
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": huge}}]}),
        );
        assert!(matches!(msg, omicos_history::HistoryItem::Assistant(_)));
        let (read, refs) = message(3, &msg);
        assert!(read.len() < 2 * MAX_INLINE_VALUE_BYTES);
        let back: Value = serde_json::from_str(&read).unwrap();
        assert_eq!(back["tool_calls"][0]["function"]["name"], "shell");
        let pointer = "/tool_calls/0/function/arguments";
        assert_eq!(
            refs,
            [ValueRef {
                at: Some(value_ref::At::Message(MessageValue {
                    index: 3,
                    pointer: pointer.into()
                })),
                size_bytes: 73400320,
            }]
        );
        assert_eq!(message_value(&msg, pointer).as_deref(), Some(huge.as_str()));
        assert_eq!(message_value(&msg, "/tool_calls/0/function"), None);
        assert_eq!(message_value(&msg, "/nope"), None);
        // Small messages are untouched.
        let small = omicos_history::HistoryItem::user("hi");
        assert_eq!(
            message(0, &small),
            (r#"{"role":"user","content":"hi"}"#.to_owned(), vec![])
        );
    }

    #[test]
    fn every_field_that_may_be_cut_is_named_and_found_whole() {
        use chat_event::Kind;
        let big = || "x".repeat(MAX_INLINE_VALUE_BYTES + 1);
        let kinds = [
            Kind::ToolCallStarted(omicos_proto::ToolCallStarted {
                arguments: big(),
                ..Default::default()
            }),
            Kind::ToolApprovalRequest(omicos_proto::ToolApprovalRequest {
                arguments: big(),
                summary: big(),
                ..Default::default()
            }),
            Kind::Error(omicos_proto::ErrorEvent {
                message: big(),
                ..Default::default()
            }),
            Kind::TextDelta(omicos_proto::TextDelta { text: big() }),
        ];
        let mut named = vec![];
        for k in kinds {
            let whole = ChatEvent {
                event_seq: 2,
                kind: Some(k),
                ..Default::default()
            };
            let ev = event(whole.clone());
            assert!(ev.encoded_len() < 3 * MAX_INLINE_VALUE_BYTES);
            for r in &ev.cut_values {
                let Some(value_ref::At::Event(e)) = &r.at else {
                    panic!("{r:?}")
                };
                assert_eq!((e.event_seq, r.size_bytes), (2, big().len() as u64));
                assert_eq!(event_field(whole.clone(), &e.field), Some(big()));
                named.push(e.field.clone());
            }
        }
        assert_eq!(named, EVENT_FIELDS);
        // A small event names nothing.
        let small = event(ChatEvent {
            kind: Some(Kind::TextDelta(omicos_proto::TextDelta {
                text: "hi".into(),
            })),
            ..Default::default()
        });
        assert!(small.cut_values.is_empty());
    }

    #[test]
    fn a_pointer_escapes_keys_as_rfc_6901_says() {
        let msg = omicos_history::HistoryItem::from_value(serde_json::json!({
            "role": "user",
            "content": "",
            "a/b~c": ["x".repeat(MAX_INLINE_VALUE_BYTES + 1)],
        }));
        let (_, refs) = message(0, &msg);
        let Some(value_ref::At::Message(m)) = &refs[0].at else {
            panic!("{refs:?}")
        };
        assert_eq!(m.pointer, "/a~1b~0c/0");
        assert_eq!(
            message_value(&msg, &m.pointer),
            Some("x".repeat(MAX_INLINE_VALUE_BYTES + 1))
        );
    }

    #[test]
    fn error_messages_are_bounded() {
        let m = error_message(&format!("permissions: {}", "x".repeat(200_000)));
        assert!(m.len() < MAX_ERROR_MESSAGE_BYTES + 100, "{}", m.len());
        assert!(m.starts_with("permissions: xxx"));
        assert_eq!(error_message("short"), "short");
    }
}
