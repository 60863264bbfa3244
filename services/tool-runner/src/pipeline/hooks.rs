//! Stage 5: command hooks, compatible with the hook contract of Claude Code and
//! codex so existing hook scripts work unchanged.
//!
//! - Events: PreToolUse, PermissionRequest, PostToolUse, PostToolUseFailure,
//!   each with a regex matcher on tool_name (anchored; empty or `*` = all).
//! - The command runs with `sh -c` in the workspace, with JSON on stdin:
//!   session_id, transcript_path, cwd, permission_mode, hook_event_name,
//!   tool_name, tool_input, tool_use_id, and tool_response or error.
//! - Exit 0: stdout is parsed as JSON (empty stdout: no opinion). Exit 2: the
//!   call is blocked with stderr as the reason. Other codes: a non-blocking
//!   error, recorded. Each hook has a timeout; a timed-out PreToolUse blocks
//!   unless `pre_tool_use_timeout_blocks` is false.

use crate::config::{HookCommand, HookMatcher, HooksConfig};
use crate::error::RunnerError;
use crate::record::{HookEvent, HookOutcome, HookResult};
use regex::Regex;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Default hook timeout, as in Claude Code.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// Compiles a matcher: anchored regex; empty or `*` matches everything.
pub fn compile_matcher(m: &str) -> Result<Option<Regex>, RunnerError> {
    let m = m.trim();
    if m.is_empty() || m == "*" {
        return Ok(None);
    }
    Regex::new(&format!("^(?:{m})$"))
        .map(Some)
        .map_err(|e| RunnerError::HookMatcher {
            matcher: m.to_owned(),
            source: Box::new(e),
        })
}

struct Matcher {
    re: Option<Regex>,
    hooks: Vec<HookCommand>,
}

impl Matcher {
    fn matches(&self, tool: &str) -> bool {
        self.re.as_ref().is_none_or(|r| r.is_match(tool))
    }
}

fn compile_all(list: &[HookMatcher]) -> Result<Vec<Matcher>, RunnerError> {
    list.iter()
        .map(|m| {
            Ok(Matcher {
                re: compile_matcher(&m.matcher)?,
                hooks: m.hooks.clone(),
            })
        })
        .collect()
}

/// The configured hooks, compiled.
pub struct Hooks {
    pre: Vec<Matcher>,
    permission: Vec<Matcher>,
    post: Vec<Matcher>,
    post_failure: Vec<Matcher>,
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

struct Raw {
    exit: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
    spawn_error: Option<String>,
    elapsed: Duration,
    timeout: Duration,
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

