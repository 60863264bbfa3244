//! The control channel between the service and a box's zygote: a unix
//! stream socket carrying length-prefixed JSON frames; a spawn's stdio
//! descriptors ride with its frame as SCM_RIGHTS.
//!
//! One frame: a little-endian `u32` length, then that many bytes of JSON.
//! Descriptors attached to any byte of a frame arrive with it; the reader
//! queues them in order and a [`ToBox::Spawn`] takes as many as it names.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// Largest frame either side accepts: a spawn's argv and environment fit
/// well within it (ARG_MAX is 2 MiB on Linux).
pub const MAX_FRAME: usize = 4 << 20;
/// Most descriptors one frame carries (stdin, stdout, stderr, and spare).
pub const MAX_FDS: usize = 8;

/// How the box is built: everything the zygote needs, computed by the service.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BoxSpec {
    /// How namespaces are made and which ids run inside.
    pub identity: Identity,
    /// Make namespaces and a view at all (false: `when_namespaces_missing:
    /// warn` on a host without them; Landlock paths are then host paths).
    pub namespaces: bool,
    /// A private network namespace with only its loopback (else the host's network).
    pub private_net: bool,
    /// The mounts, in order, onto an empty read-only root.
    pub mounts: Vec<Mount>,
    /// Lines of `/etc/passwd` and `/etc/group` for the box's ids (the host's
    /// files are copied and these appended).
    pub passwd_line: String,
    /// See `passwd_line`.
    pub group_line: String,
    /// The Landlock rules of the two confined policies, as paths in the box.
    pub landlock: LandlockSpec,
    /// The socket domains a boxed process may create (libc `AF_*`).
    pub socket_domains: Vec<i32>,
    /// The box's hostname.
    pub hostname: String,
}

/// Which namespaces and ids.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Identity {
    /// The service is root: the zygote makes the namespaces as root, then
    /// becomes `uid`:`gid` (from the configured range) before it serves.
    /// `idmap`: the workspace mounts are idmapped so that the service's files
    /// (uid 0) are the box user's inside and the box's writes land as the
    /// service's on disk.
    Privileged {
        /// The box's user id.
        uid: u32,
        /// The box's group id.
        gid: u32,
        /// Idmap the mounts marked `idmap`.
        idmap: bool,
    },
    /// An ordinary user (or root that already became `uid`): a user
    /// namespace maps the process's own ids to themselves.
    UserNamespace {
        /// The id inside (the process's own).
        uid: u32,
        /// The group inside.
        gid: u32,
    },
}

impl Identity {
    /// The user id boxed processes run as.
    pub fn uid(&self) -> u32 {
        match self {
            Identity::Privileged { uid, .. } | Identity::UserNamespace { uid, .. } => *uid,
        }
    }

    /// The group id boxed processes run as.
    pub fn gid(&self) -> u32 {
        match self {
            Identity::Privileged { gid, .. } | Identity::UserNamespace { gid, .. } => *gid,
        }
    }
}

/// One step of building the box's filesystem view.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Mount {
    /// Bind the host's `src` at `dst` (recursively); read-only unless
    /// `writable`. Always nosuid and nodev. `idmap`: under
    /// [`Identity::Privileged`] with idmapping on, the service's ids appear
    /// as the box's. A missing `src` is skipped unless `required`.
    Bind {
        /// Host path.
        src: PathBuf,
        /// Path in the box.
        dst: PathBuf,
        /// Read-write.
        writable: bool,
        /// Idmapped (workspace-like mounts).
        idmap: bool,
        /// Fail the box when `src` is missing.
        required: bool,
    },
    /// A symlink at `dst` pointing to `target` (merged-/usr systems' `/bin`).
    Symlink {
        /// Path in the box.
        dst: PathBuf,
        /// What it points to.
        target: PathBuf,
    },
    /// A fresh tmpfs of `size_bytes` (mode 1777) at `dst`.
    Tmpfs {
        /// Path in the box.
        dst: PathBuf,
        /// Size bound.
        size_bytes: u64,
    },
    /// An empty, read-only file or directory over `dst` (what the box must
    /// not see: omicos's own state, secrets). Skipped when `dst` does not
    /// exist in the view.
    Hide {
        /// Path in the box.
        dst: PathBuf,
    },
    /// `/proc` of the box's pid namespace.
    Proc,
    /// A minimal `/dev`: null, zero, full, random, urandom, tty, a private
    /// devpts with its own ptmx, `/dev/shm`, and the `fd` links.
    Dev {
        /// Size bound of `/dev/shm`.
        shm_bytes: u64,
    },
    /// A directory owned by the box's user (a home in a tmpfs).
    OwnedDir {
        /// Path in the box.
        dst: PathBuf,
    },
}

