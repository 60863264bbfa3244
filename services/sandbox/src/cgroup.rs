//! A pids cgroup per call: the process limit that holds for root too
//! (the kernel never applies RLIMIT_NPROC to uid 0), and a way to end every
//! process a call started, even one that left its process group.

use crate::config::ProcessCgroup;
use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How old an empty call cgroup must be before a new instance removes it.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Which cgroup interface a directory speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// A cgroup v1 `pids` hierarchy.
    V1,
    /// The unified hierarchy.
    V2,
}

/// The directory under which per-call cgroups are made.
#[derive(Clone, Debug)]
pub struct CgroupBase {
    dir: PathBuf,
    version: Version,
}

/// This process's path in the hierarchy named `controller` ("" for v2), from /proc/self/cgroup.
fn own_path(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        hit.then(|| PathBuf::from(path.trim_start_matches('/')))
    })
}

fn writable_dir(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn enable_pids_v2(dir: &Path) -> bool {
    let ctl = dir.join("cgroup.subtree_control");
    let has = |p: &Path| {
        std::fs::read_to_string(p)
            .map(|s| s.split_whitespace().any(|c| c == "pids"))
            .unwrap_or(false)
    };
    has(&ctl) || (std::fs::write(&ctl, "+pids").is_ok() && has(&ctl))
}

impl CgroupBase {
    /// Finds (or makes) the base for `setting`; None when there is no usable pids cgroup.
    pub fn detect(setting: &ProcessCgroup) -> Option<CgroupBase> {
        let base = match setting {
            ProcessCgroup::Off => return None,
            ProcessCgroup::Dir(d) => {
                let version = if d.join("cgroup.procs").exists() && d.join("pids.max").exists()
                    || d.join("cgroup.controllers").exists()
                {
                    if d.join("cgroup.controllers").exists() {
                        Version::V2
                    } else {
                        Version::V1
                    }
                } else {
                    tracing::warn!(dir = %d.display(), "sandbox.process_cgroup is not a cgroup directory; process limits fall back to RLIMIT_NPROC");
                    return None;
                };
                CgroupBase {
                    dir: d.clone(),
                    version,
                }
            }
            ProcessCgroup::Auto => {
                let v2_root = Path::new("/sys/fs/cgroup");
                let v1_root = Path::new("/sys/fs/cgroup/pids");
                if v2_root.join("cgroup.controllers").exists() {
                    let own = v2_root.join(own_path("")?);
                    CgroupBase {
                        dir: own.join("omicos-sandbox"),
                        version: Version::V2,
                    }
                } else if v1_root.join("cgroup.procs").exists() {
                    let own = v1_root.join(own_path("pids")?);
                    CgroupBase {
                        dir: own.join("omicos-sandbox"),
                        version: Version::V1,
                    }
                } else {
                    return None;
                }
            }
        };
        if !base.dir.exists() {
            let parent = base.dir.parent()?;
            if !writable_dir(parent) || std::fs::create_dir(&base.dir).is_err() {
                return None;
            }
        }
        if base.version == Version::V2 && !enable_pids_v2(&base.dir) {
            return None;
        }
        if !writable_dir(&base.dir) {
            return None;
        }
        base.sweep_stale(STALE_AFTER);
        Some(base)
    }

    /// Removes the call cgroups a process killed without cleanup left behind
    /// (SIGKILL, OOM): empty ones older than `age`. A cgroup that still holds
    /// a process refuses the rmdir (EBUSY) and is kept; the age spares one
    /// another live instance made an instant ago for a child about to join.
    pub fn sweep_stale(&self, age: std::time::Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let path = e.path();
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a >= age);
            let ours = e.file_name().to_str().is_some_and(|n| n.starts_with("c-"));
            if ours && old && std::fs::remove_dir(&path).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, dir = %self.dir.display(), "removed call cgroups left by killed processes");
        }
        removed
    }

    /// The base directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Which interface the base speaks.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Makes an empty cgroup for one call with `pids.max = max`.
    pub fn create(&self, max: u64) -> io::Result<CallCgroup> {
        let dir = self
            .dir
            .join(format!("c-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir)?;
        let call = CallCgroup {
            dir,
            version: self.version,
        };
        call.set_max(max)?;
        Ok(call)
    }

    /// Makes a cgroup for one call with `pids.max = max` and opens its
    /// `cgroup.procs` for the child to join (writing "0" moves the writer).
    pub fn create_call(&self, max: u64) -> io::Result<(CallCgroup, OwnedFd)> {
        let call = self.create(max)?;
        let procs = call.open_procs()?;
        Ok((call, procs))
    }
}

/// One call's cgroup. Dropping it kills whatever is still inside and removes it.
#[derive(Debug)]
pub struct CallCgroup {
    dir: PathBuf,
    version: Version,
}

impl CallCgroup {
    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Processes and threads in the cgroup now.
    pub fn current(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("pids.current"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kills every process in the cgroup (never this one: on cgroup v1 a
    /// launcher thread of ours may still be inside).
    pub fn kill_all(&self) {
        kill_all(&self.dir, self.version);
    }

    /// Sets `pids.max`.
    pub fn set_max(&self, max: u64) -> io::Result<()> {
        std::fs::write(self.dir.join("pids.max"), max.to_string())
    }

    /// Opens `cgroup.procs` for writing (a child writes "0" to join).
    pub fn open_procs(&self) -> io::Result<OwnedFd> {
        let procs = CString::new(self.dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: open(2) on a NUL-terminated path; the fd is owned below.
        let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Moves the calling thread, and only it, into the cgroup (cgroup v1:
    /// membership is per thread there). A process it forks is born inside.
    pub fn move_this_thread_in(&self) -> io::Result<()> {
        if self.version != Version::V1 {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        // "0" in `tasks` is the writing thread.
        std::fs::write(self.dir.join("tasks"), "0")
    }

    /// Removes the cgroup, waiting up to `patience` for exiting tasks to
    /// leave; false when it is still there (Drop then keeps trying).
    pub fn remove_within(&self, patience: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            if try_remove(&self.dir) {
                return true;
            }
            if start.elapsed() >= patience {
                return false;
            }
            kill_all(&self.dir, self.version);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn kill_all(dir: &Path, version: Version) {
    if version == Version::V2
        && std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"))
            .is_ok()
    {
        return;
    }
    // v1 has no cgroup.kill: kill until empty (pids.max bounds the population).
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for _ in 0..64 {
        // v1 lists a process when any of its threads is inside: ours may be.
        let pids: Vec<i32> = pids(dir).into_iter().filter(|&p| p != me).collect();
        if pids.is_empty() {
            return;
        }
        for p in pids {
            // SAFETY: kill(2) on a pid read from our own cgroup.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

fn try_remove(dir: &Path) -> bool {
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

impl Drop for CallCgroup {
    fn drop(&mut self) {
        if try_remove(&self.dir) {
            return;
        }
        kill_all(&self.dir, self.version);
        if try_remove(&self.dir) {
            return;
        }
        // Killed processes take a moment to leave; do not hold the caller up.
        let (dir, version) = (std::mem::take(&mut self.dir), self.version);
        std::thread::spawn(move || {
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(10));
                if try_remove(&dir) {
                    return;
                }
                kill_all(&dir, version);
            }
            tracing::warn!(dir = %dir.display(), "a sandbox cgroup could not be removed");
        });
    }
}
