//! Files attached to a message (issue 42): UploadFiles writes them into the
//! caller's workspace through the tool-runner (the orchestrator does not own
//! the workspace in a cluster), and a ChatRequest's `attachments` become a
//! line of the message the model reads, so the agent opens them with its
//! file tools.
//!
//! Every file goes to [`UPLOAD_DIR`] under its own name, never over a file
//! already there (the runner picks `data (1).csv` on a clash). Names are
//! checked here, sizes against `uploads` in the config, and the disk bound
//! by the runner; a refused request writes nothing.

use super::OrchestratorService;
use super::guard::Owned;
use crate::config::UploadsConfig;
use crate::error::OrchestratorError;
use omicos_proto::{
    Attachment, RestoreFile, UploadFilesRequest, UploadFilesResponse, UploadedFile,
};

/// The workspace directory attached files are written to.
pub const UPLOAD_DIR: &str = "uploads";
/// The most bytes a file name may take (what most filesystems hold).
const MAX_NAME_BYTES: usize = 255;
/// The most attachments one message may name.
const MAX_ATTACHMENTS: usize = 100;
/// The longest attachment path a message may name.
const MAX_ATTACHMENT_PATH: usize = 1024;
/// How the attachment line of a message starts (tests look for it).
pub const ATTACHED_FILES: &str = "Attached files (in the workspace):";

impl OrchestratorService {
    /// UploadFiles: checks names and sizes, then has the runner write the
    /// files into the caller's tenant workspace. `owned` is the session the
    /// request names (the guard admitted it); None: no session named yet.
    pub(super) async fn upload_files_rpc(
        &self,
        who: &omicos_auth::Principal,
        owned: Option<Owned>,
        req: UploadFilesRequest,
    ) -> Result<UploadFilesResponse, OrchestratorError> {
        let session = match (&owned, req.session_id.is_empty()) {
            (_, true) => String::new(),
            (Some(o), false) if o.id() == req.session_id => o.id().to_owned(),
            // The guard answers another owner's session; this is a guard bypass.
            _ => return Err(OrchestratorError::SessionNotFound(req.session_id)),
        };
        check(&self.engine.config.uploads, &req)?;
        let sizes: Vec<(String, u64)> = req
            .files
            .iter()
            .map(|f| (f.name.clone(), f.content.len() as u64))
            .collect();
        let files = req
            .files
            .into_iter()
            .map(|f| RestoreFile {
                path: format!("{UPLOAD_DIR}/{}", f.name),
                remove: false,
                content: f.content,
            })
            .collect();
        let principal = owned.as_ref().map(|o| o.principal()).unwrap_or(who);
        let paths = self
            .engine
            .runner
            .upload_files(&session, principal, files)
            .await?;
        if paths.len() != sizes.len() {
            return Err(OrchestratorError::ToolRunner(crate::error::RunnerStatus(
                tonic::Status::internal(format!(
                    "the runner wrote {} of {} files",
                    paths.len(),
                    sizes.len()
                )),
            )));
        }
        Ok(UploadFilesResponse {
            files: sizes
                .into_iter()
                .zip(paths)
                .map(|((name, size_bytes), path)| UploadedFile {
                    name,
                    path,
                    size_bytes,
                })
                .collect(),
        })
    }
}

/// Refuses a request with a bad name or over a size limit, with a sentence.
fn check(limits: &UploadsConfig, req: &UploadFilesRequest) -> Result<(), OrchestratorError> {
    if req.files.is_empty() {
        return Err(OrchestratorError::InvalidArgument(
            "no file to upload".into(),
        ));
    }
    if req.files.len() > limits.max_files {
        return Err(OrchestratorError::UploadTooLarge(format!(
            "{} files in one upload; the limit is {} (uploads.max_files)",
            req.files.len(),
            limits.max_files
        )));
    }
    for f in &req.files {
        check_name(&f.name)?;
        let size = f.content.len() as u64;
        if size > limits.max_file_bytes {
            return Err(OrchestratorError::UploadTooLarge(format!(
                "{} is {}; the limit is {} (uploads.max_file_bytes). Nothing was written",
                f.name,
                human_size(size),
                human_size(limits.max_file_bytes)
            )));
        }
    }
    let total: u64 = req.files.iter().map(|f| f.content.len() as u64).sum();
    if total > limits.max_request_bytes {
        return Err(OrchestratorError::UploadTooLarge(format!(
            "the files hold {} together; the limit of one upload is {} \
             (uploads.max_request_bytes). Nothing was written; send them in parts",
            human_size(total),
            human_size(limits.max_request_bytes)
        )));
    }
    Ok(())
}

