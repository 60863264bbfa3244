//! The memory provider as its own gRPC service, called the way the
//! tool-runner calls it.

mod common;

use omicos_memory::{MemoryProvider, MemoryStore};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{CallCtx, Provider, ProviderHosting, remote::RemoteProvider, serve_provider};
use serde_json::json;
use std::{sync::Arc, time::Duration};

#[tokio::test]
async fn save_and_search_over_grpc() {
    let b = common::sqlite();
    let store = MemoryStore::open(&b.url).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    let server = tokio::spawn(serve_provider(
        Arc::new(MemoryProvider::new(store.clone())),
        listener,
        hosting,
        shutdown.clone(),
    ));

    let remote = RemoteProvider::connect(&format!("http://{addr}"))
        .await
        .unwrap();
    assert_eq!(remote.name(), "memory");
    let mut names: Vec<String> = remote.tools().into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "memory__forget",
            "memory__list",
            "memory__save",
            "memory__search",
            "memory__update"
        ]
    );
    assert!(
        remote
            .tools()
            .iter()
            .all(|t| t.toolset == "memory" && t.provider == "memory")
    );

    let ctx = |scope: &str| {
        let mut c = CallCtx::for_test(std::env::temp_dir(), "s1");
        c.scope = scope.into();
        c
    };
    let saved = remote
        .call(
            "memory__save",
            json!({"content": "grpc remembers the lighthouse", "category": "reference"}),
            ctx("user:ann"),
        )
        .await
        .unwrap();
    let id = saved["saved"]["id"].as_i64().unwrap();
    let found = remote
        .call(
            "memory__search",
            json!({"query": "lighthouse"}),
            ctx("user:ann"),
        )
        .await
        .unwrap();
    assert_eq!(found["results"][0]["id"], json!(id));
    // The scope travels in the call context: another user sees nothing.
    let other = remote
        .call(
            "memory__search",
            json!({"query": "lighthouse"}),
            ctx("user:bob"),
        )
        .await
        .unwrap();
    assert_eq!(other["results"], json!([]));
    // Errors come back as clear tool errors, not transport failures.
    let e = remote
        .call(
            "memory__update",
            json!({"id": id + 1000, "content": "x"}),
            ctx("user:ann"),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not found"), "{e}");
    let e = remote
        .call(
            "memory__search",
            json!({"query": "x", "limit": 1000}),
            ctx("user:ann"),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
