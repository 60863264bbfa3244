//! RestoreFiles with `create_new`: files a user attached to a message
//! (Orchestrator/UploadFiles), written into the calling tenant's workspace.
//!
//! Unlike a restore, an upload never replaces a file: a path that exists
//! gets a free name beside it (`data.csv` → `data (1).csv`), and the link
//! that puts the file in place fails rather than overwrite one that
//! appeared meanwhile. Paths are confined as a restore's
//! ([`crate::restore::checked`]: no `..`, absolute path, symlink escape or
//! `.omicos/`). Before anything is written the request is held to the
//! sandbox's disk bound of a session (`session_limits.workspace_bytes` and
//! `min_free_bytes`, the bounds sandboxed code is held to): an upload that
//! would pass one is RESOURCE_EXHAUSTED. A refused or failed upload leaves
//! nothing behind: files written before the failure are removed.

use crate::restore::{checked, io_status};
use omicos_proto::RestoreFile;
use std::path::{Path, PathBuf};
use tonic::Status;

/// The most `name (n).ext` tried for one clash before the upload is refused.
const MAX_RENAMES: u32 = 1000;

/// The disk bounds an upload is held to (the sandbox's session limits).
#[derive(Clone, Copy, Debug)]
pub struct DiskBound {
    /// The most the workspace may hold.
    pub workspace_bytes: Option<u64>,
    /// The free space its filesystem must keep.
    pub min_free_bytes: Option<u64>,
    /// How the workspace is measured: the sandbox's own measure, so that an
    /// upload and boxed code are held to the same figure.
    pub measure: omicos_sandbox::DiskMeasure,
}

impl Default for DiskBound {
    fn default() -> Self {
        Self {
            workspace_bytes: None,
            min_free_bytes: None,
            // Without a sandbox to say otherwise, boxes may reach `.omicos/`.
            measure: omicos_sandbox::DiskMeasure::Everything,
        }
    }
}

