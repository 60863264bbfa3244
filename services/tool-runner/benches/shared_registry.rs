//! A remote tool call through the runner's pipeline on the shared registry
//! (PostgreSQL, cached live set) vs the same call on the in-memory registry,
//! interleaved in one run; the p50 ratio is the figure (target ≤ 1.1×: the
//! shared registry must cost no database round trip per call).
//!
//! Run: `cargo bench -p omicos-tool-runner --bench shared_registry` (release;
//! needs the PostgreSQL of `omicos-testdb`, else it says SKIPPED).

use async_trait::async_trait;
use omicos_proto::{ProviderInstance, ToolSpec};
use omicos_servicekit::Shutdown;
use omicos_tool_runner::shared_registry::SharedStore;
use omicos_tool_runner::{CallIo, CallRequest, Config, Pipeline, Registry};
use omicos_toolkit::{CallCtx, Provider, ProviderHosting, ToolError, serve_provider, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Noop;

#[async_trait]
impl Provider for Noop {
    fn name(&self) -> &str {
        "bench"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![tool("remote_noop", "does nothing", json!({"type":"object"})).build()]
    }
    async fn call(&self, _tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(Value::String("ok".into()))
    }
}

fn request(i: usize) -> CallRequest {
    CallRequest {
        call_id: format!("c{i}"),
        tool_name: "remote_noop".into(),
        arguments: "{}".into(),
        session_id: "bench".into(),
        agent_id: "bench".into(),
        permission_mode: omicos_proto::PermissionMode::Full as i32,
        ..Default::default()
    }
}

async fn round(p: &Pipeline, n: usize, lat: &mut Vec<Duration>) {
    for i in 0..n {
        let t = Instant::now();
        let out = p.execute(request(i), CallIo::detached()).await;
        lat.push(t.elapsed());
        assert_eq!(
            out.result.status().as_str(),
            "done",
            "{}",
            out.result.result
        );
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let Some(db) = omicos_testdb::postgres("shared_registry bench", "regbench").await else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let sd = Shutdown::new(Duration::from_millis(200));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(
        Arc::new(Noop),
        listener,
        hosting,
        sd.clone(),
    ));
    let info = ProviderInstance {
        instance_id: "bench-1".into(),
        provider: "bench".into(),
        endpoint,
        tools: Noop.tools(),
        ..Default::default()
    };
    let ws = tempfile::tempdir().unwrap();
    let cfg = Config {
        workspace: ws.path().to_path_buf(),
        ..Config::default()
    };
    let memory = Arc::new(Registry::new(Duration::from_secs(300)));
    memory
        .announce(info.clone(), Duration::ZERO, None)
        .await
        .unwrap();
    let shared = Arc::new(Registry::new(Duration::from_secs(300)));
    let store = SharedStore::connect(&db.url).await.unwrap();
    shared.attach_store(store.clone()).unwrap();
    store.spawn_follower(
        Arc::downgrade(&shared),
        Duration::from_secs(30),
        sd.streams_token(),
    );
    shared.announce(info, Duration::ZERO, None).await.unwrap();
    let pm = Pipeline::new(&cfg, memory, vec![]).unwrap();
    let ps = Pipeline::new(&cfg, shared, vec![]).unwrap();
    // Warm both (connections, catalogs).
    let (mut lm, mut ls) = (Vec::new(), Vec::new());
    round(&pm, 200, &mut lm).await;
    round(&ps, 200, &mut ls).await;
    let (mut lm, mut ls) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        round(&pm, 300, &mut lm).await;
        round(&ps, 300, &mut ls).await;
    }
    let (m, s) = (p50(lm), p50(ls));
    println!(
        "remote tool call p50: in-memory registry {:.1} µs, shared (PostgreSQL) registry {:.1} µs, ratio {:.3}×",
        m.as_secs_f64() * 1e6,
        s.as_secs_f64() * 1e6,
        s.as_secs_f64() / m.as_secs_f64()
    );
    sd.trigger();
}
