//! Where generated images go: `<workspace>/.omicos/outputs/<session>/`,
//! confined to the workspace, written whole or not at all.

use omicos_toolkit::{ToolError, confine::relative_to, confine_path};
use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

/// A saved image, as the model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    /// Workspace-relative path.
    pub path: String,
    /// `png`, `jpeg`, `webp` or `gif`.
    pub format: &'static str,
    /// Size in bytes.
    pub bytes: usize,
}

/// A name safe as one path component: the session id as given when it is
/// plain, otherwise with the other characters replaced.
pub fn component(raw: &str, fallback: &str) -> String {
    let s: String = raw
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_matches('.').to_owned();
    if s.is_empty() { fallback.to_owned() } else { s }
}

/// The session's output directory, created, and checked to be inside the
/// workspace (a symlinked `.omicos` pointing elsewhere is refused).
pub fn output_dir(workspace: &Path, session: &str) -> Result<PathBuf, ToolError> {
    let rel = format!(".omicos/outputs/{}", component(session, "no-session"));
    let dir = confine_path(workspace, &rel)
        .map_err(|e| ToolError::failed(format!("cannot save images: {e}")))?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        ToolError::failed(format!(
            "cannot create {}: {e}",
            relative_to(workspace, &dir)
        ))
    })?;
    // Check again now that it exists: a component may have been a symlink.
    confine_path(workspace, &rel).map_err(|e| ToolError::failed(format!("cannot save images: {e}")))
}

/// The image format from the first bytes, or None when it is not an image.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, ..] => Some("png"),
        [0xff, 0xd8, 0xff, ..] => Some("jpeg"),
        [
            b'R',
            b'I',
            b'F',
            b'F',
            _,
            _,
            _,
            _,
            b'W',
            b'E',
            b'B',
            b'P',
            ..,
        ] => Some("webp"),
        [b'G', b'I', b'F', b'8', ..] => Some("gif"),
        _ => None,
    }
}

/// Writes image `index` of call `call_id` into `dir` (temporary name, then
/// rename, so that a reader never sees half an image).
pub fn write_image(
    workspace: &Path,
    dir: &Path,
    call_id: &str,
    index: usize,
    bytes: &[u8],
) -> Result<Saved, String> {
    let format = sniff(bytes).ok_or_else(|| {
        format!(
            "the endpoint returned {} bytes that are not a PNG, JPEG, WebP or GIF image",
            bytes.len()
        )
    })?;
    let ext = if format == "jpeg" { "jpg" } else { format };
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let call = component(call_id, "call");
    let name = format!("{ms}__{call}__{index}.{ext}");
    let target = dir.join(&name);
    let tmp = dir.join(format!(".{name}.part"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "cannot write {}: {e}",
            relative_to(workspace, &target)
        ));
    }
    Ok(Saved {
        path: relative_to(workspace, &target),
        format,
        bytes: bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_safe() {
        assert_eq!(component("s-1_a.b", "x"), "s-1_a.b");
        assert_eq!(component("../../etc", "x"), "_.._etc");
        assert_eq!(component("..", "x"), "x");
        assert_eq!(component("", "x"), "x");
        assert_eq!(component("a/b\0c", "x"), "a_b_c");
    }

    #[test]
    fn formats() {
        assert_eq!(
            sniff(&[0x89, b'P', b'N', b'G', 13, 10, 26, 10, 0]),
            Some("png")
        );
        assert_eq!(sniff(b"RIFF1234WEBPVP8 "), Some("webp"));
        assert_eq!(sniff(b"<html>"), None);
    }

    #[test]
    fn escapes_through_symlinks_are_refused() {
        let ws = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), ws.path().join(".omicos")).unwrap();
        let e = output_dir(ws.path(), "s1").unwrap_err().to_string();
        assert!(e.contains("outside the workspace"), "{e}");
    }
}
