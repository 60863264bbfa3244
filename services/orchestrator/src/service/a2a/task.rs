//! An A2A task is an omicos turn: its state is a fold of the turn's events
//! in the session's log ([`TaskView::apply`]), so any replica answers
//! `GetTask` from the store, and nothing but the log holds a task.
//! [`Dialect`] writes the view in A2A 1.0's ProtoJSON shapes or in 0.3's
//! (with `kind` discriminators and lowercase states).

use omicos_proto::{ChatEvent, TurnDoneReason, chat_event};
use serde_json::{Value, json};

/// The artifact that holds a turn's answer.
pub const ANSWER_ARTIFACT: &str = "answer";

/// The task id of a turn: the session and the turn, so that any replica can
/// find the task's log and its owner from the id alone.
pub fn task_id(session: &str, turn: &str) -> String {
    format!("{session}{TASK_ID_SEP}{turn}")
}

/// Between the session and the turn in a task id (neither id contains it:
/// both are UUIDs).
const TASK_ID_SEP: char = ':';

/// The session and turn a task id names, or None when it is not one of ours.
pub fn parse_task_id(id: &str) -> Option<(&str, &str)> {
    let (s, t) = id.rsplit_once(TASK_ID_SEP)?;
    (!s.is_empty() && !t.is_empty()).then_some((s, t))
}

/// A2A task states omicos reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Accepted, not started yet.
    Submitted,
    /// The turn runs.
    Working,
    /// A tool call waits for an approval.
    InputRequired,
    /// The turn answered.
    Completed,
    /// The turn was cancelled.
    Canceled,
    /// The turn ended on an error or a limit.
    Failed,
}

impl TaskState {
    /// Whether nothing more happens to the task.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Canceled | Self::Failed)
    }

    /// 1.0's name (ProtoJSON writes an enum by its proto name).
    fn v1(self) -> &'static str {
        self.proto().as_str_name()
    }

    fn v03(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::InputRequired => "input-required",
            Self::Completed => "completed",
            Self::Canceled => "canceled",
            Self::Failed => "failed",
        }
    }
}

/// What a task is, as its events tell it.
#[derive(Clone, Debug)]
pub struct TaskView {
    /// The session.
    pub session: String,
    /// The turn.
    pub turn: String,
    /// The state.
    pub state: TaskState,
    /// The user's message that started the turn.
    pub prompt: String,
    /// The text of the root agent's last model answer so far.
    pub answer: String,
    /// Why the task is input-required, failed or canceled, in words.
    pub note: String,
    /// Milliseconds since the epoch of the last event.
    pub timestamp_ms: i64,
}

impl TaskView {
    /// A task just accepted, before its first event.
    pub fn submitted(session: &str, turn: &str, prompt: &str) -> Self {
        Self {
            session: session.into(),
            turn: turn.into(),
            state: TaskState::Submitted,
            prompt: prompt.into(),
            answer: String::new(),
            note: String::new(),
            timestamp_ms: 0,
        }
    }

