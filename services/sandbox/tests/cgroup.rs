//! The per-call pids cgroup as root on cgroup v1, where launcher threads
//! parked in fresh call cgroups fork the calls' processes: each call is born
//! in its own cgroup, the limit holds, and the pool leaves nothing behind.
//! Skipped where the pool is off (not root, no writable v1 `pids` hierarchy).

use omicos_sandbox::{Prepared, Rlimits, Roots, Sandbox, SandboxConfig, SandboxPolicy};
use std::collections::HashSet;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LAUNCHERS: usize = 3;
const MAX: u64 = 64;

struct Fixture {
    ws: tempfile::TempDir,
    _tmp_root: tempfile::TempDir,
    sandbox: Sandbox,
}

/// A sandbox whose pool is full, or None (with a note) where there is no pool.
fn fixture() -> Option<Fixture> {
    let tmp_root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        tmp_root: Some(tmp_root.path().canonicalize().unwrap()),
        rlimits: Rlimits {
            processes: Some(MAX),
            ..Rlimits::default()
        },
        process_cgroup_launchers: LAUNCHERS,
        ..SandboxConfig::default()
    })
    .unwrap();
    let parked = sandbox.wait_for_launchers(Duration::from_secs(20));
    if parked < LAUNCHERS {
        eprintln!(
            "SKIPPED: {parked} launchers parked (not root, or no writable cgroup v1 pids hierarchy)"
        );
        return None;
    }
    Some(Fixture {
        ws: tempfile::tempdir().unwrap(),
        _tmp_root: tmp_root,
        sandbox,
    })
}

impl Fixture {
    fn prepare(&self) -> Prepared {
        let tmp = self.sandbox.session_tmp_dir("cgroup-test").unwrap();
        self.sandbox
            .prepare(
                SandboxPolicy::WorkspaceWrite,
                &Roots::new(self.ws.path()).tmp(tmp),
            )
            .unwrap()
    }
}

/// Threads of this process.
fn our_threads() -> HashSet<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Call cgroups under `base` that hold a thread of this process.
fn cgroups_with_our_threads(base: &Path) -> Vec<PathBuf> {
    let ours = our_threads();
    std::fs::read_dir(base)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("c-"))
        })
        .filter(|d| {
            std::fs::read_to_string(d.join("tasks"))
                .is_ok_and(|t| t.lines().any(|tid| ours.contains(tid.trim())))
        })
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pids-hierarchy path of a process, from the `pids` line of its /proc/<pid>/cgroup text.
fn pids_path(cgroup_file: &str) -> String {
    cgroup_file
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
            ctrl.split(',')
                .any(|c| c == "pids")
                .then(|| path.to_string())
        })
        .expect("a pids line")
}

fn relative(dir: &Path) -> String {
    format!(
        "/{}",
        dir.strip_prefix("/sys/fs/cgroup/pids").unwrap().display()
    )
}

