//! Every provider reached the way an agent reaches it: a chat with the fake
//! LLM, the orchestrator, the tool-runner's pipeline, and (for the kernel,
//! web, memory and image_gen) a provider service on its own loopback port,
//! found through the runner's registry.

use omicos_e2e::stack::done_reason;
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, finished_calls};
use omicos_proto::ToolStatus;
use omicos_proto::{
    ChatRequest, ListProvidersRequest, chat_event, registry_client::RegistryClient,
};
use omicos_toolkit::{Provider, ProviderHosting, serve_provider};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

fn req(message: &str, session: &str) -> ChatRequest {
    ChatRequest {
        message: message.into(),
        session_id: session.into(),
        permission_mode: "full".into(),
        ..Default::default()
    }
}

fn tools(calls: &[(&str, &str, Value)]) -> Reply {
    Reply::Tools(
        String::new(),
        calls
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect(),
    )
}

/// Serves `provider` on 127.0.0.1:0, registered with the stack's runner, and waits until it is listed.
async fn attach_provider<P: Provider>(
    stack: &Stack,
    provider: Arc<P>,
) -> omicos_servicekit::Shutdown {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sd = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: Some(stack.runner.clone()),
        advertise: None,
        workspace: stack.workspace.clone(),
        ttl_seconds: 0,
    };
    let name = provider.name().to_owned();
    tokio::spawn(serve_provider(provider, l, hosting, sd.clone()));
    let mut reg = RegistryClient::connect(stack.runner.clone()).await.unwrap();
    for _ in 0..100 {
        let list = reg
            .list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner();
        if list.instances.iter().any(|i| i.provider == name) {
            return sd;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never registered");
}

fn kernel_python() -> String {
    std::env::var("OMICOS_KERNEL_PYTHON").unwrap_or_else(|_| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        root.join(".venv/bin/python3").display().to_string()
    })
}

