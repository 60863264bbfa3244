//! omicos's streamable-HTTP MCP endpoint, spoken to over plain HTTP.

use async_trait::async_trait;
use omicos_mcp::ToolBackend;
use omicos_proto::{
    ExecuteApproval, ExecuteServerMessage, ExecuteStart, PermissionMode, ToolResult, ToolSpec,
};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A backend with no tools: the session machinery is what is tested here.
struct NoTools;

#[async_trait]
impl ToolBackend for NoTools {
    async fn list_tools(&self, _: &[String], _: PermissionMode) -> Result<Vec<ToolSpec>, String> {
        Ok(vec![])
    }
    async fn execute(
        &self,
        start: ExecuteStart,
        _: mpsc::Sender<ExecuteServerMessage>,
        _: mpsc::Receiver<ExecuteApproval>,
        _: CancellationToken,
    ) -> ToolResult {
        ToolResult {
            call_id: start.call_id,
            ..Default::default()
        }
    }
}

async fn serve(backend: Arc<dyn ToolBackend>) -> String {
    let cfg = omicos_mcp::ServeConfig::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        omicos_mcp::serve::serve_http(backend, &cfg, l, CancellationToken::new()).await
    });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn a_session_delete_answers_no_content() {
    let url = serve(Arc::new(NoTools)).await;
    let http = reqwest::Client::new();
    let init = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "delete-test", "version": "1"}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert!(init.status().is_success(), "{}", init.status());
    let session = init
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned();
    let _ = init.text().await;
    let del = http
        .delete(&url)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    // The Python SDK 2.x takes only 200 and 204 as a closed session.
    assert!(
        del.status() == 204 || del.status() == 200,
        "DELETE answered {}",
        del.status()
    );
    // The session is gone.
    let after = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 404, "{}", after.status());
}
