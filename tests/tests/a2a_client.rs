//! omicos as an A2A client: `call_agent` naming a remote A2A agent (the
//! runner's `a2a_agents`) goes through the runner's pipeline to a real
//! agent built on the official Python SDK (tests/a2a/server.py, a2a-sdk
//! pinned in requirements.txt, served by uvicorn), and to a second omicos
//! stack's A2A endpoint. The remote's record file says what it really got.

use omicos_e2e::stack::{api_key, done_reason, finished_calls};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_orchestrator::agents::CatalogAgents;
use omicos_proto::{ChatRequest, Decision, ToolStatus};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "remote-a2a-token";

/// The SDK's agent on a loopback port; killed on drop.
struct Remote {
    url: String,
    record: PathBuf,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Remote {
    async fn start() -> Remote {
        Self::start_speaking("1.0").await
    }

    /// The SDK server as an agent of A2A `protocol` ("1.0", or "0.3": a 0.3
    /// card and the SDK's 0.3 compatibility on its JSON-RPC endpoint).
    async fn start_speaking(protocol: &str) -> Remote {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("a2a/server.py");
        let mut child =
            std::process::Command::new(omicos_e2e::python_importing("a2a.server, uvicorn"))
                .arg(script)
                .arg(port.to_string())
                .arg(&record)
                .arg(TOKEN)
                .env("A2A_TEST_PROTOCOL", protocol)
                .spawn()
                .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let card = format!("{base}/.well-known/agent-card.json");
        for _ in 0..200 {
            if reqwest::get(&card)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Remote {
                    url: format!("{base}/a2a"),
                    record,
                    child,
                    _dir: dir,
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the a2a-sdk server did not come up at {base}");
    }

    /// `key` of each `event` record the remote wrote, in order.
    fn recorded(&self, event: &str, key: &str) -> Vec<String> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == event)
            .map(|e| e[key].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The JSON-RPC methods the remote was sent, in order.
    fn methods(&self) -> Vec<String> {
        self.recorded("rpc", "method")
    }

    /// The texts the remote executor received.
    fn received(&self) -> Vec<String> {
        self.recorded("message", "text")
    }
}

/// A stack whose team is `lead` and `helper` (both with `team`), with the
/// runner's `a2a_agents` as given.
async fn stack(replies: Vec<Reply>, a2a_agents: Value) -> (Stack, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".omicos/agents");
    std::fs::create_dir_all(&dir).unwrap();
    for id in ["lead", "helper"] {
        std::fs::write(
            dir.join(format!("{id}.md")),
            format!("---\nid: {id}\nname: {id}\ndescription: the {id}\ntoolsets: [team]\n---\nYou are {id}.\n"),
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
        FakeLlm::start(replies).await,
        StackOptions {
            agents: Some(Arc::new(CatalogAgents::from_catalog(catalog))),
            workspace: Some(tmp.path().to_path_buf()),
            runner_overrides: json!({ "a2a_agents": a2a_agents }),
            ..Default::default()
        },
    )
    .await;
    (stack, tmp)
}

fn reverser(url: &str) -> Value {
    json!({"reverser": {"url": url, "auth": {"headers": {"Authorization": format!("Bearer {TOKEN}")}},
                        "max_answer_bytes": 20000}})
}

fn req(mode: &str) -> ChatRequest {
    ChatRequest {
        message: "go".into(),
        agent: "lead".into(),
        team_members: vec!["lead".into(), "helper".into()],
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn call(id: &str, agent: &str, instruction: &str) -> Reply {
    Reply::Tools(
        String::new(),
        vec![(
            id.into(),
            "call_agent".into(),
            json!({"agent_name": agent, "instruction": instruction}).to_string(),
        )],
    )
}

/// The tool results the model read in its last request, by call id.
fn results_seen(llm: &FakeLlm) -> std::collections::BTreeMap<String, String> {
    let reqs = llm.requests();
    let last = &reqs.last().expect("a model request").body;
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_agent_reaches_a_remote_sdk_agent_and_reads_its_answer() {
    let remote = Remote::start().await;
    let (stack, _tmp) = stack(
        vec![
            Reply::Tools(
                String::new(),
                vec![("l1".into(), "list_agents".into(), "{}".into())],
            ),
            call("c1", "reverser", "hello omicos"),
            call("c2", "reverser", "fail: the disk is full"),
            call("c3", "nobody", "anything"),
            call("c4", "reverser", "huge: 300000"),
            Reply::Text("all done".into()),
        ],
        reverser(&remote.url),
    )
    .await;
    let mut chat = stack.chat(req("full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    stack.llm.assert_invariants();

    // The remote got exactly the messages of the calls that named it.
    assert_eq!(
        remote.received(),
        ["hello omicos", "fail: the disk is full", "huge: 300000"]
    );
    // A 1.0 card: 1.0 methods only.
    let methods = remote.methods();
    assert!(
        methods.contains(&"SendMessage".to_owned()) && methods.iter().all(|m| !m.contains('/')),
        "{methods:?}"
    );
    let seen = results_seen(&stack.llm);
    // list_agents: the team, and the remote with its card's skill.
    let envelope: Value = serde_json::from_str(&seen["l1"]).unwrap();
    let listed: Value = serde_json::from_str(envelope["result"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", seen["l1"]));
    let remote_entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "reverser")
        .unwrap_or_else(|| panic!("no remote in {listed}"));
    assert_eq!(remote_entry["remote"], true);
    let about = remote_entry["description"].as_str().unwrap();
    assert!(about.contains("Reverses what it is told"), "{about}");
    assert!(about.contains("Reverse text"), "{about}");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["id"] == "helper")
    );

    // The answer the model reads.
    assert!(
        seen["c1"].contains("remote says: socimo olleh"),
        "{}",
        seen["c1"]
    );
    assert!(seen["c1"].contains("\"done\""), "{}", seen["c1"]);
    // A failed task: an error with the remote's reason; the turn went on.
    assert!(seen["c2"].contains("\"error\""), "{}", seen["c2"]);
    assert!(seen["c2"].contains("the disk is full"), "{}", seen["c2"]);
    assert!(seen["c2"].contains("failed"), "{}", seen["c2"]);
    // An unknown name: the unknown agent's error, naming the remote too.
    assert!(
        seen["c3"].contains("agent `nobody` is not in this team"),
        "{}",
        seen["c3"]
    );
    assert!(seen["c3"].contains("reverser"), "{}", seen["c3"]);
    // A 300 000-byte answer: cut at max_answer_bytes, then the runner's
    // shaping (spool and preview) bounds what the model reads.
    let huge = &seen["c4"];
    assert!(
        huge.len() < 25_000,
        "{} bytes reached the model",
        huge.len()
    );
    assert!(huge.contains("abcdefghij"), "{}", &huge[..200]);
    let finished = finished_calls(&events);
    let c4 = finished.iter().find(|f| f.call_id == "c4").unwrap();
    assert_eq!(c4.status, ToolStatus::Done as i32);
    let spooled =
        std::fs::read_to_string(stack.workspace.join(&c4.spool_path)).unwrap_or_else(|e| {
            panic!(
                "the whole (cut) answer is spooled: {e}: {:?}",
                c4.spool_path
            )
        });
    assert!(spooled.contains("more bytes of the remote agent's answer left out"));
    assert!(spooled.len() < 21_000, "{}", spooled.len());
}

/// An agent whose card says A2A 0.3 is spoken to in 0.3 (`message/send`,
/// `tasks/get`, `kind`-tagged answers), here the official SDK's 0.3
/// compatibility: the answer and a failed task read as with a 1.0 agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_agent_speaks_0_3_to_an_agent_whose_card_says_0_3() {
    let remote = Remote::start_speaking("0.3").await;
    let (stack, _tmp) = stack(
        vec![
            call("c1", "reverser", "hello old friend"),
            call("c2", "reverser", "fail: too old"),
            Reply::Text("all done".into()),
        ],
        reverser(&remote.url),
    )
    .await;
    let mut chat = stack.chat(req("full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    assert_eq!(remote.received(), ["hello old friend", "fail: too old"]);
    let methods = remote.methods();
    assert!(
        !methods.is_empty() && methods.iter().all(|m| m.contains('/')),
        "only 0.3 methods (message/send, tasks/get, …) reach a 0.3 agent: {methods:?}"
    );
    assert_eq!(methods[0], "message/send", "{methods:?}");
    let seen = results_seen(&stack.llm);
    assert!(
        seen["c1"].contains("remote says: dneirf dlo olleh"),
        "{}",
        seen["c1"]
    );
    assert!(seen["c1"].contains("\"done\""), "{}", seen["c1"]);
    assert!(seen["c2"].contains("\"error\""), "{}", seen["c2"]);
    assert!(seen["c2"].contains("too old"), "{}", seen["c2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_call_is_gated_and_a_remote_that_is_down_is_a_tool_error() {
    let remote = Remote::start().await;
    // A port nothing listens on.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut agents = reverser(&remote.url);
    agents["gone"] = json!({"url": format!("http://127.0.0.1:{down}/a2a"), "description": "a remote that is down"});
    let (stack, _tmp) = stack(
        vec![
            // read_only: refused by the gate.
            call("r1", "reverser", "read only"),
            Reply::Text("refused".into()),
            // auto: asked; denied.
            call("a1", "reverser", "denied one"),
            Reply::Text("denied".into()),
            // auto: asked; allowed.
            call("a2", "reverser", "allowed one"),
            Reply::Text("allowed".into()),
            // full: a remote that is down.
            call("d1", "gone", "are you there"),
            Reply::Text("went on".into()),
        ],
        agents,
    )
    .await;

    let mut chat = stack.chat(req("read_only")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let r1 = &results_seen(&stack.llm)["r1"];
    assert!(r1.contains("\"error\"") && r1.contains("read_only"), "{r1}");
    assert!(remote.received().is_empty(), "{:?}", remote.received());

    let mut chat = stack.chat(req("auto")).await.unwrap();
    let asked = chat.until_approval().await;
    assert_eq!(asked, "a1");
    // Nothing left before the user answered.
    assert!(remote.received().is_empty(), "{:?}", remote.received());
    chat.approve(&asked, Decision::Deny).await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let a1 = &results_seen(&stack.llm)["a1"];
    assert!(a1.contains("\"error\"") && a1.contains("denied"), "{a1}");
    assert!(remote.received().is_empty(), "{:?}", remote.received());

    let mut chat = stack.chat(req("auto")).await.unwrap();
    let asked = chat.until_approval().await;
    chat.approve(&asked, Decision::AllowOnce).await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let a2 = &results_seen(&stack.llm)["a2"];
    assert!(a2.contains("remote says: eno dewolla"), "{a2}");
    assert_eq!(remote.received(), ["allowed one"]);

    let mut chat = stack.chat(req("full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let d1 = &results_seen(&stack.llm)["d1"];
    assert!(d1.contains("\"error\""), "{d1}");
    assert!(
        d1.contains("remote agent `gone`") && d1.contains("cannot connect"),
        "{d1}"
    );
    stack.llm.assert_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omicos_calls_another_omicos_over_a2a_with_its_credential() {
    const PEER: &str = "peer-omicos-token";
    let peer = Stack::start(
        FakeLlm::start(vec![Reply::Text(
            "PEER-ANSWER from the other omicos".into(),
        )])
        .await,
        StackOptions {
            tweak: Some(Box::new(|c| {
                c.auth.api_keys = vec![api_key(PEER, "caller", "acme", "full")];
            })),
            ..Default::default()
        },
    )
    .await;
    let (stack, _tmp) = stack(
        vec![
            call("p1", "peer", "what do you say?"),
            Reply::Text("thanks".into()),
        ],
        json!({"peer": {"url": format!("{}/a2a", peer.orchestrator),
                        "auth": {"headers": {"Authorization": format!("Bearer {PEER}")}}}}),
    )
    .await;
    let mut chat = stack.chat(req("full")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let p1 = &results_seen(&stack.llm)["p1"];
    assert!(p1.contains("PEER-ANSWER from the other omicos"), "{p1}");
    // The peer's model got the message as its user prompt.
    let asked = peer.llm.requests();
    assert!(
        asked[0].body.to_string().contains("what do you say?"),
        "{}",
        asked[0].body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_cancels_the_remote_task() {
    let remote = Remote::start().await;
    let (stack, _tmp) = stack(
        vec![
            call("s1", "reverser", "slow: take your time"),
            Reply::Text("never read".into()),
        ],
        reverser(&remote.url),
    )
    .await;
    let mut chat = stack.chat(req("full")).await.unwrap();
    // Wait until the remote works on it.
    for _ in 0..100 {
        if !remote.received().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(remote.received(), ["slow: take your time"]);
    chat.cancel().await;
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("cancelled"),
        "{events:#?}"
    );
    // The runner sent CancelTask: the SDK called the executor's cancel.
    let cancelled = || {
        std::fs::read_to_string(&remote.record)
            .unwrap_or_default()
            .contains("\"cancel\"")
    };
    for _ in 0..100 {
        if cancelled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cancelled(),
        "{}",
        std::fs::read_to_string(&remote.record).unwrap()
    );
}