#[tokio::test]
async fn python_streams_output_keeps_state_and_a_cancel_interrupts() {
    let llm = FakeLlm::start(vec![
        tools(&[(
            "c_py",
            "run_python_code",
            json!({"code": "import time\nx = 21\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\nx * 2"}),
        )]),
        tools(&[("c_alias", "python", json!({"code": "x + 1"}))]),
        Reply::Text("computed".into()),
        tools(&[("c_loop", "run_python_code", json!({"code": "y = 5\nimport time\nwhile True:\n    time.sleep(0.05)"}))]),
        tools(&[("c_after", "run_python_code", json!({"code": "print(x, y)"}))]),
        Reply::Text("state survived".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let kcfg = omicos_kernel::KernelConfig {
        python: kernel_python(),
        pool_size: 1,
        ..Default::default()
    };
    let kernel =
        omicos_kernel::KernelProvider::new(kcfg, stack.workspace.canonicalize().unwrap(), vec![])
            .expect("kernel provider");
    let _sd = attach_provider(&stack, kernel.clone()).await;

    let mut chat = stack.chat(req("compute", "")).await.unwrap();
    let events = chat.until_done().await;
    assert_eq!(
        done_reason(&events).as_deref(),
        Some("completed"),
        "{events:#?}"
    );
    let session = events[0].session_id.clone();
    // Output reached the client while the cell ran, before the call finished.
    let first_chunk = events
        .iter()
        .position(|e| matches!(&e.kind, Some(chat_event::Kind::ToolOutputChunk(c)) if c.chunk.as_ref().is_some_and(|c| c.text.contains("tick"))))
        .expect("streamed output");
    let finished = events
        .iter()
        .position(|e| matches!(&e.kind, Some(chat_event::Kind::ToolCallFinished(_))))
        .unwrap();
    assert!(first_chunk < finished);
    let f = finished_calls(&events);
    assert_eq!(f[0].status(), ToolStatus::Done, "{:?}", f[0]);
    assert!(f[0].result.contains("42"), "{}", f[0].result);
    assert!(
        f[1].result.contains("22"),
        "alias and state: {}",
        f[1].result
    );

    // A cancel interrupts the running cell; the kernel keeps its state.
    let mut chat = stack.chat(req("loop", &session)).await.unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t = std::time::Instant::now();
    chat.cancel().await;
    let events = chat.until_done().await;
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    assert!(t.elapsed() < Duration::from_secs(10));
    let after = stack
        .chat(req("check", &session))
        .await
        .unwrap()
        .until_done()
        .await;
    let f = finished_calls(&after);
    assert!(
        f[0].status() == ToolStatus::Done && f[0].result.contains("21 5"),
        "{:?}",
        f[0]
    );
    llm.assert_invariants();
    kernel.close().await;
}

#[tokio::test]
async fn web_fetch_and_memory_through_the_pipeline() {
    // A page on loopback, allowed by the web provider's allowlist.
    let app = axum::Router::new().route(
        "/article",
        axum::routing::get(|| async {
            axum::response::Html(
                "<html><head><title>Tiny Article</title></head><body><nav>menu</nav><article><h1>Findings</h1>\
                 <p>The measured value was forty-two, which matches the model.</p><p>More text to make it an article. \
                 More text to make it an article. More text to make it an article.</p></article><footer>foot</footer></body></html>",
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = format!("http://{}/article", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });

    let llm = FakeLlm::start(vec![
        tools(&[("c_fetch", "web_fetch", json!({"url": page}))]),
        tools(&[
            ("c_save", "memory__save", json!({"content": "the measured value was forty-two", "category": "project", "tags": ["results"]})),
        ]),
        tools(&[("c_search", "memory__search", json!({"query": "measured value", "limit": 5}))]),
        tools(&[("c_blocked", "web_fetch", json!({"url": "http://169.254.169.254/latest/meta-data"}))]),
        Reply::Text("noted".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let wcfg = omicos_web::WebConfig {
        allow: vec!["127.0.0.1".into()],
        ..Default::default()
    };
    let _web = attach_provider(
        &stack,
        Arc::new(omicos_web::WebProvider::from_config(&wcfg).unwrap()),
    )
    .await;
    let db = format!("sqlite://{}", stack.workspace.join("memory.db").display());
    let store = omicos_memory::MemoryStore::open(&db).await.unwrap();
    let _mem = attach_provider(&stack, Arc::new(omicos_memory::MemoryProvider::new(store))).await;

    let events = stack
        .chat(req("research", ""))
        .await
        .unwrap()
        .until_done()
        .await;
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let f = finished_calls(&events);
    assert_eq!(f[0].status(), ToolStatus::Done, "{:?}", f[0]);
    assert!(
        f[0].result.contains("forty-two") && f[0].result.contains("Tiny Article"),
        "{}",
        f[0].result
    );
    assert!(
        !f[0].result.contains("menu"),
        "nav stripped: {}",
        f[0].result
    );
    assert_eq!(f[1].status(), ToolStatus::Done, "{:?}", f[1]);
    assert_eq!(f[2].status(), ToolStatus::Done, "{:?}", f[2]);
    assert!(f[2].result.contains("forty-two"), "{}", f[2].result);
    assert_eq!(f[3].status(), ToolStatus::Error);
    assert!(f[3].result.contains("169.254.169.254"), "{}", f[3].result);
    llm.assert_invariants();
}

#[tokio::test]
async fn pdf_and_image_gen_through_the_pipeline() {
    // An OpenAI-shaped images endpoint answering with b64_json.
    let png = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        b"\x89PNG\r\n\x1a\nfake-image-bytes",
    );
    let app = axum::Router::new().route(
        "/v1/images/generations",
        axum::routing::post(move || {
            let png = png.clone();
            async move { axum::Json(json!({"created": 1, "data": [{"b64_json": png}]})) }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let images = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });

    let llm = FakeLlm::start(vec![
        tools(&[
            ("c_info", "pdf__info", json!({"path": "paper.pdf"})),
            (
                "c_read",
                "pdf__read",
                json!({"path": "paper.pdf", "pages": "1"}),
            ),
            ("c_escape", "pdf__info", json!({"path": "../outside.pdf"})),
            (
                "c_img",
                "image_gen__generate",
                json!({"prompt": "a volcano plot", "n": 1}),
            ),
        ]),
        Reply::Text("done".into()),
    ])
    .await;
    let pdf: Arc<dyn Provider> =
        Arc::new(omicos_pdf::PdfProvider::new(omicos_pdf::Config::default()));
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            providers: vec![pdf],
            ..Default::default()
        },
    )
    .await;
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../services/pdf/tests/data/replicate-design-note.pdf");
    std::fs::copy(&data, stack.workspace.join("paper.pdf")).unwrap();
    let icfg = omicos_image_gen::ImageGenConfig {
        base_url: images,
        model: "fake-image".into(),
        api_key: "k".into(),
        ..Default::default()
    };
    let _img = attach_provider(
        &stack,
        Arc::new(omicos_image_gen::ImageGenProvider::new(icfg).unwrap()),
    )
    .await;

    let events = stack
        .chat(req("read the paper and draw", ""))
        .await
        .unwrap()
        .until_done()
        .await;
    let session = events[0].session_id.clone();
    // Read-only calls of one answer run side by side and finish in any
    // order: look each up by its call id.
    let finished = finished_calls(&events);
    let by_id = |id: &str| {
        finished
            .iter()
            .find(|c| c.call_id == id)
            .unwrap_or_else(|| panic!("no ToolCallFinished for {id}: {finished:?}"))
    };
    let f = [by_id("c_info"), by_id("c_read"), by_id("c_escape"), by_id("c_img")];
    assert_eq!(f[0].status(), ToolStatus::Done, "{:?}", f[0]);
    assert!(f[0].result.contains("page"), "{}", f[0].result);
    assert_eq!(f[1].status(), ToolStatus::Done, "{:?}", f[1]);
    assert!(f[1].result.len() > 100, "{}", f[1].result);
    assert_eq!(f[2].status(), ToolStatus::Error);
    assert!(
        f[2].result.contains("outside the workspace"),
        "{}",
        f[2].result
    );
    assert_eq!(f[3].status(), ToolStatus::Done, "{:?}", f[3]);
    assert!(
        !f[3].result.contains("fake-image-bytes") && f[3].result.contains(".omicos/outputs"),
        "{}",
        f[3].result
    );
    let outputs = stack.workspace.join(".omicos/outputs").join(&session);
    let saved: Vec<_> = std::fs::read_dir(&outputs).unwrap().collect();
    assert_eq!(saved.len(), 1, "{outputs:?}");
    llm.assert_invariants();
}
