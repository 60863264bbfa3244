//! image_gen__generate against a loopback server shaped like the OpenAI
//! images API (b64_json and url answers, 429/5xx with Retry-After, errors),
//! called in process and through gRPC.

use axum::{
    Json, Router,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use base64::Engine;
use omicos_image_gen::{ImageGenConfig, ImageGenProvider};
use omicos_toolkit::{
    CallCtx, Provider, ProviderHosting, ToolError, remote::RemoteProvider, serve_provider,
};
use serde_json::{Value, json};
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// A valid 1x1 PNG.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

fn png() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(PNG_B64)
        .unwrap()
}

/// What the fake answers to the next generation request.
#[derive(Clone, Debug)]
enum Answer {
    B64,
    Url(&'static str),
    Status(u16, Option<&'static str>, Value),
    Raw(Value),
}

#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Value, Instant)>>>,
    base: Arc<Mutex<String>>,
}

impl Fake {
    fn requests(&self) -> Vec<(HeaderMap, Value, Instant)> {
        self.seen.lock().unwrap().clone()
    }
}

async fn generations(
    State(f): State<Fake>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    f.seen
        .lock()
        .unwrap()
        .push((headers, body.clone(), Instant::now()));
    let n = body["n"].as_u64().unwrap_or(1) as usize;
    let next = f.script.lock().unwrap().pop_front().unwrap_or(Answer::B64);
    let base = f.base.lock().unwrap().clone();
    match next {
        Answer::B64 => Json(json!({
            "created": 1_700_000_000,
            "data": (0..n).map(|_| json!({"b64_json": PNG_B64})).collect::<Vec<_>>(),
            "usage": {"total_tokens": 100}
        }))
        .into_response(),
        Answer::Url(file) => Json(json!({
            "created": 1_700_000_000,
            "data": (0..n).map(|_| json!({"url": format!("{base}/files/{file}"), "revised_prompt": "a tidy volcano plot"})).collect::<Vec<_>>()
        }))
        .into_response(),
        Answer::Status(code, retry_after, body) => {
            let mut r = (StatusCode::from_u16(code).unwrap(), Json(body)).into_response();
            if let Some(s) = retry_after {
                r.headers_mut().insert(header::RETRY_AFTER, s.parse().unwrap());
            }
            r
        }
        Answer::Raw(v) => Json(v).into_response(),
    }
}

async fn files(UrlPath(name): UrlPath<String>) -> Response {
    match name.as_str() {
        "plot.png" => ([(header::CONTENT_TYPE, "image/png")], png()).into_response(),
        "huge.png" => {
            let mut big = png();
            big.resize(3 << 20, 0);
            ([(header::CONTENT_TYPE, "image/png")], big).into_response()
        }
        "page.html" => (
            [(header::CONTENT_TYPE, "text/html")],
            "<html>expired link</html>",
        )
            .into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Starts the fake on 127.0.0.1:0; returns it and its `/v1` base URL.
async fn start(script: Vec<Answer>) -> (Fake, String) {
    let fake = Fake::default();
    *fake.script.lock().unwrap() = script.into();
    let app = Router::new()
        .route("/v1/images/generations", post(generations))
        .route("/files/{name}", get(files))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    *fake.base.lock().unwrap() = format!("http://{addr}");
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, format!("http://{addr}/v1"))
}

fn config(base: &str) -> ImageGenConfig {
    ImageGenConfig {
        base_url: base.into(),
        model: "gpt-image-1".into(),
        api_key: "sk-test-key".into(),
        retry_base_delay: Duration::from_millis(20),
        ..ImageGenConfig::default()
    }
}

async fn generate(
    p: &ImageGenProvider,
    ws: &std::path::Path,
    args: Value,
) -> Result<Value, ToolError> {
    let mut ctx = CallCtx::for_test(ws, "sess-42");
    ctx.call_id = "call_7".into();
    p.validate_input("image_gen__generate", &args, &ctx)?;
    p.call("image_gen__generate", args, ctx).await
}

/// Checks every listed image exists under the session's output folder and is the PNG.
fn assert_saved(ws: &std::path::Path, v: &Value, count: usize) {
    let images = v["images"]
        .as_array()
        .unwrap_or_else(|| panic!("no images in {v}"));
    assert_eq!(images.len(), count, "{v}");
    for img in images {
        let rel = img["path"].as_str().unwrap();
        assert!(
            rel.starts_with(".omicos/outputs/sess-42/") && rel.ends_with(".png"),
            "{rel}"
        );
        assert_eq!(std::fs::read(ws.join(rel)).unwrap(), png());
        assert_eq!(img["format"], "png");
    }
    // The model's context gets paths, never the image itself.
    assert!(!v.to_string().contains(&PNG_B64[..20]), "{v}");
}

#[tokio::test]
async fn b64_json_answers_are_saved_as_files() {
    let (fake, base) = start(vec![Answer::B64]).await;
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let v = generate(
        &p,
        ws.path(),
        json!({"prompt": "a volcano plot of DE genes", "n": 2, "size": "1024x1536"}),
    )
    .await
    .unwrap();
    assert_saved(ws.path(), &v, 2);
    assert_eq!(v["size"], "1024x1536");
    assert_eq!(v["model"], "gpt-image-1");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let (headers, body, _) = &reqs[0];
    assert_eq!(headers["authorization"], "Bearer sk-test-key");
    assert_eq!(
        body,
        &json!({"prompt": "a volcano plot of DE genes", "n": 2, "size": "1024x1536", "model": "gpt-image-1"})
    );
    // No stray temporary files.
    let names: Vec<_> = std::fs::read_dir(ws.path().join(".omicos/outputs/sess-42"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn url_answers_are_downloaded_and_defaults_apply() {
    let (fake, base) = start(vec![Answer::Url("plot.png")]).await;
    let ws = tempfile::tempdir().unwrap();
    let cfg = ImageGenConfig {
        response_format: "url".into(),
        ..config(&base)
    };
    let p = ImageGenProvider::new(cfg).unwrap();
    let v = generate(&p, ws.path(), json!({"prompt": "UMAP of PBMCs, pastel"}))
        .await
        .unwrap();
    assert_saved(ws.path(), &v, 1);
    assert_eq!(v["revised_prompt"], "a tidy volcano plot");
    let body = &fake.requests()[0].1;
    assert_eq!(body["n"], 1);
    assert_eq!(body["size"], "1024x1024");
    assert_eq!(body["response_format"], "url");
}

#[tokio::test]
async fn rate_limits_are_retried_honouring_retry_after() {
    let limited = json!({"error": {"message": "Rate limit reached for images per minute", "type": "requests", "code": "rate_limit_exceeded"}});
    let (fake, base) = start(vec![Answer::Status(429, Some("1"), limited), Answer::B64]).await;
    let ws = tempfile::tempdir().unwrap();
    // A huge base backoff: only Retry-After can make the retry come after about a second.
    let cfg = ImageGenConfig {
        retry_base_delay: Duration::from_secs(600),
        retry_max_delay: Duration::from_secs(30),
        ..config(&base)
    };
    let p = ImageGenProvider::new(cfg).unwrap();
    let v = generate(&p, ws.path(), json!({"prompt": "a cell"}))
        .await
        .unwrap();
    assert_saved(ws.path(), &v, 1);
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let gap = reqs[1].2 - reqs[0].2;
    assert!(
        gap >= Duration::from_millis(900),
        "retried after {gap:?}, before Retry-After"
    );
}

#[tokio::test]
async fn cancelling_during_a_retry_wait_ends_the_call() {
    let (fake, base) = start(vec![Answer::Status(
        429,
        Some("20"),
        json!({"error": {"message": "slow down"}}),
    )])
    .await;
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let ctx = CallCtx::for_test(ws.path(), "sess-42");
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let e = p
        .call("image_gen__generate", json!({"prompt": "x"}), ctx)
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Cancelled), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited out the Retry-After instead of stopping"
    );
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn server_errors_back_off_then_give_up_clearly() {
    let boom = json!({"error": {"message": "upstream overloaded"}});
    let (fake, base) = start(vec![
        Answer::Status(500, None, boom.clone()),
        Answer::Status(503, None, boom.clone()),
        Answer::B64,
    ])
    .await;
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let v = generate(&p, ws.path(), json!({"prompt": "a cell"}))
        .await
        .unwrap();
    assert_saved(ws.path(), &v, 1);
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3);
    // Exponential: the second wait is longer than the first (20 ms, then 40 ms).
    assert!(reqs[1].2 - reqs[0].2 >= Duration::from_millis(20));
    assert!(reqs[2].2 - reqs[1].2 >= Duration::from_millis(40));

    let (fake, base) = start(vec![Answer::Status(502, None, boom.clone()); 10]).await;
    let p = ImageGenProvider::new(ImageGenConfig {
        max_retries: 2,
        ..config(&base)
    })
    .unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "a cell"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("502")
            && e.contains("upstream overloaded")
            && e.contains("gave up after 3 attempts"),
        "{e}"
    );
    assert_eq!(fake.requests().len(), 3);

    // A Retry-After longer than the tool waits ends the call at once, saying so.
    let (fake, base) = start(vec![Answer::Status(
        429,
        Some("3600"),
        json!({"error": {"message": "quota"}}),
    )])
    .await;
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "a cell"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("asks to wait 3600 s") && e.contains("try again later"),
        "{e}"
    );
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn refusals_are_not_retried_and_say_what_to_fix() {
    let (fake, base) = start(vec![Answer::Status(
        401,
        None,
        json!({"error": {"message": "Incorrect API key provided"}}),
    )])
    .await;
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "x"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("refused the API key")
            && e.contains("Incorrect API key provided")
            && e.contains("OPENAI_API_KEY"),
        "{e}"
    );
    assert_eq!(fake.requests().len(), 1);

    let (_, base) = start(vec![Answer::Status(
        400,
        None,
        json!({"error": {"message": "Your request was rejected by the safety system"}}),
    )])
    .await;
    let p = ImageGenProvider::new(config(&base)).unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "x"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("400") && e.contains("safety system"), "{e}");

