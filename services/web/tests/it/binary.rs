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
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("web.max_redirects is 9"), "{err}");
    std::fs::write(&file, "web:\n  search:\n    backnd: brave\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-web"))
        .arg("--config")
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("web.search.backnd") && err.contains("unknown key"),
        "{err}"
    );
}
