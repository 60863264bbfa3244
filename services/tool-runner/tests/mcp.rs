//! MCP servers in the runner's pipeline (the npm reference server-filesystem),
//! and the runner's tools served over MCP, checked with the official
//! TypeScript SDK client (installed by scripts/mcp-servers.sh).

use omicos_mcp::ServerConfig;
use omicos_proto::{
    Decision, ExecuteApproval, ExecuteServerMessage, PermissionMode, execute_server_message::Msg,
};
use omicos_tool_runner::config::{HookHandler, HookMatcher};
use omicos_tool_runner::pipeline::CallerRules;
use omicos_tool_runner::pipeline::permission::Legacy;
use omicos_tool_runner::{CallIo, CallOutcome, CallRequest, Config, Pipeline};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn servers_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp-servers");
    assert!(
        d.join("node_modules/.bin/mcp-server-filesystem").exists(),
        "the MCP reference servers are not installed: run scripts/mcp-servers.sh"
    );
    d.canonicalize().unwrap()
}

fn fs_server(root: &Path) -> ServerConfig {
    ServerConfig {
        name: "fs".into(),
        command: Some(
            servers_dir()
                .join("node_modules/.bin/mcp-server-filesystem")
                .display()
                .to_string(),
        ),
        args: vec![root.display().to_string()],
        ..Default::default()
    }
}

