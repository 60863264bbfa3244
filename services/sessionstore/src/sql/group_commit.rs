//! Group commit: one writer task per [`SqlStore`](super::SqlStore) writes the
//! event log and the message history in batches, one transaction per batch.
//!
//! Every `append_event` and `append_messages` call queues its rows and waits
//! for the commit of the batch that holds them, so a caller (the hub, which
//! publishes an event to its subscribers only after `append_event` returned)
//! never acts on a row that a crash could still lose. The writer takes what
//! queued while the previous batch committed, and when the last batch held
//! more than one job it lingers up to [`LINGER`] for more (never past
//! [`MAX_JOBS`]); an idle store commits a lone row at once.
//!
//! Order and gap-free seqs hold as before: jobs are applied in queue order,
//! each event's seq is checked against the session's last seq (read once per
//! batch, inside the transaction, under the session lock) plus the events
//! of that session earlier in the batch. A job that fails its check gets its
//! own error and the others commit. A batch whose transaction fails is
//! retried job by job, so one bad row never fails its neighbours.

use crate::{Notice, Notices, StoreError, StoreResult, now_ms};
use omicos_sqldb::Db;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long the writer waits for more rows once it has seen concurrent writers.
pub(super) const LINGER: Duration = Duration::from_millis(1);

/// The most jobs in one transaction (3 bound values per row keeps a batch's
/// statements far below SQLite's and PostgreSQL's bind limits).
pub(super) const MAX_JOBS: usize = 512;

/// Rows per INSERT statement.
const ROWS_PER_INSERT: usize = 256;

/// How many jobs may queue before callers wait for room.
const QUEUE: usize = 8192;

/// What one caller asked to write.
pub(super) enum Rows {
    /// One event with the seq the caller assigned.
    Event {
        /// The seq (last_seq + 1 of the session, or the write is refused).
        seq: i64,
        /// The encoded event.
        body: Vec<u8>,
    },
    /// Messages (OpenAI shape, already serialized) appended after the session's last.
    Messages(Vec<String>),
}

/// A queued write and who waits for its commit.
pub(super) struct Job {
    session: String,
    rows: Rows,
    done: oneshot::Sender<StoreResult<()>>,
}

/// The queue into a store's writer task. Cheap to clone; the task ends when
/// the last clone is dropped.
#[derive(Clone, Debug)]
pub(super) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer task on `db`. `channel` is the PostgreSQL
    /// notification channel; `notices` the in-process bus (SQLite).
    pub(super) fn spawn(db: Db, channel: Arc<str>, notices: Notices) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(db, channel, notices, rx));
        Self { tx }
    }

    /// Queues `rows` for `session` and waits until they are committed (or refused).
    pub(super) async fn write(&self, session: &str, rows: Rows) -> StoreResult<()> {
        let (done, rx) = oneshot::channel();
        let job = Job {
            session: session.to_owned(),
            rows,
            done,
        };
        let stopped = || StoreError::Backend("the store's writer has stopped".into());
        self.tx.send(job).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

async fn run(db: Db, channel: Arc<str>, notices: Notices, mut rx: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_JOBS);
    let mut busy = false;
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        loop {
            while batch.len() < MAX_JOBS {
                match rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            if !busy || batch.len() >= MAX_JOBS {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(j)) => batch.push(j),
                _ => break,
            }
        }
        busy = batch.len() > 1;
        commit(&db, &channel, &notices, std::mem::take(&mut batch)).await;
    }
}

