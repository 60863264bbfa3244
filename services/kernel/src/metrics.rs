//! The kernel provider's metrics (through `omicos_servicekit::metrics`):
//! `omicos.kernel.kernels`, kernels by state — `session` (serving a session)
//! and `warm` (started and pooled for the next new session).

use crate::sessions::Kernels;
use omicos_servicekit::metrics::{kv, meter};
use opentelemetry::metrics::ObservableGauge;
use std::sync::{Arc, Weak};

/// The kernels gauge over `kernels`. Keep it alive.
pub fn kernels_gauge(kernels: &Arc<Kernels>) -> ObservableGauge<u64> {
    let weak: Weak<Kernels> = Arc::downgrade(kernels);
    meter()
        .u64_observable_gauge("omicos.kernel.kernels")
        .with_description(
            "Kernels of this instance, by state: session (serving a session), warm (pooled)",
        )
        .with_callback(move |o| {
            if let Some(k) = weak.upgrade() {
                o.observe(k.session_count() as u64, &[kv("state", "session")]);
                o.observe(k.warm_count() as u64, &[kv("state", "warm")]);
            }
        })
        .build()
}
