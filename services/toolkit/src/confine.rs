//! Workspace path confinement: no path may resolve outside the workspace,
//! through `..`, an absolute path, or a symlink; and, for the tools that
//! take a path ([`confine_tool_path`]), none into the workspace's
//! `.omicos/`, omicos's own state.

use nix::fcntl::{AT_FDCWD, OFlag, openat, renameat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// A path that would leave the workspace, or cannot be checked.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ConfineError {
    /// The path resolves outside the workspace.
    #[error("path `{0}` is outside the workspace")]
    Escapes(String),
    /// The path resolves into the workspace's [`STATE_DIR`].
    #[error(
        "path `{0}` is inside .omicos/, omicos's own state (the stores, other sessions' \
         outputs, other tenants' workspaces): no tool reads or writes it"
    )]
    State(String),
    /// The path is not usable (NUL byte, workspace missing).
    #[error("path `{path}` is not usable: {why}")]
    Invalid {
        /// The path as given.
        path: String,
        /// Why.
        why: String,
    },
}

/// Resolves `user_path` (relative to `root`, or absolute inside it) to a real
/// path inside `root`. Symlinks are followed for every existing component, so
/// a link that points out of the workspace is refused. The path need not exist.
pub fn confine_path(root: &Path, user_path: &str) -> Result<PathBuf, ConfineError> {
    if user_path.contains('\0') {
        return Err(ConfineError::Invalid {
            path: user_path.escape_debug().to_string(),
            why: "contains a NUL byte".into(),
        });
    }
    let root = root.canonicalize().map_err(|e| ConfineError::Invalid {
        path: root.display().to_string(),
        why: format!("workspace cannot be resolved: {e}"),
    })?;
    let given = Path::new(user_path);
    let joined = if given.is_absolute() {
        given.to_path_buf()
    } else {
        root.join(given)
    };
    // Lexical normalization first: `a/../../x` must not pass even if `a` is missing.
    let mut lexical = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                if !lexical.pop() {
                    return Err(ConfineError::Escapes(user_path.into()));
                }
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    if !lexical.starts_with(&root) {
        return Err(ConfineError::Escapes(user_path.into()));
    }
    // Then resolve symlinks of the deepest existing ancestor.
    let mut existing = lexical.clone();
    let mut rest = Vec::new();
    while !existing.exists() && existing.symlink_metadata().is_err() {
        match existing.file_name() {
            Some(name) => {
                rest.push(name.to_owned());
                existing.pop();
            }
            None => break,
        }
    }
    let mut resolved = existing.canonicalize().map_err(|_| {
        // A dangling symlink: refuse, since we cannot tell where it points.
        ConfineError::Escapes(user_path.into())
    })?;
    for name in rest.iter().rev() {
        resolved.push(name);
    }
    if resolved.starts_with(&root) {
        Ok(resolved)
    } else {
        Err(ConfineError::Escapes(user_path.into()))
    }
}

/// omicos's own state in a workspace (`<workspace>/.omicos/`): the stores,
/// the token, trajectories, sessions' outputs and spooled results, and, in
/// the default tenant's workspace, every other tenant's workspace
/// (`.omicos/tenants/<t>/`).
pub const STATE_DIR: &str = ".omicos";

/// [`confine_path`] for a path a tool call names: also refused when the real
/// path (symlinks resolved) is [`STATE_DIR`] or lies under it, whether the
/// path names it or a link planted in the workspace leads there. A tool that
/// reads a session's own files there (the file tools) decides that itself.
pub fn confine_tool_path(root: &Path, user_path: &str) -> Result<PathBuf, ConfineError> {
    let path = confine_path(root, user_path)?;
    // confine_path answered a path under the resolved root.
    let root = root.canonicalize().map_err(|e| ConfineError::Invalid {
        path: root.display().to_string(),
        why: format!("workspace cannot be resolved: {e}"),
    })?;
    if is_state(&root, &path) {
        return Err(ConfineError::State(user_path.into()));
    }
    Ok(path)
}

/// Whether `path` (resolved, under the resolved `root`) is in `root`'s
/// [`STATE_DIR`].
pub fn is_state(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root)
        .ok()
        .and_then(|p| p.components().next())
        .is_some_and(|c| c.as_os_str() == STATE_DIR)
}

