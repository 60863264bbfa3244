//! The provider served over gRPC with `serve_provider`, called through `RemoteProvider`.

use crate::support::{loopback_cfg, serve};
use axum::{Router, http::header, routing::get};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{CallCtx, Provider, ProviderHosting, remote::RemoteProvider, serve_provider};
use omicos_web::WebProvider;
use serde_json::json;
use std::{sync::Arc, time::Duration};

#[tokio::test]
async fn web_tools_over_grpc() {
    let page = serve(Router::new().route(
        "/doc",
        get(|| async {
            (
                [(header::CONTENT_TYPE, "text/html")],
                "<html><head><title>Over the wire</title></head><body><article><h1>Over the wire</h1><p>This page travelled through the web provider, the gRPC service and back, and the paragraph is long enough for the readability pass to keep it as content.</p></article></body></html>",
            )
        }),
    ))
    .await;
    let provider = Arc::new(
        WebProvider::with_parts(
            &loopback_cfg(),
            &[],
            Arc::new(omicos_web::ssrf::SystemLookup),
        )
        .unwrap(),
    );
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
        provider,
        listener,
        hosting,
        shutdown.clone(),
    ));

    let remote = RemoteProvider::connect(&format!("http://{addr}"))
        .await
        .unwrap();
    assert_eq!(remote.name(), "web");
    let tools = remote.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["web_search", "web_fetch"]);
    assert!(
        tools
            .iter()
            .all(|t| t.toolset == "web" && t.risk == omicos_toolkit::Risk::Read as i32)
    );

    let ctx = CallCtx::for_test(std::env::temp_dir(), "s-grpc");
    let v = remote
        .call(
            "web_fetch",
            json!({"url": format!("http://{page}/doc")}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(v["title"], "Over the wire");
    assert!(
        v["content"]
            .as_str()
            .unwrap()
            .contains("travelled through the web provider"),
        "{v}"
    );
    let err = remote
        .call(
            "web_fetch",
            json!({"url": "http://[::ffff:169.254.169.254]/"}),
            ctx.clone(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "blocked: link-local address 169.254.169.254 embedded in IPv4-mapped IPv6 address ::ffff:169.254.169.254 (SSRF protection)"
    );
    let err = remote
        .call("web_search", json!({"query": "x"}), ctx)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("web_search is not configured"),
        "{err}"
    );

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
