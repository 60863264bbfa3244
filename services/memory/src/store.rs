//! The memory store: one table of entries on SQLite (FTS5) or PostgreSQL
//! (tsvector), with history kept forever.
//!
//! Entries are never deleted. `update` and a `save` that reuses a `key`
//! expire the old entry as `superseded` and link both ways
//! (`superseded_by` / `supersedes`); `forget` expires it as `forgotten`.
//! Every query names the scope, so one scope never sees another's entries.

use crate::terms;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use std::time::Duration;

/// The categories an entry can have (what the model is told to use them for
/// is in the tool descriptions).
pub const CATEGORIES: &[&str] = &["user", "feedback", "project", "reference"];
/// Longest content accepted, in bytes.
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;
/// Most tags per entry.
pub const MAX_TAGS: usize = 32;
/// Longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 64;
/// Largest `limit` of a search or list.
pub const MAX_LIMIT: i64 = 100;
/// The age, in ms, at which recency weighs half of its maximum in the ranking.
pub const RECENCY_SCALE_MS: f64 = 7.0 * 24.0 * 3600.0 * 1000.0;

/// A memory operation that failed. The message is what the model reads.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// No entry with that id in this scope.
    #[error("memory {0} not found")]
    NotFound(i64),
    /// The input cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// The entry is no longer valid, or another writer got there first.
    #[error("{0}")]
    Conflict(String),
    /// The database failed.
    #[error("memory store: {0}")]
    Backend(String),
}

impl From<sqlx::Error> for MemoryError {
    fn from(e: sqlx::Error) -> Self {
        if e.as_database_error()
            .is_some_and(|d| d.is_unique_violation())
        {
            return MemoryError::Conflict(
                "another writer saved an entry with the same key at the same time; retry".into(),
            );
        }
        MemoryError::Backend(e.to_string())
    }
}

/// Result alias.
pub type MemoryResult<T> = Result<T, MemoryError>;

/// One entry, valid or expired.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    /// The id, unique across scopes.
    pub id: i64,
    /// user | feedback | project | reference.
    pub category: String,
    /// The text.
    pub content: String,
    /// Free-form labels.
    pub tags: Vec<String>,
    /// An optional caller-chosen key; at most one valid entry per key and scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Unix ms.
    pub created_ms: i64,
    /// Unix ms of the last save, search or list that returned it.
    pub last_used_ms: i64,
    /// Unix ms it stopped being valid; None while valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expired_ms: Option<i64>,
    /// `superseded` or `forgotten`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expired_reason: Option<String>,
    /// The entry this one replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<i64>,
    /// The entry that replaced this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<i64>,
}

/// A search hit: the entry and its combined score (higher is better).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Hit {
    /// The entry.
    #[serde(flatten)]
    pub memory: Memory,
    /// Text relevance weighted by recency of use.
    pub score: f64,
}

/// What to save.
#[derive(Clone, Debug, Default)]
pub struct NewMemory {
    /// The text.
    pub content: String,
    /// One of [`CATEGORIES`].
    pub category: String,
    /// Labels.
    pub tags: Vec<String>,
    /// A key: saving again under it supersedes the previous entry.
    pub key: Option<String>,
}

/// What to search for.
#[derive(Clone, Debug, Default)]
pub struct SearchQuery {
    /// The user's words (never query syntax).
    pub text: String,
    /// Only this category.
    pub category: Option<String>,
    /// Only entries carrying every one of these tags.
    pub tags: Vec<String>,
    /// At most this many hits.
    pub limit: i64,
    /// Also superseded and forgotten entries.
    pub include_expired: bool,
}

/// A page of [`MemoryStore::list`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Page {
    /// Entries, newest first.
    pub entries: Vec<Memory>,
    /// Pass as `cursor` for the next page; None at the end.
    pub next_cursor: Option<String>,
}

use omicos_sqldb::Db;

/// Runs the same body on either pool type (the SQL text is shared where
/// both dialects agree: `$n` placeholders work on SQLite too).
macro_rules! on_db {
    ($db:expr, $p:ident => $body:expr) => {
        match $db {
            Db::Sqlite($p) => $body,
            Db::Pg($p) => $body,
        }
    };
}

