//! How Chat events look: the REPL's human view (streamed text, tool calls at
//! start and end, progress bars, indented sub-agent turns), the piped view
//! (the answer on stdout, activity on stderr) and JSON lines.

use crate::style::Style;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use omicos_proto::{ChatEvent, Decision, Risk, chat_event::Kind};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::io::Write;

/// Which view to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Everything on stdout, for a person at a terminal.
    Human,
    /// The root agent's answer on stdout; tool activity and errors on stderr.
    Answer,
    /// One JSON object per event on stdout.
    Json,
}

/// How many lines of a tool result are shown when the call ends.
const RESULT_LINES: usize = 3;
/// Longest line shown for arguments and results.
const LINE_WIDTH: usize = 120;

/// Prints events as they arrive.
pub struct Renderer {
    view: View,
    out_style: Style,
    side_style: Style,
    /// Where the last text delta left the cursor.
    at_line_start: bool,
    /// Execution context of the last text printed (a change starts a new line).
    text_context: String,
    multi: MultiProgress,
    bars: HashMap<String, ProgressBar>,
    /// Calls whose live output was shown (their result is not repeated).
    streamed: HashSet<String>,
    /// The root agent's text of the current turn.
    pub answer: String,
    /// Where in `answer` the current model request's text began: a turn
    /// moved to another replica with its request reissued supersedes what
    /// came after it.
    answer_mark: usize,
}

impl Renderer {
    /// A renderer for `view`, colours decided from the process's streams.
    pub fn new(view: View) -> Self {
        let out_style = Style::for_stdout();
        let side_style = if view == View::Answer {
            Style::for_stderr()
        } else {
            out_style
        };
        Self::with_styles(view, out_style, side_style)
    }

    /// A renderer with explicit styles.
    pub fn with_styles(view: View, out_style: Style, side_style: Style) -> Self {
        Self {
            view,
            out_style,
            side_style,
            at_line_start: true,
            text_context: "root".into(),
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: HashMap::new(),
            streamed: HashSet::new(),
            answer: String::new(),
            answer_mark: 0,
        }
    }

    /// The view.
    pub fn view(&self) -> View {
        self.view
    }

    /// The style of the activity stream (for prompts and notices).
    pub fn style(&self) -> Style {
        self.side_style
    }

    /// Resets per-turn state.
    pub fn begin_turn(&mut self) {
        self.answer.clear();
        self.answer_mark = 0;
        self.streamed.clear();
        self.text_context = "root".into();
    }

    /// Prints a line of activity (stdout in the human view, stderr otherwise).
    pub fn line(&mut self, s: &str) {
        self.break_text();
        let view = self.view;
        self.multi.suspend(|| {
            if view == View::Human {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{s}");
                let _ = o.flush();
            } else {
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{s}");
            }
        });
    }

    /// A notice about an event of `context` (indented like that context's lines).
    pub fn notice_in(&mut self, context: &str, s: &str) {
        let ind = self.indent(depth(context), "");
        self.notice(&format!("{ind}{s}"));
    }

    /// A notice from the CLI itself (re-attach, cancel), styled yellow.
    pub fn notice(&mut self, s: &str) {
        if self.view == View::Json {
            eprintln!("{s}");
            return;
        }
        let t = self.side_style.yellow(s);
        self.line(&t);
    }

    /// Ends a text line in progress, so the next line starts clean.
    fn break_text(&mut self) {
        if !self.at_line_start {
            if self.view == View::Human || self.text_context == "root" {
                let _ = writeln!(std::io::stdout());
            }
            self.at_line_start = true;
        }
    }

