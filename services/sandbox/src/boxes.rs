//! The service's side of boxes: one per session (and network setting),
//! started on the session's first confined call and reused by every call
//! after it, ended with the session, when idle, or when the service stops.
//!
//! A box is a zygote (see `zygote`) that the service talks to over a unix
//! socket. A call costs one frame, a fork of a reaper and a fork + exec of
//! the command inside the box: the namespaces, the view and the identity
//! are paid for once per session, not per call.

use crate::box_cgroup::BoxCgroup;
use crate::wire::{self, BoxSpec, FromBox, ToBox};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, oneshot, watch};

/// How long a new box may take to report ready.
const START_PATIENCE: Duration = Duration::from_secs(20);
/// How much of a zygote's stderr is kept to explain a failure.
const STDERR_TAIL: usize = 4096;

/// Which box: a session's, with or without the network, with a given set
/// of extra directories in its view.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BoxKey {
    pub tenant: String,
    pub session: String,
    pub network: bool,
    /// The workspace is mounted writable (read-only calls get a box whose
    /// workspace mount is read-only: Landlock alone cannot take back a
    /// write right that a parent directory's rule gives, e.g. /tmp's).
    pub writable: bool,
    pub workspace: PathBuf,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub bind: Vec<(PathBuf, PathBuf, bool)>,
}

/// What one call's slot waits for.
struct Slot {
    started: Option<oneshot::Sender<Result<i32, (String, i32)>>>,
    exited: watch::Sender<Option<i32>>,
    ended: Arc<Ended>,
}

#[derive(Default)]
pub(crate) struct Ended {
    done: AtomicBool,
    notify: Notify,
}

impl Ended {
    fn set(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            if self.done.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

/// The service's end of a box's control socket.
struct Control {
    fd: AsyncFd<OwnedFd>,
    write: Mutex<()>,
    slots: Mutex<HashMap<u64, Slot>>,
    dead: watch::Sender<Option<String>>,
}

impl Control {
    fn send(&self, msg: &ToBox, fds: &[std::os::fd::RawFd]) -> io::Result<()> {
        if let Some(why) = self.dead.borrow().clone() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why));
        }
        let _g = self.write.lock().unwrap_or_else(|e| e.into_inner());
        wire::send_frame(self.fd.get_ref().as_fd(), &wire::encode(msg), fds)
    }

    fn dispatch(&self, msg: FromBox) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match msg {
            FromBox::Started { id, pid } => {
                if let Some(tx) = slots.get_mut(&id).and_then(|s| s.started.take()) {
                    let _ = tx.send(Ok(pid));
                }
            }
            FromBox::SpawnFailed { id, stage, errno } => {
                if let Some(s) = slots.get_mut(&id) {
                    if let Some(tx) = s.started.take() {
                        let _ = tx.send(Err((stage, errno)));
                    }
                    s.exited.send_replace(Some(127 << 8));
                }
            }
            FromBox::Exited { id, status } => {
                if let Some(s) = slots.get(&id) {
                    s.exited.send_replace(Some(status));
                }
            }
            FromBox::Ended { id } => {
                if let Some(s) = slots.remove(&id) {
                    s.exited.send_if_modified(|v| {
                        if v.is_none() {
                            *v = Some(libc::SIGKILL);
                            true
                        } else {
                            false
                        }
                    });
                    s.ended.set();
                }
            }
            FromBox::Ready | FromBox::SetupFailed { .. } => {}
        }
    }

    /// The box is gone: every call it held is over.
    fn fail_all(&self, why: String) {
        self.dead.send_if_modified(|d| {
            if d.is_none() {
                *d = Some(why);
                true
            } else {
                false
            }
        });
        let slots: Vec<Slot> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for mut s in slots {
            if let Some(tx) = s.started.take() {
                let _ = tx.send(Err(("box".into(), libc::ESRCH)));
            }
            s.exited.send_if_modified(|v| {
                if v.is_none() {
                    *v = Some(libc::SIGKILL);
                    true
                } else {
                    false
                }
            });
            s.ended.set();
        }
    }
}