/// Commits `batch` in one transaction and answers each job; a failed
/// transaction is retried one job per transaction.
async fn commit(db: &Db, channel: &str, notices: &Notices, batch: Vec<Job>) {
    let refs: Vec<(&str, &Rows)> = batch
        .iter()
        .map(|j| (j.session.as_str(), &j.rows))
        .collect();
    match write_batch(db, channel, &refs).await {
        Ok(outcome) => {
            announce(db, notices, &outcome.last_seqs);
            for (job, r) in batch.into_iter().zip(outcome.results) {
                let _ = job.done.send(r);
            }
        }
        Err(e) if batch.len() == 1 => {
            if let Some(job) = batch.into_iter().next() {
                let _ = job.done.send(Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, jobs = batch.len(), "conversation store: a batch failed; writing its jobs one by one");
            for job in batch {
                let r = match write_batch(db, channel, &[(job.session.as_str(), &job.rows)]).await {
                    Ok(mut o) => {
                        announce(db, notices, &o.last_seqs);
                        o.results.pop().unwrap_or(Ok(()))
                    }
                    Err(e) => Err(e),
                };
                let _ = job.done.send(r);
            }
        }
    }
}

/// SQLite: the in-process bus hears of the committed events (PostgreSQL's
/// notifications went out with the transaction). One notice per session and
/// batch, with its last seq: a notice only wakes a reader, who reads the log.
fn announce(db: &Db, notices: &Notices, last_seqs: &BTreeMap<String, i64>) {
    if matches!(db, Db::Sqlite(_)) {
        for (session, seq) in last_seqs {
            notices.publish(Notice::Event {
                session: session.clone(),
                seq: *seq as u64,
            });
        }
    }
}

/// What a committed batch did.
struct Outcome {
    /// One result per job, in order.
    results: Vec<StoreResult<()>>,
    /// Per session that got events, the last seq written.
    last_seqs: BTreeMap<String, i64>,
}

/// A session's state inside the batch's transaction.
#[derive(Default)]
struct Cursor {
    exists: bool,
    last_seq: i64,
    last_idx: i64,
    messages: bool,
}

/// Writes the jobs in one transaction. Err: the transaction failed and
/// nothing of it was committed.
async fn write_batch(db: &Db, channel: &str, jobs: &[(&str, &Rows)]) -> StoreResult<Outcome> {
    // Sessions locked in sorted order: two replicas' batches cannot deadlock.
    let sessions: BTreeSet<&str> = jobs.iter().map(|(s, _)| *s).collect();
    let now = now_ms();
    macro_rules! body {
        ($tx:ident, $pg:ident, $db:ty) => {{
            let mut cursors: BTreeMap<&str, Cursor> = BTreeMap::new();
            for &s in &sessions {
                let mut c = Cursor {
                    exists: lock_session!($tx, $pg, s),
                    ..Cursor::default()
                };
                if c.exists {
                    c.last_seq = sqlx::query_scalar(
                        "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = $1",
                    )
                    .bind(s)
                    .fetch_one(&mut *$tx)
                    .await?;
                    if jobs
                        .iter()
                        .any(|(js, r)| *js == s && matches!(r, Rows::Messages(_)))
                    {
                        c.last_idx = sqlx::query_scalar(
                            "SELECT COALESCE(MAX(idx), 0) FROM session_messages WHERE session_id = $1",
                        )
                        .bind(s)
                        .fetch_one(&mut *$tx)
                        .await?;
                    }
                }
                cursors.insert(s, c);
            }
            let mut results = Vec::with_capacity(jobs.len());
            let mut events: Vec<(&str, i64, &[u8])> = Vec::new();
            let mut messages: Vec<(&str, i64, &str)> = Vec::new();
            for &(s, rows) in jobs {
                let c = cursors.get_mut(s).expect("every session has a cursor");
                if !c.exists {
                    results.push(Err(StoreError::NotFound(s.to_owned())));
                    continue;
                }
                match rows {
                    Rows::Event { seq, body } => {
                        if *seq != c.last_seq + 1 {
                            results.push(Err(StoreError::Backend(format!(
                                "event seq {seq} out of order (last {})",
                                c.last_seq
                            ))));
                            continue;
                        }
                        c.last_seq = *seq;
                        events.push((s, *seq, body.as_slice()));
                    }
                    Rows::Messages(ms) => {
                        for m in ms {
                            c.last_idx += 1;
                            messages.push((s, c.last_idx, m.as_str()));
                        }
                        c.messages = true;
                    }
                }
                results.push(Ok(()));
            }
            for chunk in events.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO session_events (session_id, seq, body) ");
                q.push_values(chunk, |mut b, (s, seq, body)| {
                    b.push_bind(*s).push_bind(*seq).push_bind(*body);
                });
                q.build().execute(&mut *$tx).await?;
            }
            for chunk in messages.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO session_messages (session_id, idx, body) ");
                q.push_values(chunk, |mut b, (s, idx, body)| {
                    b.push_bind(*s).push_bind(*idx).push_bind(*body);
                });
                q.build().execute(&mut *$tx).await?;
            }
            for (s, c) in &cursors {
                if c.messages {
                    sqlx::query("UPDATE sessions SET last_active_ms = $1 WHERE id = $2")
                        .bind(now)
                        .bind(*s)
                        .execute(&mut *$tx)
                        .await?;
                }
            }
            let mut last_seqs = BTreeMap::new();
            for (s, seq, _) in &events {
                last_seqs.insert((*s).to_owned(), *seq);
            }
            if $pg {
                // Sent inside the transaction: delivered exactly when it commits.
                for (s, seq) in &last_seqs {
                    let n = Notice::Event {
                        session: s.clone(),
                        seq: *seq as u64,
                    };
                    sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(channel)
                        .bind(n.payload())
                        .execute(&mut *$tx)
                        .await?;
                }
            }
            Outcome { results, last_seqs }
        }};
    }
    Ok(match db {
        Db::Sqlite(p) => {
            let pg = false;
            let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
            let o = body!(tx, pg, sqlx::Sqlite);
            tx.commit().await?;
            o
        }
        Db::Pg(p) => {
            let pg = true;
            let mut tx = p.begin().await?;
            let o = body!(tx, pg, sqlx::Postgres);
            tx.commit().await?;
            o
        }
    })
}
