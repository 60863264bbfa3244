//! Tool calls in parallel (issue 16; target: five calls of a 200 ms
//! read-only tool in one model answer finish in under 1.5× one call).
//!
//! Through the orchestrator's turn loop (Chat → the fake LLM's answer with
//! the calls → the runner's pipeline → the tool → the results back to the
//! model → its final answer), on loopback. Interleaved in one run:
//! - one call of the read-only tool (the baseline);
//! - five calls of it in one answer (run side by side);
//! - five calls of the same tool declared a file write (run one at a time,
//!   in order: the control that shows what parallelism saves).
//!
//! Two figures per path: the whole turn (Chat until turn_done), and the
//! calls alone (first `tool_call_started` to last `tool_call_finished`).
//!
//! `cargo bench -p omicos-e2e --bench parallel_calls` (release).
//! `PARALLEL_ROUNDS=N` sets the rounds (default 15).

use async_trait::async_trait;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, finished_calls};
use omicos_proto::{ChatRequest, Risk, ToolSpec, ToolStatus, chat_event};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOOL_TIME: Duration = Duration::from_millis(200);

struct Sleepy;

#[async_trait]
impl Provider for Sleepy {
    fn name(&self) -> &str {
        "bench_sleepy"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool("bench_read", "reads for 200 ms", json!({"type": "object"})).build(),
            tool(
                "bench_write",
                "writes for 200 ms",
                json!({"type": "object"}),
            )
            .risk(Risk::FileWrite)
            .build(),
        ]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        tokio::time::sleep(TOOL_TIME).await;
        Ok(Value::String("ok".into()))
    }
}

#[derive(Clone, Copy)]
enum Path {
    One,
    FiveRead,
    FiveWrite,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::One => "1 read-only call",
            Path::FiveRead => "5 read-only calls in one answer",
            Path::FiveWrite => "5 write calls in one answer (sequential)",
        }
    }
    fn reply(self, round: usize) -> Reply {
        let (n, tool) = match self {
            Path::One => (1, "bench_read"),
            Path::FiveRead => (5, "bench_read"),
            Path::FiveWrite => (5, "bench_write"),
        };
        Reply::Tools(
            String::new(),
            (0..n)
                .map(|i| {
                    (
                        format!("c{round}_{}_{i}", self as u8),
                        tool.into(),
                        "{}".into(),
                    )
                })
                .collect(),
        )
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("PARALLEL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    const WARM: usize = 2;
    let paths = [Path::One, Path::FiveRead, Path::FiveWrite];
    let mut script = vec![];
    for r in 0..rounds + WARM {
        for p in paths {
            script.push(p.reply(r));
            script.push(Reply::Text("done".into()));
        }
    }
    let llm = FakeLlm::start(script).await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            providers: vec![Arc::new(Sleepy)],
            ..Default::default()
        },
    )
    .await;
    let mut turn_ms: Vec<Vec<f64>> = vec![vec![]; paths.len()];
    let mut calls_ms: Vec<Vec<f64>> = vec![vec![]; paths.len()];
    for r in 0..rounds + WARM {
        for (k, p) in paths.iter().enumerate() {
            let req = ChatRequest {
                message: "go".into(),
                permission_mode: "full".into(),
                ..Default::default()
            };
            let t = Instant::now();
            let mut chat = stack.chat(req).await.expect("Chat");
            let (mut first_start, mut last_end) = (None, None);
            while let Some(ev) = chat.next().await {
                match ev.kind {
                    Some(chat_event::Kind::ToolCallStarted(_)) => {
                        first_start.get_or_insert_with(Instant::now);
                    }
                    Some(chat_event::Kind::ToolCallFinished(_)) => last_end = Some(Instant::now()),
                    Some(chat_event::Kind::TurnDone(_)) => break,
                    _ => {}
                }
            }
            let whole = t.elapsed().as_secs_f64() * 1e3;
            let finished = finished_calls(&chat.events);
            let n = if matches!(p, Path::One) { 1 } else { 5 };
            assert_eq!(finished.len(), n, "{}: {:#?}", p.name(), chat.events);
            assert!(finished.iter().all(|f| f.status() == ToolStatus::Done));
            if r >= WARM {
                turn_ms[k].push(whole);
                calls_ms[k].push((last_end.unwrap() - first_start.unwrap()).as_secs_f64() * 1e3);
            }
        }
    }
    llm.assert_invariants();
    // The results go back to the model in call order.
    for rec in llm.requests() {
        let ids: Vec<String> = rec.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "tool results out of call order");
    }

    println!(
        "Tool calls of a {} ms tool through the turn loop (fake LLM on loopback), {rounds} rounds, interleaved, ms:",
        TOOL_TIME.as_millis()
    );
    println!(
        "{:<44} {:>9} {:>9} {:>11} {:>11} {:>13}",
        "path", "turn p50", "turn p99", "calls p50", "calls p99", "turn ratio"
    );
    let mut base = 0.0;
    let mut five = 0.0;
    for (k, p) in paths.iter().enumerate() {
        let (t50, t99) = (pct(&mut turn_ms[k], 0.5), pct(&mut turn_ms[k], 0.99));
        let (c50, c99) = (pct(&mut calls_ms[k], 0.5), pct(&mut calls_ms[k], 0.99));
        if k == 0 {
            base = t50;
        }
        if k == 1 {
            five = t50;
        }
        println!(
            "{:<44} {t50:>9.1} {t99:>9.1} {c50:>11.1} {c99:>11.1} {:>13.2}",
            p.name(),
            t50 / base
        );
    }
    println!(
        "target: 5 read-only calls < 1.5× one call: {:.2}× — {}",
        five / base,
        if five / base < 1.5 { "met" } else { "NOT met" }
    );
    stack.orch_shutdown.trigger();
    stack.runner_shutdown.trigger();
}