async fn pipeline(dir: &Path, f: impl FnOnce(&mut Config)) -> Pipeline {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws = ws.canonicalize().unwrap();
    let mut cfg = Config {
        workspace: ws.clone(),
        approval_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    cfg.mcp.servers = vec![fs_server(&ws)];
    f(&mut cfg);
    omicos_tool_runner::mcp::build_with_mcp(&cfg, vec![], CancellationToken::new())
        .await
        .unwrap()
}

fn req(tool: &str, args: Value, mode: PermissionMode) -> CallRequest {
    CallRequest {
        call_id: "call_1".into(),
        tool_name: tool.into(),
        arguments: args.to_string(),
        session_id: "s1".into(),
        agent_id: "tester".into(),
        permission_mode: mode as i32,
        ..Default::default()
    }
}

async fn with_approval(
    p: &Pipeline,
    r: CallRequest,
    answer: Option<Decision>,
) -> (CallOutcome, Vec<ExecuteServerMessage>) {
    let (ev_tx, mut ev_rx) = mpsc::channel(64);
    let (ap_tx, ap_rx) = mpsc::channel(8);
    let io = CallIo {
        events: Some(ev_tx),
        approvals: Some(ap_rx),
        cancel: Default::default(),
    };
    let p2 = p.clone();
    let task = tokio::spawn(async move { p2.execute(r, io).await });
    let mut seen = Vec::new();
    while let Some(m) = ev_rx.recv().await {
        if let (Some(Msg::ApprovalRequired(a)), Some(d)) = (&m.msg, answer) {
            ap_tx
                .send(ExecuteApproval {
                    call_id: a.call_id.clone(),
                    decision: d as i32,
                    rule: String::new(),
                })
                .await
                .unwrap();
        }
        seen.push(m);
    }
    (task.await.unwrap(), seen)
}

fn names(p: &Pipeline, toolsets: &[&str], mode: PermissionMode) -> Vec<String> {
    let ts: Vec<String> = toolsets.iter().map(|s| s.to_string()).collect();
    p.list_tools(&ts, mode as i32, Legacy::default(), &CallerRules::default())
        .unwrap()
        .0
        .into_iter()
        .map(|t| t.name)
        .collect()
}

#[tokio::test]
async fn filesystem_read_tools_run_write_tools_are_asked_in_auto_and_hidden_in_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), |_| {}).await;
    std::fs::write(p.workspace().join("notes.txt"), "hello from the workspace").unwrap();

    // Listed and filtered by mode like any other tool; toolsets mcp:fs and mcp.
    let ro = names(&p, &["mcp:fs"], PermissionMode::ReadOnly);
    assert!(
        ro.contains(&"mcp__fs__read_text_file".to_string()),
        "{ro:?}"
    );
    assert!(
        ro.contains(&"mcp__fs__list_directory".to_string()),
        "{ro:?}"
    );
    assert!(
        !ro.contains(&"mcp__fs__write_file".to_string()),
        "write tools hidden in read_only: {ro:?}"
    );
    assert!(ro.iter().all(|n| n.starts_with("mcp__fs__")), "{ro:?}");
    let auto = names(&p, &["mcp"], PermissionMode::Auto);
    assert!(
        auto.contains(&"mcp__fs__write_file".to_string()),
        "{auto:?}"
    );
    assert!(
        names(&p, &["file_manager"], PermissionMode::Full)
            .iter()
            .all(|n| !n.starts_with("mcp__"))
    );

    // A read-only tool runs without asking.
    let root = p.workspace().display().to_string();
    let path = format!("{root}/notes.txt");
    let (o, msgs) = with_approval(
        &p,
        req(
            "mcp__fs__read_text_file",
            json!({"path": path}),
            PermissionMode::Auto,
        ),
        None,
    )
    .await;
    assert_eq!(o.result.status().as_str(), "done", "{}", o.result.result);
    assert!(
        o.result.result.contains("hello from the workspace"),
        "{}",
        o.result.result
    );
    assert!(
        msgs.iter()
            .all(|m| !matches!(m.msg, Some(Msg::ApprovalRequired(_))))
    );

    // A write tool is asked in auto mode; allowed, it runs.
    let out = format!("{root}/written.txt");
    let (o, msgs) = with_approval(
        &p,
        req(
            "mcp__fs__write_file",
            json!({"path": out, "content": "via mcp"}),
            PermissionMode::Auto,
        ),
        Some(Decision::AllowOnce),
    )
    .await;
    assert_eq!(o.result.status().as_str(), "done", "{}", o.result.result);
    let asked: Vec<_> = msgs
        .iter()
        .filter_map(|m| match &m.msg {
            Some(Msg::ApprovalRequired(a)) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].tool_name, "mcp__fs__write_file");
    assert_eq!(
        std::fs::read_to_string(p.workspace().join("written.txt")).unwrap(),
        "via mcp"
    );

    // Denied, it does not run.
    let (o, _) = with_approval(
        &p,
        req(
            "mcp__fs__write_file",
            json!({"path": format!("{root}/denied.txt"), "content": "x"}),
            PermissionMode::Auto,
        ),
        Some(Decision::Deny),
    )
    .await;
    assert_eq!(o.result.status().as_str(), "error");
    assert!(!p.workspace().join("denied.txt").exists());

    // In read_only it is refused.
    let (o, _) = with_approval(
        &p,
        req(
            "mcp__fs__write_file",
            json!({"path": format!("{root}/ro.txt"), "content": "x"}),
            PermissionMode::ReadOnly,
        ),
        None,
    )
    .await;
    assert!(o.result.result.contains("read_only"), "{}", o.result.result);
    assert!(!p.workspace().join("ro.txt").exists());
}

#[tokio::test]
async fn hooks_match_mcp_tool_names_and_overrides_set_the_risk() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), |c| {
        c.hooks.pre_tool_use = vec![HookMatcher {
            matcher: "mcp__fs__.*".into(),
            hooks: vec![HookHandler::command(
                r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"no MCP today"}}'"#,
            )],
        }];
        c.mcp.servers[0].tool_risk.insert("list_allowed_directories".into(), "shell".into());
    })
    .await;
    let (o, _) = with_approval(
        &p,
        req(
            "mcp__fs__list_allowed_directories",
            json!({}),
            PermissionMode::Full,
        ),
        None,
    )
    .await;
    assert!(
        o.result.result.contains("no MCP today"),
        "{}",
        o.result.result
    );
    let ro = names(&p, &["mcp:fs"], PermissionMode::ReadOnly);
    assert!(
        !ro.contains(&"mcp__fs__list_allowed_directories".to_string()),
        "overridden to shell: {ro:?}"
    );
}