/// How [`open_confined`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenFor {
    /// Read it.
    Read,
    /// Write it whole: created when missing (with its directories), emptied otherwise.
    Write,
    /// Add at its end: created when missing (with its directories).
    Append,
}

/// Opens `path`, a path [`confine_path`] answered under `root`, exactly
/// where it was checked: every directory from `root` down is opened without
/// following a symlink (and made, for a write, when missing), and so is the
/// file. A check and the open are two moments; a process of the session's
/// box may swap a directory on the way for a symlink in between (into
/// `.omicos/`, another tenant's workspace, or out of the workspace). Then
/// the open fails (`ELOOP`, `ENOTDIR`) instead of following it. `root`'s own
/// path is trusted (the deployment's, or a tenant's under `.omicos/`).
pub fn open_confined(root: &Path, path: &Path, how: OpenFor) -> std::io::Result<std::fs::File> {
    let (dir, name) = confined_parent(root, path, how != OpenFor::Read)?;
    let flags = OFlag::O_NOFOLLOW
        | match how {
            OpenFor::Read => OFlag::O_RDONLY,
            OpenFor::Write => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
            OpenFor::Append => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND,
        };
    Ok(std::fs::File::from(open_at(&dir, name, flags)?))
}

/// Replaces the file at `path` (a path [`confine_path`] answered under
/// `root`) with `bytes` at once: written to a new file beside it, then
/// renamed over it, both in its directory as opened by [`open_confined`]'s
/// walk (no symlink followed), so neither the write nor the rename can be
/// redirected.
pub fn replace_confined(root: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let (dir, name) = confined_parent(root, path, true)?;
    let tmp = std::ffi::OsString::from(format!(
        ".{}.omicos-tmp-{}",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    let file = open_at(
        &dir,
        tmp.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
    )?;
    let written = std::fs::File::from(file)
        .write_all(bytes)
        .and_then(|()| renameat(&dir, tmp.as_os_str(), &dir, name).map_err(Into::into));
    if written.is_err() {
        let _ = unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// `name` in the open directory `dir`, never inheriting into a child.
fn open_at<P: ?Sized + nix::NixPath>(
    dir: impl AsFd,
    name: &P,
    flags: OFlag,
) -> std::io::Result<OwnedFd> {
    Ok(openat(
        dir,
        name,
        flags | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o666),
    )?)
}

/// The directory of `path` (under `root`), opened from `root` down without
/// following a symlink (each missing one made when `create`), and the
/// file's name in it.
fn confined_parent<'p>(
    root: &Path,
    path: &'p Path,
    create: bool,
) -> std::io::Result<(OwnedFd, &'p std::ffi::OsStr)> {
    use std::io::{Error, ErrorKind};
    let root = root.canonicalize()?;
    let rel = path.strip_prefix(&root).map_err(|_| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("{} is not under the workspace", path.display()),
        )
    })?;
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                "a confined path has plain components only",
            )),
        })
        .collect::<Result<_, _>>()?;
    let Some((name, dirs)) = parts.split_last() else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "the workspace itself is not a file",
        ));
    };
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    let mut dir = open_at(AT_FDCWD, root.as_path(), OFlag::O_PATH | OFlag::O_DIRECTORY)?;
    for d in dirs {
        dir = match open_at(&dir, *d, dir_flags) {
            Err(e) if e.kind() == ErrorKind::NotFound && create => {
                match mkdirat(&dir, *d, Mode::from_bits_truncate(0o777)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open_at(&dir, *d, dir_flags)?
            }
            other => other?,
        };
    }
    Ok((dir, name))
}

