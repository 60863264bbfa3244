//! The MCP provider against the official reference servers from npm
//! (installed by scripts/mcp-servers.sh into tests/mcp-servers/node_modules)
//! and a small misbehaving server built on the TypeScript SDK.

use omicos_mcp::{McpConfig, McpProvider, ServerConfig};
use omicos_proto::Risk;
use omicos_toolkit::{CallCtx, EventSink, Provider, ProviderEvent, ToolError};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

fn servers_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp-servers");
    assert!(
        d.join("node_modules/.bin/mcp-server-everything").exists(),
        "the MCP reference servers are not installed: run scripts/mcp-servers.sh"
    );
    d.canonicalize().unwrap()
}

fn bin(name: &str) -> String {
    servers_dir()
        .join("node_modules/.bin")
        .join(name)
        .display()
        .to_string()
}

fn everything_stdio() -> ServerConfig {
    ServerConfig {
        name: "everything".into(),
        command: Some(bin("mcp-server-everything")),
        args: vec!["stdio".into()],
        ..Default::default()
    }
}

fn misbehaving(name: &str, env: &[(&str, &str)]) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        command: Some("node".into()),
        args: vec![
            servers_dir()
                .join("fixtures/misbehaving.mjs")
                .display()
                .to_string(),
        ],
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        startup_timeout: Duration::from_secs(20),
        // A confined server (per_session by default) reads its own install.
        sandbox_read: vec![servers_dir()],
        ..Default::default()
    }
}

async fn provider(
    servers: Vec<ServerConfig>,
    dir: &std::path::Path,
) -> (Arc<McpProvider>, Arc<AtomicUsize>) {
    let changes = Arc::new(AtomicUsize::new(0));
    let c = changes.clone();
    let cfg = McpConfig {
        servers,
        ..Default::default()
    };
    cfg.validate().unwrap();
    let sandbox = omicos_sandbox::Sandbox::shared(omicos_sandbox::SandboxConfig::default())
        .map_err(|e| e.to_string());
    let p = McpProvider::start_with(
        &cfg,
        dir,
        sandbox,
        Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }),
    )
    .await;
    (p, changes)
}

fn ctx(dir: &std::path::Path) -> (CallCtx, mpsc::Receiver<ProviderEvent>) {
    let (tx, rx) = mpsc::channel(64);
    let mut c = CallCtx::for_test(dir, "sess-1");
    c.events = EventSink::new(tx);
    (c, rx)
}

fn spec<'a>(p: &'a [omicos_proto::ToolSpec], name: &str) -> &'a omicos_proto::ToolSpec {
    p.iter().find(|t| t.name == name).unwrap_or_else(|| {
        panic!(
            "no tool {name} in {:?}",
            p.iter().map(|t| &t.name).collect::<Vec<_>>()
        )
    })
}

#[tokio::test]
async fn everything_over_stdio_echo_sum_image_progress_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = provider(vec![everything_stdio()], dir.path()).await;
    assert!(p.errors().is_empty(), "{:?}", p.errors());
    let tools = p.tools();
    let echo = spec(&tools, "mcp__everything__echo");
    assert_eq!(echo.risk, Risk::Read as i32, "echo is readOnlyHint: true");
    assert_eq!(echo.toolset, "mcp:everything");
    assert_eq!(echo.provider, "mcp");
    let schema: Value = serde_json::from_str(&echo.input_schema_json).unwrap();
    assert!(schema["properties"]["message"].is_object(), "{schema}");
    // A tool without readOnlyHint takes the server default (file_write).
    assert_eq!(
        spec(&tools, "mcp__everything__toggle-simulated-logging").risk,
        Risk::FileWrite as i32
    );

    let (c, _) = ctx(dir.path());
    let v = p
        .call(
            "mcp__everything__echo",
            json!({"message": "hello mcp"}),
            c.clone(),
        )
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: hello mcp"));
    let v = p
        .call(
            "mcp__everything__get-sum",
            json!({"a": 2, "b": 40}),
            c.clone(),
        )
        .await
        .unwrap();
    assert!(v.as_str().unwrap().contains("42"), "{v}");

    // The tiny image is saved under the session's outputs.
    let v = p
        .call("mcp__everything__get-tiny-image", json!({}), c.clone())
        .await
        .unwrap();
    let img = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block");
    let path = img["path"].as_str().unwrap();
    assert!(
        path.starts_with(".omicos/outputs/sess-1/") && path.ends_with(".png"),
        "{path}"
    );
    let bytes = std::fs::read(dir.path().join(path)).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");

    // Structured content and resource links are kept.
    let v = p
        .call(
            "mcp__everything__get-structured-content",
            json!({"location": "New York"}),
            c.clone(),
        )
        .await
        .unwrap();
    assert!(v["structured_content"].is_object(), "{v}");
    let v = p
        .call(
            "mcp__everything__get-resource-links",
            json!({"count": 2}),
            c.clone(),
        )
        .await
        .unwrap();
    let links = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "resource_link")
        .count();
    assert_eq!(links, 2, "{v}");

    // Progress notifications become tool_progress events.
    let (c2, mut rx) = ctx(dir.path());
    let v = p
        .call(
            "mcp__everything__trigger-long-running-operation",
            json!({"duration": 1, "steps": 4}),
            c2,
        )
        .await
        .unwrap();
    assert!(v.as_str().unwrap().contains("completed"), "{v}");
    let mut progress = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let ProviderEvent::Progress(pr) = ev {
            progress.push(pr);
        }
    }
    assert_eq!(progress.len(), 4, "{progress:?}");
    assert_eq!(progress[3].current, 4.0);
    assert_eq!(progress[3].total, 4.0);
    assert!(progress[3].done && progress[0].percent == 25.0);

    // A cancel mid-operation returns at once (notifications/cancelled sent),
    // and the server keeps serving.
    let (c3, _) = ctx(dir.path());
    let cancel = c3.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let t = Instant::now();
    let e = p
        .call(
            "mcp__everything__trigger-long-running-operation",
            json!({"duration": 20, "steps": 20}),
            c3,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Cancelled), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        t.elapsed()
    );
    let v = p
        .call("mcp__everything__echo", json!({"message": "still here"}), c)
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: still here"));
}