fn node_client(plan: Value) -> Value {
    let out = std::process::Command::new("node")
        .arg(servers_dir().join("fixtures/client.mjs"))
        .arg(plan.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the TS SDK client failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

async fn serve_http(p: &Pipeline, mode: &str) -> String {
    let cfg = omicos_mcp::ServeConfig {
        permission_mode: mode.into(),
        ..Default::default()
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let backend = Arc::new(omicos_tool_runner::mcp::PipelineBackend(p.clone()));
    tokio::spawn(async move {
        omicos_mcp::serve::serve_http(backend, &cfg, l, CancellationToken::new()).await
    });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn omicos_served_over_streamable_http_to_the_typescript_sdk_client() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), |_| {}).await;
    std::fs::write(p.workspace().join("a.txt"), "alpha").unwrap();

    // read_only: write tools are not offered, read tools run.
    let url = serve_http(&p, "read_only").await;
    let r = tokio::task::spawn_blocking(move || {
        node_client(json!({"http": url, "calls": [{"name": "file_manager__read", "arguments": {"path": "a.txt"}}]}))
    })
    .await
    .unwrap();
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"file_manager__read") && tools.contains(&"mcp__fs__read_text_file"),
        "{tools:?}"
    );
    assert!(
        !tools.contains(&"file_manager__write") && !tools.contains(&"shell"),
        "{tools:?}"
    );
    let read = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "file_manager__read")
        .unwrap();
    assert_eq!(read["readOnlyHint"], true);
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    assert!(
        r["results"][0]["text"].as_str().unwrap().contains("alpha"),
        "{r}"
    );

    // auto: the approval becomes an elicitation; accepted, the write runs.
    let url = serve_http(&p, "auto").await;
    let r = tokio::task::spawn_blocking(move || {
        node_client(json!({"http": url, "elicitation": "accept",
            "calls": [{"name": "file_manager__write", "arguments": {"path": "b.txt", "content": "beta"}}]}))
    })
    .await
    .unwrap();
    assert_eq!(r["elicitations"], 1, "{r}");
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    assert_eq!(
        std::fs::read_to_string(p.workspace().join("b.txt")).unwrap(),
        "beta"
    );

    // Declined: refused, nothing written.
    let url = serve_http(&p, "auto").await;
    let r = tokio::task::spawn_blocking(move || {
        node_client(json!({"http": url, "elicitation": "decline",
            "calls": [{"name": "file_manager__write", "arguments": {"path": "c.txt", "content": "x"}}]}))
    })
    .await
    .unwrap();
    assert_eq!(r["results"][0]["isError"], true, "{r}");
    assert!(!p.workspace().join("c.txt").exists());

    // A client that cannot be asked gets a clear refusal.
    let url = serve_http(&p, "auto").await;
    let r = tokio::task::spawn_blocking(move || {
        node_client(json!({"http": url,
            "calls": [{"name": "file_manager__write", "arguments": {"path": "d.txt", "content": "x"}}]}))
    })
    .await
    .unwrap();
    assert_eq!(r["elicitations"], 0);
    assert_eq!(r["results"][0]["isError"], true, "{r}");
    assert_eq!(
        r["results"][0]["text"],
        omicos_mcp::serve::NO_ELICITATION_REFUSAL,
        "{r}"
    );
    assert!(!p.workspace().join("d.txt").exists());
}

