//! Teams and call_agent: the orchestrator runs a sub-turn with the callee's own
//! prompt and tools, returns its answer as the caller's tool result, and
//! refuses self-calls, cycles, too-deep chains and overdue delegations.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, events_text, finished_calls};
use omicos_orchestrator::agents::CatalogAgents;
use omicos_proto::ToolStatus;
use omicos_proto::{ChatRequest, Decision, ListAgentToolsRequest, chat_event};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

fn agent(id: &str, toolsets: &[&str], prompt: &str) -> String {
    format!(
        "---\nid: {id}\nname: {id} agent\ndescription: the {id} of the team\ntoolsets: [{}]\nsummary: UI-ONLY-SUMMARY-{id}\n---\n{prompt}\n",
        toolsets.join(", ")
    )
}

/// A workspace holding `agents` (id, toolsets, prompt) as legacy workspace
/// agents, and a stack whose orchestrator uses only them.
async fn agents_stack(
    llm: FakeLlm,
    agents: &[(&str, &[&str], &str)],
    providers: Vec<Arc<dyn omicos_toolkit::Provider>>,
    tweak: Option<omicos_e2e::stack::ConfigTweak>,
) -> (Stack, tempfile::TempDir) {
    let files: Vec<(String, String)> = agents
        .iter()
        .map(|(id, toolsets, prompt)| (id.to_string(), agent(id, toolsets, prompt)))
        .collect();
    agent_files_stack(llm, &files, providers, tweak).await
}

/// A workspace holding agent files (id, whole text) as legacy workspace
/// agents, and a stack whose orchestrator uses only them.
async fn agent_files_stack(
    llm: FakeLlm,
    files: &[(String, String)],
    providers: Vec<Arc<dyn omicos_toolkit::Provider>>,
    tweak: Option<omicos_e2e::stack::ConfigTweak>,
) -> (Stack, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".omicos/agents");
    std::fs::create_dir_all(&dir).unwrap();
    for (id, text) in files {
        std::fs::write(dir.join(format!("{id}.md")), text).unwrap();
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
            providers,
            tweak,
            ..Default::default()
        },
    )
    .await;
    (stack, tmp)
}

/// Three agents: lead (file_manager), helper (shell), third (think).
async fn team_stack(
    llm: FakeLlm,
    tweak: Option<omicos_e2e::stack::ConfigTweak>,
) -> (Stack, tempfile::TempDir) {
    let agents: [(&str, &[&str], &str); 3] = [
        (
            "lead",
            &["file_manager"],
            "You are LEAD-PROMPT. Delegate shell work.",
        ),
        ("helper", &["shell"], "You are HELPER-PROMPT. Run commands."),
        ("third", &["think"], "You are THIRD-PROMPT."),
    ];
    agents_stack(
        llm,
        &agents,
        vec![Arc::new(omicos_catalog::ThinkProvider)],
        tweak,
    )
    .await
}

fn call(id: &str, target: &str, instruction: &str) -> Reply {
    Reply::Tools(
        String::new(),
        vec![(
            id.into(),
            "call_agent".into(),
            serde_json::json!({"agent_name": target, "instruction": instruction}).to_string(),
        )],
    )
}