/// The workspace-relative form of a confined path, for messages.
pub fn relative_to(root: &Path, path: &Path) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    path.strip_prefix(&root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "omicos-confine-{}-{}",
            std::process::id(),
            rand_id()
        ));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        d
    }
    fn rand_id() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn inside_paths_resolve() {
        let w = ws();
        let canon = w.canonicalize().unwrap();
        assert_eq!(
            confine_path(&w, "sub/new.txt").unwrap(),
            canon.join("sub/new.txt")
        );
        assert_eq!(confine_path(&w, "sub/../a/b").unwrap(), canon.join("a/b"));
        assert_eq!(confine_path(&w, "").unwrap(), canon);
        assert_eq!(
            confine_path(&w, canon.join("x").to_str().unwrap()).unwrap(),
            canon.join("x")
        );
    }

    #[test]
    fn a_confined_open_follows_no_symlink_on_the_way() {
        use std::io::{Read, Write};
        let w = ws();
        let canon = w.canonicalize().unwrap();
        let mut f = open_confined(&w, &canon.join("a/b/c.txt"), OpenFor::Write).unwrap();
        f.write_all(b"one").unwrap();
        open_confined(&w, &canon.join("a/b/c.txt"), OpenFor::Append)
            .unwrap()
            .write_all(b"two")
            .unwrap();
        let mut text = String::new();
        open_confined(&w, &canon.join("a/b/c.txt"), OpenFor::Read)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "onetwo");
        // A directory swapped for a link after the check: refused, nothing written there.
        let elsewhere = ws();
        std::fs::rename(canon.join("a"), canon.join("a.real")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, canon.join("a")).unwrap();
        std::fs::create_dir_all(elsewhere.join("b")).unwrap();
        for how in [OpenFor::Write, OpenFor::Append, OpenFor::Read] {
            assert!(
                open_confined(&w, &canon.join("a/b/c.txt"), how).is_err(),
                "{how:?}"
            );
        }
        assert!(!elsewhere.join("b/c.txt").exists());
        // The file itself a link: refused too.
        std::os::unix::fs::symlink("/etc/hostname", canon.join("link.txt")).unwrap();
        assert!(open_confined(&w, &canon.join("link.txt"), OpenFor::Read).is_err());
        assert!(open_confined(&w, &canon.join("../x"), OpenFor::Read).is_err());
        // Replaced at once where checked, and never through a link.
        replace_confined(&w, &canon.join("a.real/b/c.txt"), b"new").unwrap();
        assert_eq!(std::fs::read(canon.join("a.real/b/c.txt")).unwrap(), b"new");
        assert!(replace_confined(&w, &canon.join("a/b/c.txt"), b"x").is_err());
        assert!(!elsewhere.join("b/c.txt").exists());
        assert_eq!(
            std::fs::read_dir(canon.join("a.real/b")).unwrap().count(),
            1
        );
    }

    #[test]
    fn tool_paths_reach_no_state() {
        let w = ws();
        let canon = w.canonicalize().unwrap();
        std::fs::create_dir_all(w.join(".omicos/tenants/acme")).unwrap();
        std::fs::write(w.join(".omicos/tenants/acme/a.pdf"), "x").unwrap();
        std::os::unix::fs::symlink(".omicos/tenants/acme/a.pdf", w.join("link.pdf")).unwrap();
        std::os::unix::fs::symlink(".omicos", w.join("state")).unwrap();
        for p in [
            ".omicos",
            ".omicos/token",
            ".omicos/tenants/acme/a.pdf",
            "sub/../.omicos/x.ipynb",
            "./.omicos/new.ipynb",
            "link.pdf",
            "state/tenants",
            canon.join(".omicos/x").to_str().unwrap(),
        ] {
            assert!(
                matches!(confine_tool_path(&w, p), Err(ConfineError::State(_))),
                "{p}: {:?}",
                confine_tool_path(&w, p)
            );
        }
        for p in ["sub/a.pdf", ".omicosx/a", "sub/.omicos/a", ""] {
            assert!(confine_tool_path(&w, p).is_ok(), "{p}");
        }
        assert!(matches!(
            confine_tool_path(&w, "../x"),
            Err(ConfineError::Escapes(_))
        ));
    }

    #[test]
    fn escapes_are_refused() {
        let w = ws();
        for p in [
            "../../etc/passwd",
            "/etc/passwd",
            "sub/../../x",
            "missing/../../../x",
        ] {
            assert!(
                matches!(confine_path(&w, p), Err(ConfineError::Escapes(_))),
                "{p}"
            );
        }
        std::os::unix::fs::symlink("/etc", w.join("link")).unwrap();
        assert!(matches!(
            confine_path(&w, "link/passwd"),
            Err(ConfineError::Escapes(_))
        ));
        assert!(matches!(
            confine_path(&w, "link"),
            Err(ConfineError::Escapes(_))
        ));
        std::os::unix::fs::symlink("sub", w.join("inner")).unwrap();
        assert!(confine_path(&w, "inner/f").is_ok());
        assert!(confine_path(&w, "a\0b").is_err());
    }
}
