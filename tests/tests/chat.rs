//! End-to-end: a client chats with the orchestrator, the fake LLM asks for
//! tools, the tool-runner runs them in a real workspace, the answer streams back.

use omicos_e2e::stack::{assert_gap_free, done_reason};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, events_text, finished_calls};
use omicos_proto::ToolStatus;
use omicos_proto::{AttachRequest, ChatRequest, Decision, GetSessionRequest, chat_event};
use serde_json::Value;
use std::time::Duration;

fn req(message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        message: message.into(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn tools(calls: &[(&str, &str, &str)]) -> Reply {
    Reply::Tools(
        String::new(),
        calls
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect(),
    )
}

async fn write_then_read(backend: &str) {
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            "Writing, then reading back.".into(),
            vec![
                (
                    "call_w".into(),
                    "file_manager__write".into(),
                    r#"{"path":"notes/hello.txt","content":"hello omicos"}"#.into(),
                ),
                (
                    "call_r".into(),
                    "file_manager__read".into(),
                    r#"{"path":"notes/hello.txt"}"#.into(),
                ),
            ],
        ),
        Reply::Text("The file says hello omicos.".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            backend: backend.into(),
            ..Default::default()
        },
    )
    .await;
    let mut chat = stack
        .chat(req("write a note and read it back", "full"))
        .await
        .unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    assert_gap_free(&events, 0);
    assert!(matches!(
        events[0].kind,
        Some(chat_event::Kind::TurnStarted(_))
    ));
    let session = events[0].session_id.clone();
    assert!(
        events
            .iter()
            .all(|e| e.session_id == session && !e.turn_id.is_empty())
    );
    // Started before finished, in the model's order.
    let order: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolCallStarted(s)) => Some(format!("start:{}", s.name)),
            Some(chat_event::Kind::ToolCallFinished(f)) => {
                Some(format!("end:{}:{}", f.name, f.status().as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        [
            "start:file_manager__write",
            "end:file_manager__write:done",
            "start:file_manager__read",
            "end:file_manager__read:done"
        ]
    );
    let on_disk = std::fs::read_to_string(stack.workspace.join("notes/hello.txt")).unwrap();
    assert_eq!(on_disk, "hello omicos");
    let finished = finished_calls(&events);
    assert!(
        finished[1].result.contains("hello omicos"),
        "{:?}",
        finished[1]
    );
    assert!(events_text(&events).contains("The file says hello omicos."));
    // The second LLM request carries both tool results.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let second = reqs[1].body.to_string();
    assert!(
        second.contains("call_w") && second.contains("call_r") && second.contains("hello omicos"),
        "{second}"
    );
    llm.assert_invariants();
    // The history is kept: GetSession returns user, assistant, 2 tool results, assistant.
    let s = stack
        .client()
        .await
        .get_session(GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.messages_json.len(), 5, "{:?}", s.messages_json);
    // The trajectory holds the user message, both model turns, both tool records and the end.
    let traj = std::fs::read_to_string(
        stack
            .workspace
            .join(".omicos/trajectories")
            .join(&session)
            .join("trajectory.jsonl"),
    )
    .unwrap();
    let lines: Vec<Value> = traj
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "user",
            "model_turn",
            "tool_call",
            "tool_call",
            "model_turn",
            "turn_done"
        ]
    );
    let write = &lines[2]["record"];
    assert_eq!(write["name"], "file_manager__write");
    assert_eq!(write["status"], "done");
    assert!(
        write.to_string().contains("hello omicos"),
        "arguments kept: {write}"
    );
}

#[tokio::test]
async fn openai_write_then_read() {
    write_then_read("openai").await;
}

#[tokio::test]
async fn anthropic_write_then_read() {
    write_then_read("anthropic").await;
}

