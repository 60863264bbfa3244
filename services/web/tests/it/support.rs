//! Real HTTP servers on 127.0.0.1 and providers configured for them.

use axum::Router;
use omicos_toolkit::{CallCtx, Provider, ToolError};
use omicos_web::{WebConfig, WebProvider, ssrf::Lookup};
use serde_json::Value;
use std::{net::SocketAddr, sync::Arc, time::Duration};

/// Serves `app` on 127.0.0.1 (a free port) until the test process ends.
pub async fn serve(app: Router) -> SocketAddr {
    serve_on("127.0.0.1:0", app).await
}

/// Serves `app` on `addr`.
pub async fn serve_on(addr: &str, app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// A config with 127.0.0.1 allowlisted and short timeouts.
pub fn loopback_cfg() -> WebConfig {
    WebConfig {
        allow: vec!["127.0.0.1/32".into()],
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(5),
        total_timeout: Duration::from_secs(20),
        ..WebConfig::default()
    }
}

/// A provider for `cfg` with the system resolver and no search keys from the environment.
pub fn provider(cfg: &WebConfig) -> WebProvider {
    WebProvider::with_parts(cfg, &[], Arc::new(omicos_web::ssrf::SystemLookup)).unwrap()
}

/// A provider whose names resolve through `lookup`.
pub fn provider_with_lookup(cfg: &WebConfig, lookup: Arc<dyn Lookup>) -> WebProvider {
    WebProvider::with_parts(cfg, &[], lookup).unwrap()
}

/// Calls `tool` as the runner would: validation, then the call.
pub async fn call(p: &WebProvider, tool: &str, args: Value) -> Result<Value, ToolError> {
    let ctx = CallCtx::for_test(std::env::temp_dir(), "s1");
    p.validate_input(tool, &args, &ctx)?;
    p.call(tool, args, ctx).await
}

/// The error message of a call that must fail.
pub async fn call_err(p: &WebProvider, tool: &str, args: Value) -> String {
    match call(p, tool, args.clone()).await {
        Ok(v) => panic!("{tool} {args} should fail, got {v}"),
        Err(e) => e.to_string(),
    }
}
