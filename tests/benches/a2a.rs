//! What A2A's JSON-RPC binding costs against gRPC Chat for the same turn
//! (issue 41). One stack (orchestrator + runner on loopback, fake LLM), one
//! turn = one user message answered with text by the model, in a new
//! session each time. The turns alternate between a gRPC Chat (until its
//! TurnDone) and an A2A `SendMessage` (blocking, over HTTP/1.1 with a
//! reused connection, until the completed task comes back), so both see
//! the same machine.
//!
//! `cargo bench -p omicos-e2e --bench a2a` (release). `A2A_TURNS=N` sets the
//! turns per path (default 300).

use omicos_e2e::stack::ChatHandle;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, TEST_TOKEN, client_at};
use omicos_proto::ChatRequest;
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
    let n = 2 * (turns + WARM);
    let stack = Stack::start(
        FakeLlm::start(vec![Reply::Text("the answer".into()); n]).await,
        StackOptions::default(),
    )
    .await;
    let grpc = client_at(&stack.orchestrator).await;
    let http = reqwest::Client::new();
    let url = format!("{}/a2a", stack.orchestrator);
    let (mut g, mut a) = (vec![], vec![]);
    for i in 0..(turns + WARM) {
        let record = i >= WARM;
        // Alternate which path goes first.
        for k in 0..2 {
            let t = Instant::now();
            if (i + k) % 2 == 0 {
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
    println!("One text turn in a new session, {turns} turns per path, interleaved, ms:");
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
        "A2A SendMessage (blocking)",
        ap50 / gp50
    );
}