/// A running box.
pub struct SessionBox {
    pub(crate) key: BoxKey,
    id: String,
    dir: PathBuf,
    uid: u32,
    gid: u32,
    ctl: Arc<Control>,
    z0_pid: Option<u32>,
    cgroup: Option<BoxCgroup>,
    _lease: Option<Arc<crate::ids::UidLease>>,
    next_call: AtomicU64,
    busy: AtomicUsize,
    last_used: Mutex<Instant>,
    pub(crate) memory_bound: Option<u64>,
    /// Times the disk watchdog stopped the box's calls, and why the last time.
    disk_trips: AtomicU64,
    disk_note: Mutex<String>,
    /// Calls a disk bound interrupts instead of ending (kernels).
    interruptible: Mutex<Vec<u64>>,
}

impl std::fmt::Debug for SessionBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBox")
            .field("id", &self.id)
            .field("session", &self.key.session)
            .field("tenant", &self.key.tenant)
            .field("uid", &self.uid)
            .field("network", &self.key.network)
            .finish()
    }
}

/// Everything needed to start a box.
pub(crate) struct Launch {
    pub key: BoxKey,
    pub id: String,
    pub dir: PathBuf,
    pub spec: BoxSpec,
    pub cgroup: Option<BoxCgroup>,
    pub lease: Option<Arc<crate::ids::UidLease>>,
    /// Root whose namespaces need a user namespace: become the box's ids before exec.
    pub setuid_first: Option<(u32, u32)>,
    pub memory_bound: Option<u64>,
}

