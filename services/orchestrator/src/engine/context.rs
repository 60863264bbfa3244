//! Context management: what of a frame's history the model sees.
//!
//! The history (the store, the frame's messages) is append-only and keeps
//! everything. A compaction appends a *marker* ([`HistoryItem::Compaction`])
//! holding the summary of everything before `kept_from`; the model's view is
//! then one user message (the task-state checkpoint and the summary) followed
//! by the history from `kept_from` on. The checkpoint is rebuilt from the
//! whole history on every request, so it is always current and never
//! summarized: the user's original request, the current `plan`, the latest
//! `task__*` list and the files written in the session.
//!
//! Deciding costs one walk over the view's strings (no serialization): the
//! estimate is characters / `chars_per_token`, scaled by what the backend's
//! usage reported for earlier requests of the same model.

use crate::config::ContextConfig;
use crate::llm::ToolDef;
use omicos_history::{
    AssistantMessage, CompactionMarker, HistoryItem, SystemMessage, ToolCall, ToolResult,
    UserMessage,
};
use serde_json::Value;

/// The system prompt of the summarizing request.
pub const COMPACTION_PROMPT: &str = "You are compacting the history of an agent session so that the work can go on \
in a smaller context. Summarize the conversation below for the agent that will continue it: what the user asked \
for and why, what was done (tools called, with the results that matter: numbers, paths, names, errors), what was \
decided, what failed and why, and what remains to do. Keep every file path, identifier and number that later \
work may need. Do not invent anything. Write plain prose and short lists, no preamble.";

/// The header of the checkpoint the view starts with after a compaction.
pub const CHECKPOINT_HEADER: &str = "[Context checkpoint: earlier messages were compacted. The task state below is \
kept verbatim; the summary after it replaces the older conversation.]";

/// What a tool result is cut to when it is trimmed.
const TRIMMED_MARK: &str = "[result trimmed to save context]";

/// The messages a model request carries, and what they cost.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The messages the model reads (no markers, no private fields).
    pub messages: Vec<HistoryItem>,
    /// Estimated tokens of the messages, the system prompt and the tools.
    pub tokens: u64,
    /// The same before calibration (what the backend's usage is compared with).
    pub raw_tokens: u64,
    /// Old tool results cut to a preview.
    pub trimmed: u32,
    /// History index where the verbatim part starts.
    pub verbatim_from: usize,
}

/// Characters of the strings of a JSON value (keys included), plus a little
/// for the punctuation: a cheap, allocation-free size.
fn chars(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(chars).sum::<usize>() + 2,
        Value::Object(o) => o.iter().map(|(k, v)| k.len() + 3 + chars(v)).sum::<usize>() + 2,
        Value::Null | Value::Bool(_) => 4,
        Value::Number(_) => 6,
    }
}

/// Per-message framing the servers add (role markers, separators), in characters.
const MESSAGE_OVERHEAD_CHARS: usize = 16;

/// The fields of the chat format an unknown row carries to the model.
const CHAT_FIELDS: [&str; 5] = ["role", "content", "tool_calls", "tool_call_id", "name"];

/// Characters of a JSON string.
fn str_chars(s: &str) -> usize {
    s.len() + 2
}

/// Characters of an object's field whose value has `value` characters.
fn field(key: &str, value: usize) -> usize {
    key.len() + 3 + value
}

/// Characters of a tool call in the chat shape.
fn call_chars(c: &ToolCall) -> usize {
    let function =
        field("name", str_chars(c.name())) + field("arguments", str_chars(c.arguments())) + 2;
    field("id", str_chars(&c.id))
        + field("type", str_chars(&c.kind))
        + field("function", function)
        + 2
}

/// Characters of an item's chat fields, as the model's view carries them
/// (the private keys and the markers are never sent).
fn item_chars(m: &HistoryItem) -> usize {
    let role = field("role", str_chars(m.role()));
    let fields = match m {
        HistoryItem::User(UserMessage { content, .. })
        | HistoryItem::System(SystemMessage { content, .. }) => {
            role + field("content", str_chars(content))
        }
        HistoryItem::Assistant(a) => {
            role + field("content", str_chars(&a.content))
                + a.tool_calls.as_ref().map_or(0, |calls| {
                    field(
                        "tool_calls",
                        calls.iter().map(call_chars).sum::<usize>() + 2,
                    )
                })
        }
        HistoryItem::Tool(t) => {
            role + field("content", str_chars(&t.content))
                + field("tool_call_id", str_chars(&t.tool_call_id))
        }
        HistoryItem::Compaction(_) => 0,
        HistoryItem::Other(v) => CHAT_FIELDS
            .iter()
            .filter_map(|k| v.get(*k).map(|f| field(k, chars(f))))
            .sum(),
    };
    fields + 2
}

