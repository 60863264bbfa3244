//! `omicos mcp serve` (stdio) checked with the official TypeScript SDK client
//! (tests/mcp-servers, installed by scripts/mcp-servers.sh): the stack starts
//! in process, the client lists the tools the mode allows and calls one
//! through the pipeline.

use serde_json::{Value, json};
use std::path::PathBuf;

#[test]
fn omicos_mcp_serve_over_stdio_with_the_typescript_sdk_client() {
    let servers = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp-servers");
    assert!(
        servers
            .join("node_modules/@modelcontextprotocol/sdk")
            .exists(),
        "the MCP test packages are not installed: run scripts/mcp-servers.sh"
    );
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello over mcp").unwrap();
    let plan = json!({
        "command": env!("CARGO_BIN_EXE_omicos"),
        "args": ["mcp", "serve", "--workspace", ws.path(), "--mode", "read_only"],
        "calls": [{"name": "file_manager__read", "arguments": {"path": "hello.txt"}}]
    });
    let out = std::process::Command::new("node")
        .arg(servers.join("fixtures/client.mjs"))
        .arg(plan.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&stdout).unwrap();
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"file_manager__read"), "{tools:?}");
    assert!(
        !tools.contains(&"shell") && !tools.contains(&"file_manager__write"),
        "read_only hides them: {tools:?}"
    );
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    assert!(
        r["results"][0]["text"]
            .as_str()
            .unwrap()
            .contains("hello over mcp"),
        "{r}"
    );
}
