//! Hooks at Claude Code's level (issue 41), end to end through Chat: hook
//! scripts written in Claude Code's style (stdin JSON, exit 2 or decision
//! JSON on stdout) and an http hook server on 127.0.0.1, for the events the
//! orchestrator runs: SessionStart, SessionEnd, UserPromptSubmit, Stop.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_orchestrator::config::HooksConfig;
use omicos_proto::{ChatEvent, ChatRequest, DeleteSessionRequest, chat_event};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};

fn req(message: &str) -> ChatRequest {
    ChatRequest {
        message: message.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

fn in_session(session: &str, message: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        ..req(message)
    }
}

/// Writes an executable script into the workspace's `hooks/` folder.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let hooks = dir.join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let p = hooks.join(name);
    std::fs::write(&p, body).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

/// The JSON lines a hook appended to `file`.
fn logged(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn hooks(v: Value) -> HooksConfig {
    serde_json::from_value(v).expect("hooks in Claude Code's settings shape")
}

async fn stack_with(llm: FakeLlm, workspace: &Path, h: HooksConfig) -> Stack {
    Stack::start(
        llm,
        StackOptions {
            workspace: Some(workspace.to_path_buf()),
            tweak: Some(Box::new(move |c| c.hooks = h)),
            ..Default::default()
        },
    )
    .await
}

/// The text of every user-role message of a recorded model request.
fn user_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

fn error_event(events: &[ChatEvent]) -> Option<(String, String)> {
    events.iter().find_map(|e| match &e.kind {
        Some(chat_event::Kind::Error(x)) => Some((x.kind.clone(), x.message.clone())),
        _ => None,
    })
}

fn steers(events: &[ChatEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::Steer(s)) => Some(s.message.clone()),
            _ => None,
        })
        .collect()
}

/// A UserPromptSubmit script in the style of Claude Code's documented
/// example: exit 2 with a reason on stderr refuses the prompt, plain stdout
/// adds context. A SessionStart script adds context with
/// hookSpecificOutput.additionalContext; a SessionEnd script logs its reason.
#[tokio::test]
async fn command_hooks_refuse_a_prompt_add_context_and_see_the_session_start_and_end() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("hook-log.jsonl");
    let prompt_hook = script(
        ws.path(),
        "validate-prompt.py",
        &format!(
            r#"#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
open({log:?}, "a").write(json.dumps(data) + "\n")
prompt = data.get("prompt", "")
if "password" in prompt.lower():
    print("Security policy violation: prompt mentions a password.", file=sys.stderr)
    sys.exit(2)
print("Ticket context: TICKET-41 is open.")
sys.exit(0)
"#,
            log = log.display().to_string()
        ),
    );
    let session_hook = script(
        ws.path(),
        "session.sh",
        &format!(
            r#"#!/bin/bash
input=$(cat)
echo "$input" >> {log:?}
case "$(echo "$input" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hook_event_name"])')" in
  SessionStart) echo '{{"hookSpecificOutput": {{"hookEventName": "SessionStart", "additionalContext": "Conventions: answer in haiku."}}}}' ;;
