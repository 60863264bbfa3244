//! Landlock: which paths a sandboxed process may read, write and execute.
//!
//! A box's init builds the two rulesets (read-only and workspace-write)
//! from the paths of its view, once; each call's process only runs
//! `landlock_restrict_self` on one of them before exec.

use crate::SandboxError;
use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The ABI whose rights we ask for (best effort below it). V6 brings the
/// signal and abstract-unix-socket scopes.
const TARGET_ABI: ABI = ABI::V6;

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

/// The ruleset a boxed call runs under, built inside the box from the
/// paths of its view: read+execute beneath `read`, the workspace readable
/// or (`workspace_writable`) writable, `write` writable, the devices.
pub fn box_ruleset(
    spec: &crate::wire::LandlockSpec,
    workspace_writable: bool,
) -> Result<OwnedFd, SandboxError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))?
        .scope(Scope::from_all(TARGET_ABI))?
        .create()?;
    let ws_access = if workspace_writable {
        read_write()
    } else {
        read_exec()
    };
    let rules = spec
        .read
        .iter()
        .map(|p| (p, read_exec()))
        .chain(spec.workspace.iter().map(|p| (p, ws_access)))
        .chain(spec.write.iter().map(|p| (p, read_write())))
        .chain(
            spec.devices_rw
                .iter()
                .map(|p| (p, read_write() | AccessFs::IoctlDev)),
        )
        .chain(
            spec.devices_ro
                .iter()
                .map(|p| (p, AccessFs::ReadFile.into())),
        )
        .chain(spec.list.iter().map(|p| (p, AccessFs::ReadDir.into())));
    for (path, access) in rules {
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
