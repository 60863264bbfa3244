//! The conversation store on SQLite (single node, the default) or PostgreSQL
//! (several orchestrator replicas sharing sessions).
//!
//! Every write is one transaction, so a crash loses at most the write in
//! progress. Events and messages go through the store's writer tasks, which
//! commit what arrives together in one transaction ([`group_commit`]); on
//! SQLite every other write goes through it too. SQLite runs in WAL mode
//! with `BEGIN IMMEDIATE` write transactions; PostgreSQL locks the session row for appends so that two
//! replicas never interleave one session's messages or events. The turn lease
//! is a row (owner, expiry) taken with one atomic upsert.

use crate::{
    FileCheckpoint, HistoryItem, Lease, Notice, Notices, SessionMeta, SessionStore, StoreError,
    StoreResult, TurnMark, now_ms,
};
use async_trait::async_trait;
use rusqlite::OptionalExtension;
use sqlx::Row;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::{CancellationToken, DropGuard};

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

use omicos_sqldb::Db;

/// Runs the same body on either pool type (`$n` placeholders work on both).
macro_rules! on_db {
    ($db:expr, $p:ident => $body:expr) => {
        match $db {
            Db::Sqlite($p) => $body,
            Db::Pg($p) => $body,
        }
    };
}

macro_rules! meta_from_row {
    ($row:expr) => {{
        let row = $row;
        let team: String = row.try_get("team_members")?;
        SessionMeta {
            id: row.try_get("id")?,
            title: row.try_get("title")?,
            agent: row.try_get("agent")?,
            team_members: serde_json::from_str(&team).map_err(|e| {
                StoreError::Backend(format!("session team_members is not a JSON list: {e}"))
            })?,
            created_ms: row.try_get("created_ms")?,
            last_active_ms: row.try_get("last_active_ms")?,
            tenant: row.try_get("tenant")?,
            subject: row.try_get("subject")?,
        }
    }};
}

const SQLITE_SCHEMA_V1: &str = r#"
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    agent TEXT NOT NULL,
    team_members TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    last_active_ms INTEGER NOT NULL
);
CREATE INDEX sessions_last_active ON sessions(last_active_ms);
CREATE TABLE session_messages (
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE session_events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE session_leases (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
"#;

const PG_SCHEMA_V1: &str = r#"
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    agent TEXT NOT NULL,
    team_members TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    last_active_ms BIGINT NOT NULL
);
CREATE INDEX sessions_last_active ON sessions(last_active_ms);
CREATE TABLE session_messages (
    session_id TEXT NOT NULL,
    idx BIGINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE session_events (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    body BYTEA NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE session_leases (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_ms BIGINT NOT NULL
);
"#;

/// Session state that must outlive a replica (issue 13): allow-for-session
/// grants, pending approvals with the lease owner of the turn that waits, and
/// cancel requests per turn. Same text on both engines (INTEGER and BIGINT
/// columns hold what the code binds on each).
const SCHEMA_V3_STATE: &str = r#"
CREATE TABLE session_grants (
    session_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    PRIMARY KEY (session_id, tool)
);
CREATE TABLE session_approvals (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    decision INTEGER,
    PRIMARY KEY (session_id, call_id)
);
CREATE TABLE session_cancels (
    session_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    PRIMARY KEY (session_id, owner)
);
CREATE INDEX session_leases_expiry ON session_leases(expires_ms);
"#;

/// v2: each session belongs to the tenant and subject that created it;
/// sessions from before belong to the laptop's principal (`default`, `local`).
const SCHEMA_V2_OWNER: &str = r#"
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE sessions ADD COLUMN subject TEXT NOT NULL DEFAULT 'local';
CREATE INDEX sessions_owner ON sessions(tenant, subject, last_active_ms);
"#;

/// v4 (issue 18): an approval can be answered with an allow rule to keep for
/// the session ("shell(git *)"); the rule travels with the decision to the
/// replica whose turn waits.
const SCHEMA_V4_APPROVAL_RULE: &str = r#"
ALTER TABLE session_approvals ADD COLUMN rule TEXT NOT NULL DEFAULT '';
"#;

/// v5 (issue 15): the event log and the history refer to their session, so
/// the database itself refuses a row of a session that no longer exists (the
/// group-commit writer trusts the cursors it remembers; a delete made through
/// another store must still stop its rows). Rows left by a session deleted
/// before are dropped. SQLite adds a foreign key only by rebuilding a table.
const SQLITE_SCHEMA_V5_FK: &str = r#"
CREATE TABLE session_messages_v5 (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    idx INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);
INSERT INTO session_messages_v5 (session_id, idx, body)
    SELECT m.session_id, m.idx, m.body FROM session_messages m
    WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.id = m.session_id);
DROP TABLE session_messages;
ALTER TABLE session_messages_v5 RENAME TO session_messages;
CREATE TABLE session_events_v5 (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
);
INSERT INTO session_events_v5 (session_id, seq, body)
    SELECT e.session_id, e.seq, e.body FROM session_events e
    WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.id = e.session_id);
DROP TABLE session_events;
ALTER TABLE session_events_v5 RENAME TO session_events;
"#;
const PG_SCHEMA_V5_FK: &str = r#"
DELETE FROM session_messages m WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = m.session_id);
DELETE FROM session_events e WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = e.session_id);
ALTER TABLE session_messages ADD FOREIGN KEY (session_id) REFERENCES sessions(id);
ALTER TABLE session_events ADD FOREIGN KEY (session_id) REFERENCES sessions(id);
"#;

/// v6 (issue 15), PostgreSQL: the event log and the history lose the
/// foreign keys that v5 gave them. Every row is written by a store's
/// group-commit writer, under a lock on its session's row, by a statement
/// that writes nothing unless each of its sessions still exists
/// (`group_commit::PG_WRITE`); the per-row checks of the keys were a third
/// of that statement's time. SQLite keeps them (in-process, a check costs
/// a lookup in a page already cached).
const PG_SCHEMA_V6_NO_FK: &str = r#"
ALTER TABLE session_messages DROP CONSTRAINT IF EXISTS session_messages_session_id_fkey;
ALTER TABLE session_events DROP CONSTRAINT IF EXISTS session_events_session_id_fkey;
"#;

/// v6 (issue 15), SQLite: the event log's tail. The group-commit writer
/// appends each batch's events here, in arrival order (one or two pages per
/// batch), and moves the tail into `session_events` in the background,
/// sorted by session, many events to a page (`group_commit::move_step`):
/// written straight into the log, keyed by (session, seq), each event of a
/// batch dirtied its own session's page, a 4 KiB WAL frame per event. Reads
/// take both tables. No index: one on the session would dirty a page per
/// session again (reads find a session's rows by their positions, which the
/// writer keeps in memory: `tail::TailIndex`). The foreign key keeps a
/// deleted session's rows out, as v5's do.
const SQLITE_SCHEMA_V6_TAIL: &str = r#"
CREATE TABLE session_event_tail (
    pos INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    body BLOB NOT NULL
);
"#;

