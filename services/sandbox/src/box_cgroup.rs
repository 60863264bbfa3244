//! A cgroup per box: its memory, processes and CPU bounded together, and a
//! way to end everything in it. cgroup v1 (one directory per controller
//! hierarchy) and v2 (one directory, controllers enabled on the way down).
//!
//! The box's first process joins it once, before exec (a migration, paid
//! once per box, not per call); everything the box starts is born inside.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The controllers a box uses.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The limits of one box.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory (page cache and tmpfs included).
    pub memory_bytes: Option<u64>,
    /// Processes and threads.
    pub processes: Option<u64>,
    /// CPU time per wall second, in thousandths of a CPU.
    pub cpu_millis: Option<u64>,
}

/// Where box cgroups are made: one base directory per controller (v1) or one (v2).
#[derive(Clone, Debug)]
pub struct Base {
    v2: bool,
    /// (controller, directory); for v2 every entry has the same directory.
    dirs: Vec<(&'static str, PathBuf)>,
}

/// This process's path in the v1 hierarchy holding `controller` ("" for v2).
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

fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn enable_v2(dir: &Path, controllers: &[&str]) -> bool {
    let ctl = dir.join("cgroup.subtree_control");
    let has = |c: &str| {
        std::fs::read_to_string(&ctl)
            .map(|s| s.split_whitespace().any(|x| x == c))
            .unwrap_or(false)
    };
    controllers
        .iter()
        .all(|c| has(c) || (std::fs::write(&ctl, format!("+{c}")).is_ok() && has(c)))
}

impl Base {
    /// Finds (or makes) `<own cgroup>/omicos-sandbox/<instance>` in every
    /// controller; None when some controller has no writable hierarchy
    /// (the reason goes to `why`).
    pub fn detect(root: &Path, instance: &str, why: &mut String) -> Option<Base> {
        if root.join("cgroup.controllers").exists() {
            let own = root.join(own_path("")?);
            let top = own.join("omicos-sandbox");
            let dir = top.join(instance);
            let made = std::fs::create_dir_all(&dir).is_ok();
            if !made || !writable(&dir) {
                *why = format!(
                    "{} is not writable (delegate a cgroup to the service)",
                    own.display()
                );
                return None;
            }
            if !(enable_v2(&own, &CONTROLLERS)
                && enable_v2(&top, &CONTROLLERS)
                && enable_v2(&dir, &CONTROLLERS))
            {
                *why = format!(
                    "cannot enable the memory, pids and cpu controllers below {}",
                    own.display()
                );
                let _ = std::fs::remove_dir(&dir);
                return None;
            }
            return Some(Base {
                v2: true,
                dirs: CONTROLLERS.iter().map(|c| (*c, dir.clone())).collect(),
            });
        }
        let mut dirs = Vec::new();
        for c in CONTROLLERS {
            let Some(own) = own_path(c) else {
                *why = format!("no cgroup v1 `{c}` hierarchy is mounted");
                return None;
            };
            // `cpu` may be co-mounted as `cpu,cpuacct`.
            let hier = ["", ",cpuacct"]
                .iter()
                .map(|s| root.join(format!("{c}{s}")))
                .find(|p| p.join("cgroup.procs").exists());
            let Some(hier) = hier else {
                *why = format!("no cgroup v1 `{c}` hierarchy under {}", root.display());
                return None;
            };
            let dir = hier.join(own).join("omicos-sandbox").join(instance);
            if std::fs::create_dir_all(&dir).is_err() || !writable(&dir) {
                *why = format!(
                    "{} is not writable (run as root or delegate the `{c}` cgroup)",
                    dir.display()
                );
                return None;
            }
            dirs.push((c, dir));
        }
        Some(Base { v2: false, dirs })
    }

    /// Makes the cgroup of box `id` with `limits`.
    pub fn create(&self, id: &str, limits: &Limits) -> io::Result<BoxCgroup> {
        let mut made: Vec<(&'static str, PathBuf)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (c, base) in &self.dirs {
            let dir = base.join(id);
            if seen.insert(dir.clone()) {
                std::fs::create_dir_all(&dir)?; // the instance directory too, should a sibling service have swept it empty
            }
            made.push((c, dir));
        }
        let cg = BoxCgroup {
            v2: self.v2,
            dirs: made,
        };
        cg.apply(limits)?;
        Ok(cg)
    }

