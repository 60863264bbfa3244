//! Landlock: which paths a sandboxed process may read, write and execute.
//!
//! The ruleset is built in the parent (opening every root, adding every rule)
//! and only `landlock_restrict_self` runs in the child. System roots are opened
//! once per [`crate::Sandbox`] and reused by every ruleset.

use crate::SandboxError;
use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The ABI whose rights we ask for (best effort below it). V6 brings the
/// signal and abstract-unix-socket scopes.
const TARGET_ABI: ABI = ABI::V6;

/// Device files every confined process may read and write (with ioctl: terminals).
const RW_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];
/// Device files every confined process may read.
const RO_DEVICES: &[&str] = &["/dev/random", "/dev/urandom"];

/// What the running kernel offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockSupport {
    /// Landlock with this ABI version.
    Available(i32),
    /// No Landlock (not built, not enabled, or simulated by the test hook).
    Missing,
}

/// Asks the kernel for its Landlock ABI version.
pub fn probe() -> LandlockSupport {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attr only returns the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v > 0 {
        LandlockSupport::Available(v as i32)
    } else {
        LandlockSupport::Missing
    }
}

fn read_exec() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute
}

/// Every right but making device nodes: a writable root must not become a
/// way to create `/dev/sda` under another name.
fn read_write() -> BitFlags<AccessFs> {
    AccessFs::from_all(TARGET_ABI) & !(AccessFs::MakeChar | AccessFs::MakeBlock)
}

fn file_rights() -> BitFlags<AccessFs> {
    AccessFs::from_file(TARGET_ABI)
}

/// An opened root and the rights it gets.
#[derive(Debug)]
struct OpenRoot {
    fd: PathFd,
    access: BitFlags<AccessFs>,
}

fn open_root(path: &Path, access: BitFlags<AccessFs>) -> Option<OpenRoot> {
    let meta = std::fs::metadata(path).ok()?;
    let fd = PathFd::new(path).ok()?;
    // A rule on a file may only carry file rights.
    let access = if meta.is_dir() {
        access
    } else {
        access & file_rights()
    };
    Some(OpenRoot { fd, access })
}

/// `root`, or, when a hidden path lies beneath it, its children minus the
/// hidden ones (recursively): Landlock only allows, so hiding means not adding.
fn expand(root: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if hidden.iter().any(|h| h == root) {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(root)) {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut children: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    children.sort();
    for c in children {
        expand(&c, hidden, out);
    }
}

/// The system part of every ruleset, opened once.
#[derive(Debug)]
pub struct SystemRoots {
    roots: Vec<OpenRoot>,
}

impl SystemRoots {
    /// Opens the read roots (minus `hidden`), the devices and, when
    /// `/etc/resolv.conf` is a symlink out of `/etc`, its target.
    pub fn open(read_roots: &[PathBuf], hidden: &[PathBuf]) -> Self {
        // Hidden paths are compared with canonical roots: /bin may be /usr/bin.
        let hidden: Vec<PathBuf> = hidden
            .iter()
            .map(|h| h.canonicalize().unwrap_or_else(|_| h.clone()))
            .collect();
        let mut paths = Vec::new();
        for r in read_roots {
            if let Ok(c) = r.canonicalize() {
                expand(&c, &hidden, &mut paths);
            }
        }
        if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf")
            && !target.starts_with("/etc")
        {
            paths.push(target);
        }
        paths.sort();
        paths.dedup();
        let mut roots: Vec<OpenRoot> = paths
            .iter()
            .filter_map(|p| open_root(p, read_exec()))
            .collect();
        for d in RW_DEVICES {
            roots.extend(open_root(Path::new(d), read_write() | AccessFs::IoctlDev));
        }
        for d in RO_DEVICES {
            roots.extend(open_root(Path::new(d), AccessFs::ReadFile.into()));
        }
        Self { roots }
    }

    /// How many rules the system part adds.
    pub fn rule_count(&self) -> usize {
        self.roots.len()
    }
}

/// The roots of one ruleset beyond the system part.
#[derive(Debug, Default)]
pub struct CallRoots<'a> {
    /// Readable and executable.
    pub read: Vec<&'a Path>,
    /// Readable, executable and writable.
    pub write: Vec<&'a Path>,
}

/// Builds a ruleset and returns its fd, ready for `landlock_restrict_self`
/// in the child. Roots that do not exist are skipped.
pub fn build_ruleset(system: &SystemRoots, call: &CallRoots<'_>) -> Result<OwnedFd, SandboxError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))?
        .scope(Scope::from_all(TARGET_ABI))?
        .create()?;
    for r in &system.roots {
        ruleset = ruleset.add_rule(PathBeneath::new(r.fd.as_fd(), r.access))?;
    }
    let call_roots = call
        .read
        .iter()
        .map(|p| (*p, read_exec()))
        .chain(call.write.iter().map(|p| (*p, read_write())));
    for (path, access) in call_roots {
        if let Some(r) = open_root(path, access) {
            ruleset = ruleset.add_rule(PathBeneath::new(r.fd.as_fd(), r.access))?;
        }
    }
    let fd: Option<OwnedFd> = ruleset.into();
    fd.ok_or(SandboxError::LandlockRuleset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hiding_expands_only_the_ancestors_of_hidden_paths() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for p in [
            "etc/ssl/certs",
            "etc/ssl/private",
            "etc/ssh",
            "etc/apt",
            "usr/lib",
        ] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::fs::write(root.join("etc/shadow"), "x").unwrap();
        let hidden = vec![
            root.join("etc/shadow"),
            root.join("etc/ssh"),
            root.join("etc/ssl/private"),
        ];
        let mut out = Vec::new();
        expand(&root.join("etc"), &hidden, &mut out);
        expand(&root.join("usr"), &hidden, &mut out);
        assert_eq!(
            out,
            vec![
                root.join("etc/apt"),
                root.join("etc/ssl/certs"),
                root.join("usr")
            ]
        );
    }

    #[test]
    fn this_kernel_offers_landlock() {
        // The project's machines run ABI 7; a missing Landlock here means the
        // sandbox tests below would test nothing.
        assert!(
            matches!(probe(), LandlockSupport::Available(v) if v >= 1),
            "{:?}",
            probe()
        );
    }
}