/// v7 (issue 15), SQLite: the tail's positions are never used twice
/// (`AUTOINCREMENT`), even after the rows above them were deleted, so that
/// a read that took a position from the writer's index of the tail
/// (`tail::TailIndex`) knows every row committed after it lies past it.
/// SQLite adds `AUTOINCREMENT` only by rebuilding the table; the rows keep
/// their positions.
const SQLITE_SCHEMA_V7_TAIL_POSITIONS: &str = r#"
CREATE TABLE session_event_tail_v7 (
    pos INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    body BLOB NOT NULL
);
INSERT INTO session_event_tail_v7 (pos, session_id, seq, body)
    SELECT pos, session_id, seq, body FROM session_event_tail;
DROP TABLE session_event_tail;
ALTER TABLE session_event_tail_v7 RENAME TO session_event_tail;
"#;

/// v8 SQLite, v7 PostgreSQL (issue 40): rewind and fork. A message a
/// rewind took out of the history is kept, marked (`rewound`); each turn's
/// start in the history (`session_turns`), the prior content of the paths
/// its file tools changed (`session_checkpoints`), and where a fork came
/// from (`session_forks`). Numbers are BIGINT on both engines (sqlx reads
/// them as i64).
macro_rules! schema_turns {
    ($blob:literal) => {
        concat!(
            "ALTER TABLE session_messages ADD COLUMN rewound BIGINT NOT NULL DEFAULT 0;
CREATE TABLE session_turns (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    first_message BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    rewound BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, turn_id)
);
CREATE TABLE session_checkpoints (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    path TEXT NOT NULL,
    created BIGINT NOT NULL,
    too_large BIGINT NOT NULL,
    prior ",
            $blob,
            " NOT NULL,
    PRIMARY KEY (session_id, turn_id, path)
);
CREATE TABLE session_forks (
    session_id TEXT PRIMARY KEY,
    parent_id TEXT NOT NULL,
    turn_id TEXT NOT NULL
);
"
        )
    };
}
const SQLITE_SCHEMA_V8_TURNS: &str = schema_turns!("BLOB");
const PG_SCHEMA_V7_TURNS: &str = schema_turns!("BYTEA");

/// Schema steps in order; index + 1 is the version.
const SQLITE_MIGRATIONS: &[&str] = &[
    SQLITE_SCHEMA_V1,
    SCHEMA_V2_OWNER,
    SCHEMA_V3_STATE,
    SCHEMA_V4_APPROVAL_RULE,
    SQLITE_SCHEMA_V5_FK,
    SQLITE_SCHEMA_V6_TAIL,
    SQLITE_SCHEMA_V7_TAIL_POSITIONS,
    SQLITE_SCHEMA_V8_TURNS,
];
const PG_MIGRATIONS: &[&str] = &[
    PG_SCHEMA_V1,
    SCHEMA_V2_OWNER,
    SCHEMA_V3_STATE,
    SCHEMA_V4_APPROVAL_RULE,
    PG_SCHEMA_V5_FK,
    PG_SCHEMA_V6_NO_FK,
    PG_SCHEMA_V7_TURNS,
];

/// The columns `meta_from_row!` reads.
macro_rules! meta_columns {
    () => {
        "id, title, agent, team_members, created_ms, last_active_ms, tenant, subject"
    };
}

/// A [`SessionStore`] on SQLite or PostgreSQL. Cheap to clone (a pool inside).
#[derive(Clone, Debug)]
pub struct SqlStore {
    db: Db,
    notices: Notices,
    /// The PostgreSQL notification channel of this database and schema.
    channel: Arc<str>,
    /// The PostgreSQL listener (its connection must go back to the pool).
    listener: Option<Background>,
    /// The group-commit writer of events and messages (SQLite: of every write).
    writer: group_commit::Writer,
    /// Where writes go. SQLite: a pool of one connection on the same file,
    /// held by the group-commit writer, which runs every write of the store
    /// in its batches (events, messages, sessions, leases, grants,
    /// approvals, cancels). SQLite lets one connection write at a time
    /// anyway; through one connection, writes queue in the writer instead of
    /// sleeping in SQLite's busy handler (1 ms, then 2, 5, 10 ms … when two
    /// connections want the lock), and a commit never empties the writer's
    /// page cache, as another connection's commit does. PostgreSQL: the same
    /// pool as reads.
    writes: Db,
    /// SQLite's checkpoint task (see [`checkpoints`]).
    checkpointer: Option<Background>,
}

/// A task of the store's own, stopped by [`SqlStore::close`] or when the
/// last clone of the store is dropped.
#[derive(Clone, Debug)]
struct Background {
    stop: CancellationToken,
    _guard: Arc<DropGuard>,
}

impl Background {
    fn new(stop: CancellationToken) -> Self {
        Self {
            _guard: Arc::new(stop.clone().drop_guard()),
            stop,
        }
    }
}

/// How often the checkpoint task copies SQLite's WAL back into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// WAL frames (pages, 4 KiB) past which the checkpoint task, once it has
/// copied them back, has the writer let the WAL start over (64 MiB; see
/// `group_commit::restart_wal`).
const RESTART_FRAMES: i64 = if cfg!(test) { 1024 } else { 16_384 };

/// Passes the checkpoint task makes, each copying what was written during
/// the last, before it hands the rest to the writer (whose pass is on the
/// commit path), unless a pass finds at most [`CATCH_UP_FRAMES`] new frames.
const CATCH_UP_PASSES: usize = 3;
const CATCH_UP_FRAMES: i64 = 256;

/// WAL frames (pages, 4 KiB) past which the checkpoint task, when a passive
/// checkpoint could not catch up with the writers, waits for them to let it
/// finish and start the WAL over (about 400 MiB).
const WAL_FRAMES_MAX: i64 = 100_000;

/// SQLite's checkpoints, off the commit path. SQLite's own automatic
/// checkpoint runs inside the commit that crosses its threshold, and that
/// commit (a whole batch of events, every session of it waiting to publish)
/// took tens of milliseconds to copy ~40 MiB back and fsync. Here a passive
/// checkpoint runs on a read connection every [`CHECKPOINT_EVERY`]: it never
/// blocks the writer (which keeps appending to the WAL meanwhile), and once
/// it has caught up the next commit starts the WAL over. If writers outrun
/// it past [`WAL_FRAMES_MAX`] frames, a RESTART checkpoint makes them wait.
/// A WAL copied back but longer than [`RESTART_FRAMES`] is started over by
/// the writer, asked through `restart`.
async fn checkpoints(pool: sqlx::SqlitePool, stop: CancellationToken, restart: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let passive = || {
            sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(&pool)
        };
        let mut r = passive().await;
        // A long WAL, copied back: copy what came during the pass (less
        // each time), then hand the rest to the writer.
        if let Ok((0, log, copied)) = r
            && log >= RESTART_FRAMES
            && copied >= log
        {
            let mut last = log;
            for _ in 0..CATCH_UP_PASSES {
                match passive().await {
                    Ok((0, log, copied)) if copied >= log => {
                        let new = log - last;
                        last = log;
                        if new <= CATCH_UP_FRAMES {
                            break;
                        }
                    }
                    other => {
                        r = other;
                        break;
                    }
                }
            }
            if matches!(r, Ok((0, _, _))) {
                restart.store(true, Ordering::Relaxed);
            }
        }
        let r = match r {
            Ok((_, log, copied)) if log > WAL_FRAMES_MAX && copied < log => {
                sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(RESTART)")
                    .fetch_one(&pool)
                    .await
            }
            other => other,
        };
        if let Err(e) = r {
            if pool.is_closed() {
                return;
            }
            tracing::warn!(error = %e, "conversation store: WAL checkpoint failed");
        }
    }
}

