//! The disk bound of a session (`session_limits.workspace_bytes` and
//! `min_free_bytes`): no filesystem here offers a quota a box could be given
//! (project quotas need XFS or ext4 mounted with them), so a watchdog measures
//! instead. While a box has calls running, every [`CHECK_EVERY`] it reads the
//! free space of the workspace's filesystem (statvfs, cheap) and, at most
//! every [`MEASURE_EVERY`], what the workspace holds (a walk summing the
//! blocks each file takes, hard links once). A call is stopped only while the
//! disk use *grows* past a bound: over it, a call that deletes files (the way
//! back under) runs. Each process is also held to `rlimits.file_size_bytes`.
//! The bound is approximate by what a box writes in one check interval.
//!
//! The bound is a write budget for the session's code, so omicos's own state
//! under `<workspace>/.omicos/` ([`OWN_STATE`]: the stores, trajectories, the
//! token, kernels' markers, other tenants' workspaces) is not counted, as
//! long as boxes cannot write it ([`DiskMeasure`]). What is written there on
//! the session's behalf (kernel and image outputs, spooled tool results,
//! plans, task lists, `kernel_install`'s packages) counts.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the free space is read while calls run.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How often a workspace is walked while calls run.
const MEASURE_EVERY: Duration = Duration::from_secs(1);
/// A walk stops counting past this many entries (the bound then holds on
/// what was counted, which is a lower bound of the real use).
const MAX_ENTRIES: usize = 2_000_000;

/// omicos's own state in a workspace, relative to its `.omicos/`
/// ([`crate::plan::STATE_DIR`]): written by omicos for itself, never by a
/// session's code, and growing with use, not with what the agent writes.
pub const OWN_STATE: &[&str] = &[
    // The conversation store (SQLite in WAL mode) and the memory store.
    "sessions.db",
    "sessions.db-wal",
    "sessions.db-shm",
    "sessions.db-journal",
    "memory.db",
    "memory.db-wal",
    "memory.db-shm",
    "memory.db-journal",
    // The orchestrator's record of each session's turns.
    "trajectories",
    // The workspace's token, kernels' markers and the chosen interpreter.
    "token",
    "kernels",
    ".kernel_choice",
    // `omicos up`'s offline script, and the operator's agent and skill files.
    "offline-replay.yaml",
    "agents",
    "skills",
    // Other tenants' workspaces: each is measured as its own workspace.
    "tenants",
];

/// How a workspace's disk use is measured against its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskMeasure {
    /// Every file under the workspace: boxes can write `.omicos/` (no
    /// namespaces, so no view that hides it), so none of it may be left out.
    Everything,
    /// Every file but omicos's own state ([`OWN_STATE`]), which boxes never
    /// see (their view hides `.omicos/`).
    WithoutOwnState,
}

impl DiskMeasure {
    /// The paths this measure leaves out of `workspace`.
    pub fn excluded(self, workspace: &Path) -> Vec<PathBuf> {
        match self {
            Self::Everything => vec![],
            Self::WithoutOwnState => {
                let state = workspace.join(crate::plan::STATE_DIR);
                OWN_STATE.iter().map(|p| state.join(p)).collect()
            }
        }
    }

    /// Bytes `workspace` holds by this measure ([`usage_excluding`]).
    pub fn usage(self, workspace: &Path) -> u64 {
        usage_excluding(workspace, &self.excluded(workspace))
    }
}

/// The bounds, from the config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub workspace_bytes: Option<u64>,
    pub min_free_bytes: Option<u64>,
    pub measure: DiskMeasure,
}

/// What was last seen of each workspace being written.
#[derive(Default)]
pub(crate) struct Watch {
    seen: HashMap<PathBuf, Seen>,
}

struct Seen {
    used: u64,
    measured: Instant,
    free: u64,
}

impl Watch {
    /// No call runs: the next one starts from fresh figures.
    pub fn forget_all(&mut self) {
        self.seen.clear();
    }

