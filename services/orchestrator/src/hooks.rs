//! The hooks the orchestrator runs itself, with Claude Code's contract so
//! hook scripts written for Claude Code work unchanged.
//!
//! - Handlers: `command` runs with `sh -c` in the workspace, the event's JSON
//!   on stdin; `http` POSTs the same JSON and reads the answer's body as a
//!   command's stdout. Each has a timeout (default 60 s).
//! - A command's exit 0: stdout is a JSON object of decision fields, or plain
//!   text (context, for the events that take context). Exit 2: block, with
//!   stderr as the reason. Any other exit, a non-2xx answer, a timeout or an
//!   unreachable server: a non-blocking error, logged.
//! - The hooks of one event run in parallel; their decisions combine: any
//!   block wins (reasons joined in config order), contexts are concatenated
//!   in config order.

use crate::config::{HookCommand, HookMatcher};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// The longest a hook runs without its own timeout, as in Claude Code.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the hooks of one event decided, combined.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HookDecision {
    /// `decision: "block"` or exit 2: the reasons, in config order.
    pub block: Option<String>,
    /// `continue: false`: stop, with the `stopReason` (may be empty).
    pub stop: Option<String>,
    /// `hookSpecificOutput.additionalContext` or plain stdout, in config order.
    pub context: Vec<String>,
}

impl HookDecision {
    /// The contexts joined, or None when there is none.
    pub fn context_text(&self) -> Option<String> {
        let parts: Vec<&str> = self
            .context
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }
}

/// What one handler said.
#[derive(Debug, PartialEq)]
enum Answer {
    /// Exit 2 (or an http answer with `decision: block`): block with this reason.
    Block(String),
    /// A JSON object of decision fields.
    Json(Value),
    /// Plain text on stdout.
    Text(String),
    /// No opinion (or a non-blocking error, already logged).
    Nothing,
}

/// Whether `matcher` matches `target`: empty or `*` match all; otherwise an
/// anchored regex, as in Claude Code (a bad regex matches by equality only).
pub fn matches(matcher: &str, target: &str) -> bool {
    let m = matcher.trim();
    if m.is_empty() || m == "*" || m == target {
        return true;
    }
    regex::Regex::new(&format!("^(?:{m})$")).is_ok_and(|r| r.is_match(target))
}

/// Runs the hooks of `event` whose matcher matches `target` (None: every
/// group) in parallel, each with `payload`, and combines their decisions.
pub async fn run(
    event: &str,
    groups: &[HookMatcher],
    target: Option<&str>,
    payload: &Value,
    cwd: &Path,
) -> HookDecision {
    let handlers: Vec<&HookCommand> = groups
        .iter()
        .filter(|g| target.is_none_or(|t| matches(&g.matcher, t)))
        .flat_map(|g| g.hooks.iter())
        .collect();
    if handlers.is_empty() {
        return HookDecision::default();
    }
    let body = payload.to_string();
    let answers = futures::future::join_all(
        handlers
            .iter()
            .map(|h| run_one(event, h, body.as_str(), cwd)),
    )
    .await;
    combine(answers)
}

fn combine(answers: Vec<Answer>) -> HookDecision {
    let mut out = HookDecision::default();
    let mut blocks = Vec::new();
    for a in answers {
        match a {
            Answer::Block(r) => blocks.push(r),
            Answer::Text(t) => out.context.push(t),
            Answer::Nothing => {}
            Answer::Json(j) => {
                if j.get("continue") == Some(&Value::Bool(false)) {
                    let why = j.get("stopReason").and_then(Value::as_str).unwrap_or("");
                    out.stop.get_or_insert_with(|| why.to_owned());
                }
                if j.get("decision").and_then(Value::as_str) == Some("block") {
                    let why = j
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("blocked by a hook");
                    blocks.push(why.to_owned());
                }
                if let Some(c) = j
                    .get("hookSpecificOutput")
                    .and_then(|h| h.get("additionalContext"))
                    .and_then(Value::as_str)
                {
                    out.context.push(c.to_owned());
                }
            }
        }
    }
    if !blocks.is_empty() {
        out.block = Some(blocks.join("\n"));
    }
    out
}