#[tokio::test]
async fn served_tools_carry_the_output_schema_and_structured_content() {
    let dir = tempfile::tempdir().unwrap();
    let everything = ServerConfig {
        name: "everything".into(),
        command: Some(
            servers_dir()
                .join("node_modules/.bin/mcp-server-everything")
                .display()
                .to_string(),
        ),
        args: vec!["stdio".into()],
        startup_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let p = pipeline(dir.path(), |c| c.mcp.servers.push(everything)).await;
    let url = serve_http(&p, "read_only").await;
    let tool = "mcp__everything__get-structured-content";
    let r = tokio::task::spawn_blocking(move || {
        node_client(json!({"http": url, "calls": [
            {"name": tool, "arguments": {"location": "Chicago"}},
            {"name": "file_manager__list", "arguments": {}}]}))
    })
    .await
    .unwrap();
    let listed = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == tool)
        .unwrap_or_else(|| panic!("no {tool}: {r}"));
    let props = &listed["outputSchema"]["properties"];
    assert!(
        props["temperature"].is_object() && props["humidity"].is_object(),
        "{listed}"
    );
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    let sc = &r["results"][0]["structuredContent"];
    assert_eq!(sc["temperature"], 36, "{r}");
    assert_eq!(sc["conditions"], "Light rain / drizzle", "{r}");
    // A tool without an output schema stays without both.
    let plain = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "file_manager__list")
        .unwrap();
    assert!(plain["outputSchema"].is_null(), "{plain}");
    assert!(r["results"][1]["structuredContent"].is_null(), "{r}");
}

fn python_client(plan: Value) -> Value {
    let python = std::env::var("OMICOS_KERNEL_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .arg(servers_dir().join("fixtures/client.py"))
        .arg(plan.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python SDK client failed (it needs `pip install 'mcp>=2'`): {}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test]
async fn an_approval_reaches_a_2026_07_28_client_as_an_input_required_result() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), |_| {}).await;
    let write = |path: &str| json!([{"name": "file_manager__write", "arguments": {"path": path, "content": "x"}}]);

    // Accepted: the client retries with the answer, and the write runs.
    let url = serve_http(&p, "auto").await;
    let calls = write("a.txt");
    let r = tokio::task::spawn_blocking(move || {
        python_client(
            json!({"http": url, "mode": "2026-07-28", "elicitation": "accept", "calls": calls}),
        )
    })
    .await
    .unwrap();
    assert_eq!(r["protocol"], "2026-07-28", "{r}");
    assert_eq!(r["elicitations"], 1, "{r}");
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    assert_eq!(
        std::fs::read_to_string(p.workspace().join("a.txt")).unwrap(),
        "x"
    );

    // Declined: refused, nothing written.
    let url = serve_http(&p, "auto").await;
    let calls = write("b.txt");
    let r = tokio::task::spawn_blocking(move || {
        python_client(
            json!({"http": url, "mode": "2026-07-28", "elicitation": "decline", "calls": calls}),
        )
    })
    .await
    .unwrap();
    assert_eq!(r["elicitations"], 1, "{r}");
    assert_eq!(r["results"][0]["isError"], true, "{r}");
    assert!(!p.workspace().join("b.txt").exists());

    // A 2026-07-28 client that cannot be asked: the refusal says so.
    let url = serve_http(&p, "auto").await;
    let calls = write("c.txt");
    let r = tokio::task::spawn_blocking(move || {
        python_client(json!({"http": url, "mode": "2026-07-28", "calls": calls}))
    })
    .await
    .unwrap();
    assert_eq!(r["results"][0]["isError"], true, "{r}");
    assert_eq!(
        r["results"][0]["text"],
        omicos_mcp::serve::NO_ELICITATION_REFUSAL,
        "{r}"
    );
    assert!(!p.workspace().join("c.txt").exists());

    // The same client on the handshake-era protocol keeps the elicitation.
    let url = serve_http(&p, "auto").await;
    let calls = write("d.txt");
    let r = tokio::task::spawn_blocking(move || {
        python_client(
            json!({"http": url, "mode": "legacy", "elicitation": "accept", "calls": calls}),
        )
    })
    .await
    .unwrap();
    assert_ne!(r["protocol"], "2026-07-28", "{r}");
    assert_eq!(r["elicitations"], 1, "{r}");
    assert_eq!(r["results"][0]["isError"], false, "{r}");
    assert!(p.workspace().join("d.txt").exists());
}
