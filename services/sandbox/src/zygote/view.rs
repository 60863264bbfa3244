//! The box's filesystem view, built the way bubblewrap builds one: in a
//! private mount namespace, a staging tmpfs becomes the root with the host's
//! root under `/oldroot`; the view is assembled under `/newroot` from binds
//! of `/oldroot/...`, a fresh `/proc`, a minimal `/dev` and tmpfs
//! directories; then `/newroot` becomes `/` and the host's root is detached.

use super::{StageError, check};
use crate::wire::{BoxSpec, Identity, Mount};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cstr(p: &Path) -> Result<CString, StageError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| StageError::new(format!("path {}", p.display()), "contains a NUL byte"))
}

/// `root` + an absolute `path` (`/newroot` + `/usr` → `/newroot/usr`).
fn under(root: &str, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    Path::new(root).join(rel)
}

fn mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), StageError> {
    let src_c = src.map(cstr).transpose()?;
    let dst_c = cstr(dst)?;
    let fs_c = fstype.map(|f| CString::new(f).expect("static fs name"));
    let data_c = data.map(|d| CString::new(d).expect("mount data has no NUL"));
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            dst_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    check(rc as libc::c_long, || {
        format!(
            "mount {} on {}",
            src.map(|s| s.display().to_string())
                .or_else(|| fstype.map(str::to_owned))
                .unwrap_or_default(),
            dst.display()
        )
    })
}

/// Sets mount attributes on the mount at `path` (and, `recursive`, below it).
fn setattr(
    path: &Path,
    set: u64,
    recursive: bool,
    userns: Option<&OwnedFd>,
) -> Result<(), StageError> {
    let c = cstr(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |f| f.as_raw_fd() as u64),
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr(2) on a NUL-terminated path with a live struct of the right size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc, || format!("set the attributes of {}", path.display()))
}

/// Makes the directories leading to `dst` and `dst` itself: a directory, or
/// an empty file when `file`. Refuses a symlink on the way (a mount would
/// follow it somewhere else).
fn make_point(dst: &Path, file: bool) -> Result<(), StageError> {
    let mut cur = PathBuf::from("/");
    let comps: Vec<_> = dst.components().skip(1).collect();
    for (i, comp) in comps.iter().enumerate() {
        cur.push(comp);
        let last = i + 1 == comps.len();
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(StageError::new(
                    format!("make the mount point {}", dst.display()),
                    format!("{} is a symlink", cur.display()),
                ));
            }
            Ok(_) => {}
            Err(_) if last && file => {
                std::fs::File::create(&cur).map_err(|e| {
                    StageError::new(format!("make the mount point {}", dst.display()), e)
                })?;
            }
            Err(_) => {
                std::fs::create_dir(&cur).map_err(|e| {
                    StageError::new(format!("make the mount point {}", dst.display()), e)
                })?;
            }
        }
    }
    Ok(())
}

fn bind(src: &Path, dst: &Path, writable: bool, idmap: Option<&OwnedFd>) -> Result<(), StageError> {
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if !writable {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    if let Some(userns) = idmap {
        // A detached copy of the tree, idmapped, then attached at dst.
        let c = cstr(src)?;
        // SAFETY: open_tree(2) on a NUL-terminated path.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                c.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
            )
        };
        check(fd, || format!("open_tree {}", src.display()))?;
        // SAFETY: fd was just returned to us.
        let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let attr = MountAttr {
            attr_set: attrs | MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        let empty = c"";
        // SAFETY: mount_setattr(2) on the detached tree's fd.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        check(rc, || {
            format!(
                "idmap {} (the filesystem may not support idmapped mounts; set sandbox.idmap: false)",
                src.display()
            )
        })?;
        let d = cstr(dst)?;
        // SAFETY: move_mount(2) from the detached tree to a NUL-terminated path.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_FDCWD,
                d.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        return check(rc, || {
            format!("attach {} at {}", src.display(), dst.display())
        });
    }
    mount(
        Some(src),
        dst,
        None,
        (libc::MS_BIND | libc::MS_REC) as libc::c_ulong,
        None,
    )?;
    setattr(dst, attrs, true, None)
}

fn tmpfs(dst: &Path, mode: &str, size: u64) -> Result<(), StageError> {
    mount(
        Some(Path::new("tmpfs")),
        dst,
        Some("tmpfs"),
        (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong,
        Some(&format!("mode={mode},size={size}")),
    )
}

fn symlink(target: &Path, dst: &Path) -> Result<(), StageError> {
    if let Some(parent) = dst.parent() {
        make_point(parent, false)?;
    }
    std::os::unix::fs::symlink(target, dst).map_err(|e| {
        StageError::new(
            format!("symlink {} -> {}", dst.display(), target.display()),
            e,
        )
    })
}

fn dev(shm_bytes: u64) -> Result<(), StageError> {
    let dev = Path::new("/newroot/dev");
    make_point(dev, false)?;
    tmpfs(dev, "0755", 1 << 20)?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let dst = dev.join(name);
        make_point(&dst, true)?;
        // A bind of the host's node keeps its devices usable (the bind is
        // its own mount, without the tmpfs's nodev).
        mount(
            Some(&Path::new("/oldroot/dev").join(name)),
            &dst,
            None,
            libc::MS_BIND as libc::c_ulong,
            None,
        )?;
        setattr(&dst, MOUNT_ATTR_NOSUID, false, None)?;
    }
    let pts = dev.join("pts");
    make_point(&pts, false)?;
    mount(
        Some(Path::new("devpts")),
        &pts,
        Some("devpts"),
        (libc::MS_NOSUID | libc::MS_NOEXEC) as libc::c_ulong,
        Some("newinstance,ptmxmode=0666,mode=620"),
    )?;
    let shm = dev.join("shm");
    make_point(&shm, false)?;
    tmpfs(&shm, "1777", shm_bytes)?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(Path::new(target), &dev.join(link))?;
    }
    // Nothing new appears in /dev itself.
    setattr(dev, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, false, None)
}