/// `sqlite://<workspace>/.omicos/sessions.db`, the default store URL.
pub fn default_url(workspace: &std::path::Path) -> String {
    format!(
        "sqlite://{}",
        workspace.join(".omicos").join("sessions.db").display()
    )
}

impl SqlStore {
    /// Opens `url` (`sqlite://PATH`, `sqlite::memory:`, `postgres://...`),
    /// creating the SQLite file and its directory when missing, and runs the
    /// migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let db = omicos_sqldb::open(
            url,
            omicos_sqldb::OpenOptions {
                what: "conversation store",
                expected: "memory:, sqlite://PATH or postgres://...",
                foreign_keys: true,
            },
        )
        .await
        .map_err(|e| match e {
            omicos_sqldb::OpenError::Invalid(m) | omicos_sqldb::OpenError::Io(m) => {
                StoreError::Backend(m)
            }
            omicos_sqldb::OpenError::Sqlx(e) => StoreError::from(e),
        })?;
        let (notices, channel, listener) = match &db {
            // One process per SQLite file: an in-process bus shared by every
            // store opened on it.
            Db::Sqlite(_) => (Notices::shared(url), Arc::from(""), None),
            Db::Pg(p) => {
                let notices = Notices::new();
                let channel = pg_channel(p).await?;
                let stop = listen(p, &channel, notices.clone()).await?;
                (notices, channel, Some(Background::new(stop)))
            }
        };
        // `hold`: the writer keeps its connection between batches, except
        // `:memory:`'s one connection, which serves the reads too.
        let restart = Arc::new(AtomicBool::new(false));
        let (writes, checkpointer, hold) = match &db {
            // `:memory:` is one connection already (a database per connection).
            Db::Sqlite(p) if p.options().get_max_connections() > 1 => {
                let w = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    // A connection in this process does not go stale on its
                    // own: no ping (a round trip to its worker thread) per
                    // acquire. One that failed is dropped by its user.
                    .test_before_acquire(false)
                    // Checkpoints off the commit path (see `checkpoints`).
                    .connect_with(
                        (*p.connect_options())
                            .clone()
                            .pragma("wal_autocheckpoint", "0"),
                    )
                    .await?;
                let stop = CancellationToken::new();
                tokio::spawn(checkpoints(p.clone(), stop.clone(), restart.clone()));
                (Db::Sqlite(w), Some(Background::new(stop)), true)
            }
            Db::Sqlite(p) => (Db::Sqlite(p.clone()), None, false),
            Db::Pg(p) => (Db::Pg(p.clone()), None, true),
        };
        let writer = group_commit::Writer::spawn(
            writes.clone(),
            channel.clone(),
            notices.clone(),
            hold,
            restart,
        );
        let me = Self {
            db,
            writes,
            checkpointer,
            notices,
            writer,
            channel,
            listener,
        };
        me.migrate().await?;
        Ok(me)
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.db.backend()
    }

    async fn migrate(&self) -> StoreResult<()> {
        let m = omicos_sqldb::Migrations {
            table: "omicos_sessions_schema",
            pg_lock: 7002002,
            sqlite: SQLITE_MIGRATIONS,
            pg: PG_MIGRATIONS,
        };
        Ok(omicos_sqldb::migrate(&self.db, m).await?)
    }

    /// SQLite's `PRAGMA integrity_check` ("ok" when sound; PostgreSQL: "ok").
    pub async fn integrity_check(&self) -> StoreResult<String> {
        match &self.db {
            Db::Sqlite(p) => Ok(sqlx::query_scalar("PRAGMA integrity_check")
                .fetch_one(p)
                .await?),
            Db::Pg(_) => Ok("ok".into()),
        }
    }

    /// SQLite: runs `write` on the write connection in the group-commit
    /// writer's next batch: in its transaction, committed with its rows
    /// (a transaction of its own would cost its commit); the write's answer.
    async fn own_write(
        &self,
        session: &str,
        write: impl Fn(&rusqlite::Connection) -> StoreResult<StoreResult<bool>> + Send + Sync + 'static,
    ) -> StoreResult<bool> {
        self.writer
            .write(session, group_commit::Rows::Own(Arc::new(write)))
            .await
    }

    /// One statement whose parameters are all text, on the write path:
    /// on SQLite in the writer's next batch ([`Self::own_write`]), on
    /// PostgreSQL on its own.
    async fn write_text(
        &self,
        session: &str,
        sql: &'static str,
        params: &[&str],
    ) -> StoreResult<()> {
        match &self.writes {
            Db::Sqlite(_) => {
                let params: Vec<String> = params.iter().map(|p| (*p).to_owned()).collect();
                self.own_write(session, move |c| {
                    group_commit::prepared(c, sql)?.execute(rusqlite::params_from_iter(&params))?;
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                let mut q = sqlx::query(sql);
                for v in params {
                    q = q.bind(*v);
                }
                q.execute(p).await?;
            }
        }
        Ok(())
    }

    /// Closes the pool (and the notification listener and the group-commit
    /// writer, which hold a connection of it).
    pub async fn close(&self) {
        for task in [&self.listener, &self.checkpointer].into_iter().flatten() {
            task.stop.cancel();
        }
        self.writer.release();
        if let Db::Sqlite(w) = &self.writes {
            w.close().await;
        }
        on_db!(&self.db, p => p.close().await)
    }
}

/// The notification channel: [`crate::notice::PG_CHANNEL`] plus a digest of
/// the database and schema, because NOTIFY is database-wide and stores in
/// different schemas of one database (tests, tenants) must not hear each other.
async fn pg_channel(pool: &sqlx::PgPool) -> StoreResult<Arc<str>> {
    use std::hash::{Hash, Hasher};
    let at: String = sqlx::query_scalar("SELECT current_database() || '.' || current_schema()")
        .fetch_one(pool)
        .await?;
    // SipHash with fixed keys: the same name in every process.
    let mut h = std::hash::DefaultHasher::new();
    at.hash(&mut h);
    Ok(Arc::from(format!(
        "{}_{:016x}",
        crate::notice::PG_CHANNEL,
        h.finish()
    )))
}

/// Listens on the store's channel before returning (a notification reaches only
/// connections listening when it commits) and republishes every notice on
/// `notices` until the returned token is cancelled. A lost connection is
/// re-established by the next receive; subscribers get [`Notice::Resync`] so
/// that they re-read whatever they wait for.
async fn listen(
    pool: &sqlx::PgPool,
    channel: &str,
    notices: Notices,
) -> StoreResult<CancellationToken> {
    let mut l = sqlx::postgres::PgListener::connect_with(pool).await?;
    l.listen(channel).await?;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let r = tokio::select! {
                _ = token.cancelled() => return,
                r = l.try_recv() => r,
            };
            match r {
                Ok(Some(n)) => {
                    for n in Notice::parse_all(n.payload()) {
                        notices.publish(n);
                    }
                }
                Ok(None) => notices.publish(Notice::Resync),
                Err(e) => {
                    tracing_warn(&e);
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                    notices.publish(Notice::Resync);
                }
            }
        }
    });
    Ok(stop)
}

