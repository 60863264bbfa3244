//! What A2A's bindings cost against gRPC Chat for the same turn (issue 41).
//! One stack (orchestrator + runner on loopback, fake LLM), one turn = one
//! user message answered with text by the model, in a new session each time.
//! The turns rotate between a gRPC Chat (until its TurnDone), an A2A
//! JSON-RPC `SendMessage` (blocking, over HTTP/1.1 with a reused connection,
//! until the completed task comes back) and an A2A gRPC `SendMessage`
//! (`lf.a2a.v1.A2AService`, blocking, on a reused HTTP/2 channel), so all
//! three see the same machine.
//!
//! `cargo bench -p omicos-e2e --bench a2a` (release). `A2A_TURNS=N` sets the
//! turns per path (default 300).

use omicos_e2e::stack::ChatHandle;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, TEST_TOKEN, client_at};
use omicos_proto::ChatRequest;
use omicos_proto::a2a::{self, a2a_service_client::A2aServiceClient};
use serde_json::{Value, json};
use std::time::Instant;

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let turns: usize = std::env::var("A2A_TURNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    const WARM: usize = 30;
    let n = 3 * (turns + WARM);
    let stack = Stack::start(
        FakeLlm::start(vec![Reply::Text("the answer".into()); n]).await,
        StackOptions::default(),
    )
    .await;
    let grpc = client_at(&stack.orchestrator).await;
    let http = reqwest::Client::new();
    let url = format!("{}/a2a", stack.orchestrator);
    let ch = tonic::transport::Channel::from_shared(stack.orchestrator.clone())
        .expect("URL")
        .connect()
        .await
        .expect("connect");
    let mut a2a_grpc = A2aServiceClient::new(
        omicos_auth::Credentials::bearer(TEST_TOKEN)
            .expect("token")
            .channel(ch),
    );
    let (mut g, mut a, mut ag) = (vec![], vec![], vec![]);
    for i in 0..(turns + WARM) {
        let record = i >= WARM;
        // Rotate which path goes first.
        for k in 0..3 {
            let t = Instant::now();
            let path = (i + k) % 3;
            if path == 2 {
                let r = a2a_grpc
                    .send_message(a2a::SendMessageRequest {
                        message: Some(a2a::Message {
                            message_id: format!("g{i}"),
                            role: a2a::Role::User as i32,
                            parts: vec![a2a::Part {
                                content: Some(a2a::part::Content::Text("go".into())),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await
                    .expect("A2AService/SendMessage")
                    .into_inner();
                let Some(a2a::send_message_response::Payload::Task(task)) = r.payload else {
                    panic!("no task: {r:?}");
                };
                assert_eq!(
                    task.status.map(|s| s.state),
                    Some(a2a::TaskState::Completed as i32)
                );
                if record {
                    ag.push(t.elapsed().as_secs_f64() * 1e3);
                }
            } else if path == 0 {
                let req = ChatRequest {
                    message: "go".into(),
                    ..Default::default()
                };
                let mut chat = ChatHandle::open(grpc.clone(), req).await.expect("Chat");
                let events = chat.until_done().await;
                assert_eq!(
                    omicos_e2e::stack::done_reason(&events).as_deref(),
                    Some("completed")
                );
                if record {
                    g.push(t.elapsed().as_secs_f64() * 1e3);
                }
            } else {
                let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {
                    "message": {"messageId": format!("m{i}"), "role": "ROLE_USER", "parts": [{"text": "go"}]}}});
                let r: Value = http
                    .post(&url)
                    .bearer_auth(TEST_TOKEN)
                    .json(&body)
                    .send()
                    .await
                    .expect("POST /a2a")
                    .json()
                    .await
                    .expect("JSON-RPC answer");
                assert_eq!(
                    r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
                    "{r}"
                );
                if record {
                    a.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    stack.llm.assert_invariants();
    println!("One text turn in a new session, {turns} turns per path, rotated, ms:");
    println!(
        "{:<34} {:>8} {:>8} {:>10}",
        "path", "p50", "p99", "p50 ratio"
    );
    let (gp50, gp99) = (pct(&mut g, 0.5), pct(&mut g, 0.99));
    let (ap50, ap99) = (pct(&mut a, 0.5), pct(&mut a, 0.99));
    println!(
        "{:<34} {gp50:>8.3} {gp99:>8.3} {:>10.3}",
        "gRPC Chat (until TurnDone)", 1.0
    );
    println!(
        "{:<34} {ap50:>8.3} {ap99:>8.3} {:>10.3}",
        "A2A JSON-RPC SendMessage",
        ap50 / gp50
    );
    let (gg50, gg99) = (pct(&mut ag, 0.5), pct(&mut ag, 0.99));
    println!(
        "{:<34} {gg50:>8.3} {gg99:>8.3} {:>10.3}",
        "A2A gRPC SendMessage",
        gg50 / gp50
    );
    println!(
        "A2A over Chat, p50: JSON-RPC {:+.3} ms, gRPC {:+.3} ms",
        ap50 - gp50,
        gg50 - gp50
    );
}
