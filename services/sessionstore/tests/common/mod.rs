//! Backends for the tests (see omicos-testdb): SQLite always, PostgreSQL when it answers.

#![allow(dead_code)]

pub use omicos_testdb::Backend;

/// A new SQLite database.
pub fn sqlite() -> Backend {
    omicos_testdb::sqlite("sessions.db")
}

/// SQLite, then PostgreSQL when reachable.
pub async fn all(test: &str) -> Vec<Backend> {
    omicos_testdb::all(test, "sessions.db", "ost").await
}
