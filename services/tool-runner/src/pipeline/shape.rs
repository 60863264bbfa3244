//! Stage 7: shape the provider's value into the string the model sees. A result
//! of 16 KiB or more is written whole to
//! `<workspace>/.omicos/tool_outputs/<unix_ms>__<call_id>.txt` (never
//! garbage-collected); the model gets the first 2000 and last 500 characters and
//! a line naming the file and saying to read it with file_manager__read.

use super::normalize::{Failure, Stage};
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// Results of this many bytes or more are spooled.
pub const SPOOL_THRESHOLD_BYTES: usize = 16 * 1024;
/// Characters of the head kept in the preview.
pub const PREVIEW_HEAD_CHARS: usize = 2000;
/// Characters of the tail kept in the preview.
pub const PREVIEW_TAIL_CHARS: usize = 500;
/// Where spooled results go, relative to the workspace.
pub const SPOOL_DIR: &str = ".omicos/tool_outputs";

/// The shaped result.
#[derive(Clone, Debug, PartialEq)]
pub struct Shaped {
    /// What the model sees.
    pub text: String,
    /// Workspace-relative path of the full result, when spooled.
    pub spool_path: Option<String>,
    /// Size of the full result in bytes.
    pub full_bytes: usize,
}

/// A value as text: strings as they are, anything else as compact JSON.
pub fn stringify(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Spools `text` when it is `threshold` bytes or more.
pub fn shape(
    text: String,
    workspace: &Path,
    at: SpoolAt<'_>,
    threshold: usize,
) -> Result<Shaped, Failure> {
    let full_bytes = text.len();
    if full_bytes < threshold {
        return Ok(Shaped {
            text,
            spool_path: None,
            full_bytes,
        });
    }
    let rel = spool(&text, workspace, at, "txt").map_err(|e| {
        Failure::new(
            Stage::Shape,
            format!("the result ({full_bytes} bytes) could not be spooled to the workspace: {e}"),
        )
    })?;
    Ok(Shaped {
        text: preview(&text, &rel),
        spool_path: Some(rel),
        full_bytes,
    })
}

/// The head + tail preview with the line that names the spool file.
pub fn preview(text: &str, rel: &str) -> String {
    let total = text.chars().count();
    let head_end = text
        .char_indices()
        .nth(PREVIEW_HEAD_CHARS)
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    let tail_start = if total > PREVIEW_HEAD_CHARS + PREVIEW_TAIL_CHARS {
        text.char_indices()
            .nth(total - PREVIEW_TAIL_CHARS)
            .map(|(i, _)| i)
            .unwrap_or(text.len())
    } else {
        head_end
    };
    let omitted = total.saturating_sub(PREVIEW_HEAD_CHARS + PREVIEW_TAIL_CHARS);
    format!(
        "{}\n\n[... {omitted} characters omitted ...]\n\n{}\n\n[Full output ({} bytes) spooled to {rel}. Read it with file_manager__read (path \"{rel}\", offset/limit by lines) if you need more.]",
        &text[..head_end],
        &text[tail_start..],
        text.len()
    )
}

/// The head of a large argument string as the record keeps it, with the line
/// that names the spooled copy.
pub fn arguments_head(text: &str, rel: Option<&str>) -> String {
    let head_end = text
        .char_indices()
        .nth(PREVIEW_HEAD_CHARS)
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    let whole = match rel {
        Some(rel) => format!("spooled to {rel}"),
        None => "not kept: the spool could not be written".to_owned(),
    };
    format!(
        "{}\n\n[... the whole argument string ({} bytes) is {whole}]",
        &text[..head_end],
        text.len()
    )
}

/// Whose spool file it is: the session's directory, the call's name.
#[derive(Clone, Copy, Debug)]
pub struct SpoolAt<'a> {
    /// The calling session: its own directory under the spool, so another
    /// session (of the same tenant too) can neither list nor read it.
    pub session: &'a str,
    /// The model's call id.
    pub call_id: &'a str,
}