#[test]
fn a_call_from_a_parked_launcher_is_born_in_its_own_limited_cgroup() {
    let Some(f) = fixture() else { return };
    let prepared = f.prepare();
    assert!(prepared.has_launcher(), "{prepared:?}");
    let dir = prepared.cgroup_dir().unwrap().to_path_buf();

    // A fork bomb: the first process reports its cgroup, then multiplies.
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        "cat /proc/self/cgroup; bomb() { bomb | bomb & }; bomb; sleep 3",
    ])
    .current_dir(f.ws.path())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = prepared.spawn_std(&mut cmd).unwrap();
    assert!(!prepared.has_launcher(), "the launcher was used");
    // The launcher lowers the limit to the call's and leaves by exiting.
    wait_until("pids.max back to the call's limit", || {
        std::fs::read_to_string(dir.join("pids.max")).is_ok_and(|m| m.trim() == MAX.to_string())
    });
    wait_until("the launcher thread left the call cgroup", || {
        cgroups_with_our_threads(dir.parent().unwrap())
            .iter()
            .all(|d| d != &dir)
    });
    let started = Instant::now();
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(3) {
        peak = peak.max(prepared.processes_now().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(peak <= MAX, "the bomb reached {peak} processes");
    assert!(peak >= MAX / 2, "the bomb never grew ({peak}): did it run?");
    prepared.kill_all();
    // SAFETY: the group is the child's own.
    unsafe {
        libc::killpg(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(pids_path(&out), relative(&dir), "{out}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("Resource temporarily unavailable"), "{err}");
    drop(prepared);
    wait_until("the call cgroup is removed", || !dir.exists());
    // A replacement was parked meanwhile.
    assert_eq!(
        f.sandbox.wait_for_launchers(Duration::from_secs(20)),
        LAUNCHERS
    );
}

#[tokio::test]
async fn a_tokio_spawn_goes_through_the_launcher_too() {
    let Some(f) = fixture() else { return };
    let prepared = f.prepare();
    assert!(prepared.has_launcher());
    let dir = prepared.cgroup_dir().unwrap().to_path_buf();
    let mut cmd = tokio::process::Command::new("cat");
    cmd.arg("/proc/self/cgroup")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    // Pipes and the reaper belong to this runtime though another thread forked.
    let out = prepared.spawn(&mut cmd).unwrap().wait_with_output().await;
    let out = out.unwrap();
    assert!(out.status.success());
    assert_eq!(
        pids_path(&String::from_utf8_lossy(&out.stdout)),
        relative(&dir)
    );
    drop(prepared);
    wait_until("the call cgroup is removed", || !dir.exists());
}

#[test]
fn apply_to_still_puts_the_call_in_its_cgroup_and_kill_all_spares_the_service() {
    let Some(f) = fixture() else { return };
    let prepared = f.prepare();
    let dir = prepared.cgroup_dir().unwrap().to_path_buf();
    let mut cmd = Command::new("cat");
    cmd.arg("/proc/self/cgroup").current_dir(f.ws.path());
    // The child joins the cgroup itself; the unused launcher is let go.
    prepared.apply_to_std(&mut cmd);
    assert!(!prepared.has_launcher());
    let out = cmd.output().unwrap();
    assert_eq!(
        pids_path(&String::from_utf8_lossy(&out.stdout)),
        relative(&dir)
    );
    // Even if a thread of ours were still inside, kill_all must not signal us.
    prepared.kill_all();
    wait_until("the launcher thread left the call cgroup", || {
        cgroups_with_our_threads(dir.parent().unwrap())
            .iter()
            .all(|d| d != &dir)
    });
    drop(prepared);
    wait_until("the call cgroup is removed", || !dir.exists());
}

#[test]
fn the_pools_cgroups_are_removed_when_the_sandbox_is_dropped() {
    let Some(f) = fixture() else { return };
    let prepared = f.prepare();
    let base = prepared
        .cgroup_dir()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    drop(prepared);
    assert_eq!(
        f.sandbox.wait_for_launchers(Duration::from_secs(20)),
        LAUNCHERS
    );
    let parked = cgroups_with_our_threads(&base);
    assert_eq!(parked.len(), LAUNCHERS, "{parked:?}");
    drop(f);
    for d in &parked {
        assert!(!d.exists(), "{} outlived the sandbox", d.display());
    }
    assert!(cgroups_with_our_threads(&base).is_empty());
}

/// Sets a directory's modification time `ago` in the past.
fn age(dir: &Path, ago: Duration) {
    let then = std::time::SystemTime::now() - ago;
    let secs = then
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: utimensat(2) on a NUL-terminated path with two valid timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [t, t].as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
}

/// A process killed with SIGKILL leaves its call cgroups behind: the next
/// sandbox on the host removes the empty ones older than a minute, and keeps
/// a fresh one (another instance's, about to be joined) and a busy one.
#[test]
fn a_new_sandbox_removes_the_empty_cgroups_killed_processes_left() {
    let Some(f) = fixture() else { return };
    let base = f
        .prepare()
        .cgroup_dir()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let stale = base.join("c-stale-left-by-a-killed-process");
    let fresh = base.join("c-fresh-made-an-instant-ago");
    let busy = base.join("c-stale-but-still-running");
    for d in [&stale, &fresh, &busy] {
        std::fs::create_dir(d).unwrap();
    }
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(busy.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    age(&stale, Duration::from_secs(120));
    age(&busy, Duration::from_secs(120));
    // A new sandbox (a restarted service) sweeps at start.
    let again = Sandbox::new(SandboxConfig::default()).unwrap();
    let (gone_stale, kept_fresh, kept_busy) = (!stale.exists(), fresh.exists(), busy.exists());
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    for d in [&fresh, &busy] {
        let _ = std::fs::remove_dir(d);
    }
    drop(again);
    assert!(gone_stale, "the stale empty cgroup is still there");
    assert!(kept_fresh, "a fresh empty cgroup was removed");
    assert!(kept_busy, "a cgroup with a process in it was removed");
}