    /// Applies one event of the session; events of other turns change nothing.
    pub fn apply(&mut self, ev: &ChatEvent) {
        if ev.turn_id != self.turn {
            return;
        }
        if ev.timestamp_ms > 0 {
            self.timestamp_ms = ev.timestamp_ms;
        }
        let root = ev.execution_context_id.is_empty() || ev.execution_context_id == "root";
        match &ev.kind {
            Some(chat_event::Kind::TurnStarted(t)) => {
                self.prompt = t.message.clone();
                self.state = TaskState::Working;
            }
            Some(chat_event::Kind::TextDelta(d)) if root => self.answer.push_str(&d.text),
            // A new model answer follows every tool call: the answer is the last one's text.
            Some(chat_event::Kind::ToolCallStarted(_)) if root => self.answer.clear(),
            Some(chat_event::Kind::ToolApprovalRequest(r)) => {
                self.state = TaskState::InputRequired;
                self.note = format!(
                    "the tool call {} ({}) waits for an approval (omicos ApproveTool, or the page)",
                    r.call_id, r.tool_name
                );
            }
            Some(chat_event::Kind::ToolApprovalResolved(_))
                if self.state == TaskState::InputRequired =>
            {
                self.state = TaskState::Working;
                self.note.clear();
            }
            Some(chat_event::Kind::Error(e)) => {
                self.note = format!("{}: {}", e.kind, e.message);
            }
            Some(chat_event::Kind::TurnDone(d)) => {
                let reason = TurnDoneReason::try_from(d.reason).unwrap_or_default();
                self.state = match reason {
                    TurnDoneReason::Completed => TaskState::Completed,
                    TurnDoneReason::Cancelled => TaskState::Canceled,
                    _ => TaskState::Failed,
                };
                if self.state == TaskState::Failed && self.note.is_empty() {
                    self.note = if d.detail.is_empty() {
                        format!("the turn ended: {}", reason.as_str())
                    } else {
                        format!("the turn ended: {}: {}", reason.as_str(), d.detail)
                    };
                }
            }
            _ => {}
        }
    }

    /// The task id.
    pub fn id(&self) -> String {
        task_id(&self.session, &self.turn)
    }

    /// The task's messages, oldest first: the user's, then the answer once
    /// the task completed. Each is (message id, from the agent, text).
    pub fn history(&self) -> Vec<(String, bool, &str)> {
        let mut h = vec![(format!("{}-user", self.turn), false, self.prompt.as_str())];
        if let Some(a) = self.artifact_text() {
            h.push((format!("{}-agent", self.turn), true, a));
        }
        h
    }

    /// The answer artifact's text: only a completed task has one.
    pub fn artifact_text(&self) -> Option<&str> {
        (self.state == TaskState::Completed).then_some(self.answer.as_str())
    }

    /// The status's message (why the task is input-required, failed or
    /// canceled): its id and text.
    pub fn status_note(&self) -> Option<(String, &str)> {
        (!self.note.is_empty()).then(|| (format!("{}-status", self.turn), self.note.as_str()))
    }
}

/// Every task (turn) of one session's events, in the order the turns started.
pub fn tasks_of(session: &str, events: &[ChatEvent]) -> Vec<TaskView> {
    let mut tasks: Vec<TaskView> = vec![];
    for ev in events {
        if ev.turn_id.is_empty() {
            continue;
        }
        let i = match tasks.iter().rposition(|t| t.turn == ev.turn_id) {
            Some(i) => i,
            None => {
                tasks.push(TaskView::submitted(session, &ev.turn_id, ""));
                tasks.len() - 1
            }
        };
        tasks[i].apply(ev);
    }
    tasks
}

/// Which A2A version's JSON a request is answered in: the one its method
/// name belongs to (`SendMessage` is 1.0, `message/send` is 0.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// A2A 1.0: ProtoJSON of `a2a.proto` (`TASK_STATE_*`, `ROLE_*`, oneof fields).
    V1,
    /// A2A 0.3: `kind` discriminators, lowercase states and roles.
    V03,
}