/// Raw size estimate of a message in characters, as the view carries it.
pub fn message_chars(m: &HistoryItem) -> usize {
    item_chars(m) + MESSAGE_OVERHEAD_CHARS
}

/// Raw size estimate of the system prompt and tool definitions in characters.
pub fn fixed_chars(system: &str, tools: &[ToolDef]) -> usize {
    system.len()
        + tools
            .iter()
            .map(|t| t.name.len() + t.description.len() + chars(&t.parameters) + 40)
            .sum::<usize>()
}

/// Tokens for `chars` characters at `ratio` characters per token, scaled by `calibration`.
pub fn tokens(chars: usize, ratio: f64, calibration: f64) -> u64 {
    ((chars as f64 / ratio.max(0.5)) * calibration).ceil() as u64
}

/// Where the latest compaction marker is, and where its verbatim part starts.
fn latest_marker(history: &[HistoryItem]) -> Option<(usize, &CompactionMarker)> {
    history.iter().enumerate().rev().find_map(|(i, m)| match m {
        HistoryItem::Compaction(c) => Some((i, c)),
        _ => None,
    })
}

/// An item as the model reads it: its chat fields only (a row of no known
/// shape is filtered by the backend).
fn for_model(m: &HistoryItem) -> HistoryItem {
    match m {
        HistoryItem::User(u) => HistoryItem::user(u.content.clone()),
        HistoryItem::Assistant(a) => HistoryItem::Assistant(AssistantMessage {
            content: a.content.clone(),
            tool_calls: a.tool_calls.clone(),
            ..Default::default()
        }),
        HistoryItem::Tool(t) => HistoryItem::tool_result(&t.tool_call_id, t.content.clone(), None),
        other => other.clone(),
    }
}

/// A tool message's content cut to a preview that names where the whole result is.
fn trimmed_content(m: &ToolResult, preview_chars: usize) -> String {
    let content = &m.content;
    let preview: String = content.chars().take(preview_chars).collect();
    let whole = match m.spool_path.as_deref().filter(|s| !s.is_empty()) {
        Some(p) => format!("the whole result is in the file {p}"),
        None => "the whole result is kept in the session's trajectory".into(),
    };
    format!(
        "{preview}… {TRIMMED_MARK} ({} characters in all; {whole})",
        content.len()
    )
}

/// The task state that every compaction keeps verbatim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    /// The first user message of the history.
    pub original_request: String,
    /// The latest plan the model proposed with `plan` (approved or not).
    pub plan: String,
    /// The latest task list a `task__*` call returned.
    pub tasks: String,
    /// Paths written by `file_manager__write` / `file_manager__edit`, first write first.
    pub files_written: Vec<String>,
}

impl Checkpoint {
    /// Built from the whole history.
    pub fn of(history: &[HistoryItem]) -> Self {
        let mut c = Checkpoint::default();
        // call id → tool name, for the results that follow.
        let mut names: std::collections::HashMap<&str, &str> = Default::default();
        for m in history {
            match m {
                HistoryItem::User(u) if c.original_request.is_empty() => {
                    c.original_request = u.content.clone();
                }
                HistoryItem::Assistant(a) => {
                    for tc in a.calls() {
                        let name = tc.name();
                        names.insert(&tc.id, name);
                        let args =
                            || serde_json::from_str::<Value>(tc.arguments()).unwrap_or(Value::Null);
                        match name {
                            "plan" => {
                                if let Some(p) = args()["plan"].as_str() {
                                    c.plan = p.to_owned();
                                }
                            }
                            "file_manager__write" | "file_manager__edit" => {
                                if let Some(p) = args()["path"].as_str()
                                    && !c.files_written.iter().any(|f| f == p)
                                {
                                    c.files_written.push(p.to_owned());
                                }
                            }
                            _ => {}
                        }
                    }
                }
                HistoryItem::Tool(t)
                    if names
                        .get(t.tool_call_id.as_str())
                        .is_some_and(|n| n.starts_with("task__")) =>
                {
                    let env: Value = serde_json::from_str(&t.content).unwrap_or(Value::Null);
                    if env["status"] == "done" {
                        c.tasks = match &env["result"] {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                    }
                }
                _ => {}
            }
        }
        c
    }

    /// The checkpoint as the text the model reads.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{CHECKPOINT_HEADER}\n\n## The user's original request\n{}\n",
            self.original_request
        );
        if !self.plan.is_empty() {
            s.push_str(&format!("\n## The current plan\n{}\n", self.plan));
        }
        if !self.tasks.is_empty() {
            s.push_str(&format!("\n## The task list\n{}\n", self.tasks));
        }
        if !self.files_written.is_empty() {
            s.push_str(&format!(
                "\n## Files written in this session\n{}\n",
                self.files_written.join("\n")
            ));
        }
        s
    }
}

