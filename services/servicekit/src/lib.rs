//! What every omicos service shares: layered configuration, telemetry, a gRPC
//! host with health and reflection, graceful shutdown with a bounded drain, TLS with
//! certificates re-read when they rotate ([`tls`]),
//! and the one way a service binary starts and exits ([`run_main`]).

pub mod config;
pub mod host;
pub mod metrics;
pub mod shutdown;
pub mod startup;
pub mod telemetry;
pub mod tls;

pub use config::{ConfigError, ServiceConfig, load_config};
pub use host::{Host, HostOptions};
pub use shutdown::Shutdown;
pub use startup::{Binary, Started, run_main};
pub use tls::{ClientTls, PeerInfo, ServerTls, TlsConfig, TlsConnector};