/// The host's `/etc/<file>` with `line` appended, bound read-only over the view's.
fn account_file(file: &str, line: &str) -> Result<(), StageError> {
    let dst = Path::new("/newroot/etc").join(file);
    if std::fs::symlink_metadata(&dst).is_err() {
        return Ok(());
    }
    let mut text =
        std::fs::read_to_string(Path::new("/oldroot/etc").join(file)).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    let staged = Path::new("/").join(file);
    std::fs::write(&staged, text)
        .map_err(|e| StageError::new(format!("write the box's {file}"), e))?;
    mount(
        Some(&staged),
        &dst,
        None,
        libc::MS_BIND as libc::c_ulong,
        None,
    )?;
    setattr(
        &dst,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
        None,
    )
}

fn hide(dst: &Path) -> Result<(), StageError> {
    let Ok(meta) = std::fs::symlink_metadata(dst) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Err(StageError::new(
            format!("hide {}", dst.display()),
            "it is a symlink: refusing to mount over what it points to",
        ));
    }
    if meta.is_dir() {
        tmpfs(dst, "0555", 4096)?;
        setattr(
            dst,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            false,
            None,
        )
    } else {
        mount(
            Some(Path::new("/empty")),
            dst,
            None,
            libc::MS_BIND as libc::c_ulong,
            None,
        )?;
        setattr(
            dst,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            false,
            None,
        )
    }
}

fn pivot_root(new_root: &str, put_old: &str) -> Result<(), StageError> {
    let n = CString::new(new_root).expect("static path");
    let o = CString::new(put_old).expect("static path");
    // SAFETY: pivot_root(2) with NUL-terminated paths.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) };
    check(rc, || format!("pivot_root({new_root}, {put_old})"))
}

fn chdir(p: &str) -> Result<(), StageError> {
    std::env::set_current_dir(p).map_err(|e| StageError::new(format!("chdir {p}"), e))
}

/// Builds the view of `spec` and makes it the root.
pub(super) fn build(spec: &BoxSpec, idmap: Option<&OwnedFd>) -> Result<(), StageError> {
    let (uid, gid) = (spec.identity.uid(), spec.identity.gid());
    // Nothing we mount propagates back to the host.
    mount(
        None,
        Path::new("/"),
        None,
        (libc::MS_REC | libc::MS_PRIVATE) as libc::c_ulong,
        None,
    )?;
    tmpfs(Path::new("/tmp"), "0755", 1 << 20)?;
    chdir("/tmp")?;
    make_point(Path::new("/tmp/newroot"), false)?;
    mount(
        Some(Path::new("/tmp/newroot")),
        Path::new("/tmp/newroot"),
        None,
        (libc::MS_BIND | libc::MS_REC) as libc::c_ulong,
        None,
    )?;
    make_point(Path::new("/tmp/oldroot"), false)?;
    pivot_root("/tmp", "/tmp/oldroot")?;
    chdir("/")?;
    std::fs::write("/empty", b"").map_err(|e| StageError::new("write /empty", e))?;
    for m in &spec.mounts {
        match m {
            Mount::Bind {
                src,
                dst,
                writable,
                idmap: wants_idmap,
                required,
            } => {
                let host = under("/oldroot", src);
                let meta = match std::fs::metadata(&host) {
                    Ok(m) => m,
                    Err(e) if *required => {
                        return Err(StageError::new(format!("bind {}", src.display()), e));
                    }
                    Err(_) => continue,
                };
                let view = under("/newroot", dst);
                make_point(&view, !meta.is_dir())?;
                let mapped = match (&spec.identity, wants_idmap) {
                    (Identity::Privileged { idmap: true, .. }, true) => idmap,
                    _ => None,
                };
                bind(&host, &view, *writable, mapped)?;
            }
            Mount::Symlink { dst, target } => symlink(target, &under("/newroot", dst))?,
            Mount::Tmpfs { dst, size_bytes } => {
                let view = under("/newroot", dst);
                make_point(&view, false)?;
                tmpfs(&view, "1777", *size_bytes)?;
            }
            Mount::Hide { dst } => hide(&under("/newroot", dst))?,
            Mount::Proc => {
                let view = Path::new("/newroot/proc");
                make_point(view, false)?;
                mount(
                    Some(Path::new("proc")),
                    view,
                    Some("proc"),
                    (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as libc::c_ulong,
                    None,
                )?;
            }
            Mount::Dev { shm_bytes } => dev(*shm_bytes)?,
            Mount::OwnedDir { dst } => {
                let view = under("/newroot", dst);
                make_point(&view, false)?;
                let c = cstr(&view)?;
                // SAFETY: chown/chmod on a NUL-terminated path we just made.
                unsafe {
                    libc::chown(c.as_ptr(), uid, gid);
                    libc::chmod(c.as_ptr(), 0o700);
                }
            }
        }
    }
    account_file("passwd", &spec.passwd_line)?;
    account_file("group", &spec.group_line)?;
    // The root of the view itself takes nothing new.
    setattr(
        Path::new("/newroot"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
        None,
    )?;
    chdir("/newroot")?;
    pivot_root(".", ".")?;
    let dot = c".";
    // SAFETY: umount2(2) on the stacked old root.
    check(
        unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } as libc::c_long,
        || "detach the host's root".into(),
    )?;
    chdir("/")
}
