//! What a box looks like: its mounts, its Landlock paths and its socket
//! domains, computed by the service from the config and the session.

use crate::SandboxConfig;
use crate::wire::{LandlockSpec, Mount};
use std::path::{Path, PathBuf};

/// Where things are in a box's view.
pub const BOX_TMP: &str = "/tmp";
/// The home of boxed processes (in the box's tmpfs).
pub const BOX_HOME: &str = "/tmp/home";
/// The name of omicos's own state in a workspace, hidden from boxes.
pub const STATE_DIR: &str = ".omicos";

/// Devices read and written by boxed processes (ioctl allowed: terminals).
const DEVICES_RW: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];
/// Devices only read.
const DEVICES_RO: &[&str] = &["/dev/random", "/dev/urandom"];

/// The part of every box's view that depends only on the config: system
/// directories (symlinks kept as symlinks, as on merged-/usr systems),
/// `/proc`, `/dev`, `/tmp`, the home, resolv.conf's target, hidden paths.
pub(crate) fn system_mounts(config: &SandboxConfig) -> (Vec<Mount>, Vec<PathBuf>) {
    let mut mounts = Vec::new();
    let mut read = Vec::new();
    for root in &config.system_read_roots {
        if root == Path::new("/proc") || root == Path::new("/sys") {
            continue;
        }
        match std::fs::symlink_metadata(root) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(root) {
                    mounts.push(Mount::Symlink {
                        dst: root.clone(),
                        target,
                    });
                }
            }
            Ok(_) => {
                let src = root.canonicalize().unwrap_or_else(|_| root.clone());
                mounts.push(Mount::Bind {
                    src,
                    dst: root.clone(),
                    writable: false,
                    idmap: false,
                    required: false,
                });
                read.push(root.clone());
            }
            Err(_) => {}
        }
    }
    if config.mount_sys && Path::new("/sys").is_dir() {
        mounts.push(Mount::Bind {
            src: "/sys".into(),
            dst: "/sys".into(),
            writable: false,
            idmap: false,
            required: false,
        });
        // Other boxes' cgroups (their ids and usage) are not this box's business.
        mounts.push(Mount::Hide {
            dst: "/sys/fs/cgroup".into(),
        });
        read.push("/sys".into());
    }
    mounts.push(Mount::Proc);
    read.push("/proc".into());
    mounts.push(Mount::Dev {
        shm_bytes: config.session_limits.shm_bytes,
    });
    mounts.push(Mount::Tmpfs {
        dst: BOX_TMP.into(),
        size_bytes: config.session_limits.tmp_bytes,
    });
    mounts.push(Mount::OwnedDir {
        dst: BOX_HOME.into(),
    });
    // resolv.conf often points into /run (systemd-resolved): bind that file alone.
    if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf")
        && !target.starts_with("/etc")
    {
        mounts.push(Mount::Bind {
            src: target.clone(),
            dst: target.clone(),
            writable: false,
            idmap: false,
            required: false,
        });
        read.push(target);
    }
    (mounts, read)
}

/// Adds `path` to `out` unless a path already there contains it.
fn push_unique(out: &mut Vec<PathBuf>, path: PathBuf) {
    if out.iter().any(|p| path.starts_with(p)) {
        return;
    }
    out.retain(|p| !p.starts_with(&path));
    out.push(path);
}

/// The whole view of one box.
pub(crate) struct View {
    pub mounts: Vec<Mount>,
    pub landlock: LandlockSpec,
}

