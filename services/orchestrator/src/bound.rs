//! What comes back to a client is bounded (issue 39): an error message, an
//! event and a session read never carry a value whole when it is large. A
//! large value keeps its head and a marker that says how much was left out
//! and where the whole value is (the session's trajectory and the store
//! keep it), so a session stays readable by GetSession and Attach whatever
//! the model sent (a 70 MiB tool argument would otherwise exceed the gRPC
//! message limit on every later read).

use omicos_proto::{ChatEvent, chat_event};
use serde_json::Value;

/// The longest error message a status carries: enough for any cause chain
/// a person reads; a rule or argument quoted inside it is cut.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 << 10;

/// The longest string an event or a session read carries inline: far above
/// any prose or ordinary tool argument, far below the 64 MiB message limit
/// even with many such values in one session read.
pub const MAX_INLINE_VALUE_BYTES: usize = 64 << 10;

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
            format!("; the whole value is in {whole_in}")
        }
    )
}

/// An error message for a status.
pub fn error_message(text: &str) -> String {
    cut(text, MAX_ERROR_MESSAGE_BYTES, "")
}

const WHOLE_IN: &str = "the session's trajectory (.omicos/trajectories/<session>/)";

/// An event as a client gets it: the arguments and messages it carries cut
/// to [`MAX_INLINE_VALUE_BYTES`].
pub fn event(mut ev: ChatEvent) -> ChatEvent {
    let max = MAX_INLINE_VALUE_BYTES;
    let c = |s: &mut String| {
        if s.len() > max {
            *s = cut(s, max, WHOLE_IN);
        }
    };
    match ev.kind.as_mut() {
        Some(chat_event::Kind::ToolCallStarted(t)) => c(&mut t.arguments),
        Some(chat_event::Kind::ToolApprovalRequest(t)) => {
            c(&mut t.arguments);
            c(&mut t.summary);
        }
        Some(chat_event::Kind::Error(e)) => c(&mut e.message),
        Some(chat_event::Kind::TextDelta(t)) => c(&mut t.text),
        _ => {}
    }
    ev
}

/// A stored history message as a session read returns it: every string
/// inside it cut to [`MAX_INLINE_VALUE_BYTES`].
pub fn message(item: &omicos_history::HistoryItem) -> String {
    fn walk(v: &mut Value) {
        match v {
            Value::String(s) if s.len() > MAX_INLINE_VALUE_BYTES => {
                *s = cut(s, MAX_INLINE_VALUE_BYTES, WHOLE_IN);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    let whole = item.to_json();
    if whole.len() <= MAX_INLINE_VALUE_BYTES {
        return whole;
    }
    // Serialized to a value only when something in it is cut.
    let Ok(mut v) = serde_json::to_value(item) else {
        return whole;
    };
    walk(&mut v);
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_huge_argument_keeps_its_head_and_says_what_was_left_out() {
        let huge = "é".repeat(35 << 20); // 70 MiB
        let ev = event(ChatEvent {
            kind: Some(chat_event::Kind::ToolCallStarted(
                omicos_proto::ToolCallStarted {
                    call_id: "c1".into(),
                    name: "shell".into(),
                    arguments: huge.clone(),
                },
            )),
            ..Default::default()
        });
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

        let msg = omicos_history::HistoryItem::from_value(
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": huge}}]}),
        );
        assert!(matches!(msg, omicos_history::HistoryItem::Assistant(_)));
        let read = message(&msg);
        assert!(read.len() < 2 * MAX_INLINE_VALUE_BYTES);
        let back: Value = serde_json::from_str(&read).unwrap();
        assert_eq!(back["tool_calls"][0]["function"]["name"], "shell");
        // Small messages are untouched.
        let small = omicos_history::HistoryItem::user("hi");
        assert_eq!(message(&small), r#"{"role":"user","content":"hi"}"#);
    }

    #[test]
    fn error_messages_are_bounded() {
        let m = error_message(&format!("permissions: {}", "x".repeat(200_000)));
        assert!(m.len() < MAX_ERROR_MESSAGE_BYTES + 100, "{}", m.len());
        assert!(m.starts_with("permissions: xxx"));
        assert_eq!(error_message("short"), "short");
    }
}