impl Launch {
    fn ids(&self) -> (u32, u32) {
        (self.spec.identity.uid(), self.spec.identity.gid())
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl(2) on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl SessionBox {
    /// Starts the zygote and waits until the box is built.
    pub(crate) async fn start(launch: Launch) -> Result<Arc<SessionBox>, String> {
        let (uid, gid) = launch.ids();
        let Launch {
            key,
            id,
            dir,
            spec,
            cgroup,
            lease,
            setuid_first,
            memory_bound,
        } = launch;
        let (host, boxside) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("cannot make the box's control socket: {e}"))?;
        let host = OwnedFd::from(host);
        let boxside = OwnedFd::from(boxside);
        set_nonblocking(&host).map_err(|e| e.to_string())?;
        let procs = match &cgroup {
            Some(c) => c
                .open_procs()
                .map_err(|e| format!("cannot open the box's cgroup: {e}"))?,
            None => Vec::new(),
        };
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        {
            use std::os::unix::process::CommandExt;
            cmd.as_std_mut().arg0(crate::zygote::ARG0);
        }
        cmd.env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let box_fd = boxside.as_raw_fd();
        let procs_fds: Vec<i32> = procs.iter().map(AsRawFd::as_raw_fd).collect();
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe syscalls on values prepared
            // before the fork: cgroup joins, dup2, setsid, and the id change.
            unsafe {
                cmd.as_std_mut().pre_exec(move || {
                    for fd in &procs_fds {
                        if libc::write(*fd, b"0".as_ptr().cast(), 1) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    if libc::dup2(box_fd, crate::zygote::CONTROL_FD) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::setsid();
                    if let Some((uid, gid)) = setuid_first {
                        let groups = [gid];
                        if libc::setgroups(1, groups.as_ptr()) < 0
                            || libc::setresgid(gid, gid, gid) < 0
                            || libc::setresuid(uid, uid, uid) < 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the box's zygote: {e}"))?;
        drop(boxside);
        drop(procs);
        let z0_pid = child.id();
        let tail = Arc::new(Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let tail = tail.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 1024];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if t.len() > STDERR_TAIL {
                        let cut = t.len() - STDERR_TAIL;
                        let cut = (cut..t.len()).find(|i| t.is_char_boundary(*i)).unwrap_or(0);
                        t.drain(..cut);
                    }
                }
            });
        }
        let (dead_tx, _) = watch::channel(None);
        let ctl = Arc::new(Control {
            // SAFETY: `host` is an OwnedFd the AsyncFd owns: it stays open and
            // the same for the AsyncFd's whole life.
            fd: unsafe { AsyncFd::register_with_interest(host, tokio::io::Interest::READABLE) }
                .map_err(|e| e.to_string())?,
            write: Mutex::new(()),
            slots: Mutex::new(HashMap::new()),
            dead: dead_tx,
        });
        ctl.send(&ToBox::Setup(Box::new(spec)), &[])
            .map_err(|e| format!("cannot send the box its spec: {e}"))?;
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        tokio::spawn(pump(ctl.clone(), ready_tx));
        // The zygote's exit ends the box (its init dies with it).
        {
            let ctl = ctl.clone();
            tokio::spawn(async move {
                let status = child.wait().await;
                ctl.fail_all(format!(
                    "the sandbox box ended ({})",
                    status
                        .map(|s| s.to_string())
                        .unwrap_or_else(|e| e.to_string())
                ));
            });
        }
        let describe = |why: String| {
            let t = tail
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .trim()
                .to_owned();
            if t.is_empty() {
                why
            } else {
                format!("{why} (zygote stderr: {t})")
            }
        };
        match tokio::time::timeout(START_PATIENCE, ready_rx).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(why))) => {
                kill_pid(z0_pid);
                return Err(describe(why));
            }
            Ok(Err(_)) => {
                kill_pid(z0_pid);
                let why = ctl
                    .dead
                    .borrow()
                    .clone()
                    .unwrap_or_else(|| "the box ended before it was ready".into());
                return Err(describe(why));
            }
            Err(_) => {
                kill_pid(z0_pid);
                return Err(describe(format!(
                    "the box was not ready within {START_PATIENCE:?}"
                )));
            }
        }
        Ok(Arc::new(SessionBox {
            key,
            id,
            dir,
            uid,
            gid,
            ctl,
            z0_pid,
            cgroup,
            _lease: lease,
            next_call: AtomicU64::new(1),
            busy: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            memory_bound,
            disk_trips: AtomicU64::new(0),
            disk_note: Mutex::new(String::new()),
            interruptible: Mutex::default(),
        }))
    }

    /// The box's id (`b-…`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The uid boxed processes run as (as the host sees it).
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The gid boxed processes run as.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The box's private directory on the host, bound at the same path in
    /// the box, writable only by its uid (a kernel's connection file and
    /// sockets live here).
    pub fn private_dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Why the box is gone, if it is.
    pub fn death(&self) -> Option<String> {
        self.ctl.dead.borrow().clone()
    }

    /// Calls running now.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }

    /// Time since the last call started or ended.
    pub fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// The box's cgroup, if it has one.
    pub fn cgroup(&self) -> Option<&BoxCgroup> {
        self.cgroup.as_ref()
    }

    /// The host's pid of the box process whose pid in the box is `inner`:
    /// found among the box's cgroup's processes (or all of /proc) by its
    /// `NSpid` line and its pid namespace being the box's.
    pub fn host_pid(&self, inner: i32) -> Option<i32> {
        let z0 = self.z0_pid? as i32;
        let z1: i32 = std::fs::read_to_string(format!("/proc/{z0}/task/{z0}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let ns = std::fs::read_link(format!("/proc/{z1}/ns/pid")).ok()?;
        let candidates: Vec<i32> = match &self.cgroup {
            Some(c) => c
                .dirs()
                .iter()
                .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
                .flat_map(|t| {
                    t.lines()
                        .filter_map(|l| l.trim().parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect(),
            None => std::fs::read_dir("/proc")
                .ok()?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect(),
        };
        candidates.into_iter().find(|pid| {
            let nspid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("NSpid:"))
                        .and_then(|v| v.split_whitespace().last()?.parse::<i32>().ok())
                });
            nspid == Some(inner)
                && std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&ns)
        })
    }

    /// Ends the box: its init and every process inside die.
    pub fn end(&self) {
        self.ctl.fail_all("the session's box was ended".into());
        kill_pid(self.z0_pid);
        if let Some(c) = &self.cgroup {
            c.kill_all();
        }
    }

    /// Starts `req` in the box; returns the process and the service's ends
    /// of its piped streams.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        req: SpawnRequest,
    ) -> Result<(BoxedChild, [Option<OwnedFd>; 3]), io::Error> {
        let id = self.next_call.fetch_add(1, Ordering::SeqCst);
        if req.interrupt_on_bound {
            self.interruptible
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(id);
        }
        let mut host_ends: [Option<OwnedFd>; 3] = [None, None, None];
        let mut box_ends: Vec<OwnedFd> = Vec::new();
        let mut present = [false; 3];
        for (i, s) in req.stdio.into_iter().enumerate() {
            match s {
                crate::Stdio::Null => {}
                crate::Stdio::Fd(fd) => {
                    present[i] = true;
                    box_ends.push(fd);
                }
                crate::Stdio::Piped => {
                    present[i] = true;
                    let (r, w) = std::io::pipe()?;
                    let (r, w) = (OwnedFd::from(r), OwnedFd::from(w));
                    if i == 0 {
                        host_ends[0] = Some(w);
                        box_ends.push(r);
                    } else {
                        host_ends[i] = Some(r);
                        box_ends.push(w);
                    }
                }
            }
        }
        let (started_tx, started_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = watch::channel(None);
        let ended = Arc::new(Ended::default());
        self.ctl
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                Slot {
                    started: Some(started_tx),
                    exited: exited_tx,
                    ended: ended.clone(),
                },
            );
        let msg = ToBox::Spawn {
            id,
            argv: req.argv,
            env: req.env,
            cwd: req.cwd,
            read_only: req.read_only,
            stdio: present,
            rlimits: req.rlimits,
        };
        let fds: Vec<i32> = box_ends.iter().map(AsRawFd::as_raw_fd).collect();
        if let Err(e) = self.ctl.send(&msg, &fds) {
            self.ctl
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return Err(e);
        }
        drop(box_ends);
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.touch();
        let guard = CallGuard {
            sbox: self.clone(),
            id,
            ended: ended.clone(),
        };
        let pid = match started_rx.await {
            Ok(Ok(pid)) => pid,
            Ok(Err((stage, errno))) => {
                let e = io::Error::from_raw_os_error(errno);
                let what = match stage.as_str() {
                    "exec" => format!("cannot run the program: {e}"),
                    "chdir" => format!("cannot enter the working directory: {e}"),
                    "box" => self
                        .death()
                        .unwrap_or_else(|| "the sandbox box is gone".into()),
                    other => format!("the sandbox could not start the process ({other}): {e}"),
                };
                return Err(io::Error::new(e.kind(), what));
            }
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    self.death()
                        .unwrap_or_else(|| "the sandbox box is gone".into()),
                ));
            }
        };
        Ok((
            BoxedChild {
                pid,
                exited: exited_rx,
                guard,
                oom_before: self.cgroup.as_ref().map(BoxCgroup::oom_kills).unwrap_or(0),
                disk_before: self.disk_trips.load(Ordering::SeqCst),
            },
            host_ends,
        ))
    }

    pub(crate) fn signal(&self, id: u64, signal: i32, group: bool) {
        let _ = self.ctl.send(&ToBox::Signal { id, signal, group }, &[]);
    }

    /// A disk bound was passed (see `Sandbox`'s disk watchdog): every call
    /// running in the box is ended, and each says why.
    pub(crate) fn trip_disk(&self, note: String) {
        *self.disk_note.lock().unwrap_or_else(|e| e.into_inner()) = note;
        self.disk_trips.fetch_add(1, Ordering::SeqCst);
        let ids: Vec<u64> = self
            .ctl
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        let interruptible: Vec<u64> = {
            let mut i = self.interruptible.lock().unwrap_or_else(|e| e.into_inner());
            i.retain(|id| ids.contains(id));
            i.clone()
        };
        for id in ids {
            if interruptible.contains(&id) {
                self.signal(id, libc::SIGINT, true);
            } else {
                self.end_call(id);
            }
        }
    }

    /// Times the disk watchdog stopped (or interrupted) the box's calls, and
    /// why the last time.
    pub fn disk_trips(&self) -> (u64, String) {
        (
            self.disk_trips.load(Ordering::SeqCst),
            self.disk_note
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// The workspace the box writes.
    pub(crate) fn workspace(&self) -> &Path {
        &self.key.workspace
    }

    pub(crate) fn end_call(&self, id: u64) {
        if self.ctl.send(&ToBox::End { id }, &[]).is_err() {
            // The box is gone: so is the call.
            if let Some(s) = self
                .ctl
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
            {
                s.ended.set();
            }
        }
    }
}

fn kill_pid(pid: Option<u32>) {
    if let Some(p) = pid {
        // SAFETY: kill(2) of the zygote we started.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}

impl Drop for SessionBox {
    fn drop(&mut self) {
        self.end();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads the zygote's frames until the socket closes.
async fn pump(ctl: Arc<Control>, ready: oneshot::Sender<Result<(), String>>) {
    let mut ready = Some(ready);
    let mut reader = wire::FrameReader::default();
    loop {
        let mut guard = match ctl.fd.readable().await {
            Ok(g) => g,
            Err(e) => {
                ctl.fail_all(format!("the box's control socket failed: {e}"));
                return;
            }
        };
        let res = reader.read_from(ctl.fd.get_ref().as_fd());
        match res {
            Ok(wire::Read::WouldBlock) => {
                guard.clear_ready();
                continue;
            }
            Ok(wire::Read::Eof) => {
                let why = "the sandbox box ended".to_string();
                if let Some(r) = ready.take() {
                    let _ = r.send(Err(why.clone()));
                }
                ctl.fail_all(why);
                return;
            }
            Err(e) => {
                ctl.fail_all(format!("the box's control socket failed: {e}"));
                return;
            }
            Ok(wire::Read::Some) => {}
        }
        drop(guard);
        loop {
            let frame = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    ctl.fail_all(format!("the box sent a bad frame: {e}"));
                    return;
                }
            };
            let Ok(msg) = serde_json::from_slice::<FromBox>(&frame) else {
                continue;
            };
            match msg {
                FromBox::Ready => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Ok(()));
                    }
                }
                FromBox::SetupFailed { stage, error } => {
                    let why = format!("building the sandbox box failed at `{stage}`: {error}");
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err(why.clone()));
                    }
                    ctl.fail_all(why);
                    return;
                }
                other => ctl.dispatch(other),
            }
        }
    }
}

