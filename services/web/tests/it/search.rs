//! web_search against servers that speak the SearxNG, Brave and Tavily wire formats.

use crate::support::{call, call_err, serve};
use axum::{
    Json, Router,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
};
use omicos_web::{SearchConfig, WebConfig, WebProvider};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

/// The query strings a fake backend received.
type Seen = Arc<Mutex<Vec<HashMap<String, String>>>>;

fn search_cfg(search: SearchConfig) -> WebConfig {
    WebConfig {
        search: SearchConfig {
            retry_max_delay: std::time::Duration::from_millis(50),
            ..search
        },
        ..WebConfig::default()
    }
}

fn provider(cfg: &WebConfig, env: &[(&str, &str)]) -> WebProvider {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    WebProvider::with_parts(cfg, &env, Arc::new(omicos_web::ssrf::SystemLookup)).unwrap()
}

#[tokio::test]
async fn searxng_json() {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/search",
            get(|State(seen): State<Seen>, Query(q): Query<HashMap<String, String>>| async move {
                seen.lock().unwrap().push(q);
                Json(json!({
                    "query": "rust async",
                    "number_of_results": 3,
                    "results": [
                        {"url": "https://tokio.rs/", "title": "Tokio", "content": "An asynchronous runtime", "engine": "ddg", "publishedDate": "2025-01-02T00:00:00"},
                        {"url": "https://docs.rs/futures", "title": "futures", "content": "Zero-cost futures"},
                        {"title": "no url, skipped", "content": "x"},
                        {"url": "https://example.com/3", "title": "Third", "content": "third"}
                    ],
                    "answers": [], "suggestions": []
                }))
            }),
        )
        .with_state(seen.clone());
    let addr = serve(app).await;
    let cfg = search_cfg(SearchConfig {
        searxng_url: format!("http://{addr}/"),
        ..SearchConfig::default()
    });
    let p = provider(&cfg, &[]);
    let v = call(
        &p,
        "web_search",
        json!({"query": "rust async", "max_results": 2, "time_range": "week", "site": "docs.rs"}),
    )
    .await
    .unwrap();
    assert_eq!(v["backend"], "searxng");
    assert_eq!(
        v["results"],
        json!([
            {"title": "Tokio", "url": "https://tokio.rs/", "snippet": "An asynchronous runtime", "published": "2025-01-02T00:00:00"},
            {"title": "futures", "url": "https://docs.rs/futures", "snippet": "Zero-cost futures"}
        ])
    );
    let q = seen.lock().unwrap()[0].clone();
    assert_eq!(q["q"], "rust async site:docs.rs");
    assert_eq!(q["format"], "json");
    assert_eq!(q["time_range"], "week");
}

#[tokio::test]
async fn searxng_without_json_format_says_so() {
    let app = Router::new().route(
        "/search",
        get(|| async { (StatusCode::FORBIDDEN, "<html>Forbidden</html>") }),
    );
    let addr = serve(app).await;
    let p = provider(
        &search_cfg(SearchConfig {
            searxng_url: format!("http://{addr}"),
            ..SearchConfig::default()
        }),
        &[],
    );
    let err = call_err(&p, "web_search", json!({"query": "x"})).await;
    assert!(
        err.contains("HTTP 403") && err.contains("search.formats"),
        "{err}"
    );
}

#[tokio::test]
async fn brave_api() {
    let app = Router::new().route(
        "/res/v1/web/search",
        get(|headers: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
            if headers.get("x-subscription-token").and_then(|v| v.to_str().ok()) != Some("brave-key") {
                return (StatusCode::UNAUTHORIZED, Json(json!({"error": "bad token"}))).into_response();
            }
            assert_eq!(q["q"], "tidal power");
            assert_eq!(q["count"], "3");
            assert_eq!(q["freshness"], "pm");
            Json(json!({
                "type": "search",
                "web": {"type": "search", "results": [
                    {"title": "Tidal power", "url": "https://en.wikipedia.org/wiki/Tidal_power", "description": "Tidal power or tidal energy is...", "page_age": "2024-03-01T00:00:00", "age": "March 1, 2024"},
                    {"title": "MeyGen", "url": "https://example.org/meygen", "description": "The MeyGen project"}
                ]}
            }))
            .into_response()
        }),
    );
    let addr = serve(app).await;
    let cfg = search_cfg(SearchConfig {
        backend: "brave".into(),
        brave_url: format!("http://{addr}/res/v1/web/search"),
        ..SearchConfig::default()
    });
    // The key comes from the environment.
    let p = provider(&cfg, &[("BRAVE_API_KEY", "brave-key")]);
    let v = call(
        &p,
        "web_search",
        json!({"query": "tidal power", "max_results": 3, "time_range": "month"}),
    )
    .await
    .unwrap();
    assert_eq!(v["backend"], "brave");
    assert_eq!(v["results"][0]["title"], "Tidal power");
    assert_eq!(v["results"][0]["published"], "2024-03-01T00:00:00");
    assert_eq!(v["results"][1]["snippet"], "The MeyGen project");
    assert!(v["results"][1].get("published").is_none());
    // A wrong key is a clear error.
    let p = provider(&cfg, &[("BRAVE_API_KEY", "wrong")]);
    let err = call_err(&p, "web_search", json!({"query": "tidal power"})).await;
    assert!(err.contains("Brave search answered HTTP 401"), "{err}");
}

