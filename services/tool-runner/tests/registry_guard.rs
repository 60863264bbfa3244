//! The registry's own rules (issue 14, "the registry is guarded"), on the
//! in-memory registry and on the shared one (two replicas on one real
//! PostgreSQL schema): an instance id belongs to the key and endpoint that
//! first registered it, a tool name to the first provider that served it
//! (unless config hands it over), built-in names are never taken, static
//! entries come from config only, and the TTL is capped. Each refused attempt
//! leaves the live set unchanged.

use omicos_proto::{ProviderInstance, ToolSpec};
use omicos_tool_runner::Registry;
use omicos_tool_runner::error::RunnerError;
use omicos_tool_runner::ownership::RegistryPolicy;
use std::sync::Arc;
use std::time::Duration;

fn inst(id: &str, provider: &str, endpoint: &str, tool: &str) -> ProviderInstance {
    ProviderInstance {
        instance_id: id.into(),
        provider: provider.into(),
        endpoint: endpoint.into(),
        tools: vec![ToolSpec {
            name: tool.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn denied(r: Result<impl std::fmt::Debug, RunnerError>, why: &str) {
    match r {
        Err(RunnerError::RegistrationDenied(m)) => assert!(m.contains(why), "{why}: {m}"),
        other => panic!("expected a refusal ({why}), got {other:?}"),
    }
}

fn live(r: &Registry) -> Vec<(String, String)> {
    r.list()
        .into_iter()
        .map(|i| (i.instance_id, i.endpoint))
        .collect()
}

fn policy() -> RegistryPolicy {
    let mut p = RegistryPolicy {
        max_ttl: Duration::from_secs(60),
        ..Default::default()
    };
    p.tool_owners.insert("web_fetch".into(), "web2".into());
    p
}

/// Every rule, against `a` (where the real kernel registers) and `b` (where
/// the attacker calls: the same registry, or another replica of a shared one).
async fn rules_hold(a: &Registry, b: &Registry, settle: impl AsyncFn()) {
    let kernel = inst(
        "kernel-1",
        "kernel",
        "http://127.0.0.1:7101",
        "run_python_code",
    );
    a.announce(kernel.clone(), Duration::ZERO, Some("kernel-key"))
        .await
        .unwrap();
    // A re-registration by its owner is fine.
    a.announce(kernel.clone(), Duration::ZERO, Some("kernel-key"))
        .await
        .unwrap();
    settle().await;
    let before = live(a);

    // The id at another endpoint, or with another key (or none).
    let mut moved = kernel.clone();
    moved.endpoint = "http://127.0.0.1:9".into();
    denied(
        b.announce(moved.clone(), Duration::ZERO, Some("kernel-key"))
            .await,
        "belongs to another registrant",
    );
    denied(
        b.announce(kernel.clone(), Duration::ZERO, Some("evil-key"))
            .await,
        "belongs to another registrant",
    );
    denied(
        b.announce(moved, Duration::ZERO, None).await,
        "belongs to another registrant",
    );
    // Its heartbeats and its Deregister.
    denied(b.refresh("kernel-1", Some("evil-key")).await, "not yours");
    denied(b.refresh("kernel-1", None).await, "not yours");
    denied(b.withdraw("kernel-1", Some("evil-key")).await, "not yours");
    // Its tool, under another provider.
    denied(
        b.announce(
            inst("evil-1", "evil", "http://127.0.0.1:9", "run_python_code"),
            Duration::ZERO,
            Some("evil-key"),
        )
        .await,
        "belongs to the provider `kernel`",
    );
    // A built-in name.
    denied(
        b.announce(
            inst("evil-2", "evil", "http://127.0.0.1:9", "shell"),
            Duration::ZERO,
            Some("evil-key"),
        )
        .await,
        "built-in",
    );
    // A name config gives to another provider.
    denied(
        b.announce(
            inst("evil-3", "evil", "http://127.0.0.1:9", "web_fetch"),
            Duration::ZERO,
            Some("evil-key"),
        )
        .await,
        "registry_tool_owners",
    );
    // A static entry.
    let mut forever = inst("evil-4", "evil", "http://127.0.0.1:9", "evil_tool");
    forever.static_entry = true;
    denied(
        b.announce(forever, Duration::ZERO, Some("evil-key")).await,
        "static entries",
    );
    settle().await;
    assert_eq!(live(a), before, "nothing changed");
    assert_eq!(live(b), before, "nothing changed on the other side either");

    // The owner's heartbeat still counts.
    assert!(a.refresh("kernel-1", Some("kernel-key")).await.unwrap());
    // A new tool of one's own is fine, with the TTL capped.
    let ttl = b
        .announce(
            inst("evil-5", "evil", "http://127.0.0.1:9", "evil_tool"),
            Duration::from_secs(4_000_000_000),
            Some("evil-key"),
        )
        .await
        .unwrap();
    assert_eq!(ttl, Duration::from_secs(60));
    // The provider config names may serve web_fetch.
    b.announce(
        inst("web2-1", "web2", "http://127.0.0.1:7103", "web_fetch"),
        Duration::ZERO,
        Some("web2-key"),
    )
    .await
    .unwrap();
    // Its owner deregisters it; then it is gone.
    b.withdraw("evil-5", Some("evil-key")).await.unwrap();
    b.withdraw("web2-1", Some("web2-key")).await.unwrap();
    settle().await;
    assert_eq!(live(a), before);
    // And the real kernel deregisters itself.
    a.withdraw("kernel-1", Some("kernel-key")).await.unwrap();
    settle().await;
    assert!(live(a).is_empty());
}

#[tokio::test]
async fn in_memory() {
    let r = Registry::new(Duration::from_secs(30)).with_policy(policy());
    r.reserve_builtin(["shell".to_owned()]);
    rules_hold(&r, &r, async || {}).await;
}

#[tokio::test]
async fn shared_through_postgresql() {
    let db = omicos_testdb::postgres("registry guard", "regguard")
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (see docs/operations.md)");
    let stop = tokio_util::sync::CancellationToken::new();
    let mut replicas = vec![];
    for _ in 0..2 {
        let store = omicos_tool_runner::shared_registry::SharedStore::connect(&db.url)
            .await
            .unwrap();
        let r = Arc::new(Registry::new(Duration::from_secs(30)).with_policy(policy()));
        r.reserve_builtin(["shell".to_owned()]);
        store.load_into(&r).await.unwrap();
        r.attach_store(store.clone()).unwrap();
        store.spawn_follower(Arc::downgrade(&r), Duration::from_secs(30), stop.clone());
        replicas.push((r, store));
    }
    let (a, b) = (replicas[0].0.clone(), replicas[1].0.clone());
    let stores: Vec<_> = replicas
        .iter()
        .map(|(r, s)| (r.clone(), s.clone()))
        .collect();
    // Both views re-read the store, so each sees what the other wrote.
    let settle = async || {
        for (r, s) in &stores {
            s.load_into(r).await.unwrap();
        }
    };
    rules_hold(&a, &b, settle).await;
    stop.cancel();
}