/// A plain file name: not empty, no directory part, no `.`/`..`, no
/// control character, at most [`MAX_NAME_BYTES`].
pub fn check_name(name: &str) -> Result<(), OrchestratorError> {
    let bad = |why: &str| {
        Err(OrchestratorError::InvalidArgument(format!(
            "the file name {:?} {why}",
            crate::bound::error_message(name)
        )))
    };
    if name.trim().is_empty() {
        return bad("is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return bad(&format!(
            "is {} bytes long; a name holds at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if name.contains(['/', '\\']) {
        return bad("has a directory part; give the file's name alone, as `data.csv`");
    }
    if name == "." || name == ".." {
        return bad("is not a file name");
    }
    if name.chars().any(char::is_control) {
        return bad("holds a control character");
    }
    Ok(())
}

/// The message the model reads: `message`, then a line naming each
/// attached file with its size. Attachments are paths in the workspace
/// (UploadFiles' answer), checked to be plain text.
pub fn with_attachments(
    message: &str,
    attachments: &[Attachment],
) -> Result<String, OrchestratorError> {
    if attachments.is_empty() {
        return Ok(message.to_owned());
    }
    if attachments.len() > MAX_ATTACHMENTS {
        return Err(OrchestratorError::InvalidArgument(format!(
            "{} attachments; a message names at most {MAX_ATTACHMENTS}",
            attachments.len()
        )));
    }
    let mut listed = Vec::with_capacity(attachments.len());
    for a in attachments {
        if a.path.trim().is_empty()
            || a.path.len() > MAX_ATTACHMENT_PATH
            || a.path.chars().any(char::is_control)
        {
            return Err(OrchestratorError::InvalidArgument(format!(
                "the attachment path {:?} is not a workspace path (empty, over {MAX_ATTACHMENT_PATH} bytes, or with a control character)",
                crate::bound::error_message(&a.path)
            )));
        }
        listed.push(format!("{} ({})", a.path, human_size(a.size_bytes)));
    }
    let line = format!("{ATTACHED_FILES} {}", listed.join(", "));
    Ok(if message.trim().is_empty() {
        line
    } else {
        format!("{message}\n\n{line}")
    })
}

/// `12 bytes`, `3.4 KB`, `25 MB` (powers of 1024, as file managers show).
pub fn human_size(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    let (v, unit) = if b < K {
        return format!("{bytes} bytes");
    } else if b < K * K {
        (b / K, "KB")
    } else if b < K * K * K {
        (b / K / K, "MB")
    } else {
        (b / K / K / K, "GB")
    };
    if v >= 10.0 || v.fract() == 0.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused_with_a_sentence() {
        for bad in [
            "",
            " ",
            "../x",
            "/etc/passwd",
            ".omicos/token",
            "a/../../b",
            "a\\b",
            ".",
            "..",
            "a\0b",
            "a\nb",
            &"x".repeat(300),
        ] {
            let e = check_name(bad).unwrap_err();
            assert!(
                matches!(e, OrchestratorError::InvalidArgument(_)),
                "{bad:?}: {e:?}"
            );
            assert!(e.to_string().starts_with("the file name"), "{e}");
        }
        for ok in ["data.csv", ".env", "résumé (final).pdf", "a..b"] {
            check_name(ok).unwrap();
        }
    }

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(human_size(12), "12 bytes");
        assert_eq!(human_size(12 * 1024), "12 KB");
        assert_eq!(human_size(1536), "1.5 KB");
        assert_eq!(human_size(40 << 20), "40 MB");
        assert_eq!(human_size(25 << 20), "25 MB");
    }

    #[test]
    fn the_message_names_its_attachments() {
        let a = |p: &str, n| Attachment {
            path: p.into(),
            size_bytes: n,
        };
        assert_eq!(with_attachments("hi", &[]).unwrap(), "hi");
        assert_eq!(
            with_attachments("sum it", &[a("uploads/data.csv", 12 * 1024)]).unwrap(),
            "sum it\n\nAttached files (in the workspace): uploads/data.csv (12 KB)"
        );
        assert_eq!(
            with_attachments("", &[a("uploads/a", 1), a("uploads/b (1).txt", 2)]).unwrap(),
            "Attached files (in the workspace): uploads/a (1 bytes), uploads/b (1).txt (2 bytes)"
        );
        assert!(with_attachments("x", &[a("bad\npath", 1)]).is_err());
    }

    #[test]
    fn limits_are_sentences_that_name_the_file() {
        let limits = UploadsConfig {
            max_file_bytes: 10,
            max_request_bytes: 15,
            max_files: 3,
        };
        let f = |n: &str, len| omicos_proto::UploadFile {
            name: n.into(),
            content: vec![0; len],
        };
        let req = |files| UploadFilesRequest {
            session_id: String::new(),
            files,
        };
        let e = check(&limits, &req(vec![f("data.csv", 11)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "data.csv is 11 bytes; the limit is 10 bytes (uploads.max_file_bytes). Nothing was written"
        );
        let e = check(&limits, &req(vec![f("a", 8), f("b", 8)])).unwrap_err();
        assert!(e.to_string().contains("max_request_bytes"), "{e}");
        assert!(check(&limits, &req(vec![])).is_err());
        check(&limits, &req(vec![f("a", 10), f("b", 5)])).unwrap();
    }
}