/// What a request of `history` would cost, and what its view would change:
/// the decision whether to compact, made without building the messages (one
/// walk over the strings' lengths, no copies). [`Measure::view`] builds them.
#[derive(Clone, Debug, Default)]
pub struct Measure {
    /// Estimated tokens of the view, the system prompt and the tools.
    pub tokens: u64,
    /// The same before calibration.
    pub raw_tokens: u64,
    /// History index where the verbatim part starts.
    pub verbatim_from: usize,
    /// The checkpoint-and-summary message the view starts with after a marker.
    head: Option<HistoryItem>,
    /// Old tool results cut to a preview: history index → the preview.
    cuts: Vec<(usize, String)>,
}

/// Measures the model's view of `history`: after the latest marker, the
/// checkpoint and its summary, then the verbatim part; old tool results
/// trimmed (oldest first, never the last `keep_recent_messages`) while the
/// estimate passes `limit` tokens.
pub fn measure(
    history: &[HistoryItem],
    fixed: usize,
    cfg: &ContextConfig,
    calibration: f64,
    limit: u64,
) -> Measure {
    let ratio = cfg.chars_per_token;
    let mut out = Measure::default();
    let from = match latest_marker(history) {
        Some((at, marker)) => {
            let text = format!(
                "{}\n## Summary of the earlier conversation\n{}",
                Checkpoint::of(history).render(),
                marker.summary
            );
            out.head = Some(HistoryItem::user(text));
            (marker.kept_from as usize).min(at)
        }
        None => 0,
    };
    out.verbatim_from = from;
    let mut total = fixed + out.head.as_ref().map_or(0, message_chars);
    // (history index, estimated characters) of each message the view carries.
    let mut sizes = Vec::with_capacity(history.len().saturating_sub(from));
    for (at, m) in history.iter().enumerate().skip(from) {
        if matches!(m, HistoryItem::Compaction(_)) {
            continue;
        }
        let c = message_chars(m);
        total += c;
        sizes.push((at, c));
    }
    // Trim old tool results, oldest first, until the view fits.
    let protected = sizes.len().saturating_sub(cfg.keep_recent_messages);
    for &(at, size) in &sizes[..protected] {
        if tokens(total, ratio, calibration) <= limit {
            break;
        }
        if let HistoryItem::Tool(t) = &history[at]
            && t.content.len() > cfg.tool_result_preview_chars * 2
            && !t.content.contains(TRIMMED_MARK)
        {
            let cut = trimmed_content(t, cfg.tool_result_preview_chars);
            // What the trimmed message adds: its content replaced, its other chat fields kept.
            let c = size - str_chars(&t.content) + str_chars(&cut);
            total = total - size + c;
            out.cuts.push((at, cut));
        }
    }
    out.tokens = tokens(total, ratio, calibration);
    out.raw_tokens = tokens(total, ratio, 1.0);
    out
}

impl Measure {
    /// Old tool results this view cuts to a preview.
    pub fn trimmed(&self) -> u32 {
        self.cuts.len() as u32
    }

    /// The view itself: the messages in chat shape.
    pub fn view(self, history: &[HistoryItem]) -> View {
        let mut messages = Vec::with_capacity(history.len().saturating_sub(self.verbatim_from) + 1);
        messages.extend(self.head);
        let trimmed = self.cuts.len() as u32;
        let mut cuts = self.cuts.into_iter().peekable();
        for (at, m) in history.iter().enumerate().skip(self.verbatim_from) {
            if matches!(m, HistoryItem::Compaction(_)) {
                continue;
            }
            match (m, cuts.next_if(|(i, _)| *i == at)) {
                (HistoryItem::Tool(t), Some((_, cut))) => {
                    messages.push(HistoryItem::tool_result(&t.tool_call_id, cut, None));
                }
                _ => messages.push(for_model(m)),
            }
        }
        View {
            messages,
            tokens: self.tokens,
            raw_tokens: self.raw_tokens,
            trimmed,
            verbatim_from: self.verbatim_from,
        }
    }
}

/// The model's view of `history` (see [`measure`]), built.
pub fn view(
    history: &[HistoryItem],
    fixed: usize,
    cfg: &ContextConfig,
    calibration: f64,
    limit: u64,
) -> View {
    measure(history, fixed, cfg, calibration, limit).view(history)
}

