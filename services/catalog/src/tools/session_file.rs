//! Per-session files under `<workspace>/.omicos/`: the runner is stateless, so
//! session state that tools keep lives in the workspace.

use omicos_toolkit::{ToolError, confine_path};
use std::path::{Path, PathBuf};

/// Whether a session id can name a file: no separators, no dot-files.
fn valid_session(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// `<workspace>/.omicos/<dir>/<session>.<ext>`, refused when the session id
/// cannot name a file or a symlink would take the path out of the workspace.
pub(crate) fn path(
    workspace: &Path,
    dir: &str,
    session: &str,
    ext: &str,
) -> Result<PathBuf, ToolError> {
    if !valid_session(session) {
        return Err(ToolError::invalid(format!(
            "session id `{}` cannot name a file (letters, digits, `_`, `-`, `.` only)",
            session.escape_debug()
        )));
    }
    confine_path(workspace, &format!(".omicos/{dir}/{session}.{ext}"))
        .map_err(|e| ToolError::failed(e.to_string()))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so that a
/// reader never sees half a file and a crash never leaves one.
pub(crate) async fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ToolError> {
    let dir = path
        .parent()
        .ok_or_else(|| ToolError::failed("the file has no directory"))?;
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| ToolError::failed(format!("cannot create {}: {e}", dir.display())))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    tokio::fs::write(&tmp, bytes)
        .await
        .map_err(|e| ToolError::failed(format!("cannot write {}: {e}", tmp.display())))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| ToolError::failed(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_that_are_not_file_names_are_refused() {
        let ws = tempfile::tempdir().unwrap();
        assert!(path(ws.path(), "tasks", "s-1_a.b", "json").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a\0b", &"x".repeat(200)] {
            assert!(
                matches!(
                    path(ws.path(), "tasks", bad, "json"),
                    Err(ToolError::InvalidInput(_))
                ),
                "{bad}"
            );
        }
    }
}
