//! The `omicos-web` binary: config from the environment and a file, the
//! "listening on" line, and a bad key refused by name.

use crate::support::serve;
use axum::{Router, routing::get};
use omicos_toolkit::{CallCtx, Provider, remote::RemoteProvider};
use serde_json::json;
use std::{process::Stdio, time::Duration};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn binary_serves_the_provider() {
    let page = serve(
        Router::new()
            .route("/", get(|| async { "from the binary" }))
            .route("/big", get(|| async { "b".repeat(5000) })),
    )
    .await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .env("OMICOS_LISTEN", "127.0.0.1:0")
        .env("OMICOS_REGISTRY", "")
        .env("OMICOS_WEB_ALLOW", "127.0.0.1/32, localhost")
        .env("OMICOS_WEB_MAX_BODY_BYTES", "1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let endpoint = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    let remote = RemoteProvider::connect(&endpoint).await.unwrap();
    let ctx = CallCtx::for_test(std::env::temp_dir(), "s-bin");
    let v = remote
        .call(
            "web_fetch",
            json!({"url": format!("http://{page}/")}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(v["content"], "from the binary");
    // The environment reached the config: localhost is allowlisted, the cap is 1000 bytes.
    let v = remote
        .call(
            "web_fetch",
            json!({"url": format!("http://localhost:{}/", page.port())}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(v["content"], "from the binary");
    let err = remote
        .call(
            "web_fetch",
            json!({"url": format!("http://{page}/big")}),
            ctx,
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("over the cap of 1000 bytes"),
        "{err}"
    );
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

#[tokio::test]
async fn bad_config_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, "web:\n  max_redirects: 9\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .arg("--config")
        .arg(&file)
        .output()
        .await
        .unwrap();
    // A config error: exit code 2 and one line that names the service and the key.
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim_end(),
        "omicos-web: config key `web.max_redirects`: 9 is more than the 5 redirects that are followed"
    );
    std::fs::write(&file, "web:\n  search:\n    backnd: brave\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .arg("--config")
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("web.search.backnd") && err.contains("unknown key"),
        "{err}"
    );
    // A failure while starting (the address cannot be bound) exits 1, one line.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .env("OMICOS_LISTEN", "256.0.0.1:0")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("omicos-web: cannot listen on 256.0.0.1:0"),
        "{err}"
    );
}

#[tokio::test]
async fn old_key_names_still_work_and_warn_once_naming_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, "grace_seconds: 1\nweb:\n  total_timeout_ms: 4000\n").unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .arg("--config")
        .arg(&file)
        .env("OMICOS_LISTEN", "127.0.0.1:0")
        .env("OMICOS_REGISTRY", "")
        .env("OMICOS_WEB_READ_TIMEOUT_MS", "3000")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
    let mut err = String::new();
    use tokio::io::AsyncReadExt;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    for (old, new) in [
        ("config key `grace_seconds`", "`shutdown_grace`"),
        ("config key `web.total_timeout_ms`", "`web.total_timeout`"),
        (
            "environment variable OMICOS_WEB_READ_TIMEOUT_MS",
            "OMICOS_WEB_READ_TIMEOUT",
        ),
    ] {
        let hits: Vec<&str> = err.lines().filter(|l| l.contains(old)).collect();
        assert_eq!(hits.len(), 1, "one warning for {old}: {err}");
        assert!(
            hits[0].contains("WARN") && hits[0].contains("deprecated") && hits[0].contains(new),
            "{err}"
        );
    }
}
