//! Launcher threads parked in fresh call cgroups (cgroup v1), so that a
//! call's first process is born in its cgroup instead of moving into it.
//!
//! Joining a cgroup is a migration, and a migration takes the kernel's
//! `cgroup_threadgroup_rwsem` for writing, which first waits for an RCU grace
//! period: several ms per call on a busy machine. A fork never migrates: the
//! child starts in the cgroups of the forking *thread*, and on cgroup v1 each
//! thread has its own. So a launcher thread moves itself into a fresh call
//! cgroup ahead of time, off the call path, and waits; a call takes it and
//! has it run the spawn; then the thread exits (an exit is not a migration).
//! Every take starts a replacement. When the pool is empty, or a launcher
//! could not be parked, the call's child joins its cgroup itself as before.
//!
//! While parked, the launcher counts in its cgroup's `pids.max`, which is
//! the call's limit + 1 until the spawn is done; the launcher lowers it to
//! the call's limit before it exits, so the call never gets more.

use crate::cgroup::{CallCgroup, CgroupBase};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

/// Work for a launcher: runs once on its thread, inside its cgroup.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A launcher only forks (std's spawn, tokio's registration): a small stack is plenty.
const LAUNCHER_STACK_BYTES: usize = 512 << 10;
/// After this many launchers in a row fail to park (no permission, no
/// memory), the pool stops starting them and calls take the slow path.
const MAX_FAILURES_IN_A_ROW: u32 = 8;
/// How long shutdown waits for an ended launcher to leave its cgroup before
/// leaving the removal to [`CallCgroup`]'s drop (which keeps trying).
const REMOVE_PATIENCE: Duration = Duration::from_millis(500);

/// Parked launchers of one [`crate::Sandbox`]. Dropping it ends them and
/// removes their cgroups.
pub(crate) struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    base: CgroupBase,
    /// The call's process limit.
    max: u64,
    /// Launchers to keep parked (or on their way).
    size: usize,
    state: Mutex<State>,
    /// A launcher parked or gave up.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    parked: VecDeque<Parked>,
    /// Started, not yet parked or failed.
    starting: usize,
    /// Threads not yet taken by a call, by id.
    threads: HashMap<u64, JoinHandle<()>>,
    next_id: u64,
    failures_in_a_row: u32,
    closed: bool,
}

struct Parked {
    id: u64,
    cgroup: CallCgroup,
    jobs: mpsc::Sender<Job>,
}

/// A launcher taken for one call: runs at most one job, then exits.
pub(crate) struct Launcher {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Launcher {
    /// Not used yet.
    pub(crate) fn ready(&self) -> bool {
        self.jobs.is_some()
    }