impl Dialect {
    fn role(self, agent: bool) -> &'static str {
        match (self, agent) {
            (Dialect::V1, true) => "ROLE_AGENT",
            (Dialect::V1, false) => "ROLE_USER",
            (Dialect::V03, true) => "agent",
            (Dialect::V03, false) => "user",
        }
    }

    fn text_part(self, text: &str) -> Value {
        match self {
            Dialect::V1 => json!({"text": text}),
            Dialect::V03 => json!({"kind": "text", "text": text}),
        }
    }

    /// A message of the task (`agent`: from the agent, else the user's).
    pub fn message(self, t: &TaskView, id: &str, agent: bool, text: &str) -> Value {
        let mut m = json!({
            "messageId": id,
            "contextId": t.session,
            "taskId": t.id(),
            "role": self.role(agent),
            "parts": [self.text_part(text)],
        });
        if self == Dialect::V03 {
            m["kind"] = json!("message");
        }
        m
    }

    /// The task's status.
    pub fn status(self, t: &TaskView) -> Value {
        let mut s = json!({
            "state": match self {
                Dialect::V1 => t.state.v1(),
                Dialect::V03 => t.state.v03(),
            },
        });
        if t.timestamp_ms > 0
            && let Some(ts) = chrono_rfc3339(t.timestamp_ms)
        {
            s["timestamp"] = json!(ts);
        }
        if let Some((id, note)) = t.status_note() {
            s["message"] = self.message(t, &id, true, note);
        }
        s
    }

    /// The answer artifact.
    pub fn artifact(self, t: &TaskView) -> Value {
        json!({
            "artifactId": ANSWER_ARTIFACT,
            "name": ANSWER_ARTIFACT,
            "parts": [self.text_part(t.artifact_text().unwrap_or_default())],
        })
    }

    /// The whole task: its status, the answer as an artifact once the task
    /// completed, and the history (the user's message, then the answer).
    pub fn task(self, t: &TaskView) -> Value {
        let history: Vec<Value> = t
            .history()
            .into_iter()
            .map(|(id, agent, text)| self.message(t, &id, agent, text))
            .collect();
        let mut task = json!({
            "id": t.id(),
            "contextId": t.session,
            "status": self.status(t),
        });
        if t.artifact_text().is_some() {
            task["artifacts"] = json!([self.artifact(t)]);
        }
        task["history"] = Value::Array(history);
        if self == Dialect::V03 {
            task["kind"] = json!("task");
        }
        task
    }

    /// A stream event: a whole task (the first event of a stream).
    pub fn task_event(self, t: &TaskView) -> Value {
        match self {
            Dialect::V1 => json!({"task": self.task(t)}),
            Dialect::V03 => self.task(t),
        }
    }

    /// A stream event: the task's status changed (`last`: the stream ends after it).
    pub fn status_event(self, t: &TaskView, last: bool) -> Value {
        let ev = json!({
            "taskId": t.id(),
            "contextId": t.session,
            "status": self.status(t),
        });
        match self {
            Dialect::V1 => json!({"statusUpdate": ev}),
            Dialect::V03 => {
                let mut ev = ev;
                ev["kind"] = json!("status-update");
                ev["final"] = json!(last);
                ev
            }
        }
    }

    /// A stream event: the answer artifact, whole.
    pub fn artifact_event(self, t: &TaskView) -> Value {
        let ev = json!({
            "taskId": t.id(),
            "contextId": t.session,
            "artifact": self.artifact(t),
            "append": false,
            "lastChunk": true,
        });
        match self {
            Dialect::V1 => json!({"artifactUpdate": ev}),
            Dialect::V03 => {
                let mut ev = ev;
                ev["kind"] = json!("artifact-update");
                ev
            }
        }
    }

    /// `SendMessage`'s result: a task (1.0 wraps it in its oneof).
    pub fn send_result(self, t: &TaskView) -> Value {
        self.task_event(t)
    }
}

/// The gRPC binding's rendering of a [`TaskView`]: the messages of
/// `a2a.proto` (`lf.a2a.v1`), with the same content as [`Dialect::V1`]'s JSON.
pub mod proto {
    use super::{ANSWER_ARTIFACT, TaskState, TaskView};
    use omicos_proto::a2a;

    impl TaskState {
        /// The `lf.a2a.v1.TaskState`.
        pub fn proto(self) -> a2a::TaskState {
            match self {
                Self::Submitted => a2a::TaskState::Submitted,
                Self::Working => a2a::TaskState::Working,
                Self::InputRequired => a2a::TaskState::InputRequired,
                Self::Completed => a2a::TaskState::Completed,
                Self::Canceled => a2a::TaskState::Canceled,
                Self::Failed => a2a::TaskState::Failed,
            }
        }