/// Builds the view: the system part, then the workspace (read-write,
/// idmapped; its `.omicos/` hidden), the extra read and write directories,
/// the private directory, and the hidden paths last.
#[allow(clippy::too_many_arguments)]
pub(crate) fn view(
    config: &SandboxConfig,
    system: &(Vec<Mount>, Vec<PathBuf>),
    workspace: &Path,
    writable: bool,
    read: &[PathBuf],
    write: &[PathBuf],
    bind: &[(PathBuf, PathBuf, bool)],
    private: &Path,
    landlock: bool,
) -> View {
    let mut mounts = system.0.clone();
    mounts.push(Mount::Bind {
        src: workspace.to_path_buf(),
        dst: workspace.to_path_buf(),
        writable,
        idmap: true,
        required: true,
    });
    mounts.push(Mount::Hide {
        dst: workspace.join(STATE_DIR),
    });
    let mut ro: Vec<PathBuf> = Vec::new();
    for p in read.iter().chain(&config.read_roots) {
        let c = p.canonicalize().unwrap_or_else(|_| p.clone());
        // Under the workspace it is already in the view (and stays writable).
        if !c.starts_with(workspace) {
            push_unique(&mut ro, c);
        }
    }
    let mut rw: Vec<PathBuf> = Vec::new();
    for p in write.iter().chain(&config.write_roots) {
        let c = p.canonicalize().unwrap_or_else(|_| p.clone());
        if !c.starts_with(workspace) {
            push_unique(&mut rw, c);
        }
    }
    // Parents before children, so that a bind inside another lands on top.
    let mut extra: Vec<(PathBuf, bool)> = ro
        .iter()
        .map(|p| (p.clone(), false))
        .chain(rw.iter().map(|p| (p.clone(), true)))
        .collect();
    extra.sort_by_key(|(p, _)| p.components().count());
    for (p, writable) in &extra {
        mounts.push(Mount::Bind {
            src: p.clone(),
            dst: p.clone(),
            writable: *writable,
            idmap: *writable,
            required: false,
        });
    }
    let mut moved_ro = Vec::new();
    let mut moved_rw = Vec::new();
    for (src, dst, writable) in bind {
        mounts.push(Mount::Bind {
            src: src.clone(),
            dst: dst.clone(),
            writable: *writable,
            idmap: *writable,
            required: true,
        });
        if *writable {
            moved_rw.push(dst.clone());
        } else {
            moved_ro.push(dst.clone());
        }
    }
    mounts.push(Mount::Bind {
        src: private.to_path_buf(),
        dst: private.to_path_buf(),
        writable: true,
        idmap: false,
        required: true,
    });
    for h in &config.hidden {
        mounts.push(Mount::Hide { dst: h.clone() });
    }
    let mut spec = LandlockSpec {
        enabled: landlock,
        read: system.1.clone(),
        workspace: vec![workspace.to_path_buf()],
        write: vec![BOX_TMP.into(), "/dev/shm".into(), private.to_path_buf()],
        devices_rw: DEVICES_RW.iter().map(PathBuf::from).collect(),
        devices_ro: DEVICES_RO.iter().map(PathBuf::from).collect(),
        // Only the view is beneath it: listing names reveals nothing else.
        list: vec![PathBuf::from("/")],
    };
    spec.read.extend(ro);
    spec.read.extend(moved_ro);
    spec.write.extend(rw);
    spec.write.extend(moved_rw);
    View {
        mounts,
        landlock: spec,
    }
}

/// The Landlock paths of a box without namespaces (`warn`): host paths,
/// the private directory's `tmp` for `/tmp`.
pub(crate) fn host_landlock(
    config: &SandboxConfig,
    workspace: &Path,
    read: &[PathBuf],
    write: &[PathBuf],
    private: &Path,
    landlock: bool,
) -> LandlockSpec {
    let mut spec = LandlockSpec {
        enabled: landlock,
        read: config
            .system_read_roots
            .iter()
            .chain(read)
            .chain(&config.read_roots)
            .cloned()
            .collect(),
        workspace: vec![workspace.to_path_buf()],
        write: vec![private.to_path_buf()],
        devices_rw: DEVICES_RW.iter().map(PathBuf::from).collect(),
        devices_ro: DEVICES_RO.iter().map(PathBuf::from).collect(),
        list: Vec::new(),
    };
    spec.write
        .extend(write.iter().chain(&config.write_roots).cloned());
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_hides_state_and_orders_binds_parents_first() {
        let config = SandboxConfig {
            hidden: vec!["/etc/shadow".into()],
            ..SandboxConfig::default()
        };
        let system = system_mounts(&config);
        let ws = tempfile::tempdir().unwrap();
        let ws = ws.path().canonicalize().unwrap();
        let a = tempfile::tempdir().unwrap();
        let a = a.path().canonicalize().unwrap();
        let nested = a.join("lib");
        std::fs::create_dir_all(&nested).unwrap();
        let v = view(
            &config,
            &system,
            &ws,
            true,
            &[nested.clone(), a.clone(), ws.join("venv")],
            &[],
            &[],
            Path::new("/run/x/b-1"),
            true,
        );
        // The workspace's own state is hidden right after the workspace.
        let pos = |m: &Mount| v.mounts.iter().position(|x| x == m).unwrap();
        let ws_bind = v
            .mounts
            .iter()
            .position(|m| matches!(m, Mount::Bind { dst, .. } if dst == &ws))
            .unwrap();
        assert_eq!(
            pos(&Mount::Hide {
                dst: ws.join(".omicos")
            }),
            ws_bind + 1
        );
        // `a` covers `a/lib`; the workspace's venv is already in the view.
        let binds: Vec<&PathBuf> = v
            .mounts
            .iter()
            .filter_map(|m| match m {
                Mount::Bind { dst, .. } => Some(dst),
                _ => None,
            })
            .collect();
        assert!(binds.contains(&&a));
        assert!(!binds.contains(&&nested));
        assert!(!binds.contains(&&ws.join("venv")));
        // /tmp comes before anything that may live under it.
        let tmp = v
            .mounts
            .iter()
            .position(|m| matches!(m, Mount::Tmpfs { dst, .. } if dst == Path::new("/tmp")))
            .unwrap();
        assert!(tmp < ws_bind);
        assert!(
            matches!(v.mounts.last(), Some(Mount::Hide { dst }) if dst == Path::new("/etc/shadow"))
        );
        assert_eq!(v.landlock.workspace, vec![ws]);
    }
}