fn tracing_warn(e: &sqlx::Error) {
    tracing::warn!(error = %e, "conversation store: notification listener failed; reconnecting");
}

/// PostgreSQL: sends `n` on the store's channel inside the transaction, so
/// it is delivered exactly when the write commits.
async fn notify(tx: &mut sqlx::PgConnection, channel: &str, n: &Notice) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(n.payload())
        .execute(tx)
        .await?;
    Ok(())
}

/// A session's metadata, created or updated (the owner columns are
/// written once, at creation).
const PUT_SESSION: &str = "INSERT INTO sessions (id, title, agent, team_members, created_ms, last_active_ms, tenant, subject) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (id) DO UPDATE SET title = excluded.title, agent = excluded.agent, \
     team_members = excluded.team_members, created_ms = excluded.created_ms, \
     last_active_ms = excluded.last_active_ms";

/// PostgreSQL: [`PUT_SESSION`], answering whether it created the session.
/// The insert does nothing on a conflict, and the update then changes the
/// row the statement's snapshot holds (a row that another transaction
/// inserts meanwhile is one created for another request's new id, which
/// never happens with ids drawn at random).
const PG_PUT_SESSION: &str = "WITH \
     ins AS (INSERT INTO sessions (id, title, agent, team_members, created_ms, last_active_ms, tenant, subject) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING RETURNING 1), \
     upd AS (UPDATE sessions SET title = $2, agent = $3, team_members = $4, created_ms = $5, \
             last_active_ms = $6 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ins)) \
     SELECT EXISTS (SELECT 1 FROM ins)";

/// A turn's lease in one statement: inserted, or taken over when it is
/// ours or has expired, for a session that exists; when another owner's
/// lease is live, nothing changes. `$1` session, `$2` owner, `$3` expiry,
/// `$4` now.
const LEASE: &str = "INSERT INTO session_leases (session_id, owner, expires_ms) \
     SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1) \
     ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, expires_ms = excluded.expires_ms \
     WHERE session_leases.owner = excluded.owner OR session_leases.expires_ms <= $4";

const SESSION_EXISTS: &str = "SELECT 1 FROM sessions WHERE id = $1";

/// PostgreSQL: a new session and its first turn's lease in one statement,
/// one commit (`put_session`, then `try_lease_turn`, were two round trips
/// and two commits for every new chat). It writes nothing when the session
/// is already there (the caller then makes the two calls), and no lease
/// when a lease row of the id was left; it answers whether it created the
/// session and whether it wrote the lease. `$1`–`$8` as [`PG_PUT_SESSION`],
/// `$9` owner, `$10` expiry.
const PG_CREATE_LEASED: &str = "WITH \
     ins AS (INSERT INTO sessions (id, title, agent, team_members, created_ms, last_active_ms, tenant, subject) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING RETURNING 1), \
     ls AS (INSERT INTO session_leases (session_id, owner, expires_ms) \
            SELECT $1, $9, $10 WHERE EXISTS (SELECT 1 FROM ins) \
            ON CONFLICT (session_id) DO NOTHING RETURNING 1) \
     SELECT EXISTS (SELECT 1 FROM ins), EXISTS (SELECT 1 FROM ls)";

/// A PostgreSQL query whose rows decode as `O`.
type PgQueryAs<'q, O> = sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>;

/// PostgreSQL: `meta` bound as `$1`–`$8` of [`PG_PUT_SESSION`] and
/// [`PG_CREATE_LEASED`] (`team`: its members as JSON).
fn bind_meta<'q, O>(q: PgQueryAs<'q, O>, meta: &'q SessionMeta, team: &'q str) -> PgQueryAs<'q, O> {
    q.bind(&meta.id)
        .bind(&meta.title)
        .bind(&meta.agent)
        .bind(team)
        .bind(meta.created_ms)
        .bind(meta.last_active_ms)
        .bind(&meta.tenant)
        .bind(&meta.subject)
}

/// SQLite: [`PUT_SESSION`] for `m` (`team`: its members as JSON), in the
/// writer's transaction.
fn sqlite_put_session(c: &rusqlite::Connection, m: &SessionMeta, team: &str) -> StoreResult<()> {
    group_commit::prepared(c, PUT_SESSION)?.execute(rusqlite::params![
        m.id,
        m.title,
        m.agent,
        team,
        m.created_ms,
        m.last_active_ms,
        m.tenant,
        m.subject,
    ])?;
    Ok(())
}

/// SQLite: [`LEASE`] in the writer's transaction; the job's answer as
/// `try_lease_turn`'s.
fn sqlite_lease(
    c: &rusqlite::Connection,
    id: &str,
    owner: &str,
    expires: i64,
    now: i64,
) -> StoreResult<StoreResult<bool>> {
    let n =
        group_commit::prepared(c, LEASE)?.execute(rusqlite::params![id, owner, expires, now])?;
    if n == 1 {
        return Ok(Ok(true));
    }
    let exists = group_commit::prepared(c, SESSION_EXISTS)?.exists([id])?;
    Ok(lease_refused(exists, id))
}

/// A lease refused: another owner's live lease (false), or no such session
/// (NotFound).
fn lease_refused(exists: bool, id: &str) -> StoreResult<bool> {
    if exists {
        Ok(false)
    } else {
        Err(StoreError::NotFound(id.to_owned()))
    }
}

/// A turn's release: its lease, with the approvals and cancel requests of
/// its turn (`$1` session, `$2` owner).
/// SQLite: one statement each, in the writer's batch.
const RELEASE: [&str; 3] = [
    "DELETE FROM session_leases WHERE session_id = $1 AND owner = $2",
    "DELETE FROM session_approvals WHERE session_id = $1 AND owner = $2",
    "DELETE FROM session_cancels WHERE session_id = $1 AND owner = $2",
];

/// PostgreSQL: [`RELEASE`] as one statement (data-modifying CTEs all run,
/// in one snapshot, whatever the main query reads).
const PG_RELEASE: &str = "WITH \
     a AS (DELETE FROM session_approvals WHERE session_id = $1 AND owner = $2), \
     c AS (DELETE FROM session_cancels WHERE session_id = $1 AND owner = $2) \
     DELETE FROM session_leases WHERE session_id = $1 AND owner = $2";