esac
exit 0
"#,
            log = log.display().to_string()
        ),
    );
    let h = hooks(json!({
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": prompt_hook}]}],
        "SessionStart": [{"matcher": "startup|resume", "hooks": [{"type": "command", "command": session_hook.clone()}]}],
        "SessionEnd": [{"hooks": [{"type": "command", "command": session_hook}]}],
    }));
    let llm = FakeLlm::start(vec![Reply::Text("ok".into())]).await;
    let stack = stack_with(llm, ws.path(), h).await;

    // Refused: an error event with the script's reason, and no model request.
    let events = stack
        .chat(req("what is the admin password?"))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = events[0].session_id.clone();
    let (kind, message) = error_event(&events).expect("an error event");
    assert_eq!(kind, omicos_orchestrator::engine::PROMPT_BLOCKED);
    assert!(
        message.contains("Security policy violation: prompt mentions a password."),
        "{message}"
    );
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    assert!(stack.llm.requests().is_empty(), "nothing reached the model");

    // Allowed: the prompt, the session's context and the prompt's context reach the model.
    let events = stack
        .chat(in_session(&session, "summarize the ticket"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let reqs = stack.llm.requests();
    assert_eq!(reqs.len(), 1);
    let users = user_texts(&reqs[0].body);
    assert!(
        !users.iter().any(|u| u.contains("password")),
        "the refused prompt is not in the history: {users:?}"
    );
    assert!(
        users.iter().any(|u| u == "summarize the ticket"),
        "{users:?}"
    );
    assert!(
        users
            .iter()
            .any(|u| u.contains("Conventions: answer in haiku.")),
        "SessionStart context: {users:?}"
    );
    assert!(
        users
            .iter()
            .any(|u| u.contains("Ticket context: TICKET-41 is open.")),
        "UserPromptSubmit context: {users:?}"
    );

    // SessionEnd when the session is deleted.
    stack
        .client()
        .await
        .delete_session(DeleteSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap();

    let log = logged(&log);
    let names: Vec<&str> = log
        .iter()
        .map(|p| p["hook_event_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "SessionStart",
            "UserPromptSubmit",
            "UserPromptSubmit",
            "SessionEnd"
        ],
        "one SessionStart per session on this replica"
    );
    for p in &log {
        assert_eq!(p["session_id"], session.as_str(), "{p}");
        assert!(
            p["transcript_path"].as_str().unwrap().contains(&session),
            "{p}"
        );
        assert_eq!(p["cwd"], ws.path().display().to_string(), "{p}");
    }
    assert_eq!(log[0]["source"], "startup");
    assert_eq!(log[1]["prompt"], "what is the admin password?");
    assert_eq!(log[2]["prompt"], "summarize the ticket");
    assert_eq!(log[3]["reason"], "other");
}

/// A Stop script in Claude Code's style: it blocks once ("decision: block"
/// with a reason), and lets the agent stop when `stop_hook_active` is true.
#[tokio::test]
async fn a_stop_hook_makes_the_agent_go_on_with_its_reason() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("stop-log.jsonl");
    let stop_hook = script(
        ws.path(),
        "stop.py",
        &format!(
            r#"#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
open({log:?}, "a").write(json.dumps(data) + "\n")
if data.get("stop_hook_active"):
    sys.exit(0)
print(json.dumps({{"decision": "block", "reason": "Run the tests before you stop."}}))
"#,
            log = log.display().to_string()
        ),
    );
    let h = hooks(json!({"Stop": [{"hooks": [{"type": "command", "command": stop_hook}]}]}));
    let llm = FakeLlm::start(vec![
        Reply::Text("done, I think".into()),
        Reply::Text("tests ran green".into()),
    ])
    .await;
    let stack = stack_with(llm, ws.path(), h).await;
    let events = stack
        .chat(req("fix the bug"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert_eq!(steers(&events), ["Run the tests before you stop."]);
    let reqs = stack.llm.requests();
    assert_eq!(reqs.len(), 2, "the agent went on once");
    let last = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], "Run the tests before you stop.");
    let log = logged(&log);
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["hook_event_name"], "Stop");
    assert_eq!(log[0]["stop_hook_active"], false);
    assert_eq!(log[0]["last_assistant_message"], "done, I think");
    assert_eq!(log[1]["stop_hook_active"], true);
    stack.llm.assert_invariants();
}

