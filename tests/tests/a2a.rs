//! omicos as an A2A agent, with the official Python SDK (a2a-sdk, pinned in
//! requirements.txt) as the client (tests/a2a/client.py): the card, a
//! blocking send, a stream with its status updates and final artifact, a
//! task read back, a running task cancelled, another principal refused on
//! the first one's context and tasks, and the 0.3 binding through the SDK's
//! compatibility transport. Malformed JSON-RPC gets the spec's error codes,
//! and a request without a credential gets 401.

use omicos_e2e::stack::api_key;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const ALICE: &str = "a2a-alice-token";
const BOB: &str = "a2a-bob-token";

/// The model answers by what it was asked (the last user message contains
/// the key), not by the order requests arrive: a task cancelled before its
/// turn reached the model leaves no scripted reply behind for the next one.
fn by_question(answers: Vec<(&'static str, Reply)>) -> impl Fn(&Value) -> Reply + Send + Sync {
    move |body: &Value| {
        let asked = omicos_e2e::fake_llm::user_messages(body)
            .pop()
            .unwrap_or_default();
        answers
            .iter()
            .find(|(key, _)| asked.contains(key))
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| Reply::Text(format!("UNEXPECTED QUESTION: {asked}")))
    }
}

/// The users' questions whose turns reached the model.
fn questions(stack: &Stack) -> Vec<String> {
    stack
        .llm
        .requests()
        .iter()
        .filter_map(|r| omicos_e2e::fake_llm::user_messages(&r.body).pop())
        .collect()
}

