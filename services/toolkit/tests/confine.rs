//! A provider works in the workspace it was configured with, never in one the
//! caller names (issue 14, the kernel's `context.workspace: "/"` attack): over
//! real gRPC, a call naming `/` or another directory still runs in the
//! provider's root, a tenant runs in `<root>/<tenant>/`, and a tenant that is
//! not a plain name is refused before the provider sees the call.

use async_trait::async_trait;
use omicos_proto::{
    CallContext, CallToolRequest, call_tool_event, tool_provider_client::ToolProviderClient,
};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{CallCtx, Provider, ProviderHosting, ToolError, ToolSpec, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Answers with the workspace, scope and tenant the call ran with.
struct Where;

#[async_trait]
impl Provider for Where {
    fn name(&self) -> &str {
        "where"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![tool("where", "where am I", json!({"type":"object"})).build()]
    }
    async fn call(&self, _tool: &str, _args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(json!({
            "workspace": ctx.workspace.display().to_string(),
            "scope": ctx.scope,
            "tenant": ctx.tenant,
        }))
    }
}

async fn call(
    c: &mut ToolProviderClient<tonic::transport::Channel>,
    workspace: &str,
    tenant: &str,
) -> Result<Value, tonic::Status> {
    let mut s = c
        .call_tool(CallToolRequest {
            tool: "where".into(),
            arguments_json: "{}".into(),
            context: Some(CallContext {
                session_id: "s1".into(),
                scope: "workspace".into(),
                workspace: workspace.into(),
                tenant: tenant.into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    while let Some(ev) = s.message().await? {
        if let Some(call_tool_event::Event::Result(r)) = ev.event {
            assert!(!r.is_error, "{}", r.value_json);
            return Ok(serde_json::from_str(&r.value_json).unwrap());
        }
    }
    panic!("no result");
}

#[tokio::test]
async fn the_caller_never_names_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().to_path_buf();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new(Duration::from_millis(200));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: root_path.clone(),
        ttl_seconds: 0,
    };
    tokio::spawn(omicos_toolkit::serve_provider_with(
        Arc::new(Where),
        listener,
        hosting,
        "",
        shutdown.clone(),
    ));
    let mut c = loop {
        if let Ok(c) = ToolProviderClient::connect(addr.clone()).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let root_s = root_path.display().to_string();
    for named in ["/", "/etc", "", "/tmp/other-workspace"] {
        let v = call(&mut c, named, "").await.unwrap();
        assert_eq!(v["workspace"], root_s.as_str(), "named {named:?}: {v}");
    }
    let v = call(&mut c, "/", "default").await.unwrap();
    assert_eq!(v["workspace"], root_s.as_str());
    let v = call(&mut c, "/", "acme").await.unwrap();
    assert_eq!(
        v["workspace"],
        root_path
            .join(".omicos/tenants/acme")
            .display()
            .to_string()
            .as_str()
    );
    assert_eq!(v["tenant"], "acme");
    assert!(root_path.join(".omicos/tenants/acme").is_dir());
    for bad in ["..", "../acme", "a/b", "/"] {
        let e = call(&mut c, "", bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert!(e.message().contains("tenant"), "{}", e.message());
    }
    // Only the tenant's directory was made, inside the root's state.
    let made: Vec<String> = std::fs::read_dir(root_path.join(".omicos/tenants"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(made, vec!["acme".to_owned()]);
    shutdown.trigger();
}
