//! Stage 5: tool hooks, with the hook contract of Claude Code and codex so
//! existing hook scripts work unchanged. The handlers (`command` and
//! `http`, their timeouts and exit codes) run in [`omicos_hooks`], the same
//! code the orchestrator uses for its events; this stage says what their
//! answers mean for a tool call.
//!
//! - Events: PreToolUse, PermissionRequest, PostToolUse, PostToolUseFailure,
//!   each with a regex matcher on tool_name (anchored; empty or `*` = all).
//! - Every handler gets JSON: session_id, transcript_path, cwd,
//!   permission_mode, hook_event_name, tool_name, tool_input, tool_use_id,
//!   and tool_response or error.
//! - The handlers of one event run in parallel; their answers are read in
//!   config order: deny over ask over allow, the last rewrite wins, contexts
//!   are kept in order.
//! - A command's exit 2 blocks with stderr as the reason; other codes, a
//!   non-2xx http answer or an unreachable server are non-blocking errors,
//!   recorded. A timed-out `command` PreToolUse hook blocks unless
//!   `pre_tool_use_timeout_blocks` is false; a timed-out `http` hook never
//!   blocks (a server that does not answer has no say, as in Claude Code).

use crate::config::HooksConfig;
use crate::error::RunnerError;
use crate::record::{HookEvent, HookOutcome, HookResult};
use omicos_hooks::{Answer, HandlerKind, HookHandler, HookMatcher, Matchers, Outcome};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn compile_all(list: &[HookMatcher]) -> Result<Matchers, RunnerError> {
    Matchers::compile(list).map_err(|(i, e)| RunnerError::HookMatcher {
        matcher: list[i].matcher.clone(),
        source: Box::new(e),
    })
}

/// The configured hooks, compiled.
pub struct Hooks {
    pre: Matchers,
    permission: Matchers,
    post: Matchers,
    post_failure: Matchers,
    pre_timeout_blocks: bool,
    cwd: PathBuf,
}

/// What every hook of a call is told.
#[derive(Clone, Debug)]
pub struct HookInput<'a> {
    /// Chat session.
    pub session_id: &'a str,
    /// The orchestrator's trajectory file, if known.
    pub transcript_path: &'a str,
    /// Effective permission mode (read_only, auto, full).
    pub permission_mode: &'a str,
    /// Resolved tool name.
    pub tool_name: &'a str,
    /// The arguments about to run (or that ran).
    pub tool_input: &'a Value,
    /// The call id.
    pub tool_use_id: &'a str,
}

/// A hook's say on whether the call runs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Verdict {
    /// No opinion.
    #[default]
    None,
    /// Run without asking.
    Allow,
    /// Ask the user.
    Ask(String),
    /// Do not run; the reason goes to the model.
    Deny(String),
}

impl Verdict {
    fn rank(&self) -> u8 {
        match self {
            Verdict::None => 0,
            Verdict::Allow => 1,
            Verdict::Ask(_) => 2,
            Verdict::Deny(_) => 3,
        }
    }
    fn merge(&mut self, other: Verdict) {
        if other.rank() > self.rank() {
            *self = other;
        }
    }
}

/// What the PreToolUse or PermissionRequest hooks decided.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// Combined verdict: deny over ask over allow.
    pub verdict: Verdict,
    /// A rewritten input (validated again by the pipeline).
    pub updated_input: Option<Value>,
    /// Extra context for the model.
    pub context: Vec<String>,
}

/// What the PostToolUse hooks decided.
#[derive(Clone, Debug, Default)]
pub struct PostDecision {
    /// Block the result; the reason replaces it as an error.
    pub block: Option<String>,
    /// Replace the tool's output.
    pub updated_output: Option<Value>,
    /// Extra context for the model.
    pub context: Vec<String>,
}