#[tokio::test]
async fn second_request_continues_the_session() {
    let llm = FakeLlm::start(vec![
        Reply::Text("first answer".into()),
        Reply::Text("second answer".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut c1 = stack
        .chat(req("remember the word apricot", "full"))
        .await
        .unwrap();
    let e1 = c1.until_done().await;
    let session = e1[0].session_id.clone();
    let last = e1.last().unwrap().event_seq;
    let mut c2 = stack
        .chat(ChatRequest {
            session_id: session.clone(),
            ..req("what was the word?", "full")
        })
        .await
        .unwrap();
    let e2 = c2.until_done().await;
    assert_eq!(e2[0].session_id, session);
    assert_gap_free(&e2, last);
    let second = llm.requests()[1].body.to_string();
    assert!(
        second.contains("apricot") && second.contains("first answer"),
        "{second}"
    );
}

#[tokio::test]
async fn disconnect_and_reattach_misses_nothing() {
    let long: String = (0..60).map(|i| format!("word{i} ")).collect();
    let llm = FakeLlm::start(vec![Reply::Slow(long.clone(), Duration::from_millis(15))]).await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let mut chat = stack.chat(req("talk slowly", "full")).await.unwrap();
    for _ in 0..5 {
        chat.next().await.unwrap();
    }
    let seen = chat.events.clone();
    let session = seen[0].session_id.clone();
    let since = seen.last().unwrap().event_seq;
    drop(chat);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut client = stack.client().await;
    let mut stream = client
        .attach(AttachRequest {
            session_id: session,
            since_seq: since,
        })
        .await
        .unwrap()
        .into_inner();
    let mut rest = vec![];
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .unwrap()
        .unwrap()
    {
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        let done = matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)));
        rest.push(ev);
        if done {
            break;
        }
    }
    assert_gap_free(&rest, since);
    let mut all = seen.clone();
    all.extend(rest.clone());
    assert_gap_free(&all, 0);
    assert_eq!(events_text(&all).replace(' ', ""), long.replace(' ', ""));
    assert_eq!(done_reason(&rest).as_deref(), Some("completed"));
}

