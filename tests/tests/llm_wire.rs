//! The LLM backends against servers that differ in small ways: legacy
//! `function_call` deltas, odd or missing ids, arguments as objects, usage
//! only in the last chunk, several tool calls interleaved, idle streams.

use axum::{Router, body::Body, response::Response, routing::post};
use omicos_orchestrator::llm::{
    LlmBackend, LlmError, LlmRequest, openai::OpenAiBackend, retry::RetryPolicy,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

async fn serve_sse(body: &'static str, delay_after_first: Option<Duration>) -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || async move {
            let chunks: Vec<String> = body.split_inclusive("\n\n").map(str::to_owned).collect();
            let s = futures::stream::unfold(
                (chunks.into_iter(), 0usize),
                move |(mut it, i)| async move {
                    let c = it.next()?;
                    if i == 1
                        && let Some(d) = delay_after_first
                    {
                        tokio::time::sleep(d).await;
                    }
                    Some((Ok::<_, std::io::Error>(bytes::Bytes::from(c)), (it, i + 1)))
                },
            );
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(s))
                .unwrap()
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

fn backend(url: &str, idle: Duration) -> OpenAiBackend {
    OpenAiBackend::new(
        url,
        "",
        "m",
        RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        idle,
    )
}

fn request() -> LlmRequest {
    LlmRequest {
        system: "s".into(),
        messages: vec![],
        tools: Default::default(),
        model: String::new(),
        agent_id: "a".into(),
    }
}

#[tokio::test]
async fn interleaved_calls_odd_ids_object_arguments_and_late_usage() {
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":7,\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"name\":\"b\",\"arguments\":{\"y\":2}}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    );
    let url = serve_sse(body, None).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let turn = backend(&url, Duration::from_secs(5))
        .complete(&request(), tx, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(turn.text, "Hi");
    assert!(rx.recv().await.is_some());
    assert_eq!(turn.tool_calls.len(), 2);
    assert_eq!(turn.tool_calls[0].id, "7");
    assert_eq!(turn.tool_calls[0].arguments, "{\"x\":1}");
    assert_eq!(turn.tool_calls[1].name, "b");
    assert!(
        turn.tool_calls[1].id.starts_with("call_"),
        "generated id: {}",
        turn.tool_calls[1].id
    );
    assert_eq!(turn.tool_calls[1].arguments, "{\"y\":2}");
    assert_eq!((turn.input_tokens, turn.output_tokens), (5, 3));
}

#[tokio::test]
async fn legacy_function_call_delta() {
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"name\":\"shell\",\"arguments\":\"{\\\"command\\\"\"}}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"arguments\":\":\\\"ls\\\"}\"}}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"function_call\"}]}\n\n",
    );
    let url = serve_sse(body, None).await;
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let turn = backend(&url, Duration::from_secs(5))
        .complete(&request(), tx, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.tool_calls[0].name, "shell");
    assert_eq!(turn.tool_calls[0].arguments, "{\"command\":\"ls\"}");
}

#[tokio::test]
async fn an_idle_stream_is_broken() {
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n",
    );
    let url = serve_sse(body, Some(Duration::from_secs(3))).await;
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let err = backend(&url, Duration::from_millis(300))
        .complete(&request(), tx, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::StreamBroken(_)), "{err:?}");
    assert_eq!(err.kind().as_str(), "llm_stream_broken");
}

/// LiteLLM's `/v1/messages` in front of an OpenAI-compatible model that
/// repeats the call's id in every fragment (llama.cpp's server) splits one
/// call into a tool_use block per fragment, all with one id, the last only
/// whitespace: captured from a real proxy by
/// tests/stream-captures/capture_litellm.py. Through Chat it is one call
/// with whole arguments, and the model is told one result for it.
#[tokio::test]
async fn litellm_blocks_sharing_an_id_are_one_call_through_chat() {
    use omicos_e2e::stack::{finished_calls, started_calls};
    use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
    use omicos_proto::{ChatRequest, chat_event};
    let capture = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("stream-captures/litellm_split_tool_use.sse"),
    )
    .unwrap();
    let blocks = capture.matches("\"type\": \"tool_use\"").count();
    assert!(blocks > 5, "the capture splits the call: {blocks} blocks");
    let llm = FakeLlm::start(vec![Reply::Raw(capture), Reply::Text("done".into())]).await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            backend: "anthropic".into(),
            ..Default::default()
        },
    )
    .await;
    let events = stack
        .chat(ChatRequest {
            message: "list /tmp".into(),
            permission_mode: "full".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .until_done()
        .await;
    let started = started_calls(&events);
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].call_id, "call_cap1");
    assert_eq!(started[0].name, "shell");
    let args: serde_json::Value = serde_json::from_str(&started[0].arguments).unwrap();
    assert_eq!(
        args,
        serde_json::json!({"command": "ls -la /tmp && echo done", "timeout_secs": 30})
    );
    let done = finished_calls(&events);
    assert_eq!(done.len(), 1);
    assert!(done[0].result.contains("exit_code"), "{}", done[0].result);
    // The next request answers that one call once.
    llm.assert_invariants();
    let next = &llm.requests()[1].body;
    let uses = next.to_string().matches("\"tool_use\"").count();
    assert_eq!(uses, 1, "{next}");
    // The prompt's size, sent only at the end, is counted.
    let usage = events.iter().find_map(|e| match &e.kind {
        Some(chat_event::Kind::TurnDone(d)) => d.usage,
        _ => None,
    });
    assert!(usage.is_some_and(|u| u.input_tokens >= 10), "{events:?}");
}