#[async_trait]
impl SessionStore for SqlStore {
    async fn put_session(&self, meta: &SessionMeta) -> StoreResult<()> {
        let team = serde_json::to_string(&meta.team_members).unwrap_or_else(|_| "[]".into());
        match &self.writes {
            Db::Sqlite(_) => {
                let m = meta.clone();
                self.own_write(&meta.id, move |c| {
                    sqlite_put_session(c, &m, &team)?;
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                let (created,): (bool,) = bind_meta(sqlx::query_as(PG_PUT_SESSION), meta, &team)
                    .fetch_one(p)
                    .await?;
                if created {
                    self.writer.created(&meta.id);
                }
            }
        }
        Ok(())
    }

    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionMeta>> {
        on_db!(&self.db, p => {
            let row = sqlx::query(concat!("SELECT ", meta_columns!(), " FROM sessions WHERE id = $1"))
                .bind(id)
                .fetch_optional(p)
                .await?;
            match row {
                Some(r) => Ok(Some(meta_from_row!(&r))),
                None => Ok(None),
            }
        })
    }

    async fn list_sessions(&self, limit: usize) -> StoreResult<Vec<SessionMeta>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_db!(&self.db, p => {
            let rows = sqlx::query(concat!(
                "SELECT ",
                meta_columns!(),
                " FROM sessions ORDER BY last_active_ms DESC, id LIMIT $1"
            ))
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(meta_from_row!(r));
            }
            Ok(out)
        })
    }