/// The paths each confined policy's Landlock ruleset allows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LandlockSpec {
    /// The kernel has Landlock: build and apply rulesets.
    pub enabled: bool,
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Readable under read-only, writable under workspace-write (the workspace).
    pub workspace: Vec<PathBuf>,
    /// Writable under every confined policy (tmp, private directories).
    pub write: Vec<PathBuf>,
    /// Device files read and written (with ioctl: terminals).
    pub devices_rw: Vec<PathBuf>,
    /// Device files only read.
    pub devices_ro: Vec<PathBuf>,
    /// Directories whose entries (names only) may be listed, beneath them
    /// too: the view's root, so that `ls /` works in a box.
    pub list: Vec<PathBuf>,
}

/// One resource limit for a spawned process (libc `RLIMIT_*`, soft = hard).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rlimit {
    /// `RLIMIT_*`.
    pub resource: i32,
    /// The limit.
    pub value: u64,
}

/// A message from the service to the zygote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ToBox {
    /// Build the box (the first frame).
    Setup(Box<BoxSpec>),
    /// Start a process: `fds` descriptors ride with this frame, for its
    /// stdin, stdout and stderr in that order (each present or not).
    Spawn {
        /// The call's id, chosen by the service.
        id: u64,
        /// Program (a path, or a name looked up on the environment's PATH) and arguments.
        argv: Vec<String>,
        /// The whole environment, `NAME=value`.
        env: Vec<String>,
        /// Working directory (in the box).
        cwd: PathBuf,
        /// Under read-only: the workspace is not writable.
        read_only: bool,
        /// Which of stdin, stdout, stderr come with the frame (else /dev/null).
        stdio: [bool; 3],
        /// Limits of the process (and what it starts).
        rlimits: Vec<Rlimit>,
    },
    /// Send `signal` to the call's process group (or only its first process).
    Signal {
        /// The call.
        id: u64,
        /// The signal number.
        signal: i32,
        /// To the whole process group.
        group: bool,
    },
    /// Kill every process of the call, the ones that left its process
    /// group included, then answer [`FromBox::Ended`].
    End {
        /// The call.
        id: u64,
    },
}

/// A message from the zygote to the service.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum FromBox {
    /// The box is built and serves.
    Ready,
    /// Building the box failed at `stage`.
    SetupFailed {
        /// What was being done.
        stage: String,
        /// The error.
        error: String,
    },
    /// The call's process runs (its pid in the box).
    Started {
        /// The call.
        id: u64,
        /// Pid in the box.
        pid: i32,
    },
    /// The call's process could not start.
    SpawnFailed {
        /// The call.
        id: u64,
        /// What failed (`exec`, `chdir`, `landlock`, …).
        stage: String,
        /// The errno.
        errno: i32,
    },
    /// The call's first process ended (raw wait status).
    Exited {
        /// The call.
        id: u64,
        /// As waitpid(2) reports it.
        status: i32,
    },
    /// Every process of the call is gone.
    Ended {
        /// The call.
        id: u64,
    },
}

