//! The box side: a fresh process image of the service's own binary (exec'd
//! with [`ARG0`] as its name, so none of the service's memory, secrets or
//! environment comes along) that builds the box and then starts every
//! process of it.
//!
//! 1. `Z0` reads the [`BoxSpec`] from fd 3 and makes the namespaces: as root,
//!    mount/pid/ipc/uts/cgroup (and net) namespaces directly; otherwise a
//!    user namespace that maps its own ids first.
//! 2. `Z0` forks `Z1`, the pid namespace's init, and then only waits for it
//!    (its death kills the box through `Z1`'s parent-death signal and lifeline).
//! 3. `Z1` builds the filesystem view (`view`), brings up its loopback,
//!    becomes the box's unprivileged user, drops every capability, sets
//!    no_new_privs, installs the box's seccomp filter and serves (`serve`).
//!
//! The entry runs from `.init_array`, before the binary's `main`: every
//! binary that links this crate (services, the CLI, test harnesses) can be
//! a zygote without a helper binary to find at run time.

mod serve;
mod view;

use crate::wire::{BoxSpec, FromBox, Identity, ToBox};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The name a zygote is exec'd under; any other `argv[0]` runs the binary as usual.
pub const ARG0: &str = "omicos-sandbox-box";
/// The control socket's descriptor in the zygote.
pub const CONTROL_FD: RawFd = 3;

type InitFn = extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char);

/// Run by the loader before `main` in every binary that links this crate.
/// [`crate::Sandbox::new`] refers to it, so the object that holds it is linked.
#[used]
#[unsafe(link_section = ".init_array")]
pub static ENTRY: InitFn = entry;

extern "C" fn entry(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    if argc < 1 || argv.is_null() {
        return;
    }
    // SAFETY: the loader passes argc valid, NUL-terminated argv strings.
    let arg0 = unsafe { *argv };
    if arg0.is_null() {
        return;
    }
    // SAFETY: as above.
    if unsafe { CStr::from_ptr(arg0) }.to_bytes() != ARG0.as_bytes() {
        return;
    }
    let code = run();
    // SAFETY: ends the process without running the binary's main or atexit handlers.
    unsafe { libc::_exit(code) }
}

/// A failure while building the box: the stage and the error.
#[derive(Debug)]
pub(crate) struct StageError {
    pub stage: String,
    pub error: String,
}

impl StageError {
    pub(crate) fn new(stage: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self {
            stage: stage.into(),
            error: error.to_string(),
        }
    }

    /// The last OS error, for `stage`.
    pub(crate) fn os(stage: impl Into<String>) -> Self {
        Self::new(stage, io::Error::last_os_error())
    }
}

/// `rc < 0` → the OS error for `stage`.
pub(crate) fn check(rc: libc::c_long, stage: impl FnOnce() -> String) -> Result<(), StageError> {
    if rc < 0 {
        Err(StageError::os(stage()))
    } else {
        Ok(())
    }
}

pub(crate) fn send(ctl: BorrowedFd<'_>, msg: &FromBox) {
    let _ = crate::wire::send_frame(ctl, &crate::wire::encode(msg), &[]);
}