    fn text(&mut self, ev: &ChatEvent, text: &str) {
        let ctx = ev.execution_context_id.as_str();
        let depth = depth(ctx);
        if ctx == "root" {
            self.answer.push_str(text);
        }
        if self.view == View::Answer && depth > 0 {
            // Piped: only the answer goes to stdout; sub-agent text is not the answer.
            return;
        }
        if self.text_context != ctx {
            self.break_text();
            self.text_context = ctx.to_owned();
        }
        let prefix = self.indent(depth, ev.agent_id.as_str());
        let mut s = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            if self.at_line_start && c != '\n' {
                s.push_str(&prefix);
            }
            s.push(c);
            self.at_line_start = c == '\n';
        }
        self.multi.suspend(|| {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
        });
    }

    fn indent(&self, depth: usize, agent: &str) -> String {
        if depth == 0 || self.view != View::Human {
            return String::new();
        }
        let _ = agent;
        format!(
            "{}{} ",
            "    ".repeat(depth - 1),
            self.out_style.magenta("  │")
        )
    }

    /// Prints one event.
    pub fn event(&mut self, ev: &ChatEvent) {
        let Some(kind) = &ev.kind else { return };
        if matches!(kind, Kind::Heartbeat(_)) {
            return;
        }
        self.mark_answer(ev, kind);
        if self.view == View::Json {
            if let Kind::TextDelta(t) = kind
                && ev.execution_context_id == "root"
            {
                self.answer.push_str(&t.text);
            }
            println!("{}", event_json(ev));
            return;
        }
        let st = self.side_style;
        let d = depth(&ev.execution_context_id);
        let ind = self.indent(d, &ev.agent_id);
        match kind {
            Kind::TurnStarted(t) => {
                if self.view == View::Human {
                    let team = if t.team_members.is_empty() {
                        String::new()
                    } else {
                        format!(" · team {}", t.team_members.join(", "))
                    };
                    let mode = match t.permission_mode() {
                        omicos_proto::PermissionMode::Unspecified => String::new(),
                        m => format!(" · mode {}", m.as_str()),
                    };
                    let l = st.dim(&format!(
                        "── {}{team}{mode} · session {}",
                        t.agent, ev.session_id
                    ));
                    self.line(&l);
                }
            }
            Kind::TextDelta(t) => self.text(ev, &t.text),
            Kind::ToolCallStarted(c) => {
                let l = format!(
                    "{ind}{} {} {}",
                    st.cyan("▸"),
                    st.cyan(&c.name),
                    st.dim(&short_args(&c.arguments, 80))
                );
                self.line(&l);
            }
            Kind::ToolOutputChunk(o) => {
                let Some(chunk) = &o.chunk else { return };
                self.streamed.insert(o.call_id.clone());
                for l in chunk.text.lines().filter(|l| !l.trim().is_empty()) {
                    let l = format!("{ind}  {}", st.dim(&format!("┆ {}", clip(l, LINE_WIDTH))));
                    self.line(&l);
                }
            }
            Kind::ToolProgress(p) => self.progress(ev, p),
            Kind::ToolApprovalRequest(a) => {
                let risk = Risk::try_from(a.risk).map(risk_name).unwrap_or("unknown");
                let summary = if a.summary.is_empty() {
                    String::new()
                } else {
                    format!(": {}", a.summary)
                };
                let l = format!(
                    "{ind}{} {} wants to run {} ({risk} risk){summary}",
                    st.yellow("?"),
                    ev.agent_id,
                    st.cyan(&a.tool_name)
                );
                self.line(&l);
                if !a.arguments.is_empty() {
                    let l = format!("{ind}  {}", st.dim(&short_args(&a.arguments, LINE_WIDTH)));
                    self.line(&l);
                }
            }
            Kind::ToolApprovalResolved(r) => {
                let dec = Decision::try_from(r.decision).unwrap_or(Decision::Unspecified);
                let how = decision_words(dec);
                let l = if matches!(dec, Decision::AllowOnce | Decision::AllowSession) {
                    format!("{ind}  {} {how} ({})", st.green("✓"), r.source)
                } else {
                    format!("{ind}  {} {how} ({})", st.red("✗"), r.source)
                };
                self.line(&l);
            }
            Kind::ToolCallFinished(f) => {
                self.finish_bars(&f.call_id);
                let ok = f.status() == omicos_proto::ToolStatus::Done;
                let mark = if ok { st.green("✓") } else { st.red("✗") };
                let l = format!(
                    "{ind}{mark} {} {} {}",
                    st.cyan(&f.name),
                    f.status().as_str(),
                    st.dim(&elapsed(f.elapsed_ms))
                );
                self.line(&l);
                let show = !ok || !self.streamed.contains(&f.call_id);
                if show {
                    for l in result_lines(&f.result, RESULT_LINES) {
                        let l = format!("{ind}  {}", st.dim(&l));
                        self.line(&l);
                    }
                }
                if !f.spool_path.is_empty() {
                    let l = format!(
                        "{ind}  {}",
                        st.dim(&format!("(full output: {})", f.spool_path))
                    );
                    self.line(&l);
                }
            }
            Kind::AgentSwitch(s) => {
                let l = if s.reason == "delegate" {
                    let outer = self.indent(s.depth.saturating_sub(1) as usize, &s.from_agent);
                    format!(
                        "{outer}{} {} hands over to {}",
                        st.magenta("↳"),
                        s.from_agent,
                        st.bold(&s.to_agent)
                    )
                } else {
                    let inner = self.indent(s.depth as usize + 1, &s.from_agent);
                    format!(
                        "{inner}{} {} returns to {}",
                        st.magenta("↲"),
                        s.from_agent,
                        st.bold(&s.to_agent)
                    )
                };
                self.line(&l);
            }
            Kind::Usage(_) | Kind::Heartbeat(_) => {}
            Kind::Steer(s) => {
                let l = format!("{} {}", st.bold("you (steer)>"), s.message);
                self.line(&l);
            }
            Kind::Rewound(w) => {
                let n = w.turn_ids.len();
                let mut l = format!(
                    "(rewound {n} turn{}: the model no longer sees {})",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "it" } else { "them" }
                );
                if !w.files_restored.is_empty() {
                    l.push_str(&format!(
                        "; files restored: {}",
                        w.files_restored.join(", ")
                    ));
                }
                if !w.files_not_restored.is_empty() {
                    l.push_str(&format!(
                        "; left as they are (too large to have been kept): {}",
                        w.files_not_restored.join(", ")
                    ));
                }
                let l = st.yellow(&l);
                self.line(&l);
            }
            Kind::TurnMoved(m) => {
                // A terminal cannot take back what it printed: say that the
                // answer starts again, and keep only the new one as the answer.
                let mut l = "(continued on another server".to_owned();
                if m.model_request_reissued {
                    l.push_str("; the answer above restarts");
                }
                if !m.lost_calls.is_empty() {
                    l.push_str(&format!(
                        "; lost with the first one: {}",
                        m.lost_calls.join(", ")
                    ));
                }
                l.push(')');
                let l = format!("{ind}{}", st.dim(&l));
                self.line(&l);
            }
            Kind::Compaction(c) => {
                let l = st.yellow(&format!(
                    "(context compacted, {}: {} → {} tokens)",
                    c.trigger, c.tokens_before, c.tokens_after
                ));
                self.line(&l);
            }
            Kind::Error(e) => {
                let l = format!(
                    "{ind}{} {}",
                    st.red(&format!("error [{}]:", e.kind)),
                    e.message
                );
                self.line(&l);
            }
            Kind::TurnDone(t) => {
                self.break_text();
                for (_, b) in self.bars.drain() {
                    b.finish_and_clear();
                }
                if t.reason() != omicos_proto::TurnDoneReason::Completed {
                    let l = st.yellow(&format!("(turn {})", t.reason().as_str()));
                    self.line(&l);
                }
            }
        }
    }

    /// Keeps `answer` to what stands: a root model request's text begins
    /// after each call or steer, and a reissued request (the turn moved to
    /// another replica) supersedes the text of the one it replaces.
    fn mark_answer(&mut self, ev: &ChatEvent, kind: &Kind) {
        if ev.execution_context_id != "root" {
            return;
        }
        match kind {
            Kind::ToolCallStarted(_) | Kind::ToolCallFinished(_) | Kind::Steer(_) => {
                self.answer_mark = self.answer.len();
            }
            Kind::TurnMoved(m) if m.model_request_reissued => {
                self.answer
                    .truncate(self.answer_mark.min(self.answer.len()));
            }
            _ => {}
        }
    }

    fn progress(&mut self, ev: &ChatEvent, p: &omicos_proto::ToolProgressEvent) {
        let Some(pr) = &p.progress else { return };
        if self.view != View::Human {
            return;
        }
        let key = format!("{}/{}", p.call_id, pr.bar_id);
        let ind = self.indent(depth(&ev.execution_context_id), &ev.agent_id);
        let bar = self.bars.entry(key.clone()).or_insert_with(|| {
            let b = self.multi.add(ProgressBar::new(pr.total.max(0.0) as u64));
            let tpl = format!("{ind}  {{msg}} [{{bar:30}}] {{pos}}/{{len}} {{elapsed}}");
            b.set_style(
                ProgressStyle::with_template(&tpl)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b
        });
        if pr.total > 0.0 {
            bar.set_length(pr.total as u64);
        }
        bar.set_position(pr.current.max(0.0) as u64);
        let label = if pr.label.is_empty() {
            pr.message.clone()
        } else {
            pr.label.clone()
        };
        bar.set_message(label);
        if pr.done {
            bar.finish_and_clear();
            self.bars.remove(&key);
        }
    }

    fn finish_bars(&mut self, call_id: &str) {
        let keys: Vec<String> = self
            .bars
            .keys()
            .filter(|k| k.starts_with(&format!("{call_id}/")))
            .cloned()
            .collect();
        for k in keys {
            if let Some(b) = self.bars.remove(&k) {
                b.finish_and_clear();
            }
        }
    }
}

