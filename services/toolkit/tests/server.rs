//! A provider served over gRPC on 127.0.0.1: the call runs inside its span
//! (fields recorded, the provider's logs under it), and a request that does not
//! decode is INVALID_ARGUMENT.

#[path = "support/raw_wire.rs"]
mod raw_wire;

use async_trait::async_trait;
use omicos_servicekit::Shutdown;
use omicos_toolkit::remote::RemoteProvider;
use omicos_toolkit::{
    CallCtx, Provider, ProviderHosting, ToolError, ToolSpec, serve_provider, tool,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

struct Greeter;

#[async_trait]
impl Provider for Greeter {
    fn name(&self) -> &str {
        "greeter"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool("greet", "says hello", json!({"type":"object"})).build(),
            tool("fail", "always fails", json!({"type":"object"})).build(),
        ]
    }
    async fn call(&self, tool: &str, _args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        tracing::info!(marker = tool, "provider at work");
        match tool {
            "greet" => Ok(json!("hello")),
            _ => Err(ToolError::failed("no")),
        }
    }
}

/// What the capturing layer saw: each span's name and fields, and for each
/// provider log line the names of the spans it ran in.
#[derive(Default)]
struct Seen {
    spans: HashMap<u64, (String, HashMap<String, String>)>,
    logs: Vec<(String, Vec<String>)>,
}

struct Capture(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .spans
            .insert(id.into_u64(), (attrs.metadata().name().to_owned(), fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Some((_, fields)) = self.0.lock().unwrap().spans.get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        if let Some(marker) = fields.get("marker") {
            let scope = ctx
                .event_scope(event)
                .map(|s| s.map(|span| span.name().to_owned()).collect())
                .unwrap_or_default();
            self.0.lock().unwrap().logs.push((marker.clone(), scope));
        }
    }
}

fn seen() -> &'static Arc<Mutex<Seen>> {
    static SEEN: OnceLock<Arc<Mutex<Seen>>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        seen
    })
}

async fn start() -> (String, Shutdown) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new(Duration::from_millis(200));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    tokio::spawn(serve_provider(
        Arc::new(Greeter),
        listener,
        hosting,
        shutdown.clone(),
    ));
    (addr, shutdown)
}

async fn connect(addr: &str) -> RemoteProvider {
    for _ in 0..100 {
        if let Ok(p) = RemoteProvider::connect(addr).await {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the provider at {addr} never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_runs_in_its_span_and_the_span_records_tool_and_status() {
    let seen = seen();
    let (addr, shutdown) = start().await;
    let remote = connect(&addr).await;
    let ctx = CallCtx::for_test(std::env::temp_dir(), "s1");
    assert_eq!(
        remote.call("greet", json!({}), ctx.clone()).await.unwrap(),
        json!("hello")
    );
    assert!(remote.call("fail", json!({}), ctx).await.is_err());
    shutdown.trigger();

    let seen = seen.lock().unwrap();
    let calls: Vec<&HashMap<String, String>> = seen
        .spans
        .values()
        .filter(|(name, _)| name == "provider.call_tool")
        .map(|(_, f)| f)
        .collect();
    let status_of = |tool: &str| {
        calls
            .iter()
            .find(|f| f.get("tool_name").map(String::as_str) == Some(tool))
            .and_then(|f| f.get("status").cloned())
    };
    assert_eq!(status_of("greet").as_deref(), Some("done"), "{calls:?}");
    assert_eq!(status_of("fail").as_deref(), Some("error"), "{calls:?}");
    // The provider's own logs ran inside the call's span.
    for tool in ["greet", "fail"] {
        let (_, scope) = seen
            .logs
            .iter()
            .find(|(m, _)| m == tool)
            .unwrap_or_else(|| panic!("no log from {tool}"));
        assert!(
            scope.iter().any(|s| s == "provider.call_tool"),
            "{tool}: {scope:?}"
        );
    }
}

#[tokio::test]
async fn invalid_utf8_in_a_call_is_invalid_argument() {
    use raw_wire::{NOT_UTF8, field};
    let (addr, shutdown) = start().await;
    let remote = connect(&addr).await;
    // CallToolRequest.tool, then CallContext.session_id: not UTF-8.
    for body in [
        field(1, NOT_UTF8),
        [field(1, b"greet"), field(3, &field(2, NOT_UTF8))].concat(),
    ] {
        let s =
            raw_wire::server_stream_status(&addr, "/omicos.v1.ToolProvider/CallTool", body).await;
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("UTF-8"), "{s:?}");
    }
    // The same request with valid text is served.
    let ctx = CallCtx::for_test(std::env::temp_dir(), "s1");
    assert_eq!(
        remote.call("greet", json!({}), ctx).await.unwrap(),
        json!("hello")
    );
    shutdown.trigger();
}
