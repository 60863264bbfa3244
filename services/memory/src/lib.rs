//! omicos long-term memory: the `memory` tool provider (`memory__save`,
//! `memory__search`, `memory__list`, `memory__update`, `memory__forget`) over a
//! store on SQLite (FTS5, the default, under `<workspace>/.omicos/memory.db`)
//! or PostgreSQL (tsvector, for replicated deployments).
//!
//! The scope of every call (workspace or user) comes from the call context
//! that the tool-runner sets, never from the model's arguments.

pub mod provider;
pub mod store;
pub mod terms;

pub use provider::MemoryProvider;
pub use store::{Hit, Memory, MemoryError, MemoryStore, NewMemory, Page, SearchQuery};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    /// Workspace root (`OMICOS_WORKSPACE`).
    pub workspace: PathBuf,
    /// Seconds to let running calls finish on SIGTERM (`OMICOS_GRACE_SECONDS`).
    pub grace_seconds: u64,
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
            workspace: PathBuf::from("."),
            grace_seconds: 10,
            log: "info".into(),
            memory: MemoryConfig::default(),
        }
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

    #[tokio::test]
    async fn a_bad_store_url_is_a_clear_error() {
        let e = MemoryStore::open("mysql://x").await.unwrap_err();
        assert!(
            e.to_string()
                .contains("expected sqlite://PATH or postgres://"),
            "{e}"
        );
    }
}
