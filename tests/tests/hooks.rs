//! Hooks at Claude Code's level (issue 41), end to end through Chat: hook
//! scripts written in Claude Code's style (stdin JSON, exit 2 or decision
//! JSON on stdout) and http hook servers on 127.0.0.1, for the events the
//! orchestrator runs (SessionStart, SessionEnd, UserPromptSubmit, Stop,
//! SubagentStart, SubagentStop, Notification, PermissionDenied) and the
//! tool events the runner runs (PreToolUse, PostToolUse).

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

/// Writes an executable script into a folder of hook scripts outside the
/// workspace `_ws` (a hook runs outside the sandbox, so its code must be
/// where the agent cannot write it: the runner refuses a hook in the
/// workspace).
fn script(_ws: &Path, name: &str, body: &str) -> String {
    static SCRIPTS: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let hooks = SCRIPTS
        .get_or_init(|| tempfile::tempdir().unwrap())
        .path()
        .join(format!("{}-{name}", std::process::id()));
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

/// The text of every tool-role message of a recorded model request.
fn tool_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn shell(id: &str, command: &str) -> Reply {
    Reply::Tools(
        String::new(),
        vec![(
            id.into(),
            "shell".into(),
            json!({ "command": command }).to_string(),
        )],
    )
}

/// A policy server for the runner's tool events, on 127.0.0.1: `/pre`
/// denies commands that touch `denied.txt`, rewrites those that say
/// `rewrite-me`, allows the rest; `/post` adds context; `/fail` answers 500;
/// `/slow` answers after 3 s (past its hook's timeout).
async fn tool_hook_server(seen: Seen) -> String {
    use axum::{Json, Router, http::StatusCode, routing::post};
    let record = move |route: &'static str| {
        let seen = seen.clone();
        move |v: Value| {
            let mut v = v;
            v["_route"] = route.into();
            seen.lock().unwrap().push(v);
        }
    };
    let (r1, r2, r3, r4) = (
        record("pre"),
        record("post"),
        record("fail"),
        record("slow"),
    );
    let app = Router::new()
        .route(
            "/pre",
            post(move |Json(v): Json<Value>| async move {
                let command = v["tool_input"]["command"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                r1(v);
                let out = if command.contains("denied.txt") {
                    json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                        "permissionDecision": "deny",
                        "permissionDecisionReason": "no writes to denied.txt"}})
                } else if command.contains("rewrite-me") {
                    json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                        "permissionDecision": "allow",
                        "updatedInput": {"command": "echo rewritten > rewritten.txt"}}})
                } else {
                    json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                        "permissionDecision": "allow", "permissionDecisionReason": "policy ok"}})
                };
                Json(out)
            }),
        )
        .route(
            "/post",
            post(move |Json(v): Json<Value>| async move {
                r2(v);
                Json(
                    json!({"hookSpecificOutput": {"hookEventName": "PostToolUse",
                    "additionalContext": "POST-CONTEXT: the file was scanned"}}),
                )
            }),
        )
        .route(
            "/fail",
            post(move |Json(v): Json<Value>| async move {
                r3(v);
                (StatusCode::INTERNAL_SERVER_ERROR, "broken")
            }),
        )
        .route(
            "/slow",
            post(move |Json(v): Json<Value>| async move {
                r4(v);
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                Json(json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                    "permissionDecision": "deny", "permissionDecisionReason": "too late"}}))
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// http handlers for the runner's tool events, through Chat → runner: a
/// PreToolUse deny stops the call before it runs (its file never appears),
/// an allow runs it without asking in `auto`, an `updatedInput` rewrites
/// it, a PostToolUse `additionalContext` reaches the model's next request,
/// and a server that answers 500 or too late blocks nothing: the calls run
/// and the turn goes on (the slow one costs its timeout, not its 3 s).
#[tokio::test]
async fn http_tool_hooks_deny_allow_rewrite_and_add_context_and_failures_block_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let seen: Seen = Default::default();
    let url = tool_hook_server(seen.clone()).await;
    let llm = FakeLlm::start(vec![
        shell("c_deny", "echo hi > denied.txt"),
        shell("c_allow", "echo hi > allowed.txt"),
        shell("c_rewrite", "echo rewrite-me > original.txt"),
        Reply::Text("all done".into()),
    ])
    .await;
    let stack = Stack::start(
        llm,
        StackOptions {
            workspace: Some(ws.path().to_path_buf()),
            runner_overrides: json!({"hooks": {
                "PreToolUse": [{"matcher": "shell", "hooks": [
                    {"type": "http", "url": format!("{url}/pre"), "timeout": 5},
                    {"type": "http", "url": format!("{url}/fail"), "timeout": 5},
                    {"type": "http", "url": format!("{url}/slow"), "timeout": "700ms"}
                ]}],
                "PostToolUse": [{"matcher": "shell|file_.*", "hooks": [
                    {"type": "http", "url": format!("{url}/post")}
                ]}],
            }}),
            ..Default::default()
        },
    )
    .await;
    let started = std::time::Instant::now();
    let events = stack
        .chat(ChatRequest {
            permission_mode: "auto".into(),
            ..req("write the files")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    let took = started.elapsed();
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, Some(chat_event::Kind::ToolApprovalRequest(_)))),
        "the hook allowed: nobody was asked in auto"
    );
    // Denied: never ran. Allowed: ran. Rewritten: the rewritten command ran.
    assert!(!ws.path().join("denied.txt").exists(), "a denied call ran");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("allowed.txt")).unwrap(),
        "hi\n"
    );
    assert!(
        !ws.path().join("original.txt").exists(),
        "the input was not rewritten"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("rewritten.txt")).unwrap(),
        "rewritten\n"
    );

    let reqs = stack.llm.requests();
    assert_eq!(reqs.len(), 4);
    let denied = tool_texts(&reqs[1].body);
    assert!(
        denied.last().unwrap().contains("no writes to denied.txt"),
        "the model reads the deny reason: {denied:?}"
    );
    assert!(
        !denied.last().unwrap().contains("POST-CONTEXT"),
        "no PostToolUse for a call that never ran: {denied:?}"
    );
    let allowed = tool_texts(&reqs[2].body);
    assert!(
        allowed
            .last()
            .unwrap()
            .contains("POST-CONTEXT: the file was scanned"),
        "PostToolUse context reaches the model: {allowed:?}"
    );

    let seen = seen.lock().unwrap().clone();
    let on =
        |route: &str| -> Vec<&Value> { seen.iter().filter(|v| v["_route"] == route).collect() };
    // Every PreToolUse handler saw every call, with Claude Code's fields.
    for route in ["pre", "fail", "slow"] {
        let ids: Vec<&str> = on(route)
            .iter()
            .map(|v| v["tool_use_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 3, "{route}: {ids:?}");
        for id in ["c_deny", "c_allow", "c_rewrite"] {
            assert!(ids.contains(&id), "{route}: {ids:?}");
        }
    }
    let session = events[0].session_id.clone();
    let pre = on("pre");
    let deny = pre.iter().find(|v| v["tool_use_id"] == "c_deny").unwrap();
    assert_eq!(deny["hook_event_name"], "PreToolUse");
    assert_eq!(deny["tool_name"], "shell");
    assert_eq!(deny["tool_input"]["command"], "echo hi > denied.txt");
    assert_eq!(deny["session_id"], session.as_str());
    assert_eq!(deny["cwd"], ws.path().display().to_string());
    assert_eq!(deny["permission_mode"], "auto");
    // PostToolUse for the two calls that ran, with their responses.
    let post = on("post");
    let ids: Vec<&str> = post
        .iter()
        .map(|v| v["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c_allow", "c_rewrite"]);
    assert_eq!(post[0]["hook_event_name"], "PostToolUse");
    assert!(post[0].get("tool_response").is_some(), "{}", post[0]);
    assert_eq!(
        post[1]["tool_input"]["command"],
        "echo rewritten > rewritten.txt"
    );
    // Three calls, each waiting for the slow handler's 700 ms timeout, not 3 s.
    assert!(took < std::time::Duration::from_secs(6), "took {took:?}");
    stack.llm.assert_invariants();
}

/// A workspace with a lead and a helper agent, and a stack using them.
async fn team_stack(llm: FakeLlm, workspace: &Path, h: HooksConfig) -> Stack {
    let dir = workspace.join(".omicos/agents");
    std::fs::create_dir_all(&dir).unwrap();
    for (id, prompt) in [
        ("lead", "You are LEAD-PROMPT. Delegate."),
        ("helper", "You are HELPER-PROMPT. Count things."),
    ] {
        std::fs::write(
            dir.join(format!("{id}.md")),
            format!("---\nid: {id}\nname: {id} agent\ndescription: the {id}\ntoolsets: [think]\n---\n{prompt}\n"),
        )
        .unwrap();
    }
    let mut cc = omicos_catalog::CatalogConfig::new(workspace, omicos_catalog::Tier::Community);
    cc.builtin_agents = false;
    cc.agent_cache_dir = None;
    cc.skill_cache_dir = None;
    let (catalog, warnings) = omicos_catalog::Catalog::load(cc);
    assert!(warnings.is_empty(), "{warnings:?}");
    Stack::start(
        llm,
        StackOptions {
            agents: Some(Arc::new(
                omicos_orchestrator::agents::CatalogAgents::from_catalog(catalog),
            )),
            workspace: Some(workspace.to_path_buf()),
            providers: vec![Arc::new(omicos_catalog::ThinkProvider)],
            tweak: Some(Box::new(move |c| c.hooks = h)),
            ..Default::default()
        },
    )
    .await
}

fn team_req() -> ChatRequest {
    ChatRequest {
        agent: "lead".into(),
        team_members: vec!["lead".into(), "helper".into()],
        ..req("count the files")
    }
}

fn delegate() -> Reply {
    Reply::Tools(
        String::new(),
        vec![(
            "c_del".into(),
            "call_agent".into(),
            json!({"agent_name": "helper", "instruction": "count the files"}).to_string(),
        )],
    )
}

fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// SubagentStart and SubagentStop through a real `call_agent` delegation,
/// with Claude Code-style python scripts: SubagentStart's context reaches
/// the helper's first model request; SubagentStop blocks once (the helper
/// goes on with the reason) and lets it stop when `stop_hook_active`.
#[tokio::test]
async fn subagent_start_adds_context_and_subagent_stop_makes_the_helper_go_on() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("subagent-log.jsonl");
    let start_hook = script(
        ws.path(),
        "subagent-start.py",
        &format!(
            r#"#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
open({log:?}, "a").write(json.dumps(data) + "\n")
print(json.dumps({{"hookSpecificOutput": {{"hookEventName": "SubagentStart",
    "additionalContext": "SUBAGENT-START-CONTEXT: count only .rs files"}}}}))
"#,
            log = log.display().to_string()
        ),
    );
    let stop_hook = script(
        ws.path(),
        "subagent-stop.py",
        &format!(
            r#"#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
open({log:?}, "a").write(json.dumps(data) + "\n")
if data.get("stop_hook_active"):
    sys.exit(0)
print(json.dumps({{"decision": "block", "reason": "Count again, and show your work."}}))
"#,
            log = log.display().to_string()
        ),
    );
    let h = hooks(json!({
        "SubagentStart": [{"matcher": "helper", "hooks": [{"type": "command", "command": start_hook}]}],
        // A matcher for another agent never runs.
        "SubagentStop": [
            {"matcher": "helper", "hooks": [{"type": "command", "command": stop_hook}]},
            {"matcher": "third", "hooks": [{"type": "command", "command": "exit 2"}]}
        ],
    }));
    let llm = FakeLlm::start(vec![
        delegate(),
        Reply::Text("HELPER: 3 files".into()),
        Reply::Text("HELPER: 7 files, counted twice".into()),
        Reply::Text("The helper counted 7 files.".into()),
    ])
    .await;
    let stack = team_stack(llm, ws.path(), h).await;
    let events = stack.chat(team_req()).await.unwrap().until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:?}"
    );
    let session = events[0].session_id.clone();

    let reqs = stack.llm.requests();
    assert_eq!(reqs.len(), 4, "lead, helper, helper again, lead");
    assert!(system_of(&reqs[1].body).contains("HELPER-PROMPT"));
    let first = user_texts(&reqs[1].body);
    assert!(
        first
            .iter()
            .any(|u| u.contains("SUBAGENT-START-CONTEXT: count only .rs files")),
        "SubagentStart context reaches the helper: {first:?}"
    );
    assert!(
        !user_texts(&reqs[0].body)
            .iter()
            .any(|u| u.contains("SUBAGENT-START-CONTEXT")),
        "and not the lead"
    );
    assert!(system_of(&reqs[2].body).contains("HELPER-PROMPT"));
    let last = reqs[2].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], "Count again, and show your work.");
    assert!(steers(&events).contains(&"Count again, and show your work.".to_owned()));
    let result = tool_texts(&reqs[3].body);
    assert!(
        result.last().unwrap().contains("7 files, counted twice"),
        "the lead gets the answer after the helper went on: {result:?}"
    );

    let log = logged(&log);
    let names: Vec<&str> = log
        .iter()
        .map(|p| p["hook_event_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["SubagentStart", "SubagentStop", "SubagentStop"]);
    let agent_id = log[0]["agent_id"].as_str().unwrap();
    assert!(!agent_id.is_empty());
    for p in &log {
        assert_eq!(p["session_id"], session.as_str(), "{p}");
        assert_eq!(p["agent_type"], "helper", "{p}");
        assert_eq!(p["agent_id"], agent_id, "one sub-agent: {p}");
        assert_eq!(p["cwd"], ws.path().display().to_string(), "{p}");
        assert!(
            p["transcript_path"].as_str().unwrap().contains(&session),
            "{p}"
        );
    }
    assert_eq!(log[1]["stop_hook_active"], false);
    assert_eq!(log[1]["last_assistant_message"], "HELPER: 3 files");
    assert_eq!(log[2]["stop_hook_active"], true);
    assert_eq!(
        log[2]["last_assistant_message"],
        "HELPER: 7 files, counted twice"
    );
    assert_eq!(log[1]["permission_mode"], "bypassPermissions");
    stack.llm.assert_invariants();
}

/// A SubagentStop hook that always blocks cannot keep a helper going
/// forever: past the bound the helper's answer goes back to the lead.
#[tokio::test]
async fn subagent_stop_continuations_are_bounded() {
    let ws = tempfile::tempdir().unwrap();
    let h = hooks(json!({"SubagentStop": [{"hooks": [{"type": "command",
        "command": r#"cat >/dev/null; echo '{"decision": "block", "reason": "again"}'"#}]}]}));
    let llm = FakeLlm::start(vec![]).await.with_responder(|body| {
        let lead = system_of(body).contains("LEAD-PROMPT");
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        match (lead, answered) {
            (true, false) => delegate(),
            (true, true) => Reply::Text("lead done".into()),
            (false, _) => Reply::Text("helper stopping".into()),
        }
    });
    let stack = team_stack(llm, ws.path(), h).await;
    let events = stack.chat(team_req()).await.unwrap().until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:?}"
    );
    let max = omicos_orchestrator::engine::hook_events::MAX_STOP_CONTINUATIONS as usize;
    let helper = stack
        .llm
        .requests()
        .iter()
        .filter(|r| system_of(&r.body).contains("HELPER-PROMPT"))
        .count();
    assert_eq!(helper, 1 + max);
    assert_eq!(steers(&events).len(), max);
    assert_eq!(stack.llm.requests().len(), 2 + 1 + max);
}
