//! Trajectories: every model turn and tool call of a session, as JSONL under
//! `<workspace>/.omicos/trajectories/<session>/trajectory.jsonl`, so a
//! conversation can be replayed.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Appends trajectory records.
#[derive(Clone, Debug)]
pub struct Trajectories {
    root: PathBuf,
}

impl Trajectories {
    /// Under `<workspace>/.omicos/trajectories`.
    pub fn new(workspace: &Path) -> Self {
        Self {
            root: workspace.join(".omicos").join("trajectories"),
        }
    }

    /// The file of a session.
    pub fn path(&self, session: &str) -> PathBuf {
        self.root.join(sanitize(session)).join("trajectory.jsonl")
    }

    /// Appends one record (one line). Failures are logged, never fatal.
    pub async fn append(&self, session: &str, record: Value) {
        let path = self.path(session);
        let line = format!("{record}\n");
        let res = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            // One write call per line keeps lines whole when several writers append.
            f.write_all(line.as_bytes())
        })
        .await;
        if let Ok(Err(e)) | Err(e) = res.map_err(std::io::Error::other) {
            tracing::warn!(session, error = %e, "trajectory not written");
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