/// A process to start in a box.
#[derive(Debug)]
pub(crate) struct SpawnRequest {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: PathBuf,
    pub read_only: bool,
    pub stdio: [crate::Stdio; 3],
    pub rlimits: Vec<wire::Rlimit>,
    pub interrupt_on_bound: bool,
}

/// Ends the call's processes when the handle goes.
struct CallGuard {
    sbox: Arc<SessionBox>,
    id: u64,
    ended: Arc<Ended>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.ended.done.load(Ordering::SeqCst) {
            self.sbox.end_call(self.id);
        }
        self.sbox.busy.fetch_sub(1, Ordering::SeqCst);
        self.sbox.touch();
    }
}

/// A process started in a box. Dropping it kills everything the call
/// started (like [`BoxedChild::end`], without waiting).
pub(crate) struct BoxedChild {
    pid: i32,
    exited: watch::Receiver<Option<i32>>,
    guard: CallGuard,
    oom_before: u64,
    disk_before: u64,
}

impl std::fmt::Debug for BoxedChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoxedChild")
            .field("pid", &self.pid)
            .field("box", &self.guard.sbox.id)
            .field("call", &self.guard.id)
            .finish()
    }
}

impl BoxedChild {
    /// The process's pid inside its box.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The box it runs in.
    pub fn sandbox_box(&self) -> &Arc<SessionBox> {
        &self.guard.sbox
    }

