//! What every omicos service shares: layered configuration, telemetry, a gRPC
//! host with health and reflection, and graceful shutdown with a bounded drain.

pub mod config;
pub mod host;
pub mod shutdown;
pub mod telemetry;

pub use config::{ConfigError, load_config};
pub use host::{Host, HostOptions};
pub use shutdown::Shutdown;