#[tokio::test]
async fn bad_tool_input_gives_clear_results_and_the_turn_goes_on() {
    let llm = FakeLlm::start(vec![
        tools(&[
            ("c1", "file_manager__read", "{not json"),
            ("c2", "file_manager__raed", r#"{"path":"x"}"#),
            ("c3", "file_manager__read", r#"{"path":"../../etc/passwd"}"#),
            ("c4", "file_manager__read", r#"{"path":"link/passwd"}"#),
        ]),
        Reply::Text("I could not read those.".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    std::os::unix::fs::symlink("/etc", stack.workspace.join("link")).unwrap();
    let mut chat = stack.chat(req("read some files", "full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let f = finished_calls(&events);
    assert_eq!(f.len(), 4);
    assert!(f.iter().all(|c| c.status() == ToolStatus::Error), "{f:#?}");
    assert!(
        f[0].result.to_lowercase().contains("json"),
        "{}",
        f[0].result
    );
    assert!(
        f[1].result.contains("file_manager__read"),
        "closest names listed: {}",
        f[1].result
    );
    assert!(
        f[2].result.contains("outside the workspace"),
        "{}",
        f[2].result
    );
    assert!(
        f[3].result.contains("outside the workspace"),
        "{}",
        f[3].result
    );
    // The model got four error results, each once.
    llm.assert_invariants();
    let second = &llm.requests()[1].body;
    let tool_msgs: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_msgs.len(), 4);
    for m in tool_msgs {
        let inner: Value = serde_json::from_str(m["content"].as_str().unwrap()).unwrap();
        assert_eq!(inner["status"], "error");
    }
}

#[tokio::test]
async fn llm_500_twice_then_success() {
    let llm = FakeLlm::start(vec![
        Reply::Status(500, r#"{"error":{"message":"boom"}}"#.into(), None),
        Reply::Status(503, r#"{"error":{"message":"busy"}}"#.into(), Some(0)),
        Reply::Text("recovered".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("hello", "full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert_eq!(events_text(&events), "recovered");
    assert_eq!(llm.requests().len(), 3);
}

#[tokio::test]
async fn llm_retries_run_out_with_a_clear_error() {
    let llm = FakeLlm::start(
        (0..4)
            .map(|_| Reply::Status(500, "down".into(), None))
            .collect(),
    )
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(req("hello", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let err = events.iter().find_map(|e| match &e.kind {
        Some(chat_event::Kind::Error(x)) => Some(x.clone()),
        _ => None,
    });
    let err = err.expect("an error event");
    assert_eq!(err.kind, "llm_unavailable");
    assert!(err.message.contains("4 attempts"), "{}", err.message);
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
}

#[tokio::test]
async fn context_overflow_is_its_own_error_kind() {
    let llm = FakeLlm::start(vec![Reply::Status(
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#.into(),
        None,
    )])
    .await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let events = stack
        .chat(req("hello", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert!(events.iter().any(
        |e| matches!(&e.kind, Some(chat_event::Kind::Error(x)) if x.kind == "context_overflow")
    ));
}

async fn stream_cut(backend: &str) {
    let llm = FakeLlm::start(vec![
        Reply::CutMidToolCall,
        Reply::Text("still here".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            backend: backend.into(),
            ..Default::default()
        },
    )
    .await;
    let events = stack
        .chat(req("read a file", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let err = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) => Some(x.clone()),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(err.kind, "llm_stream_broken", "{err:?}");
    assert!(
        err.message.contains("middle of a tool call"),
        "{}",
        err.message
    );
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    // The half-streamed call never ran and the session goes on.
    assert!(finished_calls(&events).is_empty());
    let session = events[0].session_id.clone();
    let again = stack
        .chat(ChatRequest {
            session_id: session,
            ..req("again", "full")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(events_text(&again), "still here");
    llm.assert_invariants();
}

#[tokio::test]
async fn openai_stream_closed_mid_tool_call() {
    stream_cut("openai").await;
}

#[tokio::test]
async fn anthropic_stream_closed_mid_tool_call() {
    stream_cut("anthropic").await;
}

#[tokio::test]
async fn unknown_session_gives_a_clear_event() {
    let llm = FakeLlm::start(vec![]).await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(ChatRequest {
            session_id: "no-such-session".into(),
            ..req("hi", "full")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert!(
        events.iter().any(|e| matches!(&e.kind, Some(chat_event::Kind::Error(x)) if x.kind == "session_not_found" && x.message.contains("no-such-session"))),
        "{events:#?}"
    );
    assert!(llm.requests().is_empty());
    // Still serving.
    let ok = stack
        .chat(req("hello", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&ok).as_deref(), Some("completed"));
}

#[tokio::test]
async fn unknown_permission_mode_is_refused() {
    let llm = FakeLlm::start(vec![]).await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let err = stack.chat(req("hi", "yolo")).await.err().expect("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("yolo"));
}

#[tokio::test]
async fn approval_in_auto_mode_and_out_of_band() {
    let llm = FakeLlm::start(vec![
        tools(&[(
            "c_w",
            "file_manager__write",
            r#"{"path":"a.txt","content":"A"}"#,
        )]),
        Reply::Text("written".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("write a.txt", "auto")).await.unwrap();
    let call = chat.until_approval().await;
    assert_eq!(call, "c_w");
    let session = chat.events[0].session_id.clone();
    // An approval for another session is refused.
    let mut client = stack.client().await;
    let wrong = client
        .approve_tool(omicos_proto::ApproveToolRequest {
            session_id: "other".into(),
            call_id: call.clone(),
            decision: Decision::AllowOnce as i32,
            ..Default::default()
        })
        .await;
    assert_eq!(wrong.unwrap_err().code(), tonic::Code::NotFound);
    // The out-of-band answer, as a UI would POST it.
    client
        .approve_tool(omicos_proto::ApproveToolRequest {
            session_id: session,
            call_id: call,
            decision: Decision::AllowOnce as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    let events = chat.until_done().await;
    assert!(events.iter().any(|e| matches!(&e.kind, Some(chat_event::Kind::ToolApprovalResolved(r)) if r.decision == Decision::AllowOnce as i32)));
    assert_eq!(
        std::fs::read_to_string(stack.workspace.join("a.txt")).unwrap(),
        "A"
    );
    assert_eq!(finished_calls(&events)[0].status(), ToolStatus::Done);
}

#[tokio::test]
async fn denied_approval_reaches_the_model_as_an_error() {
    let llm = FakeLlm::start(vec![
        tools(&[("c_sh", "shell", r#"{"command":"echo hi > b.txt"}"#)]),
        Reply::Text("ok, not running it".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("run a command", "auto")).await.unwrap();
    let call = chat.until_approval().await;
    chat.approve(&call, Decision::Deny).await;
    let events = chat.until_done().await;
    let f = &finished_calls(&events)[0];
    assert_eq!(f.status(), ToolStatus::Error);
    assert!(f.result.contains("denied by user"), "{}", f.result);
    assert!(!stack.workspace.join("b.txt").exists());
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
}

#[tokio::test]
async fn cancel_stops_a_running_tool_and_the_turn() {
    let llm = FakeLlm::start(vec![
        tools(&[("c_sleep", "shell", r#"{"command":"sleep 30"}"#)]),
        Reply::Text("never".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("sleep", "full")).await.unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            break;
        }
    }
    let t = std::time::Instant::now();
    chat.cancel().await;
    let events = chat.until_done().await;
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "cancel took {:?}",
        t.elapsed()
    );
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    assert_eq!(finished_calls(&events)[0].status(), ToolStatus::Error);
    // The model was not called again, and the cancelled call was still answered in history.
    assert_eq!(llm.requests().len(), 1);
}

#[tokio::test]
async fn max_iterations_stops_the_loop() {
    let llm = FakeLlm::start(
        (0..5)
            .map(|i| tools(&[(&format!("c{i}"), "file_manager__list", r#"{"path":"."}"#)]))
            .collect(),
    )
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(ChatRequest {
            max_tool_iterations: 2,
            ..req("list forever", "full")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("max_iterations"));
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(finished_calls(&events).len(), 2);
}

#[tokio::test]
async fn a_root_turn_past_its_deadline_reports_deadline_and_answers_every_call() {
    let llm = FakeLlm::start(vec![
        tools(&[("c_sleep", "shell", r#"{"command":"sleep 30"}"#)]),
        Reply::Text("next turn".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let t = std::time::Instant::now();
    let mut chat = stack
        .chat_with_deadline(req("sleep", "full"), Duration::from_millis(1500))
        .await
        .unwrap();
    let events = chat.until_done().await;
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("deadline"),
        "{events:#?}"
    );
    assert_gap_free(&events, 0);
    let f = finished_calls(&events);
    assert_eq!(f.len(), 1, "{events:#?}");
    assert_eq!(f[0].status(), ToolStatus::Error);
    // The trajectory says why the turn ended.
    let session = events[0].session_id.clone();
    let traj = std::fs::read_to_string(
        stack
            .workspace
            .join(".omicos/trajectories")
            .join(&session)
            .join("trajectory.jsonl"),
    )
    .unwrap();
    let last: Value = serde_json::from_str(traj.lines().last().unwrap()).unwrap();
    assert_eq!(last["reason"], "deadline", "{last}");
    // The session goes on, and the stopped call was answered exactly once in its history.
    let next = stack
        .chat(ChatRequest {
            session_id: session,
            ..req("go on", "full")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&next).as_deref(), Some("completed"));
    assert_eq!(llm.requests().len(), 2);
    llm.assert_invariants();
}

#[tokio::test]
async fn a_deadline_that_is_not_reached_changes_nothing() {
    let llm = FakeLlm::start(vec![Reply::Text("quick".into())]).await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let events = stack
        .chat_with_deadline(req("hi", "full"), Duration::from_secs(60))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert_eq!(events_text(&events), "quick");
}

/// The tool_call records of a session's trajectory, by call id.
fn trajectory_records(stack: &Stack, session: &str) -> std::collections::HashMap<String, Value> {
    let traj = std::fs::read_to_string(
        stack
            .workspace
            .join(".omicos/trajectories")
            .join(session)
            .join("trajectory.jsonl"),
    )
    .unwrap();
    traj.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["type"] == "tool_call")
        .map(|l| {
            (
                l["record"]["id"].as_str().unwrap().to_owned(),
                l["record"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_approval_answered_as_a_rule_lets_matching_calls_run_and_others_still_ask() {
    let llm = FakeLlm::start(vec![
        tools(&[("c1", "shell", r#"{"command":"printf one"}"#)]),
        Reply::Text("one done".into()),
        tools(&[
            ("c2", "shell", r#"{"command":"printf two"}"#),
            ("c3", "shell", r#"{"command":"printf two && ls"}"#),
        ]),
        Reply::Text("two done".into()),
        tools(&[("c4", "shell", r#"{"command":"printf three"}"#)]),
        Reply::Text("three refused".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut client = stack.client().await;

    // Turn 1: asked; answered out of band with a rule for the session.
    let mut chat = stack.chat(req("print one", "auto")).await.unwrap();
    let call = chat.until_approval().await;
    assert_eq!(call, "c1");
    let session = chat.events[0].session_id.clone();
    let approve = |rule: &str, decision: Decision| omicos_proto::ApproveToolRequest {
        session_id: session.clone(),
        call_id: call.clone(),
        decision: decision as i32,
        rule: rule.into(),
    };
    // A rule that does not parse, comes with a decision other than
    // ALLOW_SESSION, names another tool or does not match the call is
    // refused at once, and the call still waits for its answer.
    for (rule, decision, want) in [
        ("shell(", Decision::AllowSession, "must end with `)`"),
        (
            "shell(printf *)",
            Decision::AllowOnce,
            "only come with ALLOW_SESSION",
        ),
        (
            "file_manager__write",
            Decision::AllowSession,
            "must name the approved tool `shell` exactly",
        ),
        (
            "shell(ls *)",
            Decision::AllowSession,
            "`shell(ls *)` does not match the approved call",
        ),
    ] {
        let e = client
            .approve_tool(approve(rule, decision))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{rule}");
        assert!(e.message().contains(want), "{rule}: {}", e.message());
    }
    client
        .approve_tool(approve("shell(printf *)", Decision::AllowSession))
        .await
        .unwrap();
    let events = chat.until_done().await;
    let c1 = &finished_calls(&events)[0];
    assert!(
        c1.status() == ToolStatus::Done && c1.result.contains("one"),
        "{}",
        c1.result
    );

    // Turn 2: the matching call runs without a question; the compound one still asks.
    let mut next = req("print two", "auto");
    next.session_id = session.clone();
    let mut chat = stack.chat(next).await.unwrap();
    let asked = chat.until_approval().await;
    assert_eq!(asked, "c3", "c2 must not ask");
    chat.approve(&asked, Decision::Deny).await;
    let events = chat.until_done().await;
    let approvals: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolApprovalRequest(a)) => Some(a.call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(approvals, ["c3"]);
    let done = finished_calls(&events);
    let by_id = |id: &str| done.iter().find(|f| f.call_id == id).unwrap().clone();
    assert_eq!(
        by_id("c2").status(),
        ToolStatus::Done,
        "{}",
        by_id("c2").result
    );
    assert!(by_id("c2").result.contains("two"), "{}", by_id("c2").result);
    assert!(
        by_id("c3").result.contains("denied by user"),
        "{}",
        by_id("c3").result
    );

    // Turn 3: a ChatRequest deny rule beats the session's grant, even in full mode.
    let mut third = req("print three", "full");
    third.session_id = session.clone();
    third.permissions = Some(omicos_proto::PermissionRules {
        deny: vec!["shell(printf three)".into()],
        ..Default::default()
    });
    let events = stack.chat(third).await.unwrap().until_done().await;
    let c4 = &finished_calls(&events)[0];
    assert_eq!(c4.status(), ToolStatus::Error);
    assert!(
        c4.result
            .contains("deny rule `shell(printf three)` (request)"),
        "{}",
        c4.result
    );

    // The trajectory names the rule that decided each call, and its source.
    let rec = trajectory_records(&stack, &session);
    assert_eq!(rec["c1"]["approval"]["granted_rule"], "shell(printf *)");
    assert_eq!(rec["c1"]["permission"]["gate"], "ask");
    assert_eq!(rec["c2"]["permission"]["gate"], "run");
    assert_eq!(rec["c2"]["permission"]["rule"]["rule"], "shell(printf *)");
    assert_eq!(rec["c2"]["permission"]["rule"]["source"], "session");
    assert_eq!(rec["c2"]["permission"]["rule"]["behavior"], "allow");
    assert_eq!(rec["c3"]["permission"]["gate"], "ask");
    assert!(
        rec["c3"]["permission"].get("rule").is_none(),
        "{}",
        rec["c3"]
    );
    assert_eq!(rec["c4"]["permission"]["gate"], "refuse");
    assert_eq!(rec["c4"]["permission"]["rule"]["source"], "request");

    // A ChatRequest whose rule does not parse is refused before a turn starts.
    let mut bad = req("hi", "auto");
    bad.permissions = Some(omicos_proto::PermissionRules {
        allow: vec!["web_fetch(domain:)".into()],
        ..Default::default()
    });
    let e = stack.chat(bad).await.err().expect("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("web_fetch(domain:)"),
        "{}",
        e.message()
    );
}