    /// Checks `workspace`; a note for the model when a bound was passed by
    /// growth since the last check.
    pub fn check(&mut self, workspace: &Path, limits: Limits) -> Option<String> {
        let free = limits.min_free_bytes.and_then(|_| free_bytes(workspace));
        let prev = self.seen.get(workspace);
        let measure = limits.workspace_bytes.is_some()
            && prev.is_none_or(|p| p.measured.elapsed() >= MEASURE_EVERY);
        let used = if measure {
            limits.measure.usage(workspace)
        } else {
            prev.map(|p| p.used).unwrap_or(0)
        };
        let mut note = None;
        if let (Some(min), Some(free)) = (limits.min_free_bytes, free)
            && free < min
            && prev.is_some_and(|p| free < p.free)
        {
            note = Some(format!(
                "the call was stopped: the workspace's filesystem has {} MiB free, below the \
                 sandbox's floor of {} MiB (sandbox.session_limits.min_free_bytes). Nothing else of \
                 the session was lost; delete files you no longer need before writing more",
                free >> 20,
                min >> 20
            ));
        }
        if let Some(max) = limits.workspace_bytes
            && measure
            && used > max
            && prev.is_some_and(|p| used > p.used)
        {
            note = Some(format!(
                "the call was stopped: the workspace holds {} MiB, past its bound of {} MiB \
                 (sandbox.session_limits.workspace_bytes). Nothing else of the session was lost; \
                 delete files you no longer need (a call that deletes runs) before writing more",
                used >> 20,
                max >> 20
            ));
        }
        let measured = if measure {
            Instant::now()
        } else {
            prev.map(|p| p.measured).unwrap_or_else(Instant::now)
        };
        self.seen.insert(
            workspace.to_path_buf(),
            Seen {
                used,
                measured,
                free: free.unwrap_or(u64::MAX),
            },
        );
        note
    }
}

/// Bytes free to an unprivileged writer on the filesystem of `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

/// Bytes the files under `root` take on disk (allocated blocks: a sparse
/// file counts what it holds), hard links once, symlinks not followed.
pub fn usage(root: &Path) -> u64 {
    usage_excluding(root, &[])
}

