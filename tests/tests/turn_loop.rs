//! The turn loop for real work (issue 16), end to end through Chat:
//!
//! - every real server's streaming shape of tool calls and reasoning;
//! - a 300-turn session in a 4,000-token window that never overflows;
//! - parallel calls: results in call order, exactly once under cancel, two
//!   approvals pending at once;
//! - budgets in a root turn and in a call_agent sub-turn;
//! - a context overflow that still comes back: compact, retry once, fail clearly;
//! - a cancelled model stream kept in the history as interrupted.

use async_trait::async_trait;
use omicos_e2e::stack::{ChatHandle, ConfigTweak, assert_gap_free, done_reason};
use omicos_e2e::stream_shapes::call_id;
use omicos_e2e::{
    FakeLlm, Reasoning, Reply, Shape, Stack, StackOptions, events_text, finished_calls,
};
use omicos_orchestrator::agents::CatalogAgents;
use omicos_proto::{
    ChatEvent, ChatRequest, Decision, GetSessionRequest, Risk, ToolSpec, ToolStatus, TurnDone,
    chat_event,
};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn req(message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        message: message.into(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn in_session(session: &str, message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        ..req(message, mode)
    }
}

fn calls(list: &[(&str, &str, Value)]) -> Vec<(String, String, String)> {
    list.iter()
        .map(|(id, name, args)| (id.to_string(), name.to_string(), args.to_string()))
        .collect()
}

fn tools(list: &[(&str, &str, Value)]) -> Reply {
    Reply::Tools(String::new(), calls(list))
}

fn turn_done(events: &[ChatEvent]) -> TurnDone {
    events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::TurnDone(d)) => Some(d.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no turn_done: {events:#?}"))
}

fn started_ids(events: &[ChatEvent]) -> Vec<String> {
    omicos_e2e::stack::started_calls(events)
        .into_iter()
        .map(|s| s.call_id)
        .collect()
}

/// The ids of the tool results of an OpenAI request body, in order.
fn result_ids(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn history(stack: &Stack, session: &str) -> Vec<Value> {
    stack
        .client()
        .await
        .get_session(GetSessionRequest {
            session_id: session.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .messages_json
        .iter()
        .map(|m| serde_json::from_str(m).unwrap())
        .collect()
}

fn trajectory(stack: &Stack, session: &str) -> Vec<Value> {
    std::fs::read_to_string(
        stack
            .workspace
            .join(".omicos/trajectories")
            .join(session)
            .join("trajectory.jsonl"),
    )
    .unwrap()
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect()
}

// ---------------------------------------------------------------------------
// 1. Every real server's streaming shape, through Chat.

/// One answer of `shape` writing `n` notes (each appended, so a call that ran
/// twice shows), then a plain answer; checks every call ran once with its
/// name and arguments, and that the reasoning stays out of the answer text,
/// the history and the next request but is in the trajectory.
async fn shape_through_chat(shape: Shape, n: usize, reasoning: Option<Reasoning>) {
    let label = format!("{shape:?}").to_lowercase();
    let wanted: Vec<(String, String, String)> = (0..n)
        .map(|i| {
            (
                call_id(shape, i, "file_manager__write"),
                "file_manager__write".to_owned(),
                json!({"path": format!("notes/{label}-{i}.txt"),
                       "content": format!("note {i} from {label}"), "append": true})
                .to_string(),
            )
        })
        .collect();
    let llm = FakeLlm::start(vec![
        Reply::Shaped {
            shape,
            reasoning: reasoning.clone(),
            text: "Writing the notes now.".into(),
            calls: wanted.clone(),
        },
        Reply::Text("All notes are written.".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(req("write the notes", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{shape:?}: {events:#?}"
    );
    assert_gap_free(&events, 0);
    let finished = finished_calls(&events);
    assert_eq!(finished.len(), n, "{shape:?}: {finished:#?}");
    let started: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolCallStarted(s)) => {
                Some((s.name.clone(), s.arguments.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), n, "{shape:?}: each call started once");
    for (i, (id, name, args)) in wanted.iter().enumerate() {
        assert_eq!(finished[i].name, *name, "{shape:?}");
        assert_eq!(
            finished[i].status(),
            ToolStatus::Done,
            "{shape:?}: {}",
            finished[i].result
        );
        if !id.is_empty() {
            assert_eq!(
                finished[i].call_id, *id,
                "{shape:?}: the server's id is kept"
            );
        }
        let sent: Value = serde_json::from_str(&started[i].1).unwrap();
        assert_eq!(
            sent,
            serde_json::from_str::<Value>(args).unwrap(),
            "{shape:?}"
        );
        // Appended: a second run would have doubled the note.
        let on_disk =
            std::fs::read_to_string(stack.workspace.join(format!("notes/{label}-{i}.txt")))
                .unwrap();
        assert_eq!(on_disk, format!("note {i} from {label}"), "{shape:?}");
    }
    let text = events_text(&events);
    assert_eq!(
        text, "Writing the notes now.All notes are written.",
        "{shape:?}"
    );
    // The next request: one assistant message with exactly these calls, each answered once.
    llm.assert_invariants();
    let second = &llm.requests()[1].body;
    let assistant: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistant.len(), 1, "{shape:?}: {second}");
    let sent_calls = assistant[0]["tool_calls"].as_array().unwrap();
    assert_eq!(sent_calls.len(), n, "{shape:?}: {second}");
    for (c, (_, name, args)) in sent_calls.iter().zip(&wanted) {
        assert_eq!(c["function"]["name"], name.as_str());
        assert_eq!(
            serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap()).unwrap(),
            serde_json::from_str::<Value>(args).unwrap()
        );
    }
    let session = events[0].session_id.clone();
    let model_turns: Vec<Value> = trajectory(&stack, &session)
        .into_iter()
        .filter(|l| l["type"] == "model_turn")
        .collect();
    if let Some(r) = reasoning {
        assert!(
            !text.contains(&r.text),
            "{shape:?}: reasoning in the answer"
        );
        assert!(
            !second.to_string().contains(&r.text),
            "{shape:?}: reasoning sent back to the model: {second}"
        );
        let stored = serde_json::to_string(&history(&stack, &session).await).unwrap();
        assert!(
            !stored.contains(&r.text),
            "{shape:?}: reasoning in the history"
        );
        // Once, even when the server sent it in two fields.
        assert_eq!(model_turns[0]["reasoning"], r.text.as_str(), "{shape:?}");
    }
    assert_eq!(model_turns[0]["text"], "Writing the notes now.");
}

fn reasoning(fields: &[&'static str]) -> Option<Reasoning> {
    Some(Reasoning {
        fields: fields.to_vec(),
        text: "The user wants notes; appending keeps earlier ones. REASONING-MARK".into(),
    })
}

#[tokio::test]
async fn shape_openai_vllm_name_once_with_reasoning_content() {
    shape_through_chat(Shape::OpenAi, 2, reasoning(&["reasoning_content"])).await;
}

#[tokio::test]
async fn shape_llama_cpp_python_name_and_id_in_every_chunk_in_both_fields() {
    shape_through_chat(Shape::LlamaCppPython, 2, None).await;
}

#[tokio::test]
async fn shape_ollama_whole_calls_under_one_index_with_reasoning() {
    shape_through_chat(Shape::Ollama, 3, reasoning(&["reasoning"])).await;
}

#[tokio::test]
async fn shape_function_call_beside_tool_calls_runs_once() {
    shape_through_chat(Shape::FunctionCallBeside, 2, None).await;
}

#[tokio::test]
async fn shape_legacy_function_call_alone() {
    shape_through_chat(Shape::LegacyFunctionCall, 1, None).await;
}

#[tokio::test]
async fn shape_interleaved_indices_with_reasoning_in_both_fields() {
    shape_through_chat(
        Shape::Interleaved,
        3,
        reasoning(&["reasoning_content", "reasoning"]),
    )
    .await;
}

// ---------------------------------------------------------------------------
// A provider for the parallel tests.

/// `probe_wait {tag, after?, ms?}` (risk Read): finishes once the call tagged
/// `after` has finished (so calls that must overlap prove they did), or
/// after `ms`; stops on cancel. `probe_stamp {tag}` (risk FileWrite).
/// Every run is counted.
#[derive(Clone)]
struct Probe {
    finished: Arc<tokio::sync::watch::Sender<Vec<String>>>,
    runs: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    fn new() -> Self {
        Self {
            finished: Arc::new(tokio::sync::watch::channel(vec![]).0),
            runs: Arc::default(),
        }
    }

    fn runs(&self) -> Vec<String> {
        self.runs.lock().unwrap().clone()
    }
}

#[async_trait]
impl Provider for Probe {
    fn name(&self) -> &str {
        "probe"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        let schema = json!({"type": "object", "properties": {
            "tag": {"type": "string"}, "after": {"type": "string"}, "ms": {"type": "integer"}},
            "required": ["tag"]});
        vec![
            tool(
                "probe_wait",
                "Waits for another call, or a while.",
                schema.clone(),
            )
            .provider("probe")
            .build(),
            tool("probe_stamp", "Stamps a tag.", schema)
                .risk(Risk::FileWrite)
                .provider("probe")
                .build(),
        ]
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let tag = args["tag"].as_str().unwrap_or_default().to_owned();
        self.runs.lock().unwrap().push(tag.clone());
        if tool == "probe_wait" {
            let mut rx = self.finished.subscribe();
            let wait = async {
                match args["after"].as_str() {
                    Some(after) => {
                        let after = after.to_owned();
                        let _ = rx.wait_for(|done| done.contains(&after)).await;
                    }
                    None => {
                        tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(0)))
                            .await
                    }
                }
            };
            tokio::select! {
                _ = wait => {}
                _ = tokio::time::sleep(Duration::from_secs(20)) => {
                    return Err(ToolError::failed(format!("{tag}: waited 20 s: the calls did not run side by side")));
                }
                _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            }
        }
        self.finished.send_modify(|d| d.push(tag.clone()));
        Ok(json!(format!("{tool} {tag}")))
    }
}

async fn probe_stack(llm: FakeLlm, probe: &Probe, tweak: Option<ConfigTweak>) -> Stack {
    Stack::start(
        llm,
        StackOptions {
            providers: vec![Arc::new(probe.clone())],
            tweak,
            ..Default::default()
        },
    )
    .await
}

// ---------------------------------------------------------------------------
// 3. Parallel calls.

#[tokio::test]
async fn parallel_read_only_calls_overlap_and_return_in_call_order() {
    // a waits for c, c for b: they can only finish if they run side by side,
    // and they finish b, c, a, the reverse of the call order.
    let probe = Probe::new();
    let llm = FakeLlm::start(vec![
        tools(&[
            ("p_a", "probe_wait", json!({"tag": "a", "after": "c"})),
            ("p_b", "probe_wait", json!({"tag": "b", "ms": 0})),
            ("p_c", "probe_wait", json!({"tag": "c", "after": "b"})),
        ]),
        Reply::Text("all three came back".into()),
    ])
    .await;
    let stack = probe_stack(llm.clone(), &probe, None).await;
    let events = stack
        .chat(req("wait for the three", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let finished = finished_calls(&events);
    assert!(
        finished.iter().all(|f| f.status() == ToolStatus::Done),
        "{finished:#?}"
    );
    // All three started before any finished, and they finished b, c, a.
    let first_finish = events
        .iter()
        .position(|e| matches!(e.kind, Some(chat_event::Kind::ToolCallFinished(_))))
        .unwrap();
    assert_eq!(started_ids(&events[..first_finish]), ["p_a", "p_b", "p_c"]);
    assert_eq!(*probe.finished.borrow(), ["b", "c", "a"]);
    // Back to the model in call order.
    assert_eq!(result_ids(&llm.requests()[1].body), ["p_a", "p_b", "p_c"]);
    llm.assert_invariants();
    assert_eq!(probe.runs().len(), 3);
}

#[tokio::test]
async fn a_cancel_answers_every_parallel_and_queued_call_exactly_once() {
    let probe = Probe::new();
    let llm = FakeLlm::start(vec![
        tools(&[
            ("w_1", "probe_wait", json!({"tag": "w1", "ms": 30_000})),
            ("w_2", "probe_wait", json!({"tag": "w2", "ms": 30_000})),
            (
                "f_w",
                "file_manager__write",
                json!({"path": "never.txt", "content": "x"}),
            ),
            ("w_3", "probe_wait", json!({"tag": "w3", "ms": 0})),
        ]),
        Reply::Text("next turn".into()),
    ])
    .await;
    let stack = probe_stack(llm.clone(), &probe, None).await;
    let mut chat = stack.chat(req("wait a long time", "full")).await.unwrap();
    let mut started = 0;
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            started += 1;
            if started == 2 {
                break;
            }
        }
    }
    chat.cancel().await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    assert_eq!(
        started_ids(&events),
        ["w_1", "w_2"],
        "the write never started"
    );
    let finished = finished_calls(&events);
    let mut ids: Vec<&str> = finished.iter().map(|f| f.call_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["f_w", "w_1", "w_2", "w_3"], "each answered once");
    assert!(finished.iter().all(|f| f.status() == ToolStatus::Error));
    for f in finished
        .iter()
        .filter(|f| f.call_id == "f_w" || f.call_id == "w_3")
    {
        assert!(f.result.contains("before it ran"), "{}", f.result);
    }
    assert!(!stack.workspace.join("never.txt").exists());
    let mut runs = probe.runs();
    runs.sort();
    assert_eq!(runs, ["w1", "w2"]);
    // The session goes on; its history answers each call once, in call order.
    let session = events[0].session_id.clone();
    let next = stack
        .chat(in_session(&session, "go on", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&next).as_deref(), Some("completed"));
    llm.assert_invariants();
    assert_eq!(
        result_ids(&llm.requests()[1].body),
        ["w_1", "w_2", "f_w", "w_3"]
    );
}

#[tokio::test]
async fn two_approvals_pending_at_once_are_answered_separately() {
    let probe = Probe::new();
    let llm = FakeLlm::start(vec![
        tools(&[
            ("s_x", "probe_stamp", json!({"tag": "x"})),
            ("s_y", "probe_stamp", json!({"tag": "y"})),
        ]),
        Reply::Text("one stamped".into()),
    ])
    .await;
    // Risky, but declared safe side by side: both run at once, both ask.
    let stack = probe_stack(
        llm.clone(),
        &probe,
        Some(Box::new(|c| {
            c.tool_calls.concurrency_safe = vec!["probe_stamp".into()];
        })),
    )
    .await;
    let mut chat = stack.chat(req("stamp both", "auto")).await.unwrap();
    let mut pending = vec![];
    while pending.len() < 2 {
        let ev = chat.next().await.expect("the stream ended");
        match ev.kind {
            Some(chat_event::Kind::ToolApprovalRequest(a)) => pending.push(a.call_id),
            Some(chat_event::Kind::ToolCallFinished(f)) => {
                panic!("{} finished before both approvals were asked", f.call_id)
            }
            _ => {}
        }
    }
    pending.sort();
    assert_eq!(pending, ["s_x", "s_y"]);
    assert!(probe.runs().is_empty(), "nothing runs before its approval");
    // The second first, then the first.
    chat.approve("s_y", Decision::AllowOnce).await;
    chat.approve("s_x", Decision::Deny).await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let f: HashMap<String, _> = finished_calls(&events)
        .into_iter()
        .map(|f| (f.call_id.clone(), f))
        .collect();
    assert_eq!(f.len(), 2);
    assert_eq!(f["s_y"].status(), ToolStatus::Done, "{:?}", f["s_y"]);
    assert!(f["s_y"].result.contains("probe_stamp y"), "{:?}", f["s_y"]);
    assert_eq!(f["s_x"].status(), ToolStatus::Error);
    assert!(f["s_x"].result.contains("denied by user"), "{:?}", f["s_x"]);
    assert_eq!(probe.runs(), ["y"]);
    let resolved = events
        .iter()
        .filter(|e| matches!(e.kind, Some(chat_event::Kind::ToolApprovalResolved(_))))
        .count();
    assert_eq!(resolved, 2);
    assert_eq!(result_ids(&llm.requests()[1].body), ["s_x", "s_y"]);
    llm.assert_invariants();
}

// ---------------------------------------------------------------------------
// 4. Budgets.

#[tokio::test]
async fn a_root_turn_stops_at_its_token_budget_with_a_clear_reason_and_usage() {
    // The fake reports 11 input + 7 output tokens per request.
    let list = |id: &str| tools(&[(id, "file_manager__list", json!({"path": "."}))]);
    let llm = FakeLlm::start(vec![
        list("l_1"),
        list("l_2"),
        list("l_3"),
        Reply::Text("next turn".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            tweak: Some(Box::new(|c| c.budget.turn_tokens = 40)),
            ..Default::default()
        },
    )
    .await;
    let events = stack
        .chat(req("list forever", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let done = turn_done(&events);
    assert_eq!(done.reason().as_str(), "budget", "{events:#?}");
    assert!(
        done.detail.contains("turn token budget") && done.detail.contains("54 of 40"),
        "{}",
        done.detail
    );
    let usage = done.usage.expect("turn_done carries usage");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.model_calls),
        (33, 21, 3)
    );
    assert_eq!(
        (usage.session_input_tokens, usage.session_output_tokens),
        (33, 21)
    );
    // Two calls ran; the third was answered as not run.
    let f = finished_calls(&events);
    assert_eq!(f.len(), 3);
    assert!(f[..2].iter().all(|c| c.status() == ToolStatus::Done));
    assert_eq!(f[2].status(), ToolStatus::Error);
    assert!(
        f[2].result.contains("not run") && f[2].result.contains("budget"),
        "{}",
        f[2].result
    );
    assert_eq!(llm.requests().len(), 3);
    // The trajectory says why, with the usage.
    let session = events[0].session_id.clone();
    let last = trajectory(&stack, &session).pop().unwrap();
    assert_eq!(last["reason"], "budget");
    assert_eq!(last["usage"]["model_calls"], 3);
    // A new turn has a new turn budget, and its request answers every call once.
    let next = stack
        .chat(in_session(&session, "go on", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&next).as_deref(), Some("completed"));
    let u = turn_done(&next).usage.unwrap();
    assert_eq!((u.input_tokens, u.session_input_tokens), (11, 44));
    llm.assert_invariants();
}

#[tokio::test]
async fn a_session_past_its_budget_refuses_the_next_model_call() {
    let llm = FakeLlm::start(vec![
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("never".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            tweak: Some(Box::new(|c| c.budget.session_tokens = 30)),
            ..Default::default()
        },
    )
    .await;
    let first = stack
        .chat(req("hi", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&first).as_deref(), Some("completed"));
    let session = first[0].session_id.clone();
    let second = stack
        .chat(in_session(&session, "again", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&second).as_deref(), Some("completed"));
    let third = stack
        .chat(in_session(&session, "once more", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let done = turn_done(&third);
    assert_eq!(done.reason().as_str(), "budget");
    assert!(
        done.detail.contains("session token budget"),
        "{}",
        done.detail
    );
    assert_eq!(done.usage.unwrap().session_input_tokens, 22);
    assert_eq!(llm.requests().len(), 2, "no model call past the budget");
}

fn agent_file(id: &str, toolsets: &[&str], prompt: &str) -> String {
    format!(
        "---\nid: {id}\nname: {id} agent\ndescription: the {id} of the team\ntoolsets: [{}]\n---\n{prompt}\n",
        toolsets.join(", ")
    )
}

/// A stack whose catalog holds exactly `agents` (id, toolsets, prompt).
async fn agents_stack(
    llm: FakeLlm,
    agents: &[(&str, &[&str], &str)],
    opts: StackOptions,
) -> (Stack, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".omicos/agents");
    std::fs::create_dir_all(&dir).unwrap();
    for (id, toolsets, prompt) in agents {
        std::fs::write(
            dir.join(format!("{id}.md")),
            agent_file(id, toolsets, prompt),
        )
        .unwrap();
    }
    let mut cc = omicos_catalog::CatalogConfig::new(tmp.path(), omicos_catalog::Tier::Community);
    cc.builtin_agents = false;
    cc.agent_cache_dir = None;
    cc.skill_cache_dir = None;
    let (catalog, warnings) = omicos_catalog::Catalog::load(cc);
    assert!(warnings.is_empty(), "{warnings:?}");
    let stack = Stack::start(
        llm,
        StackOptions {
            agents: Some(Arc::new(CatalogAgents::from_catalog(catalog))),
            workspace: Some(tmp.path().to_path_buf()),
            ..opts
        },
    )
    .await;
    (stack, tmp)
}

#[tokio::test]
async fn a_sub_turn_stops_at_its_own_budget_and_the_caller_goes_on() {
    let list = |id: &str| tools(&[(id, "file_manager__list", json!({"path": "."}))]);
    let llm = FakeLlm::start(vec![
        tools(&[(
            "c_del",
            "call_agent",
            json!({"agent_name": "helper", "instruction": "list the files, again and again"}),
        )]),
        list("h_1"),
        list("h_2"),
        list("h_3"),
        Reply::Text("The helper ran out of budget; here is what it found.".into()),
    ])
    .await;
    let (stack, _tmp) = agents_stack(
        llm.clone(),
        &[
            ("lead", &["file_manager"], "You are LEAD."),
            ("helper", &["file_manager"], "You are HELPER."),
        ],
        StackOptions {
            tweak: Some(Box::new(|c| c.budget.sub_turn_tokens = 40)),
            ..Default::default()
        },
    )
    .await;
    let events = stack
        .chat(ChatRequest {
            agent: "lead".into(),
            team_members: vec!["lead".into(), "helper".into()],
            ..req("delegate the listing", "full")
        })
        .await
        .unwrap()
        .until_done()
        .await;
    let done = turn_done(&events);
    assert_eq!(done.reason().as_str(), "completed", "{events:#?}");
    let f = finished_calls(&events);
    let del = f.iter().find(|c| c.call_id == "c_del").unwrap();
    assert_eq!(del.status(), ToolStatus::Error);
    assert!(
        del.result.contains("sub-turn token budget")
            && del.result.contains("budget.sub_turn_tokens"),
        "{}",
        del.result
    );
    let h3 = f.iter().find(|c| c.call_id == "h_3").unwrap();
    assert!(h3.result.contains("not run"), "{}", h3.result);
    // The usage of the turn counts the sub-turn's model calls too.
    let usage = done.usage.unwrap();
    assert_eq!(
        (usage.model_calls, usage.input_tokens, usage.output_tokens),
        (5, 55, 35)
    );
    // The caller read the reason as its tool result.
    let last = &llm.requests()[4].body;
    assert!(last.to_string().contains("sub-turn token budget"), "{last}");
    assert!(
        last["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("LEAD")
    );
    llm.assert_invariants();
}

// ---------------------------------------------------------------------------
// 5. A context overflow that still comes back: compact, retry once, fail clearly.

const OVERFLOW: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;

/// Two turns of history, then a third whose first request is refused as too long.
async fn overflow_session(third: Vec<Reply>) -> (FakeLlm, Stack, String, Vec<ChatEvent>) {
    // Long answers, so that folding the older one saves room.
    let long = |what: &str| -> String { (0..300).map(|i| format!("{what}{i} ")).collect() };
    let mut script = vec![
        Reply::Text(long("first")),
        Reply::Text(long("second")),
        Reply::Status(400, OVERFLOW.into(), None),
    ];
    script.extend(third);
    let llm = FakeLlm::start(script).await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let first = stack
        .chat(req("ORIGINAL-QUESTION: what is in the data?", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = first[0].session_id.clone();
    for m in ["and then?", "the third question"] {
        let events = stack
            .chat(in_session(&session, m, "full"))
            .await
            .unwrap()
            .until_done()
            .await;
        if m == "the third question" {
            return (llm, stack, session, events);
        }
        assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    }
    unreachable!()
}

fn compactions(events: &[ChatEvent]) -> Vec<omicos_proto::Compaction> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::Compaction(c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_overflow_compacts_and_the_retry_goes_through() {
    let (llm, stack, session, events) = overflow_session(vec![
        Reply::Text("SUMMARY-OF-EARLIER: the user asked about the data.".into()),
        Reply::Text("fits now".into()),
    ])
    .await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    assert_eq!(events_text(&events), "fits now");
    let c = compactions(&events);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].trigger, "overflow");
    assert!(
        c[0].messages_summarized > 0 && c[0].tokens_after < c[0].tokens_before,
        "{c:?}"
    );
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        5,
        "two turns, the refused request, the summary, the retry"
    );
    assert!(
        reqs[3].body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You are compacting")
    );
    // The retry: the checkpoint (with the original request) and the summary
    // first, then the latest exchange verbatim.
    let retry = reqs[4].body["messages"].as_array().unwrap();
    let head = retry[1]["content"].as_str().unwrap();
    assert!(head.starts_with("[Context checkpoint"), "{head}");
    assert!(
        head.contains("ORIGINAL-QUESTION") && head.contains("SUMMARY-OF-EARLIER"),
        "{head}"
    );
    assert_eq!(retry.last().unwrap()["content"], "the third question");
    // The store keeps every message, and the marker.
    let h = history(&stack, &session).await;
    let roles: Vec<&str> = h.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "compaction",
            "assistant"
        ]
    );
}

#[tokio::test]
async fn an_overflow_that_comes_back_after_compacting_fails_clearly() {
    let (llm, stack, session, events) = overflow_session(vec![
        Reply::Text("SUMMARY-OF-EARLIER".into()),
        Reply::Status(400, OVERFLOW.into(), None),
        Reply::Text("never asked".into()),
    ])
    .await;
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    let err = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) => Some(x.clone()),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(err.kind, "context_overflow");
    assert!(
        err.message.contains("still too long after compacting once")
            && err.message.contains("maximum context length"),
        "{}",
        err.message
    );
    assert_eq!(compactions(&events).len(), 1);
    assert_eq!(llm.requests().len(), 5, "retried once, not again");
    // Nothing is lost: the user's message and the earlier turns are in the store.
    let h = history(&stack, &session).await;
    assert_eq!(h.iter().filter(|m| m["role"] == "user").count(), 3);
    assert!(h.iter().any(|m| m["content"] == "the third question"));
}

#[tokio::test]
async fn an_overflow_with_nothing_older_to_fold_fails_at_once() {
    let llm = FakeLlm::start(vec![
        Reply::Status(400, OVERFLOW.into(), None),
        Reply::Text("never asked".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(req("a single long question", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("error"));
    let msg = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(chat_event::Kind::Error(x)) if x.kind == "context_overflow" => {
                Some(x.message.clone())
            }
            _ => None,
        })
        .expect("a context_overflow error");
    assert!(msg.contains("nothing older is left to compact"), "{msg}");
    assert_eq!(llm.requests().len(), 1);
}

// ---------------------------------------------------------------------------
// 6. A cancelled model stream keeps its partial text, marked interrupted.

#[tokio::test]
async fn a_cancelled_stream_keeps_the_partial_answer_as_the_user_saw_it() {
    let long: String = (0..80).map(|i| format!("w{i} ")).collect();
    let llm = FakeLlm::start(vec![
        Reply::Slow(long.clone(), Duration::from_millis(25)),
        Reply::Text("picking up again".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("talk at length", "full")).await.unwrap();
    let mut deltas = 0;
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::TextDelta(_))) {
            deltas += 1;
            if deltas == 5 {
                break;
            }
        }
    }
    chat.cancel().await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    let seen = events_text(&events);
    assert!(seen.len() >= 10 && seen.len() < long.len(), "{seen:?}");
    let session = events[0].session_id.clone();
    let h = history(&stack, &session).await;
    let last = h.last().unwrap();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"], seen.as_str(), "kept as the user saw it");
    assert_eq!(last["interrupted"], true);
    let t = trajectory(&stack, &session);
    assert!(
        t.iter().any(|l| l["type"] == "model_turn"
            && l["interrupted"] == true
            && l["text"] == seen.as_str()),
        "{t:#?}"
    );
    // The next request carries it as an assistant message (the mark stays private).
    let next = stack
        .chat(in_session(&session, "go on", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&next).as_deref(), Some("completed"));
    let msgs = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .clone();
    let partial = msgs
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the partial answer");
    assert_eq!(partial["content"], seen.as_str());
    assert!(partial.get("interrupted").is_none(), "{partial}");
}

// ---------------------------------------------------------------------------
// 2. A session longer than the context window.

const ORIGINAL: &str = "ORIGINAL-REQUEST: analyse the samples step by step. For each step write its partial \
result to data/part<k>.txt, keep the task list current, and report at the end.";
const PLAN: &str = "PLAN-MARK\n1. Load the samples\n2. Process them step by step into data/part<k>.txt\n3. Summarize the findings";
const WINDOW: u64 = 4_000;
const TURNS: usize = 300;

/// What the fake model was asked and answered in the long session.
#[derive(Default)]
struct Sim {
    calls: Vec<String>,
    summaries: usize,
}

/// The model of the long session: turn 1 plans and creates three tasks;
/// every later turn writes a partial result (and every 40th updates a
/// task), then reports; a compaction request gets a short summary.
fn long_session_model(sim: Arc<Mutex<Sim>>) -> impl Fn(&Value) -> Reply + Send + Sync {
    move |body| {
        let msgs = body["messages"].as_array().expect("messages");
        let mut sim = sim.lock().unwrap();
        if msgs[0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You are compacting"))
        {
            sim.summaries += 1;
            return Reply::Text(format!(
                "Summary {}: the samples are being processed one step at a time; partial results are in \
                 data/part0.txt to data/part4.txt; nothing failed so far.",
                sim.summaries
            ));
        }
        let step = msgs
            .iter()
            .rev()
            .filter(|m| m["role"] == "user")
            .find_map(|m| {
                m["content"]
                    .as_str()?
                    .strip_prefix("Step ")?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .unwrap_or(1);
        if msgs.last().unwrap()["role"] == "tool" {
            return Reply::Text(format!(
                "Step {step} is done: data/part{}.txt is updated.",
                step % 5
            ));
        }
        let mut out: Vec<(String, String, String)> = vec![];
        let mut call = |name: &str, args: Value| {
            let id = format!("c{step}_{}", out.len());
            sim.calls.push(id.clone());
            out.push((id, name.to_owned(), args.to_string()));
        };
        if step == 1 {
            call("plan", json!({"plan": PLAN}));
            for t in ["load the samples", "process the samples", "summarize"] {
                call("task__create", json!({"title": t}));
            }
        } else {
            let body: String = (0..12)
                .map(|i| format!("sample {step}.{i}: value {} ok; ", step * 31 + i))
                .collect();
            call(
                "file_manager__write",
                json!({"path": format!("data/part{}.txt", step % 5), "content": body}),
            );
            if step % 40 == 0 {
                let status = if step % 80 == 0 {
                    "completed"
                } else {
                    "in_progress"
                };
                call(
                    "task__update",
                    json!({"id": (step / 40) % 3 + 1, "status": status}),
                );
            }
        }
        Reply::Streamed {
            text: format!("Working on step {step}."),
            chunks: 2,
            delay: Duration::ZERO,
            calls: out,
        }
    }
}

#[tokio::test]
async fn a_300_turn_session_in_a_4000_token_window_never_overflows() {
    let sim = Arc::new(Mutex::new(Sim::default()));
    let llm = FakeLlm::start(vec![])
        .await
        .with_window(WINDOW)
        .with_responder(long_session_model(sim.clone()));
    let (stack, _tmp) = agents_stack(
        llm.clone(),
        &[(
            "analyst",
            &["file_manager", "task", "plan"],
            "You are the analyst. Work step by step.",
        )],
        StackOptions {
            providers: vec![
                Arc::new(omicos_catalog::TaskProvider),
                Arc::new(omicos_catalog::PlanProvider),
            ],
            // The default store: SQLite in the workspace.
            store_url: String::new(),
            tweak: Some(Box::new(|c| {
                c.context.windows.insert("fake-model".into(), WINDOW);
            })),
            ..Default::default()
        },
    )
    .await;
    let started = std::time::Instant::now();
    let client = stack.client().await;
    // Turn 1: the plan asks for approval.
    let mut chat = ChatHandle::open(client.clone(), req(ORIGINAL, "full"))
        .await
        .unwrap();
    let plan_call = chat.until_approval().await;
    assert_eq!(plan_call, "c1_0");
    chat.approve(&plan_call, Decision::AllowOnce).await;
    let first = chat.until_done().await;
    assert_eq!(
        done_reason(&first).as_deref(),
        Some("completed"),
        "{first:#?}"
    );
    let session = first[0].session_id.clone();
    let mut seen_compactions = compactions(&first).len();
    for step in 2..=TURNS {
        let events = ChatHandle::open(
            client.clone(),
            in_session(
                &session,
                &format!("Step {step}. Go on with the analysis."),
                "full",
            ),
        )
        .await
        .unwrap()
        .until_done()
        .await;
        assert_eq!(
            done_reason(&events).as_deref(),
            Some("completed"),
            "step {step}: {events:#?}"
        );
        seen_compactions += compactions(&events).len();
    }
    let elapsed = started.elapsed();
    eprintln!("{TURNS} turns in {elapsed:?}, {seen_compactions} compactions");

    let reqs = llm.requests();
    // Never overflowed: the fake refuses a request past the window with a real 400.
    let refused: Vec<u64> = reqs
        .iter()
        .filter(|r| r.refused)
        .map(|r| r.tokens)
        .collect();
    assert!(refused.is_empty(), "requests past the window: {refused:?}");
    let biggest = reqs.iter().map(|r| r.tokens).max().unwrap();
    assert!(biggest <= WINDOW, "{biggest}");
    let summaries = sim.lock().unwrap().summaries;
    assert!(
        summaries >= 10,
        "the session was compacted only {summaries} times"
    );
    assert_eq!(
        seen_compactions, summaries,
        "one compaction event per compaction"
    );
    llm.assert_invariants();

    // The last request still carries the original request, the plan and the
    // latest task list, verbatim.
    let h = history(&stack, &session).await;
    let latest_tasks = {
        let task_ids: Vec<&str> = h
            .iter()
            .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
            .filter(|c| {
                c["function"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("task__")
            })
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        let answer = h
            .iter()
            .rev()
            .find(|m| {
                m["role"] == "tool" && task_ids.contains(&m["tool_call_id"].as_str().unwrap())
            })
            .unwrap();
        let env: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
        env["result"].as_str().unwrap().to_owned()
    };
    assert!(latest_tasks.contains("completed"), "{latest_tasks}");
    let last = &reqs
        .iter()
        .rev()
        .find(|r| {
            !r.body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .starts_with("You are compacting")
        })
        .unwrap()
        .body;
    let msgs = last["messages"].as_array().unwrap();
    let head = msgs[1]["content"].as_str().unwrap();
    assert!(head.starts_with("[Context checkpoint"), "{head}");
    assert!(head.contains(ORIGINAL), "{head}");
    assert!(head.contains(PLAN), "{head}");
    assert!(head.contains(&latest_tasks), "{head}\n---\n{latest_tasks}");
    assert!(
        msgs.iter()
            .any(|m| m["content"] == format!("Step {TURNS}. Go on with the analysis.")),
        "the latest turn is verbatim"
    );

    // The store still holds every message: each turn's user message, each
    // call once with its one result, both answers of every turn.
    let users: Vec<&str> = h
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users.len(), TURNS);
    assert_eq!(users[0], ORIGINAL);
    for (i, u) in users.iter().enumerate().skip(1) {
        assert_eq!(*u, format!("Step {}. Go on with the analysis.", i + 1));
    }
    let issued = sim.lock().unwrap().calls.clone();
    let stored_calls: Vec<&str> = h
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(stored_calls, issued);
    let results: Vec<&str> = h
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(results, issued, "every call answered once, in order");
    assert_eq!(
        h.iter().filter(|m| m["role"] == "assistant").count(),
        2 * TURNS
    );
    assert_eq!(
        h.iter().filter(|m| m["role"] == "compaction").count(),
        summaries
    );
}

// ---------------------------------------------------------------------------
// 3. Steering a running turn (ChatRequest.steer).

fn steer(session: &str, message: &str) -> ChatRequest {
    ChatRequest {
        steer: true,
        ..in_session(session, message, "full")
    }
}

/// The first event of a kind on a stream, with what came before it.
async fn until_delta(chat: &mut ChatHandle) -> ChatEvent {
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::TextDelta(_))) {
            return ev;
        }
    }
    panic!("the stream ended before any text");
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

fn roles(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_steered_message_joins_the_running_turn_at_its_next_model_request() {
    const NOTE: &str = "STEER-NOTE: count them as well";
    let llm = FakeLlm::start(vec![
        Reply::Streamed {
            text: "Listing the files first. ".repeat(4),
            chunks: 8,
            delay: Duration::from_millis(60),
            calls: vec![("c1".into(), "file_manager__list".into(), "{}".into())],
        },
        Reply::Text("There are 0 files, counted as you asked.".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("list the files", "full")).await.unwrap();
    let first = until_delta(&mut chat).await;
    let session = first.session_id.clone();
    // Sent while the model streams its answer: joins after the call's result.
    let mut steering = stack.chat(steer(&session, NOTE)).await.unwrap();
    let steered = steering.until_done().await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert_eq!(done_reason(&steered).as_deref(), Some("completed"));
    assert_eq!(
        turn_done(&steered),
        turn_done(&events),
        "one turn, followed twice"
    );
    assert!(steered.iter().all(|e| e.turn_id == first.turn_id));
    assert_eq!(steers(&events), [NOTE]);
    assert_eq!(steers(&steered), [NOTE]);
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        2,
        "the steer joined the turn, no turn of its own"
    );
    assert_eq!(
        roles(&requests[1].body),
        ["system", "user", "assistant", "tool", "user"],
        "after the call's result, never between a call and its result"
    );
    assert_eq!(requests[1].body["messages"][4]["content"], NOTE);
    let h = history(&stack, &session).await;
    let stored: Vec<&str> = h.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(stored, ["user", "assistant", "tool", "user", "assistant"]);
    assert_eq!(h[3]["content"], NOTE);
}

#[tokio::test]
async fn a_message_steered_into_the_last_answer_gets_an_answer_of_its_own() {
    const NOTE: &str = "STEER-NOTE: and in French";
    let llm = FakeLlm::start(vec![
        Reply::Slow(
            "a long answer in English ".repeat(6),
            Duration::from_millis(40),
        ),
        Reply::Text("Et en français.".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let mut chat = stack.chat(req("say something", "full")).await.unwrap();
    let session = until_delta(&mut chat).await.session_id;
    let steered = stack
        .chat(steer(&session, NOTE))
        .await
        .unwrap()
        .until_done()
        .await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert_eq!(steers(&steered), [NOTE]);
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the turn went on to answer the steer");
    assert_eq!(
        roles(&requests[1].body),
        ["system", "user", "assistant", "user"]
    );
    assert!(events_text(&events).ends_with("Et en français."));
    // With no turn running, a steer is an ordinary message: it starts one.
    let later = stack
        .chat(steer(&session, "and now?"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&later).as_deref(), Some("completed"));
    assert!(steers(&later).is_empty());
    assert_ne!(later[0].turn_id, events[0].turn_id);
}