fn team_req(members: &[&str], mode: &str) -> ChatRequest {
    ChatRequest {
        message: "go".into(),
        agent: members[0].into(),
        team_members: members.iter().map(|s| s.to_string()).collect(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn delegation_runs_the_callee_with_its_own_prompt_and_tools() {
    let llm = FakeLlm::start(vec![
        call("c_del", "helper", "count the files"),
        Reply::Text("HELPER-ANSWER: 42 files".into()),
        Reply::Text("The helper found 42 files.".into()),
    ])
    .await;
    let (stack, _tmp) = team_stack(llm.clone(), None).await;
    let events = stack
        .chat(team_req(&["lead", "helper"], "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    // The caller: its own prompt, teammates listed, file_manager + team tools, no shell.
    let lead = &reqs[0].body;
    assert!(
        system_of(lead).contains("LEAD-PROMPT") && system_of(lead).contains("helper"),
        "{}",
        system_of(lead)
    );
    assert!(
        !system_of(lead).contains("UI-ONLY-SUMMARY"),
        "summary must never enter a prompt"
    );
    let lt = tool_names(lead);
    assert!(
        lt.contains(&"call_agent".to_string()) && lt.contains(&"file_manager__read".to_string()),
        "{lt:?}"
    );
    assert!(!lt.contains(&"shell".to_string()), "{lt:?}");
    // The callee: its own prompt and tools, a fresh context holding only the instruction.
    let helper = &reqs[1].body;
    assert!(
        system_of(helper).contains("HELPER-PROMPT") && !system_of(helper).contains("LEAD-PROMPT")
    );
    let ht = tool_names(helper);
    assert!(
        ht.contains(&"shell".to_string()) && !ht.contains(&"file_manager__write".to_string()),
        "{ht:?}"
    );
    let msgs = helper["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "system + instruction only: {msgs:?}");
    assert_eq!(msgs[1]["content"], "count the files");
    // The caller receives the callee's answer as the tool result.
    assert!(reqs[2].body.to_string().contains("HELPER-ANSWER: 42 files"));
    let f = finished_calls(&events);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].status(), ToolStatus::Done);
    assert!(f[0].result.contains("42 files"));
    // Sub-turn events come between agent_switch events, tagged with the callee's context.
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::AgentSwitch(s)) => Some(format!(
                "switch:{}>{}:{}",
                s.from_agent, s.to_agent, s.reason
            )),
            Some(chat_event::Kind::TextDelta(_)) => {
                Some(format!("text:{}:{}", e.agent_id, e.execution_context_id))
            }
            _ => None,
        })
        .fold(Vec::new(), |mut v: Vec<String>, k| {
            if v.last() != Some(&k) {
                v.push(k);
            }
            v
        });
    assert_eq!(
        kinds,
        [
            "switch:lead>helper:delegate",
            "text:helper:root/c_del",
            "switch:helper>lead:return",
            "text:lead:root"
        ],
        "{kinds:?}"
    );
    llm.assert_invariants();
}

#[tokio::test]
async fn callee_approvals_reach_the_client_with_its_context() {
    let llm = FakeLlm::start(vec![
        call("c_del", "helper", "make a file"),
        Reply::Tools(
            String::new(),
            vec![(
                "c_sh".into(),
                "shell".into(),
                r#"{"command":"echo hi > made.txt"}"#.into(),
            )],
        ),
        Reply::Text("made it".into()),
        Reply::Text("helper made it".into()),
    ])
    .await;
    let (stack, _tmp) = team_stack(llm.clone(), None).await;
    let mut chat = stack
        .chat(team_req(&["lead", "helper"], "auto"))
        .await
        .unwrap();
    let call_id = chat.until_approval().await;
    assert_eq!(call_id, "c_sh");
    let req = chat.events.last().unwrap().clone();
    assert_eq!(req.execution_context_id, "root/c_del");
    assert_eq!(req.agent_id, "helper");
    chat.approve(&call_id, Decision::AllowOnce).await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert!(stack.workspace.join("made.txt").exists());
}

#[tokio::test]
async fn self_call_and_unknown_member_are_refused() {
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![
                (
                    "c1".into(),
                    "call_agent".into(),
                    r#"{"agent_name":"lead","instruction":"x"}"#.into(),
                ),
                (
                    "c2".into(),
                    "call_agent".into(),
                    r#"{"agent_name":"nobody","instruction":"x"}"#.into(),
                ),
                (
                    "c3".into(),
                    "call_agent".into(),
                    r#"{"agent_name":"helper"}"#.into(),
                ),
            ],
        ),
        Reply::Text("ok".into()),
    ])
    .await;
    let (stack, _tmp) = team_stack(llm.clone(), None).await;
    let events = stack
        .chat(team_req(&["lead", "helper"], "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let f = finished_calls(&events);
    assert!(
        f[0].status() == ToolStatus::Error && f[0].result.contains("itself"),
        "{:?}",
        f[0]
    );
    assert!(
        f[1].status() == ToolStatus::Error && f[1].result.contains("not in this team"),
        "{:?}",
        f[1]
    );
    assert!(
        f[2].status() == ToolStatus::Error && f[2].result.contains("instruction"),
        "{:?}",
        f[2]
    );
    assert_eq!(llm.requests().len(), 2);
    llm.assert_invariants();
}

#[tokio::test]
async fn cycles_are_refused() {
    let llm = FakeLlm::start(vec![
        call("c_a", "helper", "ask the lead"),
        call("c_b", "lead", "back to you"),
        Reply::Text("helper gives up on the cycle".into()),
        Reply::Text("lead done".into()),
    ])
    .await;
    let (stack, _tmp) = team_stack(llm.clone(), None).await;
    let events = stack
        .chat(team_req(&["lead", "helper"], "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let f = finished_calls(&events);
    let inner = f.iter().find(|c| c.call_id == "c_b").unwrap();
    assert_eq!(inner.status(), ToolStatus::Error);
    assert!(inner.result.contains("cycle"), "{}", inner.result);
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    llm.assert_invariants();
}

#[tokio::test]
async fn depth_limit_is_enforced() {
    let llm = FakeLlm::start(vec![
        call("c_1", "helper", "go deeper"),
        call("c_2", "third", "deeper still"),
        Reply::Text("helper stops".into()),
        Reply::Text("lead done".into()),
    ])
    .await;
    let tweak: omicos_e2e::stack::ConfigTweak = Box::new(|c| c.delegation.max_depth = 1);
    let (stack, _tmp) = team_stack(llm.clone(), Some(tweak)).await;
    let events = stack
        .chat(team_req(&["lead", "helper", "third"], "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let f = finished_calls(&events);
    let deep = f.iter().find(|c| c.call_id == "c_2").unwrap();
    assert!(
        deep.status() == ToolStatus::Error && deep.result.contains("depth limit (1)"),
        "{deep:?}"
    );
    let outer = f.iter().find(|c| c.call_id == "c_1").unwrap();
    assert_eq!(outer.status(), ToolStatus::Done);
    assert_eq!(outer.result, "helper stops");
}

#[tokio::test]
async fn an_overdue_delegation_returns_what_it_has() {
    let slow: String = (0..40).map(|i| format!("part{i} ")).collect();
    let llm = FakeLlm::start(vec![
        call("c_slow", "helper", "take your time"),
        Reply::Slow(slow, Duration::from_millis(100)),
        Reply::Text("lead continues".into()),
    ])
    .await;
    let tweak: omicos_e2e::stack::ConfigTweak =
        Box::new(|c| c.delegation.deadline = Duration::from_secs(1));
    let (stack, _tmp) = team_stack(llm.clone(), Some(tweak)).await;
    let events = stack
        .chat(team_req(&["lead", "helper"], "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let f = &finished_calls(&events)[0];
    assert_eq!(f.status(), ToolStatus::Error);
    assert!(f.result.contains("deadline"), "{}", f.result);
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    assert!(events_text(&events).contains("lead continues"));
}

#[tokio::test]
async fn agent_tools_in_both_formats_under_each_mode() {
    let (stack, _tmp) = team_stack(FakeLlm::start(vec![]).await, None).await;
    let mut client = stack.client().await;
    for (mode, write_visible) in [("read_only", false), ("auto", true), ("full", true)] {
        for format in ["openai", "anthropic"] {
            let r = client
                .list_agent_tools(ListAgentToolsRequest {
                    agent: "lead".into(),
                    permission_mode: mode.into(),
                    format: format.into(),
                })
                .await
                .unwrap()
                .into_inner();
            let tools: Value = serde_json::from_str(&r.llm_tools_json).unwrap();
            let names: Vec<String> = tools
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    if format == "openai" {
                        t["function"]["name"].clone()
                    } else {
                        t["name"].clone()
                    }
                })
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert!(
                names.contains(&"file_manager__read".to_string()),
                "{mode} {format}: {names:?}"
            );
            assert_eq!(
                names.contains(&"file_manager__write".to_string()),
                write_visible,
                "{mode} {format}: {names:?}"
            );
            assert!(!names.contains(&"shell".to_string()));
            if format == "anthropic" {
                assert!(tools[0]["input_schema"].is_object());
            } else {
                assert_eq!(tools[0]["type"], "function");
            }
        }
    }
}

/// The names ListAgentTools gives for `agent` under `mode`.
async fn listed_tools(
    client: &mut omicos_e2e::stack::Client,
    agent: &str,
    mode: &str,
) -> Vec<String> {
    let r = client
        .list_agent_tools(ListAgentToolsRequest {
            agent: agent.into(),
            permission_mode: mode.into(),
            format: "openai".into(),
        })
        .await
        .unwrap()
        .into_inner();
    r.tools.into_iter().map(|t| t.name).collect()
}

#[tokio::test]
async fn agent_tools_leave_out_what_the_agents_frontmatter_denies_as_its_turn_does() {
    // `file_manager__write` is denied outright; `file_manager__read` only
    // under secret/ (a rule with a specifier hides nothing: other paths run).
    let guarded = "---\nid: guarded\nname: guarded agent\ndescription: reads only\n\
        toolsets: [file_manager]\npermissions:\n  deny: [file_manager__write, \"file_manager__read(secret/**)\"]\n\
        ---\nYou are GUARDED.\n";
    let llm = FakeLlm::start(vec![Reply::Text("done".into())]).await;
    let files = [
        ("guarded".to_string(), guarded.to_string()),
        ("lead".to_string(), agent("lead", &["file_manager"], "LEAD")),
    ];
    let (stack, _tmp) = agent_files_stack(llm.clone(), &files, vec![], None).await;
    let mut client = stack.client().await;
    let names = listed_tools(&mut client, "guarded", "full").await;
    assert!(
        names.contains(&"file_manager__read".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"file_manager__write".to_string()),
        "denied by the frontmatter: {names:?}"
    );
    // Another agent with the same toolsets still has it: the rules are the agent's.
    let lead = listed_tools(&mut client, "lead", "full").await;
    assert!(
        lead.contains(&"file_manager__write".to_string()),
        "{lead:?}"
    );
    // The agent's turn offers the model exactly what ListAgentTools listed.
    let events = stack
        .chat(ChatRequest {
            message: "go".into(),
            agent: "guarded".into(),
            permission_mode: "full".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let reqs = llm.requests();
    assert_eq!(tool_names(&reqs[0].body), names);
}

#[tokio::test]
async fn refresh_catalog_and_list_agents() {
    let (stack, tmp) = team_stack(FakeLlm::start(vec![]).await, None).await;
    let mut client = stack.client().await;
    let before = client
        .list_agents(omicos_proto::ListAgentsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.agents.len(), 3);
    let lead = before.agents.iter().find(|a| a.id == "lead").unwrap();
    assert_eq!(lead.summary, "UI-ONLY-SUMMARY-lead", "UIs get the summary");
    std::fs::write(
        tmp.path().join(".omicos/agents/fourth.md"),
        agent("fourth", &["think"], "You are FOURTH."),
    )
    .unwrap();
    let r = client
        .refresh_catalog(omicos_proto::RefreshCatalogRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.agents, 4);
    let after = client
        .list_agents(omicos_proto::ListAgentsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(after.agents.iter().any(|a| a.id == "fourth"));
}

#[tokio::test]
async fn plan_asks_the_client_through_the_approval_path() {
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c_plan".into(),
                "plan".into(),
                r#"{"plan":"1. look\n2. act"}"#.into(),
            )],
        ),
        Reply::Text("plan approved".into()),
    ])
    .await;
    let planner: [(&str, &[&str], &str); 1] = [("planner", &["plan"], "You plan.")];
    let (stack, tmp) = agents_stack(
        llm,
        &planner,
        vec![Arc::new(omicos_catalog::PlanProvider)],
        None,
    )
    .await;
    // Even in full mode, a plan is put to the client.
    let mut chat = stack.chat(team_req(&["planner"], "full")).await.unwrap();
    let call = chat.until_approval().await;
    assert_eq!(call, "c_plan");
    chat.approve(&call, Decision::AllowOnce).await;
    let events = chat.until_done().await;
    assert_eq!(
        finished_calls(&events)[0].status(),
        ToolStatus::Done,
        "{events:#?}"
    );
    let session = events[0].session_id.clone();
    let plan = std::fs::read_to_string(
        tmp.path()
            .join(".omicos/plans")
            .join(format!("{session}.md")),
    )
    .unwrap();
    assert!(plan.contains("1. look"), "{plan}");
}

#[tokio::test]
async fn without_a_catalog_the_single_agent_reports_the_configured_tier() {
    let llm = FakeLlm::start(vec![Reply::Text("hello".into())]).await;
    let tweak: omicos_e2e::stack::ConfigTweak = Box::new(|c| c.tier = "pro_cloud".into());
    let stack = Stack::start(
        llm,
        StackOptions {
            tweak: Some(tweak),
            ..Default::default()
        },
    )
    .await;
    let mut client = stack.client().await;
    let listed = client
        .list_agents(omicos_proto::ListAgentsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.deployment_tier, "pro_cloud");
    let ids: Vec<&str> = listed.agents.iter().map(|a| a.id.as_str()).collect();
    // The agent listed is the one a turn really runs as.
    let events = stack
        .chat(ChatRequest {
            message: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .until_done()
        .await;
    let Some(chat_event::Kind::TurnStarted(t)) = &events[0].kind else {
        panic!("{events:#?}");
    };
    assert_eq!(ids, [t.agent.as_str()]);
    let r = client
        .refresh_catalog(omicos_proto::RefreshCatalogRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.agents as usize, listed.agents.len());
}