    // A base URL without /v1 hits a 404: the message says what the URL should look like.
    let (_, base) = start(vec![]).await;
    let p = ImageGenProvider::new(config(base.trim_end_matches("/v1"))).unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "x"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist") && e.contains("/v1"), "{e}");
}

#[tokio::test]
async fn bad_payloads_give_clear_errors_and_no_files() {
    let ws = tempfile::tempdir().unwrap();
    let not_image = base64::engine::general_purpose::STANDARD.encode(b"<html>not an image</html>");
    let (_, base) = start(vec![
        Answer::Raw(json!({"data": [{"b64_json": not_image}]})),
        Answer::Raw(json!({"data": [{"b64_json": "%%%not base64%%%"}]})),
        Answer::Raw(json!({"data": []})),
        Answer::Raw(json!({"unexpected": true, "data": "nope"})),
        Answer::Url("huge.png"),
        Answer::Url("page.html"),
        Answer::Url("gone.png"),
    ])
    .await;
    let p = ImageGenProvider::new(ImageGenConfig {
        max_image_mb: 1,
        ..config(&base)
    })
    .unwrap();
    let wants = [
        "not a PNG, JPEG, WebP or GIF image",
        "not valid base64",
        "answered without any image",
        "not an images response",
        "too large",
        "not a PNG, JPEG, WebP or GIF image",
        "404",
    ];
    for want in wants {
        let e = generate(&p, ws.path(), json!({"prompt": "x"}))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "want {want}: {e}");
    }
    let dir = ws.path().join(".omicos/outputs/sess-42");
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "no file, not even a partial one"
    );
}