/// A Stop hook that always blocks cannot keep a turn going forever.
#[tokio::test]
async fn stop_hook_continuations_are_bounded() {
    let ws = tempfile::tempdir().unwrap();
    let h = hooks(json!({"Stop": [{"hooks": [{"type": "command",
        "command": r#"cat >/dev/null; echo '{"decision": "block", "reason": "again"}'"#}]}]}));
    let llm = FakeLlm::start(vec![])
        .await
        .with_responder(|_| Reply::Text("stopping".into()));
    let stack = stack_with(llm, ws.path(), h).await;
    let events = stack.chat(req("go")).await.unwrap().until_done().await;
    let max = omicos_orchestrator::engine::hook_events::MAX_STOP_CONTINUATIONS as usize;
    assert_eq!(stack.llm.requests().len(), 1 + max);
    assert_eq!(steers(&events).len(), max);
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
}

/// What the http hook server was sent.
type Seen = Arc<Mutex<Vec<Value>>>;

/// An http hook server on 127.0.0.1: `/prompt` blocks prompts that mention
/// "forbidden" and adds context to the others; `/fail` answers 500 (a
/// non-blocking error); `/stop` allows with an empty body.
async fn hook_server(seen: Seen) -> String {
    use axum::{Json, Router, http::StatusCode, routing::post};
    let s1 = seen.clone();
    let s2 = seen.clone();
    let s3 = seen;
    let app = Router::new()
        .route(
            "/prompt",
            post(move |Json(v): Json<Value>| {
                let seen = s1.clone();
                async move {
                    let prompt = v["prompt"].as_str().unwrap_or_default().to_owned();
                    seen.lock().unwrap().push(v);
                    if prompt.contains("forbidden") {
                        Json(json!({"decision": "block", "reason": "policy says no"}))
                    } else {
                        Json(
                            json!({"hookSpecificOutput": {"hookEventName": "UserPromptSubmit",
                            "additionalContext": "from http"}}),
                        )
                    }
                }
            }),
        )
        .route(
            "/fail",
            post(move |Json(v): Json<Value>| {
                let seen = s2.clone();
                async move {
                    seen.lock().unwrap().push(v);
                    (StatusCode::INTERNAL_SERVER_ERROR, "broken")
                }
            }),
        )
        .route(
            "/stop",
            post(move |Json(v): Json<Value>| {
                let seen = s3.clone();
                async move {
                    seen.lock().unwrap().push(v);
                    ""
                }
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// http handlers get the same JSON and answer with the same decision JSON;
/// the hooks of one event run together and their decisions combine: a
/// block wins, contexts come in config order, a 500 blocks nothing.
#[tokio::test]
async fn http_hooks_block_allow_and_add_context_alongside_command_hooks() {
    let ws = tempfile::tempdir().unwrap();
    let seen: Seen = Default::default();
    let url = hook_server(seen.clone()).await;
    let h = hooks(json!({
        "UserPromptSubmit": [
            {"hooks": [{"type": "command", "command": "cat >/dev/null; echo from command"}]},
            {"hooks": [
                {"type": "http", "url": format!("{url}/prompt"), "timeout": 5},
                {"type": "http", "url": format!("{url}/fail"), "timeout": 5}
            ]}
        ],
        "Stop": [{"hooks": [{"type": "http", "url": format!("{url}/stop")}]}],
    }));
    let llm = FakeLlm::start(vec![Reply::Text("fine".into())]).await;
    let stack = stack_with(llm, ws.path(), h).await;

    let events = stack
        .chat(req("do the forbidden thing"))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = events[0].session_id.clone();
    let (kind, message) = error_event(&events).expect("an error event");
    assert_eq!(kind, "prompt_blocked");
    assert!(message.contains("policy says no"), "{message}");
    assert!(stack.llm.requests().is_empty());

    let events = stack
        .chat(in_session(&session, "do the allowed thing"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let reqs = stack.llm.requests();
    assert_eq!(reqs.len(), 1);
    let users = user_texts(&reqs[0].body);
    let ctx = users
        .iter()
        .find(|u| u.contains("hook-context"))
        .unwrap_or_else(|| panic!("no hook context: {users:?}"));
    let (c, h) = (
        ctx.find("from command").expect("command context"),
        ctx.find("from http").expect("http context"),
    );
    assert!(c < h, "contexts in config order: {ctx}");

    let seen = seen.lock().unwrap().clone();
    let events_seen: Vec<&str> = seen
        .iter()
        .map(|v| v["hook_event_name"].as_str().unwrap())
        .collect();
    // Two prompts × two http handlers, then one Stop.
    assert_eq!(
        events_seen
            .iter()
            .filter(|e| **e == "UserPromptSubmit")
            .count(),
        4
    );
    assert_eq!(events_seen.iter().filter(|e| **e == "Stop").count(), 1);
    for v in &seen {
        assert_eq!(v["session_id"], session.as_str());
        assert_eq!(v["cwd"], ws.path().display().to_string());
    }
    let stop = seen
        .iter()
        .find(|v| v["hook_event_name"] == "Stop")
        .unwrap();
    assert_eq!(stop["stop_hook_active"], false);
    assert_eq!(stop["last_assistant_message"], "fine");
}

/// Notification fires while an approval waits; PermissionDenied after the
/// user refused the call. Both are observed by a Claude Code-style script.
#[tokio::test]
async fn notification_while_an_approval_waits_and_permission_denied_after_a_refusal() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("notify-log.jsonl");
    let logger = script(
        ws.path(),
        "log.sh",
        &format!("#!/bin/bash\ncat >> {:?}\necho >> {:?}\n", log, log),
    );
    let h = hooks(json!({
        "Notification": [{"matcher": "permission_prompt", "hooks": [{"type": "command", "command": logger.clone()}]}],
        "PermissionDenied": [{"matcher": "shell", "hooks": [{"type": "command", "command": logger}]}],
    }));
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c_sh".into(),
                "shell".into(),
                r#"{"command":"echo hi > b.txt"}"#.into(),
            )],
        ),
        Reply::Text("ok, not running it".into()),
    ])
    .await;
    let stack = stack_with(llm, ws.path(), h).await;
    let mut chat = stack
        .chat(ChatRequest {
            permission_mode: "auto".into(),
            ..req("run a command")
        })
        .await
        .unwrap();
    let call = chat.until_approval().await;
    // The notification is not awaited by the call: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !logged(&log)
        .iter()
        .any(|p| p["hook_event_name"] == "Notification")
    {
        assert!(std::time::Instant::now() < deadline, "no Notification");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    chat.approve(&call, omicos_proto::Decision::Deny).await;
    let events = chat.until_done().await;
    let session = events[0].session_id.clone();
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let log = logged(&log);
    let n = log
        .iter()
        .find(|p| p["hook_event_name"] == "Notification")
        .unwrap();
    assert_eq!(n["notification_type"], "permission_prompt");
    assert!(n["message"].as_str().unwrap().contains("shell"), "{n}");
    assert_eq!(n["session_id"], session.as_str());
    let d = log
        .iter()
        .find(|p| p["hook_event_name"] == "PermissionDenied")
        .unwrap_or_else(|| panic!("no PermissionDenied: {log:?}"));
    assert_eq!(d["tool_name"], "shell");
    assert_eq!(d["tool_use_id"], "c_sh");
    assert_eq!(d["tool_input"]["command"], "echo hi > b.txt");
    assert!(d["reason"].as_str().unwrap().contains("denied"), "{d}");
}
