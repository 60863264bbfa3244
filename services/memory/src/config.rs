//! The memory service's configuration (`omicos-memory --config FILE`, then
//! `OMICOS_*` environment variables; see docs/configuration.md).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The memory service's configuration (`omicos-memory --config FILE`, then
/// `OMICOS_*` environment variables).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to serve on (`OMICOS_LISTEN`).
    pub listen: String,
    /// Registry to register with, e.g. `http://127.0.0.1:7002`; empty: do not register (`OMICOS_REGISTRY`).
    pub registry: String,
    /// Endpoint announced to the registry; empty: `http://<bound address>` (`OMICOS_ADVERTISE`).
    pub advertise: String,
    /// TLS (`tls.cert`, `tls.key`, `tls.client_ca`, `tls.ca`): the port
    /// serves TLS with `cert`/`key`; with `client_ca` only peers presenting a
    /// certificate from that CA get in (mutual TLS); `ca` verifies an
    /// `https://` registry, `cert`/`key` is also the client certificate to it.
    pub tls: omicos_servicekit::TlsConfig,
    /// The TTL asked of the registry, whole seconds (0: the registry's default).
    #[serde(with = "duration")]
    pub registry_ttl: Duration,
    /// Workspace root (`OMICOS_WORKSPACE`).
    pub workspace: PathBuf,
    /// How long running calls get to finish on SIGTERM (`OMICOS_SHUTDOWN_GRACE`).
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Log filter when `RUST_LOG` is unset (`OMICOS_LOG`).
    pub log: String,
    /// The store.
    pub memory: MemoryConfig,
}

/// The `memory:` section.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// `sqlite://PATH` or `postgres://USER@HOST/DB`; empty: `sqlite://<workspace>/.omicos/memory.db`
    /// (`OMICOS_MEMORY_STORE_URL`).
    pub store_url: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            registry: String::new(),
            advertise: String::new(),
            tls: Default::default(),
            registry_ttl: Duration::ZERO,
            workspace: PathBuf::from("."),
            shutdown_grace: Duration::from_secs(10),
            log: "info".into(),
            memory: MemoryConfig::default(),
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[Renamed::to("grace_seconds", "shutdown_grace")];

    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        omicos_servicekit::config::require_registry_ttl("registry_ttl", self.registry_ttl)
    }

    fn log_filter(&self) -> Option<&str> {
        Some(&self.log)
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }
}

impl Config {
    /// The store URL: the configured one, or the workspace's SQLite file.
    pub fn store_url(&self) -> String {
        default_store_url(&self.memory.store_url, &self.workspace)
    }
}

/// `url` when set, else `sqlite://<workspace>/.omicos/memory.db`.
pub fn default_store_url(url: &str, workspace: &Path) -> String {
    if url.trim().is_empty() {
        format!(
            "sqlite://{}",
            workspace.join(".omicos").join("memory.db").display()
        )
    } else {
        url.trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layers_and_default_url() {
        let env = vec![(
            "OMICOS_MEMORY_STORE_URL".to_string(),
            "postgres://u@h/db".to_string(),
        )];
        let cfg: Config = omicos_servicekit::load_config(None, &env).unwrap();
        assert_eq!(cfg.store_url(), "postgres://u@h/db");
        let cfg: Config = omicos_servicekit::load_config(None, &[]).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.store_url(), "sqlite://./.omicos/memory.db");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.yaml");
        std::fs::write(
            &file,
            "memory:\n  store_url: ${DB:-sqlite:///tmp/x.db}\n  nope: 1\n",
        )
        .unwrap();
        let err = omicos_servicekit::load_config::<Config>(Some(&file), &[]).unwrap_err();
        assert!(err.to_string().contains("memory.nope"), "{err}");
        std::fs::write(&file, "memory:\n  store_url: ${DB:-sqlite:///tmp/x.db}\n").unwrap();
        let cfg: Config = omicos_servicekit::load_config(Some(&file), &[]).unwrap();
        assert_eq!(cfg.store_url(), "sqlite:///tmp/x.db");
    }
}
