//! Group commit: a writer task of each [`SqlStore`](super::SqlStore) (one on
//! SQLite, [`PG_WRITERS`] on PostgreSQL, each with its share of the sessions)
//! writes the event log and the message history in batches, one transaction
//! per batch.
//!
//! Every `append_event` and `append_messages` call queues its rows and waits
//! for the commit of the batch that holds them, so a caller (the hub, which
//! publishes an event to its subscribers only after `append_event` returned)
//! never acts on a row that a crash could still lose. The writer takes what
//! queued while the previous batch committed, and when the last batch held
//! more than one job it lingers up to [`LINGER`] for more (never past
//! [`MAX_JOBS`]); an idle store commits a lone row at once. `delete_session`
//! goes through the same queue, so a session's log changes in one order. On
//! SQLite, every other write of the store (a session's metadata, its turn
//! lease, grants, approvals, cancel requests) comes as a job too
//! ([`Rows::Own`]), run in the batch's transaction before its rows.
//!
//! Order and gap-free seqs hold as before: a batch's rows are applied in
//! queue order (its own writes before them: their callers ran concurrently,
//! each waiting for its commit, so any order among them is a serial one),
//! each event's seq is checked against the session's last seq plus the
//! events of that session earlier in the batch. A job that fails its check
//! gets its own error and the others commit. A batch whose transaction fails
//! is retried job by job, so one bad row never fails its neighbours.
//!
//! **The cursor cache.** Reading each session's last seq and last message
//! index cost more than writing the rows, so the writer remembers them from
//! its own commits ([`Known`]) and reads only the sessions it does not know.
//! The cache is a hint that can never make a wrong row durable:
//! - a job whose seq is not the remembered one + 1 makes the writer read that
//!   session again (another replica wrote since, and the hub has re-read);
//! - PostgreSQL: a row written on a stale cursor collides with the row that
//!   made it stale, on the `(session_id, seq)` or `(session_id, idx)` key:
//!   the batch fails as a whole, its sessions are forgotten, and its jobs
//!   are retried one by one on fresh reads;
//! - SQLite: a cursor is used only while no other connection has committed
//!   to the file since the writer's last batch (`PRAGMA data_version`, read
//!   under the write lock); otherwise every cursor is forgotten and the
//!   batch's are read again (the events' tail has no key to collide on);
//! - a session deleted through another store takes no more rows (SQLite:
//!   the rows refer to their session, a foreign key of schema v5, and the
//!   delete changed the data version;
//!   PostgreSQL: [`PG_WRITE`] writes nothing unless each session of the
//!   batch is there under its lock, schema v6 having dropped the keys), and
//!   the batch is retried as above; deletes through this store come through
//!   this queue and forget the session;
//! - a session PostgreSQL's `put_session` has just created is known to be
//!   empty ([`Rows::Created`]) without a read;
//! - PostgreSQL locks every session of a batch in sorted order before it
//!   writes (and before it reads cursors it does not know), so two replicas'
//!   batches on one session serialize and cannot deadlock. A batch whose
//!   cursors are all remembered (the usual case) is one statement that
//!   locks, writes and notifies, committed on its own: one round trip.
//!
//! **SQLite's tail.** On SQLite a batch's events are appended to
//! `session_event_tail`, in arrival order and without an index, instead of
//! into the log keyed by (session, seq), where each event dirtied its own
//! session's page: a 4 KiB WAL frame per event. The writer knows the
//! tail's live rows by session in memory ([`TailIndex`], shared with the
//! store's reads, which find a session's rows in the tail by position
//! instead of a scan), and moves them into the log, sorted, past
//! [`MOVE_ROWS`] live rows (a step of up to [`move_sessions!`] sessions
//! after each batch, each in a transaction of its own, then steps that
//! delete the copied rows by ranges of positions), after [`MOVE_IDLE`]
//! without a job, and when the store closes (every step at once). With no
//! key on the tail, a row on a stale cursor would not collide with
//! anything, so the SQLite writer trusts its cursors and its index only
//! while `PRAGMA data_version` shows no other connection's commit (see
//! [`sync`]).
//!
//! **SQLite in-process.** SQLite's writer does not go through sqlx's
//! connection worker for its batches: it locks the write connection's handle
//! out of that thread and drives it itself through rusqlite ([`run_sqlite`]),
//! a batch being one synchronous `BEGIN IMMEDIATE` … `COMMIT` within one poll
//! of the task (no transaction is ever open across an await).

use crate::{Notice, Notices, StoreError, StoreResult, now_ms};
use omicos_sqldb::Db;
use sqlx::pool::PoolConnection;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::tail::TailIndex;

/// How long the writer waits for more rows once it has seen concurrent writers.
pub(super) const LINGER: Duration = Duration::from_millis(1);

/// The most jobs in one transaction.
pub(super) const MAX_JOBS: usize = 512;

/// SQLite: the live rows of the tail past which the writer starts moving
/// it into the log, one step after each batch ([`move_step`]). A move
/// writes each session's events of the tail to its pages of the log
/// together: at 1,000 streams of ten events a second, 16,384 rows are
/// about 16 events a session, most of a page each, where writing each
/// event straight into the log dirtied a page per event. Reads find a
/// session's rows in the tail by the writer's index ([`TailIndex`]), not
/// by a scan, so the tail's length costs them nothing.
pub(super) const MOVE_ROWS: usize = 16_384;

/// SQLite: how long the writer idles before it moves what the tail holds.
const MOVE_IDLE: Duration = Duration::from_millis(20);

/// SQLite: the most sessions one step of a move takes ([`move_step`]), so
/// that one step dirties about as many pages of the log: at 1,000 sessions
/// a whole move in one transaction wrote about 1,000 pages at its commit,
/// and every event queued behind it waited (p99 at 1,000 slow streams
/// 24–29 ms, against 14 without the tail).
macro_rules! move_sessions {
    () => {
        64
    };
}

/// SQLite: the rows past which a step of a move takes no more sessions
/// (a step copies its rows in one statement, about 2 µs each; the events
/// queued meanwhile wait for it).
const STEP_ROWS: usize = 256;

/// SQLite: the rows one step of a move's end deletes from the tail.
/// Deleting a range of positions dirties each page of the tail once; a
/// session's rows, spread over the whole tail, dirtied every page at every
/// step. 16,384 rows took 12 ms in one statement. Written out, not bound
/// (a bound value the plan depends on makes SQLite compile the statement
/// again at every execution; `a_move_copies_sessions_in_steps_then_empties_the_tail` checks it).
macro_rules! delete_rows {
    () => {
        1024
    };
}

/// SQLite: one step of a move: the tail's rows at the positions `$1` (a
/// JSON array from the writer's index, a step's sessions) are copied into
/// the log, sorted by session and seq, in one transaction. They stay in
/// the tail, no longer in the index, until the move's end deletes them
/// ([`MOVE_DELETE`]): a read that finds one in both tables keeps one.
const MOVE_COPY: &str = "INSERT INTO session_events (session_id, seq, body) \
     SELECT session_id, seq, body FROM session_event_tail \
     WHERE pos IN (SELECT value FROM json_each($1)) ORDER BY session_id, seq";

/// SQLite: one step of a move's end: up to [`delete_rows!`] of the tail's
/// rows at or below `$1` (the tail's highest position when the move
/// began, every row below it copied by the move), lowest first.
const MOVE_DELETE: &str = concat!(
    "DELETE FROM session_event_tail WHERE pos <= $1 \
     AND pos < (SELECT MIN(pos) FROM session_event_tail) + ",
    delete_rows!()
);

/// SQLite: the tail's highest position (NULL when it is empty).
const TAIL_TOP: &str = "SELECT MAX(pos) FROM session_event_tail";

/// SQLite: the tail's live rows (not yet in the log), in position order,
/// for the writer's index ([`sync`]).
const TAIL_LIVE: &str = "SELECT pos, session_id, seq FROM session_event_tail t \
     WHERE NOT EXISTS (SELECT 1 FROM session_events e \
     WHERE e.session_id = t.session_id AND e.seq = t.seq) ORDER BY pos";

/// How many jobs may queue before callers wait for room.
const QUEUE: usize = 8192;

/// PostgreSQL's writers: the sessions are spread over this many writer
/// tasks, each with its connection, queue and cursor cache, by a hash of
/// their id, so one session's writes keep one queue (and their order) while
/// two batches of different sessions are written at once. One writer's
/// batches follow one another, each a round trip in which the server
/// spends most of the time; alone it served about 15,000 events/s, and
/// near that its batches, and every event's wait, grew (at 1,000 new
/// turns in 2 s, batches of 300 jobs took 16–30 ms). SQLite has one
/// writer: it lets one connection write at a time.
const PG_WRITERS: usize = 2;

/// How many sessions' cursors the writer remembers; past it, it forgets all
/// of them and reads them again as they come (about 100 bytes each).
const KNOWN_SESSIONS: usize = 65_536;