/// [`usage`] without the entries at `excluded` (each `root` joined to a
/// relative path) and what is under them. An entry is left out by where it
/// is, not by its name or what it points to: a symlink there is not
/// followed (only the link is left out), a file of the same name elsewhere
/// counts, and a file hard-linked from an excluded path and from a counted
/// one counts once.
pub fn usage_excluding(root: &Path, excluded: &[PathBuf]) -> u64 {
    let mut total = 0u64;
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    for e in walkdir::WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .filter_entry(|e| !excluded.iter().any(|x| x == e.path()))
        .take(MAX_ENTRIES)
        .flatten()
    {
        let Ok(m) = e.metadata() else { continue };
        if m.nlink() > 1 && !m.is_dir() && !linked.insert((m.dev(), m.ino())) {
            continue;
        }
        total = total.saturating_add(m.blocks().saturating_mul(512));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_growth_past_the_bound_trips() {
        let d = tempfile::tempdir().unwrap();
        let limits = Limits {
            workspace_bytes: Some(1 << 20),
            min_free_bytes: None,
            measure: DiskMeasure::WithoutOwnState,
        };
        let mut w = Watch::default();
        assert_eq!(
            w.check(d.path(), limits),
            None,
            "the first look sets the figures"
        );
        std::fs::write(d.path().join("a"), vec![1u8; 3 << 20]).unwrap();
        // Not measured again within MEASURE_EVERY.
        assert_eq!(w.check(d.path(), limits), None);
        w.seen.get_mut(d.path()).unwrap().measured -= MEASURE_EVERY;
        let note = w.check(d.path(), limits).expect("grew past the bound");
        assert!(note.contains("3 MiB, past its bound of 1 MiB"), "{note}");
        // Over the bound but not growing (a call that deletes): no trip.
        w.seen.get_mut(d.path()).unwrap().measured -= MEASURE_EVERY;
        assert_eq!(w.check(d.path(), limits), None);
        std::fs::remove_file(d.path().join("a")).unwrap();
        w.seen.get_mut(d.path()).unwrap().measured -= MEASURE_EVERY;
        assert_eq!(w.check(d.path(), limits), None);
    }

    #[test]
    fn usage_counts_hard_links_once_and_not_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let before = usage(d.path());
        std::fs::write(d.path().join("a"), vec![7u8; 1 << 20]).unwrap();
        std::fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("c")).unwrap();
        let after = usage(d.path());
        assert!(
            after - before >= 1 << 20 && after - before < 2 << 20,
            "{before} {after}"
        );
    }

    #[test]
    fn own_state_is_left_out_by_where_it_is_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path();
        let state = ws.join(".omicos");
        std::fs::create_dir_all(state.join("trajectories/s1")).unwrap();
        std::fs::create_dir_all(state.join("outputs/s1")).unwrap();
        let mib = |n: usize| vec![7u8; n << 20];
        let measure = DiskMeasure::WithoutOwnState;
        let empty = measure.usage(ws);
        // The store, its WAL and a trajectory: not counted.
        std::fs::write(state.join("sessions.db"), mib(4)).unwrap();
        std::fs::write(state.join("sessions.db-wal"), mib(2)).unwrap();
        std::fs::write(state.join("trajectories/s1/t.jsonl"), mib(2)).unwrap();
        let own = measure.usage(ws);
        assert!(own - empty < 64 << 10, "own state counted: {empty} {own}");
        assert!(DiskMeasure::Everything.usage(ws) - empty >= 8 << 20);
        // What is written on the session's behalf counts.
        std::fs::write(state.join("outputs/s1/plot.png"), mib(1)).unwrap();
        let with_output = measure.usage(ws);
        assert!(with_output - own >= 1 << 20, "{own} {with_output}");
        // A file named like the store, anywhere else, counts.
        std::fs::create_dir_all(ws.join("data/.omicos")).unwrap();
        std::fs::write(ws.join("data/.omicos/sessions.db"), mib(1)).unwrap();
        std::fs::write(ws.join("sessions.db"), mib(1)).unwrap();
        let named = measure.usage(ws);
        assert!(named - with_output >= 2 << 20, "{with_output} {named}");
        // A hard link in the workspace to an excluded file counts, once.
        std::fs::hard_link(state.join("sessions.db"), ws.join("store-copy")).unwrap();
        std::fs::hard_link(state.join("sessions.db"), ws.join("store-copy2")).unwrap();
        let linked = measure.usage(ws);
        assert!(
            linked - named >= 4 << 20 && linked - named < 5 << 20,
            "{named} {linked}"
        );
        // A symlink at an excluded path leaves out the link, not its target.
        std::fs::create_dir(ws.join("big")).unwrap();
        std::fs::write(ws.join("big/f"), mib(3)).unwrap();
        let before = measure.usage(ws);
        std::fs::rename(state.join("trajectories"), ws.join("old-trajectories")).unwrap();
        std::os::unix::fs::symlink(ws.join("big"), state.join("trajectories")).unwrap();
        let after = measure.usage(ws);
        assert!(
            after + (64 << 10) >= before + (2 << 20),
            "the moved trajectory counts where it is now: {before} {after}"
        );
        // And a symlink elsewhere named like an excluded path excludes nothing.
        std::fs::create_dir_all(ws.join("x")).unwrap();
        let after = measure.usage(ws);
        std::os::unix::fs::symlink(ws.join("big"), ws.join("x/tenants")).unwrap();
        assert_eq!(measure.usage(ws), after);
        // `.omicos` below another directory is not the state directory.
        let under = ws.join("proj/.omicos/trajectories");
        std::fs::create_dir_all(&under).unwrap();
        std::fs::write(under.join("t"), mib(1)).unwrap();
        assert!(measure.usage(ws) - after >= 1 << 20);
    }

    #[test]
    fn a_falling_floor_trips_only_while_it_falls() {
        let d = tempfile::tempdir().unwrap();
        let limits = Limits {
            workspace_bytes: None,
            min_free_bytes: Some(u64::MAX),
            measure: DiskMeasure::WithoutOwnState,
        };
        let mut w = Watch::default();
        assert_eq!(w.check(d.path(), limits), None);
        // Pretend the last look saw more free space than there is now.
        w.seen.get_mut(d.path()).unwrap().free = u64::MAX;
        let note = w
            .check(d.path(), limits)
            .expect("below the floor and falling");
        assert!(note.contains("min_free_bytes"), "{note}");
    }
}