    /// The process's pid on the host (see [`SessionBox::host_pid`]).
    pub fn host_pid(&self) -> Option<i32> {
        self.guard.sbox.host_pid(self.pid)
    }

    /// The call's id in its box.
    pub fn call_id(&self) -> u64 {
        self.guard.id
    }

    /// Waits until the call's first process exits.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status =
            self.exited.wait_for(Option::is_some).await.map_err(|_| {
                io::Error::new(io::ErrorKind::BrokenPipe, "the sandbox box is gone")
            })?;
        Ok(ExitStatus::from_raw(status.unwrap_or(libc::SIGKILL)))
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&self) -> Option<ExitStatus> {
        (*self.exited.borrow()).map(ExitStatus::from_raw)
    }

    /// Sends `signal` to the process's group (what it started and did not
    /// move to a session of its own).
    pub fn signal_group(&self, signal: i32) {
        self.guard.sbox.signal(self.guard.id, signal, true);
    }

    /// Kills every process of the call, those that left its group or
    /// session included, and waits until they are gone.
    pub async fn end(&self) {
        if !self.guard.ended.done.load(Ordering::SeqCst) {
            self.guard.sbox.end_call(self.guard.id);
        }
        self.guard.ended.wait().await;
    }

    /// Times the disk watchdog stopped the box's calls.
    pub fn disk_trips(&self) -> u64 {
        self.guard.sbox.disk_trips.load(Ordering::SeqCst)
    }

    /// Why the disk watchdog stopped the box's calls, if it did since this
    /// one started.
    pub fn hit_disk_bound(&self) -> Option<String> {
        let b = &self.guard.sbox;
        (b.disk_trips.load(Ordering::SeqCst) > self.disk_before).then(|| {
            b.disk_note
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        })
    }

    /// Whether the box's memory bound stopped a process since this call began.
    pub fn hit_memory_bound(&self) -> Option<u64> {
        let c = self.guard.sbox.cgroup.as_ref()?;
        (c.oom_kills() > self.oom_before).then_some(self.guard.sbox.memory_bound.unwrap_or(0))
    }
}
