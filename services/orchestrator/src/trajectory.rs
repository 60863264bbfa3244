//! Trajectories: every model turn and tool call of a session, as JSONL under
//! `<workspace>/.omicos/trajectories/<session>/trajectory.jsonl`, so a
//! conversation can be replayed.
//!
//! One writer thread per orchestrator appends the records: it takes every
//! record that queued while it wrote the last ones, writes each file's lines
//! with one call, and keeps recently used files open. A turn appends four or
//! five records; opening, writing and closing the file on a blocking-pool
//! thread for each of them cost more than the event log's own writes.

use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How many files the writer keeps open; past it, it closes them all.
const OPEN_FILES: usize = 256;

/// An idle writer closes its files after this long (a session that goes
/// quiet holds no descriptor).
const IDLE_CLOSE: Duration = Duration::from_secs(2);

/// The writer thread's name (the load bench counts its CPU as the orchestrator's).
pub const WRITER_THREAD: &str = "omicos-traj";

/// Told when a record is written, or why it is not.
type Done = oneshot::Sender<std::io::Result<()>>;

/// Where the answer to a [`Done`] arrives.
type Written = oneshot::Receiver<std::io::Result<()>>;

/// One record to append, and who waits until it is written.
struct Append {
    path: PathBuf,
    line: String,
    done: Done,
}

/// Appends trajectory records.
#[derive(Clone, Debug)]
pub struct Trajectories {
    root: PathBuf,
    tx: mpsc::Sender<Append>,
}

impl Trajectories {
    /// Under `<workspace>/.omicos/trajectories`. Starts the writer thread,
    /// which ends when the last clone is dropped.
    pub fn new(workspace: &Path) -> Self {
        let (tx, rx) = mpsc::channel();
        let started = std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || write_loop(rx));
        if let Err(e) = started {
            // Appends then fail one by one, each with a warning; the turn goes on.
            tracing::error!(error = %e, "trajectory writer not started");
        }
        Self {
            root: workspace.join(".omicos").join("trajectories"),
            tx,
        }
    }

    /// The file of a session.
    pub fn path(&self, session: &str) -> PathBuf {
        self.root.join(sanitize(session)).join("trajectory.jsonl")
    }

    /// Appends one record (one line) and waits until it is written, so that
    /// a client that saw the turn end, or a hook given the transcript path,
    /// finds it in the file with every record queued before it (the writer
    /// keeps the queue's order). Failures are logged, never fatal.
    pub async fn append(&self, session: &str, record: Value) {
        let Some(rx) = self.queue(session, &record) else {
            return;
        };
        let res = rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the trajectory writer stopped")));
        if let Err(e) = res {
            tracing::warn!(session, error = %e, "trajectory not written");
        }
    }

    /// Queues one record without waiting for it: the next awaited
    /// [`append`](Self::append) of the session is written after it. For the
    /// record that opens a turn, so that the turn does not wait for its
    /// session's directory and file to be made.
    pub fn append_queued(&self, session: &str, record: Value) {
        if let Some(rx) = self.queue(session, &record) {
            let session = session.to_owned();
            // Watched only to log a failure; nobody waits for it.
            tokio::spawn(async move {
                if let Ok(Err(e)) = rx.await {
                    tracing::warn!(session, error = %e, "trajectory not written");
                }
            });
        }
    }

    /// Waits until every record queued for the session so far is written.
    pub async fn flush(&self, session: &str) {
        if let Some(rx) = self.send(session, String::new()) {
            let _ = rx.await;
        }
    }

    /// Hands a record to the writer; None (logged) when it is not running.
    fn queue(&self, session: &str, record: &Value) -> Option<Written> {
        self.send(session, format!("{record}\n"))
    }

    /// Hands lines to the writer (none: a flush, answered in queue order).
    fn send(&self, session: &str, line: String) -> Option<Written> {
        let (done, rx) = oneshot::channel();
        let job = Append {
            path: self.path(session),
            line,
            done,
        };
        match self.tx.send(job) {
            Ok(()) => Some(rx),
            Err(_) => {
                tracing::warn!(session, "trajectory not written: the writer is not running");
                None
            }
        }
    }
}

