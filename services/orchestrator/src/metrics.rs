//! The orchestrator's metrics (through `omicos_servicekit::metrics`): turns by
//! reason, sessions and turns live on this replica, LLM requests by model and
//! outcome with their latency, retries, and tokens by model and direction.
//!
//! The instruments are made on first use, after `run_main` has installed the
//! meter provider; before that (and in tests without one) they are no-ops.

use crate::hub::Hub;
use omicos_servicekit::metrics::{kv, latency_histogram, meter};
use opentelemetry::metrics::{Counter, Histogram, ObservableGauge};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

/// The instruments of one orchestrator process.
pub struct OrchestratorMetrics {
    turns: Counter<u64>,
    llm_requests: Counter<u64>,
    llm_duration: Histogram<f64>,
    llm_retries: Counter<u64>,
    llm_tokens: Counter<u64>,
    genai_tokens: Histogram<u64>,
    genai_duration: Histogram<f64>,
}

/// `gen_ai.client.token.usage` buckets, the conventions' advice: powers of 4
/// from 1 to 4^13 tokens.
const GENAI_TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// `gen_ai.client.operation.duration` buckets, the conventions' advice: 10 ms
/// doubling to 82 s.
const GENAI_DURATION_BUCKETS_S: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

static METRICS: LazyLock<OrchestratorMetrics> = LazyLock::new(|| OrchestratorMetrics {
    turns: meter()
        .u64_counter("omicos.orchestrator.turns")
        .with_description("Root turns finished, by reason")
        .build(),
    llm_requests: meter()
        .u64_counter("omicos.orchestrator.llm.requests")
        .with_description("Model requests, by model and outcome")
        .build(),
    llm_duration: latency_histogram(
        "omicos.orchestrator.llm.duration",
        "Model request time from send to the end of the stream, by model and outcome",
    ),
    llm_retries: meter()
        .u64_counter("omicos.orchestrator.llm.retries")
        .with_description("Model requests sent again after a 429, a 5xx or a connection error")
        .build(),
    llm_tokens: meter()
        .u64_counter("omicos.orchestrator.llm.tokens")
        .with_description("Tokens by model and direction (input, output)")
        .build(),
    genai_tokens: meter()
        .u64_histogram("gen_ai.client.token.usage")
        .with_unit("{token}")
        .with_description(
            "Number of input and output tokens used (OpenTelemetry GenAI conventions)",
        )
        .with_boundaries(GENAI_TOKEN_BUCKETS.to_vec())
        .build(),
    genai_duration: meter()
        .f64_histogram("gen_ai.client.operation.duration")
        .with_unit("s")
        .with_description("GenAI operation duration (OpenTelemetry GenAI conventions)")
        .with_boundaries(GENAI_DURATION_BUCKETS_S.to_vec())
        .build(),
});

/// The process's instruments.
pub fn get() -> &'static OrchestratorMetrics {
    &METRICS
}

impl OrchestratorMetrics {
    /// A root turn ended with `reason` (`completed`, `cancelled`, …).
    pub fn turn_done(&self, reason: &'static str) {
        self.turns.add(1, &[kv("reason", reason)]);
    }

    /// A model request ended: `outcome` is `ok`, `cancelled`, `context_overflow` or `error`.
    pub fn llm_request(&self, model: &str, outcome: &'static str, elapsed: Duration) {
        let labels = [kv("model", model.to_owned()), kv("outcome", outcome)];
        self.llm_requests.add(1, &labels);
        self.llm_duration.record(elapsed.as_secs_f64(), &labels);
    }

    /// A model request is sent again; `why` is `http_429`, `http_5xx` or `connection`.
    pub fn llm_retry(&self, why: &'static str) {
        self.llm_retries.add(1, &[kv("reason", why)]);
    }

    /// Tokens one model request used, labelled with the model asked for (as the requests are).
    pub fn tokens(&self, model: &str, input: u64, output: u64) {
        let m = kv("model", model.to_owned());
        self.llm_tokens
            .add(input, &[m.clone(), kv("direction", "input")]);
        self.llm_tokens.add(output, &[m, kv("direction", "output")]);
    }
}

impl OrchestratorMetrics {
    /// `gen_ai.client.operation.duration` of one `chat` request: `error` is
    /// the error's kind when it failed (`error.type`).
    pub fn genai_operation(
        &self,
        provider: &str,
        request_model: &str,
        response_model: &str,
        error: Option<&'static str>,
        elapsed: Duration,
    ) {
        let mut attrs = genai_attrs(provider, request_model, response_model);
        if let Some(e) = error {
            attrs.push(kv("error.type", e));
        }
        self.genai_duration.record(elapsed.as_secs_f64(), &attrs);
    }

    /// `gen_ai.client.token.usage` of one `chat` request, one record per token type.
    pub fn genai_tokens(
        &self,
        provider: &str,
        request_model: &str,
        response_model: &str,
        input: u64,
        output: u64,
    ) {
        for (kind, n) in [("input", input), ("output", output)] {
            let mut attrs = genai_attrs(provider, request_model, response_model);
            attrs.push(kv("gen_ai.token.type", kind));
            self.genai_tokens.record(n, &attrs);
        }
    }
}

/// The attributes every GenAI client metric carries.
fn genai_attrs(
    provider: &str,
    request_model: &str,
    response_model: &str,
) -> Vec<opentelemetry::KeyValue> {
    let mut attrs = vec![
        kv("gen_ai.operation.name", "chat"),
        kv(
            "gen_ai.provider.name",
            crate::genai::provider_name(provider).to_owned(),
        ),
        kv("gen_ai.request.model", request_model.to_owned()),
    ];
    if !response_model.is_empty() {
        attrs.push(kv("gen_ai.response.model", response_model.to_owned()));
    }
    attrs
}

/// The `omicos.orchestrator.sessions.live` and `omicos.orchestrator.turns.running`
/// gauges over `hub` (this replica's sessions in memory and the turns it runs).
/// Keep the returned gauges alive.
pub fn hub_gauges(hub: &Arc<Hub>) -> [ObservableGauge<u64>; 2] {
    let (w1, w2): (Weak<Hub>, Weak<Hub>) = (Arc::downgrade(hub), Arc::downgrade(hub));
    [
        meter()
            .u64_observable_gauge("omicos.orchestrator.sessions.live")
            .with_description(
                "Sessions held live by this replica (a running turn, a subscriber, or recent use)",
            )
            .with_callback(move |o| {
                if let Some(h) = w1.upgrade() {
                    o.observe(h.live_sessions() as u64, &[]);
                }
            })
            .build(),
        meter()
            .u64_observable_gauge("omicos.orchestrator.turns.running")
            .with_description("Turns this replica is running")
            .with_callback(move |o| {
                if let Some(h) = w2.upgrade() {
                    o.observe(h.running_turns() as u64, &[]);
                }
            })
            .build(),
    ]
}