/// What one caller asked to write.
pub(super) enum Rows {
    /// Events with consecutive seqs from the one the caller assigned, all
    /// or none (a turn's text deltas that queued while the last batch
    /// committed come as one job).
    Events {
        /// The first seq (last_seq + 1 of the session, or the job is refused).
        first_seq: i64,
        /// The encoded events, in seq order (at least one).
        bodies: Vec<Vec<u8>>,
    },
    /// Messages (OpenAI shape, already serialized) appended after the session's last.
    Messages(Vec<String>),
    /// The session with everything it owns (its own transaction).
    Delete,
    /// The session was just created (PostgreSQL's `put_session` inserted
    /// it): it has no events and no messages, so its cursor is known
    /// without a read. Writes nothing; sent without waiting
    /// ([`Writer::created`]), ahead of the session's first rows.
    Created,
    /// SQLite: a write of the store's own on the write connection (a
    /// session's metadata, its turn lease, a grant, an approval, a cancel
    /// request), run in the batch's transaction before the batch's rows; its
    /// answer is the job's.
    Own(OwnWrite),
}

/// A write of the store's own, run on SQLite's write connection inside a
/// batch's transaction (synchronously: the writer drives the connection
/// itself). The outer error is SQLite's (the batch fails and is retried job
/// by job, so it may run again); the inner one is the job's answer.
pub(super) type OwnWrite =
    Arc<dyn Fn(&rusqlite::Connection) -> StoreResult<StoreResult<bool>> + Send + Sync>;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// A queued write and who waits for its commit: true; for a delete whether
/// the session existed; for an own write its answer.
pub(super) struct Job {
    session: String,
    rows: Rows,
    done: oneshot::Sender<StoreResult<bool>>,
}

/// The queue into a store's writer task. Cheap to clone; the task ends when
/// the last clone is dropped.
#[derive(Clone, Debug)]
pub(super) struct Writer {
    /// One queue per writer task (see [`PG_WRITERS`]).
    tx: Arc<[mpsc::Sender<Job>]>,
    /// SQLite: the live rows of the events' tail, for the store's reads.
    tail: Arc<TailIndex>,
    /// Cancelled: the task keeps no connection between batches (once the
    /// store closes).
    give_back: CancellationToken,
}

impl Writer {
    /// Starts the writer task on `db`. `channel` is the PostgreSQL
    /// notification channel; `notices` the in-process bus (SQLite). With
    /// `hold`, the task keeps its connection from one batch to the next
    /// until the store closes; without (SQLite's `:memory:`, whose one connection
    /// serves the reads too), it gives it back after each batch. `restart`:
    /// SQLite's checkpoint task asks the writer to let the WAL start over
    /// (see [`restart_wal`]).
    pub(super) fn spawn(
        db: Db,
        channel: Arc<str>,
        notices: Notices,
        hold: bool,
        restart: Arc<AtomicBool>,
    ) -> Self {
        let give_back = CancellationToken::new();
        if !hold {
            give_back.cancel();
        }
        let mut tx = Vec::new();
        let tail = Arc::new(TailIndex::default());
        match db {
            Db::Sqlite(pool) => {
                let (t, rx) = mpsc::channel(QUEUE);
                tx.push(t);
                tokio::spawn(run_sqlite(
                    pool,
                    notices,
                    Queue::new(rx, tail.clone()),
                    give_back.clone(),
                    hold,
                    restart,
                ));
            }
            Db::Pg(pool) => {
                for _ in 0..PG_WRITERS {
                    let (t, rx) = mpsc::channel(QUEUE);
                    tx.push(t);
                    let (pool, channel) = (pool.clone(), channel.clone());
                    tokio::spawn(run_pg(pool, channel, rx, give_back.clone()));
                }
            }
        }
        Self {
            tx: tx.into(),
            tail,
            give_back,
        }
    }

    /// SQLite: the live rows of the events' tail (see [`TailIndex`]).
    pub(super) fn tail(&self) -> &TailIndex {
        &self.tail
    }

    /// The queue of the writer task that writes `session`.
    fn queue(&self, session: &str) -> &mpsc::Sender<Job> {
        if let [one] = &self.tx[..] {
            return one;
        }
        &self.tx[(session_hash(session) % self.tx.len() as u64) as usize]
    }

    /// Lets the writers' connections go, now or after the batch being
    /// committed, so that the pool can close (SQLite's goes back to the
    /// pool; PostgreSQL's, set to plan by key, are closed). Later writes take
    /// a connection from the pool again (and fail once it is closed).
    pub(super) fn release(&self) {
        self.give_back.cancel();
    }

    /// Tells the writer that `session` was just created, so that its first
    /// rows need not read its cursor (a batch with a cursor to read is a
    /// transaction of four round trips on PostgreSQL instead of one
    /// statement, and during a burst of new sessions nearly every batch had
    /// one). Only a hint: dropped when the queue is full, and a wrong one
    /// would only make a batch fail on the rows' key and be retried.
    pub(super) fn created(&self, session: &str) {
        let (done, _) = oneshot::channel();
        let _ = self.queue(session).try_send(Job {
            session: session.to_owned(),
            rows: Rows::Created,
            done,
        });
    }

    /// Queues `rows` for `session` and waits until they are committed (or
    /// refused). True, except for a delete of a session that did not exist
    /// and an own write's false.
    pub(super) async fn write(&self, session: &str, rows: Rows) -> StoreResult<bool> {
        let (done, rx) = oneshot::channel();
        let job = Job {
            session: session.to_owned(),
            rows,
            done,
        };
        let stopped = || StoreError::Backend("the store's writer has stopped".into());
        self.queue(session).send(job).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// A hash of a session's id (which writer takes it; the sessions of a
/// window).
fn session_hash(session: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    session.hash(&mut h);
    h.finish()
}

/// A session's cursor as the writer's last commit left it (default: a
/// session without events or messages).
#[derive(Clone, Copy, Debug, Default)]
struct Known {
    last_seq: i64,
    last_idx: i64,
}

/// The writer's cursor cache (see the module's documentation).
type Cache = HashMap<String, Known>;

/// What one writer task keeps from batch to batch.
struct Queue {
    rx: mpsc::Receiver<Job>,
    batch: Vec<Job>,
    cache: Cache,
    /// The last batch held more than one job: linger for more.
    busy: bool,
    /// SQLite: what the writer knows of the events' tail.
    tail: Tail,
}

/// SQLite: the events over which the writer measures how many a session
/// gets ([`Tail::note`]).
const WINDOW: usize = 4096;

/// SQLite: the events a session must get per [`WINDOW`], on average, for
/// the tail to pay: below, a move writes about a page per event anyway,
/// after the tail's own page (at 10,000 sessions of one event each, say).
const GROUPING: usize = 3;

/// SQLite: what the writer knows of the events' tail.
#[derive(Default)]
struct Tail {
    /// Its live rows (see [`TailIndex`]), shared with the store's reads.
    index: Arc<TailIndex>,
    /// The tail may hold rows, live or copied: the next idle moves it (true
    /// at start, for what a crash or another store left).
    pending: bool,
    /// A move is under way, one step after each batch.
    moving: bool,
    /// The last session the move under way copied (None: from the first).
    after: Option<String>,
    /// The tail's highest position when the move under way began: every
    /// row up to it is copied by the move's end, which deletes them.
    upto: Option<i64>,
    /// The move under way has copied every session and deletes the rows
    /// it copied.
    deleting: bool,
    /// The live rows when a move failed: the next starts after
    /// [`MOVE_ROWS`] more (or when idle).
    floor: usize,
    /// Batches write their events straight into the log: in the last
    /// window, sessions got fewer than [`GROUPING`] events each.
    direct: bool,
    /// Events written in the current window.
    window_events: usize,
    /// The sessions that got them (hashes of their ids).
    window_sessions: std::collections::HashSet<u64>,
}

impl Tail {
    fn new(index: Arc<TailIndex>) -> Self {
        Self {
            index,
            pending: true,
            ..Self::default()
        }
    }

    /// Counts a committed batch's events; at the end of a window, chooses
    /// where the next window's go.
    fn note(&mut self, outcome: &Outcome<'_>, direct: bool) {
        if !direct && outcome.events > 0 {
            self.pending = true;
        }
        self.window_events += outcome.events;
        for s in outcome.last_seqs.keys() {
            self.window_sessions.insert(session_hash(s));
        }
        if self.window_events >= WINDOW {
            self.direct = self.window_events < GROUPING * self.window_sessions.len();
            self.window_events = 0;
            self.window_sessions.clear();
        }
    }

    /// A move has ended (or failed): nothing under way.
    fn moved(&mut self) {
        self.moving = false;
        self.after = None;
        self.upto = None;
        self.deleting = false;
    }

    /// A move should start, or go on, after a batch.
    fn due(&self) -> bool {
        self.moving || self.index.rows() >= self.floor + MOVE_ROWS
    }
}

impl Queue {
    fn new(rx: mpsc::Receiver<Job>, index: Arc<TailIndex>) -> Self {
        Self {
            rx,
            batch: Vec::with_capacity(MAX_JOBS),
            cache: Cache::new(),
            busy: false,
            tail: Tail::new(index),
        }
    }

    /// Adds to the batch (which holds its first job) what queued behind it,
    /// lingering up to [`LINGER`] for more when the last batch was not
    /// alone; takes the batch.
    async fn gather(&mut self) -> Vec<Job> {
        let deadline = tokio::time::Instant::now() + LINGER;
        loop {
            while self.batch.len() < MAX_JOBS {
                match self.rx.try_recv() {
                    Ok(j) => self.batch.push(j),
                    Err(_) => break,
                }
            }
            if !self.busy || self.batch.len() >= MAX_JOBS {
                break;
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(j)) => self.batch.push(j),
                _ => break,
            }
        }
        self.busy = self.batch.len() > 1;
        if self.cache.len() > KNOWN_SESSIONS {
            self.cache.clear();
        }
        std::mem::take(&mut self.batch)
    }

    /// Answers the batch with `error` (the writer has no connection).
    async fn refuse(&mut self, error: &str) {
        for job in self.gather().await {
            let e = StoreError::Backend(format!("the store's writer has no connection: {error}"));
            let _ = job.done.send(Err(e));
        }
    }
}

/// PostgreSQL's writer: batches on a connection kept until the store closes
/// (PostgreSQL prepares statements per connection).
async fn run_pg(
    pool: sqlx::PgPool,
    channel: Arc<str>,
    rx: mpsc::Receiver<Job>,
    give_back: CancellationToken,
) {
    let mut q = Queue::new(rx, Arc::default());
    let mut held: Option<PoolConnection<sqlx::Postgres>> = None;
    loop {
        let first = tokio::select! {
            j = q.rx.recv() => match j {
                Some(j) => j,
                None => break,
            },
            () = give_back.cancelled(), if held.is_some() => {
                held = None;
                continue;
            }
        };
        q.batch.push(first);
        let batch = q.gather().await;
        let mut b = Batcher {
            timed_out: false,
            conn: Conn::Pg {
                pool: &pool,
                channel: &channel,
                held: &mut held,
            },
        };
        b.commit(&mut q.cache, batch).await;
        if give_back.is_cancelled() {
            held = None;
        }
    }
}

/// SQLite's writer. It takes the store's one write connection from the
/// pool, locks its handle out of sqlx's worker thread, and runs its batches
/// on it in-process, synchronously, through rusqlite: a batch is its
/// SQLite calls and nothing else, where through sqlx each statement was a
/// round trip to the worker thread (two thread wake-ups, and the writer
/// task's). Every SQLite write of the store comes through it (the store's
/// own as [`Rows::Own`]), so it keeps the connection between batches, which
/// keeps its page cache warm, until the store closes; on `:memory:`, whose
/// one connection serves the reads too, it gives it back after each batch.
///
/// No transaction is open across an await: each batch begins and commits
/// (or rolls back) within one poll. A connection that could not roll back
/// is closed, and the next batch takes a new one.
async fn run_sqlite(
    pool: sqlx::SqlitePool,
    notices: Notices,
    mut q: Queue,
    give_back: CancellationToken,
    keep: bool,
    restart: Arc<AtomicBool>,
) {
    while let Some(first) = q.rx.recv().await {
        q.batch.push(first);
        let mut pc = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => {
                q.refuse(&e.to_string()).await;
                continue;
            }
        };
        let end = hold(&mut pc, &mut q, &notices, &give_back, keep, &restart).await;
        if end.broken {
            pc.close_on_drop();
        }
        drop(pc);
        if end.closed {
            break;
        }
    }
}