#[tokio::test]
async fn everything_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::new(bin("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server-everything (HTTP) did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cfg = ServerConfig {
        name: "ev-http".into(),
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        bearer_token: Some("test-token".into()),
        ..Default::default()
    };
    let (p, _) = provider(vec![cfg], dir.path()).await;
    assert!(p.errors().is_empty(), "{:?}", p.errors());
    let (c, mut rx) = ctx(dir.path());
    let v = p
        .call(
            "mcp__ev-http__echo",
            json!({"message": "over http"}),
            c.clone(),
        )
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: over http"));
    let v = p
        .call("mcp__ev-http__get-sum", json!({"a": 1, "b": 2}), c.clone())
        .await
        .unwrap();
    assert!(v.as_str().unwrap().contains('3'), "{v}");
    let v = p
        .call("mcp__ev-http__get-tiny-image", json!({}), c.clone())
        .await
        .unwrap();
    assert!(
        v["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["type"] == "image" && b["path"].is_string()),
        "{v}"
    );
    let v = p
        .call(
            "mcp__ev-http__trigger-long-running-operation",
            json!({"duration": 0.6, "steps": 3}),
            c.clone(),
        )
        .await
        .unwrap();
    assert!(v.as_str().unwrap().contains("completed"));
    let n = std::iter::from_fn(|| rx.try_recv().ok())
        .filter(|e| matches!(e, ProviderEvent::Progress(_)))
        .count();
    assert_eq!(n, 3);
    let (c3, _) = ctx(dir.path());
    let cancel = c3.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let e = p
        .call(
            "mcp__ev-http__trigger-long-running-operation",
            json!({"duration": 20, "steps": 20}),
            c3,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Cancelled), "{e}");
    let _ = child.kill().await;
}

#[tokio::test]
async fn a_server_that_crashes_mid_call_fails_the_call_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = provider(vec![misbehaving("bad", &[])], dir.path()).await;
    assert!(p.errors().is_empty(), "{:?}", p.errors());
    let (c, _) = ctx(dir.path());
    let pid1 = p.call("mcp__bad__pid", json!({}), c.clone()).await.unwrap();
    let e = p
        .call("mcp__bad__crash", json!({}), c.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`bad`") && e.contains("exited") && e.contains("restarted on the next call"),
        "{e}"
    );
    let pid2 = p.call("mcp__bad__pid", json!({}), c.clone()).await.unwrap();
    assert_ne!(pid1, pid2, "the next call runs on a new process");
}

#[tokio::test]
async fn a_server_that_never_starts_is_reported_and_the_others_serve() {
    let dir = tempfile::tempdir().unwrap();
    let silent = ServerConfig {
        name: "silent".into(),
        command: Some("sleep".into()),
        args: vec!["60".into()],
        startup_timeout: Duration::from_millis(800),
        ..Default::default()
    };
    let missing = ServerConfig {
        name: "missing".into(),
        command: Some("/nonexistent/mcp-server".into()),
        ..Default::default()
    };
    let t = Instant::now();
    let (p, _) = provider(vec![silent, missing, everything_stdio()], dir.path()).await;
    assert!(t.elapsed() < Duration::from_secs(20));
    let errors = p.errors();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("`silent`") && errors[0].contains("did not start within 800ms"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("`missing`") && errors[1].contains("cannot start"),
        "{errors:?}"
    );
    assert!(
        p.tools()
            .iter()
            .all(|t| t.name.starts_with("mcp__everything__"))
    );
    let (c, _) = ctx(dir.path());
    assert!(
        p.call("mcp__everything__echo", json!({"message": "x"}), c.clone())
            .await
            .is_ok()
    );
    let e = p
        .call("mcp__silent__anything", json!({}), c)
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::UnknownTool(_)), "{e}");
}

