//! The box's init serving the service: one reaper process per call.
//!
//! For each [`ToBox::Spawn`] the init forks a reaper, a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`) that forks the call's process. Whatever the
//! call starts, even a double fork or `setsid` that leaves its process group,
//! stays below the reaper: an orphan is reparented to it, not to init. On
//! [`ToBox::End`] the reaper kills its children until it has none, so nothing
//! a call started outlives it, without a cgroup per call (joining a cgroup
//! costs an RCU grace period; a fork costs none).
//!
//! The call's process: a new session (no controlling terminal), its stdio,
//! its working directory, its rlimits, the policy's Landlock domain (whose
//! scopes keep it from signalling the reaper or init), then execve with
//! exactly the environment it was given.

use super::{StageError, check, send};
use crate::wire::{FromBox, LandlockSpec, ToBox};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a reaper keeps killing before it gives up (a process stuck in
/// uninterruptible sleep dies when it wakes).
const END_PATIENCE: Duration = Duration::from_secs(5);

/// The Landlock rulesets of the two confined policies.
pub(super) struct Rulesets {
    read_only: Option<OwnedFd>,
    write: Option<OwnedFd>,
}

impl Rulesets {
    pub(super) fn build(spec: &LandlockSpec) -> Result<Self, StageError> {
        if !spec.enabled {
            return Ok(Self {
                read_only: None,
                write: None,
            });
        }
        let build = |workspace_writable: bool| {
            crate::filesystem::box_ruleset(spec, workspace_writable)
                .map_err(|e| StageError::new("build the Landlock ruleset", e))
        };
        Ok(Self {
            read_only: Some(build(false)?),
            write: Some(build(true)?),
        })
    }
}

/// Kinds of the reaper's reports (fixed 12-byte records on a pipe: atomic).
const R_STARTED: i32 = 1;
const R_FAILED: i32 = 2;
const R_EXITED: i32 = 3;
const R_ENDED: i32 = 4;

/// Stages a call's start can fail at (the reaper reports the number).
const STAGES: [&str; 6] = ["stdio", "chdir", "rlimit", "landlock", "exec", "fork"];

struct Call {
    reaper: libc::pid_t,
    report: OwnedFd,
    end: Option<OwnedFd>,
    child: Option<libc::pid_t>,
    exited: bool,
    ended: bool,
}

fn signalfd_for(signals: &[libc::c_int]) -> Result<OwnedFd, StageError> {
    // SAFETY: sigset manipulation on a zeroed set, then signalfd(2).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        check(fd as libc::c_long, || "signalfd".into())?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn drain(fd: RawFd) {
    let mut buf = [0u8; 512];
    // SAFETY: non-blocking read(2) into a local buffer.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

fn write_record(fd: RawFd, kind: i32, a: i32, b: i32) {
    let mut rec = [0u8; 12];
    rec[..4].copy_from_slice(&kind.to_le_bytes());
    rec[4..8].copy_from_slice(&a.to_le_bytes());
    rec[8..].copy_from_slice(&b.to_le_bytes());
    // SAFETY: write(2) of a local buffer (≤ PIPE_BUF: atomic).
    unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
}

/// Serves until the service closes the socket or `Z0` dies.
pub(super) fn serve(
    ctl: &OwnedFd,
    lifeline: OwnedFd,
    rulesets: Rulesets,
) -> Result<i32, StageError> {
    let sigchld = signalfd_for(&[libc::SIGCHLD])?;
    let mut reader = crate::wire::FrameReader::default();
    let mut calls: HashMap<u64, Call> = HashMap::new();
    loop {
        let mut fds = vec![
            libc::pollfd {
                fd: ctl.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigchld.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: lifeline.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ids: Vec<u64> = calls.keys().copied().collect();
        for id in &ids {
            fds.push(libc::pollfd {
                fd: calls[id].report.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: poll(2) on a live array.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(StageError::os("poll"));
        }
        if fds[2].revents != 0 {
            // Z0 is gone: so is the service's hold on this box.
            return Ok(0);
        }
        for (i, id) in ids.iter().enumerate() {
            if fds[3 + i].revents != 0 {
                read_reports(ctl, *id, &mut calls);
            }
        }
        if fds[1].revents != 0 {
            drain(sigchld.as_raw_fd());
            reap(ctl, &mut calls);
        }
        if fds[0].revents != 0 {
            match reader.read_from(ctl.as_fd()) {
                Ok(crate::wire::Read::Eof) | Err(_) => return Ok(0),
                Ok(_) => {}
            }
            loop {
                let frame = match reader.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(_) => return Ok(0),
                };
                let Ok(msg) = serde_json::from_slice::<ToBox>(&frame) else {
                    continue;
                };
                handle(
                    ctl,
                    &lifeline,
                    &sigchld,
                    msg,
                    &mut reader,
                    &mut calls,
                    &rulesets,
                );
            }
        }
    }
}

fn read_reports(ctl: &OwnedFd, id: u64, calls: &mut HashMap<u64, Call>) {
    let Some(call) = calls.get_mut(&id) else {
        return;
    };
    let mut rec = [0u8; 12];
    loop {
        // SAFETY: read(2) of one record from a non-blocking pipe.
        let n = unsafe { libc::read(call.report.as_raw_fd(), rec.as_mut_ptr().cast(), 12) };
        if n != 12 {
            return;
        }
        let kind = i32::from_le_bytes(rec[..4].try_into().expect("4 bytes"));
        let a = i32::from_le_bytes(rec[4..8].try_into().expect("4 bytes"));
        let b = i32::from_le_bytes(rec[8..].try_into().expect("4 bytes"));
        match kind {
            R_STARTED => {
                call.child = Some(a);
                send(ctl.as_fd(), &FromBox::Started { id, pid: a });
            }
            R_FAILED => {
                call.exited = true;
                let stage = STAGES.get(a as usize).copied().unwrap_or("start");
                send(
                    ctl.as_fd(),
                    &FromBox::SpawnFailed {
                        id,
                        stage: stage.into(),
                        errno: b,
                    },
                );
            }
            R_EXITED => {
                call.exited = true;
                send(ctl.as_fd(), &FromBox::Exited { id, status: a });
            }
            R_ENDED => {
                call.ended = true;
                send(ctl.as_fd(), &FromBox::Ended { id });
            }
            _ => {}
        }
    }
}

/// Reaps reapers (and orphans reparented to init) and closes their calls.
fn reap(ctl: &OwnedFd, calls: &mut HashMap<u64, Call>) {
    loop {
        let mut st = 0;
        // SAFETY: waitpid(2) without blocking.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        let Some(id) = calls
            .iter()
            .find(|(_, c)| c.reaper == pid)
            .map(|(id, _)| *id)
        else {
            continue;
        };
        // Its last reports may still be in the pipe.
        read_reports(ctl, id, calls);
        if let Some(call) = calls.remove(&id) {
            if !call.exited {
                // The reaper died before its process ended (killed): say so.
                send(
                    ctl.as_fd(),
                    &FromBox::Exited {
                        id,
                        status: libc::SIGKILL,
                    },
                );
            }
            if !call.ended {
                send(ctl.as_fd(), &FromBox::Ended { id });
            }
        }
    }
}

fn handle(
    ctl: &OwnedFd,
    lifeline: &OwnedFd,
    sigchld: &OwnedFd,
    msg: ToBox,
    reader: &mut crate::wire::FrameReader,
    calls: &mut HashMap<u64, Call>,
    rulesets: &Rulesets,
) {
    match msg {
        ToBox::Setup(_) => {}
        ToBox::Spawn {
            id,
            argv,
            env,
            cwd,
            read_only,
            stdio,
            rlimits,
        } => {
            let mut given: [Option<OwnedFd>; 3] = [None, None, None];
            for (i, present) in stdio.iter().enumerate() {
                if *present {
                    given[i] = reader.take_fd();
                }
            }
            if calls.contains_key(&id) || argv.is_empty() {
                send(
                    ctl.as_fd(),
                    &FromBox::SpawnFailed {
                        id,
                        stage: "request".into(),
                        errno: libc::EINVAL,
                    },
                );
                return;
            }
            let ruleset = if read_only {
                rulesets.read_only.as_ref()
            } else {
                rulesets.write.as_ref()
            };
            let request = Request {
                argv,
                env,
                cwd,
                rlimits: rlimits.iter().map(|r| (r.resource, r.value)).collect(),
                ruleset: ruleset.map(AsRawFd::as_raw_fd),
            };
            // Everything of init's that the reaper must not keep.
            let mut theirs: Vec<RawFd> =
                vec![ctl.as_raw_fd(), lifeline.as_raw_fd(), sigchld.as_raw_fd()];
            for c in calls.values() {
                theirs.push(c.report.as_raw_fd());
                theirs.extend(c.end.as_ref().map(AsRawFd::as_raw_fd));
            }
            match start_reaper(&request, given, &theirs) {
                Ok(call) => {
                    calls.insert(id, call);
                }
                Err(errno) => send(
                    ctl.as_fd(),
                    &FromBox::SpawnFailed {
                        id,
                        stage: "fork".into(),
                        errno,
                    },
                ),
            }
        }
        ToBox::Signal { id, signal, group } => {
            if let Some(pid) = calls.get(&id).and_then(|c| c.child) {
                let target = if group { -pid } else { pid };
                // SAFETY: kill(2) of the call's own process (group).
                unsafe { libc::kill(target, signal) };
            }
        }
        ToBox::End { id } => match calls.get_mut(&id) {
            // Closing the pipe wakes the reaper, which kills and reports Ended.
            Some(c) => drop(c.end.take()),
            None => send(ctl.as_fd(), &FromBox::Ended { id }),
        },
    }
}

struct Request {
    argv: Vec<String>,
    env: Vec<String>,
    cwd: std::path::PathBuf,
    rlimits: Vec<(i32, u64)>,
    ruleset: Option<RawFd>,
}

/// Finds `program` on the environment's PATH (a name with '/' is used as is).
fn resolve(program: &str, env: &[String]) -> CString {
    if program.contains('/') {
        return CString::new(program).unwrap_or_default();
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(program);
        if let Ok(c) = CString::new(candidate.as_os_str().as_encoded_bytes()) {
            // SAFETY: access(2) on a NUL-terminated path.
            if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 && candidate.is_file() {
                return c;
            }
        }
    }
    CString::new(program).unwrap_or_default()
}

fn cstrings(v: &[String]) -> Vec<CString> {
    v.iter()
        .map(|s| CString::new(s.replace('\0', "")).unwrap_or_default())
        .collect()
}

/// Forks the call's reaper; returns init's side of it.
fn start_reaper(req: &Request, stdio: [Option<OwnedFd>; 3], theirs: &[RawFd]) -> Result<Call, i32> {
    let errno = |_| {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let (report_r, report_w) = super::pipe().map_err(errno)?;
    let (end_r, end_w) = super::pipe().map_err(errno)?;
    // Everything the call's process needs, allocated before the fork.
    let program = resolve(&req.argv[0], &req.env);
    let argv = cstrings(&req.argv);
    let envp = cstrings(&req.env);
    let cwd = CString::new(req.cwd.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: fork in a single-threaded process (init never starts threads).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    if pid == 0 {
        for fd in theirs {
            // SAFETY: closing init's descriptors in the reaper.
            unsafe { libc::close(*fd) };
        }
        drop(report_r);
        drop(end_w);
        let code = reaper(
            report_w.as_raw_fd(),
            end_r.as_raw_fd(),
            stdio,
            &program,
            &argv,
            &envp,
            &cwd,
            req,
        );
        // SAFETY: ends the reaper.
        unsafe { libc::_exit(code) }
    }
    drop(report_w);
    drop(end_r);
    drop(stdio);
    // SAFETY: fcntl(2) on our own pipe end.
    unsafe {
        let fl = libc::fcntl(report_r.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(report_r.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok(Call {
        reaper: pid,
        report: report_r,
        end: Some(end_w),
        child: None,
        exited: false,
        ended: false,
    })
}

/// The reaper: starts the call's process, reports, and on End kills every
/// process below it.
#[allow(clippy::too_many_arguments)]
fn reaper(
    report: RawFd,
    end: RawFd,
    stdio: [Option<OwnedFd>; 3],
    program: &CString,
    argv: &[CString],
    envp: &[CString],
    cwd: &CString,
    req: &Request,
) -> i32 {
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let Ok(sigchld) = signalfd_for(&[libc::SIGCHLD]) else {
        write_record(report, R_FAILED, 5, libc::EIO);
        return 1;
    };
    let Ok((err_r, err_w)) = super::pipe() else {
        write_record(report, R_FAILED, 5, libc::EIO);
        return 1;
    };
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|c| c.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: fork in the single-threaded reaper.
    let child = unsafe { libc::fork() };
    if child < 0 {
        write_record(
            report,
            R_FAILED,
            5,
            io::Error::last_os_error().raw_os_error().unwrap_or(0),
        );
        return 1;
    }
    if child == 0 {
        let fail = |stage: i32| -> ! {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let mut rec = [0u8; 8];
            rec[..4].copy_from_slice(&stage.to_le_bytes());
            rec[4..].copy_from_slice(&errno.to_le_bytes());
            // SAFETY: write(2) then _exit(2).
            unsafe {
                libc::write(err_w.as_raw_fd(), rec.as_ptr().cast(), 8);
                libc::_exit(127)
            }
        };
        // SAFETY: the remaining steps are plain syscalls on data prepared above.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::setsid();
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            for (i, fd) in stdio.iter().enumerate() {
                let src = fd.as_ref().map_or(null, AsRawFd::as_raw_fd);
                if src < 0 || libc::dup2(src, i as i32) < 0 {
                    fail(0);
                }
            }
            if libc::chdir(cwd.as_ptr()) != 0 {
                fail(1);
            }
            for (resource, value) in &req.rlimits {
                let lim = libc::rlimit {
                    rlim_cur: *value,
                    rlim_max: *value,
                };
                if libc::setrlimit(*resource as libc::__rlimit_resource_t, &lim) != 0 {
                    fail(2);
                }
            }
            if let Some(fd) = req.ruleset
                && libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0
            {
                fail(3);
            }
            // Every descriptor above stdio closes at exec (the error pipe too).
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                4u32, /* CLOSE_RANGE_CLOEXEC */
            );
            libc::execve(program.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr());
            fail(4);
        }
    }
    drop(stdio);
    drop(err_w);
    let mut rec = [0u8; 8];
    // SAFETY: read(2) of the child's error record (EOF: it exec'd).
    let n = unsafe { libc::read(err_r.as_raw_fd(), rec.as_mut_ptr().cast(), 8) };
    drop(err_r);
    let mut exited = false;
    if n == 8 {
        let stage = i32::from_le_bytes(rec[..4].try_into().expect("4 bytes"));
        let errno = i32::from_le_bytes(rec[4..].try_into().expect("4 bytes"));
        write_record(report, R_FAILED, stage, errno);
        exited = true;
    } else {
        write_record(report, R_STARTED, child, 0);
    }
    let mut ending = false;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sigchld.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: end,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on a live array.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[0].revents != 0 {
            drain(sigchld.as_raw_fd());
            loop {
                let mut st = 0;
                // SAFETY: waitpid(2) without blocking.
                let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                if pid == child && !exited {
                    exited = true;
                    write_record(report, R_EXITED, st, 0);
                }
            }
        }
        if fds[1].revents != 0 {
            ending = true;
        }
        if ending {
            kill_below_me();
            if !exited {
                write_record(report, R_EXITED, libc::SIGKILL, 0);
            }
            write_record(report, R_ENDED, 0, 0);
            return 0;
        }
    }
}

/// This process's children, from `/proc/self/task/<tid>/children` (the
/// reaper is single-threaded, so that is all of them).
fn children() -> Vec<libc::pid_t> {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    std::fs::read_to_string(format!("/proc/self/task/{me}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_else(|_| scan_children(me))
}

/// Without CONFIG_PROC_CHILDREN: every process whose parent is `me`.
fn scan_children(me: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1;
                    after.split_whitespace().nth(1)?.parse::<libc::pid_t>().ok()
                })
                == Some(me)
        })
        .collect()
}

/// Kills children until none is left: a killed process's own children are
/// reparented here and killed in the next round.
fn kill_below_me() {
    let start = Instant::now();
    loop {
        for pid in children() {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        loop {
            let mut st = 0;
            // SAFETY: waitpid(2) without blocking.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if r < 0 {
                // ECHILD: nothing left below.
                return;
            }
            if r == 0 {
                break;
            }
        }
        if start.elapsed() > END_PATIENCE {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