/// Runs the body in a write transaction: `BEGIN IMMEDIATE` on SQLite so that
/// concurrent writers queue on the busy timeout instead of failing when a
/// read lock cannot be upgraded.
macro_rules! in_tx {
    ($db:expr, $tx:ident => $body:expr) => {
        match $db {
            Db::Sqlite(p) => {
                let mut $tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let r = $body;
                $tx.commit().await?;
                r
            }
            Db::Pg(p) => {
                let mut $tx = p.begin().await?;
                let r = $body;
                $tx.commit().await?;
                r
            }
        }
    };
}

/// The statements of one save, inside an open transaction `$tx`; evaluates
/// to the new id.
macro_rules! save_in_tx {
    ($tx:ident, $scope:expr, $new:expr, $now:expr) => {{
        let (scope, new, now): (&str, &NewMemory, i64) = ($scope, $new, $now);

            let old: Option<i64> = match &new.key {
                Some(key) => sqlx::query_scalar(
                    "UPDATE memories SET expired_ms = $1, expired_reason = 'superseded' \
                     WHERE scope = $2 AND key = $3 AND expired_ms IS NULL RETURNING id",
                )
                .bind(now)
                .bind(scope)
                .bind(key)
                .fetch_optional(&mut *$tx)
                .await?,
                None => None,
            };
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO memories (scope, category, content, tags, tags_text, key, created_ms, last_used_ms, supersedes) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8) RETURNING id",
            )
            .bind(scope)
            .bind(&new.category)
            .bind(&new.content)
            .bind(serde_json::to_string(&new.tags).unwrap_or_else(|_| "[]".into()))
            .bind(new.tags.join(" "))
            .bind(&new.key)
            .bind(now)
            .bind(old)
            .fetch_one(&mut *$tx)
            .await?;
            for tag in &new.tags {
                sqlx::query("INSERT INTO memory_tags (memory_id, tag) VALUES ($1, $2)")
                    .bind(id)
                    .bind(tag)
                    .execute(&mut *$tx)
                    .await?;
            }
            if let Some(old) = old {
                sqlx::query("UPDATE memories SET superseded_by = $1 WHERE id = $2")
                    .bind(id)
                    .bind(old)
                    .execute(&mut *$tx)
                    .await?;
            }
            id
    }};
}

macro_rules! memory_from_row {
    ($row:expr) => {{
        let row = $row;
        let tags: String = row.try_get("tags")?;
        Memory {
            id: row.try_get("id")?,
            category: row.try_get("category")?,
            content: row.try_get("content")?,
            tags: serde_json::from_str(&tags).unwrap_or_default(),
            key: row.try_get("key")?,
            created_ms: row.try_get("created_ms")?,
            last_used_ms: row.try_get("last_used_ms")?,
            expired_ms: row.try_get("expired_ms")?,
            expired_reason: row.try_get("expired_reason")?,
            supersedes: row.try_get("supersedes")?,
            superseded_by: row.try_get("superseded_by")?,
        }
    }};
}

const COLUMNS: &str = "id, category, content, tags, key, created_ms, last_used_ms, expired_ms, expired_reason, supersedes, superseded_by";

const SQLITE_SCHEMA_V1: &str = r#"
CREATE TABLE memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    category TEXT NOT NULL,
    content TEXT NOT NULL,
    tags TEXT NOT NULL,
    tags_text TEXT NOT NULL,
    key TEXT,
    created_ms INTEGER NOT NULL,
    last_used_ms INTEGER NOT NULL,
    expired_ms INTEGER,
    expired_reason TEXT,
    supersedes INTEGER REFERENCES memories(id),
    superseded_by INTEGER
);
CREATE INDEX memories_scope_id ON memories(scope, id);
CREATE UNIQUE INDEX memories_scope_key ON memories(scope, key) WHERE key IS NOT NULL AND expired_ms IS NULL;
CREATE TABLE memory_tags (
    memory_id INTEGER NOT NULL REFERENCES memories(id),
    tag TEXT NOT NULL,
    PRIMARY KEY (memory_id, tag)
);
CREATE INDEX memory_tags_tag ON memory_tags(tag, memory_id);
CREATE VIRTUAL TABLE memories_fts USING fts5(
    content, tags_text, content='memories', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, content, tags_text) VALUES (new.id, new.content, new.tags_text);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, content, tags_text) VALUES ('delete', old.id, old.content, old.tags_text);
END;
"#;