/// Where to cut the history for a compaction: the verbatim part starts at the
/// returned index (a user or assistant message, so no tool result is parted
/// from its call) and holds about `recent_tokens`. None: nothing to fold.
pub fn split_point(
    history: &[HistoryItem],
    from: usize,
    recent_tokens: u64,
    cfg: &ContextConfig,
    calibration: f64,
) -> Option<usize> {
    let mut acc = 0usize;
    let mut best = None;
    for i in (from..history.len()).rev() {
        let m = &history[i];
        if matches!(m, HistoryItem::Compaction(_)) {
            continue;
        }
        acc += message_chars(m);
        let boundary = matches!(m, HistoryItem::User(_) | HistoryItem::Assistant(_));
        if boundary && i > from {
            best = Some(i);
            if tokens(acc, cfg.chars_per_token, calibration) >= recent_tokens {
                break;
            }
        }
    }
    // Keep at least the last exchange verbatim; fold only when something is left before it.
    best.filter(|&i| i > from)
}

/// The transcript of `messages` as plain text for the summarizing request,
/// each message cut to `per_message` characters, at most `budget` characters.
pub fn transcript(messages: &[HistoryItem], per_message: usize, budget: usize) -> String {
    let mut out = String::new();
    for m in messages {
        if let HistoryItem::Compaction(c) = m {
            out.push_str(&format!("[earlier summary]\n{}\n\n", c.summary));
            continue;
        }
        let role = match m.role() {
            "" => "?",
            r => r,
        };
        let mut line = String::new();
        if let Some(c) = m.content().filter(|c| !c.is_empty()) {
            line.push_str(c);
        }
        if let HistoryItem::Assistant(a) = m {
            for tc in a.calls() {
                line.push_str(&format!("\n[calls {} with {}]", tc.name(), tc.arguments()));
            }
        }
        let cut: String = line.chars().take(per_message).collect();
        let more = if cut.len() < line.len() { " …" } else { "" };
        let entry = format!("{role}: {cut}{more}\n\n");
        if out.len() + entry.len() > budget {
            // Keep the most recent part: drop from the front.
            let overflow = out.len() + entry.len() - budget;
            let cut_at = out
                .char_indices()
                .map(|(i, _)| i)
                .find(|&i| i >= overflow)
                .unwrap_or(out.len());
            out.replace_range(..cut_at, "… ");
        }
        out.push_str(&entry);
    }
    out
}