/// How long a frame may wait for room in the socket: the zygote reads
/// continuously, so a full socket for this long means it is wedged.
const SEND_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes one frame (with `fds` attached) to a blocking or non-blocking
/// socket, waiting for room when the socket is full.
pub fn send_frame(sock: BorrowedFd<'_>, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a control frame of {} bytes is over the limit of {MAX_FRAME}",
                payload.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    let mut sent = 0usize;
    let mut first = true;
    let start = std::time::Instant::now();
    while sent < buf.len() {
        let iov = [io::IoSlice::new(&buf[sent..])];
        let rights = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        let cmsgs: &[nix::sys::socket::ControlMessage<'_>] = if first && !fds.is_empty() {
            &rights
        } else {
            &[]
        };
        match nix::sys::socket::sendmsg::<()>(
            sock.as_raw_fd(),
            &iov,
            cmsgs,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => {
                sent += n;
                first = false;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => {
                if start.elapsed() > SEND_PATIENCE {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the sandbox's zygote has not read its control socket for 10 s",
                    ));
                }
                wait_writable(sock)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn wait_writable(sock: BorrowedFd<'_>) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, 1000) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reassembles frames from a stream, queueing the descriptors that arrive.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// What one read gave.
pub enum Read {
    /// Bytes (and maybe descriptors) were added.
    Some,
    /// The peer closed the socket.
    Eof,
    /// Nothing to read now (non-blocking socket).
    WouldBlock,
}

impl FrameReader {
    /// One `recvmsg` from `sock` into the buffer.
    pub fn read_from(&mut self, sock: BorrowedFd<'_>) -> io::Result<Read> {
        let mut chunk = vec![0u8; 64 << 10];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        loop {
            let mut iov = [io::IoSliceMut::new(&mut chunk)];
            match nix::sys::socket::recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    for c in msg.cmsgs().map_err(io::Error::from)? {
                        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = c {
                            for fd in fds {
                                // SAFETY: the kernel just installed this fd for us.
                                self.fds.push_back(unsafe { OwnedFd::from_raw_fd(fd) });
                            }
                        }
                    }
                    let n = msg.bytes;
                    if n == 0 {
                        return Ok(Read::Eof);
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(Read::Some);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return Ok(Read::WouldBlock),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The next whole frame's payload, if one is buffered.
    pub fn next_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a control frame announces {len} bytes, over the limit of {MAX_FRAME}"),
            ));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let payload = self.buf[4..4 + len].to_vec();
        self.buf.drain(..4 + len);
        Ok(Some(payload))
    }

    /// The oldest queued descriptor.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

/// Encodes a message.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    serde_json::to_vec(msg).expect("control messages serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn frames_and_descriptors_cross_a_socket_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = std::io::pipe().unwrap();
        let big = "x".repeat(300 << 10);
        let spawn = ToBox::Spawn {
            id: 7,
            argv: vec!["bash".into(), "-c".into(), big.clone()],
            env: vec!["PATH=/usr/bin".into()],
            cwd: "/w".into(),
            read_only: false,
            stdio: [false, true, false],
            rlimits: vec![],
        };
        let writer = std::thread::spawn(move || {
            use std::os::fd::AsFd;
            send_frame(a.as_fd(), &encode(&spawn), &[w.as_raw_fd()]).unwrap();
            send_frame(a.as_fd(), &encode(&ToBox::End { id: 7 }), &[]).unwrap();
            drop(w);
        });
        let mut reader = FrameReader::default();
        let mut frames = Vec::new();
        use std::os::fd::AsFd;
        while frames.len() < 2 {
            match reader.read_from(b.as_fd()).unwrap() {
                Read::Eof => break,
                _ => {
                    while let Some(f) = reader.next_frame().unwrap() {
                        frames.push(serde_json::from_slice::<ToBox>(&f).unwrap());
                    }
                }
            }
        }
        writer.join().unwrap();
        match &frames[0] {
            ToBox::Spawn { id, argv, .. } => {
                assert_eq!(*id, 7);
                assert_eq!(argv[2], big);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(frames[1], ToBox::End { id: 7 }));
        // The pipe's write end came across: writing into it reaches `r`.
        let fd = reader.take_fd().expect("one descriptor");
        let mut f = std::fs::File::from(fd);
        use std::io::{Read as _, Write as _};
        f.write_all(b"through").unwrap();
        drop(f);
        let mut got = String::new();
        let mut r = r;
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
        assert!(reader.take_fd().is_none());
    }

    #[test]
    fn an_oversized_frame_is_refused_on_both_sides() {
        let (a, _b) = UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        let e = send_frame(a.as_fd(), &vec![b'x'; MAX_FRAME + 1], &[]).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        let mut r = FrameReader::default();
        r.buf
            .extend_from_slice(&((MAX_FRAME as u32) + 1).to_le_bytes());
        assert!(r.next_frame().is_err());
    }
}