/// Delegation depth of an execution context (`root` = 0, `root/call` = 1, …).
pub fn depth(context: &str) -> usize {
    context.matches('/').count()
}

/// A risk class in words.
pub fn risk_name(r: Risk) -> &'static str {
    match r {
        Risk::Read => "read",
        Risk::FileWrite => "file write",
        Risk::Python => "python",
        Risk::Shell => "shell",
        Risk::MemoryWrite => "memory write",
    }
}

/// A decision in words.
pub fn decision_words(d: Decision) -> &'static str {
    match d {
        Decision::AllowOnce => "allowed once",
        Decision::AllowSession => "allowed for this session",
        Decision::Deny => "denied",
        Decision::Unspecified => "no decision",
    }
}

/// `s` cut to `max` characters, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// Tool arguments on one short line: `key=value` pairs of a JSON object.
pub fn short_args(args: &str, max: usize) -> String {
    let one_line = match serde_json::from_str::<Value>(args) {
        Ok(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => format!("{s:?}"),
                    other => other.to_string(),
                };
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => args.replace('\n', " "),
    };
    clip(&one_line, max)
}

/// The first `n` meaningful lines of a tool result. Structured results (a
/// kernel cell's JSON) show their output rather than raw JSON.
pub fn result_lines(result: &str, n: usize) -> Vec<String> {
    let text = match serde_json::from_str::<Value>(result) {
        Ok(Value::Object(m)) => {
            let mut parts = vec![];
            if let Some(Value::Object(e)) = m.get("error") {
                parts.push(format!(
                    "{}: {}",
                    e.get("ename").and_then(Value::as_str).unwrap_or("error"),
                    e.get("evalue").and_then(Value::as_str).unwrap_or("")
                ));
            }
            for key in ["stdout", "content", "result", "text", "message", "stderr"] {
                if let Some(Value::String(s)) = m.get(key)
                    && !s.trim().is_empty()
                {
                    parts.push(s.clone());
                    break;
                }
            }
            if parts.is_empty() {
                result.to_owned()
            } else {
                parts.join("\n")
            }
        }
        _ => result.to_owned(),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out: Vec<String> = lines.iter().take(n).map(|l| clip(l, LINE_WIDTH)).collect();
    if lines.len() > n {
        out.push(format!("… {} more lines", lines.len() - n));
    }
    out
}

/// Milliseconds in a short human form.
pub fn elapsed(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// An event as one JSON object: the envelope fields plus `type` and the
/// kind's own fields (decisions and risks by name).
pub fn event_json(ev: &ChatEvent) -> Value {
    let mut v = json!({
        "session_id": ev.session_id,
        "turn_id": ev.turn_id,
        "event_seq": ev.event_seq,
        "execution_context_id": ev.execution_context_id,
        "agent_id": ev.agent_id,
        "timestamp_ms": ev.timestamp_ms,
    });
    let (ty, body) = match &ev.kind {
        None => ("unknown", json!({})),
        Some(Kind::TurnStarted(t)) => (
            "turn_started",
            json!({"message": t.message, "agent": t.agent, "team_members": t.team_members, "permission_mode": t.permission_mode().as_str()}),
        ),
        Some(Kind::TextDelta(t)) => ("text_delta", json!({"text": t.text})),
        Some(Kind::ToolCallStarted(c)) => (
            "tool_call_started",
            json!({"call_id": c.call_id, "name": c.name, "arguments": c.arguments}),
        ),
        Some(Kind::ToolProgress(p)) => {
            let pr = p.progress.clone().unwrap_or_default();
            (
                "tool_progress",
                json!({"call_id": p.call_id, "bar_id": pr.bar_id, "label": pr.label, "current": pr.current, "total": pr.total,
                    "percent": pr.percent, "elapsed_s": pr.elapsed_s, "eta_s": pr.eta_s, "unit": pr.unit, "done": pr.done, "message": pr.message}),
            )
        }
        Some(Kind::ToolOutputChunk(o)) => {
            let c = o.chunk.clone().unwrap_or_default();
            (
                "tool_output_chunk",
                json!({"call_id": o.call_id, "stream": c.stream, "text": c.text}),
            )
        }
        Some(Kind::ToolApprovalRequest(a)) => (
            "tool_approval_request",
            json!({"call_id": a.call_id, "tool_name": a.tool_name, "risk": Risk::try_from(a.risk).map(risk_name).unwrap_or("unknown"),
                "summary": a.summary, "arguments": a.arguments}),
        ),
        Some(Kind::ToolApprovalResolved(r)) => (
            "tool_approval_resolved",
            json!({"call_id": r.call_id, "decision": decision_name(r.decision), "source": r.source}),
        ),
        Some(Kind::ToolCallFinished(f)) => (
            "tool_call_finished",
            json!({"call_id": f.call_id, "name": f.name, "status": f.status().as_str(), "result": f.result, "spool_path": f.spool_path, "elapsed_ms": f.elapsed_ms}),
        ),
        Some(Kind::AgentSwitch(s)) => (
            "agent_switch",
            json!({"from_agent": s.from_agent, "to_agent": s.to_agent, "reason": s.reason, "depth": s.depth}),
        ),
        Some(Kind::Usage(u)) => (
            "usage",
            json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens, "model": u.model}),
        ),
        Some(Kind::Error(e)) => ("error", json!({"kind": e.kind, "message": e.message})),
        Some(Kind::Heartbeat(_)) => ("heartbeat", json!({})),
        Some(Kind::Compaction(c)) => (
            "compaction",
            json!({"trigger": c.trigger, "tokens_before": c.tokens_before, "tokens_after": c.tokens_after,
                   "messages_summarized": c.messages_summarized}),
        ),
        Some(Kind::Steer(s)) => ("steer", json!({"message": s.message})),
        Some(Kind::Rewound(r)) => (
            "rewound",
            json!({"turn_ids": r.turn_ids, "files_restored": r.files_restored,
                   "files_not_restored": r.files_not_restored}),
        ),
        Some(Kind::TurnMoved(m)) => (
            "turn_moved",
            json!({"reason": m.reason, "replica": m.replica,
                   "model_request_reissued": m.model_request_reissued,
                   "reattached_calls": m.reattached_calls, "lost_calls": m.lost_calls}),
        ),
        Some(Kind::TurnDone(t)) => ("turn_done", json!({"reason": t.reason().as_str()})),
    };
    v["type"] = json!(ty);
    if let (Some(o), Value::Object(b)) = (v.as_object_mut(), body) {
        o.extend(b);
    }
    v
}