/// The marker a compaction appends to the history.
pub fn marker(
    summary: &str,
    kept_from: usize,
    before: u64,
    after: u64,
    folded: usize,
    trigger: &str,
) -> CompactionMarker {
    CompactionMarker {
        summary: summary.to_owned(),
        kept_from: kept_from as u64,
        tokens_before: before,
        tokens_after: after,
        messages_summarized: folded as u64,
        trigger: trigger.to_owned(),
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        extra: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(v: Value) -> HistoryItem {
        HistoryItem::from_value(v)
    }

    fn cfg() -> ContextConfig {
        ContextConfig {
            tool_result_preview_chars: 20,
            keep_recent_messages: 2,
            ..Default::default()
        }
    }

    fn history() -> Vec<HistoryItem> {
        [
            json!({"role": "user", "content": "analyse the data"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "p1", "type": "function", "function": {"name": "plan", "arguments": "{\"plan\":\"1. load\\n2. plot\"}"}},
                {"id": "t1", "type": "function", "function": {"name": "task__create", "arguments": "{\"title\":\"load\"}"}},
                {"id": "w1", "type": "function", "function": {"name": "file_manager__write", "arguments": "{\"path\":\"out/a.csv\",\"content\":\"x\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "p1", "content": "{\"status\":\"done\",\"result\":\"approved\"}"}),
            json!({"role": "tool", "tool_call_id": "t1", "content": "{\"status\":\"done\",\"result\":{\"tasks\":[{\"id\":1,\"title\":\"load\"}]}}"}),
            json!({"role": "tool", "tool_call_id": "w1", "content": format!("{{\"status\":\"done\",\"result\":\"{}\"}}", "y".repeat(500)), "spool_path": ".omicos/spool/w1.txt"}),
            json!({"role": "assistant", "content": "written"}),
            json!({"role": "user", "content": "now plot"}),
        ]
        .into_iter()
        .map(item)
        .collect()
    }

    #[test]
    fn the_checkpoint_holds_request_plan_tasks_and_files() {
        let c = Checkpoint::of(&history());
        assert_eq!(c.original_request, "analyse the data");
        assert_eq!(c.plan, "1. load\n2. plot");
        assert_eq!(c.tasks, r#"{"tasks":[{"id":1,"title":"load"}]}"#);
        assert_eq!(c.files_written, ["out/a.csv"]);
        let r = c.render();
        assert!(
            r.contains("1. load\n2. plot") && r.contains("out/a.csv"),
            "{r}"
        );
    }

    #[test]
    fn old_tool_results_are_trimmed_first_and_name_their_spool_file() {
        let h = history();
        let roomy = view(&h, 0, &cfg(), 1.0, 1_000_000);
        assert_eq!(roomy.trimmed, 0);
        assert_eq!(roomy.messages.len(), h.len());
        assert!(roomy.messages.iter().all(|m| match m {
            HistoryItem::Tool(t) => t.spool_path.is_none(),
            HistoryItem::Assistant(a) => a.usage.is_none(),
            _ => true,
        }));
        let tight = view(&h, 0, &cfg(), 1.0, roomy.tokens - 50);
        assert_eq!(
            tight.trimmed, 2,
            "the small task result first, then the big one"
        );
        let cut = tight.messages[4].content().unwrap();
        assert!(
            cut.contains(".omicos/spool/w1.txt") && cut.contains(TRIMMED_MARK),
            "{cut}"
        );
        assert!(tight.tokens < roomy.tokens);
        // The call itself is kept.
        let HistoryItem::Assistant(a) = &tight.messages[1] else {
            panic!("{:?}", tight.messages[1])
        };
        assert_eq!(a.calls()[2].id, "w1");
    }

    /// The decision is made on lengths alone: it must count exactly what the
    /// built view carries, trimmed results and the checkpoint included.
    #[test]
    fn the_measure_counts_what_the_view_carries() {
        let mut marked = history();
        marked.push(HistoryItem::Compaction(marker(
            "they loaded data",
            5,
            100,
            40,
            5,
            "auto",
        )));
        marked.push(item(json!({"role": "assistant", "content": "plotted"})));
        for (h, limit) in [
            (history(), u64::MAX),
            (history(), 1),
            (marked.clone(), u64::MAX),
            (marked, 1),
        ] {
            let m = measure(&h, 123, &cfg(), 1.0, limit);
            let (tokens, trimmed) = (m.tokens, m.trimmed());
            let v = m.view(&h);
            let carried: usize = 123 + v.messages.iter().map(message_chars).sum::<usize>();
            assert_eq!(tokens, super::tokens(carried, cfg().chars_per_token, 1.0));
            assert_eq!(trimmed, v.trimmed);
            assert_eq!(
                v.messages
                    .iter()
                    .filter(|m| m.content().is_some_and(|c| c.contains(TRIMMED_MARK)))
                    .count() as u32,
                trimmed
            );
        }
    }

    #[test]
    fn after_a_marker_the_view_is_checkpoint_summary_then_the_verbatim_part() {
        let mut h = history();
        h.push(HistoryItem::Compaction(marker(
            "they loaded data",
            5,
            100,
            40,
            5,
            "auto",
        )));
        h.push(item(json!({"role": "assistant", "content": "plotted"})));
        let v = view(&h, 0, &cfg(), 1.0, 1_000_000);
        let head = v.messages[0].content().unwrap();
        assert!(head.starts_with(CHECKPOINT_HEADER), "{head}");
        assert!(
            head.contains("analyse the data")
                && head.contains("1. load")
                && head.contains("they loaded data")
        );
        let rest: Vec<&str> = v.messages[1..]
            .iter()
            .map(|m| m.content().unwrap())
            .collect();
        assert_eq!(rest, ["written", "now plot", "plotted"]);
    }

    #[test]
    fn the_split_never_parts_a_result_from_its_call() {
        let h = history();
        let at = split_point(&h, 0, 1, &cfg(), 1.0).unwrap();
        assert!(matches!(
            h[at],
            HistoryItem::User(_) | HistoryItem::Assistant(_)
        ));
        assert_eq!(at, 6);
        let all = split_point(&h, 0, 1_000_000, &cfg(), 1.0).unwrap();
        assert_eq!(all, 1, "folds at least the first message");
        assert_eq!(split_point(&h[..1], 0, 1, &cfg(), 1.0), None);
    }

    #[test]
    fn the_transcript_is_bounded_and_keeps_the_latest() {
        let t = transcript(&history(), 40, 200);
        assert!(t.len() <= 210, "{}", t.len());
        assert!(t.ends_with("user: now plot\n\n"), "{t}");
    }
}