    /// Hands `job` to the thread; gives it back if the thread is gone.
    pub(crate) fn run(&mut self, job: Job) -> Result<(), Job> {
        match self.jobs.take() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Lets the thread exit without a job (the call did not use it).
    pub(crate) fn release(&mut self) {
        self.jobs = None;
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.release();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Pool {
    /// Starts `size` launchers for calls limited to `max` processes.
    pub(crate) fn new(base: CgroupBase, max: u64, size: usize) -> Pool {
        let shared = Arc::new(Shared {
            base,
            max,
            size,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        refill(&shared, &mut shared.lock());
        Pool { shared }
    }

    /// A parked launcher and the cgroup it sits in, if one is ready; starts
    /// a replacement either way.
    pub(crate) fn take(&self) -> Option<(CallCgroup, Launcher)> {
        let mut st = self.shared.lock();
        let got = st.parked.pop_front().map(|p| {
            let thread = st.threads.remove(&p.id);
            (
                p.cgroup,
                Launcher {
                    jobs: Some(p.jobs),
                    thread,
                },
            )
        });
        refill(&self.shared, &mut st);
        got
    }

    /// Launchers parked now.
    pub(crate) fn parked(&self) -> usize {
        self.shared.lock().parked.len()
    }

    /// Waits until `size` launchers are parked or none is on its way.
    pub(crate) fn wait_filled(&self, timeout: Duration) -> usize {
        let st = self.shared.lock();
        let (st, _) = self
            .shared
            .changed
            .wait_timeout_while(st, timeout, |st| {
                st.parked.len() < self.shared.size && st.starting > 0
            })
            .unwrap_or_else(|e| e.into_inner());
        st.parked.len()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the state consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn refill(shared: &Arc<Shared>, st: &mut State) {
    while !st.closed
        && st.failures_in_a_row < MAX_FAILURES_IN_A_ROW
        && st.parked.len() + st.starting < shared.size
    {
        let id = st.next_id;
        st.next_id += 1;
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("sandbox-launcher".into())
            .stack_size(LAUNCHER_STACK_BYTES)
            .spawn(move || launcher_main(s, id));
        match spawned {
            Ok(t) => {
                st.starting += 1;
                st.threads.insert(id, t);
            }
            Err(e) => {
                st.failures_in_a_row += 1;
                tracing::warn!(error = %e, "cannot start a sandbox launcher thread");
                break;
            }
        }
    }
}

/// A launcher's life: into a fresh cgroup (the slow migration, off the call
/// path), park, run at most one job, lower the limit to the call's, exit.
fn launcher_main(shared: Arc<Shared>, id: u64) {
    let moved = shared
        .base
        .create(shared.max.saturating_add(1))
        .and_then(|cg| {
            // On failure the empty cgroup is removed as `cg` drops.
            cg.move_this_thread_in()?;
            Ok(cg)
        });
    let (tx, rx) = mpsc::channel::<Job>();
    let pids_max: PathBuf;
    {
        let mut st = shared.lock();
        st.starting -= 1;
        match moved {
            Ok(cgroup) => {
                st.failures_in_a_row = 0;
                pids_max = cgroup.dir().join("pids.max");
                st.parked.push_back(Parked {
                    id,
                    cgroup,
                    jobs: tx,
                });
            }
            Err(e) => {
                st.failures_in_a_row += 1;
                if st.failures_in_a_row == MAX_FAILURES_IN_A_ROW {
                    tracing::warn!(dir = %shared.base.dir().display(), error = %e,
                        "sandbox launchers cannot be parked in call cgroups: each call's process joins its cgroup itself (slower)");
                }
                // Nobody will join this thread: let it go.
                drop(st.threads.remove(&id));
                shared.changed.notify_all();
                return;
            }
        }
        shared.changed.notify_all();
    }
    if let Ok(job) = rx.recv() {
        // A panic must not skip the limit below; the job reports its own result.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
    // Still inside, so the call's processes have never exceeded `max`.
    if let Err(e) = std::fs::write(&pids_max, shared.max.to_string()) {
        tracing::warn!(file = %pids_max.display(), error = %e, "cannot lower a call cgroup's pids.max after its launcher leaves: the call may start one process more");
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let (parked, mut threads) = {
            let mut st = self.shared.lock();
            st.closed = true;
            // Launchers on their way park shortly (or fail): wait for them.
            while st.starting > 0 {
                st = self
                    .shared
                    .changed
                    .wait(st)
                    .unwrap_or_else(|e| e.into_inner());
            }
            (
                std::mem::take(&mut st.parked),
                std::mem::take(&mut st.threads),
            )
        };
        let mut ending = Vec::new();
        for p in parked {
            // Closing the channel ends the thread; it leaves its cgroup by exiting.
            drop(p.jobs);
            ending.push((p.cgroup, threads.remove(&p.id)));
        }
        for (cgroup, thread) in ending {
            if let Some(t) = thread {
                let _ = t.join();
            }
            // Drop keeps trying in the background if this gives up.
            cgroup.remove_within(REMOVE_PATIENCE);
        }
    }
}
