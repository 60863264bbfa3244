//! registry_lookup: search the functions, classes and methods of the Python
//! packages installed in the kernel's environment. The index is built once per
//! interpreter by reading package sources with `ast` (no package code runs)
//! and kept in memory until kernel_install changes the environment.

use omicos_toolkit::ToolError;
use serde::Deserialize;
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

const INDEX_SCRIPT: &str = include_str!("lookup_index.py");

/// One indexed callable.
#[derive(Debug, Clone, Deserialize)]
pub struct Entry {
    /// Module path (`matplotlib.pyplot`).
    #[serde(rename = "m")]
    pub module: String,
    /// Name (`plot`, `Figure.savefig`).
    #[serde(rename = "n")]
    pub name: String,
    /// function | class | method.
    #[serde(rename = "k")]
    pub kind: String,
    /// Signature as written in the source.
    #[serde(rename = "s")]
    pub signature: String,
    /// The docstring's first line.
    #[serde(rename = "d")]
    pub doc: String,
}

/// Indexes per interpreter.
#[derive(Default)]
pub struct Lookup {
    indexes: Mutex<HashMap<PathBuf, Arc<Vec<Entry>>>>,
    building: tokio::sync::Mutex<()>,
}

impl Lookup {
    /// Forgets the index of `python` (after an install).
    pub fn invalidate(&self, python: &Path) {
        self.indexes.lock().expect("lookup lock").remove(python);
    }

    async fn index(&self, python: &Path, timeout: Duration) -> Result<Arc<Vec<Entry>>, ToolError> {
        if let Some(i) = self.indexes.lock().expect("lookup lock").get(python) {
            return Ok(i.clone());
        }
        // One build at a time: concurrent first calls wait for it instead of repeating it.
        let _building = self.building.lock().await;
        if let Some(i) = self.indexes.lock().expect("lookup lock").get(python) {
            return Ok(i.clone());
        }
        let mut cmd = tokio::process::Command::new(python);
        cmd.arg("-c")
            .arg(INDEX_SCRIPT)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(timeout, cmd.output())
            .await
            .map_err(|_| {
                ToolError::failed(format!(
                    "indexing the installed packages took longer than {} s",
                    timeout.as_secs()
                ))
            })?
            .map_err(|e| ToolError::failed(format!("cannot run {}: {e}", python.display())))?;
        if !out.status.success() {
            return Err(ToolError::failed(format!(
                "indexing the installed packages failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )));
        }
        let entries: Vec<Entry> = out
            .stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let entries = Arc::new(entries);
        self.indexes
            .lock()
            .expect("lookup lock")
            .insert(python.to_path_buf(), entries.clone());
        Ok(entries)
    }

    /// Searches `query` (words; all must match the name, module or doc line).
    pub async fn search(
        &self,
        python: &Path,
        query: &str,
        max_results: usize,
        timeout: Duration,
    ) -> Result<Value, ToolError> {
        let words: Vec<String> = query
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .filter(|w| !w.is_empty())
            .map(|w| w.to_lowercase())
            .collect();
        if words.is_empty() {
            return Err(ToolError::invalid(
                "query is empty: give a function, module or topic name",
            ));
        }
        let index = self.index(python, timeout).await?;
        let mut hits: Vec<(i64, &Entry)> = index
            .iter()
            .filter_map(|e| {
                let name = e.name.to_lowercase();
                let module = e.module.to_lowercase();
                let doc = e.doc.to_lowercase();
                let full = format!("{module}.{name}");
                let mut score = 0i64;
                for w in &words {
                    let leaf = name.rsplit('.').next().unwrap_or(&name);
                    score += if leaf == w.as_str() {
                        10
                    } else if full.ends_with(w.as_str()) {
                        8
                    } else if name.contains(w.as_str()) {
                        5
                    } else if module.contains(w.as_str()) {
                        2
                    } else if doc.contains(w.as_str()) {
                        1
                    } else {
                        return None;
                    };
                }
                // Shorter, public-facing paths first: `numpy.mean` before `numpy.core.fromnumeric.mean`.
                Some((
                    score * 100
                        - full.matches('.').count() as i64 * 3
                        - if e.doc.is_empty() { 5 } else { 0 },
                    e,
                ))
            })
            .collect();
        hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.module.cmp(&b.1.module)));
        let results: Vec<Value> = hits
            .iter()
            .take(max_results)
            .map(|(_, e)| {
                json!({
                    "path": format!("{}.{}", e.module, e.name),
                    "kind": e.kind,
                    "signature": format!("{}{}", e.name.rsplit('.').next().unwrap_or(&e.name), e.signature),
                    "doc": e.doc,
                })
            })
            .collect();
        Ok(
            json!({"query": query, "total_matches": hits.len(), "indexed": index.len(), "results": results}),
        )
    }
}
