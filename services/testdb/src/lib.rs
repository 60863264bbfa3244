//! Backends for the tests: a fresh SQLite file always, and a fresh PostgreSQL
//! schema when a server answers on 127.0.0.1:5432.

use sqlx::{Connection, PgConnection};
use std::time::Duration;

/// The PostgreSQL server the tests use (trust auth); `OMICOS_TEST_PG_URL` overrides it.
pub fn pg_admin_url() -> String {
    std::env::var("OMICOS_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A store location that cleans up after itself.
pub struct Backend {
    /// `sqlite` or `postgres`.
    pub name: &'static str,
    /// The URL to open.
    pub url: String,
    schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(schema) = self.schema.take() {
            // Best effort, on a thread of its own: Drop may run inside a runtime.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    if let Ok(mut c) = PgConnection::connect(&pg_admin_url()).await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS {schema} CASCADE"
                        )))
                        .execute(&mut c)
                        .await;
                    }
                });
            })
            .join();
        }
    }
}

/// A new SQLite database `<tmp>/.omicos/<file>` in a temporary directory.
pub fn sqlite(file: &str) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}",
        dir.path().join(".omicos").join(file).display()
    );
    Backend {
        name: "sqlite",
        url,
        schema: None,
        _dir: Some(dir),
    }
}

/// A new, empty schema (named `<prefix>_<uuid>`) on the local PostgreSQL, or
/// None (with a visible message) when it does not answer.
pub async fn postgres(test: &str, prefix: &str) -> Option<Backend> {
    let conn = tokio::time::timeout(
        Duration::from_secs(3),
        PgConnection::connect(&pg_admin_url()),
    )
    .await;
    let mut c = match conn {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            eprintln!("SKIPPED: PostgreSQL not reachable ({test}): {e}");
            return None;
        }
        Err(_) => {
            eprintln!("SKIPPED: PostgreSQL not reachable ({test}): timeout");
            return None;
        }
    };
    let schema = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut c)
        .await
        .unwrap();
    let url = format!("{}?options[search_path]={schema}", pg_admin_url());
    Some(Backend {
        name: "postgres",
        url,
        schema: Some(schema),
        _dir: None,
    })
}

/// SQLite, then PostgreSQL when reachable.
pub async fn all(test: &str, file: &str, prefix: &str) -> Vec<Backend> {
    let mut v = vec![sqlite(file)];
    v.extend(postgres(test, prefix).await);
    v
}
