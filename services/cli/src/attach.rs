//! Files attached to a message (`omicos chat --attach FILE`, `/attach PATH`):
//! uploaded into the session's workspace with UploadFiles, then named in the
//! next message's `attachments` so the model is told where they are.

use crate::error::CliError;
use crate::turn::Client;
use omicos_proto::{Attachment, UploadFile, UploadFilesRequest};
use std::path::Path;

/// Uploads `paths` (local files) for `session` (empty: the workspace a new
/// session works in); the attachments to send with the next message and a
/// line per file saying where it went.
pub async fn upload(
    client: &mut Client,
    session: &str,
    paths: &[impl AsRef<Path>],
) -> Result<(Vec<Attachment>, Vec<String>), CliError> {
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        let p = p.as_ref();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| CliError::Usage(format!("{} is not a file", p.display())))?;
        // A file that cannot be read is refused before anything is sent,
        // as bad input (exit 2): the message waits for a path that works.
        let content = std::fs::read(p).map_err(|e| {
            CliError::Usage(format!(
                "cannot attach {}: {e}; nothing was sent",
                p.display()
            ))
        })?;
        files.push(UploadFile { name, content });
    }
    let done = client
        .upload_files(UploadFilesRequest {
            session_id: session.to_owned(),
            files,
        })
        .await?
        .into_inner();
    let lines = done
        .files
        .iter()
        .map(|f| format!("attached {} as {} ({} bytes)", f.name, f.path, f.size_bytes))
        .collect();
    let attachments = done
        .files
        .into_iter()
        .map(|f| Attachment {
            path: f.path,
            size_bytes: f.size_bytes,
        })
        .collect();
    Ok((attachments, lines))
}
