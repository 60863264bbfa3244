//! omicos long-term memory: the `memory` tool provider (`memory__save`,
//! `memory__search`, `memory__list`, `memory__update`, `memory__forget`) over a
//! store on SQLite (FTS5, the default, under `<workspace>/.omicos/memory.db`)
//! or PostgreSQL (tsvector, for replicated deployments).
//!
//! The scope of every call (workspace or user) comes from the call context
//! that the tool-runner sets, never from the model's arguments.

pub mod config;
pub mod provider;
pub mod store;
pub mod terms;

pub use provider::MemoryProvider;
pub use store::{Hit, Memory, MemoryError, MemoryStore, NewMemory, Page, SearchQuery};

pub use config::{Config, MemoryConfig, default_store_url};

#[cfg(test)]
mod tests {
    use super::*;

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
