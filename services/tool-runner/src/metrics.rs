//! The runner's metrics (through `omicos_servicekit::metrics`): tool calls by
//! tool, status and provider with their latency, calls in flight, and the
//! registry's live entries per provider.

use crate::registry::Registry;
use omicos_servicekit::metrics::{kv, latency_histogram, meter};
use opentelemetry::metrics::{Counter, Histogram, ObservableGauge, UpDownCounter};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The instruments of one pipeline.
#[derive(Clone)]
pub struct RunnerMetrics {
    calls: Counter<u64>,
    duration: Histogram<f64>,
    in_flight: UpDownCounter<i64>,
}

impl Default for RunnerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RunnerMetrics {
    /// Made from the global meter (no-ops until `run_main` installs one).
    pub fn new() -> Self {
        Self {
            calls: meter()
                .u64_counter("omicos.tool_runner.calls")
                .with_description("Tool calls finished, by tool, status and provider")
                .build(),
            duration: latency_histogram(
                "omicos.tool_runner.call.duration",
                "Tool call time from request to result, by tool, status and provider",
            ),
            in_flight: meter()
                .i64_up_down_counter("omicos.tool_runner.calls.in_flight")
                .with_description("Tool calls running in this runner")
                .build(),
        }
    }

    /// Counts a call in flight until the guard drops (a cancelled call too).
    pub fn start(&self) -> InFlight {
        self.in_flight.add(1, &[]);
        InFlight(self.in_flight.clone())
    }

    /// Records a finished call. `tool` and `provider` are empty when the name
    /// resolved to no tool (kept as `unknown`, so a model inventing names
    /// cannot grow the label set).
    pub fn finish(&self, tool: &str, provider: &str, status: &'static str, elapsed: Duration) {
        let (tool, provider) = if provider.is_empty() {
            ("unknown".to_owned(), "unknown".to_owned())
        } else {
            (tool.to_owned(), provider.to_owned())
        };
        let labels = [
            kv("tool", tool),
            kv("status", status),
            kv("provider", provider),
        ];
        self.calls.add(1, &labels);
        self.duration.record(elapsed.as_secs_f64(), &labels);
    }
}

/// Decrements the in-flight gauge on drop.
pub struct InFlight(UpDownCounter<i64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.add(-1, &[]);
    }
}

/// The `omicos.tool_runner.registry.entries` gauge: live instances per
/// provider and the registry's backend. Keep the returned gauge alive.
pub fn registry_gauge(registry: &Arc<Registry>) -> ObservableGauge<u64> {
    let weak: Weak<Registry> = Arc::downgrade(registry);
    meter()
        .u64_observable_gauge("omicos.tool_runner.registry.entries")
        .with_description("Live provider instances in the registry, by provider")
        .with_callback(move |o| {
            if let Some(r) = weak.upgrade() {
                for (provider, n) in r.live_counts() {
                    o.observe(n, &[kv("provider", provider), kv("backend", r.backend())]);
                }
            }
        })
        .build()
}
