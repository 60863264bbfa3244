//! RestoreFiles: writes files back into the calling tenant's workspace as
//! they were at a checkpoint (RewindSession, ForkSession with files).
//!
//! Every path is resolved and confined as the file tools resolve it
//! ([`omicos_toolkit::confine_path`]: no `..`, absolute path or symlink
//! leaves the workspace), and nothing under `.omicos/` (omicos's own state)
//! is written. All paths are checked before the first is written: a request
//! with one refused path writes nothing. Each file is written to a
//! temporary file beside it and renamed over it, so a reader never sees
//! half a file.

use omicos_proto::RestoreFile;
use omicos_toolkit::confine_path;
use std::path::{Path, PathBuf};
use tonic::Status;

/// The workspace-relative paths written or removed, in request order.
pub fn restore(workspace: &Path, files: &[RestoreFile]) -> Result<Vec<String>, Status> {
    let root = workspace.canonicalize().map_err(|e| {
        Status::failed_precondition(format!(
            "the workspace {} cannot be resolved: {e}",
            workspace.display()
        ))
    })?;
    let mut planned: Vec<(PathBuf, &RestoreFile)> = Vec::with_capacity(files.len());
    for f in files {
        planned.push((checked(&root, &f.path)?, f));
    }
    let mut restored = Vec::with_capacity(planned.len());
    for (path, f) in planned {
        if f.remove {
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {
                    return Err(Status::failed_precondition(format!(
                        "`{}` is a directory now; a restore removes only files",
                        f.path
                    )));
                }
                Ok(_) => {
                    std::fs::remove_file(&path).map_err(|e| io_status("remove", &f.path, e))?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_status("read", &f.path, e)),
            }
        } else {
            write_atomically(&root, &path, &f.path, &f.content)?;
        }
        restored.push(f.path.clone());
    }
    Ok(restored)
}

/// `given` confined to `root`, refused when it leaves it or lies in
/// `.omicos/`.
pub(crate) fn checked(root: &Path, given: &str) -> Result<PathBuf, Status> {
    if given.trim().is_empty() {
        return Err(Status::invalid_argument("a restored path is empty"));
    }
    let path = confine_path(root, given)
        .map_err(|e| Status::invalid_argument(format!("restore `{given}`: {e}")))?;
    if path == root {
        return Err(Status::invalid_argument(format!(
            "restore `{given}`: that is the workspace itself, not a file"
        )));
    }
    if path
        .strip_prefix(root)
        .ok()
        .and_then(|p| p.iter().next())
        .is_some_and(|c| c == ".omicos")
    {
        return Err(Status::permission_denied(format!(
            "restore `{given}`: the path is inside .omicos/, omicos's own state; no restore writes it"
        )));
    }
    Ok(path)
}

/// Writes `content` to a temporary file beside `path` and renames it over
/// `path`; the parent directories are made first and the path confined
/// again after (a directory made meanwhile must not redirect it).
fn write_atomically(root: &Path, path: &Path, given: &str, content: &[u8]) -> Result<(), Status> {
    use std::io::Write;
    let parent = path.parent().ok_or_else(|| {
        Status::invalid_argument(format!("restore `{given}`: no parent directory"))
    })?;
    std::fs::create_dir_all(parent).map_err(|e| io_status("create the directory of", given, e))?;
    let again = checked(root, given)?;
    if again != path {
        return Err(Status::permission_denied(format!(
            "restore `{given}`: the path resolves elsewhere since it was checked"
        )));
    }
    if path.is_dir() {
        return Err(Status::failed_precondition(format!(
            "`{given}` is a directory now; a restore writes only files"
        )));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(
        ".{name}.omicos-restore-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        // No fsync: a reader never sees half a file (the rename is atomic),
        // and a crash loses what it would lose of a file tool's own write
        // (they do not sync either); 20 syncs were most of a rewind's time.
        f.write_all(content)?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_status("write", given, e));
    }
    Ok(())
}

pub(crate) fn io_status(what: &str, given: &str, e: std::io::Error) -> Status {
    Status::internal(format!("restore could not {what} `{given}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &[u8]) -> RestoreFile {
        RestoreFile {
            path: path.into(),
            remove: false,
            content: content.to_vec(),
        }
    }

    #[test]
    fn writes_and_removes_and_refuses_escapes_writing_nothing() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path();
        std::fs::write(ws.join("gone.txt"), "x").unwrap();
        let got = restore(
            ws,
            &[
                file("sub/a.bin", &[0, 159, 146, 150, 0xff]),
                RestoreFile {
                    path: "gone.txt".into(),
                    remove: true,
                    content: vec![],
                },
            ],
        )
        .unwrap();
        assert_eq!(got, ["sub/a.bin", "gone.txt"]);
        assert_eq!(
            std::fs::read(ws.join("sub/a.bin")).unwrap(),
            [0, 159, 146, 150, 0xff]
        );
        assert!(!ws.join("gone.txt").exists());

        for (bad, code) in [
            ("../x", tonic::Code::InvalidArgument),
            (".omicos/token", tonic::Code::PermissionDenied),
            ("a/../.omicos/x", tonic::Code::PermissionDenied),
            ("/etc/passwd", tonic::Code::InvalidArgument),
        ] {
            let e = restore(ws, &[file("first.txt", b"no"), file(bad, b"no")]).unwrap_err();
            assert_eq!(e.code(), code, "{bad}: {e:?}");
            assert!(!ws.join("first.txt").exists(), "{bad}: nothing is written");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_out_of_the_workspace_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("out")).unwrap();
        let e = restore(d.path(), &[file("out/f", b"x")]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(!outside.path().join("f").exists());
    }
}
