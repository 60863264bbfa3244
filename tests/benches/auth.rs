//! What client authentication costs on the call path (issue 14; target:
//! under 5% of a tool call's p50 through the pipeline).
//!
//! Three stacks in one process, each an orchestrator and a runner on
//! loopback with its own fake LLM, identical but for `auth`: off (what
//! `--no-auth` runs), an API key, and JWTs verified against a JWKS served
//! over HTTP on 127.0.0.1 (EdDSA). One turn is a Chat with one tool call: the
//! model asks for a no-op read tool, the runner's pipeline runs it, the model
//! answers. Turns alternate between the three stacks, so all three see the
//! same machine. A second table times `ClientAuth::authenticate` alone.
//!
//! `cargo bench -p omicos-e2e --bench auth` (release). `AUTH_TURNS=N` sets
//! the turns per stack (default 300).

use async_trait::async_trait;
use omicos_e2e::idp::Idp;
use omicos_e2e::stack::ChatHandle;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, TEST_TOKEN, client_with, finished_calls};
use omicos_orchestrator::config::Config;
use omicos_proto::{ChatRequest, ToolSpec, ToolStatus};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Noop;

#[async_trait]
impl Provider for Noop {
    fn name(&self) -> &str {
        "bench_noop"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![tool("bench_noop", "does nothing", json!({"type": "object"})).build()]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(Value::String("ok".into()))
    }
}

fn script(turns: usize) -> Vec<Reply> {
    let mut s = vec![];
    for i in 0..turns {
        s.push(Reply::Tools(
            String::new(),
            vec![(format!("c{i}"), "bench_noop".into(), "{}".into())],
        ));
        s.push(Reply::Text("ok".into()));
    }
    s
}

struct Variant {
    name: &'static str,
    stack: Stack,
    client: omicos_e2e::Client,
    lat: Vec<f64>,
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

async fn turn(v: &mut Variant, record: bool) {
    // A new session each turn: every turn costs the same.
    let req = ChatRequest {
        message: "go".into(),
        permission_mode: "full".into(),
        ..Default::default()
    };
    let t = Instant::now();
    let mut chat = ChatHandle::open(v.client.clone(), req).await.expect("Chat");
    let events = chat.until_done().await;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let calls = finished_calls(&events);
    assert_eq!(calls.len(), 1, "{}: {events:#?}", v.name);
    assert_eq!(
        calls[0].status(),
        ToolStatus::Done,
        "{}: {}",
        v.name,
        calls[0].result
    );
    if record {
        v.lat.push(ms);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let turns: usize = std::env::var("AUTH_TURNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    const WARM: usize = 30;
    let idp = Idp::start().await;
    let jwt_cfg = idp.config();
    let jwt = idp.token(json!({"sub": "tester", "tenant": "default", "max_mode": "full"}));
    let opts = |tweak: omicos_e2e::stack::ConfigTweak| StackOptions {
        providers: vec![Arc::new(Noop)],
        tweak: Some(tweak),
        ..Default::default()
    };
    let off = Stack::start(
        FakeLlm::start(script(turns + WARM)).await,
        opts(Box::new(|c: &mut Config| c.auth.enabled = false)),
    )
    .await;
    let key = Stack::start(
        FakeLlm::start(script(turns + WARM)).await,
        opts(Box::new(|_: &mut Config| {})),
    )
    .await;
    let with_jwt = Stack::start(
        FakeLlm::start(script(turns + WARM)).await,
        opts(Box::new(move |c: &mut Config| c.auth.jwt = jwt_cfg)),
    )
    .await;
    let variant = |name: &'static str, stack: Stack, token: String| async move {
        let client = client_with(&stack.orchestrator, &token).await;
        Variant {
            name,
            stack,
            client,
            lat: vec![],
        }
    };
    let mut vs = vec![
        variant("auth off (--no-auth)", off, TEST_TOKEN.into()).await,
        variant("API key", key, TEST_TOKEN.into()).await,
        variant("JWT (JWKS, EdDSA)", with_jwt, jwt.clone()).await,
    ];
    for _ in 0..WARM {
        for v in &mut vs {
            turn(v, false).await;
        }
    }
    for i in 0..turns {
        // Rotate the order so no variant always runs right after another.
        for k in 0..vs.len() {
            let j = (i + k) % vs.len();
            turn(&mut vs[j], true).await;
        }
    }
    for v in &vs {
        v.stack.llm.assert_invariants();
    }
    let fetches_after_turns = idp.fetches();

    // authenticate() alone, in process.
    let mut cfg = omicos_auth::ClientAuthConfig::default();
    cfg.api_keys
        .push(omicos_e2e::api_key(TEST_TOKEN, "tester", "default", "full"));
    cfg.jwt = idp.config();
    let auth = omicos_auth::ClientAuth::new(&cfg).unwrap();
    let key_header = format!("Bearer {TEST_TOKEN}");
    let jwt_header = format!("Bearer {jwt}");
    auth.authenticate(Some(&jwt_header)).await.unwrap();
    let micro = |header: String| {
        let auth = &auth;
        async move {
            let mut v = Vec::with_capacity(20_000);
            for _ in 0..20_000 {
                let t = Instant::now();
                std::hint::black_box(auth.authenticate(Some(&header)).await.unwrap());
                v.push(t.elapsed().as_secs_f64() * 1e6);
            }
            v
        }
    };
    let mut m_key = micro(key_header).await;
    let mut m_jwt = micro(jwt_header).await;
    // A token never seen: the signature is verified (the JWKS is cached).
    let mut m_fresh = vec![];
    for i in 0..500 {
        let h = format!(
            "Bearer {}",
            idp.token(json!({"sub": format!("u{i}"), "tenant": "default"}))
        );
        let t = Instant::now();
        auth.authenticate(Some(&h)).await.unwrap();
        m_fresh.push(t.elapsed().as_secs_f64() * 1e6);
    }

    println!(
        "A Chat turn with one tool call (no-op read tool through the runner's pipeline), {turns} turns per stack, interleaved, ms:"
    );
    println!(
        "{:<24} {:>8} {:>8} {:>10} {:>10}",
        "auth", "p50", "p99", "p50 ratio", "p50 cost"
    );
    let mut base = 0.0;
    for (i, v) in vs.iter_mut().enumerate() {
        let (p50, p99) = (pct(&mut v.lat, 0.5), pct(&mut v.lat, 0.99));
        if i == 0 {
            base = p50;
        }
        println!(
            "{:<24} {p50:>8.3} {p99:>8.3} {:>10.3} {:>+9.1}%",
            v.name,
            p50 / base,
            (p50 / base - 1.0) * 100.0
        );
    }
    println!("ClientAuth::authenticate alone, µs:");
    println!(
        "{:<40} {:>8} {:>8} {:>12}",
        "credential", "p50", "p99", "share of turn p50"
    );
    for (name, v) in [
        ("API key (sha256, constant-time compare)", &mut m_key),
        ("JWT, verified before (token cache)", &mut m_jwt),
        ("JWT never seen (EdDSA verify, cached JWKS)", &mut m_fresh),
    ] {
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!(
            "{name:<40} {p50:>8.2} {p99:>8.2} {:>11.3}%",
            p50 / (base * 1e3) * 100.0
        );
    }
    println!(
        "JWKS fetches: {fetches_after_turns} during the {} JWT turns, {} in all",
        turns + WARM,
        idp.fetches()
    );
    println!("target: auth costs under 5% of a tool call's p50");
    for v in &vs {
        v.stack.orch_shutdown.trigger();
        v.stack.runner_shutdown.trigger();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}