/// A stack whose model answers by the question ([`by_question`]).
async fn stack_by_question(answers: Vec<(&'static str, Reply)>) -> Stack {
    stack_with(
        FakeLlm::start(vec![])
            .await
            .with_responder(by_question(answers)),
    )
    .await
}

/// A stack whose model answers `replies` in order.
async fn stack(replies: Vec<Reply>) -> Stack {
    stack_with(FakeLlm::start(replies).await).await
}

async fn stack_with(llm: FakeLlm) -> Stack {
    Stack::start(
        llm,
        StackOptions {
            tweak: Some(Box::new(|c| {
                // A `Slow` reply waits for a cancel from the Python client,
                // which can take seconds on a loaded machine: the stack's
                // 5 s idle timeout would take it for a broken stream and
                // retry it with the next scripted reply (another test's).
                c.llm.idle_timeout = Duration::from_secs(60);
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_sends_streams_gets_and_cancels() {
    let stack = stack_by_question(vec![
        ("first question", Reply::Text("ANSWER-ONE".into())),
        ("second question", Reply::Text("ANSWER-TWO".into())),
        // Cancelled long before its three pieces are sent.
        (
            "a long one",
            Reply::Slow("never finished".into(), Duration::from_secs(20)),
        ),
        ("third question", Reply::Text("ANSWER-THREE".into())),
        ("fourth question", Reply::Text("ANSWER-FOUR".into())),
    ])
    .await;
    let r = run_sdk("a2a/client.py", &stack).await;

    // The card: streaming, the catalog's agent as a skill, the API key scheme,
    // JSON-RPC 1.0 and 0.3 at /a2a.
    let card = &r["card"];
    assert_eq!(card["name"], "omicos", "{card}");
    assert_eq!(card["streaming"], true, "{card}");
    assert!(!card["skills"].as_array().unwrap().is_empty(), "{card}");
    assert_eq!(card["schemes"], json!(["apiKey"]), "{card}");
    let rpc = format!("{}/a2a", stack.orchestrator);
    let grpc = stack.orchestrator.trim_start_matches("http://");
    assert_eq!(
        card["interfaces"],
        json!([
            ["JSONRPC", "1.0", rpc],
            ["JSONRPC", "0.3", rpc],
            ["GRPC", "1.0", grpc]
        ]),
        "{card}"
    );

    // A blocking send: one completed task, the answer as its artifact.
    let send = r["send"].as_array().unwrap();
    assert_eq!(send.len(), 1, "{send:?}");
    let first = &send[0]["task"];
    assert_eq!(first["state"], "TASK_STATE_COMPLETED", "{first}");
    assert_eq!(first["artifacts"], json!(["ANSWER-ONE"]), "{first}");
    assert_eq!(
        first["history_roles"],
        json!(["ROLE_USER", "ROLE_AGENT"]),
        "{first}"
    );
    let context = first["context_id"].as_str().unwrap();
    let (session, _) = context.split_once(':').map_or((context, ""), |p| p);
    assert_eq!(session, context, "a context is a session id");
    assert!(
        first["id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{context}:"))
    );

    // A stream in the same context: the task, working, the artifact, completed.
    let stream = r["stream"].as_array().unwrap();
    let kinds: Vec<String> = stream
        .iter()
        .map(|e| {
            e.as_object()
                .unwrap()
                .keys()
                .find(|k| ["task", "status", "artifact", "message"].contains(&k.as_str()))
                .unwrap()
                .clone()
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task"),
        "{stream:?}"
    );
    assert_eq!(stream[0]["task"]["context_id"], context, "{stream:?}");
    let states: Vec<&str> = stream.iter().filter_map(|e| e["status"].as_str()).collect();
    assert!(states.contains(&"TASK_STATE_WORKING"), "{stream:?}");
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{stream:?}");
    let art = stream
        .iter()
        .position(|e| e["artifact"].is_string())
        .unwrap_or_else(|| panic!("no artifact: {stream:?}"));
    assert_eq!(stream[art]["artifact"], "ANSWER-TWO");
    assert_eq!(stream[art]["last_chunk"], true);
    assert_eq!(
        art,
        stream.len() - 2,
        "the artifact comes before the last status"
    );

    // The first task read back.
    assert_eq!(r["get"]["id"], first["id"]);
    assert_eq!(r["get"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(r["get"]["artifacts"], json!(["ANSWER-ONE"]));

    // A task sent without waiting is running; cancelled, it is canceled, and
    // a second cancel is refused as not cancelable.
    assert_eq!(
        r["running"]["state"], "TASK_STATE_WORKING",
        "{}",
        r["running"]
    );
    assert_eq!(
        r["cancel"]["state"], "TASK_STATE_CANCELED",
        "{}",
        r["cancel"]
    );
    assert_eq!(
        r["cancel_again"]["error"], "TaskNotCancelableError",
        "{}",
        r["cancel_again"]
    );

    // Bob: Alice's context and tasks do not exist for him.
    for k in ["bob_send", "bob_get", "bob_cancel"] {
        assert_eq!(r[k]["error"], "TaskNotFoundError", "{k}: {}", r[k]);
    }

    // The 0.3 binding, through the SDK's compatibility transport.
    assert_eq!(r["legacy_transport"], "CompatJsonRpcTransport");
    let legacy = &r["legacy_send"][0]["task"];
    assert_eq!(
        legacy["state"], "TASK_STATE_COMPLETED",
        "{}",
        r["legacy_send"]
    );
    assert_eq!(legacy["artifacts"], json!(["ANSWER-THREE"]), "{legacy}");
    let ls = r["legacy_stream"].as_array().unwrap();
    assert!(ls.iter().any(|e| e["artifact"] == "ANSWER-FOUR"), "{ls:?}");
    assert_eq!(
        ls.iter().filter_map(|e| e["status"].as_str()).next_back(),
        Some("TASK_STATE_COMPLETED"),
        "{ls:?}"
    );
    // Bob's attempts never reached the model: only Alice's questions did
    // (the cancelled one may have been cancelled before its turn asked).
    let asked = questions(&stack);
    assert!(asked.iter().all(|q| !q.contains("let me in")), "{asked:?}");
    for q in [
        "first question",
        "second question",
        "third question",
        "fourth question",
    ] {
        assert_eq!(
            asked.iter().filter(|a| a.contains(q)).count(),
            1,
            "{q}: {asked:?}"
        );
    }
}

/// The SDK as a gRPC client (tests/a2a/grpc_client.py), from the card's
/// GRPC interface: send, stream, get, subscribe from a second client to a
/// running task's end, cancel, list (own tasks only, paged), another
/// principal refused as TaskNotFound, and UNAUTHENTICATED without a valid
/// credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_over_grpc_sends_streams_subscribes_lists_and_cancels() {
    let stack = stack_by_question(vec![
        ("first question", Reply::Text("ANSWER-G1".into())),
        ("second question", Reply::Text("ANSWER-G2".into())),
        // Followed by a second client: long enough to subscribe while it runs.
        (
            "a slow one",
            Reply::Slow("SLOW-ANSWER".into(), Duration::from_secs(1)),
        ),
        // Cancelled long before its pieces are sent.
        (
            "a long one",
            Reply::Slow("never finished".into(), Duration::from_secs(20)),
        ),
        ("bob's question", Reply::Text("BOB-ANSWER".into())),
    ])
    .await;
    let r = run_sdk("a2a/grpc_client.py", &stack).await;
    let host = stack.orchestrator.trim_start_matches("http://");

    // The card names the gRPC binding at the port's host:port; the SDK's
    // factory picked its gRPC transport from it.
    assert!(
        r["interfaces"]
            .as_array()
            .unwrap()
            .contains(&json!(["GRPC", "1.0", host])),
        "{}",
        r["interfaces"]
    );
    assert_eq!(r["transport"], "GrpcTransport");

    let first = &r["send"][0]["task"];
    assert_eq!(first["state"], "TASK_STATE_COMPLETED", "{}", r["send"]);
    assert_eq!(first["artifacts"], json!(["ANSWER-G1"]), "{first}");
    assert_eq!(first["history_roles"], json!(["ROLE_USER", "ROLE_AGENT"]));
    let context = first["context_id"].as_str().unwrap();

    let stream = r["stream"].as_array().unwrap();
    assert!(stream[0]["task"].is_object(), "{stream:?}");
    assert_eq!(stream[0]["task"]["context_id"], context);
    let states: Vec<&str> = stream.iter().filter_map(|e| e["status"].as_str()).collect();
    assert!(states.contains(&"TASK_STATE_WORKING"), "{stream:?}");
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{stream:?}");
    assert_eq!(
        stream[stream.len() - 2]["artifact"],
        "ANSWER-G2",
        "{stream:?}"
    );

    assert_eq!(r["get"]["id"], first["id"]);
    assert_eq!(r["get"]["artifacts"], json!(["ANSWER-G1"]));

    // The subscriber sees the running task, then its end, with the answer.
    let slow = &r["slow_sent"];
    assert_eq!(slow["state"], "TASK_STATE_WORKING", "{slow}");
    let sub = r["subscribe"].as_array().unwrap();
    assert_eq!(sub[0]["task"]["id"], slow["id"], "{sub:?}");
    assert_eq!(sub[0]["task"]["state"], "TASK_STATE_WORKING", "{sub:?}");
    assert_eq!(sub[sub.len() - 2]["artifact"], "SLOW-ANSWER", "{sub:?}");
    assert_eq!(
        sub[sub.len() - 1]["status"],
        "TASK_STATE_COMPLETED",
        "{sub:?}"
    );
    assert_eq!(
        r["subscribe_ended"]["error"], "UnsupportedOperationError",
        "{}",
        r["subscribe_ended"]
    );

    assert_eq!(r["running"]["state"], "TASK_STATE_WORKING");
    assert_eq!(
        r["cancel"]["state"], "TASK_STATE_CANCELED",
        "{}",
        r["cancel"]
    );
    assert_eq!(r["cancel_again"]["error"], "TaskNotCancelableError");

    // Alice's four tasks, newest first, in pages of two.
    let ids: Vec<&str> = r["list"]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4, "{}", r["list"]);
    assert_eq!(r["list"]["total_size"], 4);
    assert_eq!(r["list"]["pages"].as_array().unwrap().len(), 2);
    assert_eq!(ids[0], r["running"]["id"], "the newest first: {ids:?}");
    for t in [&first["id"], &stream[0]["task"]["id"], &slow["id"]] {
        assert!(ids.contains(&t.as_str().unwrap()), "{t} not in {ids:?}");
    }
    let done = r["list_completed_in_first_context"].as_array().unwrap();
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(
        done.iter()
            .all(|t| t["context_id"] == context && t["state"] == "TASK_STATE_COMPLETED")
    );

    // Bob lists his own task only, and reaches none of Alice's.
    assert_eq!(r["bob_own"]["artifacts"], json!(["BOB-ANSWER"]));
    assert_eq!(r["bob_list"], json!([r["bob_own"]["id"]]));
    assert_eq!(r["bob_list_alices_context"], json!([]));
    for k in [
        "bob_send",
        "bob_send_task",
        "bob_get",
        "bob_cancel",
        "bob_subscribe",
    ] {
        assert_eq!(r[k]["error"], "TaskNotFoundError", "{k}: {}", r[k]);
    }
    for k in ["wrong_token", "no_token"] {
        assert!(
            r[k]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("UNAUTHENTICATED"),
            "{k}: {}",
            r[k]
        );
    }
    assert_eq!(
        r["push"]["error"], "PushNotificationNotSupportedError",
        "{}",
        r["push"]
    );
    // The model was asked Alice's questions and Bob's own, once each, and
    // none of Bob's attempts on Alice's tasks (the cancelled one may have
    // been cancelled before its turn asked).
    let asked = questions(&stack);
    for q in [
        "first question",
        "second question",
        "a slow one",
        "bob's question",
    ] {
        assert_eq!(
            asked.iter().filter(|a| a.contains(q)).count(),
            1,
            "{q}: {asked:?}"
        );
    }
    assert!(asked.len() <= 5, "{asked:?}");
    assert!(asked.iter().all(|q| !q.contains("let me in")), "{asked:?}");
}

/// Runs a Python SDK script against `stack` and returns its JSON report.
async fn run_sdk(script: &str, stack: &Stack) -> Value {
    let plan = json!({"url": stack.orchestrator, "alice": ALICE, "bob": BOB});
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let py = omicos_e2e::python_importing("a2a.client");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(script)
            .arg(plan.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the a2a-sdk client failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test]
async fn malformed_json_rpc_gets_the_specs_error_codes() {
    let stack = stack(vec![]).await;
    let url = format!("{}/a2a", stack.orchestrator);
    let http = reqwest::Client::new();
    let post = |body: String, token: Option<&'static str>| {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    // No credential, a wrong one: 401, as the port's other routes.
    let r = post("{}".into(), None).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = post("{}".into(), Some("wrong")).await.unwrap();
    assert_eq!(r.status(), 401);
    for (body, code) in [
        ("{not json".to_owned(), -32700),
        ("[]".to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":"#.to_owned(), -32700),
        (r#"{"jsonrpc":"1.0","id":1,"method":"GetTask","params":{"id":"x"}}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":1}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"GetTask"}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tasks/explode"}"#.to_owned(), -32601),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":[1]}"#.to_owned(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#.to_owned(), -32602),
        (
            json!({"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"file","file":{"uri":"file:///etc/passwd"}}]}}}).to_string(),
            -32005,
        ),
        (r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}}"#.to_owned(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"no-such-task"}}"#.to_owned(), -32001),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"s:t"}}"#.to_owned(), -32001),
        (r#"{"jsonrpc":"2.0","id":1,"method":"CancelTask","params":{"id":"s:t"}}"#.to_owned(), -32001),
        (r#"{"jsonrpc":"2.0","id":1,"method":"CreateTaskPushNotificationConfig","params":{}}"#.to_owned(), -32003),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id":"s:t"}}"#.to_owned(), -32001),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{}}"#.to_owned(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageToken":"x"}}"#.to_owned(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"status":"DONE"}}"#.to_owned(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"GetExtendedAgentCard"}"#.to_owned(), -32007),
        (
            json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","contextId":"no-such-session","parts":[{"text":"hi"}]}}}).to_string(),
            -32001,
        ),
    ] {
        let r = post(body.clone(), Some(ALICE)).await.unwrap();
        assert_eq!(r.status(), 200, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0", "{body}: {v}");
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v.get("result").is_none(), "{v}");
    }
    // The card is open, and names the JSON-RPC endpoint.
    let card: Value = http
        .get(format!(
            "{}/.well-known/agent-card.json",
            stack.orchestrator
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["capabilities"]["streaming"], true, "{card}");
    assert_eq!(card["supportedInterfaces"][0]["url"], url, "{card}");
    // Nothing reached the model.
    assert!(stack.llm.requests().is_empty());
}

/// JSON-RPC's SubscribeToTask (SSE) follows a running task from a second
/// connection to its end; 0.3's tasks/resubscribe answers in 0.3's shapes;
/// ListTasks lists the caller's tasks only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_rpc_subscribes_and_lists() {
    use futures::StreamExt as _;
    let stack = stack(vec![
        Reply::Slow("SLOW-JSON".into(), Duration::from_millis(700)),
        Reply::Text("BOB-JSON".into()),
    ])
    .await;
    let url = format!("{}/a2a", stack.orchestrator);
    let http = reqwest::Client::new();
    let call = |token: &'static str, body: Value| {
        let req = http.post(&url).bearer_auth(token).json(&body);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let sent = call(
        ALICE,
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "slow"}]},
        "configuration": {"returnImmediately": true}}}),
    )
    .await;
    let task = sent["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{sent}");
    let id = task["id"].as_str().unwrap().to_owned();
    // Subscribed while it runs: every SSE event is a JSON-RPC response.
    let res = http
        .post(&url)
        .bearer_auth(ALICE)
        .json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": id}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = String::new();
    let mut chunks = res.bytes_stream();
    while let Some(c) = tokio::time::timeout(Duration::from_secs(30), chunks.next())
        .await
        .expect("the subscription ends with the task")
    {
        body.push_str(&String::from_utf8_lossy(&c.unwrap()));
    }
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect();
    assert!(events.iter().all(|e| e["id"] == 2), "{events:?}");
    assert_eq!(events[0]["result"]["task"]["id"], id.as_str(), "{events:?}");
    let n = events.len();
    assert_eq!(
        events[n - 2]["result"]["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "SLOW-JSON",
        "{events:?}"
    );
    assert_eq!(
        events[n - 1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    // Ended: 0.3's resubscribe has nothing to follow (-32004).
    let r = call(
        ALICE,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/resubscribe", "params": {"id": id}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32004, "{r}");

    // Bob's one task; each lists only their own.
    call(
        BOB,
        json!({"jsonrpc": "2.0", "id": 4, "method": "SendMessage", "params": {
        "message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "bob"}]}}}),
    )
    .await;
    let list = |token: &'static str| {
        call(
            token,
            json!({"jsonrpc": "2.0", "id": 5, "method": "ListTasks", "params": {}}),
        )
    };
    let alice = list(ALICE).await;
    let tasks = alice["result"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{alice}");
    assert_eq!(tasks[0]["id"], id.as_str());
    assert_eq!(tasks[0]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(alice["result"]["totalSize"], 1);
    let bob = list(BOB).await;
    let tasks = bob["result"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{bob}");
    assert_ne!(tasks[0]["id"], id.as_str());
    // Bob cannot follow Alice's task.
    let r = call(
        BOB,
        json!({"jsonrpc": "2.0", "id": 6, "method": "SubscribeToTask", "params": {"id": id}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32001, "{r}");
}

/// A tool call waiting for an approval makes the task input-required (a
/// blocking SendMessage returns there); approved through the gRPC API, the
/// same task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_is_input_required() {
    let stack = stack(vec![
        Reply::Tools(
            String::new(),
            vec![(
                "c_w".into(),
                "file_manager__write".into(),
                r#"{"path":"a.txt","content":"A"}"#.into(),
            )],
        ),
        Reply::Text("written".into()),
    ])
    .await;
    let url = format!("{}/a2a", stack.orchestrator);
    let http = reqwest::Client::new();
    let call = |body: Value| {
        let req = http.post(&url).bearer_auth(ALICE).json(&body);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let r = call(
        json!({"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {
        "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "write a.txt"}]},
        "metadata": {"permissionMode": "auto"}}}),
    )
    .await;
    let task = &r["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{r}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(why.contains("c_w"), "{why}");
    let (id, session) = (
        task["id"].as_str().unwrap().to_owned(),
        task["contextId"].as_str().unwrap().to_owned(),
    );
    let get = json!({"jsonrpc": "2.0", "id": "2", "method": "GetTask", "params": {"id": id}});
    assert_eq!(
        call(get.clone()).await["result"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    omicos_e2e::client_with(&stack.orchestrator, ALICE)
        .await
        .approve_tool(omicos_proto::ApproveToolRequest {
            session_id: session,
            call_id: "c_w".into(),
            decision: omicos_proto::Decision::AllowOnce as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    // The turn goes on after the approval; wait for its end (bounded, not timed).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let t = call(get.clone()).await;
        if t["result"]["status"]["state"] != "TASK_STATE_INPUT_REQUIRED"
            && t["result"]["status"]["state"] != "TASK_STATE_WORKING"
        {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "still running: {t}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        done["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );
    assert_eq!(
        done["result"]["artifacts"][0]["parts"][0]["text"], "written",
        "{done}"
    );
}
