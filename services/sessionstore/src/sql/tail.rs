//! SQLite: the live rows of the event log's tail, known in memory.
//!
//! The group-commit writer appends a batch's events to
//! `session_event_tail` in arrival order, and moves them into the log
//! (`session_events`, keyed by session and seq) a few sessions at a time
//! once the tail holds [`MOVE_ROWS`](super::group_commit::MOVE_ROWS) live
//! rows, so that a move writes each session's page of the log once for
//! many of its events instead of once per event. The tail has no index by
//! session (one would dirty a page per session and batch again, which is
//! what the tail exists to avoid), so reads cannot find a session's rows in
//! it without a scan; this index tells them where they are.
//!
//! **What it holds.** Per session, the positions (`pos`, the tail's
//! `INTEGER PRIMARY KEY AUTOINCREMENT`) and seqs of its live rows, and
//! `covered`: every live row at or below that position is in the index.
//! Only the writer changes it, and only after a commit (or, in
//! [`TailIndex::reload`], from what it read under the write lock). A row is
//! *live* while it is in the tail and not yet in the log; a move copies a
//! session's rows into the log and drops them from the index, and the rows
//! themselves are deleted from the tail later, by position ranges, at the
//! end of the move (deleting each session's rows at once dirtied every page
//! of the tail once per step).
//!
//! **How a read stays exact.** A read takes a session's positions and
//! `covered` from the index, then runs one statement (one snapshot) that
//! reads the log, the tail's rows at those positions, and the tail's rows
//! past `covered` (a range of the primary key). Positions only grow
//! (AUTOINCREMENT: never reused, even after the rows above were deleted),
//! so a row committed after the read took `covered` lies past it, whoever
//! wrote it (this store or another on the file); one committed before is in
//! the index or past `covered` (the writer raises `covered` only over rows it
//! has put in the index). A row moved meanwhile is in the log; one moved but
//! not yet deleted from the tail may be read twice (in the log and at its
//! position), with the same seq and body, and the read keeps one. So a
//! read sees every event of its snapshot once, in seq order.
//!
//! **Another connection on the file** (another store, another process):
//! the writer notices its commits by `PRAGMA data_version` at the start of
//! each of its transactions, under the write lock, and reads the tail's
//! live rows again ([`TailIndex::reload`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// The index (see the module's documentation). Shared by a store's clones
/// and its writer.
#[derive(Debug, Default)]
pub(super) struct TailIndex(Mutex<Live>);

#[derive(Debug, Default)]
struct Live {
    /// Per session, its live rows: (pos, seq), in position order.
    sessions: BTreeMap<String, Vec<(i64, i64)>>,
    /// Every live row at or below this position is in `sessions`.
    covered: i64,
    /// How many rows `sessions` holds.
    rows: usize,
}

/// What a read of one session takes from the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    /// The positions of the session's live rows it wants, as a JSON array
    /// (for `json_each`).
    pub positions: String,
    /// Rows past this position are read by a range of the primary key.
    pub covered: i64,
}

/// A step of a move: the sessions it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Step {
    /// The positions of their live rows, as a JSON array.
    pub positions: String,
    /// How many rows.
    pub rows: usize,
    /// The last session it takes (the next step starts after it).
    pub last: String,
}

fn json(positions: impl Iterator<Item = i64>) -> String {
    let mut s = String::from("[");
    for (i, p) in positions.enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{p}");
    }
    s.push(']');
    s
}

impl TailIndex {
    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        // Never poisoned in practice: nothing below panics while holding it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For a read of `session`: its live rows with a seq past `since`.
    pub(super) fn seen(&self, session: &str, since: i64) -> Seen {
        let live = self.live();
        let positions = match live.sessions.get(session) {
            Some(rows) => json(rows.iter().filter(|(_, s)| *s > since).map(|(p, _)| *p)),
            None => "[]".to_owned(),
        };
        Seen {
            positions,
            covered: live.covered,
        }
    }

    /// For a read of `session`'s last seq: its last live row (seqs grow with
    /// positions), if any.
    pub(super) fn seen_last(&self, session: &str) -> Seen {
        let live = self.live();
        let positions = json(
            live.sessions
                .get(session)
                .and_then(|rows| rows.last())
                .map(|(p, _)| *p)
                .into_iter(),
        );
        Seen {
            positions,
            covered: live.covered,
        }
    }

    /// The writer, under the write lock and in step with the file
    /// (after [`reload`](Self::reload) when another connection wrote):
    /// `session`'s last seq in the tail.
    pub(super) fn last_seq(&self, session: &str) -> Option<i64> {
        let live = self.live();
        live.sessions.get(session)?.last().map(|(_, s)| *s)
    }

    /// How many live rows it holds.
    pub(super) fn rows(&self) -> usize {
        self.live().rows
    }