/// Why [`hold`] gave its connection back.
struct Given {
    /// The connection failed: it is closed, not reused.
    broken: bool,
    /// The queue closed: the writer ends.
    closed: bool,
}

/// Locks `pc`'s handle out of sqlx's worker thread and commits the batch
/// in `q`, and the batches that follow, on it until the store closes
/// (on `:memory:`, without `keep`: after each batch), the connection fails or
/// the queue closes. When the store closes (or is dropped) it moves the
/// tail first, so that a cleanly stopped store leaves its log in one table.
async fn hold(
    pc: &mut sqlx::SqliteConnection,
    q: &mut Queue,
    notices: &Notices,
    give_back: &CancellationToken,
    keep: bool,
    restart: &AtomicBool,
) -> Given {
    let mut end = Given {
        broken: true,
        closed: false,
    };
    let mut locked = match pc.lock_handle().await {
        Ok(l) => l,
        Err(e) => {
            q.refuse(&e.to_string()).await;
            return end;
        }
    };
    // SAFETY: the handle is sqlx's open connection, which its worker
    // thread does not use while `locked` lives; `conn` is dropped before
    // `locked`, and a connection made from a handle does not close it.
    let conn = unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr()) };
    let conn = match conn.and_then(Driven::new) {
        Ok(c) => c,
        Err(e) => {
            q.refuse(&e.to_string()).await;
            return end;
        }
    };
    end.broken = false;
    // The connection's `PRAGMA data_version` at the writer's last batch
    // (unknown for a connection it has just taken).
    let mut version = None;
    // The store is closing (or dropped): move the tail before giving back.
    let mut closing = false;
    loop {
        let batch = q.gather().await;
        let mut b = Batcher {
            timed_out: false,
            conn: Conn::Sqlite {
                conn: &conn,
                notices,
                broken: &mut end.broken,
                version: &mut version,
                tail: &mut q.tail,
            },
        };
        b.commit(&mut q.cache, batch).await;
        if !end.broken && q.tail.due() {
            let mut synced = Synced {
                version: &mut version,
                cache: &mut q.cache,
            };
            move_step(&conn, &mut end.broken, &mut q.tail, &mut synced).await;
        }
        if !end.broken && restart.swap(false, Ordering::Relaxed) {
            restart_wal(&conn);
        }
        if end.broken {
            break;
        }
        if give_back.is_cancelled() {
            closing = keep;
            break;
        }
        // Idle, holding the connection (no transaction open); the tail
        // moves once nothing came for a while, a step each millisecond.
        // None: give the connection back.
        let next = loop {
            let pause = if q.tail.moving {
                Duration::from_millis(1)
            } else {
                MOVE_IDLE
            };
            tokio::select! {
                j = q.rx.recv() => break Some(j),
                () = give_back.cancelled() => break None,
                () = tokio::time::sleep(pause), if q.tail.moving || q.tail.pending => {
                    let mut synced = Synced { version: &mut version, cache: &mut q.cache };
                    move_step(&conn, &mut end.broken, &mut q.tail, &mut synced).await;
                    if end.broken {
                        break None;
                    }
                }
            }
        };
        match next {
            Some(Some(j)) => q.batch.push(j),
            Some(None) => {
                end.closed = true;
                closing = keep;
                break;
            }
            None => {
                closing = keep && !end.broken;
                break;
            }
        }
    }
    if closing && !end.broken && (q.tail.moving || q.tail.pending) {
        let mut synced = Synced {
            version: &mut version,
            cache: &mut q.cache,
        };
        move_tail(&conn, &mut end.broken, &mut q.tail, &mut synced).await;
    }
    end.broken |= !conn.give_back();
    end
}

/// Lets the WAL start over. SQLite starts it over at a write that finds
/// every frame of it copied back into the database, and the checkpoint task
/// copies back, off the commit path, only the frames written before its
/// pass began: under a steady load the writer appends more during every
/// pass, the WAL never starts over and grows without end (about 500 MB in
/// ten seconds at 1,000 streams, each event a 4 KiB frame). So when the
/// checkpoint task has copied back a long WAL it raises `restart`, and the
/// writer, between two batches (no other write can come between), copies
/// back the few frames written since: the next batch starts the WAL over.
/// A failure here loses nothing (the frames stay in the WAL); the task
/// asks again after its next pass.
fn restart_wal(conn: &Driven) {
    let r = conn
        .lock()
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        });
    match r {
        Ok((0, log, copied)) if copied >= log => {}
        Ok((busy, log, copied)) => {
            tracing::debug!(
                busy,
                log,
                copied,
                "conversation store: the WAL could not start over yet"
            );
        }
        Err(e) => tracing::warn!(error = %e, "conversation store: WAL checkpoint failed"),
    }
}

/// How many prepared statements the writer's connection keeps (the writer
/// prepares about 26 texts; rusqlite keeps 16 by default).
const STATEMENTS: usize = 64;

/// The writer's rusqlite connection on sqlx's locked handle. While the
/// writer holds it, SQLite's busy handler is off: a `BEGIN` that finds the
/// write lock taken (by the checkpointer's RESTART, or another process on
/// the file) waits in [`sqlite_begin`], which yields the runtime, instead
/// of sleeping in SQLite on a runtime thread. Given back, or dropped by a
/// panic, it rolls back a transaction left open and restores sqlx's busy
/// timeout.
struct Driven {
    conn: std::sync::Mutex<rusqlite::Connection>,
    /// sqlx's busy timeout: how long a batch waits for the write lock.
    busy: Duration,
}

