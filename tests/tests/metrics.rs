//! The orchestrator's and the runner's metrics on one scrape endpoint: a turn
//! with a retried model request and one tool call shows up as turns by reason,
//! model requests by outcome, retries, tokens and tool calls. Each nextest test
//! runs in its own process, so this one owns the process-wide meter provider.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::ChatRequest;

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The sum of the samples of `metric` whose line contains every one of `labels`.
fn value(body: &str, metric: &str, labels: &[&str]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_turn_is_counted_by_the_orchestrator_and_the_runner() {
    let guard = omicos_servicekit::metrics::init("omicos-e2e", Some("127.0.0.1:0"))
        .await
        .unwrap();
    let addr = guard.local_addr().unwrap();
    let llm = FakeLlm::start(vec![
        Reply::Status(503, "busy".into(), None),
        Reply::Tools(
            String::new(),
            vec![(
                "c1".into(),
                "file_manager__list".into(),
                r#"{"path":"."}"#.into(),
            )],
        ),
        Reply::Text("Nothing here.".into()),
    ])
    .await;
    let stack = Stack::start(llm, StackOptions::default()).await;
    let mut chat = stack
        .chat(ChatRequest {
            message: "what is in the workspace?".into(),
            permission_mode: "auto".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    let body = scrape(addr).await;
    let m = r#"model="fake-model""#;
    assert_eq!(
        value(
            &body,
            "omicos_orchestrator_turns_total",
            &[r#"reason="completed""#]
        ),
        1.0,
        "{body}"
    );
    // The 503 is retried inside one request: two requests, both ok, one retry.
    assert_eq!(
        value(
            &body,
            "omicos_orchestrator_llm_requests_total",
            &[m, r#"outcome="ok""#]
        ),
        2.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "omicos_orchestrator_llm_retries_total",
            &[r#"reason="http_5xx""#]
        ),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "omicos_orchestrator_llm_duration_seconds_count",
            &[m]
        ),
        2.0,
        "{body}"
    );
    assert!(
        value(
            &body,
            "omicos_orchestrator_llm_tokens_total",
            &[m, r#"direction="input""#]
        ) > 0.0,
        "{body}"
    );
    assert!(
        value(
            &body,
            "omicos_orchestrator_llm_tokens_total",
            &[m, r#"direction="output""#]
        ) > 0.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "omicos_tool_runner_calls_total",
            &[r#"tool="file_manager__list""#, r#"status="done""#]
        ),
        1.0,
        "{body}"
    );
    // Its turn is over (whether the session is still held live depends on eviction).
    assert!(
        body.contains("omicos_orchestrator_sessions_live{"),
        "{body}"
    );
    assert_eq!(
        value(&body, "omicos_orchestrator_turns_running", &[]),
        0.0,
        "{body}"
    );
}
