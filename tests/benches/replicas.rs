//! Two orchestrator replicas on one PostgreSQL store (issue 13's figures):
//!
//! 1. ApproveTool through the replica that does not run the turn, until the
//!    runner has the decision (the approved tool starts): target p50 < 50 ms.
//!    Baseline, interleaved in the same run: ApproveTool on the replica that
//!    runs the turn (the decision is delivered in memory).
//! 2. Attach on the other replica: an event reaches its client after it was
//!    written (the event's `timestamp_ms`, set when the running replica
//!    appends it): target p50 < 100 ms. Baseline, same events: the Chat
//!    stream on the replica that runs the turn.
//!
//! Both replicas run in this process (as tests/tests/replicas.rs does); they
//! share only the PostgreSQL store and the runner, so every cross-replica
//! step goes through the store's LISTEN/NOTIFY as between two processes.
//!
//! `cargo bench -p omicos-e2e --bench replicas` (release; needs the
//! PostgreSQL of omicos-testdb, else it says SKIPPED). `REPLICAS_N=N` sets
//! the approvals per path (default 40).

use async_trait::async_trait;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, client_at};
use omicos_proto::{
    ApproveToolRequest, AttachRequest, ChatRequest, Decision, Risk, ToolSpec, chat_event,
};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// A write tool (asked in auto mode) that reports the instant it starts.
struct Gate(mpsc::UnboundedSender<Instant>);

#[async_trait]
impl Provider for Gate {
    fn name(&self) -> &str {
        "bench_gate"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "bench_gate",
                "a write the user must approve",
                json!({"type": "object"}),
            )
            .risk(Risk::FileWrite)
            .build(),
        ]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        let _ = self.0.send(Instant::now());
        Ok(Value::String("ok".into()))
    }
}