#[tokio::test]
async fn tavily_api() {
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = Router::new()
        .route(
            "/search",
            post(|State(bodies): State<Arc<Mutex<Vec<Value>>>>, headers: HeaderMap, Json(body): Json<Value>| async move {
                assert_eq!(headers.get("authorization").unwrap(), "Bearer tvly-test");
                bodies.lock().unwrap().push(body);
                Json(json!({
                    "query": "q",
                    "results": [{"title": "A", "url": "https://a.example/", "content": "alpha", "score": 0.9, "published_date": "2026-01-05"}],
                    "response_time": 0.5
                }))
            }),
        )
        .with_state(bodies.clone());
    let addr = serve(app).await;
    let cfg = search_cfg(SearchConfig {
        backend: "tavily".into(),
        tavily_url: format!("http://{addr}/search"),
        tavily_api_key: "tvly-test".into(),
        ..SearchConfig::default()
    });
    let p = provider(&cfg, &[]);
    let v = call(
        &p,
        "web_search",
        json!({"query": "solar", "site": "a.example", "time_range": "day"}),
    )
    .await
    .unwrap();
    assert_eq!(
        v["results"],
        json!([{"title": "A", "url": "https://a.example/", "snippet": "alpha", "published": "2026-01-05"}])
    );
    let body = bodies.lock().unwrap()[0].clone();
    assert_eq!(body["query"], "solar");
    assert_eq!(body["include_domains"], json!(["a.example"]));
    assert_eq!(body["time_range"], "day");
    assert_eq!(body["max_results"], 8);
}

#[tokio::test]
async fn rate_limits_are_retried_then_reported() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/search",
            get(|State(hits): State<Arc<AtomicUsize>>, Query(q): Query<HashMap<String, String>>| async move {
                let n = hits.fetch_add(1, Ordering::SeqCst);
                // "flaky" succeeds on the third attempt; anything else is always limited.
                if q["q"] == "flaky" && n >= 2 {
                    return Json(json!({"results": [{"url": "https://ok.example/", "title": "ok", "content": "fine"}]})).into_response();
                }
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")], "slow down").into_response()
            }),
        )
        .with_state(hits.clone());
    let addr = serve(app).await;
    let cfg = search_cfg(SearchConfig {
        searxng_url: format!("http://{addr}"),
        max_retries: 3,
        ..SearchConfig::default()
    });
    let p = provider(&cfg, &[]);
    let v = call(&p, "web_search", json!({"query": "flaky"}))
        .await
        .unwrap();
    assert_eq!(v["results"][0]["title"], "ok");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    hits.store(100, Ordering::SeqCst);
    let err = call_err(&p, "web_search", json!({"query": "always"})).await;
    assert!(
        err.contains("rate limited") && err.contains("after 3 retries"),
        "{err}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        104,
        "one try and three retries"
    );
}

#[tokio::test]
async fn missing_configuration_says_how_to_configure() {
    let p = provider(&WebConfig::default(), &[]);
    let err = call_err(&p, "web_search", json!({"query": "x"})).await;
    assert!(
        err.contains("web_search is not configured")
            && err.contains("OMICOS_WEB_SEARCH_SEARXNG_URL")
            && err.contains("BRAVE_API_KEY"),
        "{err}"
    );
    let p = provider(
        &WebConfig {
            search: SearchConfig {
                backend: "tavily".into(),
                ..SearchConfig::default()
            },
            ..WebConfig::default()
        },
        &[],
    );
    let err = call_err(&p, "web_search", json!({"query": "x"})).await;
    assert!(err.contains("TAVILY_API_KEY is not set"), "{err}");
    let p = provider(
        &search_cfg(SearchConfig {
            searxng_url: "http://127.0.0.1:1".into(),
            ..SearchConfig::default()
        }),
        &[],
    );
    let err = call_err(&p, "web_search", json!({"query": "  "})).await;
    assert!(err.contains("must not be empty"), "{err}");
    let err = call_err(
        &p,
        "web_search",
        json!({"query": "x", "time_range": "decade"}),
    )
    .await;
    assert!(err.contains("day, week, month or year"), "{err}");
}
