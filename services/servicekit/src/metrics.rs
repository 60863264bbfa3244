//! Metrics for every service, through OpenTelemetry: a Prometheus scrape
//! endpoint (`GET /metrics` on the config's `metrics_addr`) and OTLP export
//! over gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! [`crate::run_main`] installs the meter provider before the service runs, so
//! a service only asks for instruments:
//!
//! ```no_run
//! use omicos_servicekit::metrics;
//! let calls = metrics::meter()
//!     .u64_counter("omicos.orchestrator.turns")
//!     .with_description("Turns started")
//!     .build();
//! calls.add(1, &[metrics::kv("reason", "done")]);
//! let latency = metrics::latency_histogram("omicos.orchestrator.llm.duration", "LLM request time");
//! latency.record(0.42, &[]);
//! ```
//!
//! Instruments made before the provider is installed (or when neither the
//! endpoint nor OTLP is configured) are no-ops, so libraries and tests can use
//! them freely. Names are dotted; Prometheus sees `omicos_orchestrator_turns_total`.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The scope name of every omicos instrument.
pub const SCOPE: &str = "omicos";

/// Bucket bounds of [`latency_histogram`], in seconds: 1 ms to 5 min, dense
/// where tool calls and LLM requests usually fall.
pub const LATENCY_BUCKETS_S: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// How often metrics go out over OTLP (the SDK's default is 60 s, too slow to watch a fault).
pub const OTLP_EXPORT_INTERVAL: Duration = Duration::from_secs(10);

/// The meter every omicos instrument comes from.
pub fn meter() -> Meter {
    opentelemetry::global::meter(SCOPE)
}

/// A label (`KeyValue`), shorter to write at call sites.
pub fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

/// A histogram of durations in seconds with [`LATENCY_BUCKETS_S`].
pub fn latency_histogram(name: &'static str, description: &'static str) -> Histogram<f64> {
    meter()
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(LATENCY_BUCKETS_S.to_vec())
        .build()
}

/// Keeps the meter provider and the scrape endpoint alive; flushes on drop.
pub struct MetricsGuard {
    provider: Option<SdkMeterProvider>,
    local_addr: Option<SocketAddr>,
    stop: CancellationToken,
}

impl MetricsGuard {
    /// The address `/metrics` is served on, when one was configured.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }
}

impl Drop for MetricsGuard {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Why metrics could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The scrape address cannot be listened on.
    #[error("metrics_addr: cannot listen on {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: String,
        /// The bind error.
        source: std::io::Error,
    },
    /// The exporter could not be built.
    #[error("metrics exporter: {0}")]
    Exporter(String),
}

/// Installs the global meter provider for `service`: a Prometheus reader
/// served on `metrics_addr` (when given and not empty) and an OTLP reader when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set. With neither, nothing is installed
/// and instruments stay no-ops.
pub async fn init(
    service: &'static str,
    metrics_addr: Option<&str>,
) -> Result<MetricsGuard, MetricsError> {
    let addr = metrics_addr.map(str::trim).filter(|a| !a.is_empty());
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|s| !s.is_empty())
        .is_some();
    let stop = CancellationToken::new();
    if addr.is_none() && !otlp {
        return Ok(MetricsGuard {
            provider: None,
            local_addr: None,
            stop,
        });
    }
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    let mut builder = SdkMeterProvider::builder().with_resource(resource);
    let mut local_addr = None;
    if let Some(addr) = addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| MetricsError::Bind {
                addr: addr.to_owned(),
                source,
            })?;
        local_addr = listener.local_addr().ok();
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| MetricsError::Exporter(e.to_string()))?;
        builder = builder.with_reader(exporter);
        tokio::spawn(serve(listener, registry, stop.clone()));
        tracing::info!(service, addr = ?local_addr, "metrics: serving /metrics");
    }
    if otlp {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| MetricsError::Exporter(e.to_string()))?;
        let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
            .with_interval(OTLP_EXPORT_INTERVAL)
            .build();
        builder = builder.with_reader(reader);
    }
    let provider = builder.build();
    opentelemetry::global::set_meter_provider(provider.clone());
    Ok(MetricsGuard {
        provider: Some(provider),
        local_addr,
        stop,
    })
}

/// The Prometheus text exposition of everything in `registry`.
pub fn render(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Serves `GET /metrics` from `registry` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: prometheus::Registry,
    stop: CancellationToken,
) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    render(&registry),
                )
            }
        }),
    );
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "metrics endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn scrape(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    // One test owns the process-wide provider (it is global by design).
    #[tokio::test]
    async fn counters_histograms_and_gauges_are_scraped_on_metrics_addr() {
        let bad = init("omicos-test", Some("256.0.0.1:1")).await;
        assert!(
            matches!(&bad, Err(e) if e.to_string().contains("metrics_addr")),
            "a bad address is refused, naming the key"
        );
        let guard = init("omicos-test", Some("127.0.0.1:0")).await.unwrap();
        let addr = guard.local_addr().unwrap();
        let calls = meter().u64_counter("omicos.test.calls").build();
        calls.add(3, &[kv("tool", "read_file"), kv("status", "done")]);
        latency_histogram("omicos.test.duration", "time").record(0.02, &[kv("tool", "x")]);
        let _gauge = meter()
            .i64_observable_gauge("omicos.test.live")
            .with_callback(|o| o.observe(7, &[]))
            .build();
        let body = scrape(addr, "/metrics").await;
        assert!(
            body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
            "{body}"
        );
        assert!(
            body.contains(r#"omicos_test_calls_total{status="done",tool="read_file",otel_scope_name="omicos"} 3"#),
            "{body}"
        );
        assert!(
            body.contains(r#"omicos_test_duration_seconds_bucket{tool="x",otel_scope_name="omicos",le="0.025"} 1"#),
            "{body}"
        );
        assert!(body.contains("omicos_test_live{"), "{body}");
        assert!(body.contains(r#"service_name="omicos-test""#), "{body}");
        let missing = scrape(addr, "/nothing").await;
        assert!(missing.contains(" 404 "), "{missing}");
    }
}