fn run() -> i32 {
    // SAFETY: fd 3 was set up by the service as the control socket.
    let ctl = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // SAFETY: fcntl on our own fd.
    unsafe { libc::fcntl(ctl.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let spec = match read_spec(&ctl) {
        Ok(s) => s,
        Err(e) => {
            send(
                ctl.as_fd(),
                &FromBox::SetupFailed {
                    stage: e.stage,
                    error: e.error,
                },
            );
            return 2;
        }
    };
    match start(&spec, ctl) {
        Ok(code) => code,
        Err((ctl, e)) => {
            send(
                ctl.as_fd(),
                &FromBox::SetupFailed {
                    stage: e.stage,
                    error: e.error,
                },
            );
            2
        }
    }
}

fn read_spec(ctl: &OwnedFd) -> Result<BoxSpec, StageError> {
    let mut reader = crate::wire::FrameReader::default();
    loop {
        if let Some(frame) = reader
            .next_frame()
            .map_err(|e| StageError::new("read the box spec", e))?
        {
            return match serde_json::from_slice::<ToBox>(&frame) {
                Ok(ToBox::Setup(spec)) => Ok(*spec),
                Ok(other) => Err(StageError::new(
                    "read the box spec",
                    format!("expected Setup first, got {other:?}"),
                )),
                Err(e) => Err(StageError::new("read the box spec", e)),
            };
        }
        match reader
            .read_from(ctl.as_fd())
            .map_err(|e| StageError::new("read the box spec", e))?
        {
            crate::wire::Read::Eof => {
                return Err(StageError::new(
                    "read the box spec",
                    "the service closed the socket",
                ));
            }
            _ => continue,
        }
    }
}

fn write_file(path: &str, data: &str) -> Result<(), StageError> {
    std::fs::write(path, data).map_err(|e| StageError::new(format!("write {path}"), e))
}

/// Makes a user namespace mapping uid 0 and gid 0 to `uid`/`gid` and returns
/// its descriptor: the idmapping of the workspace mounts (files of the
/// service, uid 0, are the box user's in the box). Root only.
fn idmap_userns(uid: u32, gid: u32) -> Result<OwnedFd, StageError> {
    let (go_r, go_w) = pipe()?;
    let (ready_r, ready_w) = pipe()?;
    // SAFETY: fork in a single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(StageError::os("fork the idmap helper"));
    }
    if pid == 0 {
        drop(go_w);
        drop(ready_r);
        // SAFETY: unshare(2) with a flag.
        let ok = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
        let byte = [if ok { 1u8 } else { 0 }];
        // SAFETY: write(2)/read(2) on pipes we own; _exit ends the helper.
        unsafe {
            libc::write(ready_w.as_raw_fd(), byte.as_ptr().cast(), 1);
            let mut b = [0u8; 1];
            libc::read(go_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    drop(go_r);
    drop(ready_w);
    let result = (|| {
        let mut b = [0u8; 1];
        // SAFETY: read(2) into a one-byte buffer.
        let n = unsafe { libc::read(ready_r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        if n != 1 || b[0] != 1 {
            return Err(StageError::new(
                "make the idmap user namespace",
                "unshare(CLONE_NEWUSER) failed in the helper",
            ));
        }
        write_file(&format!("/proc/{pid}/uid_map"), &format!("0 {uid} 1\n"))?;
        write_file(&format!("/proc/{pid}/gid_map"), &format!("0 {gid} 1\n"))?;
        std::fs::File::open(format!("/proc/{pid}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| StageError::new("open the idmap user namespace", e))
    })();
    drop(go_w);
    let mut st = 0;
    // SAFETY: reaps the helper we forked.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    result
}

pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), StageError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 into a two-element array.
    check(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long,
        || "pipe".into(),
    )?;
    // SAFETY: both fds were just created and are ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Z0: namespaces, then fork Z1 and wait for it.
fn start(spec: &BoxSpec, ctl: OwnedFd) -> Result<i32, (OwnedFd, StageError)> {
    let fail = |ctl: OwnedFd| move |e: StageError| (ctl, e);
    let mut flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if spec.private_net {
        flags |= libc::CLONE_NEWNET;
    }
    let mut idmap = None;
    if !spec.namespaces {
        flags = 0;
    }
    match &spec.identity {
        _ if !spec.namespaces => {}
        Identity::Privileged {
            uid,
            gid,
            idmap: true,
        } => match idmap_userns(*uid, *gid) {
            Ok(fd) => idmap = Some(fd),
            Err(e) => return Err(fail(ctl)(e)),
        },
        Identity::Privileged { .. } => {}
        Identity::UserNamespace { .. } => flags |= libc::CLONE_NEWUSER,
    }
    // SAFETY: unshare(2) with namespace flags.
    if flags != 0 && unsafe { libc::unshare(flags) } != 0 {
        return Err(fail(ctl)(StageError::os(format!(
            "unshare the box's namespaces ({})",
            describe_flags(flags)
        ))));
    }
    if let (true, Identity::UserNamespace { uid, gid }) = (spec.namespaces, &spec.identity) {
        let maps = write_file("/proc/self/setgroups", "deny")
            .and_then(|_| write_file("/proc/self/uid_map", &format!("{uid} {uid} 1\n")))
            .and_then(|_| write_file("/proc/self/gid_map", &format!("{gid} {gid} 1\n")));
        if let Err(e) = maps {
            return Err(fail(ctl)(e));
        }
    }
    let (life_r, life_w) = match pipe() {
        Ok(p) => p,
        Err(e) => return Err(fail(ctl)(e)),
    };
    // SAFETY: fork in a single-threaded process; the child continues below.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(fail(ctl)(StageError::os("fork the box's init")));
    }
    if pid == 0 {
        drop(life_w);
        // SAFETY: prctl(2) with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        let code = match init(spec, &ctl, idmap.as_ref(), life_r) {
            Ok(code) => code,
            Err(e) => {
                send(
                    ctl.as_fd(),
                    &FromBox::SetupFailed {
                        stage: e.stage,
                        error: e.error,
                    },
                );
                2
            }
        };
        // SAFETY: ends Z1.
        unsafe { libc::_exit(code) }
    }
    drop(ctl);
    drop(life_r);
    drop(idmap);
    // Z0 keeps nothing of root: it only waits.
    if let Identity::Privileged { uid, gid, .. } = &spec.identity {
        let _ = become_user(*uid, *gid);
    }
    let mut st = 0;
    loop {
        // SAFETY: waits for Z1, our only child.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            break;
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    drop(life_w);
    Ok(if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        128 + libc::WTERMSIG(st)
    })
}

fn describe_flags(flags: libc::c_int) -> String {
    let names = [
        (libc::CLONE_NEWUSER, "user"),
        (libc::CLONE_NEWNS, "mount"),
        (libc::CLONE_NEWPID, "pid"),
        (libc::CLONE_NEWIPC, "ipc"),
        (libc::CLONE_NEWUTS, "uts"),
        (libc::CLONE_NEWCGROUP, "cgroup"),
        (libc::CLONE_NEWNET, "net"),
    ];
    names
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// setgroups/setresgid/setresuid to the box's ids (root → unprivileged:
/// the kernel clears every capability).
fn become_user(uid: u32, gid: u32) -> Result<(), StageError> {
    let groups = [gid];
    // SAFETY: setgroups/setresgid/setresuid with plain values.
    unsafe {
        check(libc::setgroups(1, groups.as_ptr()) as libc::c_long, || {
            "setgroups".into()
        })?;
        check(libc::setresgid(gid, gid, gid) as libc::c_long, || {
            format!("setresgid({gid})")
        })?;
        check(libc::setresuid(uid, uid, uid) as libc::c_long, || {
            format!("setresuid({uid})")
        })?;
    }
    Ok(())
}

/// Drops every capability from the ambient, effective, permitted and
/// inheritable sets (the bounding set goes first, with [`drop_bounding`],
/// while the process may still change it).
pub(crate) fn drop_capabilities() -> Result<(), StageError> {
    // SAFETY: prctl(2) with integer arguments.
    check(
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            )
        } as libc::c_long,
        || "clear ambient capabilities".into(),
    )?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) with a v3 header and two data structs.
    check(
        unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) },
        || "capset".into(),
    )
}

/// Z1: the box's init.
fn init(
    spec: &BoxSpec,
    ctl: &OwnedFd,
    idmap: Option<&OwnedFd>,
    lifeline: OwnedFd,
) -> Result<i32, StageError> {
    if spec.namespaces {
        view::build(spec, idmap)?;
        // SAFETY: sethostname(2) on a live buffer, in the box's own UTS namespace.
        unsafe {
            libc::sethostname(spec.hostname.as_ptr().cast(), spec.hostname.len());
        }
    }
    if spec.private_net {
        loopback_up()?;
    }
    drop_bounding()?;
    if let Identity::Privileged { uid, gid, .. } = &spec.identity {
        become_user(*uid, *gid)?;
    }
    drop_capabilities()?;
    // SAFETY: prctl(2) and friends with integer arguments.
    unsafe {
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long,
            || "no_new_privs".into(),
        )?;
        // Credentials changed: the parent-death signal was cleared.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // Nothing of this process can be read through /proc or ptrace.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::umask(0o002);
        libc::setsid();
    }
    let rulesets = serve::Rulesets::build(&spec.landlock)?;
    let programs = crate::syscalls::box_program(&spec.socket_domains)
        .map_err(|e| StageError::new("build the seccomp filter", e))?;
    for program in &programs {
        seccompiler::apply_filter(program)
            .map_err(|e| StageError::new("install the seccomp filter", e))?;
    }
    send(ctl.as_fd(), &FromBox::Ready);
    serve::serve(ctl, lifeline, rulesets)
}

fn drop_bounding() -> Result<(), StageError> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(63);
    for cap in 0..=last {
        // SAFETY: prctl(2) with integer arguments.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        match io::Error::last_os_error().raw_os_error() {
            _ if rc == 0 => {}
            // A capability this kernel does not know.
            Some(libc::EINVAL) => {}
            // Without CAP_SETPCAP (an ordinary user outside a user
            // namespace) the set cannot change, and no_new_privs keeps
            // file capabilities from adding anything at exec.
            Some(libc::EPERM) => return Ok(()),
            _ => return Err(StageError::os(format!("drop capability {cap}"))),
        }
    }
    Ok(())
}

/// Brings `lo` up in the box's own network namespace.
fn loopback_up() -> Result<(), StageError> {
    // SAFETY: a datagram socket and two ioctls on a zeroed ifreq naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(fd as libc::c_long, || "socket for lo".into())?;
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        check(
            libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) as libc::c_long,
            || "read lo's flags".into(),
        )?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(
            libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) as libc::c_long,
            || "bring lo up".into(),
        )?;
    }
    Ok(())
}