    /// Removes the directories that instances known to be gone left (a
    /// killed service's; empty ones: a cgroup with a process in it refuses).
    /// Never a live sibling's: its box cgroups are empty between their
    /// creation and the zygote's join, and writing to a removed cgroup's
    /// `cgroup.procs` fails with ENODEV.
    pub fn sweep_gone(&self, gone: &[String]) {
        for (_, base) in &self.dirs {
            let Some(parent) = base.parent() else {
                continue;
            };
            for name in gone {
                let p = parent.join(name);
                if let Ok(children) = std::fs::read_dir(&p) {
                    for c in children.flatten().filter(|c| c.path().is_dir()) {
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
                let _ = std::fs::remove_dir(&p);
            }
        }
    }

    /// The instance's directories (removed when the sandbox is dropped).
    pub fn remove(&self) {
        for (_, d) in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// One box's cgroup; dropping it kills what is left inside and removes it.
#[derive(Debug)]
pub struct BoxCgroup {
    v2: bool,
    dirs: Vec<(&'static str, PathBuf)>,
}

impl BoxCgroup {
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, d)| d.as_path())
    }

    fn apply(&self, l: &Limits) -> io::Result<()> {
        let write = |controller: &str, file: &str, value: String| -> io::Result<()> {
            match self.dir(controller) {
                Some(d) => std::fs::write(d.join(file), value).map_err(|e| {
                    io::Error::new(e.kind(), format!("{}: {e}", d.join(file).display()))
                }),
                None => Ok(()),
            }
        };
        if let Some(m) = l.memory_bytes {
            if self.v2 {
                write("memory", "memory.max", m.to_string())?;
                // No swap: the bound is the bound.
                let _ = write("memory", "memory.swap.max", "0".into());
            } else {
                write("memory", "memory.limit_in_bytes", m.to_string())?;
                let _ = write("memory", "memory.memsw.limit_in_bytes", m.to_string());
            }
        }
        if let Some(p) = l.processes {
            write("pids", "pids.max", p.to_string())?;
        }
        if let Some(c) = l.cpu_millis {
            let period = 100_000u64;
            let quota = (c * period / 1000).max(1000);
            if self.v2 {
                write("cpu", "cpu.max", format!("{quota} {period}"))?;
            } else {
                write("cpu", "cpu.cfs_period_us", period.to_string())?;
                write("cpu", "cpu.cfs_quota_us", quota.to_string())?;
            }
        }
        Ok(())
    }

    /// `cgroup.procs` of every hierarchy, opened for writing: the box's first
    /// process writes "0" to each before exec.
    pub fn open_procs(&self) -> io::Result<Vec<OwnedFd>> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for (_, d) in &self.dirs {
            if !seen.insert(d.clone()) {
                continue;
            }
            let c = CString::new(d.join("cgroup.procs").as_os_str().as_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: open(2) on a NUL-terminated path; the fd is owned below.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: just opened, owned by nobody else.
            out.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Ok(out)
    }

    /// Times the kernel's OOM killer ended a process of the box.
    pub fn oom_kills(&self) -> u64 {
        let Some(d) = self.dir("memory") else {
            return 0;
        };
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(d.join(file))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Memory in use now (bytes).
    pub fn memory_now(&self) -> Option<u64> {
        let d = self.dir("memory")?;
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(d.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes and threads in the box now.
    pub fn processes_now(&self) -> Option<u64> {
        let d = self.dir("pids")?;
        std::fs::read_to_string(d.join("pids.current"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The box's directories (one per hierarchy).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Kills every process inside.
    pub fn kill_all(&self) {
        if self.v2
            && let Some(d) = self.dir("pids")
            && std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.kill"))
                .and_then(|mut f| f.write_all(b"1"))
                .is_ok()
        {
            return;
        }
        // v1 has no cgroup.kill: kill until empty (pids.max bounds the population).
        let Some(d) = self.dir("pids").or_else(|| self.dir("memory")) else {
            return;
        };
        for _ in 0..64 {
            let pids: Vec<i32> = std::fs::read_to_string(d.join("cgroup.procs"))
                .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
                .unwrap_or_default();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                // SAFETY: kill(2) of a process in the box's own cgroup.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn try_remove(&self) -> bool {
        let mut all = true;
        for (_, d) in &self.dirs {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => all = false,
            }
        }
        all
    }
}

impl Drop for BoxCgroup {
    fn drop(&mut self) {
        if self.try_remove() {
            return;
        }
        self.kill_all();
        if self.try_remove() {
            return;
        }
        let mut this = BoxCgroup {
            v2: self.v2,
            dirs: std::mem::take(&mut self.dirs),
        };
        std::thread::spawn(move || {
            for _ in 0..300 {
                std::thread::sleep(Duration::from_millis(10));
                if this.try_remove() {
                    return;
                }
                this.kill_all();
            }
            tracing::warn!(dirs = ?this.dirs(), "a box's cgroup could not be removed");
            // Nothing left to retry: its drop has nothing to do.
            this.dirs.clear();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live sibling instance's empty box cgroup (made, not yet joined) is
    /// never swept: only instances known to be gone are.
    #[test]
    fn only_gone_instances_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let top = root.path().join("omicos-sandbox");
        for d in ["i-me/b-own", "i-live/b-starting", "i-dead/b-left"] {
            std::fs::create_dir_all(top.join(d)).unwrap();
        }
        let base = Base {
            v2: true,
            dirs: vec![("memory", top.join("i-me"))],
        };
        base.sweep_gone(&["i-dead".to_string()]);
        assert!(
            top.join("i-live/b-starting").is_dir(),
            "a live sibling's box was swept"
        );
        assert!(top.join("i-me/b-own").is_dir());
        assert!(!top.join("i-dead").exists(), "a gone instance was left");
    }
}