/// Writes each file as a new file; the workspace-relative paths used, in
/// request order.
pub fn upload(
    workspace: &Path,
    files: &[RestoreFile],
    bound: DiskBound,
) -> Result<Vec<String>, Status> {
    let root = workspace.canonicalize().map_err(|e| {
        Status::failed_precondition(format!(
            "the workspace {} cannot be resolved: {e}",
            workspace.display()
        ))
    })?;
    if files.iter().any(|f| f.remove) {
        return Err(Status::invalid_argument(
            "an upload writes files; it removes none",
        ));
    }
    for f in files {
        checked(&root, &f.path)?;
    }
    let adding: u64 = files.iter().map(|f| f.content.len() as u64).sum();
    check_bound(&root, adding, bound)?;
    let mut written: Vec<(PathBuf, String)> = Vec::with_capacity(files.len());
    for f in files {
        match write_new(&root, f, &written) {
            Ok(done) => written.push(done),
            Err(e) => {
                for (p, _) in &written {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
    }
    Ok(written.into_iter().map(|(_, rel)| rel).collect())
}

/// RESOURCE_EXHAUSTED when `adding` more bytes would take the workspace past
/// its bound or its filesystem below its floor.
fn check_bound(root: &Path, adding: u64, bound: DiskBound) -> Result<(), Status> {
    if let Some(max) = bound.workspace_bytes {
        let used = bound.measure.usage(root);
        if used.saturating_add(adding) > max {
            return Err(Status::resource_exhausted(format!(
                "the upload ({}) does not fit: the workspace holds {} of its {} \
                 (sandbox.session_limits.workspace_bytes); nothing was written",
                human(adding),
                human(used),
                human(max)
            )));
        }
    }
    if let Some(min) = bound.min_free_bytes
        && let Ok(s) = nix::sys::statvfs::statvfs(root)
    {
        let free = s.blocks_available().saturating_mul(s.fragment_size());
        if free.saturating_sub(adding) < min {
            return Err(Status::resource_exhausted(format!(
                "the upload ({}) does not fit: the workspace's disk has {} free and keeps {} \
                 (sandbox.session_limits.min_free_bytes); nothing was written",
                human(adding),
                human(free),
                human(min)
            )));
        }
    }
    Ok(())
}

/// Writes `f` under a free name and returns where (absolute and
/// workspace-relative). `taken` holds what this upload wrote already.
fn write_new(
    root: &Path,
    f: &RestoreFile,
    taken: &[(PathBuf, String)],
) -> Result<(PathBuf, String), Status> {
    use std::io::Write;
    let first = checked(root, &f.path)?;
    let parent = first
        .parent()
        .ok_or_else(|| Status::invalid_argument(format!("upload `{}`: no directory", f.path)))?
        .to_path_buf();
    std::fs::create_dir_all(&parent)
        .map_err(|e| io_status("create the directory of", &f.path, e))?;
    // Confined again once the directory exists: a symlink made meanwhile
    // must not redirect the file.
    if checked(root, &f.path)? != first {
        return Err(Status::permission_denied(format!(
            "upload `{}`: the path resolves elsewhere since it was checked",
            f.path
        )));
    }
    let tmp = parent.join(format!(".omicos-upload-{}", uuid::Uuid::new_v4().simple()));
    let staged = (|| {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        out.write_all(&f.content)
    })();
    if let Err(e) = staged {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_status("write", &f.path, e));
    }
    let result = (|| {
        for n in 0..=MAX_RENAMES {
            let rel = if n == 0 {
                f.path.clone()
            } else {
                numbered(&f.path, n)
            };
            let path = checked(root, &rel)?;
            if taken.iter().any(|(p, _)| *p == path) {
                continue;
            }
            // A hard link fails when the name exists: nothing is replaced,
            // even by a file that appeared since the last look.
            match std::fs::hard_link(&tmp, &path) {
                Ok(()) => return Ok((path, rel)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_status("write", &rel, e)),
            }
        }
        Err(Status::already_exists(format!(
            "upload `{}`: it and {MAX_RENAMES} numbered names beside it exist",
            f.path
        )))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// `dir/name (n).ext` for `dir/name.ext` (the extension is what follows the
/// last dot of the file name, unless the name starts with it).
pub fn numbered(path: &str, n: u32) -> String {
    let (dir, name) = match path.rfind('/') {
        Some(i) => (&path[..=i], &path[i + 1..]),
        None => ("", path),
    };
    match name.rfind('.') {
        Some(i) if i > 0 => format!("{dir}{} ({n}){}", &name[..i], &name[i..]),
        _ => format!("{dir}{name} ({n})"),
    }
}

/// `12 KB`, `3.4 MiB`: a size for a sentence.
fn human(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} bytes")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / KIB / KIB)
    } else {
        format!("{:.1} GiB", b / KIB / KIB / KIB)
    }
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
    fn a_clash_gets_a_numbered_name_and_nothing_is_replaced() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("uploads")).unwrap();
        std::fs::write(d.path().join("uploads/a.csv"), "old").unwrap();
        let got = upload(
            d.path(),
            &[
                file("uploads/a.csv", b"new1"),
                file("uploads/a.csv", b"new2"),
            ],
            DiskBound::default(),
        )
        .unwrap();
        assert_eq!(got, ["uploads/a (1).csv", "uploads/a (2).csv"]);
        assert_eq!(
            std::fs::read(d.path().join("uploads/a.csv")).unwrap(),
            b"old"
        );
        assert_eq!(
            std::fs::read(d.path().join("uploads/a (2).csv")).unwrap(),
            b"new2"
        );
        let names: Vec<_> = std::fs::read_dir(d.path().join("uploads"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "no temporary file is left: {names:?}");
    }

    #[test]
    fn over_the_disk_bound_nothing_is_written() {
        let d = tempfile::tempdir().unwrap();
        let e = upload(
            d.path(),
            &[file("uploads/big.bin", &vec![1u8; 64 << 10])],
            DiskBound {
                workspace_bytes: Some(16 << 10),
                ..DiskBound::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("workspace_bytes"), "{}", e.message());
        assert!(!d.path().join("uploads").exists());
    }

    #[test]
    fn the_bound_leaves_out_omicos_state_but_not_outputs() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join(".omicos");
        std::fs::create_dir_all(state.join("outputs/s")).unwrap();
        std::fs::write(state.join("sessions.db"), vec![1u8; 2 << 20]).unwrap();
        let bound = DiskBound {
            workspace_bytes: Some(1 << 20),
            measure: omicos_sandbox::DiskMeasure::WithoutOwnState,
            ..DiskBound::default()
        };
        let small = [file("uploads/a.bin", &[1u8; 4096])];
        upload(d.path(), &small, bound).expect("the store is not the agent's");
        // Where boxes could write the store, it counts.
        let everything = DiskBound {
            measure: omicos_sandbox::DiskMeasure::Everything,
            ..bound
        };
        let e = upload(d.path(), &small, everything).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        // Outputs written on the session's behalf count.
        std::fs::write(state.join("outputs/s/plot.png"), vec![1u8; 2 << 20]).unwrap();
        let e = upload(d.path(), &small, bound).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn names_are_numbered_before_the_extension() {
        assert_eq!(numbered("uploads/data.csv", 1), "uploads/data (1).csv");
        assert_eq!(numbered("uploads/a.tar.gz", 2), "uploads/a.tar (2).gz");
        assert_eq!(numbered("uploads/.env", 1), "uploads/.env (1)");
        assert_eq!(numbered("README", 3), "README (3)");
    }

    #[test]
    fn escapes_are_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        for bad in ["../x", ".omicos/token", "/etc/passwd"] {
            let e = upload(
                d.path(),
                &[file("uploads/ok.txt", b"x"), file(bad, b"x")],
                DiskBound::default(),
            )
            .unwrap_err();
            assert!(
                matches!(
                    e.code(),
                    tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
                ),
                "{bad}: {e:?}"
            );
            assert!(!d.path().join("uploads/ok.txt").exists(), "{bad}");
        }
    }
}