impl Driven {
    fn new(c: rusqlite::Connection) -> rusqlite::Result<Self> {
        let busy_ms: i64 = c.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?;
        c.busy_timeout(Duration::ZERO)?;
        c.set_prepared_statement_cache_capacity(STATEMENTS);
        Ok(Self {
            conn: std::sync::Mutex::new(c),
            busy: Duration::from_millis(busy_ms.max(0) as u64),
        })
    }

    /// The connection, for one synchronous step (never held across an await).
    fn lock(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        // Poisoned: a batch panicked, and the task is unwinding.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves the connection as sqlx knows it: outside a transaction, with
    /// its busy timeout (again when dropped, which changes nothing then).
    /// False: it could not roll back (close it).
    fn give_back(mut self) -> bool {
        self.reset()
    }

    fn reset(&mut self) -> bool {
        let c = self.conn.get_mut().unwrap_or_else(|p| p.into_inner());
        let clean = c.is_autocommit() || c.execute_batch("ROLLBACK").is_ok();
        clean && c.busy_timeout(self.busy).is_ok()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        self.reset();
    }
}

/// The connection a batch is written on.
enum Conn<'a> {
    /// SQLite's write connection, driven in-process (see [`run_sqlite`]).
    Sqlite {
        conn: &'a Driven,
        /// The in-process bus that hears of committed events.
        notices: &'a Notices,
        /// Set when a failed transaction could not be rolled back: the
        /// connection is not used again.
        broken: &'a mut bool,
        /// The connection's data version at the last batch: when it
        /// changed, another connection committed, and every remembered
        /// cursor may be stale.
        version: &'a mut Option<i64>,
        /// What the writer knows of the events' tail.
        tail: &'a mut Tail,
    },
    /// PostgreSQL: the held connection, or a new one from the pool.
    Pg {
        pool: &'a sqlx::PgPool,
        channel: &'a str,
        /// Dropped after a failure: a broken connection is not used again.
        held: &'a mut Option<PoolConnection<sqlx::Postgres>>,
    },
}

/// What a batch is committed with.
struct Batcher<'a> {
    conn: Conn<'a>,
    /// The last write waited out SQLite's busy timeout: its jobs are not
    /// retried one by one (each would wait as long again).
    timed_out: bool,
}

impl Batcher<'_> {
    /// Commits `batch` and answers each job: the writes between two deletes
    /// in one transaction (retried one job per transaction if it fails),
    /// each delete in its own.
    async fn commit(&mut self, cache: &mut Cache, batch: Vec<Job>) {
        let mut writes: Vec<Job> = Vec::with_capacity(batch.len());
        for job in batch {
            match job.rows {
                Rows::Delete => {
                    self.commit_writes(cache, std::mem::take(&mut writes)).await;
                    cache.remove(&job.session);
                    let r = self.delete(&job.session).await;
                    let _ = job.done.send(r);
                }
                // Before the session's first rows, which queued after it.
                Rows::Created => {
                    cache.insert(job.session, Known::default());
                }
                _ => writes.push(job),
            }
        }
        self.commit_writes(cache, writes).await;
    }

    async fn delete(&mut self, id: &str) -> StoreResult<bool> {
        match &mut self.conn {
            Conn::Sqlite {
                conn, broken, tail, ..
            } => {
                sqlite_begin(conn, **broken, &mut self.timed_out).await?;
                let existed = sqlite_tx(&conn.lock(), broken, |c| sqlite_delete(c, id))?;
                tail.index.forget(id);
                Ok(existed)
            }
            Conn::Pg { pool, held, .. } => {
                let r = match pg_conn(pool, held).await {
                    Ok(c) => pg_delete(c, id).await,
                    Err(e) => Err(e),
                };
                if r.is_err() {
                    **held = None;
                }
                r
            }
        }
    }

    async fn commit_writes(&mut self, cache: &mut Cache, batch: Vec<Job>) {
        if batch.is_empty() {
            return;
        }
        let refs: Vec<(&str, &Rows)> = batch
            .iter()
            .map(|j| (j.session.as_str(), &j.rows))
            .collect();
        // A remembered cursor may be stale (another replica, or another
        // store on the file, wrote since): a failed batch that used one is
        // retried on fresh reads, even a batch of one job.
        let used_cache = refs
            .iter()
            .any(|(s, r)| !matches!(r, Rows::Own(_)) && cache.contains_key(*s));
        let e = match self.write(cache, &refs).await {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let _ = job.done.send(r);
                }
                return;
            }
            Err(e) => e,
        };
        for (s, _) in &refs {
            cache.remove(*s);
        }
        if (batch.len() == 1 && !used_cache) || self.timed_out {
            for job in batch {
                let _ = job.done.send(Err(again(&e)));
            }
            return;
        }
        if batch.len() > 1 {
            tracing::warn!(error = %e, jobs = batch.len(), "conversation store: a batch failed; writing its jobs one by one");
        }
        for job in batch {
            let one = [(job.session.as_str(), &job.rows)];
            let r = match self.write(cache, &one).await {
                Ok(mut results) => results.pop().unwrap_or(Ok(true)),
                Err(e) => {
                    cache.remove(&job.session);
                    Err(e)
                }
            };
            let _ = job.done.send(r);
        }
    }

    /// One transaction for `jobs`; on commit the cache takes the new cursors
    /// and SQLite's bus hears of the events. Err: nothing was committed.
    async fn write(
        &mut self,
        cache: &mut Cache,
        jobs: &[(&str, &Rows)],
    ) -> StoreResult<Vec<StoreResult<bool>>> {
        let outcome = match &mut self.conn {
            Conn::Sqlite {
                conn,
                broken,
                version,
                tail,
                ..
            } => {
                sqlite_begin(conn, **broken, &mut self.timed_out).await?;
                let direct = tail.direct;
                let mut synced = Synced { version, cache };
                let outcome =
                    sqlite_batch(&conn.lock(), broken, &mut synced, &tail.index, direct, jobs)?;
                tail.note(&outcome, direct);
                outcome
            }
            Conn::Pg {
                pool,
                channel,
                held,
            } => {
                let r = match pg_conn(pool, held).await {
                    Ok(c) => pg_batch(c, channel, cache, jobs).await,
                    Err(e) => Err(e),
                };
                if r.is_err() {
                    **held = None;
                }
                r?
            }
        };
        for (s, k) in outcome.cursors {
            cache.insert(s.to_owned(), k);
        }
        if let Conn::Sqlite { notices, .. } = &self.conn {
            announce(notices, &outcome.last_seqs);
        }
        Ok(outcome.results)
    }
}

/// The same error, for another job.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::NotFound(s) => StoreError::NotFound(s.clone()),
        StoreError::Backend(m) => StoreError::Backend(m.clone()),
    }
}

/// PostgreSQL: the held connection, or a new one from the pool, set to
/// plan by key ([`BY_KEY`]).
async fn pg_conn<'c>(
    pool: &sqlx::PgPool,
    held: &'c mut Option<PoolConnection<sqlx::Postgres>>,
) -> StoreResult<&'c mut PoolConnection<sqlx::Postgres>> {
    if held.is_none() {
        let mut c = pool.acquire().await?;
        // Closed, not pooled, when the writer lets it go: the pool's other
        // users keep PostgreSQL's default planning.
        c.close_on_drop();
        sqlx::query(BY_KEY).execute(&mut *c).await?;
        *held = Some(c);
    }
    Ok(held.as_mut().expect("just set"))
}

/// The writer's statements reach every row by its key (the sessions' locks
/// and last activity by id, the rows' keys, the cursors' `MAX` on the
/// `(session_id, seq|idx)` keys), so its connection
/// tells the planner to use those indexes whatever the statistics say. A
/// prepared statement's generic plan is made once and kept until the
/// table's statistics change (autovacuum's ANALYZE, up to a minute after
/// enough rows changed): planned while `sessions` was nearly empty, the
/// batch's `id = ANY($1)` locks were a sequential scan, kept as the table
/// grew, each batch comparing every session's id with each of its own (half
/// of the writer's backend CPU at 1,000 sessions, measured with `perf`).
/// Planning each execution for its values instead cost a third of that
/// CPU, and still chose the scan on a table of a few dozen pages.
const BY_KEY: &str = "SET enable_seqscan = off";

/// SQLite: the in-process bus hears of the committed events (PostgreSQL's
/// notifications went out with the transaction). One notice per session and
/// batch, with its last seq: a notice only wakes a reader, who reads the log.
fn announce(notices: &Notices, last_seqs: &BTreeMap<&str, i64>) {
    for (session, seq) in last_seqs {
        notices.publish(Notice::Event {
            session: (*session).to_owned(),
            seq: *seq as u64,
        });
    }
}

/// What a committed batch did.
struct Outcome<'a> {
    /// One answer per job, in order.
    results: Vec<StoreResult<bool>>,
    /// Per session that got events, the last seq written.
    last_seqs: BTreeMap<&'a str, i64>,
    /// How many events it wrote.
    events: usize,
    /// The cursors of the batch's existing sessions after it.
    cursors: Vec<(&'a str, Known)>,
}

