//! Backends for the tests: a fresh SQLite file always, and a fresh PostgreSQL
//! schema when a server answers on 127.0.0.1:5432.
//!
//! Every PostgreSQL test goes through [`postgres`], so one rule holds for all
//! of them: when the server does not answer, the test prints `SKIPPED` and
//! passes, except under CI (`CI=true`), where PostgreSQL is expected and the
//! test fails saying so. `OMICOS_TEST_PG_URL` names the server;
//! `OMICOS_TEST_POSTGRES`, its old name, is still read with a warning.

use sqlx::{Connection, PgConnection};
use std::sync::Once;
use std::time::Duration;

/// The variable that names the tests' PostgreSQL server (trust auth).
pub const PG_URL_VAR: &str = "OMICOS_TEST_PG_URL";
/// The old name of [`PG_URL_VAR`] (tests/tests/durable.rs used it): read, with a warning.
pub const OLD_PG_URL_VAR: &str = "OMICOS_TEST_POSTGRES";
/// The server when neither variable is set: the machine's PostgreSQL, database `test`.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Where the PostgreSQL tests connect, and whether they may skip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSettings {
    /// The server, as an admin URL (schemas are created there).
    pub admin_url: String,
    /// Whether a missing server fails the test instead of skipping it (`CI=true`).
    pub required: bool,
}

impl PgSettings {
    /// From the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From `get` (a variable's value by name): [`PG_URL_VAR`], else
    /// [`OLD_PG_URL_VAR`] (with a warning), else [`DEFAULT_PG_URL`];
    /// required when `CI` is `true` or `1`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let admin_url = match (set(PG_URL_VAR), set(OLD_PG_URL_VAR)) {
            (Some(url), _) => url,
            (None, Some(url)) => {
                static WARN: Once = Once::new();
                WARN.call_once(|| {
                    eprintln!(
                        "warning: {OLD_PG_URL_VAR} is deprecated: it is now {PG_URL_VAR} (the old name is read until the next release)"
                    )
                });
                url
            }
            (None, None) => DEFAULT_PG_URL.to_owned(),
        };
        let required = set("CI").is_some_and(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "true" || v == "1"
        });
        Self {
            admin_url,
            required,
        }
    }
}

/// The PostgreSQL server the tests use (see [`PgSettings::from_env`]).
pub fn pg_admin_url() -> String {
    PgSettings::from_env().admin_url
}

/// A store location that cleans up after itself.
pub struct Backend {
    /// `sqlite` or `postgres`.
    pub name: &'static str,
    /// The URL to open.
    pub url: String,
    schema: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some((admin, schema)) = self.schema.take() {
            // Best effort, on a thread of its own: Drop may run inside a runtime.
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async {
                    if let Ok(mut c) = PgConnection::connect(&admin).await {
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
    let dir = tempfile::tempdir().expect("a temporary directory");
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

/// A new, empty schema (named `<prefix>_<uuid>`) on the tests' PostgreSQL.
/// None, with a visible `SKIPPED` line, when it does not answer; under
/// `CI=true` a missing server panics instead, so the test fails.
pub async fn postgres(test: &str, prefix: &str) -> Option<Backend> {
    postgres_with(&PgSettings::from_env(), test, prefix).await
}

/// [`postgres`] with explicit settings.
pub async fn postgres_with(settings: &PgSettings, test: &str, prefix: &str) -> Option<Backend> {
    let conn = tokio::time::timeout(
        Duration::from_secs(3),
        PgConnection::connect(&settings.admin_url),
    )
    .await;
    let why = match conn {
        Ok(Ok(mut c)) => {
            let schema = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&mut c)
                .await
                .unwrap_or_else(|e| panic!("{test}: CREATE SCHEMA {schema}: {e}"));
            let sep = if settings.admin_url.contains('?') {
                '&'
            } else {
                '?'
            };
            let url = format!("{}{sep}options[search_path]={schema}", settings.admin_url);
            return Some(Backend {
                name: "postgres",
                url,
                schema: Some((settings.admin_url.clone(), schema)),
                _dir: None,
            });
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 3 s".to_owned(),
    };
    if settings.required {
        panic!(
            "{test}: PostgreSQL is expected under CI=true but {} does not answer ({why}); start it (scripts/test.sh starts the local cluster) or point {PG_URL_VAR} at one",
            settings.admin_url
        );
    }
    eprintln!(
        "SKIPPED: PostgreSQL not reachable ({test}) at {}: {why}",
        settings.admin_url
    );
    None
}

/// SQLite, then PostgreSQL when reachable (required under CI).
pub async fn all(test: &str, file: &str, prefix: &str) -> Vec<Backend> {
    let mut v = vec![sqlite(file)];
    v.extend(postgres(test, prefix).await);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn one_name_for_the_server_the_old_one_still_read_and_ci_requires_it() {
        let s = PgSettings::from_vars(vars(&[]));
        assert_eq!(s.admin_url, DEFAULT_PG_URL);
        assert!(!s.required);
        let s = PgSettings::from_vars(vars(&[(OLD_PG_URL_VAR, "postgres://old@h/db")]));
        assert_eq!(s.admin_url, "postgres://old@h/db");
        let s = PgSettings::from_vars(vars(&[
            (OLD_PG_URL_VAR, "postgres://old@h/db"),
            (PG_URL_VAR, "postgres://new@h/db"),
            ("CI", "true"),
        ]));
        assert_eq!(s.admin_url, "postgres://new@h/db");
        assert!(s.required);
        assert!(PgSettings::from_vars(vars(&[("CI", "1")])).required);
        assert!(!PgSettings::from_vars(vars(&[("CI", "false")])).required);
    }

    /// Nothing listens on port 1.
    fn nowhere(required: bool) -> PgSettings {
        PgSettings {
            admin_url: "postgres://postgres@127.0.0.1:1/test".into(),
            required,
        }
    }

    #[tokio::test]
    async fn a_missing_server_skips_outside_ci() {
        assert!(postgres_with(&nowhere(false), "t", "x").await.is_none());
    }

    #[tokio::test]
    #[should_panic(expected = "PostgreSQL is expected under CI=true")]
    async fn a_missing_server_fails_under_ci() {
        let _ = postgres_with(&nowhere(true), "t", "x").await;
    }
}
