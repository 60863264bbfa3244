//! Workspace notebooks (nbformat 4): read, summarise, edit, write back.

use omicos_toolkit::ToolError;
use serde_json::{Map, Value, json};
use std::path::Path;

/// A parsed notebook.
#[derive(Debug, Clone)]
pub struct Notebook(pub Value);

/// The source of a cell, whether stored as a string or a list of lines.
pub fn source_text(cell: &Value) -> String {
    match &cell["source"] {
        Value::String(s) => s.clone(),
        Value::Array(lines) => lines.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

/// A source in the list-of-lines form Jupyter writes.
pub fn source_lines(text: &str) -> Value {
    Value::Array(
        text.split_inclusive('\n')
            .map(|l| Value::String(l.to_owned()))
            .collect(),
    )
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// One line per output: what kind, and its gist.
pub fn summarize_outputs(cell: &Value) -> Vec<String> {
    let Some(outputs) = cell["outputs"].as_array() else {
        return vec![];
    };
    outputs
        .iter()
        .map(|o| match o["output_type"].as_str().unwrap_or("") {
            "stream" => format!(
                "{}: {}",
                o["name"].as_str().unwrap_or("stream"),
                truncate(source_text(&json!({"source": o["text"]})).trim(), 200)
            ),
            "error" => format!(
                "error: {}: {}",
                o["ename"].as_str().unwrap_or(""),
                truncate(o["evalue"].as_str().unwrap_or(""), 200)
            ),
            kind @ ("display_data" | "execute_result") => {
                let data = o["data"].as_object();
                let mimes: Vec<&str> = data
                    .map(|d| d.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let text = data
                    .and_then(|d| d.get("text/plain"))
                    .map(|t| truncate(source_text(&json!({"source": t})).trim(), 200))
                    .unwrap_or_default();
                format!("{kind} [{}]: {text}", mimes.join(", "))
            }
            other => other.to_owned(),
        })
        .collect()
}

impl Notebook {
    /// Reads and checks a notebook file.
    pub fn read(path: &Path, shown: &str) -> Result<Self, ToolError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ToolError::failed(format!("cannot read {shown}: {e}")))?;
        Self::parse(&text, shown)
    }

    /// Reads the notebook at `path`, a path confined under `workspace`,
    /// where it was checked ([`omicos_toolkit::open_confined`]: a directory
    /// swapped for a link since fails the read, never redirects it).
    pub fn read_confined(workspace: &Path, path: &Path, shown: &str) -> Result<Self, ToolError> {
        let mut text = String::new();
        omicos_toolkit::open_confined(workspace, path, omicos_toolkit::OpenFor::Read)
            .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
            .map_err(|e| ToolError::failed(format!("cannot read {shown}: {e}")))?;
        Self::parse(&text, shown)
    }

    fn parse(text: &str, shown: &str) -> Result<Self, ToolError> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            ToolError::failed(format!("{shown} is not a notebook (invalid JSON: {e})"))
        })?;
        Self::check(v, shown)
    }

    fn check(v: Value, shown: &str) -> Result<Self, ToolError> {
        if v["nbformat"].as_i64() != Some(4) {
            return Err(ToolError::failed(format!(
                "{shown} is not an nbformat 4 notebook (nbformat = {})",
                v["nbformat"]
            )));
        }
        if !v["cells"].is_array() {
            return Err(ToolError::failed(format!("{shown} has no cells array")));
        }
        Ok(Self(v))
    }

    /// An empty nbformat 4.5 notebook for a Python kernel.
    pub fn new_empty() -> Self {
        Self(json!({
            "cells": [],
            "metadata": {
                "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                "language_info": {"name": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5
        }))
    }

    /// The cells.
    pub fn cells(&self) -> &Vec<Value> {
        self.0["cells"].as_array().expect("checked on read")
    }

    /// The cells, to change.
    pub fn cells_mut(&mut self) -> &mut Vec<Value> {
        self.0["cells"].as_array_mut().expect("checked on read")
    }

    /// A new cell of `cell_type` with `source`.
    pub fn new_cell(&self, cell_type: &str, source: &str) -> Value {
        let mut c = Map::new();
        c.insert("cell_type".into(), json!(cell_type));
        if self.0["nbformat_minor"].as_i64().unwrap_or(0) >= 5 {
            c.insert(
                "id".into(),
                json!(uuid::Uuid::new_v4().simple().to_string()[..8]),
            );
        }
        c.insert("metadata".into(), json!({}));
        c.insert("source".into(), source_lines(source));
        if cell_type == "code" {
            c.insert("execution_count".into(), Value::Null);
            c.insert("outputs".into(), json!([]));
        }
        Value::Object(c)
    }

    /// Writes the notebook at once at `path`, a path confined under
    /// `workspace`, where it was checked ([`omicos_toolkit::replace_confined`]).
    pub fn write_confined(
        &self,
        workspace: &Path,
        path: &Path,
        shown: &str,
    ) -> Result<(), ToolError> {
        let mut text = serde_json::to_string_pretty(&self.0).expect("notebook serializes");
        text.push('\n');
        omicos_toolkit::replace_confined(workspace, path, text.as_bytes())
            .map_err(|e| ToolError::failed(format!("cannot write {shown}: {e}")))
    }

    /// Writes the notebook atomically (temp file, then rename).
    pub fn write(&self, path: &Path, shown: &str) -> Result<(), ToolError> {
        let mut text = serde_json::to_string_pretty(&self.0).expect("notebook serializes");
        text.push('\n');
        let tmp = path.with_extension(format!("ipynb.tmp-{}", std::process::id()));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                ToolError::failed(format!("cannot create the folder of {shown}: {e}"))
            })?;
        }
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                ToolError::failed(format!("cannot write {shown}: {e}"))
            })
    }

    /// What notebook__inspect returns.
    pub fn inspect(&self, shown: &str) -> Value {
        let cells: Vec<Value> = self
            .cells()
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({
                    "index": i,
                    "cell_type": c["cell_type"],
                    "source": source_text(c),
                });
                if c["cell_type"] == "code" {
                    v["execution_count"] = c["execution_count"].clone();
                    v["outputs"] = json!(summarize_outputs(c));
                }
                v
            })
            .collect();
        json!({"path": shown, "nbformat": format!("{}.{}", self.0["nbformat"], self.0["nbformat_minor"]), "cell_count": cells.len(), "cells": cells})
    }

    /// Applies notebook__edit's action.
    pub fn edit(
        &mut self,
        action: &str,
        index: Option<usize>,
        source: Option<&str>,
        cell_type: Option<&str>,
    ) -> Result<String, ToolError> {
        let len = self.cells().len();
        let ct = cell_type.unwrap_or("code");
        if !matches!(ct, "code" | "markdown" | "raw") {
            return Err(ToolError::invalid(format!(
                "cell_type `{ct}` is not one of code, markdown, raw"
            )));
        }
        match action {
            "insert" => {
                let at = index.unwrap_or(len);
                if at > len {
                    return Err(ToolError::invalid(format!(
                        "index {at} is past the end: the notebook has {len} cells (insert accepts 0..={len})"
                    )));
                }
                let cell = self.new_cell(
                    ct,
                    source.ok_or_else(|| ToolError::invalid("insert needs source"))?,
                );
                self.cells_mut().insert(at, cell);
                Ok(format!("inserted a {ct} cell at index {at}"))
            }
            "replace" => {
                let at = index.ok_or_else(|| ToolError::invalid("replace needs index"))?;
                if at >= len {
                    return Err(ToolError::invalid(format!(
                        "index {at} does not exist: the notebook has {len} cells"
                    )));
                }
                let src = source.ok_or_else(|| ToolError::invalid("replace needs source"))?;
                let old_type = self.cells()[at]["cell_type"]
                    .as_str()
                    .unwrap_or("code")
                    .to_owned();
                let ct = cell_type.unwrap_or(&old_type).to_owned();
                let mut cell = self.new_cell(&ct, src);
                // Keep the cell's id and metadata; a replaced code cell loses its stale outputs.
                if let Some(id) = self.cells()[at].get("id") {
                    cell["id"] = id.clone();
                }
                cell["metadata"] = self.cells()[at]["metadata"].clone();
                if cell["metadata"].is_null() {
                    cell["metadata"] = json!({});
                }
                self.cells_mut()[at] = cell;
                Ok(format!("replaced cell {at} ({ct})"))
            }
            "delete" => {
                let at = index.ok_or_else(|| ToolError::invalid("delete needs index"))?;
                if at >= len {
                    return Err(ToolError::invalid(format!(
                        "index {at} does not exist: the notebook has {len} cells"
                    )));
                }
                self.cells_mut().remove(at);
                Ok(format!("deleted cell {at}"))
            }
            other => Err(ToolError::invalid(format!(
                "action `{other}` is not one of replace, insert, delete"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_and_inspect() {
        let mut nb = Notebook::new_empty();
        nb.edit("insert", None, Some("x = 1\nx + 1"), None).unwrap();
        nb.edit("insert", Some(0), Some("# Title"), Some("markdown"))
            .unwrap();
        assert!(nb.edit("insert", Some(5), Some("y"), None).is_err());
        assert!(nb.edit("replace", Some(9), Some("y"), None).is_err());
        assert!(nb.edit("move", Some(0), None, None).is_err());
        nb.edit("replace", Some(1), Some("x = 2"), None).unwrap();
        let v = nb.inspect("a.ipynb");
        assert_eq!(v["cell_count"], 2);
        assert_eq!(v["cells"][0]["cell_type"], "markdown");
        assert_eq!(v["cells"][1]["source"], "x = 2");
        nb.edit("delete", Some(0), None, None).unwrap();
        assert_eq!(nb.cells().len(), 1);
        let bad = serde_json::json!({"nbformat": 3, "worksheets": []});
        assert!(Notebook::check(bad, "old.ipynb").is_err());
    }
}
