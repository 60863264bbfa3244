//! Running one handler, with Claude Code's rules for what it answered.
//!
//! - `command`: `sh -c` in [`HOOK_CWD`], never the workspace (its own process group, killed
//!   whole on timeout), the event's JSON on stdin. Exit 0: stdout is a JSON
//!   object of decision fields, plain text, or nothing. Exit 2: block, with
//!   stderr as the reason. Any other exit: a non-blocking error.
//! - `http`: POST the JSON; a 2xx answer's body is read as a command's
//!   stdout. A non-2xx answer, an unreachable server or a timeout is a
//!   non-blocking error: an http handler blocks only by answering a decision.

use crate::config::{HandlerKind, HookHandler};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// What a handler answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// A JSON object of decision fields (exit 0, or a 2xx body).
    Json(Value),
    /// Plain text that is not a JSON object.
    Text(String),
    /// No output: no opinion.
    Nothing,
    /// A command's exit 2: block, with stderr (or a stock reason).
    Block(String),
    /// A non-blocking error: another exit code, a failed start, a non-2xx
    /// answer, an unreachable server.
    Failed(String),
    /// It ran past its timeout (the command was killed).
    TimedOut(Duration),
}

/// One handler's answer and how it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// What it said.
    pub answer: Answer,
    /// A command's exit code, if it exited; an http answer's status.
    pub exit_code: Option<i32>,
    /// How long it took.
    pub elapsed: Duration,
}

/// Runs `handlers` in parallel, each with `payload`; the outcomes come back
/// in the handlers' order.
pub async fn run_all(handlers: &[&HookHandler], payload: &Value, cwd: &Path) -> Vec<Outcome> {
    if handlers.is_empty() {
        return Vec::new();
    }
    let body = payload.to_string();
    futures::future::join_all(handlers.iter().map(|h| run_one(h, &body, cwd))).await
}

/// Runs one handler with the JSON text `payload`.
pub async fn run_one(h: &HookHandler, payload: &str, cwd: &Path) -> Outcome {
    let started = Instant::now();
    let (answer, exit_code) = match h.kind {
        HandlerKind::Command => run_command(&h.command, payload, cwd, h.limit()).await,
        HandlerKind::Http => run_http(h, payload).await,
    };
    Outcome {
        answer,
        exit_code,
        elapsed: started.elapsed(),
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

/// Where a `command` hook runs: never the workspace. A hook runs outside
/// the sandbox, with the service's rights and environment, and the agent
/// writes the workspace, so a relative name there (`python3 guard.py`)
/// would run code the agent chose. The workspace is in `CLAUDE_PROJECT_DIR`,
/// `OMICOS_WORKSPACE` and the event's `cwd`, for a hook to read.
pub const HOOK_CWD: &str = "/";

async fn run_command(
    command: &str,
    payload: &str,
    workspace: &Path,
    limit: Duration,
) -> (Answer, Option<i32>) {
    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(HOOK_CWD)
        .env("CLAUDE_PROJECT_DIR", workspace)
        .env("OMICOS_WORKSPACE", workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return (Answer::Failed(format!("cannot start the hook: {e}")), None),
    };
    let pid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = payload.as_bytes().to_vec();
        // A hook that does not read its stdin must not block us.
        tokio::spawn(async move {
            let _ = stdin.write_all(&bytes).await;
            let _ = stdin.shutdown().await;
        });
    }
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return (Answer::Failed(format!("the hook failed: {e}")), None),
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                // The whole group: the shell and whatever it started.
                // SAFETY: killpg takes plain integers; the group is the
                // child's own (process_group(0)), so nothing else is hit.
                unsafe {
                    libc::killpg(pid, libc::SIGKILL);
                }
            }
            return (Answer::TimedOut(limit), None);
        }
    };
    let code = out.status.code();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let answer = match code {
        Some(0) => parse_output(&String::from_utf8_lossy(&out.stdout)),
        Some(2) => {
            let why = stderr.trim();
            Answer::Block(if why.is_empty() {
                "the hook exited with code 2".into()
            } else {
                why.to_owned()
            })
        }
        other => Answer::Failed(format!(
            "the hook exited with {} (non-blocking): {}",
            other
                .map(|c| format!("code {c}"))
                .unwrap_or_else(|| "a signal".into()),
            stderr.trim()
        )),
    };
    (answer, code)
}

async fn run_http(h: &HookHandler, payload: &str) -> (Answer, Option<i32>) {
    let limit = h.limit();
    let mut req = http_client()
        .post(&h.url)
        .timeout(limit)
        .header("content-type", "application/json")
        .body(payload.to_owned());
    for (k, v) in &h.headers {
        req = req.header(k, expand_env(v, h.allowed_env_vars.as_deref()));
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return (Answer::TimedOut(limit), None),
        Err(e) => {
            return (
                Answer::Failed(format!("the hook server did not answer: {e}")),
                None,
            );
        }
    };
    let status = resp.status();
    let code = Some(i32::from(status.as_u16()));
    let body = match resp.text().await {
        Ok(b) => b,
        Err(e) if e.is_timeout() => return (Answer::TimedOut(limit), code),
        Err(e) => {
            return (
                Answer::Failed(format!("the hook's answer broke off: {e}")),
                code,
            );
        }
    };
    if !status.is_success() {
        return (
            Answer::Failed(format!(
                "the hook server answered {status} (non-blocking): {}",
                body.chars().take(300).collect::<String>()
            )),
            code,
        );
    }
    (parse_output(&body), code)
}