/// A session's state inside the batch's transaction.
#[derive(Default)]
struct Cursor {
    exists: bool,
    last_seq: i64,
    last_idx: i64,
    messages: bool,
}

/// The ids in order, the last repeated up to the next power of two (none
/// when there are none): `IN (a, b, c, c)` means `IN (a, b, c)`.
fn padded<'a>(ids: &BTreeSet<&'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = ids.iter().copied().collect();
    if let Some(last) = v.last().copied() {
        v.resize(v.len().next_power_of_two(), last);
    }
    v
}

/// Appends the ids as binds and the closing parenthesis of an `IN (`.
fn push_ids(q: &mut sqlx::QueryBuilder<sqlx::Postgres>, ids: &[&str]) {
    let mut sep = q.separated(", ");
    for id in ids {
        sep.push_bind(*id);
    }
    sep.push_unseparated(")");
}

/// The sessions of `jobs` whose remembered cursor can be used: known, and
/// the first event of the session in the batch comes right after it.
fn trusted<'a>(cache: &Cache, jobs: &[(&'a str, &Rows)]) -> BTreeMap<&'a str, Known> {
    // Per session, its first event's seq in the batch (None: no event).
    let mut first_seq: BTreeMap<&str, Option<i64>> = BTreeMap::new();
    for &(s, rows) in jobs {
        let seq = match rows {
            Rows::Events { first_seq, .. } => Some(*first_seq),
            Rows::Own(_) => continue,
            _ => None,
        };
        let first = first_seq.entry(s).or_insert(seq);
        if first.is_none() {
            *first = seq;
        }
    }
    first_seq
        .into_iter()
        .filter_map(|(s, first)| {
            let k = *cache.get(s)?;
            first
                .is_none_or(|seq| seq == k.last_seq + 1)
                .then_some((s, k))
        })
        .collect()
}

/// The rows a batch writes, planned on its sessions' cursors.
struct Plan<'a> {
    /// One answer per job, in order (a row job's is true).
    results: Vec<StoreResult<bool>>,
    events: Vec<(&'a str, i64, &'a [u8])>,
    messages: Vec<(&'a str, i64, &'a str)>,
}

/// The cursors the batch starts from: the trusted ones as remembered, the
/// others unknown until read.
fn start_cursors<'a>(
    known: &BTreeMap<&'a str, Known>,
    unknown: &BTreeSet<&'a str>,
) -> BTreeMap<&'a str, Cursor> {
    let mut cursors: BTreeMap<&str, Cursor> = known
        .iter()
        .map(|(s, k)| {
            let c = Cursor {
                exists: true,
                last_seq: k.last_seq,
                last_idx: k.last_idx,
                messages: false,
            };
            (*s, c)
        })
        .collect();
    for s in unknown {
        cursors.insert(*s, Cursor::default());
    }
    cursors
}

/// Checks each job against its session's cursor and lays out its rows,
/// advancing the cursors.
fn plan<'a>(jobs: &[(&'a str, &'a Rows)], cursors: &mut BTreeMap<&'a str, Cursor>) -> Plan<'a> {
    let mut results = Vec::with_capacity(jobs.len());
    let mut events: Vec<(&str, i64, &[u8])> = Vec::new();
    let mut messages: Vec<(&str, i64, &str)> = Vec::new();
    for &(s, rows) in jobs {
        if matches!(rows, Rows::Own(_)) {
            // Answered by SQLite's batch, which runs it.
            results.push(Err(StoreError::Backend(
                "a write of the SQLite store's own reached another engine".into(),
            )));
            continue;
        }
        let c = cursors.get_mut(s).expect("every session has a cursor");
        if !c.exists {
            results.push(Err(StoreError::NotFound(s.to_owned())));
            continue;
        }
        match rows {
            Rows::Events { first_seq, bodies } => {
                if *first_seq != c.last_seq + 1 {
                    results.push(Err(StoreError::Backend(format!(
                        "event seq {first_seq} out of order (last {})",
                        c.last_seq
                    ))));
                    continue;
                }
                for body in bodies {
                    c.last_seq += 1;
                    events.push((s, c.last_seq, body.as_slice()));
                }
            }
            Rows::Messages(ms) => {
                for m in ms {
                    c.last_idx += 1;
                    messages.push((s, c.last_idx, m.as_str()));
                }
                c.messages = true;
            }
            Rows::Delete | Rows::Created | Rows::Own(_) => {
                unreachable!(
                    "deletes are committed on their own, creations noted; own writes were skipped"
                )
            }
        }
        results.push(Ok(true));
    }
    Plan {
        results,
        events,
        messages,
    }
}

/// What the batch did, once committed.
fn outcome<'a>(plan: Plan<'a>, cursors: BTreeMap<&'a str, Cursor>) -> Outcome<'a> {
    let last_seqs = last_seqs(&plan);
    let events = plan.events.len();
    let cursors = cursors
        .into_iter()
        .filter(|(_, c)| c.exists)
        .map(|(s, c)| {
            let k = Known {
                last_seq: c.last_seq,
                last_idx: c.last_idx,
            };
            (s, k)
        })
        .collect();
    Outcome {
        results: plan.results,
        last_seqs,
        events,
        cursors,
    }
}

/// Per session that gets events in `plan`, its last seq.
fn last_seqs<'a>(plan: &Plan<'a>) -> BTreeMap<&'a str, i64> {
    plan.events.iter().map(|(s, seq, _)| (*s, *seq)).collect()
}

/// The cursors a batch starts from: its sessions (an own write's is not
/// one) with their remembered cursors where they can be trusted, and the
/// sessions whose cursors must be read (sorted).
fn start<'a>(
    cache: &Cache,
    jobs: &[(&'a str, &'a Rows)],
) -> (BTreeMap<&'a str, Cursor>, BTreeSet<&'a str>) {
    let sessions: BTreeSet<&str> = jobs
        .iter()
        .filter(|(_, r)| !matches!(r, Rows::Own(_)))
        .map(|(s, _)| *s)
        .collect();
    let known = trusted(cache, jobs);
    let unknown: BTreeSet<&str> = sessions
        .iter()
        .copied()
        .filter(|s| !known.contains_key(s))
        .collect();
    (start_cursors(&known, &unknown), unknown)
}

/// PostgreSQL: writes the jobs in one transaction. Err: the transaction
/// failed and nothing of it was committed.
async fn pg_batch<'a>(
    c: &mut sqlx::PgConnection,
    channel: &str,
    cache: &Cache,
    jobs: &[(&'a str, &'a Rows)],
) -> StoreResult<Outcome<'a>> {
    let (mut cursors, unknown) = start(cache, jobs);
    let now = now_ms();
    if unknown.is_empty() {
        // Every cursor is remembered (the usual case): one statement,
        // committed on its own (it locks the sessions first).
        let plan = plan(jobs, &mut cursors);
        pg_write(&mut *c, channel, &plan, &cursors, now).await?;
        return Ok(outcome(plan, cursors));
    }
    use sqlx::Connection;
    let mut tx = c.begin().await?;
    // Every session's row is locked first, in sorted order, by a statement
    // of its own, so another replica's batch on the same session waits for
    // this one, the read that follows (a new snapshot: READ COMMITTED) sees
    // what it committed, and a session deleted meanwhile is seen gone. The
    // id lists are padded to a power of two, so that a few prepared
    // statements serve every batch size.
    let sessions: BTreeSet<&str> = cursors.keys().copied().collect();
    let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new("SELECT id FROM sessions WHERE id IN (");
    push_ids(&mut q, &padded(&sessions));
    q.push(" ORDER BY id FOR UPDATE");
    let locked: BTreeSet<String> = q
        .build_query_scalar::<String>()
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
    for (s, c) in cursors.iter_mut() {
        c.exists = c.exists && locked.contains(*s);
    }
    // The cursors the writer does not know, in one statement whatever their
    // number (a statement per session cost more than the inserts): each MAX
    // is an index lookup on the (session_id, seq|idx) key.
    let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(
        "SELECT s.id, \
         COALESCE((SELECT MAX(e.seq) FROM session_events e WHERE e.session_id = s.id), 0), \
         COALESCE((SELECT MAX(m.idx) FROM session_messages m WHERE m.session_id = s.id), 0) \
         FROM sessions s WHERE s.id IN (",
    );
    push_ids(&mut q, &padded(&unknown));
    for (id, seq, idx) in q
        .build_query_as::<(String, i64, i64)>()
        .fetch_all(&mut *tx)
        .await?
    {
        if let Some(c) = cursors.get_mut(id.as_str()) {
            c.exists = true;
            c.last_seq = seq;
            c.last_idx = idx;
        }
    }
    let plan = plan(jobs, &mut cursors);
    pg_write(&mut *tx, channel, &plan, &cursors, now).await?;
    tx.commit().await?;
    Ok(outcome(plan, cursors))
}

