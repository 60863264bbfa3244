//! A2A from the network as another principal (issue 39): bob (alice's
//! tenant) and mallory (another tenant) try alice's task and context over
//! JSON-RPC, A2A 1.0 and 0.3 alike, and over gRPC (`lf.a2a.v1.A2AService`).
//! Each attempt is answered exactly as a task that does not exist, ListTasks
//! never shows alice's task, and alice's session is the same after as before
//! (its history, its log, no model call). What comes back is bounded: a
//! task or context id of a megabyte is not echoed whole in the error.

use omicos_e2e::stack::{ChatHandle, client_with};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_proto::a2a::{self, a2a_service_client::A2aServiceClient};
use omicos_proto::{AttachRequest, ChatEvent, ChatRequest, GetSessionRequest, chat_event};
use serde_json::{Value, json};
use std::time::Duration;
use tonic::Code;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abcdef";

/// The most an error message may take ([`omicos_orchestrator::bound`]'s
/// bound, with room for the marker that says what was cut).
const ERROR_BOUND: usize = omicos_orchestrator::bound::MAX_ERROR_MESSAGE_BYTES + 200;

async fn stack(llm: FakeLlm) -> Stack {
    Stack::start(
        llm,
        StackOptions {
            tweak: Some(Box::new(|c| {
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await
}

/// alice's session as the store and the model see it.
async fn snapshot(url: &str, sid: &str, llm: &FakeLlm) -> (Vec<String>, Vec<ChatEvent>, usize) {
    let mut c = client_with(url, ALICE).await;
    let history = c
        .get_session(GetSessionRequest {
            session_id: sid.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .messages_json;
    let mut s = c
        .attach(AttachRequest {
            session_id: sid.into(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut log = vec![];
    while let Ok(Ok(Some(mut ev))) = tokio::time::timeout(Duration::from_secs(3), s.message()).await
    {
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        ev.timestamp_ms = 0;
        log.push(ev);
    }
    (history, log, llm.requests().len())
}

async fn rpc(url: &str, token: &str, method: &str, params: Value) -> Value {
    reqwest::Client::new()
        .post(format!("{url}/a2a"))
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
}

/// Every JSON-RPC method that names a task or a context, on `task`
/// (`<session>:<turn>`) and its context `ctx`: (method, error code,
/// error message with the ids replaced by `<task>` and `<ctx>`).
async fn json_rpc_attempts(
    url: &str,
    token: &str,
    task: &str,
    ctx: &str,
) -> Vec<(String, Value, String)> {
    let msg_v1 = |extra: Value| {
        let mut m = json!({"messageId": "m-x", "role": "ROLE_USER", "parts": [{"text": "steal"}]});
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"message": m})
    };
    let msg_v03 = |extra: Value| {
        let mut m = json!({"messageId": "m-y", "role": "user", "kind": "message",
            "parts": [{"kind": "text", "text": "steal"}]});
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"message": m})
    };
    let calls: Vec<(&str, Value)> = vec![
        ("GetTask", json!({"id": task})),
        ("tasks/get", json!({"id": task})),
        ("CancelTask", json!({"id": task})),
        ("tasks/cancel", json!({"id": task})),
        ("SubscribeToTask", json!({"id": task})),
        ("tasks/resubscribe", json!({"id": task})),
        ("SendMessage", msg_v1(json!({"contextId": ctx}))),
        ("SendMessage", msg_v1(json!({"taskId": task}))),
        ("message/send", msg_v03(json!({"contextId": ctx}))),
        ("message/send", msg_v03(json!({"taskId": task}))),
        ("SendStreamingMessage", msg_v1(json!({"contextId": ctx}))),
        ("message/stream", msg_v03(json!({"taskId": task}))),
    ];
    let mut out = vec![];
    for (method, params) in calls {
        let r = if method.contains("ubscribe") || method.contains("tream") {
            // SSE or a JSON answer: a refusal is one JSON-RPC response.
            let res = reqwest::Client::new()
                .post(format!("{url}/a2a"))
                .bearer_auth(token)
                .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
                .send()
                .await
                .unwrap();
            let text = res.text().await.unwrap();
            let data = text
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .map(str::to_owned)
                .unwrap_or(text);
            serde_json::from_str::<Value>(data.trim()).unwrap()
        } else {
            rpc(url, token, method, params).await
        };
        let message = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .replace(task, "<task>")
            .replace(ctx, "<ctx>");
        out.push((method.to_owned(), r["error"]["code"].clone(), message));
    }
    out
}

fn grpc_client(
    ch: tonic::transport::Channel,
    token: &str,
) -> A2aServiceClient<omicos_auth::AuthedChannel> {
    A2aServiceClient::new(omicos_auth::Credentials::bearer(token).unwrap().channel(ch))
        .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
}

fn send_req(context: &str, task: &str) -> a2a::SendMessageRequest {
    a2a::SendMessageRequest {
        message: Some(a2a::Message {
            message_id: "g1".into(),
            context_id: context.into(),
            task_id: task.into(),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text("steal".into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The same over gRPC: (method, code, message with the ids replaced).
async fn grpc_attempts(
    url: &str,
    token: &str,
    task: &str,
    ctx: &str,
) -> Vec<(String, Code, String)> {
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = grpc_client(ch, token);
    let mut out = vec![];
    let mut push = |m: &str, r: Result<(), tonic::Status>| {
        let (code, msg) = match r {
            Ok(()) => (Code::Ok, String::new()),
            Err(s) => (s.code(), s.message().to_owned()),
        };
        out.push((
            m.to_owned(),
            code,
            msg.replace(task, "<task>").replace(ctx, "<ctx>"),
        ));
    };
    let id = || task.to_owned();
    push(
        "GetTask",
        c.get_task(a2a::GetTaskRequest {
            id: id(),
            ..Default::default()
        })
        .await
        .map(|_| ()),
    );
    push(
        "CancelTask",
        c.cancel_task(a2a::CancelTaskRequest {
            id: id(),
            ..Default::default()
        })
        .await
        .map(|_| ()),
    );
    push(
        "SubscribeToTask",
        c.subscribe_to_task(a2a::SubscribeToTaskRequest {
            id: id(),
            ..Default::default()
        })
        .await
        .map(|_| ()),
    );
    push(
        "SendMessage ctx",
        c.send_message(send_req(ctx, "")).await.map(|_| ()),
    );
    push(
        "SendMessage task",
        c.send_message(send_req("", task)).await.map(|_| ()),
    );
    push(
        "SendStreamingMessage ctx",
        c.send_streaming_message(send_req(ctx, ""))
            .await
            .map(|_| ()),
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_principals_get_nothing_of_a_task_over_either_binding() {
    let llm = FakeLlm::start(vec![Reply::Text("alice's answer".into()); 20]).await;
    let stack = stack(llm.clone()).await;
    let url = stack.orchestrator.clone();
    let sent = rpc(
        &url,
        ALICE,
        "SendMessage",
        json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
    )
    .await;
    let task = sent["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_owned();
    let ctx = sent["result"]["task"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{sent}"
    );
    let before = snapshot(&url, &ctx, &llm).await;
    assert!(!before.0.is_empty() && !before.1.is_empty());

    // The reference: a task and a context that do not exist.
    let (no_task, no_ctx) = ("no-such-session:0123", "no-such-session");
    let missing_json = json_rpc_attempts(&url, BOB, no_task, no_ctx).await;
    let missing_grpc = grpc_attempts(&url, BOB, no_task, no_ctx).await;
    for (m, code, _) in &missing_json {
        assert_eq!(code, &json!(-32001), "{m}: {missing_json:?}");
    }
    for (m, code, _) in &missing_grpc {
        assert_eq!(*code, Code::NotFound, "{m}: {missing_grpc:?}");
    }
    for (who, token) in [("bob", BOB), ("mallory", MALLORY)] {
        assert_eq!(
            json_rpc_attempts(&url, token, &task, &ctx).await,
            missing_json,
            "{who}: JSON-RPC"
        );
        assert_eq!(
            grpc_attempts(&url, token, &task, &ctx).await,
            missing_grpc,
            "{who}: gRPC"
        );
        // ListTasks: never alice's, whatever the filter.
        for params in [json!({}), json!({"contextId": ctx})] {
            let r = rpc(&url, token, "ListTasks", params).await;
            assert!(
                !r.to_string().contains(&ctx),
                "{who} listed alice's task: {r}"
            );
        }
        let ch = tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let listed = grpc_client(ch, token)
            .list_tasks(a2a::ListTasksRequest {
                context_id: ctx.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(listed.tasks.is_empty(), "{who}: {listed:?}");
    }
    // Nothing changed: the same history, the same log, no model call.
    assert_eq!(snapshot(&url, &ctx, &llm).await, before);
    // And alice still reads her task, over both bindings.
    let r = rpc(&url, ALICE, "GetTask", json!({"id": task})).await;
    assert_eq!(r["result"]["id"], task.as_str(), "{r}");
}

/// A task or context id of a megabyte comes back in no error whole, over
/// JSON-RPC (1.0 and 0.3) and gRPC, whether the session guard or a handler
/// refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_errors_are_bounded_whatever_the_id() {
    let stack = stack(FakeLlm::start(vec![Reply::Text("x".into()); 4]).await).await;
    let url = stack.orchestrator.clone();
    let big = "s".repeat(1 << 20);
    let big_task = format!("{big}:t");
    for (method, params) in [
        ("GetTask", json!({"id": big_task})),
        ("tasks/get", json!({"id": big})),
        ("CancelTask", json!({"id": big_task})),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "contextId": big,
                "parts": [{"text": "hi"}]}}),
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": big, "parts": [{"text": "hi"}]}}),
        ),
        (&big, json!({})),
    ] {
        let r = rpc(&url, ALICE, method, params).await;
        let m = r["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", &r.to_string()[..300]));
        assert!(
            m.len() <= ERROR_BOUND,
            "{}: a JSON-RPC error of {} bytes",
            &method[..method.len().min(20)],
            m.len()
        );
    }
    let ch = tonic::transport::Channel::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = grpc_client(ch, ALICE);
    let bounded = |what: &str, r: Result<(), tonic::Status>| {
        let s = r.expect_err(what);
        assert_eq!(s.code(), Code::NotFound, "{what}: {:?}", s.code());
        assert!(
            s.message().len() <= ERROR_BOUND && s.details().len() <= 2 * ERROR_BOUND,
            "{what}: a gRPC error of {} bytes, details {}",
            s.message().len(),
            s.details().len()
        );
    };
    // Refused by the session guard (the context names no session of alice's).
    bounded(
        "SendMessage",
        c.send_message(send_req(&big, "")).await.map(|_| ()),
    );
    bounded(
        "GetTask",
        c.get_task(a2a::GetTaskRequest {
            id: big_task.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ()),
    );
    // Refused by the handler: alice's own context, a turn it never had.
    let sent = rpc(
        &url,
        ALICE,
        "SendMessage",
        json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
    )
    .await;
    let ctx = sent["result"]["task"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = rpc(
        &url,
        ALICE,
        "GetTask",
        json!({"id": format!("{ctx}:{big}")}),
    )
    .await;
    let m = r["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(r["error"]["code"], -32001);
    assert!(
        m.len() <= ERROR_BOUND,
        "GetTask of an own context: {} bytes",
        m.len()
    );
    bounded(
        "CancelTask",
        c.cancel_task(a2a::CancelTaskRequest {
            id: format!("{ctx}:{big}"),
            ..Default::default()
        })
        .await
        .map(|_| ()),
    );
    // The stack still answers.
    let mut h = ChatHandle::open(
        client_with(&url, ALICE).await,
        ChatRequest {
            message: "still there".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!h.until_done().await.is_empty());
}