/// `s` as one safe path component (at most 120 characters of
/// `[A-Za-z0-9_-]`, others as `_`), or `empty` when nothing is left.
fn component(s: &str, empty: &str) -> String {
    let safe: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(120)
        .collect();
    if safe.is_empty() {
        empty.to_owned()
    } else {
        safe
    }
}

/// The spool directory of `session`, relative to the workspace.
pub fn session_spool_dir(session: &str) -> String {
    format!("{SPOOL_DIR}/{}", component(session, "_"))
}

/// Writes `text` byte-exact to
/// `<workspace>/.omicos/tool_outputs/<session>/<unix_ms>__<call_id>.<ext>`
/// (a new file, never overwritten) and returns its workspace-relative path.
pub fn spool(text: &str, workspace: &Path, at: SpoolAt<'_>, ext: &str) -> std::io::Result<String> {
    let rel_dir = session_spool_dir(at.session);
    let dir = workspace.join(&rel_dir);
    std::fs::create_dir_all(&dir)?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let safe = component(at.call_id, "call");
    for n in 0.. {
        let name = if n == 0 {
            format!("{ms}__{safe}.{ext}")
        } else {
            format!("{ms}__{safe}-{n}.{ext}")
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(&name))
        {
            Ok(mut f) => {
                f.write_all(text.as_bytes())?;
                f.sync_data()?;
                return Ok(format!("{rel_dir}/{name}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

#[cfg(test)]
mod tests {
    use super::*;

    const C1: SpoolAt<'static> = SpoolAt {
        session: "s1",
        call_id: "c1",
    };

    #[test]
    fn small_results_are_untouched() {
        let d = tempfile::tempdir().unwrap();
        let s = shape("hello".into(), d.path(), C1, SPOOL_THRESHOLD_BYTES).unwrap();
        assert_eq!(
            s,
            Shaped {
                text: "hello".into(),
                spool_path: None,
                full_bytes: 5
            }
        );
        assert!(!d.path().join(SPOOL_DIR).exists());
        // One byte under the threshold stays inline; at the threshold it spools.
        let s = shape(
            "x".repeat(SPOOL_THRESHOLD_BYTES - 1),
            d.path(),
            C1,
            SPOOL_THRESHOLD_BYTES,
        )
        .unwrap();
        assert!(s.spool_path.is_none());
        let s = shape(
            "x".repeat(SPOOL_THRESHOLD_BYTES),
            d.path(),
            C1,
            SPOOL_THRESHOLD_BYTES,
        )
        .unwrap();
        assert!(s.spool_path.is_some());
    }

    #[test]
    fn large_results_spool_byte_exact_with_head_and_tail() {
        let d = tempfile::tempdir().unwrap();
        // 200 KB of multi-byte text with distinct lines, so a wrong cut would show.
        let mut text = String::new();
        let mut i = 0;
        while text.len() < 200_000 {
            text.push_str(&format!("line {i:06} é✓\n"));
            i += 1;
        }
        let s = shape(
            text.clone(),
            d.path(),
            SpoolAt {
                session: "../s 2",
                call_id: "call/../x y",
            },
            SPOOL_THRESHOLD_BYTES,
        )
        .unwrap();
        let rel = s.spool_path.clone().unwrap();
        assert!(
            rel.starts_with(".omicos/tool_outputs/___s_2/") && rel.ends_with("__call____x_y.txt"),
            "{rel}"
        );
        assert_eq!(std::fs::read(d.path().join(&rel)).unwrap(), text.as_bytes());
        let head: String = text.chars().take(PREVIEW_HEAD_CHARS).collect();
        let tail: String = text
            .chars()
            .skip(text.chars().count() - PREVIEW_TAIL_CHARS)
            .collect();
        assert!(s.text.starts_with(&head));
        let before_note = s.text.rsplit_once("\n\n[Full output").unwrap().0;
        assert!(before_note.ends_with(&tail));
        assert!(s.text.contains(&rel) && s.text.contains("file_manager__read"));
        assert!(s.text.len() < 4000, "preview too long: {}", s.text.len());
        assert_eq!(s.full_bytes, text.len());
    }
}