/// The writer thread: batches what queued, one write per file and batch.
fn write_loop(rx: mpsc::Receiver<Append>) {
    let mut open: HashMap<PathBuf, File> = HashMap::new();
    loop {
        let first = match rx.recv_timeout(IDLE_CLOSE) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                open.clear();
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // Per file, its lines in arrival order and who waits for them; the
        // files in the order they first came (a burst of new turns queues
        // one record for each of hundreds of sessions).
        let mut batch: Vec<(PathBuf, String, Vec<Done>)> = Vec::new();
        let mut slot: HashMap<PathBuf, usize> = HashMap::new();
        for a in std::iter::once(first).chain(rx.try_iter()) {
            match slot.get(&a.path) {
                Some(&i) => {
                    let (_, lines, waiting) = &mut batch[i];
                    lines.push_str(&a.line);
                    waiting.push(a.done);
                }
                None => {
                    slot.insert(a.path.clone(), batch.len());
                    batch.push((a.path, a.line, vec![a.done]));
                }
            }
        }
        for (path, lines, waiting) in batch {
            let res = append_lines(&mut open, &path, &lines);
            for w in waiting {
                let _ = w.send(
                    res.as_ref()
                        .map(|_| ())
                        .map_err(|e| std::io::Error::new(e.kind(), e.to_string())),
                );
            }
        }
    }
}

/// Appends `lines` to `path` with one write call (lines stay whole when
/// another process appends too), through the open file when there is one.
fn append_lines(
    open: &mut HashMap<PathBuf, File>,
    path: &Path,
    lines: &str,
) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if lines.is_empty() {
        // Only a flush: everything queued before it is written already.
        return Ok(());
    }
    // A kept file whose directory was removed would swallow the lines.
    if open
        .get(path)
        .is_some_and(|f| f.metadata().map_or(true, |m| m.nlink() == 0))
    {
        open.remove(path);
    }
    if !open.contains_key(path) {
        if open.len() >= OPEN_FILES {
            open.clear();
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        open.insert(path.to_owned(), f);
    }
    let f = open.get_mut(path).expect("just opened");
    let res = f.write_all(lines.as_bytes());
    if res.is_err() {
        // Opened again next time (the directory may have been removed).
        open.remove(path);
    }
    res
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `i` of every record in the session's file, in file order.
    fn numbers(t: &Trajectories, session: &str) -> Vec<u64> {
        std::fs::read_to_string(t.path(session))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["i"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn records_from_many_sessions_land_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trajectories::new(dir.path());
        let mut tasks = tokio::task::JoinSet::new();
        for s in 0..20 {
            let t = t.clone();
            tasks.spawn(async move {
                for i in 0..30 {
                    t.append(
                        &format!("s{s}"),
                        serde_json::json!({"i": i, "pad": "x".repeat(i * 50)}),
                    )
                    .await;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        for s in 0..20 {
            let seen = numbers(&t, &format!("s{s}"));
            assert_eq!(seen, (0..30).collect::<Vec<_>>(), "session s{s}");
        }
    }

    #[tokio::test]
    async fn a_queued_record_is_written_before_the_next_awaited_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trajectories::new(dir.path());
        for i in 0..50 {
            t.append_queued("s", serde_json::json!({"i": i}));
        }
        t.flush("s").await;
        assert_eq!(numbers(&t, "s"), (0..50).collect::<Vec<_>>());
        t.append("s", serde_json::json!({"i": 50})).await;
        assert_eq!(numbers(&t, "s"), (0..=50).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_removed_directory_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trajectories::new(dir.path());
        t.append("s", serde_json::json!({"n": 1})).await;
        std::fs::remove_dir_all(t.path("s").parent().unwrap()).unwrap();
        // The writer kept the file open: it sees the file is gone and makes it again.
        t.append("s", serde_json::json!({"n": 2})).await;
        t.append("s", serde_json::json!({"n": 3})).await;
        let text = std::fs::read_to_string(t.path("s")).unwrap();
        assert_eq!(text, "{\"n\":2}\n{\"n\":3}\n");
    }
}