async fn run_one(event: &str, h: &HookCommand, payload: &str, cwd: &Path) -> Answer {
    let limit = h
        .timeout
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let (what, result) = match h.kind.as_str() {
        "http" => (&h.url, run_http(h, payload, limit).await),
        _ => (
            &h.command,
            run_command(&h.command, payload, cwd, limit).await,
        ),
    };
    match result {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(event, hook = %what, error = %e, "hook failed (non-blocking)");
            Answer::Nothing
        }
    }
}

/// Reads a command's stdout or an http answer's body.
fn parse_output(text: &str) -> Answer {
    let t = text.trim();
    if t.is_empty() {
        return Answer::Nothing;
    }
    match serde_json::from_str::<Value>(t) {
        Ok(v @ Value::Object(_)) => Answer::Json(v),
        _ => Answer::Text(t.to_owned()),
    }
}

async fn run_command(
    command: &str,
    payload: &str,
    cwd: &Path,
    limit: Duration,
) -> Result<Answer, String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env("CLAUDE_PROJECT_DIR", cwd)
        .env("OMICOS_WORKSPACE", cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = payload.as_bytes().to_vec();
        // A hook that does not read its stdin must not block us.
        tokio::spawn(async move {
            let _ = stdin.write_all(&bytes).await;
            let _ = stdin.shutdown().await;
        });
    }
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(r) => r.map_err(|e| e.to_string())?,
        Err(_) => return Err(format!("timed out after {limit:?}")),
    };
    match out.status.code() {
        Some(0) => Ok(parse_output(&String::from_utf8_lossy(&out.stdout))),
        Some(2) => {
            let why = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            Ok(Answer::Block(if why.is_empty() {
                "the hook exited with code 2".into()
            } else {
                why
            }))
        }
        code => Err(format!(
            "exited with {}: {}",
            code.map(|c| format!("code {c}"))
                .unwrap_or_else(|| "a signal".into()),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

async fn run_http(h: &HookCommand, payload: &str, limit: Duration) -> Result<Answer, String> {
    let mut req = http_client()
        .post(&h.url)
        .timeout(limit)
        .header("content-type", "application/json")
        .body(payload.to_owned());
    for (k, v) in &h.headers {
        req = req.header(k, expand_env(v));
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "answered {status}: {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    Ok(parse_output(&body))
}

/// `$VAR` and `${VAR}` in a header value, as in Claude Code's http hooks.
fn expand_env(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, tail) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(j) => (&inner[..j], &inner[j + 1..]),
                None => ("", after),
            }
        } else {
            let n = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..n], &after[n..])
        };
        if name.is_empty() {
            out.push('$');
        } else {
            out.push_str(&std::env::var(name).unwrap_or_default());
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

fn http_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_block_wins_and_contexts_keep_config_order() {
        let d = combine(vec![
            Answer::Json(json!({"hookSpecificOutput": {"additionalContext": "one"}})),
            Answer::Json(json!({"decision": "block", "reason": "no"})),
            Answer::Text("two".into()),
            Answer::Nothing,
        ]);
        assert_eq!(d.block.as_deref(), Some("no"));
        assert_eq!(d.context_text().as_deref(), Some("one\n\ntwo"));
        assert_eq!(d.stop, None);
    }

    #[test]
    fn continue_false_stops_with_its_reason() {
        let d = combine(vec![Answer::Json(
            json!({"continue": false, "stopReason": "enough"}),
        )]);
        assert_eq!(d.stop.as_deref(), Some("enough"));
        assert_eq!(d.block, None);
    }

    #[test]
    fn matchers_match_all_or_alternatives() {
        assert!(matches("", "startup"));
        assert!(matches("*", "resume"));
        assert!(matches("startup|resume", "resume"));
        assert!(!matches("startup", "compact"));
    }

    #[test]
    fn header_values_expand_the_environment() {
        // PATH is set in every test environment.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_env("a ${PATH} $PATH"), format!("a {path} {path}"));
        assert_eq!(expand_env("a $ b"), "a $ b");
    }

    #[tokio::test]
    async fn a_command_exit_2_blocks_with_stderr() {
        let dir = std::env::temp_dir();
        let a = run_command("echo nope >&2; exit 2", "{}", &dir, DEFAULT_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(a, Answer::Block("nope".into()));
        let a = run_command("cat", r#"{"x":1}"#, &dir, DEFAULT_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(a, Answer::Json(json!({"x": 1})));
        let e = run_command("exit 3", "{}", &dir, DEFAULT_TIMEOUT).await;
        assert!(e.is_err());
    }
}