/// PostgreSQL: the one statement that writes a planned batch, whatever its
/// size (the rows go as arrays, so one prepared statement serves every
/// batch). It first locks the batch's sessions in sorted order (`lk`), so
/// two replicas' batches on a session serialize and cannot deadlock, and
/// writes only if every one of them still exists (`ok`, a one-time filter
/// of each write below, which therefore waits for the locks): the events,
/// the messages, the sessions' last activity, and the notifications, which
/// PostgreSQL delivers when (and only if) the transaction commits: each
/// session's last seq, many sessions to a notification
/// ([`Notice::event_payloads`]). It answers `ok`: false, it wrote nothing (a
/// session was deleted through another store since the writer remembered
/// its cursor), and the batch is retried job by job on fresh reads.
///
/// That check is what keeps a deleted session's rows out on PostgreSQL
/// (schema 6 dropped the foreign keys of the events and messages there:
/// their per-row checks were a third of the statement's time, and every
/// row is written here, under its session's lock).
const PG_WRITE: &str = "WITH \
     lk AS (SELECT id FROM sessions WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE), \
     ok AS (SELECT count(*) = cardinality($1::text[]) AS ok FROM lk), \
     ev AS (INSERT INTO session_events (session_id, seq, body) \
            SELECT * FROM UNNEST($2::text[], $3::int8[], $4::bytea[]) \
            WHERE (SELECT ok FROM ok)), \
     ms AS (INSERT INTO session_messages (session_id, idx, body) \
            SELECT * FROM UNNEST($5::text[], $6::int8[], $7::text[]) \
            WHERE (SELECT ok FROM ok)), \
     tc AS (UPDATE sessions SET last_active_ms = $8 \
            WHERE id = ANY($9::text[]) AND (SELECT ok FROM ok)), \
     nt AS (SELECT pg_notify($10, p) FROM UNNEST($11::text[]) AS t(p) \
            WHERE (SELECT ok FROM ok)) \
     SELECT (SELECT ok FROM ok), (SELECT count(*) FROM nt)";

/// Runs [`PG_WRITE`] for `plan` on `ex` (a connection: a transaction of its
/// own; or the batch's transaction).
async fn pg_write<'c>(
    ex: impl sqlx::PgExecutor<'c>,
    channel: &str,
    plan: &Plan<'_>,
    cursors: &BTreeMap<&str, Cursor>,
    now: i64,
) -> StoreResult<()> {
    // Every session the batch writes, sorted (a session found gone inside
    // the batch's transaction has no rows in it).
    let sessions: Vec<&str> = cursors
        .iter()
        .filter(|(_, c)| c.exists)
        .map(|(s, _)| *s)
        .collect();
    let touched: Vec<&str> = cursors
        .iter()
        .filter(|(_, c)| c.messages)
        .map(|(s, _)| *s)
        .collect();
    let payloads =
        Notice::event_payloads(last_seqs(plan).into_iter().map(|(s, seq)| (s, seq as u64)));
    let (ok, _): (bool, i64) = sqlx::query_as(PG_WRITE)
        .bind(sessions)
        .bind(plan.events.iter().map(|e| e.0).collect::<Vec<&str>>())
        .bind(plan.events.iter().map(|e| e.1).collect::<Vec<i64>>())
        .bind(plan.events.iter().map(|e| e.2).collect::<Vec<&[u8]>>())
        .bind(plan.messages.iter().map(|m| m.0).collect::<Vec<&str>>())
        .bind(plan.messages.iter().map(|m| m.1).collect::<Vec<i64>>())
        .bind(plan.messages.iter().map(|m| m.2).collect::<Vec<&str>>())
        .bind(now)
        .bind(touched)
        .bind(channel)
        .bind(payloads)
        .fetch_one(ex)
        .await?;
    if !ok {
        return Err(StoreError::Backend(
            "a session of the batch was deleted meanwhile; nothing of it was written".into(),
        ));
    }
    Ok(())
}

/// SQLite: a session's last seq, in the log or its tail (`$1`: the
/// session; `$2`, `$3`: what the writer's index showed, [`TailIndex::seen_last`]).
/// The log's MAX is a lookup on its (session_id, seq) key; the tail's are
/// lookups of the positions the index gave and a range of those past the
/// ones it covers (see [`TailIndex`]).
pub(in crate::sql) const SQLITE_LAST_SEQ: &str = "SELECT MAX(\
     COALESCE((SELECT MAX(seq) FROM session_events WHERE session_id = $1), 0), \
     COALESCE((SELECT MAX(seq) FROM session_event_tail \
     WHERE pos IN (SELECT value FROM json_each($2)) AND session_id = $1), 0), \
     COALESCE((SELECT MAX(seq) FROM session_event_tail WHERE pos > $3 AND session_id = $1), 0))";

/// SQLite: a session's events after a seq, in seq order (`$1`: the
/// session; `$2`: the seq; `$3`, `$4`: what the writer's index showed,
/// [`TailIndex::seen`]), as [`SQLITE_LAST_SEQ`] reads them. One statement,
/// so one snapshot: a step of a move is seen whole or not at all. A row a
/// move copied but has not yet deleted from the tail may come twice, in
/// the log and at its position: the caller keeps one of each seq.
pub(in crate::sql) const SQLITE_EVENTS_SINCE: &str = "\
     SELECT seq, body FROM session_events WHERE session_id = $1 AND seq > $2 \
     UNION ALL \
     SELECT seq, body FROM session_event_tail \
     WHERE pos IN (SELECT value FROM json_each($3)) AND session_id = $1 AND seq > $2 \
     UNION ALL \
     SELECT seq, body FROM session_event_tail WHERE pos > $4 AND session_id = $1 AND seq > $2 \
     ORDER BY seq";

/// SQLite: one event of a session (`$1`: the session; `$2`: the seq;
/// `$3`, `$4`: what the writer's index showed from that seq on,
/// [`TailIndex::seen`]), wherever it is, as [`SQLITE_EVENTS_SINCE`] reads
/// it: each branch a lookup by key or position.
pub(in crate::sql) const SQLITE_EVENT_AT: &str = "\
     SELECT body FROM session_events WHERE session_id = $1 AND seq = $2 \
     UNION ALL \
     SELECT body FROM session_event_tail \
     WHERE pos IN (SELECT value FROM json_each($3)) AND session_id = $1 AND seq = $2 \
     UNION ALL \
     SELECT body FROM session_event_tail WHERE pos > $4 AND session_id = $1 AND seq = $2 \
     LIMIT 1";

/// SQLite: a session's cursor in the log, if it exists (each MAX a lookup
/// on the (session_id, seq) or (session_id, idx) key); the writer takes
/// the tail's last seq from its index.
const SQLITE_CURSOR: &str = "SELECT \
     COALESCE((SELECT MAX(seq) FROM session_events WHERE session_id = $1), 0), \
     COALESCE((SELECT MAX(idx) FROM session_messages WHERE session_id = $1), 0) \
     FROM sessions WHERE id = $1";

/// SQLite: writes the jobs in one transaction on the writer's connection:
/// the store's own writes first, then the cursors it does not know are
/// read, then one prepared single-row statement per row, the events into
/// the log's tail. Single-row
/// inserts need no statement journal (a multi-row INSERT copied each page
/// it touched into one, in case the statement failed halfway), and
/// in-process a statement per row costs no round trip. Err: nothing of it
/// was committed.
///
/// The tail has no key to refuse a row written on a stale cursor, so the
/// writer trusts its cursors only while no other connection has committed
/// to the file: `PRAGMA data_version`, read under the write lock, changes
/// when another connection committed (another store on the file, another
/// process), and then the writer forgets every cursor and reads the
/// batch's sessions again.
fn sqlite_batch<'a>(
    c: &rusqlite::Connection,
    broken: &mut bool,
    synced: &mut Synced<'_>,
    tail: &TailIndex,
    direct: bool,
    jobs: &[(&'a str, &'a Rows)],
) -> StoreResult<Outcome<'a>> {
    let now = now_ms();
    let (plan, cursors, appended) = sqlite_tx(c, broken, |c| {
        sync(c, synced, tail)?;
        let (mut cursors, unknown) = start(synced.cache, jobs);
        let mut answers = Vec::new();
        for (i, (_, rows)) in jobs.iter().enumerate() {
            if let Rows::Own(write) = rows {
                answers.push((i, write(c)?));
            }
        }
        if !unknown.is_empty() {
            let mut read = prepared(c, SQLITE_CURSOR)?;
            for s in &unknown {
                let mut rows = read.query([s])?;
                if let Some(row) = rows.next()? {
                    let cur = cursors.get_mut(s).expect("every session has a cursor");
                    cur.exists = true;
                    // The index is in step with the file (`sync`).
                    cur.last_seq = row.get::<_, i64>(0)?.max(tail.last_seq(s).unwrap_or(0));
                    cur.last_idx = row.get(1)?;
                }
            }
        }
        let mut plan = plan(jobs, &mut cursors);
        for (i, answer) in answers {
            plan.results[i] = answer;
        }
        let mut appended = Vec::new();
        if direct {
            insert(
                c,
                "INSERT INTO session_events (session_id, seq, body) VALUES ($1, $2, $3)",
                &plan.events,
            )?;
        } else if !plan.events.is_empty() {
            let mut ins = prepared(
                c,
                "INSERT INTO session_event_tail (session_id, seq, body) VALUES ($1, $2, $3)",
            )?;
            appended.reserve(plan.events.len());
            for (s, seq, body) in &plan.events {
                ins.execute(rusqlite::params![s, seq, body])?;
                appended.push((*s, c.last_insert_rowid(), *seq));
            }
        }
        if !plan.messages.is_empty() {
            insert(
                c,
                "INSERT INTO session_messages (session_id, idx, body) VALUES ($1, $2, $3)",
                &plan.messages,
            )?;
            let mut touch = prepared(c, "UPDATE sessions SET last_active_ms = $1 WHERE id = $2")?;
            for (s, _) in cursors.iter().filter(|(_, c)| c.messages) {
                touch.execute(rusqlite::params![now, s])?;
            }
        }
        Ok((plan, cursors, appended))
    })?;
    tail.appended(&appended);
    Ok(outcome(plan, cursors))
}