#[tokio::test]
async fn unconfigured_says_how_to_configure() {
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(ImageGenConfig::default()).unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "a cell"}))
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Unavailable(_)), "{e:?}");
    let e = e.to_string();
    for hint in [
        "not configured",
        "OMICOS_IMAGE_GEN_BASE_URL",
        "OMICOS_IMAGE_GEN_API_KEY",
        "OPENAI_API_KEY",
        "image_gen:",
    ] {
        assert!(e.contains(hint), "{hint}: {e}");
    }
    assert!(!ws.path().join(".omicos").exists());
}

#[tokio::test]
async fn a_broken_base_url_fails_at_once_and_a_dead_one_after_the_retries() {
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(ImageGenConfig {
        retry_base_delay: Duration::from_secs(600),
        ..config("not a url")
    })
    .unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "x"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not usable") && e.contains("OMICOS_IMAGE_GEN_BASE_URL"),
        "{e}"
    );
    // A port nothing listens on: connection failures are retried, then reported.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let p = ImageGenProvider::new(ImageGenConfig {
        max_retries: 1,
        ..config(&dead)
    })
    .unwrap();
    let e = generate(&p, ws.path(), json!({"prompt": "x"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot reach the images endpoint") && e.contains("gave up after 2 attempts"),
        "{e}"
    );
}

#[tokio::test]
async fn input_is_checked_before_any_request() {
    let (fake, base) = start(vec![]).await;
    let ws = tempfile::tempdir().unwrap();
    let p = ImageGenProvider::new(config(&base)).unwrap();
    for (args, want) in [
        (json!({"prompt": "  "}), "`prompt` must describe the image"),
        (
            json!({"prompt": "x", "size": "huge"}),
            "`size` must be WIDTHxHEIGHT",
        ),
        (
            json!({"prompt": "x", "n": 0}),
            "`n` must be a whole number from 1 to 4",
        ),
        (
            json!({"prompt": "x", "n": 50}),
            "`n` must be a whole number from 1 to 4",
        ),
    ] {
        let e = generate(&p, ws.path(), args).await.unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn through_grpc_with_serve_provider_and_remote_provider() {
    let (fake, base) = start(vec![Answer::Url("plot.png")]).await;
    let ws = tempfile::tempdir().unwrap();
    let provider = Arc::new(ImageGenProvider::new(config(&base)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: ws.path().to_path_buf(),
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
    assert_eq!(remote.name(), "image_gen");
    let tools = remote.tools();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "image_gen__generate");
    assert_eq!(tools[0].toolset, "image_gen");
    assert_eq!(tools[0].risk, omicos_toolkit::Risk::FileWrite as i32);

    let mut ctx = CallCtx::for_test(ws.path(), "sess-42");
    ctx.call_id = "call_grpc".into();
    let v = remote
        .call(
            "image_gen__generate",
            json!({"prompt": "a heatmap"}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_saved(ws.path(), &v, 1);
    assert!(
        v["images"][0]["path"]
            .as_str()
            .unwrap()
            .contains("call_grpc")
    );
    assert_eq!(fake.requests().len(), 1);

    // Errors travel as error results with their message intact.
    let e = remote
        .call(
            "image_gen__generate",
            json!({"prompt": "x", "size": "huge"}),
            ctx,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`size` must be WIDTHxHEIGHT"), "{e}");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn through_grpc_unconfigured() {
    let ws = tempfile::tempdir().unwrap();
    let provider = Arc::new(ImageGenProvider::new(ImageGenConfig::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: ws.path().to_path_buf(),
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
    let e = remote
        .call(
            "image_gen__generate",
            json!({"prompt": "x"}),
            CallCtx::for_test(ws.path(), "s"),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("OMICOS_IMAGE_GEN_BASE_URL"), "{e}");
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