impl Hooks {
    /// Compiles the configured hooks; `cwd` is the workspace.
    pub fn new(
        cfg: &HooksConfig,
        cwd: &Path,
        pre_timeout_blocks: bool,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            pre: compile_all(&cfg.pre_tool_use)?,
            permission: compile_all(&cfg.permission_request)?,
            post: compile_all(&cfg.post_tool_use)?,
            post_failure: compile_all(&cfg.post_tool_use_failure)?,
            pre_timeout_blocks,
            cwd: cwd.to_path_buf(),
        })
    }

    /// Whether a PostToolUse or PostToolUseFailure hook is configured.
    pub fn has_post(&self) -> bool {
        !self.post.is_empty() || !self.post_failure.is_empty()
    }

    fn payload(&self, event: HookEvent, input: &HookInput<'_>) -> Value {
        json!({
            "session_id": input.session_id,
            "transcript_path": input.transcript_path,
            "cwd": self.cwd.display().to_string(),
            "permission_mode": input.permission_mode,
            "hook_event_name": event.as_str(),
            "tool_name": input.tool_name,
            "tool_input": input.tool_input,
            "tool_use_id": input.tool_use_id,
        })
    }

    /// Runs the handlers of `list` that match `tool`, in parallel; each
    /// answer comes back in config order with its record started.
    async fn run(
        &self,
        event: HookEvent,
        list: &Matchers,
        tool: &str,
        payload: &Value,
    ) -> Vec<(HookOutcome, Step)> {
        let handlers = list.matching(tool);
        let outcomes = omicos_hooks::run_all(&handlers, payload, &self.cwd).await;
        handlers
            .into_iter()
            .zip(outcomes)
            .map(|(h, o)| classify(event, h, o))
            .collect()
    }

    /// PreToolUse: allow, deny or ask; rewrite the input; add context.
    pub async fn pre_tool_use(
        &self,
        input: &HookInput<'_>,
        records: &mut Vec<HookOutcome>,
    ) -> Decision {
        let mut out = Decision::default();
        if self.pre.is_empty() {
            return out;
        }
        let payload = self.payload(HookEvent::PreToolUse, input);
        let answers = self
            .run(HookEvent::PreToolUse, &self.pre, input.tool_name, &payload)
            .await;
        for (mut rec, step) in answers {
            let verdict = match step {
                Step::TimedOut { kind, limit } => {
                    if self.pre_timeout_blocks && kind == HandlerKind::Command {
                        Verdict::Deny(format!(
                            "blocked: the PreToolUse hook `{}` timed out after {limit:?} (a timed-out PreToolUse hook blocks the call)",
                            rec.command
                        ))
                    } else {
                        Verdict::None
                    }
                }
                Step::Block(reason) => {
                    Verdict::Deny(format!("blocked by PreToolUse hook: {reason}"))
                }
                Step::Json(j) => {
                    let v = pre_verdict(&j);
                    let hso = j.get("hookSpecificOutput");
                    if let Some(u) = hso
                        .and_then(|h| h.get("updatedInput"))
                        .filter(|u| u.is_object())
                    {
                        out.updated_input = Some(u.clone());
                        rec.outcome = HookResult::UpdatedInput;
                    }
                    if let Some(c) = hso
                        .and_then(|h| h.get("additionalContext"))
                        .and_then(Value::as_str)
                    {
                        out.context.push(c.to_owned());
                    }
                    label(&mut rec, &v);
                    v
                }
                Step::Nothing => Verdict::None,
            };
            records.push(rec);
            out.verdict.merge(verdict);
        }
        out
    }

    /// PermissionRequest: allow or deny on the user's behalf (else the user is asked).
    pub async fn permission_request(
        &self,
        input: &HookInput<'_>,
        records: &mut Vec<HookOutcome>,
    ) -> Decision {
        let mut out = Decision::default();
        if self.permission.is_empty() {
            return out;
        }
        let payload = self.payload(HookEvent::PermissionRequest, input);
        let answers = self
            .run(
                HookEvent::PermissionRequest,
                &self.permission,
                input.tool_name,
                &payload,
            )
            .await;
        for (mut rec, step) in answers {
            let verdict = match step {
                Step::TimedOut { .. } | Step::Nothing => Verdict::None,
                Step::Block(reason) => {
                    Verdict::Deny(format!("denied by PermissionRequest hook: {reason}"))
                }
                Step::Json(j) => {
                    let d = j.get("hookSpecificOutput").and_then(|h| h.get("decision"));
                    let behavior = d
                        .and_then(|d| d.get("behavior"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let message = d
                        .and_then(|d| d.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    if let Some(u) = d
                        .and_then(|d| d.get("updatedInput"))
                        .filter(|u| u.is_object())
                    {
                        out.updated_input = Some(u.clone());
                    }
                    let v = match behavior {
                        "allow" => Verdict::Allow,
                        "deny" => Verdict::Deny(if message.is_empty() {
                            "denied by PermissionRequest hook".into()
                        } else {
                            format!("denied by PermissionRequest hook: {message}")
                        }),
                        _ => Verdict::None,
                    };
                    label(&mut rec, &v);
                    v
                }
            };
            records.push(rec);
            out.verdict.merge(verdict);
        }
        out
    }

    /// PostToolUse: block or replace the output; add context.
    pub async fn post_tool_use(
        &self,
        input: &HookInput<'_>,
        response: &Value,
        records: &mut Vec<HookOutcome>,
    ) -> PostDecision {
        let mut out = PostDecision::default();
        if self.post.is_empty() {
            return out;
        }
        let mut payload = self.payload(HookEvent::PostToolUse, input);
        payload["tool_response"] = response.clone();
        let answers = self
            .run(
                HookEvent::PostToolUse,
                &self.post,
                input.tool_name,
                &payload,
            )
            .await;
        for (mut rec, step) in answers {
            match step {
                Step::TimedOut { .. } | Step::Nothing => {}
                Step::Block(reason) => {
                    rec.outcome = HookResult::Block;
                    out.block.get_or_insert(reason);
                }
                Step::Json(j) => {
                    if j.get("continue") == Some(&Value::Bool(false))
                        || j.get("decision").and_then(Value::as_str) == Some("block")
                    {
                        let reason = j
                            .get("reason")
                            .or_else(|| j.get("stopReason"))
                            .and_then(Value::as_str)
                            .unwrap_or("blocked by PostToolUse hook");
                        rec.outcome = HookResult::Block;
                        out.block.get_or_insert_with(|| reason.to_owned());
                    }
                    let hso = j.get("hookSpecificOutput");
                    if let Some(o) = hso.and_then(|h| {
                        h.get("updatedToolOutput")
                            .or_else(|| h.get("updatedMCPToolOutput"))
                    }) {
                        out.updated_output = Some(o.clone());
                        if rec.outcome != HookResult::Block {
                            rec.outcome = HookResult::UpdatedOutput;
                        }
                    }
                    if let Some(c) = hso
                        .and_then(|h| h.get("additionalContext"))
                        .and_then(Value::as_str)
                    {
                        out.context.push(c.to_owned());
                        if rec.outcome == HookResult::None {
                            rec.outcome = HookResult::Context;
                        }
                    }
                }
            }
            records.push(rec);
        }
        out
    }

    /// PostToolUseFailure: add context to the error the model sees.
    pub async fn post_tool_use_failure(
        &self,
        input: &HookInput<'_>,
        error: &str,
        records: &mut Vec<HookOutcome>,
    ) -> Vec<String> {
        let mut context = Vec::new();
        if self.post_failure.is_empty() {
            return context;
        }
        let mut payload = self.payload(HookEvent::PostToolUseFailure, input);
        payload["error"] = Value::String(error.to_owned());
        payload["is_interrupt"] = Value::Bool(error == "cancelled");
        let answers = self
            .run(
                HookEvent::PostToolUseFailure,
                &self.post_failure,
                input.tool_name,
                &payload,
            )
            .await;
        for (mut rec, step) in answers {
            match step {
                Step::TimedOut { .. } | Step::Nothing => {}
                Step::Block(reason) => context.push(reason),
                Step::Json(j) => {
                    if let Some(c) = j
                        .get("hookSpecificOutput")
                        .and_then(|h| h.get("additionalContext"))
                        .and_then(Value::as_str)
                    {
                        context.push(c.to_owned());
                        rec.outcome = HookResult::Context;
                    }
                }
            }
            records.push(rec);
        }
        context
    }
}

/// What a tool event reads from one handler's answer.
enum Step {
    /// Exit 2: block with this reason.
    Block(String),
    /// A JSON object of decision fields.
    Json(Value),
    /// It ran past its timeout.
    TimedOut {
        kind: HandlerKind,
        limit: std::time::Duration,
    },
    /// No opinion, or a non-blocking error (recorded).
    Nothing,
}

/// The record of one handler's run, and what the event reads from it.
fn classify(event: HookEvent, h: &HookHandler, o: Outcome) -> (HookOutcome, Step) {
    let mut rec = HookOutcome {
        event,
        command: h.label().to_owned(),
        exit_code: o.exit_code,
        outcome: HookResult::None,
        message: String::new(),
        elapsed_ms: u64::try_from(o.elapsed.as_millis()).unwrap_or(u64::MAX),
    };
    let step = match o.answer {
        Answer::Json(j) => Step::Json(j),
        Answer::Nothing => Step::Nothing,
        Answer::Block(reason) => {
            rec.outcome = HookResult::Block;
            rec.message = reason.clone();
            Step::Block(reason)
        }
        Answer::Text(t) => {
            rec.outcome = HookResult::Error;
            rec.message = format!(
                "hook output is not a JSON object (ignored): {}",
                t.chars().take(300).collect::<String>()
            );
            Step::Nothing
        }
        Answer::Failed(e) => {
            rec.outcome = HookResult::Error;
            rec.message = e;
            Step::Nothing
        }
        Answer::TimedOut(limit) => {
            rec.outcome = HookResult::Timeout;
            rec.message = format!("timed out after {limit:?}");
            Step::TimedOut {
                kind: h.kind,
                limit,
            }
        }
    };
    (rec, step)
}

fn pre_verdict(j: &Value) -> Verdict {
    if j.get("continue") == Some(&Value::Bool(false)) {
        let why = j
            .get("stopReason")
            .and_then(Value::as_str)
            .unwrap_or("the hook stopped the call");
        return Verdict::Deny(format!("blocked by PreToolUse hook: {why}"));
    }
    let hso = j.get("hookSpecificOutput");
    let reason = hso
        .and_then(|h| h.get("permissionDecisionReason"))
        .or_else(|| j.get("reason"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let decision = hso
        .and_then(|h| h.get("permissionDecision"))
        .and_then(Value::as_str)
        // The older top-level form: "approve" | "block".
        .or_else(|| j.get("decision").and_then(Value::as_str));
    match decision {
        Some("allow") | Some("approve") => Verdict::Allow,
        Some("deny") | Some("block") => Verdict::Deny(if reason.is_empty() {
            "blocked by PreToolUse hook".into()
        } else {
            format!("blocked by PreToolUse hook: {reason}")
        }),
        Some("ask") => Verdict::Ask(reason),
        _ => Verdict::None,
    }
}

fn label(rec: &mut HookOutcome, v: &Verdict) {
    let (outcome, msg) = match v {
        Verdict::None => return,
        Verdict::Allow => (HookResult::Allow, String::new()),
        Verdict::Ask(r) => (HookResult::Ask, r.clone()),
        Verdict::Deny(r) => (HookResult::Deny, r.clone()),
    };
    rec.outcome = outcome;
    rec.message = msg;
}