#[tokio::test]
async fn colliding_tool_names_are_refused_at_load_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = provider(vec![misbehaving("clash", &[("COLLIDE", "1")])], dir.path()).await;
    let errors = p.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("`get.sum`")
            && errors[0].contains("`get_sum`")
            && errors[0].contains("mcp__clash__get_sum"),
        "{errors:?}"
    );
    assert!(p.tools().is_empty());
    // Disabling one of the two loads the server.
    let mut cfg = misbehaving("clash", &[("COLLIDE", "1")]);
    cfg.disabled_tools = vec!["get.sum".into()];
    let (p, _) = provider(vec![cfg], dir.path()).await;
    assert!(p.errors().is_empty(), "{:?}", p.errors());
    let (c, _) = ctx(dir.path());
    assert_eq!(
        p.call("mcp__clash__get_sum", json!({}), c).await.unwrap(),
        json!("b")
    );
}

#[tokio::test]
async fn tools_list_changed_refreshes_the_list_and_tells_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let (p, changes) = provider(vec![misbehaving("dyn", &[])], dir.path()).await;
    assert!(p.tools().iter().all(|t| t.name != "mcp__dyn__added_1"));
    let (c, _) = ctx(dir.path());
    p.call("mcp__dyn__add_tool", json!({}), c.clone())
        .await
        .unwrap();
    let t = Instant::now();
    while !p.tools().iter().any(|t| t.name == "mcp__dyn__added_1") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the new tool never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(changes.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        p.call("mcp__dyn__added_1", json!({}), c).await.unwrap(),
        json!("added_1 ran")
    );
}

#[tokio::test]
async fn per_session_servers_run_one_instance_per_session() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = misbehaving("ps", &[]);
    cfg.per_session = true;
    let (p, _) = provider(vec![cfg], dir.path()).await;
    let (mut a, _) = ctx(dir.path());
    let mut b = a.clone();
    a.session_id = "A".into();
    b.session_id = "B".into();
    let a1 = p.call("mcp__ps__pid", json!({}), a.clone()).await.unwrap();
    let a2 = p.call("mcp__ps__pid", json!({}), a).await.unwrap();
    let b1 = p.call("mcp__ps__pid", json!({}), b).await.unwrap();
    assert_eq!(a1, a2, "a session keeps its instance");
    assert_ne!(a1, b1, "another session gets its own");
}

#[tokio::test]
async fn the_call_timeout_cancels_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = misbehaving("slow", &[]);
    cfg.call_timeout = Duration::from_millis(300);
    let (p, _) = provider(vec![cfg], dir.path()).await;
    let (c, _) = ctx(dir.path());
    let e = p
        .call("mcp__slow__wait", json!({"ms": 5000}), c.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not answer within 300ms"), "{e}");
    assert_eq!(
        p.call("mcp__slow__wait", json!({"ms": 1}), c)
            .await
            .unwrap(),
        json!("waited 1")
    );
}

#[tokio::test]
async fn idle_per_session_instances_are_stopped_but_never_mid_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = misbehaving("ps", &[]);
    cfg.per_session = true;
    cfg.session_idle_timeout = Duration::from_secs(1);
    let (p, _) = provider(vec![cfg], dir.path()).await;
    let server = p.servers()[0].clone();
    let (mut a, _) = ctx(dir.path());
    a.session_id = "A".into();
    let first = p.call("mcp__ps__pid", json!({}), a.clone()).await.unwrap();
    assert_eq!(server.session_instances().await, 1);
    // A call longer than the idle timeout keeps its instance.
    assert_eq!(
        p.call("mcp__ps__wait", json!({"ms": 2500}), a.clone())
            .await
            .unwrap(),
        json!("waited 2500")
    );
    assert_eq!(
        p.call("mcp__ps__pid", json!({}), a.clone()).await.unwrap(),
        first,
        "the instance in use was not stopped"
    );
    // Unused, it is stopped within the timeout and a quarter of a check.
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.session_instances().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle instance was never stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The session's next call starts a fresh one.
    let again = p.call("mcp__ps__pid", json!({}), a).await.unwrap();
    assert_ne!(
        again, first,
        "a new instance after the idle one was stopped"
    );
}