    /// The writer committed `rows` (session, pos, seq) to the tail, in
    /// position order.
    pub(super) fn appended(&self, rows: &[(&str, i64, i64)]) {
        let mut live = self.live();
        for (session, pos, seq) in rows {
            match live.sessions.get_mut(*session) {
                Some(v) => v.push((*pos, *seq)),
                None => {
                    live.sessions
                        .insert((*session).to_owned(), vec![(*pos, *seq)]);
                }
            }
            live.covered = live.covered.max(*pos);
        }
        live.rows += rows.len();
    }

    /// The writer read the tail's live rows (pos, session, seq) under the
    /// write lock, and its highest position (`covered`): they replace
    /// what the index held.
    pub(super) fn reload(&self, rows: Vec<(i64, String, i64)>, covered: i64) {
        let mut sessions: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
        let n = rows.len();
        for (pos, session, seq) in rows {
            sessions.entry(session).or_default().push((pos, seq));
        }
        for v in sessions.values_mut() {
            v.sort_unstable();
        }
        let mut live = self.live();
        live.sessions = sessions;
        live.rows = n;
        live.covered = covered;
    }

    /// The next step of a move: the sessions after `after` (from the first
    /// when None), in id order, up to `max_sessions` of them or until they
    /// hold `max_rows` rows. None: no session left after `after`.
    pub(super) fn step(
        &self,
        after: Option<&str>,
        max_rows: usize,
        max_sessions: usize,
    ) -> Option<Step> {
        use std::ops::Bound;
        let live = self.live();
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut positions = Vec::new();
        let mut last = None;
        for (n, (session, rows)) in live
            .sessions
            .range::<str, _>((from, Bound::Unbounded))
            .enumerate()
        {
            if n == max_sessions || positions.len() >= max_rows {
                break;
            }
            positions.extend(rows.iter().map(|(p, _)| *p));
            last = Some(session.clone());
        }
        let last = last?;
        let rows = positions.len();
        Some(Step {
            positions: json(positions.into_iter()),
            rows,
            last,
        })
    }

    /// A step committed: the sessions after `after` up to `last` are in the
    /// log (the writer appended nothing between the step's planning and its
    /// commit).
    pub(super) fn moved(&self, after: Option<&str>, last: &str) {
        use std::ops::Bound;
        let mut live = self.live();
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let gone: Vec<String> = live
            .sessions
            .range::<str, _>((from, Bound::Included(last)))
            .map(|(s, _)| s.clone())
            .collect();
        for s in gone {
            if let Some(v) = live.sessions.remove(&s) {
                live.rows -= v.len();
            }
        }
    }

    /// The session was deleted (its rows with it).
    pub(super) fn forget(&self, session: &str) {
        let mut live = self.live();
        if let Some(v) = live.sessions.remove(session) {
            live.rows -= v.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_see_positions_and_steps_take_sessions_in_order() {
        let t = TailIndex::default();
        assert_eq!(
            t.seen("a", 0),
            Seen {
                positions: "[]".into(),
                covered: 0
            }
        );
        t.appended(&[("b", 1, 1), ("a", 2, 1), ("b", 3, 2), ("c", 4, 7)]);
        assert_eq!(t.rows(), 4);
        assert_eq!(t.seen("b", 0).positions, "[1,3]");
        assert_eq!(t.seen("b", 1).positions, "[3]");
        assert_eq!(t.seen("b", 0).covered, 4);
        assert_eq!(t.seen_last("b").positions, "[3]");
        assert_eq!(t.seen_last("z").positions, "[]");
        assert_eq!(t.last_seq("c"), Some(7));
        assert_eq!(t.last_seq("z"), None);
        // Two sessions a step, or until two rows.
        let s = t.step(None, 100, 2).unwrap();
        assert_eq!(
            (s.positions.as_str(), s.rows, s.last.as_str()),
            ("[2,1,3]", 3, "b")
        );
        let s = t.step(None, 1, 2).unwrap();
        assert_eq!((s.positions.as_str(), s.last.as_str()), ("[2]", "a"));
        t.moved(None, "b");
        assert_eq!(t.rows(), 1);
        assert_eq!(t.seen("b", 0).positions, "[]");
        // Still covered: a read finds b's rows in the log.
        assert_eq!(t.seen("b", 0).covered, 4);
        let s = t.step(Some("b"), 100, 2).unwrap();
        assert_eq!((s.positions.as_str(), s.last.as_str()), ("[4]", "c"));
        assert!(t.step(Some("c"), 100, 2).is_none());
        t.forget("c");
        assert_eq!(t.rows(), 0);
        t.reload(vec![(9, "x".into(), 2), (8, "x".into(), 1)], 12);
        assert_eq!(t.seen("x", 0).positions, "[8,9]");
        assert_eq!(t.seen("x", 0).covered, 12);
        assert_eq!(t.rows(), 2);
    }
}