/// A decision's wire name in lower case (`allow_once`, `allow_session`, `deny`).
pub fn decision_name(d: i32) -> &'static str {
    match Decision::try_from(d).unwrap_or(Decision::Unspecified) {
        Decision::AllowOnce => "allow_once",
        Decision::AllowSession => "allow_session",
        Decision::Deny => "deny",
        Decision::Unspecified => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omicos_proto::{ToolCallFinished, chat_event};

    #[test]
    fn short_args_are_one_line_and_clipped() {
        assert_eq!(
            short_args(r#"{"path":"a.txt","n":3}"#, 80),
            r#"path="a.txt" n=3"#
        );
        let long = format!(r#"{{"code":"{}"}}"#, "x".repeat(200));
        let s = short_args(&long, 40);
        assert_eq!(s.chars().count(), 40);
        assert!(s.ends_with('…'));
        assert_eq!(short_args("not json\nat all", 80), "not json at all");
    }

    #[test]
    fn result_lines_prefer_output_of_structured_results() {
        let r = json!({"stdout": "a\nb\n\nc\nd\n", "stderr": "", "error": null}).to_string();
        assert_eq!(result_lines(&r, 3), vec!["a", "b", "c", "… 1 more lines"]);
        let e = json!({"stdout": "", "error": {"ename": "ZeroDivisionError", "evalue": "division by zero"}}).to_string();
        assert_eq!(
            result_lines(&e, 3),
            vec!["ZeroDivisionError: division by zero"]
        );
        assert_eq!(
            result_lines("plain\ntext", 1),
            vec!["plain", "… 1 more lines"]
        );
    }

    #[test]
    fn a_moved_turn_keeps_only_the_reissued_answer() {
        let ev = |kind| ChatEvent {
            execution_context_id: "root".into(),
            kind: Some(kind),
            ..Default::default()
        };
        let text = |t: &str| {
            ev(chat_event::Kind::TextDelta(omicos_proto::TextDelta {
                text: t.into(),
            }))
        };
        let mut r = Renderer::with_styles(View::Json, Style::plain(), Style::plain());
        r.event(&text("Listing. "));
        r.event(&ev(chat_event::Kind::ToolCallFinished(ToolCallFinished {
            call_id: "c1".into(),
            ..Default::default()
        })));
        r.event(&text("There are no fi"));
        r.event(&ev(chat_event::Kind::TurnMoved(omicos_proto::TurnMoved {
            model_request_reissued: true,
            ..Default::default()
        })));
        r.event(&text("There are no files."));
        assert_eq!(r.answer, "Listing. There are no files.");
        // Not reissued: nothing is superseded.
        r.event(&ev(chat_event::Kind::TurnMoved(
            omicos_proto::TurnMoved::default(),
        )));
        assert_eq!(r.answer, "Listing. There are no files.");
        let v = event_json(&ev(chat_event::Kind::Rewound(omicos_proto::Rewound {
            turn_ids: vec!["t2".into()],
            files_restored: vec!["a.txt".into()],
            ..Default::default()
        })));
        assert_eq!(v["type"], "rewound");
        assert_eq!(v["files_restored"][0], "a.txt");
    }

    #[test]
    fn json_lines_carry_the_envelope_and_the_kind() {
        let ev = ChatEvent {
            session_id: "s".into(),
            event_seq: 7,
            execution_context_id: "root/c1".into(),
            agent_id: "data_analyst".into(),
            kind: Some(chat_event::Kind::ToolCallFinished(ToolCallFinished {
                call_id: "c2".into(),
                name: "run_python_code".into(),
                status: omicos_proto::ToolStatus::Done.into(),
                elapsed_ms: 12,
                ..Default::default()
            })),
            ..Default::default()
        };
        let v = event_json(&ev);
        assert_eq!(v["type"], "tool_call_finished");
        assert_eq!(v["event_seq"], 7);
        assert_eq!(v["name"], "run_python_code");
        assert_eq!(v["execution_context_id"], "root/c1");
        assert_eq!(depth("root/c1/c9"), 2);
        assert_eq!(
            decision_name(Decision::AllowSession as i32),
            "allow_session"
        );
    }
}