/// SQLite: what the writer's transactions keep in step with the file:
/// the connection's data version at its last transaction, and the cursors
/// and tail index it vouches for.
struct Synced<'a> {
    version: &'a mut Option<i64>,
    cache: &'a mut Cache,
}

/// SQLite: at the start of a transaction of the writer, under the write
/// lock: when another connection has committed since the writer's last
/// transaction (`PRAGMA data_version` changed; unknown for a connection
/// just taken), every remembered cursor may be stale and the tail may hold
/// rows the index does not know (or no longer hold rows it knows): the
/// cursors are forgotten and the index read again from the tail.
fn sync(c: &rusqlite::Connection, synced: &mut Synced<'_>, tail: &TailIndex) -> StoreResult<()> {
    let v: i64 = prepared(c, "PRAGMA data_version")?.query_row([], |r| r.get(0))?;
    if *synced.version == Some(v) {
        return Ok(());
    }
    // The version is taken only once the index is read again: a read that
    // fails here must not leave a stale index vouched for.
    *synced.version = None;
    synced.cache.clear();
    let top: Option<i64> = prepared(c, TAIL_TOP)?.query_row([], |r| r.get(0))?;
    let mut read = prepared(c, TAIL_LIVE)?;
    let rows = read
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<Vec<(i64, String, i64)>>>()?;
    tail.reload(rows, top.unwrap_or(0));
    *synced.version = Some(v);
    Ok(())
}

/// SQLite: moves the whole tail into the log (when the store closes): a
/// new move, step after step until it ends (or fails).
async fn move_tail(conn: &Driven, broken: &mut bool, tail: &mut Tail, synced: &mut Synced<'_>) {
    tail.moved();
    loop {
        move_step(conn, broken, tail, synced).await;
        if !tail.moving {
            return;
        }
    }
}

/// What one step of a move did.
enum Moved {
    /// The tail was empty: no move.
    Empty,
    /// It copied the sessions up to this one into the log.
    Copied { upto: i64, last: String },
    /// It deleted copied rows; the move ends when none up to `upto` is
    /// left. `lowest`: the tail's lowest position after it.
    Deleted { upto: i64, lowest: Option<i64> },
}

/// SQLite: one step of the move under way (or of a new one), in a
/// transaction of its own. A move notes the tail's highest position, then
/// copies its sessions into the log, the next [`move_sessions!`] of them
/// (in id order, from the writer's index, fewer when they hold
/// [`STEP_ROWS`] rows) at each step; then it deletes the rows up to that
/// position from the tail, [`delete_rows!`] at each step, and ends. A
/// failed step ends the move (it changed nothing: reads see the tail as
/// before) and is logged; the next move is tried after [`MOVE_ROWS`] more
/// live rows or when idle.
async fn move_step(conn: &Driven, broken: &mut bool, tail: &mut Tail, synced: &mut Synced<'_>) {
    tail.moving = true;
    let mut timed_out = false;
    let index = tail.index.clone();
    let (after, upto, deleting) = (tail.after.clone(), tail.upto, tail.deleting);
    let r = match sqlite_begin(conn, *broken, &mut timed_out).await {
        Ok(()) => sqlite_tx(&conn.lock(), broken, |c| {
            sync(c, synced, &index)?;
            let upto = match upto {
                Some(u) => u,
                None => match prepared(c, TAIL_TOP)?.query_row([], |r| r.get(0))? {
                    Some(u) => u,
                    None => return Ok(Moved::Empty),
                },
            };
            if !deleting
                && let Some(step) = index.step(after.as_deref(), STEP_ROWS, move_sessions!())
            {
                prepared(c, MOVE_COPY)?.execute([&step.positions])?;
                return Ok(Moved::Copied {
                    upto,
                    last: step.last,
                });
            }
            prepared(c, MOVE_DELETE)?.execute([upto])?;
            let lowest = prepared(c, "SELECT MIN(pos) FROM session_event_tail")?
                .query_row([], |r| r.get(0))?;
            Ok(Moved::Deleted { upto, lowest })
        }),
        Err(e) => Err(e),
    };
    match r {
        Ok(Moved::Empty) => {
            tail.pending = false;
            tail.floor = 0;
            tail.moved();
        }
        Ok(Moved::Copied { upto, last }) => {
            index.moved(after.as_deref(), &last);
            tail.upto = Some(upto);
            tail.after = Some(last);
        }
        Ok(Moved::Deleted { upto, lowest }) if lowest.is_some_and(|p| p <= upto) => {
            tail.upto = Some(upto);
            tail.deleting = true;
        }
        Ok(Moved::Deleted { lowest, .. }) => {
            // Rows written since the move began stay for the next.
            tail.pending = lowest.is_some();
            tail.floor = 0;
            tail.moved();
        }
        Err(e) => {
            tracing::warn!(error = %e, "conversation store: moving the event log's tail failed");
            tail.pending = false;
            tail.floor = index.rows();
            tail.moved();
        }
    }
}

/// `sql` prepared once per connection. Its parameters, in the texts shared
/// with PostgreSQL, are `$1`, `$2`, …, which SQLite numbers in the order they
/// first appear, and rusqlite binds by that number: each must first appear in
/// order, or a value would be bound to another's place (checked here in
/// debug builds, so a test catches a text that breaks it).
pub(super) fn prepared<'c>(
    c: &'c rusqlite::Connection,
    sql: &str,
) -> rusqlite::Result<rusqlite::CachedStatement<'c>> {
    let stmt = c.prepare_cached(sql)?;
    debug_assert!(
        (1..=stmt.parameter_count())
            .all(|i| stmt.parameter_name(i) == Some(format!("${i}").as_str())),
        "parameters out of order in {sql}"
    );
    Ok(stmt)
}

/// SQLite: `rows` (session, seq or index, body) through `sql`, one
/// execution of the prepared statement per row.
fn insert<B: rusqlite::ToSql>(
    c: &rusqlite::Connection,
    sql: &str,
    rows: &[(&str, i64, B)],
) -> rusqlite::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut ins = prepared(c, sql)?;
    for (s, n, body) in rows {
        ins.execute(rusqlite::params![s, n, body])?;
    }
    Ok(())
}

/// Runs one prepared statement without parameters (`BEGIN IMMEDIATE`, …).
fn exec(c: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    prepared(c, sql)?.execute([])?;
    Ok(())
}