/// The `sh` tool's answer: (status, stdout, stderr).
async fn sh(p: &McpProvider, c: &CallCtx, cmd: &str) -> (Option<i64>, String, String) {
    let v = p
        .call("mcp__box__sh", json!({ "cmd": cmd }), c.clone())
        .await
        .unwrap();
    let text = match &v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (
        r["status"].as_i64(),
        r["stdout"].as_str().unwrap_or_default().to_owned(),
        r["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

// A per-session server is hostile code like the shell: by default it runs in
// the session's box (workspace-write), and its session's end stops it with
// everything it started.
#[tokio::test]
async fn a_per_session_server_runs_in_the_sessions_box_and_ends_with_it() {
    let ci = matches!(std::env::var("CI").as_deref(), Ok("true" | "1"));
    let sandbox =
        omicos_sandbox::Sandbox::shared(omicos_sandbox::SandboxConfig::default()).unwrap();
    if sandbox.report().mode == omicos_sandbox::Mode::NoNamespaces {
        assert!(
            !ci,
            "no namespaces for the sandbox under CI: {:?}",
            sandbox.report().lines
        );
        eprintln!("SKIPPED: no namespaces ({:?})", sandbox.report().lines);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(ws.join(".omicos")).unwrap();
    std::fs::write(ws.join(".omicos/token"), "S3CRET-token").unwrap();
    let mut cfg = misbehaving("box", &[]);
    cfg.per_session = true;
    let (p, _) = provider(vec![cfg], &ws).await;
    let (mut a, _) = ctx(&ws);
    a.session_id = "A".into();
    // Not the runner's uid, none of its environment, none of omicos's state.
    let (_, uid, _) = sh(&p, &a, "id -u").await;
    if nix_is_root() {
        assert_ne!(uid.trim(), "0", "the server runs as root");
    }
    // SAFETY: set before the next box starts; nextest runs each test in its own process.
    unsafe { std::env::set_var("OMICOS_TEST_RUNNER_SECRET", "runner-secret-value") };
    let (_, env, _) = sh(&p, &a, "env").await;
    assert!(!env.contains("runner-secret-value"), "{env}");
    for attempt in [
        "cat .omicos/token",
        "cat $PWD/.omicos/token",
        // The hidden directory is an empty read-only mount: nothing listed.
        "test -n \"$(ls -A .omicos)\"",
        "touch /etc/omicos-mcp-escape",
        "touch /usr/omicos-mcp-escape",
    ] {
        let (status, out, err) = sh(&p, &a, attempt).await;
        assert_ne!(status, Some(0), "`{attempt}` worked: {out} {err}");
        assert!(!out.contains("S3CRET"), "`{attempt}`: {out}");
    }
    assert!(!std::path::Path::new("/etc/omicos-mcp-escape").exists());
    // It works in the workspace, as the session's shell does.
    let (status, _, err) = sh(&p, &a, "echo made-by-mcp > mcp.txt").await;
    assert_eq!(status, Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.join("mcp.txt")).unwrap(),
        "made-by-mcp\n"
    );
    // A background process that escapes its group: after the session ends,
    // nothing of it runs (the heartbeat file stops changing).
    let (status, _, err) = sh(
        &p,
        &a,
        "setsid sh -c 'while :; do date +%s%N > beat; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
    )
    .await;
    assert_eq!(status, Some(0), "{err}");
    let beat = ws.join("beat");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !beat.exists() {
        assert!(Instant::now() < deadline, "the heartbeat never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The runner ends a session in every provider: the MCP servers, then the
    // shell's sandbox (the same one) ends the session's boxes.
    assert_eq!(
        p.end_session("", "A").await,
        1,
        "one server instance stopped"
    );
    sandbox.end_session("", "A");
    assert_eq!(p.servers()[0].session_instances().await, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = std::fs::read_to_string(&beat).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        std::fs::read_to_string(&beat).unwrap(),
        before,
        "a process of the session's server outlived it"
    );
    // The session's next call starts a fresh server.
    let (status, _, _) = sh(&p, &a, "true").await;
    assert_eq!(status, Some(0));
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

#[tokio::test]
async fn a_failed_start_always_carries_the_servers_stderr() {
    let dir = tempfile::tempdir().unwrap();
    // The server says a lot on stderr, ends with why it failed, and exits:
    // the handshake fails at once, and the error must still carry its last words.
    for i in 0..20 {
        let marker = format!("boom-{i}-{}", std::process::id());
        let cfg = ServerConfig {
            name: "failing".into(),
            command: Some("sh".into()),
            args: vec![
                "-c".into(),
                format!("seq 1 300 | sed 's/^/noise /' >&2; echo {marker} >&2; exit 3"),
            ],
            startup_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let err = match omicos_mcp::client::Live::start(
            &cfg,
            dir.path(),
            None,
            omicos_mcp::client::Launch::Host,
        )
        .await
        {
            Ok(_) => panic!("a server that exits at start started"),
            Err(e) => e,
        };
        assert!(err.contains(&marker), "run {i}: {err}");
    }
}
