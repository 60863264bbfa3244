//! Opening the database an omicos store lives in, from its URL: SQLite (WAL,
//! file and directory created when missing) or PostgreSQL. The memory store
//! and the conversation store share this so both behave alike.

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::time::Duration;

/// A pool on one of the two backends.
#[derive(Clone, Debug)]
pub enum Db {
    /// SQLite.
    Sqlite(SqlitePool),
    /// PostgreSQL.
    Pg(PgPool),
}

impl Db {
    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "sqlite",
            Db::Pg(_) => "postgres",
        }
    }
}

/// Why a database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL is not one this store takes.
    #[error("{0}")]
    Invalid(String),
    /// The SQLite file's directory cannot be created.
    #[error("{0}")]
    Io(String),
    /// The database refused the connection.
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
}

/// How to open.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions<'a> {
    /// What the store is called in messages ("memory store").
    pub what: &'a str,
    /// The URL forms the store accepts, for the message about a bad URL.
    pub expected: &'a str,
    /// Enforce foreign keys on SQLite.
    pub foreign_keys: bool,
}

/// Opens `url` (`sqlite://PATH`, `sqlite::memory:`, `postgres://…`).
pub async fn open(url: &str, o: OpenOptions<'_>) -> Result<Db, OpenError> {
    if url.starts_with("sqlite:") {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(|e| OpenError::Invalid(format!("{} URL {url}: {e}", o.what)))?
            .create_if_missing(true)
            // WAL: readers never block the writer. NORMAL sync in WAL mode: a
            // killed process loses nothing that committed; only a power cut may
            // lose the last commits.
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(o.foreign_keys)
            // Statement journals of multi-row inserts in memory, not temp files.
            .pragma("temp_store", "memory")
            // A checkpoint every ~40 MiB of WAL instead of ~4 MiB: a page that
            // every batch rewrites (an index leaf) is copied back once per
            // checkpoint, not once per few batches.
            .pragma("wal_autocheckpoint", "10000");
        if let Some(dir) = std::path::Path::new(opts.get_filename()).parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| OpenError::Io(format!("cannot create {}: {e}", dir.display())))?;
        }
        // An in-memory database exists per connection: keep one.
        let max = if url.contains(":memory:") { 1 } else { 8 };
        Ok(Db::Sqlite(
            SqlitePoolOptions::new()
                .max_connections(max)
                .connect_with(opts)
                .await?,
        ))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| OpenError::Invalid(format!("{} URL: {e}", o.what)))?;
        Ok(Db::Pg(
            PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(opts)
                .await?,
        ))
    } else {
        Err(OpenError::Invalid(format!(
            "{} URL {url:?}: expected {}",
            o.what, o.expected
        )))
    }
}

/// A store's schema history: numbered steps per backend, recorded in `table`.
#[derive(Clone, Copy, Debug)]
pub struct Migrations<'a> {
    /// The table that records applied versions (a name from code, never user input).
    pub table: &'a str,
    /// PostgreSQL advisory lock id, so replicas starting together migrate one at a time.
    pub pg_lock: i64,
    /// SQLite steps, in order.
    pub sqlite: &'a [&'a str],
    /// PostgreSQL steps, in order.
    pub pg: &'a [&'a str],
}

/// Applies the steps not yet recorded, in one transaction.
pub async fn migrate(db: &Db, m: Migrations<'_>) -> Result<(), sqlx::Error> {
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {} (version BIGINT PRIMARY KEY, applied_ms BIGINT NOT NULL)",
        m.table
    );
    let max = format!("SELECT COALESCE(MAX(version), 0) FROM {}", m.table);
    let record = format!(
        "INSERT INTO {} (version, applied_ms) VALUES ($1, $2)",
        m.table
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    macro_rules! apply {
        ($tx:ident, $steps:expr) => {{
            sqlx::query(sqlx::AssertSqlSafe(create.clone()))
                .execute(&mut *$tx)
                .await?;
            let have: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(max.clone()))
                .fetch_one(&mut *$tx)
                .await?;
            for (i, step) in $steps.iter().enumerate().skip(have as usize) {
                sqlx::raw_sql(sqlx::AssertSqlSafe(*step))
                    .execute(&mut *$tx)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(record.clone()))
                    .bind(i as i64 + 1)
                    .bind(now_ms)
                    .execute(&mut *$tx)
                    .await?;
            }
            $tx.commit().await
        }};
    }
    match db {
        Db::Sqlite(p) => {
            let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
            apply!(tx, m.sqlite)
        }
        Db::Pg(p) => {
            let mut tx = p.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(m.pg_lock)
                .execute(&mut *tx)
                .await?;
            apply!(tx, m.pg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: OpenOptions<'static> = OpenOptions {
        what: "test store",
        expected: "sqlite://PATH or postgres://...",
        foreign_keys: true,
    };

    #[tokio::test]
    async fn sqlite_file_and_directory_are_created() {
        let dir = std::env::temp_dir().join(format!("omicos-sqldb-{}", std::process::id()));
        let url = format!("sqlite://{}", dir.join("a/b/x.db").display());
        let db = open(&url, O).await.unwrap();
        assert_eq!(db.backend(), "sqlite");
        assert!(dir.join("a/b/x.db").exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn migrations_apply_once_and_resume() {
        let db = open("sqlite::memory:", O).await.unwrap();
        let steps = ["CREATE TABLE a (x INTEGER)", "CREATE TABLE b (y INTEGER)"];
        let m = Migrations {
            table: "t_schema",
            pg_lock: 1,
            sqlite: &steps[..1],
            pg: &[],
        };
        migrate(&db, m).await.unwrap();
        migrate(&db, m).await.unwrap();
        migrate(
            &db,
            Migrations {
                sqlite: &steps,
                ..m
            },
        )
        .await
        .unwrap();
        let Db::Sqlite(p) = &db else { unreachable!() };
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t_schema")
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(n, 2);
        sqlx::query("INSERT INTO b (y) VALUES (1)")
            .execute(p)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_bad_url_names_the_store_and_the_forms() {
        let e = open("mysql://x", O).await.unwrap_err().to_string();
        assert!(
            e.contains("test store") && e.contains("sqlite://PATH"),
            "{e}"
        );
    }
}