fn req(session: &str, message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn gate_call(i: usize) -> Reply {
    Reply::Tools(
        String::new(),
        vec![(format!("c_gate_{i}"), "bench_gate".into(), "{}".into())],
    )
}

fn now_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let n: usize = std::env::var("REPLICAS_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let Some(pg) = omicos_testdb::postgres("replicas bench", "orbench").await else {
        return;
    };
    const TURNS: usize = 5;
    const CHUNKS: usize = 40;
    // The script: a first turn that creates the session, 2n approval turns,
    // then the streamed turns of the Attach figure.
    let mut script = vec![Reply::Text("ready".into())];
    for i in 0..2 * n {
        script.push(gate_call(i));
        script.push(Reply::Text("done".into()));
    }
    for _ in 0..TURNS {
        script.push(Reply::Streamed {
            text: "word ".repeat(CHUNKS),
            chunks: CHUNKS,
            delay: Duration::from_millis(20),
            calls: vec![],
        });
    }
    let llm = FakeLlm::start(script).await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url: pg.url.clone(),
            providers: vec![Arc::new(Gate(started_tx))],
            ..Default::default()
        },
    )
    .await;
    let other_url = stack.add_replica().await;
    let mut same = stack.client().await;
    let mut other = client_at(&other_url).await;

    let mut first = stack.chat(req("", "hello", "auto")).await.unwrap();
    first.until_done().await;
    let session = first.events[0].session_id.clone();

    // 1. Approvals, alternating the replica that answers.
    let (mut via_other, mut via_same) = (Vec::new(), Vec::new());
    let (mut rpc_other, mut rpc_same) = (Vec::new(), Vec::new());
    for i in 0..2 * n {
        let through_other = i % 2 == 0;
        let mut chat = stack.chat(req(&session, "go", "auto")).await.unwrap();
        let call = chat.until_approval().await;
        // Let the pending approval reach the store before answering (a client
        // reads the request and then decides; that is never sub-millisecond).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let client = if through_other { &mut other } else { &mut same };
        let t = Instant::now();
        client
            .approve_tool(ApproveToolRequest {
                session_id: session.clone(),
                call_id: call,
                decision: Decision::AllowOnce as i32,
                ..Default::default()
            })
            .await
            .expect("ApproveTool");
        let rpc = t.elapsed();
        let ran = tokio::time::timeout(Duration::from_secs(10), started.recv())
            .await
            .expect("the approved tool ran within 10 s")
            .unwrap();
        let ms = (ran - t).as_secs_f64() * 1e3;
        let rpc_ms = rpc.as_secs_f64() * 1e3;
        if through_other {
            via_other.push(ms);
            rpc_other.push(rpc_ms);
        } else {
            via_same.push(ms);
            rpc_same.push(rpc_ms);
        }
        chat.until_done().await;
    }

    // 2. Attach on the other replica while the turn streams on the first.
    let (mut lag_other, mut lag_same) = (Vec::new(), Vec::new());
    for _ in 0..TURNS {
        let mut chat = stack.chat(req(&session, "stream", "auto")).await.unwrap();
        let started_ev = chat.next().await.expect("turn_started");
        let mut attach = other
            .attach(AttachRequest {
                session_id: session.clone(),
                since_seq: started_ev.event_seq,
            })
            .await
            .expect("Attach on the other replica")
            .into_inner();
        let follower = tokio::spawn(async move {
            let mut lags = vec![];
            while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(30), attach.message())
                .await
                .expect("an attached event within 30 s")
            {
                let at = now_ms_f64();
                match ev.kind {
                    Some(chat_event::Kind::TextDelta(_)) => lags.push(at - ev.timestamp_ms as f64),
                    Some(chat_event::Kind::TurnDone(_)) => break,
                    _ => {}
                }
            }
            lags
        });
        while let Some(ev) = chat.next().await {
            let at = now_ms_f64();
            match ev.kind {
                Some(chat_event::Kind::TextDelta(_)) => lag_same.push(at - ev.timestamp_ms as f64),
                Some(chat_event::Kind::TurnDone(_)) => break,
                _ => {}
            }
        }
        lag_other.extend(follower.await.unwrap());
    }
    llm.assert_invariants();

    println!("Two orchestrator replicas on one PostgreSQL store, one runner; release build");
    println!(
        "ApproveTool until the runner has the decision (the approved tool starts), n = {n} per path, ms:"
    );
    println!("{:<44} {:>8} {:>8} {:>12}", "path", "p50", "p99", "RPC p50");
    let (o50, o99, or50) = (
        pct(&mut via_other, 0.5),
        pct(&mut via_other, 0.99),
        pct(&mut rpc_other, 0.5),
    );
    let (s50, s99, sr50) = (
        pct(&mut via_same, 0.5),
        pct(&mut via_same, 0.99),
        pct(&mut rpc_same, 0.5),
    );
    println!(
        "{:<44} {s50:>8.2} {s99:>8.2} {sr50:>12.2}",
        "ApproveTool on the replica running the turn"
    );
    println!(
        "{:<44} {o50:>8.2} {o99:>8.2} {or50:>12.2}",
        "ApproveTool on the other replica"
    );
    println!(
        "  ratio other/same p50: {:.2}; target p50 < 50 ms: {}",
        o50 / s50,
        if o50 < 50.0 { "met" } else { "NOT met" }
    );
    println!(
        "An event reaches its client after it was written (text deltas, {TURNS} turns × {CHUNKS}), ms:"
    );
    let (lo, ls) = (lag_other.len(), lag_same.len());
    let (a50, a99) = (pct(&mut lag_other, 0.5), pct(&mut lag_other, 0.99));
    let (c50, c99) = (pct(&mut lag_same, 0.5), pct(&mut lag_same, 0.99));
    println!("{:<44} {:>8} {:>8} {:>8}", "path", "p50", "p99", "events");
    println!(
        "{:<44} {c50:>8.2} {c99:>8.2} {ls:>8}",
        "Chat stream on the replica running the turn"
    );
    println!(
        "{:<44} {a50:>8.2} {a99:>8.2} {lo:>8}",
        "Attach on the other replica"
    );
    println!(
        "  difference of p50s: {:.2} ms; target p50 < 100 ms: {}",
        a50 - c50,
        if a50 < 100.0 { "met" } else { "NOT met" }
    );
    stack.orch_shutdown.trigger();
    stack.runner_shutdown.trigger();
}