/// `$VAR` and `${VAR}` in a header value, as in Claude Code's http hooks;
/// with `allowed`, a variable not in it expands to nothing.
pub fn expand_env(v: &str, allowed: Option<&[String]>) -> String {
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
        } else if allowed.is_none_or(|a| a.iter().any(|x| x == name)) {
            out.push_str(&std::env::var(name).unwrap_or_default());
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// One client for every http hook: its pool keeps connections to a hook
/// server warm, which is most of an http hook's cost.
fn http_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir() -> std::path::PathBuf {
        std::env::temp_dir()
    }

    #[test]
    fn header_values_expand_the_environment_within_the_allowed_list() {
        // PATH and HOME are set in every test environment.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(
            expand_env("a ${PATH} $PATH", None),
            format!("a {path} {path}")
        );
        assert_eq!(expand_env("a $ b", None), "a $ b");
        let allowed = ["PATH".to_owned()];
        assert_eq!(
            expand_env("$PATH|$HOME", Some(&allowed)),
            format!("{path}|"),
            "HOME is not allowed"
        );
    }

    #[tokio::test]
    async fn a_command_follows_claude_codes_exit_codes() {
        let run = |c: &'static str, p: &'static str| async move {
            run_one(&HookHandler::command(c), p, &dir()).await
        };
        let o = run("echo nope >&2; exit 2", "{}").await;
        assert_eq!(
            (o.answer, o.exit_code),
            (Answer::Block("nope".into()), Some(2))
        );
        assert_eq!(
            run("cat", r#"{"x":1}"#).await.answer,
            Answer::Json(json!({"x": 1}))
        );
        assert_eq!(
            run("echo some text", "{}").await.answer,
            Answer::Text("some text".into())
        );
        assert_eq!(run("true", "{}").await.answer, Answer::Nothing);
        assert!(matches!(
            run("exit 3", "{}").await.answer,
            Answer::Failed(_)
        ));
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_its_children() {
        let h = HookHandler {
            timeout: Some(Duration::from_millis(200)),
            ..HookHandler::command("sleep 30 & sleep 30")
        };
        let o = run_one(&h, "{}", &dir()).await;
        assert_eq!(o.answer, Answer::TimedOut(Duration::from_millis(200)));
        assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
    }

    async fn server() -> String {
        use axum::{Json, Router, http::StatusCode, routing::post};
        let app = Router::new()
            .route(
                "/echo",
                post(|Json(v): Json<Value>| async move { Json(json!({"got": v})) }),
            )
            .route(
                "/fail",
                post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "broken") }),
            )
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "{}"
                }),
            )
            .route(
                "/auth",
                post(|h: axum::http::HeaderMap| async move {
                    h.get("x-token")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                }),
            );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        url
    }

    #[tokio::test]
    async fn http_handlers_read_the_answer_and_never_block_on_failure() {
        let url = server().await;
        let o = run_one(
            &HookHandler::http(format!("{url}/echo")),
            r#"{"a":1}"#,
            &dir(),
        )
        .await;
        assert_eq!(o.answer, Answer::Json(json!({"got": {"a": 1}})));
        assert_eq!(o.exit_code, Some(200));
        let o = run_one(&HookHandler::http(format!("{url}/fail")), "{}", &dir()).await;
        assert!(
            matches!(&o.answer, Answer::Failed(m) if m.contains("500")),
            "{o:?}"
        );
        let slow = HookHandler {
            timeout: Some(Duration::from_millis(200)),
            ..HookHandler::http(format!("{url}/slow"))
        };
        let o = run_one(&slow, "{}", &dir()).await;
        assert_eq!(o.answer, Answer::TimedOut(Duration::from_millis(200)));
        let o = run_one(&HookHandler::http("http://127.0.0.1:1/none"), "{}", &dir()).await;
        assert!(matches!(o.answer, Answer::Failed(_)), "{o:?}");
        let auth = HookHandler {
            headers: [("x-token".to_owned(), "t-$PATH".to_owned())].into(),
            allowed_env_vars: Some(vec![]),
            ..HookHandler::http(format!("{url}/auth"))
        };
        let o = run_one(&auth, "{}", &dir()).await;
        assert_eq!(o.answer, Answer::Text("t-".into()), "PATH is not allowed");
    }

    #[tokio::test]
    async fn the_handlers_of_one_event_run_in_parallel_in_config_order() {
        let a = HookHandler::command("sleep 0.5; echo one");
        let b = HookHandler::command("sleep 0.5; echo two");
        let started = Instant::now();
        let out = run_all(&[&a, &b], &json!({}), &dir()).await;
        assert!(
            started.elapsed() < Duration::from_millis(950),
            "{:?}",
            started.elapsed()
        );
        let texts: Vec<_> = out.into_iter().map(|o| o.answer).collect();
        assert_eq!(
            texts,
            [Answer::Text("one".into()), Answer::Text("two".into())]
        );
    }
}