    async fn list_sessions_of(
        &self,
        tenant: &str,
        subject: &str,
        limit: usize,
    ) -> StoreResult<Vec<SessionMeta>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_db!(&self.db, p => {
            let rows = sqlx::query(concat!(
                "SELECT ",
                meta_columns!(),
                " FROM sessions WHERE tenant = $1 AND subject = $2 \
                 ORDER BY last_active_ms DESC, id LIMIT $3"
            ))
            .bind(tenant)
            .bind(subject)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(meta_from_row!(r));
            }
            Ok(out)
        })
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        // Through the writer: the session's log changes in one order.
        self.writer.write(id, group_commit::Rows::Delete).await
    }

    async fn append_messages(&self, id: &str, messages: &[HistoryItem]) -> StoreResult<()> {
        let bodies = messages.iter().map(HistoryItem::to_json).collect();
        self.writer
            .write(id, group_commit::Rows::Messages(bodies))
            .await
            .map(drop)
    }

    async fn messages(&self, id: &str) -> StoreResult<Vec<HistoryItem>> {
        let bodies: Vec<String> = on_db!(&self.db, p => {
            sqlx::query_scalar("SELECT body FROM session_messages WHERE session_id = $1 AND rewound = 0 ORDER BY idx")
                .bind(id)
                .fetch_all(p)
                .await?
        });
        bodies
            .iter()
            .map(|b| {
                serde_json::from_str(b)
                    .map_err(|e| StoreError::Backend(format!("stored message is not JSON: {e}")))
            })
            .collect()
    }

    async fn append_event(&self, id: &str, seq: u64, event: &[u8]) -> StoreResult<()> {
        self.append_events(id, seq, vec![event.to_vec()]).await
    }

    async fn append_events(
        &self,
        id: &str,
        first_seq: u64,
        events: Vec<Vec<u8>>,
    ) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        // The last seq must fit the column; then so does every one before it.
        let more = events.len() as u64 - 1;
        let last = first_seq
            .checked_add(more)
            .and_then(|l| i64::try_from(l).ok())
            .ok_or_else(|| StoreError::Backend(format!("event seq {first_seq} is too large")))?;
        let first_seq = last - more as i64;
        self.writer
            .write(
                id,
                group_commit::Rows::Events {
                    first_seq,
                    bodies: events,
                },
            )
            .await
            .map(drop)
    }

    async fn events_since(&self, id: &str, since: u64) -> StoreResult<Vec<(u64, Vec<u8>)>> {
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        let rows: Vec<(i64, Vec<u8>)> = match &self.db {
            Db::Sqlite(p) => {
                let seen = self.writer.tail().seen(id, since);
                sqlx::query_as(group_commit::SQLITE_EVENTS_SINCE)
                    .bind(id)
                    .bind(since)
                    .bind(seen.positions)
                    .bind(seen.covered)
                    .fetch_all(p)
                    .await?
            }
            Db::Pg(p) => {
                sqlx::query_as(
                    "SELECT seq, body FROM session_events WHERE session_id = $1 AND seq > $2 ORDER BY seq",
                )
                .bind(id)
                .bind(since)
                .fetch_all(p)
                .await?
            }
        };
        let mut out: Vec<(u64, Vec<u8>)> = Vec::with_capacity(rows.len());
        for (seq, body) in rows {
            let seq = seq as u64;
            // SQLite: a row a move has copied but not yet deleted from the
            // tail comes twice, the same seq and body.
            if out.last().is_some_and(|(last, _)| *last == seq) {
                continue;
            }
            out.push((seq, body));
        }
        Ok(out)
    }

    async fn event_at(&self, id: &str, seq: u64) -> StoreResult<Option<Vec<u8>>> {
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(None);
        };
        if seq < 1 {
            return Ok(None);
        }
        let row: Option<Vec<u8>> = match &self.db {
            Db::Sqlite(p) => {
                // The tail rows the index shows from this seq on; the
                // statement keeps the one with this seq (either copy of a
                // row a move has copied but not yet deleted: the same body).
                let seen = self.writer.tail().seen(id, seq - 1);
                sqlx::query_scalar(group_commit::SQLITE_EVENT_AT)
                    .bind(id)
                    .bind(seq)
                    .bind(seen.positions)
                    .bind(seen.covered)
                    .fetch_optional(p)
                    .await?
            }
            Db::Pg(p) => {
                sqlx::query_scalar(
                    "SELECT body FROM session_events WHERE session_id = $1 AND seq = $2",
                )
                .bind(id)
                .bind(seq)
                .fetch_optional(p)
                .await?
            }
        };
        Ok(row)
    }

    async fn last_seq(&self, id: &str) -> StoreResult<u64> {
        let last: i64 = match &self.db {
            Db::Sqlite(p) => {
                let seen = self.writer.tail().seen_last(id);
                sqlx::query_scalar(group_commit::SQLITE_LAST_SEQ)
                    .bind(id)
                    .bind(seen.positions)
                    .bind(seen.covered)
                    .fetch_one(p)
                    .await?
            }
            Db::Pg(p) => {
                sqlx::query_scalar(
                    "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = $1",
                )
                .bind(id)
                .fetch_one(p)
                .await?
            }
        };
        Ok(last as u64)
    }

    async fn try_lease_turn(&self, id: &str, owner: &str, ttl_ms: i64) -> StoreResult<bool> {
        let now = now_ms();
        let expires = now.saturating_add(ttl_ms);
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, owner) = (id.to_owned(), owner.to_owned());
                self.own_write(&id.clone(), move |c| {
                    sqlite_lease(c, &id, &owner, expires, now)
                })
                .await
            }
            Db::Pg(p) => {
                let mut c = p.acquire().await?;
                let r = sqlx::query(LEASE)
                    .bind(id)
                    .bind(owner)
                    .bind(expires)
                    .bind(now)
                    .execute(&mut *c)
                    .await?;
                if r.rows_affected() == 1 {
                    return Ok(true);
                }
                let exists = sqlx::query(SESSION_EXISTS)
                    .bind(id)
                    .fetch_optional(&mut *c)
                    .await?
                    .is_some();
                lease_refused(exists, id)
            }
        }
    }

    async fn create_leased_session(
        &self,
        meta: &SessionMeta,
        owner: &str,
        ttl_ms: i64,
    ) -> StoreResult<bool> {
        let now = now_ms();
        let expires = now.saturating_add(ttl_ms);
        let team = serde_json::to_string(&meta.team_members).unwrap_or_else(|_| "[]".into());
        match &self.writes {
            Db::Sqlite(_) => {
                // One job of the writer instead of two.
                let (m, owner) = (meta.clone(), owner.to_owned());
                self.own_write(&meta.id, move |c| {
                    sqlite_put_session(c, &m, &team)?;
                    sqlite_lease(c, &m.id, &owner, expires, now)
                })
                .await
            }
            Db::Pg(p) => {
                let (created, leased): (bool, bool) =
                    bind_meta(sqlx::query_as(PG_CREATE_LEASED), meta, &team)
                        .bind(owner)
                        .bind(expires)
                        .fetch_one(p)
                        .await?;
                if !created {
                    // The session was there: its metadata and lease as
                    // the two calls write them.
                    self.put_session(meta).await?;
                    return self.try_lease_turn(&meta.id, owner, ttl_ms).await;
                }
                self.writer.created(&meta.id);
                if leased {
                    return Ok(true);
                }
                // A lease row of the id was left (none is, with ids drawn
                // at random): taken over as `try_lease_turn` does.
                self.try_lease_turn(&meta.id, owner, ttl_ms).await
            }
        }
    }

    async fn release_turn(&self, id: &str, owner: &str) -> StoreResult<()> {
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, owner) = (id.to_owned(), owner.to_owned());
                self.own_write(&id.clone(), move |c| {
                    for sql in RELEASE {
                        group_commit::prepared(c, sql)?.execute([&id, &owner])?;
                    }
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                // One statement, committed on its own: one round trip
                // instead of five (BEGIN, the three deletes, COMMIT).
                sqlx::query(PG_RELEASE)
                    .bind(id)
                    .bind(owner)
                    .execute(p)
                    .await?;
            }
        }
        Ok(())
    }

    async fn lease(&self, id: &str) -> StoreResult<Option<Lease>> {
        on_db!(&self.db, p => {
            let row = sqlx::query("SELECT owner, expires_ms FROM session_leases WHERE session_id = $1")
                .bind(id)
                .fetch_optional(p)
                .await?;
            match row {
                Some(r) => Ok(Some(Lease { owner: r.try_get("owner")?, expires_ms: r.try_get("expires_ms")? })),
                None => Ok(None),
            }
        })
    }

    async fn expired_leases(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Ok(on_db!(&self.db, p => {
            sqlx::query_scalar("SELECT session_id FROM session_leases WHERE expires_ms <= $1 ORDER BY session_id LIMIT $2")
                .bind(now_ms)
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    async fn add_grant(&self, id: &str, tool: &str) -> StoreResult<()> {
        const ADD: &str = "INSERT INTO session_grants (session_id, tool) VALUES ($1, $2) \
                           ON CONFLICT (session_id, tool) DO NOTHING";
        self.write_text(id, ADD, &[id, tool]).await
    }

    async fn grants(&self, id: &str) -> StoreResult<Vec<String>> {
        Ok(on_db!(&self.db, p => {
            sqlx::query_scalar("SELECT tool FROM session_grants WHERE session_id = $1 ORDER BY tool")
                .bind(id)
                .fetch_all(p)
                .await?
        }))
    }

    async fn put_approval(&self, id: &str, call_id: &str, owner: &str) -> StoreResult<()> {
        const PUT: &str = "INSERT INTO session_approvals (session_id, call_id, owner, decision) VALUES ($1, $2, $3, NULL) \
             ON CONFLICT (session_id, call_id) DO UPDATE SET owner = excluded.owner, decision = NULL, rule = ''";
        self.write_text(id, PUT, &[id, call_id, owner]).await
    }

    async fn decide_approval(
        &self,
        id: &str,
        call_id: &str,
        decision: i32,
        rule: &str,
    ) -> StoreResult<bool> {
        const DECIDE: &str = "UPDATE session_approvals SET decision = $1, rule = $2 \
             WHERE session_id = $3 AND call_id = $4 AND decision IS NULL";
        let n = Notice::Approval {
            session: id.into(),
            call_id: call_id.into(),
            decision,
            rule: rule.into(),
        };
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, call_id, rule) = (id.to_owned(), call_id.to_owned(), rule.to_owned());
                let decided = self
                    .own_write(&id.clone(), move |c| {
                        let n = group_commit::prepared(c, DECIDE)?
                            .execute(rusqlite::params![decision, rule, id, call_id])?;
                        Ok(Ok(n == 1))
                    })
                    .await?;
                if decided {
                    self.notices.publish(n);
                }
                Ok(decided)
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                let r = sqlx::query(DECIDE)
                    .bind(decision)
                    .bind(rule)
                    .bind(id)
                    .bind(call_id)
                    .execute(&mut *tx)
                    .await?;
                let decided = r.rows_affected() == 1;
                if decided {
                    notify(&mut tx, &self.channel, &n).await?;
                }
                tx.commit().await?;
                Ok(decided)
            }
        }
    }

    async fn approval_decision(
        &self,
        id: &str,
        call_id: &str,
    ) -> StoreResult<Option<(i32, String)>> {
        let d: Option<(Option<i32>, String)> = on_db!(&self.db, p => {
            sqlx::query_as("SELECT decision, rule FROM session_approvals WHERE session_id = $1 AND call_id = $2")
                .bind(id)
                .bind(call_id)
                .fetch_optional(p)
                .await?
        });
        Ok(d.and_then(|(d, rule)| d.map(|d| (d, rule))))
    }

    async fn clear_approval(&self, id: &str, call_id: &str) -> StoreResult<()> {
        const CLEAR: &str = "DELETE FROM session_approvals WHERE session_id = $1 AND call_id = $2";
        self.write_text(id, CLEAR, &[id, call_id]).await
    }

    async fn request_cancel(&self, id: &str) -> StoreResult<Option<String>> {
        // The live lease's owner, whose turn is asked to stop.
        const OWNER: &str =
            "SELECT owner FROM session_leases WHERE session_id = $1 AND expires_ms > $2";
        const CANCEL: &str = "INSERT INTO session_cancels (session_id, owner) VALUES ($1, $2) \
                              ON CONFLICT (session_id, owner) DO NOTHING";
        let now = now_ms();
        let cancel = |owner: &String| Notice::Cancel {
            session: id.into(),
            owner: owner.clone(),
        };
        match &self.writes {
            Db::Sqlite(_) => {
                // The write's answer is a bool: the owner comes back beside
                // it (set by the run that committed, should it run twice).
                let found: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
                let (session, slot) = (id.to_owned(), found.clone());
                self.own_write(id, move |c| {
                    let owner: Option<String> = group_commit::prepared(c, OWNER)?
                        .query_row(rusqlite::params![session, now], |r| r.get(0))
                        .optional()?;
                    if let Some(o) = &owner {
                        group_commit::prepared(c, CANCEL)?.execute([&session, o])?;
                    }
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = owner;
                    Ok(Ok(true))
                })
                .await?;
                let owner = found.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(o) = &owner {
                    self.notices.publish(cancel(o));
                }
                Ok(owner)
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                let owner: Option<String> = sqlx::query_scalar(OWNER)
                    .bind(id)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(o) = &owner {
                    sqlx::query(CANCEL)
                        .bind(id)
                        .bind(o)
                        .execute(&mut *tx)
                        .await?;
                    notify(&mut tx, &self.channel, &cancel(o)).await?;
                }
                tx.commit().await?;
                Ok(owner)
            }
        }
    }

    async fn cancel_requested(&self, id: &str, owner: &str) -> StoreResult<bool> {
        Ok(on_db!(&self.db, p => {
            sqlx::query("SELECT 1 FROM session_cancels WHERE session_id = $1 AND owner = $2")
                .bind(id)
                .bind(owner)
                .fetch_optional(p)
                .await?
                .is_some()
        }))
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    async fn rename_session(&self, id: &str, title: &str) -> StoreResult<bool> {
        const RENAME: &str = "UPDATE sessions SET title = $1 WHERE id = $2";
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, title) = (id.to_owned(), title.to_owned());
                self.own_write(&id.clone(), move |c| {
                    let n = group_commit::prepared(c, RENAME)?.execute([&title, &id])?;
                    Ok(Ok(n == 1))
                })
                .await
            }
            Db::Pg(p) => Ok(sqlx::query(RENAME)
                .bind(title)
                .bind(id)
                .execute(p)
                .await?
                .rows_affected()
                == 1),
        }
    }

    async fn mark_turn(&self, id: &str, mark: &TurnMark) -> StoreResult<()> {
        const MARK: &str = "INSERT INTO session_turns (session_id, turn_id, first_message, first_seq, rewound) \
             VALUES ($1, $2, $3, $4, 0) ON CONFLICT (session_id, turn_id) DO UPDATE SET \
             first_message = excluded.first_message, first_seq = excluded.first_seq, rewound = 0";
        let (first_message, first_seq) = (to_i64(mark.first_message)?, to_i64(mark.first_seq)?);
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, turn) = (id.to_owned(), mark.turn_id.clone());
                self.own_write(&id.clone(), move |c| {
                    group_commit::prepared(c, MARK)?.execute(rusqlite::params![
                        id,
                        turn,
                        first_message,
                        first_seq
                    ])?;
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                sqlx::query(MARK)
                    .bind(id)
                    .bind(&mark.turn_id)
                    .bind(first_message)
                    .bind(first_seq)
                    .execute(p)
                    .await?;
            }
        }
        Ok(())
    }

    async fn turns(&self, id: &str) -> StoreResult<Vec<TurnMark>> {
        let rows: Vec<(String, i64, i64)> = on_db!(&self.db, p => {
            sqlx::query_as(
                "SELECT turn_id, first_message, first_seq FROM session_turns \
                 WHERE session_id = $1 AND rewound = 0 ORDER BY first_message",
            )
            .bind(id)
            .fetch_all(p)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(turn_id, m, q)| TurnMark {
                turn_id,
                first_message: m.max(0) as u64,
                first_seq: q.max(0) as u64,
            })
            .collect())
    }

    async fn keep_file_changes(
        &self,
        id: &str,
        turn_id: &str,
        changes: &[FileCheckpoint],
    ) -> StoreResult<()> {
        // The first change of a path in a turn is the one whose prior counts.
        const KEEP: &str = "INSERT INTO session_checkpoints (session_id, turn_id, path, created, too_large, prior) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session_id, turn_id, path) DO NOTHING";
        if changes.is_empty() {
            return Ok(());
        }
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, turn, changes) = (id.to_owned(), turn_id.to_owned(), changes.to_vec());
                self.own_write(&id.clone(), move |c| {
                    let mut ins = group_commit::prepared(c, KEEP)?;
                    for ch in &changes {
                        ins.execute(rusqlite::params![
                            id,
                            turn,
                            ch.path,
                            i64::from(ch.created),
                            i64::from(ch.too_large),
                            ch.prior
                        ])?;
                    }
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                for ch in changes {
                    sqlx::query(KEEP)
                        .bind(id)
                        .bind(turn_id)
                        .bind(&ch.path)
                        .bind(i64::from(ch.created))
                        .bind(i64::from(ch.too_large))
                        .bind(&ch.prior)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    async fn file_checkpoints(
        &self,
        id: &str,
        turn_ids: &[String],
    ) -> StoreResult<Vec<(String, FileCheckpoint)>> {
        type Row = (String, String, i64, i64, Vec<u8>);
        // One lookup per turn on the (session, turn, path) key: a rewind
        // names one turn or a few, and a session keeps many.
        let mut rows: Vec<Row> = vec![];
        for turn in turn_ids {
            let found: Vec<Row> = on_db!(&self.db, p => {
                sqlx::query_as(
                    "SELECT turn_id, path, created, too_large, prior FROM session_checkpoints \
                     WHERE session_id = $1 AND turn_id = $2",
                )
                .bind(id)
                .bind(turn)
                .fetch_all(p)
                .await?
            });
            rows.extend(found);
        }
        Ok(rows
            .into_iter()
            .map(|(turn, path, created, too_large, prior)| {
                (
                    turn,
                    FileCheckpoint {
                        path,
                        created: created != 0,
                        too_large: too_large != 0,
                        prior,
                    },
                )
            })
            .collect())
    }

    async fn rewind(&self, id: &str, first_message: u64, turn_ids: &[String]) -> StoreResult<()> {
        // The visible messages from index `first_message` on ($2: how many
        // visible messages stay).
        const HIDE: &str = "UPDATE session_messages SET rewound = 1 \
             WHERE session_id = $1 AND rewound = 0 AND idx >= \
             (SELECT idx FROM session_messages WHERE session_id = $1 AND rewound = 0 \
              ORDER BY idx LIMIT 1 OFFSET $2)";
        const SET_ASIDE: &str =
            "UPDATE session_turns SET rewound = 1 WHERE session_id = $1 AND turn_id = $2";
        let keep = to_i64(first_message)?;
        match &self.writes {
            Db::Sqlite(_) => {
                let (id, turns) = (id.to_owned(), turn_ids.to_vec());
                self.own_write(&id.clone(), move |c| {
                    group_commit::prepared(c, HIDE)?.execute(rusqlite::params![id, keep])?;
                    let mut set = group_commit::prepared(c, SET_ASIDE)?;
                    for t in &turns {
                        set.execute([&id, t])?;
                    }
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                // The appends of this session wait (they lock its row too).
                sqlx::query("SELECT id FROM sessions WHERE id = $1 FOR UPDATE")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                sqlx::query(HIDE)
                    .bind(id)
                    .bind(keep)
                    .execute(&mut *tx)
                    .await?;
                for t in turn_ids {
                    sqlx::query(SET_ASIDE)
                        .bind(id)
                        .bind(t)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    async fn fork_session(
        &self,
        parent: &str,
        turn_id: &str,
        meta: &SessionMeta,
        messages: &[HistoryItem],
    ) -> StoreResult<()> {
        // The history goes through the writer (one batch, one multi-row
        // insert), which keeps the new session's cursors; the marks,
        // checkpoints and origin are copied by the database, in one write.
        self.put_session(meta).await?;
        let copied = async {
            self.append_messages(&meta.id, messages).await?;
            self.copy_fork_state(parent, turn_id, &meta.id, messages.len())
                .await
        }
        .await;
        if let Err(e) = copied {
            // Half a fork is no fork.
            let _ = self.delete_session(&meta.id).await;
            return Err(e);
        }
        Ok(())
    }

    async fn forked_from(&self, id: &str) -> StoreResult<Option<(String, String)>> {
        Ok(on_db!(&self.db, p => {
            sqlx::query_as("SELECT parent_id, turn_id FROM session_forks WHERE session_id = $1")
                .bind(id)
                .fetch_optional(p)
                .await?
        }))
    }
}

/// A count or seq as the BIGINT columns hold it.
fn to_i64(n: u64) -> StoreResult<i64> {
    i64::try_from(n).map_err(|_| StoreError::Backend(format!("{n} does not fit a BIGINT column")))
}

/// A fork's copy of its parent's turn marks before the fork point (`$3`:
/// the messages copied), their checkpoints, and its origin. `$1` the new
/// session, `$2` the parent (parameters in order of first use, as SQLite
/// numbers them).
const FORK_COPY: [&str; 2] = [
    "INSERT INTO session_turns (session_id, turn_id, first_message, first_seq, rewound) \
     SELECT $1, turn_id, first_message, 0, 0 FROM session_turns \
     WHERE session_id = $2 AND rewound = 0 AND first_message < $3",
    "INSERT INTO session_checkpoints (session_id, turn_id, path, created, too_large, prior) \
     SELECT $1, c.turn_id, c.path, c.created, c.too_large, c.prior FROM session_checkpoints c \
     WHERE c.session_id = $2 AND c.turn_id IN (SELECT turn_id FROM session_turns WHERE session_id = $1)",
];
const FORK_ORIGIN: &str =
    "INSERT INTO session_forks (session_id, parent_id, turn_id) VALUES ($1, $2, $3)";

impl SqlStore {
    async fn copy_fork_state(
        &self,
        parent: &str,
        turn_id: &str,
        new: &str,
        messages: usize,
    ) -> StoreResult<()> {
        let copied = to_i64(messages as u64)?;
        match &self.writes {
            Db::Sqlite(_) => {
                let (parent, turn, new) = (parent.to_owned(), turn_id.to_owned(), new.to_owned());
                self.own_write(&new.clone(), move |c| {
                    group_commit::prepared(c, FORK_COPY[0])?
                        .execute(rusqlite::params![new, parent, copied])?;
                    group_commit::prepared(c, FORK_COPY[1])?
                        .execute(rusqlite::params![new, parent])?;
                    group_commit::prepared(c, FORK_ORIGIN)?.execute([&new, &parent, &turn])?;
                    Ok(Ok(true))
                })
                .await?;
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                sqlx::query(FORK_COPY[0])
                    .bind(new)
                    .bind(parent)
                    .bind(copied)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(FORK_COPY[1])
                    .bind(new)
                    .bind(parent)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(FORK_ORIGIN)
                    .bind(new)
                    .bind(parent)
                    .bind(turn_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

mod group_commit;
mod tail;

#[cfg(test)]
mod tests {
    use super::*;

    /// The WAL header's checkpoint sequence, which SQLite counts up each
    /// time the WAL starts over.
    fn wal_sequence(wal: &str) -> u32 {
        let h = std::fs::read(wal).unwrap_or_default();
        h.get(12..16)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Under writes that never pause, the checkpoint task never finds the
    /// WAL copied back at a moment with no write after it; the writer lets
    /// it start over, so the WAL stays within a few times
    /// [`RESTART_FRAMES`] (here 4 MiB) while 24 times that is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_wal_starts_over_under_steady_writes() {
        const SESSIONS: usize = 8;
        let b = omicos_testdb::sqlite("sessions.db");
        let wal = format!("{}-wal", b.url.strip_prefix("sqlite://").unwrap());
        let store = Arc::new(SqlStore::open(&b.url).await.unwrap());
        let body = vec![b'w'; 8192];
        let frames = 24 * RESTART_FRAMES as usize;
        // Two or three pages an event: about `frames` frames in all.
        let events = frames / 2 / SESSIONS;
        for s in 0..SESSIONS {
            let meta = SessionMeta {
                id: format!("w{s}"),
                title: String::new(),
                agent: "a".into(),
                team_members: vec![],
                created_ms: 1,
                last_active_ms: 1,
                tenant: "default".into(),
                subject: "local".into(),
            };
            store.put_session(&meta).await.unwrap();
        }
        let first = wal_sequence(&wal);
        let mut writers = tokio::task::JoinSet::new();
        for s in 0..SESSIONS {
            let (store, body) = (store.clone(), body.clone());
            writers.spawn(async move {
                let id = format!("w{s}");
                for seq in 1..=events as u64 {
                    store.append_event(&id, seq, &body).await.unwrap();
                }
            });
        }
        let mut largest = 0;
        while !writers.is_empty() {
            tokio::select! {
                r = writers.join_next() => r.unwrap().unwrap(),
                () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            }
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        let written = (events * SESSIONS * body.len()) as u64;
        let restarts = wal_sequence(&wal).wrapping_sub(first);
        assert!(
            largest < written / 2 && restarts >= 2,
            "{written} bytes written: the WAL reached {largest} bytes and started over {restarts} times"
        );
        for s in 0..SESSIONS {
            let id = format!("w{s}");
            let got = store.events_since(&id, 0).await.unwrap();
            assert_eq!(got.len(), events, "{id}");
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, (q, b))| *q == i as u64 + 1 && b.len() == 8192)
            );
        }
        store.close().await;
    }
}
