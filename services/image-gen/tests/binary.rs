//! The `omicos-image-gen` binary as deployed: configured by environment only,
//! prints its address, serves the tool over gRPC, and drains on SIGTERM.

use axum::{Json, Router, http::HeaderMap, routing::post};
use omicos_toolkit::{CallCtx, Provider, remote::RemoteProvider};
use serde_json::{Value, json};
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

#[tokio::test]
async fn the_binary_serves_the_tool_configured_from_the_environment() {
    let auth = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = auth.clone();
    let app = Router::new().route(
        "/v1/images/generations",
        post(move |headers: HeaderMap, Json(body): Json<Value>| {
            let seen = seen.clone();
            async move {
                let a = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                seen.lock().unwrap().push(format!(
                    "{a} model={}",
                    body["model"].as_str().unwrap_or("")
                ));
                Json(json!({"data": [{"b64_json": PNG_B64}]}))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });

    let ws = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omicos-image-gen"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OMICOS_IMAGE_GEN_BASE_URL", &base)
        .env("OMICOS_IMAGE_GEN_MODEL", "fake-image-1")
        // No OMICOS_IMAGE_GEN_API_KEY: the OpenAI variable is the fallback.
        .env("OPENAI_API_KEY", "sk-from-openai-var")
        .env("OMICOS_WORKSPACE", ws.path())
        .env("OMICOS_SHUTDOWN_GRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let remote = RemoteProvider::connect(&addr).await.unwrap();
    assert_eq!(remote.name(), "image_gen");
    // An empty workspace in the call: the service's own (OMICOS_WORKSPACE) is used.
    let mut ctx = CallCtx::for_test("", "sess-bin");
    ctx.call_id = "call_bin".into();
    let v = remote
        .call(
            "image_gen__generate",
            json!({"prompt": "a cell atlas"}),
            ctx,
        )
        .await
        .unwrap();
    let rel = v["images"][0]["path"].as_str().unwrap();
    assert!(rel.starts_with(".omicos/outputs/sess-bin/"), "{v}");
    assert!(
        ws.path().join(rel).is_file(),
        "{rel} not in the configured workspace"
    );
    assert_eq!(
        auth.lock().unwrap().as_slice(),
        ["Bearer sk-from-openai-var model=fake-image-1"]
    );

    // SIGTERM drains and exits cleanly.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the service did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}
