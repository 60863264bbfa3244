//! What a file tool changed in one call, with what each path held before:
//! the orchestrator keeps it as the turn's checkpoint, and RewindSession
//! (or ForkSession with files) writes it back through the runner's
//! RestoreFiles.
//!
//! Only tools that call [`FileChanges::before_change`] are tracked (the
//! file_manager tools). A shell command or kernel cell that writes a file
//! is not: the runner cannot tell what it touched.

use omicos_proto::FileChange;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The largest prior content kept for one path (beyond: `too_large`, not
/// restorable; a rewind reports it).
pub const MAX_PRIOR_BYTES: usize = 4 << 20;
/// The most prior content kept for one call, all paths together: a call
/// that rewrites many large files keeps the first ones and marks the rest
/// `too_large`, so that one result never carries more than this.
pub const MAX_CALL_PRIOR_BYTES: usize = 16 << 20;

/// The paths one call changed, shared between the call's context (the
/// provider records) and the pipeline (which returns them in the result).
/// Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct FileChanges(Arc<Mutex<Vec<FileChange>>>);

impl FileChanges {
    /// Records what `path` (already confined to `workspace`) holds before
    /// the call changes it. Only the first change of a path in a call
    /// counts: a second write of the same path keeps the first prior. A
    /// path that does not exist is recorded as `created`.
    pub fn before_change(&self, workspace: &Path, path: &Path) {
        let rel = crate::confine::relative_to(workspace, path);
        let mut changes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if changes.iter().any(|c| c.path == rel) {
            return;
        }
        let kept: usize = changes.iter().map(|c| c.prior.len()).sum();
        let change = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileChange {
                path: rel,
                created: true,
                ..Default::default()
            },
            Ok(m) if m.is_file() && (m.len() as usize) <= MAX_PRIOR_BYTES => {
                // Read where the path was checked (a directory swapped for a
                // link meanwhile must not copy another file into the checkpoint).
                let read = crate::confine::open_confined(workspace, path, crate::OpenFor::Read)
                    .and_then(|mut f| {
                        let mut b = Vec::new();
                        std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
                    });
                match read {
                    Ok(prior) if kept + prior.len() <= MAX_CALL_PRIOR_BYTES => FileChange {
                        path: rel,
                        prior,
                        ..Default::default()
                    },
                    _ => too_large(rel),
                }
            }
            // Too large, not a regular file, or unreadable: the change is
            // known, its prior content is not kept.
            _ => too_large(rel),
        };
        changes.push(change);
    }

    /// The changes recorded so far, leaving none.
    pub fn take(&self) -> Vec<FileChange> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn too_large(path: String) -> FileChange {
    FileChange {
        path,
        too_large: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_prior_of_a_path_counts_and_a_new_path_is_created() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().canonicalize().unwrap();
        std::fs::write(ws.join("a.txt"), "one").unwrap();
        let c = FileChanges::default();
        c.before_change(&ws, &ws.join("a.txt"));
        std::fs::write(ws.join("a.txt"), "two").unwrap();
        c.before_change(&ws, &ws.join("a.txt"));
        c.before_change(&ws, &ws.join("new/b.txt"));
        let got = c.take();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].path.as_str(), got[0].prior.as_slice()),
            ("a.txt", &b"one"[..])
        );
        assert!(!got[0].created && !got[0].too_large);
        assert_eq!(got[1].path, "new/b.txt");
        assert!(got[1].created);
        assert!(c.take().is_empty());
    }

    #[test]
    fn a_prior_beyond_the_cap_is_marked_too_large() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().canonicalize().unwrap();
        std::fs::write(ws.join("big"), vec![b'x'; MAX_PRIOR_BYTES + 1]).unwrap();
        let c = FileChanges::default();
        c.before_change(&ws, &ws.join("big"));
        let got = c.take();
        assert!(got[0].too_large && got[0].prior.is_empty() && !got[0].created);
    }
}