    fn matching<'a>(
        list: &'a [Matcher],
        tool: &'a str,
    ) -> impl Iterator<Item = &'a HookCommand> + 'a {
        list.iter()
            .filter(move |m| m.matches(tool))
            .flat_map(|m| m.hooks.iter())
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
        for cmd in Self::matching(&self.pre, input.tool_name) {
            let raw = self.run(cmd, &payload).await;
            let mut rec = record(HookEvent::PreToolUse, cmd, &raw);
            let verdict = if raw.timed_out {
                rec.outcome = HookResult::Timeout;
                if self.pre_timeout_blocks {
                    Verdict::Deny(format!(
                        "blocked: the PreToolUse hook `{}` timed out after {}s (a timed-out PreToolUse hook blocks the call)",
                        cmd.command,
                        raw.timeout.as_secs()
                    ))
                } else {
                    Verdict::None
                }
            } else {
                match classify(&raw, &mut rec) {
                    Exit::Block(reason) => {
                        Verdict::Deny(format!("blocked by PreToolUse hook: {reason}"))
                    }
                    Exit::Json(j) => {
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
                    Exit::Nothing => Verdict::None,
                }
            };
            records.push(rec);
            let deny = matches!(verdict, Verdict::Deny(_));
            out.verdict.merge(verdict);
            if deny {
                break;
            }
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
        for cmd in Self::matching(&self.permission, input.tool_name) {
            let raw = self.run(cmd, &payload).await;
            let mut rec = record(HookEvent::PermissionRequest, cmd, &raw);
            let verdict = if raw.timed_out {
                rec.outcome = HookResult::Timeout;
                Verdict::None
            } else {
                match classify(&raw, &mut rec) {
                    Exit::Block(reason) => {
                        Verdict::Deny(format!("denied by PermissionRequest hook: {reason}"))
                    }
                    Exit::Json(j) => {
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
                    Exit::Nothing => Verdict::None,
                }
            };
            records.push(rec);
            let deny = matches!(verdict, Verdict::Deny(_));
            out.verdict.merge(verdict);
            if deny {
                break;
            }
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
        for cmd in Self::matching(&self.post, input.tool_name) {
            let raw = self.run(cmd, &payload).await;
            let mut rec = record(HookEvent::PostToolUse, cmd, &raw);
            if raw.timed_out {
                rec.outcome = HookResult::Timeout;
            } else {
                match classify(&raw, &mut rec) {
                    Exit::Block(reason) => {
                        rec.outcome = HookResult::Block;
                        out.block = Some(reason);
                    }
                    Exit::Json(j) => {
                        if j.get("continue") == Some(&Value::Bool(false))
                            || j.get("decision").and_then(Value::as_str) == Some("block")
                        {
                            let reason = j
                                .get("reason")
                                .or_else(|| j.get("stopReason"))
                                .and_then(Value::as_str)
                                .unwrap_or("blocked by PostToolUse hook");
                            rec.outcome = HookResult::Block;
                            out.block = Some(reason.to_owned());
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
                    Exit::Nothing => {}
                }
            }
            records.push(rec);
            if out.block.is_some() {
                break;
            }
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
        for cmd in Self::matching(&self.post_failure, input.tool_name) {
            let raw = self.run(cmd, &payload).await;
            let mut rec = record(HookEvent::PostToolUseFailure, cmd, &raw);
            if raw.timed_out {
                rec.outcome = HookResult::Timeout;
            } else {
                match classify(&raw, &mut rec) {
                    Exit::Block(reason) => context.push(reason),
                    Exit::Json(j) => {
                        if let Some(c) = j
                            .get("hookSpecificOutput")
                            .and_then(|h| h.get("additionalContext"))
                            .and_then(Value::as_str)
                        {
                            context.push(c.to_owned());
                            rec.outcome = HookResult::Context;
                        }
                    }
                    Exit::Nothing => {}
                }
            }
            records.push(rec);
        }
        context
    }

    async fn run(&self, cmd: &HookCommand, payload: &Value) -> Raw {
        let timeout = cmd
            .timeout
            .unwrap_or(Duration::from_secs(DEFAULT_TIMEOUT_SECS));
        let started = Instant::now();
        let mut raw = Raw {
            exit: None,
            stdout: String::new(),
            stderr: String::new(),
            timed_out: false,
            spawn_error: None,
            elapsed: Duration::ZERO,
            timeout,
        };
        let spawned = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd.command)
            .current_dir(&self.cwd)
            .env("CLAUDE_PROJECT_DIR", &self.cwd)
            .env("OMICOS_WORKSPACE", &self.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                raw.spawn_error = Some(format!("cannot start hook: {e}"));
                raw.elapsed = started.elapsed();
                return raw;
            }
        };
        let pid = child.id();
        if let Some(mut stdin) = child.stdin.take() {
            let bytes = payload.to_string().into_bytes();
            // A hook that does not read its stdin must not block us.
            tokio::spawn(async move {
                let _ = stdin.write_all(&bytes).await;
                let _ = stdin.shutdown().await;
            });
        }
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(o)) => {
                raw.exit = o.status.code();
                raw.stdout = String::from_utf8_lossy(&o.stdout).into_owned();
                raw.stderr = String::from_utf8_lossy(&o.stderr).into_owned();
            }
            Ok(Err(e)) => raw.spawn_error = Some(format!("hook failed: {e}")),
            Err(_) => {
                raw.timed_out = true;
                if let Some(pid) = pid {
                    // The whole group: the shell and whatever it started.
                    unsafe {
                        libc::killpg(pid as i32, libc::SIGKILL);
                    }
                }
            }
        }
        raw.elapsed = started.elapsed();
        raw
    }
}

fn record(event: HookEvent, cmd: &HookCommand, raw: &Raw) -> HookOutcome {
    HookOutcome {
        event,
        command: cmd.command.clone(),
        exit_code: raw.exit,
        outcome: HookResult::None,
        message: String::new(),
        elapsed_ms: raw.elapsed.as_millis() as u64,
    }
}

enum Exit {
    /// Exit 2: block with this reason.
    Block(String),
    /// Exit 0 with a JSON object on stdout.
    Json(Value),
    /// Exit 0 without output, or a non-blocking error (recorded).
    Nothing,
}

fn classify(raw: &Raw, rec: &mut HookOutcome) -> Exit {
    if let Some(e) = &raw.spawn_error {
        rec.outcome = HookResult::Error;
        rec.message = e.clone();
        return Exit::Nothing;
    }
    match raw.exit {
        Some(0) => {
            let text = raw.stdout.trim();
            if text.is_empty() {
                return Exit::Nothing;
            }
            match serde_json::from_str::<Value>(text) {
                Ok(v @ Value::Object(_)) => Exit::Json(v),
                Ok(_) | Err(_) => {
                    rec.outcome = HookResult::Error;
                    rec.message = format!(
                        "hook stdout is not a JSON object (ignored): {}",
                        text.chars().take(300).collect::<String>()
                    );
                    Exit::Nothing
                }
            }
        }
        Some(2) => {
            let reason = raw.stderr.trim();
            rec.outcome = HookResult::Block;
            rec.message = reason.to_owned();
            Exit::Block(if reason.is_empty() {
                "the hook exited with code 2".into()
            } else {
                reason.to_owned()
            })
        }
        other => {
            rec.outcome = HookResult::Error;
            rec.message = format!(
                "hook exited with {} (non-blocking): {}",
                other
                    .map(|c| format!("code {c}"))
                    .unwrap_or_else(|| "a signal".into()),
                raw.stderr.trim()
            );
            Exit::Nothing
        }
    }
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