/// SQLite: takes the write lock (`BEGIN IMMEDIATE`). When another
/// connection holds it, waits for it up to sqlx's busy timeout, yielding
/// between tries; `timed_out` tells whether it waited that long in vain.
async fn sqlite_begin(conn: &Driven, broken: bool, timed_out: &mut bool) -> StoreResult<()> {
    *timed_out = false;
    if broken {
        return Err(StoreError::Backend(
            "the write connection failed to roll back".into(),
        ));
    }
    let deadline = tokio::time::Instant::now() + conn.busy;
    let mut pause = Duration::from_millis(1);
    loop {
        let r = exec(&conn.lock(), "BEGIN IMMEDIATE");
        match r {
            Ok(()) => return Ok(()),
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                if tokio::time::Instant::now() >= deadline {
                    *timed_out = true;
                    return Err(StoreError::Backend(format!(
                        "SQLite's write lock stayed taken for {} ms: {e}",
                        conn.busy.as_millis()
                    )));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// SQLite: `body` in the transaction [`sqlite_begin`] began, committed; on
/// any error rolled back, and a connection that cannot roll back is
/// `broken`.
fn sqlite_tx<T>(
    c: &rusqlite::Connection,
    broken: &mut bool,
    body: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    let r = (|| {
        let v = body(c)?;
        exec(c, "COMMIT")?;
        Ok(v)
    })();
    if r.is_err() && !c.is_autocommit() && exec(c, "ROLLBACK").is_err() {
        *broken = true;
    }
    r
}

/// What deleting a session deletes before its row, in order.
const DELETE_OWNED: [&str; 9] = [
    "DELETE FROM session_messages WHERE session_id = $1",
    "DELETE FROM session_turns WHERE session_id = $1",
    "DELETE FROM session_checkpoints WHERE session_id = $1",
    "DELETE FROM session_forks WHERE session_id = $1",
    "DELETE FROM session_events WHERE session_id = $1",
    "DELETE FROM session_leases WHERE session_id = $1",
    "DELETE FROM session_grants WHERE session_id = $1",
    "DELETE FROM session_approvals WHERE session_id = $1",
    "DELETE FROM session_cancels WHERE session_id = $1",
];

/// SQLite: deletes a session with its messages, events, lease, grants,
/// approvals and cancel requests (in the caller's transaction); whether it
/// existed.
fn sqlite_delete(c: &rusqlite::Connection, id: &str) -> StoreResult<bool> {
    prepared(c, "DELETE FROM session_event_tail WHERE session_id = $1")?.execute([id])?;
    for sql in DELETE_OWNED {
        prepared(c, sql)?.execute([id])?;
    }
    Ok(prepared(c, "DELETE FROM sessions WHERE id = $1")?.execute([id])? > 0)
}

/// PostgreSQL: [`sqlite_delete`] in one transaction that locks the
/// session's row first, as a batch does: a batch of another replica on it
/// commits before the delete reads what to delete, or waits for the delete
/// and finds the session gone (locking it last let the delete fail on the
/// batch's rows, or deadlock with a batch whose insert waited for a key the
/// delete held).
async fn pg_delete(c: &mut sqlx::PgConnection, id: &str) -> StoreResult<bool> {
    use sqlx::Connection;
    let mut tx = c.begin().await?;
    sqlx::query("SELECT id FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    for sql in DELETE_OWNED {
        sqlx::query(sql).bind(id).execute(&mut *tx).await?;
    }
    let existed = sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        > 0;
    tx.commit().await?;
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// b3d9013, with the failure injected: another connection commits a
    /// row to the tail (the writer's data version changes), then the
    /// writer's read of the tail fails. The writer must not take the new
    /// version with the index it failed to read: before the fix it did, and
    /// its index stayed without that row for good (later commits vouched
    /// for rows it did not hold, and a move could delete rows never copied).
    /// Its next transaction reads the index again and finds the row.
    #[test]
    fn a_failed_tail_read_leaves_the_index_to_be_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        for m in super::super::SQLITE_MIGRATIONS {
            writer.execute_batch(m).unwrap();
        }
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute(
                "INSERT INTO sessions (id, title, agent, team_members, created_ms, last_active_ms) \
                 VALUES ('s1', '', 'a', '[]', 1, 1)",
                [],
            )
            .unwrap();
        let tail_row = |seq: i64| {
            other
                .execute(
                    "INSERT INTO session_event_tail (session_id, seq, body) VALUES ('s1', ?1, x'00')",
                    [seq],
                )
                .unwrap();
        };
        tail_row(1);
        let index = TailIndex::default();
        let (mut version, mut cache) = (None, Cache::new());
        sync(
            &writer,
            &mut Synced {
                version: &mut version,
                cache: &mut cache,
            },
            &index,
        )
        .unwrap();
        assert_eq!(index.last_seq("s1"), Some(1));
        assert!(version.is_some());

        // Another store commits seq 2; the writer's read of the tail then
        // fails (injected: the table is away while it reads).
        tail_row(2);
        other
            .execute_batch("ALTER TABLE session_event_tail RENAME TO tail_away")
            .unwrap();
        let failed = sync(
            &writer,
            &mut Synced {
                version: &mut version,
                cache: &mut cache,
            },
            &index,
        );
        assert!(failed.is_err(), "the injected failure fails the read");
        assert_eq!(
            version, None,
            "a failed read leaves no version vouching for the stale index"
        );
        assert_eq!(
            index.last_seq("s1"),
            Some(1),
            "the index is still the old one"
        );

        // The next transaction reads the index again and holds the row.
        other
            .execute_batch("ALTER TABLE tail_away RENAME TO session_event_tail")
            .unwrap();
        sync(
            &writer,
            &mut Synced {
                version: &mut version,
                cache: &mut cache,
            },
            &index,
        )
        .unwrap();
        assert_eq!(
            index.last_seq("s1"),
            Some(2),
            "the row committed by the other connection is in the index"
        );
        assert!(version.is_some());
    }

    /// The writer's move ([`move_step`]) on a database of the store's
    /// schema, its tail left by "another store" (rows the writer's index
    /// has never seen, which it reads at its first step): each step copies
    /// the next [`move_sessions!`] sessions into the log, a read in the
    /// middle of the move sees every event once (a copied row still in the
    /// tail is skipped by seq), the move's end deletes the tail, and each
    /// of the move's statements is compiled once (SQLite compiles a
    /// statement again when a bound value can change its plan, as a bound
    /// `LIMIT` in a subquery did at every step).
    #[tokio::test]
    async fn a_move_copies_sessions_in_steps_then_empties_the_tail() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        for m in super::super::SQLITE_MIGRATIONS {
            c.execute_batch(m).unwrap();
        }
        const SESSIONS: usize = move_sessions!();
        let sessions = 2 * SESSIONS + 10;
        for s in 0..sessions {
            let id = format!("s{s:03}");
            c.execute(
                "INSERT INTO sessions (id, title, agent, team_members, created_ms, last_active_ms) \
                 VALUES (?1, '', 'a', '[]', 1, 1)",
                [&id],
            )
            .unwrap();
        }
        // Interleaved, as batches leave them: seq 1 of every session, then seq 2.
        for seq in 1..=2 {
            for s in 0..sessions {
                c.execute(
                    "INSERT INTO session_event_tail (session_id, seq, body) VALUES (?1, ?2, ?3)",
                    rusqlite::params![format!("s{s:03}"), seq, format!("{s}/{seq}").into_bytes()],
                )
                .unwrap();
            }
        }
        let conn = Driven::new(c).unwrap();
        let count = |table: &str| {
            conn.lock()
                .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap() as usize
        };
        // What `SqlStore::events_since` reads and keeps.
        let read = |index: &TailIndex, id: &str| -> Vec<(i64, String)> {
            let seen = index.seen(id, 0);
            let c = conn.lock();
            let mut st = c.prepare(&SQLITE_EVENTS_SINCE.replace('$', "?")).unwrap();
            let rows: Vec<(i64, Vec<u8>)> = st
                .query_map(
                    rusqlite::params![id, 0, seen.positions, seen.covered],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let mut out: Vec<(i64, String)> = Vec::new();
            for (seq, body) in rows {
                let body = String::from_utf8(body).unwrap();
                if let Some(last) = out.last()
                    && last.0 == seq
                {
                    assert_eq!(last.1, body, "a row read twice is the same row");
                    continue;
                }
                out.push((seq, body));
            }
            out
        };
        let index = Arc::new(TailIndex::default());
        let (mut broken, mut tail, mut steps) = (false, Tail::new(index.clone()), Vec::new());
        let (mut version, mut cache) = (None, Cache::new());
        let mut read_mid_move = false;
        loop {
            let before = count("session_events");
            let mut synced = Synced {
                version: &mut version,
                cache: &mut cache,
            };
            move_step(&conn, &mut broken, &mut tail, &mut synced).await;
            assert!(!broken);
            if !tail.moving {
                break;
            }
            assert!(
                !tail.deleting,
                "{} rows: one step deletes them",
                2 * sessions
            );
            steps.push((
                tail.after.clone().unwrap(),
                count("session_events") - before,
            ));
            if index.rows() == 0 {
                // Every session copied, none deleted from the tail yet.
                read_mid_move = true;
                assert_eq!(count("session_event_tail"), 2 * sessions);
                for id in ["s000", "s070", "s137"] {
                    let n: usize = id[1..].parse().unwrap();
                    assert_eq!(
                        read(&index, id),
                        [(1, format!("{n}/1")), (2, format!("{n}/2"))],
                        "{id}"
                    );
                }
            }
        }
        assert_eq!(
            steps,
            [
                ("s063".to_owned(), 2 * SESSIONS),
                ("s127".to_owned(), 2 * SESSIONS),
                ("s137".to_owned(), 20),
            ]
        );
        assert!(read_mid_move);
        assert_eq!(count("session_event_tail"), 0);
        assert_eq!(count("session_events"), 2 * sessions);
        assert_eq!(index.rows(), 0);
        assert!(!tail.pending);
        assert_eq!(
            read(&index, "s099"),
            [(1, "99/1".into()), (2, "99/2".into())]
        );
        for sql in [MOVE_COPY, MOVE_DELETE, TAIL_TOP, TAIL_LIVE] {
            let compiled_again = prepared(&conn.lock(), sql)
                .unwrap()
                .get_status(rusqlite::StatementStatus::RePrepare);
            assert_eq!(compiled_again, 0, "{sql}");
        }
    }
}