// fillfactor 70: every read rewrites last_used_ms; with room on the page the
// new row version is a HOT update (no indexed column changes), so the GIN
// index is not touched and its pending list does not grow with each search.
const PG_SCHEMA_V1: &str = r#"
CREATE TABLE memories (
    id BIGSERIAL PRIMARY KEY,
    scope TEXT NOT NULL,
    category TEXT NOT NULL,
    content TEXT NOT NULL,
    tags TEXT NOT NULL,
    tags_text TEXT NOT NULL,
    key TEXT,
    created_ms BIGINT NOT NULL,
    last_used_ms BIGINT NOT NULL,
    expired_ms BIGINT,
    expired_reason TEXT,
    supersedes BIGINT REFERENCES memories(id),
    superseded_by BIGINT,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', content || ' ' || tags_text)) STORED
) WITH (fillfactor = 70);
CREATE INDEX memories_scope_id ON memories(scope, id);
CREATE UNIQUE INDEX memories_scope_key ON memories(scope, key) WHERE key IS NOT NULL AND expired_ms IS NULL;
CREATE INDEX memories_tsv ON memories USING GIN (tsv);
CREATE TABLE memory_tags (
    memory_id BIGINT NOT NULL REFERENCES memories(id),
    tag TEXT NOT NULL,
    PRIMARY KEY (memory_id, tag)
);
CREATE INDEX memory_tags_tag ON memory_tags(tag, memory_id);
"#;

/// Schema steps, applied in order; the index + 1 is the schema version.
const SQLITE_MIGRATIONS: &[&str] = &[SQLITE_SCHEMA_V1];
const PG_MIGRATIONS: &[&str] = &[PG_SCHEMA_V1];

/// The store. Cheap to clone (a pool inside).
#[derive(Clone, Debug)]
pub struct MemoryStore {
    db: Db,
}

impl MemoryStore {
    /// Opens `url` (`sqlite://path`, `sqlite::memory:`, `postgres://...`),
    /// creating the SQLite file and its directory when missing, and runs
    /// the migrations.
    pub async fn open(url: &str) -> MemoryResult<Self> {
        let db = omicos_sqldb::open(
            url,
            omicos_sqldb::OpenOptions {
                what: "memory store",
                expected: "sqlite://PATH or postgres://...",
                foreign_keys: true,
            },
        )
        .await
        .map_err(|e| match e {
            omicos_sqldb::OpenError::Invalid(m) => MemoryError::Invalid(m),
            omicos_sqldb::OpenError::Io(m) => MemoryError::Backend(m),
            omicos_sqldb::OpenError::Sqlx(e) => MemoryError::from(e),
        })?;
        let me = Self { db };
        me.migrate().await?;
        Ok(me)
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.db.backend()
    }

    async fn migrate(&self) -> MemoryResult<()> {
        let m = omicos_sqldb::Migrations {
            table: "omicos_memory_schema",
            pg_lock: 7002001,
            sqlite: SQLITE_MIGRATIONS,
            pg: PG_MIGRATIONS,
        };
        Ok(omicos_sqldb::migrate(&self.db, m).await?)
    }

