//! What runs in the child between fork and exec.
//!
//! Everything here must be async-signal-safe: the parent is multi-threaded, so
//! the child may not allocate, lock or log. Every value was computed before the
//! fork; only raw syscalls run here, and a failure returns its errno (std sends
//! it to the parent, whose `spawn` fails with it).

use seccompiler::BpfProgram;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// One rlimit to set.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// `RLIMIT_*`.
    pub resource: libc::__rlimit_resource_t,
    /// Soft and hard values.
    pub value: libc::rlimit,
}

/// A private network namespace with only a loopback interface.
#[derive(Clone, Debug)]
pub struct NetNs {
    /// Not root: a user namespace first, mapping our own ids
    /// (`/proc/self/uid_map` and `gid_map` contents, prepared before the fork).
    pub user: Option<(Vec<u8>, Vec<u8>)>,
}

/// Everything the child applies, in order.
#[derive(Debug, Default)]
pub struct ChildSetup {
    /// `cgroup.procs` of the call's cgroup, opened for writing: the child
    /// joins it unless it was born inside (forked by a parked launcher).
    pub cgroup_procs: Option<OwnedFd>,
    /// rlimits.
    pub limits: Vec<Limit>,
    /// Enter a private network namespace (its loopback up).
    pub netns: Option<NetNs>,
    /// Drop every capability up to this number (root: an ordinary user after exec).
    pub drop_caps_upto: Option<u32>,
    /// Set PR_SET_NO_NEW_PRIVS.
    pub no_new_privs: bool,
    /// A Landlock ruleset to enforce.
    pub landlock: Option<OwnedFd>,
    /// A seccomp program to install.
    pub seccomp: Option<Arc<BpfProgram>>,
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Writes `data` to the file at `path`. Async-signal-safe.
fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd as libc::c_long)?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// Unshares the network namespace (and the user namespace when not root)
/// and brings its loopback up. Async-signal-safe.
fn enter_netns(ns: &NetNs) -> io::Result<()> {
    let mut flags = libc::CLONE_NEWNET;
    if ns.user.is_some() {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: unshare(2) with flags.
    check(unsafe { libc::unshare(flags) } as libc::c_long)?;
    if let Some((uid_map, gid_map)) = &ns.user {
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", uid_map)?;
        write_file(c"/proc/self/gid_map", gid_map)?;
    }
    // SAFETY: a datagram socket and two ioctls on a zeroed ifreq naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(fd as libc::c_long)?;
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

impl ChildSetup {
    /// Applies the setup to the calling process. Async-signal-safe.
    /// `join_cgroup`: write to `cgroup_procs` (false when the process was
    /// born in the cgroup: the write would be a migration, an RCU grace period).
    pub fn enter(&self, join_cgroup: bool) -> io::Result<()> {
        if let Some(fd) = self.cgroup_procs.as_ref().filter(|_| join_cgroup) {
            // SAFETY: write(2) of a static buffer to an fd we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            check(n as libc::c_long)?;
        }
        for l in &self.limits {
            // SAFETY: setrlimit(2) with a valid struct.
            check(unsafe { libc::setrlimit(l.resource, &l.value) } as libc::c_long)?;
        }
        // Before the capability drop: root needs CAP_SYS_ADMIN to unshare.
        if let Some(ns) = &self.netns {
            enter_netns(ns)?;
        }
        if let Some(last) = self.drop_caps_upto {
            for cap in 0..=last {
                // SAFETY: prctl(2) with integer arguments.
                let rc =
                    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
                // EINVAL: a capability this kernel does not know.
                if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                    return Err(io::Error::last_os_error());
                }
            }
            // SAFETY: prctl(2) with integer arguments.
            check(unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                    0,
                    0,
                    0,
                )
            } as libc::c_long)?;
            let header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let data = [CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            // SAFETY: capset(2) with a v3 header and two data structs, as the ABI requires.
            check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) })?;
        }
        if self.no_new_privs {
            // SAFETY: prctl(2) with integer arguments.
            check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)?;
        }
        if let Some(fd) = &self.landlock {
            // SAFETY: landlock_restrict_self(2) on a ruleset fd we own, no flags.
            check(unsafe {
                libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32)
            })?;
        }
        if let Some(prog) = &self.seccomp {
            // Last: the filter must not stand in the way of the steps above.
            seccompiler::apply_filter(prog).map_err(|e| match e {
                seccompiler::Error::Prctl(io) | seccompiler::Error::Seccomp(io) => io,
                _ => io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        Ok(())
    }
}
