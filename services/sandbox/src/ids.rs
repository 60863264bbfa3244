//! The user ids boxes run as when the service is root: one per box, from
//! the configured range, leased with an exclusive `flock` on a file named
//! after it in a directory shared by every omicos process of the host. A
//! lease ends with its holder (the kernel drops the lock when the process
//! dies), so a crashed service never strands ids.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// A uid held for one box.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: File,
}

impl UidLease {
    /// The uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

/// Takes a free uid of `start..start+count`, trying from a random point so
/// that concurrent takers rarely meet.
pub fn lease(dir: &Path, start: u32, count: u32) -> io::Result<UidLease> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let offset = rand_u32() % count.max(1);
    for i in 0..count {
        let uid = start + (offset + i) % count;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(dir.join(uid.to_string()))?;
        // SAFETY: flock(2) on a file we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(UidLease { uid, _lock: file });
        }
    }
    Err(io::Error::other(format!(
        "every uid of the sandbox's range {start}..{} is in use (raise sandbox.uid_count)",
        start as u64 + count as u64
    )))
}

fn rand_u32() -> u32 {
    let b = uuid::Uuid::new_v4();
    let b = b.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_until_dropped() {
        let d = tempfile::tempdir().unwrap();
        let a = lease(d.path(), 5000, 2).unwrap();
        let b = lease(d.path(), 5000, 2).unwrap();
        assert_ne!(a.uid(), b.uid());
        let e = lease(d.path(), 5000, 2).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        let freed = a.uid();
        drop(a);
        assert_eq!(lease(d.path(), 5000, 2).unwrap().uid(), freed);
    }
}