    /// Saves an entry. With a `key` that a valid entry of the scope already
    /// has, that entry is superseded by the new one.
    pub async fn save(&self, scope: &str, new: NewMemory) -> MemoryResult<Memory> {
        let new = check_new(new)?;
        // A concurrent save under the same key loses the unique index race
        // (PostgreSQL's UPDATE does not see the winner's new row): retry; each
        // retry sees the winner and supersedes it.
        let mut attempt: u64 = 0;
        loop {
            match self.save_once(scope, &new).await {
                Err(MemoryError::Conflict(_)) if attempt < 20 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(attempt * 2)).await;
                }
                r => return r,
            }
        }
    }

    async fn save_once(&self, scope: &str, new: &NewMemory) -> MemoryResult<Memory> {
        let now = now_ms();
        let id = in_tx!(&self.db, tx => save_in_tx!(tx, scope, new, now));
        self.get(scope, id).await?.ok_or(MemoryError::NotFound(id))
    }

    /// Saves many entries in one transaction (imports, benchmarks): all or
    /// none. Keys supersede as in [`MemoryStore::save`]. Returns the new ids.
    pub async fn save_many(&self, scope: &str, entries: Vec<NewMemory>) -> MemoryResult<Vec<i64>> {
        let entries = entries
            .into_iter()
            .map(check_new)
            .collect::<MemoryResult<Vec<_>>>()?;
        let now = now_ms();
        let ids = in_tx!(&self.db, tx => {
            let mut ids = Vec::with_capacity(entries.len());
            for new in &entries {
                ids.push(save_in_tx!(tx, scope, new, now));
            }
            ids
        });
        Ok(ids)
    }

    /// One entry of the scope, valid or not, without touching its last-used time.
    pub async fn get(&self, scope: &str, id: i64) -> MemoryResult<Option<Memory>> {
        let sql = format!("SELECT {COLUMNS} FROM memories WHERE scope = $1 AND id = $2");
        on_db!(&self.db, p => {
            let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(scope).bind(id).fetch_optional(p).await?;
            match row {
                Some(r) => Ok(Some(memory_from_row!(&r))),
                None => Ok(None),
            }
        })
    }

    /// Replaces entry `id` with `content`: the old entry is expired as
    /// superseded and kept; the new one (same category, tags and key) points to it.
    pub async fn update(&self, scope: &str, id: i64, content: &str) -> MemoryResult<Memory> {
        let content = check_content(content)?;
        let now = now_ms();
        let new_id: Option<i64> = in_tx!(&self.db, tx => {
            // Expiring first takes the row lock (PostgreSQL) so two updates of
            // the same entry cannot both succeed.
            let old = sqlx::query(
                "UPDATE memories SET expired_ms = $1, expired_reason = 'superseded' \
                 WHERE scope = $2 AND id = $3 AND expired_ms IS NULL RETURNING category, tags, tags_text, key",
            )
            .bind(now)
            .bind(scope)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            match old {
                None => None,
                Some(old) => {
                    let category: String = old.try_get("category")?;
                    let tags: String = old.try_get("tags")?;
                    let tags_text: String = old.try_get("tags_text")?;
                    let key: Option<String> = old.try_get("key")?;
                    let new_id: i64 = sqlx::query_scalar(
                        "INSERT INTO memories (scope, category, content, tags, tags_text, key, created_ms, last_used_ms, supersedes) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8) RETURNING id",
                    )
                    .bind(scope)
                    .bind(&category)
                    .bind(&content)
                    .bind(&tags)
                    .bind(&tags_text)
                    .bind(&key)
                    .bind(now)
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                    sqlx::query("INSERT INTO memory_tags (memory_id, tag) SELECT $1, tag FROM memory_tags WHERE memory_id = $2")
                        .bind(new_id)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("UPDATE memories SET superseded_by = $1 WHERE id = $2")
                        .bind(new_id)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    Some(new_id)
                }
            }
        });
        match new_id {
            Some(n) => self.get(scope, n).await?.ok_or(MemoryError::NotFound(n)),
            None => Err(self.why_not_valid(scope, id).await),
        }
    }

    /// Expires entry `id` as forgotten; it is kept, never deleted. Forgetting
    /// an already expired entry changes nothing and returns it as it is.
    pub async fn forget(&self, scope: &str, id: i64) -> MemoryResult<Memory> {
        let now = now_ms();
        on_db!(&self.db, p => {
            sqlx::query(
                "UPDATE memories SET expired_ms = $1, expired_reason = 'forgotten' \
                 WHERE scope = $2 AND id = $3 AND expired_ms IS NULL",
            )
            .bind(now)
            .bind(scope)
            .bind(id)
            .execute(p)
            .await?;
        });
        self.get(scope, id).await?.ok_or(MemoryError::NotFound(id))
    }

    async fn why_not_valid(&self, scope: &str, id: i64) -> MemoryError {
        match self.get(scope, id).await {
            Ok(None) => MemoryError::NotFound(id),
            Ok(Some(m)) => match (m.expired_reason.as_deref(), m.superseded_by) {
                (Some("superseded"), Some(by)) => MemoryError::Conflict(format!(
                    "memory {id} was superseded by memory {by}; update {by} instead"
                )),
                (reason, _) => MemoryError::Conflict(format!(
                    "memory {id} is expired ({}); save a new entry instead",
                    reason.unwrap_or("expired")
                )),
            },
            Err(e) => e,
        }
    }

    /// Full-text search of the scope, ranked by text relevance weighted by how
    /// recently each entry was used. Marks the hits as used now.
    pub async fn search(&self, scope: &str, q: &SearchQuery) -> MemoryResult<Vec<Hit>> {
        let words = terms::search_words(&q.text);
        if words.is_empty() {
            return Ok(vec![]);
        }
        let limit = q.limit.clamp(1, MAX_LIMIT);
        let tags = check_tags(q.tags.clone())?;
        let now = now_ms();
        // Only placeholders are formatted into the SQL, never user text.
        let tag_filter: String = (0..tags.len())
            .map(|i| {
                format!(
                    " AND EXISTS (SELECT 1 FROM memory_tags t WHERE t.memory_id = m.id AND t.tag = ${})",
                    7 + i
                )
            })
            .collect();
        let recency =
            format!("(1.0 + 1.0 / (1.0 + ($5 - m.last_used_ms) / {RECENCY_SCALE_MS:.1}))");
        let cols = COLUMNS
            .split(", ")
            .map(|c| format!("m.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let hits: Vec<Hit> = match &self.db {
            Db::Sqlite(p) => {
                // bm25() is negative, lower is better: flip it for the score.
                // CROSS JOIN pins the full-text index as the outer loop: left
                // to itself, the planner may walk the scope's rows and run
                // the MATCH once per row (100x slower at 100,000 entries).
                let sql = format!(
                    "SELECT {cols}, -bm25(memories_fts) * {recency} AS score \
                     FROM memories_fts CROSS JOIN memories m ON m.id = memories_fts.rowid \
                     WHERE memories_fts MATCH $1 AND m.scope = $2 AND ($3 = 1 OR m.expired_ms IS NULL) \
                     AND ($4 = '' OR m.category = $4){tag_filter} \
                     ORDER BY score DESC, m.id DESC LIMIT $6"
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(terms::fts5_match(&words))
                    .bind(scope)
                    .bind(q.include_expired as i64)
                    .bind(q.category.clone().unwrap_or_default())
                    .bind(now)
                    .bind(limit);
                for t in &tags {
                    query = query.bind(t.clone());
                }
                let rows = query.fetch_all(p).await?;
                let mut out = Vec::with_capacity(rows.len());
                for r in &rows {
                    out.push(Hit {
                        memory: memory_from_row!(r),
                        score: r.try_get("score")?,
                    });
                }
                out
            }
            Db::Pg(p) => {
                let recency = format!(
                    "(1.0::float8 + 1.0::float8 / (1.0::float8 + ($5::float8 - m.last_used_ms::float8) / {RECENCY_SCALE_MS:.1}::float8))"
                );
                let sql = format!(
                    "SELECT {cols}, (ts_rank_cd(m.tsv, q)::float8 * {recency}) AS score \
                     FROM memories m, to_tsquery('simple', $1) q \
                     WHERE m.tsv @@ q AND m.scope = $2 AND ($3 = 1 OR m.expired_ms IS NULL) \
                     AND ($4 = '' OR m.category = $4){tag_filter} \
                     ORDER BY score DESC, m.id DESC LIMIT $6"
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(terms::tsquery(&words))
                    .bind(scope)
                    .bind(q.include_expired as i64)
                    .bind(q.category.clone().unwrap_or_default())
                    .bind(now)
                    .bind(limit);
                for t in &tags {
                    query = query.bind(t.clone());
                }
                let rows = query.fetch_all(p).await?;
                let mut out = Vec::with_capacity(rows.len());
                for r in &rows {
                    out.push(Hit {
                        memory: memory_from_row!(r),
                        score: r.try_get("score")?,
                    });
                }
                out
            }
        };
        let ids: Vec<i64> = hits.iter().map(|h| h.memory.id).collect();
        self.touch(scope, &ids, now).await?;
        Ok(hits
            .into_iter()
            .map(|mut h| {
                h.memory.last_used_ms = now;
                h
            })
            .collect())
    }

    /// Entries of the scope, newest first, `limit` at a time. `cursor` is the
    /// `next_cursor` of the previous page. Marks the returned entries as used.
    pub async fn list(
        &self,
        scope: &str,
        category: Option<&str>,
        limit: i64,
        cursor: Option<&str>,
        include_expired: bool,
    ) -> MemoryResult<Page> {
        let limit = limit.clamp(1, MAX_LIMIT);
        let before = match cursor.filter(|c| !c.is_empty()) {
            None => i64::MAX,
            Some(c) => c.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                MemoryError::Invalid(format!("cursor {c:?} is not one this tool returned"))
            })?,
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM memories WHERE scope = $1 AND id < $2 AND ($3 = 1 OR expired_ms IS NULL) \
             AND ($4 = '' OR category = $4) ORDER BY id DESC LIMIT $5"
        );
        let mut entries: Vec<Memory> = on_db!(&self.db, p => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(scope)
                .bind(before)
                .bind(include_expired as i64)
                .bind(category.unwrap_or_default())
                .bind(limit + 1)
                .fetch_all(p)
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(memory_from_row!(r));
            }
            out
        });
        let next_cursor = if entries.len() as i64 > limit {
            entries.truncate(limit as usize);
            entries.last().map(|m| m.id.to_string())
        } else {
            None
        };
        let now = now_ms();
        let ids: Vec<i64> = entries.iter().map(|m| m.id).collect();
        self.touch(scope, &ids, now).await?;
        for m in &mut entries {
            m.last_used_ms = now;
        }
        Ok(Page {
            entries,
            next_cursor,
        })
    }

    /// Sets the last-used time of `ids` (reads count as use).
    async fn touch(&self, scope: &str, ids: &[i64], now: i64) -> MemoryResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let marks: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "UPDATE memories SET last_used_ms = $1 WHERE scope = $2 AND id IN ({})",
            marks.join(", ")
        );
        on_db!(&self.db, p => {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(scope);
            for id in ids {
                q = q.bind(*id);
            }
            q.execute(p).await?;
        });
        Ok(())
    }

    /// Sets an entry's last-used time (imports that carry their own history,
    /// and tests of the recency ranking).
    pub async fn set_last_used(&self, scope: &str, id: i64, ms: i64) -> MemoryResult<()> {
        self.touch(scope, &[id], ms).await
    }

    /// Runs SQLite's `PRAGMA integrity_check` and FTS5's `integrity-check`;
    /// "ok" when both pass (PostgreSQL: always "ok", the server guarantees it).
    pub async fn integrity_check(&self) -> MemoryResult<String> {
        match &self.db {
            Db::Sqlite(p) => {
                let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
                    .fetch_one(p)
                    .await?;
                if verdict != "ok" {
                    return Ok(verdict);
                }
                // The full-text index must agree with the table it indexes.
                match sqlx::query(
                    "INSERT INTO memories_fts(memories_fts) VALUES ('integrity-check')",
                )
                .execute(p)
                .await
                {
                    Ok(_) => Ok("ok".into()),
                    Err(e) => Ok(format!("full-text index: {e}")),
                }
            }
            Db::Pg(_) => Ok("ok".into()),
        }
    }

    /// Counts the scope's entries: (valid, all).
    pub async fn count(&self, scope: &str) -> MemoryResult<(i64, i64)> {
        on_db!(&self.db, p => {
            let r = sqlx::query(
                "SELECT COUNT(*) FILTER (WHERE expired_ms IS NULL) AS valid, COUNT(*) AS total FROM memories WHERE scope = $1",
            )
            .bind(scope)
            .fetch_one(p)
            .await?;
            Ok((r.try_get("valid")?, r.try_get("total")?))
        })
    }

    /// Closes the pool.
    pub async fn close(&self) {
        on_db!(&self.db, p => p.close().await)
    }
}