        /// The state an `lf.a2a.v1.TaskState` names; None for the ones omicos
        /// never reaches (unspecified, rejected, auth-required).
        pub fn from_proto(s: a2a::TaskState) -> Option<Self> {
            Some(match s {
                a2a::TaskState::Submitted => Self::Submitted,
                a2a::TaskState::Working => Self::Working,
                a2a::TaskState::InputRequired => Self::InputRequired,
                a2a::TaskState::Completed => Self::Completed,
                a2a::TaskState::Canceled => Self::Canceled,
                a2a::TaskState::Failed => Self::Failed,
                _ => return None,
            })
        }
    }

    fn text_part(text: &str) -> a2a::Part {
        a2a::Part {
            content: Some(a2a::part::Content::Text(text.to_owned())),
            ..Default::default()
        }
    }

    fn message(t: &TaskView, id: String, agent: bool, text: &str) -> a2a::Message {
        a2a::Message {
            message_id: id,
            context_id: t.session.clone(),
            task_id: t.id(),
            role: if agent {
                a2a::Role::Agent
            } else {
                a2a::Role::User
            } as i32,
            parts: vec![text_part(text)],
            ..Default::default()
        }
    }

    /// The task's status.
    pub fn status(t: &TaskView) -> a2a::TaskStatus {
        a2a::TaskStatus {
            state: t.state.proto() as i32,
            message: t.status_note().map(|(id, note)| message(t, id, true, note)),
            timestamp: (t.timestamp_ms > 0).then(|| prost_types::Timestamp {
                seconds: t.timestamp_ms.div_euclid(1000),
                nanos: (t.timestamp_ms.rem_euclid(1000) * 1_000_000) as i32,
            }),
        }
    }

    /// The answer artifact (empty text before the task completed).
    pub fn artifact(t: &TaskView) -> a2a::Artifact {
        a2a::Artifact {
            artifact_id: ANSWER_ARTIFACT.into(),
            name: ANSWER_ARTIFACT.into(),
            parts: vec![text_part(t.artifact_text().unwrap_or_default())],
            ..Default::default()
        }
    }

    /// The whole task: status, the answer as an artifact once completed, the history.
    pub fn task(t: &TaskView) -> a2a::Task {
        a2a::Task {
            id: t.id(),
            context_id: t.session.clone(),
            status: Some(status(t)),
            artifacts: t.artifact_text().map(|_| artifact(t)).into_iter().collect(),
            history: t
                .history()
                .into_iter()
                .map(|(id, agent, text)| message(t, id, agent, text))
                .collect(),
            metadata: None,
        }
    }

    /// A stream event: the whole task.
    pub fn task_event(t: &TaskView) -> a2a::StreamResponse {
        a2a::StreamResponse {
            payload: Some(a2a::stream_response::Payload::Task(task(t))),
        }
    }

    /// A stream event: the task's status changed.
    pub fn status_event(t: &TaskView) -> a2a::StreamResponse {
        a2a::StreamResponse {
            payload: Some(a2a::stream_response::Payload::StatusUpdate(
                a2a::TaskStatusUpdateEvent {
                    task_id: t.id(),
                    context_id: t.session.clone(),
                    status: Some(status(t)),
                    metadata: None,
                },
            )),
        }
    }

