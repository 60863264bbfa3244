//! Logs and traces: `tracing` filtered by RUST_LOG, OTLP export over gRPC when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace context carried in gRPC
//! metadata across every hop.

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

/// Keeps the tracer provider alive; flushes spans on drop.
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports every span ended so far, now (blocks until the exporter answered).
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            let _ = p.force_flush();
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber once. `default_filter` applies when RUST_LOG is unset.
/// Safe to call more than once (later calls only return a guard).
pub fn init(service_name: &'static str, default_filter: &str) -> TelemetryGuard {
    let export = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|_| Export::FromEnv)
        .unwrap_or(Export::Off);
    install(service_name, default_filter, export)
}

/// [`init`] with the OTLP endpoint given rather than read from the
/// environment (None: no export). For a process that hosts services in
/// itself (the e2e tests) and cannot set its environment safely once threads run.
pub fn init_with(
    service_name: &'static str,
    default_filter: &str,
    endpoint: Option<&str>,
) -> TelemetryGuard {
    let export = endpoint.map(Export::To).unwrap_or(Export::Off);
    install(service_name, default_filter, export)
}

/// Where spans go.
enum Export<'a> {
    /// Nowhere (logs only).
    Off,
    /// Where the OTEL_EXPORTER_OTLP_* variables say (the exporter reads them,
    /// so a per-signal `..._TRACES_ENDPOINT` still wins).
    FromEnv,
    /// To this endpoint.
    To(&'a str),
}

fn install(service_name: &'static str, default_filter: &str, export: Export<'_>) -> TelemetryGuard {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(true);
    let exporter = match export {
        Export::Off => None,
        Export::FromEnv => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .ok(),
        Export::To(endpoint) => {
            use opentelemetry_otlp::WithExportConfig;
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .ok()
        }
    };
    let provider = exporter.map(|exporter| {
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service_name)
            .build();
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build()
    });
    let otel = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(p.tracer(service_name))
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    TelemetryGuard { provider }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Puts the current span's trace context into outgoing request metadata.
pub fn inject_current(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata))
    });
}

/// Wraps a request message, carrying the current trace context.
pub fn traced_request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    inject_current(req.metadata_mut());
    req
}

/// Sets `span`'s parent from incoming metadata. Call before entering the span.
pub fn set_parent_from(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)));
    let _ = span.set_parent(cx);
}