fn check_content(content: &str) -> MemoryResult<String> {
    let c = content.trim();
    if c.is_empty() {
        return Err(MemoryError::Invalid("content is empty".into()));
    }
    if c.len() > MAX_CONTENT_BYTES {
        return Err(MemoryError::Invalid(format!(
            "content is {} bytes; a memory holds at most {MAX_CONTENT_BYTES} (save a summary, or a reference to a file)",
            c.len()
        )));
    }
    Ok(c.to_owned())
}

fn check_tags(tags: Vec<String>) -> MemoryResult<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        let t = t.trim().to_owned();
        if t.is_empty() {
            continue;
        }
        if t.chars().count() > MAX_TAG_CHARS {
            return Err(MemoryError::Invalid(format!(
                "tag {t:?} is longer than {MAX_TAG_CHARS} characters"
            )));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if out.len() > MAX_TAGS {
        return Err(MemoryError::Invalid(format!(
            "{} tags; at most {MAX_TAGS}",
            out.len()
        )));
    }
    Ok(out)
}

fn check_new(new: NewMemory) -> MemoryResult<NewMemory> {
    if !CATEGORIES.contains(&new.category.as_str()) {
        return Err(MemoryError::Invalid(format!(
            "category {:?} is not one of {}",
            new.category,
            CATEGORIES.join(", ")
        )));
    }
    let key = new
        .key
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty());
    if key.as_ref().is_some_and(|k| k.chars().count() > 200) {
        return Err(MemoryError::Invalid(
            "key is longer than 200 characters".into(),
        ));
    }
    Ok(NewMemory {
        content: check_content(&new.content)?,
        category: new.category,
        tags: check_tags(new.tags)?,
        key,
    })
}

pub use omicos_proto::now_ms;