    /// A stream event: the answer artifact, whole.
    pub fn artifact_event(t: &TaskView) -> a2a::StreamResponse {
        a2a::StreamResponse {
            payload: Some(a2a::stream_response::Payload::ArtifactUpdate(
                a2a::TaskArtifactUpdateEvent {
                    task_id: t.id(),
                    context_id: t.session.clone(),
                    artifact: Some(artifact(t)),
                    append: false,
                    last_chunk: true,
                    metadata: None,
                },
            )),
        }
    }
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds (what ProtoJSON's
/// Timestamp and 0.3's ISO 8601 strings both accept).
fn chrono_rfc3339(ms: i64) -> Option<String> {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    Some(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    ))
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use omicos_proto::{TextDelta, ToolCallStarted, TurnDone, TurnStarted};

    fn ev(turn: &str, ctx: &str, kind: chat_event::Kind) -> ChatEvent {
        ChatEvent {
            session_id: "s".into(),
            turn_id: turn.into(),
            execution_context_id: ctx.into(),
            timestamp_ms: 1_767_225_600_123,
            kind: Some(kind),
            ..Default::default()
        }
    }

    #[test]
    fn task_ids_round_trip() {
        let id = task_id("0b7c-s", "9f1e-t");
        assert_eq!(parse_task_id(&id), Some(("0b7c-s", "9f1e-t")));
        assert_eq!(parse_task_id("nosep"), None);
        assert_eq!(parse_task_id(":t"), None);
        assert_eq!(parse_task_id("s:"), None);
    }

    #[test]
    fn the_answer_is_the_root_agents_last_text() {
        let mut t = TaskView::submitted("s", "t1", "hi");
        for e in [
            ev(
                "t1",
                "root",
                chat_event::Kind::TurnStarted(TurnStarted {
                    message: "hi".into(),
                    ..Default::default()
                }),
            ),
            ev(
                "t1",
                "root",
                chat_event::Kind::TextDelta(TextDelta {
                    text: "let me look".into(),
                }),
            ),
            ev(
                "t1",
                "root",
                chat_event::Kind::ToolCallStarted(ToolCallStarted::default()),
            ),
            ev(
                "t1",
                "root/c1",
                chat_event::Kind::TextDelta(TextDelta {
                    text: "sub-agent text".into(),
                }),
            ),
            ev(
                "t0",
                "root",
                chat_event::Kind::TextDelta(TextDelta {
                    text: "another turn".into(),
                }),
            ),
            ev(
                "t1",
                "root",
                chat_event::Kind::TextDelta(TextDelta {
                    text: "Done.".into(),
                }),
            ),
        ] {
            t.apply(&e);
        }
        assert_eq!(t.state, TaskState::Working);
        t.apply(&ev(
            "t1",
            "root",
            chat_event::Kind::TurnDone(TurnDone {
                reason: TurnDoneReason::Completed as i32,
                ..Default::default()
            }),
        ));
        assert_eq!(t.state, TaskState::Completed);
        assert_eq!(t.answer, "Done.");
        let v1 = Dialect::V1.task(&t);
        assert_eq!(v1["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(v1["status"]["timestamp"], "2026-01-01T00:00:00.123Z");
        assert_eq!(v1["artifacts"][0]["parts"][0]["text"], "Done.");
        assert_eq!(v1["history"][0]["role"], "ROLE_USER");
        assert!(v1.get("kind").is_none());
        let v03 = Dialect::V03.task(&t);
        assert_eq!(v03["kind"], "task");
        assert_eq!(v03["status"]["state"], "completed");
        assert_eq!(v03["artifacts"][0]["parts"][0]["kind"], "text");
        assert_eq!(v03["history"][1]["role"], "agent");
        assert_eq!(Dialect::V03.status_event(&t, true)["final"], true);
        assert_eq!(Dialect::V03.status_event(&t, true)["kind"], "status-update");
    }

    #[test]
    fn a_stopped_turn_is_failed_with_why() {
        let mut t = TaskView::submitted("s", "t1", "hi");
        t.apply(&ev(
            "t1",
            "root",
            chat_event::Kind::TurnDone(TurnDone {
                reason: TurnDoneReason::Budget as i32,
                detail: "turn tokens".into(),
                ..Default::default()
            }),
        ));
        assert_eq!(t.state, TaskState::Failed);
        assert!(t.note.contains("turn tokens"), "{}", t.note);
        let v1 = Dialect::V1.task(&t);
        assert_eq!(v1["status"]["message"]["role"], "ROLE_AGENT");
        assert!(v1.get("artifacts").is_none());
    }
}
