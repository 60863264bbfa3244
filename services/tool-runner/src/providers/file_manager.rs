//! `file_manager__list/read/write/edit/glob/grep`: files of the workspace, every
//! path through `confine_path` (no `..`, absolute path or symlink leaves it).

use async_trait::async_trait;
use omicos_proto::{Risk, ToolSpec};
use omicos_toolkit::{
    CallCtx, OpenFor, Provider, ToolError, confine::relative_to, confine_path, open_confined, tool,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Default lines returned by a read.
const READ_DEFAULT_LINES: usize = 2000;
/// A read returns at most this many bytes, below the spool threshold, so that
/// reading a spooled file never spools again; the reply says where to continue.
const READ_MAX_BYTES: usize = 15_000;
/// Entries listed, files matched by glob.
const MAX_ENTRIES: usize = 1000;
/// Grep: default and hard cap of matching lines; longest line shown; largest file searched.
const GREP_DEFAULT_MATCHES: usize = 200;
const GREP_MAX_MATCHES: usize = 2000;
const GREP_LINE_CHARS: usize = 300;
const GREP_MAX_FILE_BYTES: u64 = 10 << 20;

/// The file_manager provider.
#[derive(Clone, Debug, Default)]
pub struct FileManager;

fn s<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn path_arg<'a>(args: &'a Value, key: &str, default: &'a str) -> &'a str {
    s(args, key).unwrap_or(default)
}

fn confine(ctx: &CallCtx, p: &str) -> Result<PathBuf, ToolError> {
    confine_path(&ctx.workspace, p).map_err(|e| ToolError::invalid(e.to_string()))
}

/// What a file tool may do with a path under `.omicos/`, omicos's own state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not omicos's state: an ordinary workspace file.
    Outside,
    /// A place the model is meant to read: the calling session's own spooled
    /// outputs, outputs, trajectory, plan and task list.
    Readable,
    /// A spool file from before spools had a directory per session: read by
    /// its name (a call id the session was told), never found by a walk.
    ReadableByName,
    /// Everything else there: the bearer token, the session and memory
    /// stores, other sessions' files, kernel markers, the agent files.
    Closed,
}

/// Where paths lie in `.omicos/` for one call: the workspace resolved once
/// (confined paths and the walks under them are resolved paths).
struct StateMap<'a> {
    root: PathBuf,
    session: &'a str,
}

impl<'a> StateMap<'a> {
    fn of(ctx: &'a CallCtx) -> Self {
        Self {
            root: ctx
                .workspace
                .canonicalize()
                .unwrap_or_else(|_| ctx.workspace.clone()),
            session: &ctx.session_id,
        }
    }

    /// The components of `path` below the workspace when it is under
    /// `.omicos/` (the first is `.omicos`), else None.
    fn parts<'p>(&self, path: &'p Path) -> Option<Vec<&'p std::ffi::OsStr>> {
        let parts: Vec<&std::ffi::OsStr> = path.strip_prefix(&self.root).ok()?.iter().collect();
        (parts.first().is_some_and(|c| *c == ".omicos")).then_some(parts)
    }

    /// Where `path` (already confined) lies in `.omicos/` for the calling
    /// session. Nothing under `.omicos/` is ever writable by a file tool.
    fn state(&self, path: &Path) -> State {
        let Some(parts) = self.parts(path) else {
            return State::Outside;
        };
        let own_file = |ext: &str| {
            parts.len() == 3
                && parts[2] == std::ffi::OsString::from(format!("{}.{ext}", self.session))
        };
        let readable = !self.session.is_empty()
            && match parts.get(1).and_then(|c| c.to_str()) {
                // Spooled results live in the session's own directory. A
                // file directly under tool_outputs/ is from before that
                // layout (named by call id; readable as it was), never a
                // directory: that would be another session's.
                Some("tool_outputs") if parts.len() == 3 && path.is_file() => {
                    return State::ReadableByName;
                }
                Some("tool_outputs") => parts.len() >= 3 && parts[2] == self.session,
                Some("outputs" | "trajectories") => parts.len() >= 3 && parts[2] == self.session,
                Some("plans") => own_file("md"),
                Some("tasks") => own_file("json"),
                _ => false,
            };
        if readable {
            State::Readable
        } else {
            State::Closed
        }
    }

    /// `.omicos` or one of its areas (`outputs`, `trajectories`, `plans`,
    /// `tasks`): a directory on the way to the session's own files, entered
    /// but not listed for itself.
    fn is_way_to_readable(&self, path: &Path) -> bool {
        self.parts(path).is_some_and(|parts| {
            path.is_dir()
                && match parts.as_slice() {
                    [_] => true,
                    [_, area] => ["outputs", "tool_outputs", "trajectories", "plans", "tasks"]
                        .iter()
                        .any(|a| *area == *a),
                    _ => false,
                }
        })
    }
}

/// Refuses a read of omicos's state other than the session's own.
fn refuse_closed(ctx: &CallCtx, path: &Path, given: &str) -> Result<(), ToolError> {
    if StateMap::of(ctx).state(path) == State::Closed {
        return Err(ToolError::invalid(format!(
            "`{given}` is inside .omicos/, omicos's own state (the token, the stores, other \
             sessions' files): no tool reads it. Readable there: this session's \
             .omicos/tool_outputs/{s}/ (spooled outputs), .omicos/outputs/{s}/, \
             .omicos/trajectories/{s}/, .omicos/plans/{s}.md, .omicos/tasks/{s}.json",
            s = ctx.session_id
        )));
    }
    Ok(())
}

/// Refuses a walk rooted in closed state (a directory on the way to the
/// session's own files may be walked: the walk skips what is closed).
fn refuse_closed_dir(ctx: &CallCtx, path: &Path, given: &str) -> Result<(), ToolError> {
    if StateMap::of(ctx).is_way_to_readable(path) {
        return Ok(());
    }
    refuse_closed(ctx, path, given)
}

/// Refuses a write or an edit anywhere under `.omicos/`.
fn refuse_internal(ctx: &CallCtx, path: &Path, given: &str) -> Result<(), ToolError> {
    if StateMap::of(ctx).state(path) != State::Outside {
        return Err(ToolError::invalid(format!(
            "`{given}` is inside .omicos/, omicos's own state (trajectories, spool, stores): \
             no tool writes it"
        )));
    }
    Ok(())
}

/// A walk (list, glob, grep) does not enter closed state: it skips it. The
/// workspace is resolved once for the whole walk.
fn walk<'a>(
    ctx: &'a CallCtx,
    root: &Path,
    max_depth: usize,
) -> impl Iterator<Item = walkdir::DirEntry> + 'a {
    let map = StateMap::of(ctx);
    walkdir::WalkDir::new(root)
        .max_depth(max_depth)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(move |e| {
            e.depth() == 0
                || match map.state(e.path()) {
                    State::Outside | State::Readable => true,
                    // `.omicos` itself and the area directories are walked
                    // into only as far as the session's own files.
                    State::Closed => map.is_way_to_readable(e.path()),
                    State::ReadableByName => false,
                }
        })
        .flatten()
}

/// The whole file, read where it was checked ([`open_confined`]).
fn read_confined(ctx: &CallCtx, path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = open_confined(&ctx.workspace, path, OpenFor::Read)?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut b)?;
    Ok(b)
}

fn io_err(what: &str, path: &str, e: std::io::Error) -> ToolError {
    ToolError::failed(format!("cannot {what} `{path}`: {e}"))
}

#[async_trait]
impl Provider for FileManager {
    fn name(&self) -> &str {
        "file_manager"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "file_manager__list",
                "List a directory of the workspace (name, kind, size). Set recursive to walk subdirectories.",
                json!({"type":"object","properties":{
                    "path":{"type":"string","description":"Directory, relative to the workspace (default: the workspace root)."},
                    "recursive":{"type":"boolean","description":"Walk subdirectories (at most 1000 entries)."}
                },"additionalProperties":false}),
            )
            .toolset("file_manager")
            .build(),
            tool(
                "file_manager__read",
                "Read a text file of the workspace. offset is the first line (1-based), limit the number of lines. Use it to page through spooled tool outputs.",
                json!({"type":"object","properties":{
                    "path":{"type":"string"},
                    "offset":{"type":"integer","minimum":1,"description":"First line to read, 1-based (default 1)."},
                    "limit":{"type":"integer","minimum":1,"description":"Lines to read (default 2000)."}
                },"required":["path"],"additionalProperties":false}),
            )
            .toolset("file_manager")
            .alias("read_file")
            .build(),
            tool(
                "file_manager__write",
                "Write a text file of the workspace (parent directories are created). Replaces the file unless append is true.",
                json!({"type":"object","properties":{
                    "path":{"type":"string"},
                    "content":{"type":"string"},
                    "append":{"type":"boolean"}
                },"required":["path","content"],"additionalProperties":false}),
            )
            .toolset("file_manager")
            .risk(Risk::FileWrite)
            .alias("write_file")
            .build(),
            tool(
                "file_manager__edit",
                "Replace old_string by new_string in a file. old_string must occur exactly once unless replace_all is true.",
                json!({"type":"object","properties":{
                    "path":{"type":"string"},
                    "old_string":{"type":"string","minLength":1},
                    "new_string":{"type":"string"},
                    "replace_all":{"type":"boolean"}
                },"required":["path","old_string","new_string"],"additionalProperties":false}),
            )
            .toolset("file_manager")
            .risk(Risk::FileWrite)
            .build(),
            tool(
                "file_manager__glob",
                "Find files whose workspace-relative path matches a glob (e.g. `**/*.py`).",
                json!({"type":"object","properties":{
                    "pattern":{"type":"string","minLength":1},
                    "path":{"type":"string","description":"Directory to search from (default: the workspace root)."}
                },"required":["pattern"],"additionalProperties":false}),
            )
            .toolset("file_manager")
            .build(),
            tool(
                "file_manager__grep",
                "Search files for a regex; returns `path:line: text` for each matching line.",
                json!({"type":"object","properties":{
                    "pattern":{"type":"string","minLength":1},
                    "path":{"type":"string","description":"File or directory to search (default: the workspace root)."},
                    "glob":{"type":"string","description":"Only files whose relative path matches this glob."},
                    "case_insensitive":{"type":"boolean"},
                    "max_matches":{"type":"integer","minimum":1,"maximum":GREP_MAX_MATCHES}
                },"required":["pattern"],"additionalProperties":false}),
            )
            .toolset("file_manager")
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        confine(ctx, path_arg(args, "path", "."))?;
        match tool {
            "file_manager__edit" if s(args, "old_string") == s(args, "new_string") => {
                return Err(ToolError::invalid(
                    "old_string and new_string are the same: nothing to edit",
                ));
            }
            "file_manager__grep" => {
                regex::Regex::new(s(args, "pattern").unwrap_or_default()).map_err(|e| {
                    ToolError::invalid(format!("pattern is not a valid regex: {e}"))
                })?;
                if let Some(g) = s(args, "glob") {
                    globset::Glob::new(g)
                        .map_err(|e| ToolError::invalid(format!("glob is not valid: {e}")))?;
                }
            }
            "file_manager__glob" => {
                globset::Glob::new(s(args, "pattern").unwrap_or_default())
                    .map_err(|e| ToolError::invalid(format!("pattern is not a valid glob: {e}")))?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let tool = tool.to_owned();
        // File work is blocking; keep it off the async workers.
        tokio::task::spawn_blocking(move || match tool.as_str() {
            "file_manager__list" => list(&args, &ctx),
            "file_manager__read" => read(&args, &ctx),
            "file_manager__write" => write(&args, &ctx),
            "file_manager__edit" => edit(&args, &ctx),
            "file_manager__glob" => glob(&args, &ctx),
            "file_manager__grep" => grep(&args, &ctx),
            other => Err(ToolError::UnknownTool(other.to_owned())),
        })
        .await
        .map_err(|e| ToolError::failed(format!("file_manager task failed: {e}")))?
    }
}

fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else {
        "file"
    }
}

fn list(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let given = path_arg(args, "path", ".");
    let dir = confine(ctx, given)?;
    refuse_closed_dir(ctx, &dir, given)?;
    if !dir.is_dir() {
        return Err(ToolError::failed(format!("`{given}` is not a directory")));
    }
    let recursive = args
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut entries = Vec::new();
    let mut truncated = false;
    for e in walk(ctx, &dir, if recursive { usize::MAX } else { 1 }).filter(|e| e.depth() > 0) {
        if entries.len() >= MAX_ENTRIES {
            truncated = true;
            break;
        }
        let size = e.metadata().map(|m| m.len()).unwrap_or(0);
        entries.push(json!({
            "path": relative_to(&ctx.workspace, e.path()),
            "kind": kind(e.file_type()),
            "size": size,
        }));
    }
    Ok(
        json!({"path": relative_to(&ctx.workspace, &dir), "entries": entries, "truncated": truncated}),
    )
}

fn read(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let given = path_arg(args, "path", "");
    let path = confine(ctx, given)?;
    refuse_closed(ctx, &path, given)?;
    if path.is_dir() {
        return Err(ToolError::failed(format!(
            "`{given}` is a directory; use file_manager__list"
        )));
    }
    let bytes = read_confined(ctx, &path).map_err(|e| io_err("read", given, e))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        ToolError::failed(format!(
            "`{given}` is not UTF-8 text ({} bytes); it cannot be read as text",
            e.as_bytes().len()
        ))
    })?;
    let offset = args
        .get("offset")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1) as usize;
    let limit = args
        .get("limit")
        .and_then(Value::as_u64)
        .map(|l| l as usize)
        .unwrap_or(READ_DEFAULT_LINES);
    let total = text.lines().count();
    if offset == 1 && limit >= total && text.len() <= READ_MAX_BYTES {
        return Ok(Value::String(text));
    }
    if offset > total.max(1) {
        return Err(ToolError::failed(format!(
            "offset {offset} is past the end of `{given}` ({total} lines)"
        )));
    }
    let mut out = String::new();
    let mut last = offset - 1;
    for (i, line) in text
        .split_inclusive('\n')
        .enumerate()
        .skip(offset - 1)
        .take(limit)
    {
        if out.len() + line.len() > READ_MAX_BYTES && i >= offset {
            break;
        }
        out.push_str(line);
        last = i + 1;
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if last < total {
        out.push_str(&format!(
            "[lines {offset}-{last} of {total}; continue with offset={}]",
            last + 1
        ));
    } else {
        out.push_str(&format!("[lines {offset}-{last} of {total}; end of file]"));
    }
    Ok(Value::String(out))
}

fn write(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let given = path_arg(args, "path", "");
    let path = confine(ctx, given)?;
    refuse_internal(ctx, &path, given)?;
    let content = s(args, "content").unwrap_or_default();
    if path.is_dir() {
        return Err(ToolError::failed(format!("`{given}` is a directory")));
    }
    let append = args.get("append").and_then(Value::as_bool).unwrap_or(false);
    // What the path held before: the turn's checkpoint (RewindSession).
    ctx.file_changes.before_change(&ctx.workspace, &path);
    // Opened where it was checked, its directories made on the way: a
    // directory swapped for a symlink since (by a job of the session's box)
    // fails the write instead of redirecting it.
    let how = if append {
        OpenFor::Append
    } else {
        OpenFor::Write
    };
    open_confined(&ctx.workspace, &path, how)
        .and_then(|mut f| std::io::Write::write_all(&mut f, content.as_bytes()))
        .map_err(|e| io_err("write", given, e))?;
    Ok(Value::String(format!(
        "{} {} bytes to {}",
        if append { "appended" } else { "wrote" },
        content.len(),
        relative_to(&ctx.workspace, &path)
    )))
}

fn edit(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let given = path_arg(args, "path", "");
    let path = confine(ctx, given)?;
    refuse_internal(ctx, &path, given)?;
    let old = s(args, "old_string").unwrap_or_default();
    let new = s(args, "new_string").unwrap_or_default();
    let replace_all = args
        .get("replace_all")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let text = read_confined(ctx, &path)
        .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
        .map_err(|e| io_err("read", given, e))?;
    let count = text.matches(old).count();
    if count == 0 {
        return Err(ToolError::failed(format!(
            "old_string was not found in `{given}`; nothing changed"
        )));
    }
    if count > 1 && !replace_all {
        return Err(ToolError::failed(format!(
            "old_string occurs {count} times in `{given}`; add surrounding context to make it unique, or set replace_all"
        )));
    }
    let updated = if replace_all {
        text.replace(old, new)
    } else {
        text.replacen(old, new, 1)
    };
    ctx.file_changes.before_change(&ctx.workspace, &path);
    open_confined(&ctx.workspace, &path, OpenFor::Write)
        .and_then(|mut f| std::io::Write::write_all(&mut f, updated.as_bytes()))
        .map_err(|e| io_err("write", given, e))?;
    Ok(Value::String(format!(
        "replaced {count} occurrence{} in {}",
        if count == 1 { "" } else { "s" },
        relative_to(&ctx.workspace, &path)
    )))
}

fn glob(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let base_given = path_arg(args, "path", ".");
    let base = confine(ctx, base_given)?;
    refuse_closed_dir(ctx, &base, base_given)?;
    let pattern = s(args, "pattern").unwrap_or_default();
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| ToolError::invalid(format!("pattern is not a valid glob: {e}")))?
        .compile_matcher();
    let mut found = Vec::new();
    let mut truncated = false;
    for e in walk(ctx, &base, usize::MAX).filter(|e| e.depth() > 0) {
        let rel = e.path().strip_prefix(&base).unwrap_or(e.path());
        if matcher.is_match(rel) {
            if found.len() >= MAX_ENTRIES {
                truncated = true;
                break;
            }
            found.push(relative_to(&ctx.workspace, e.path()));
        }
    }
    Ok(json!({"matches": found, "truncated": truncated}))
}

fn grep(args: &Value, ctx: &CallCtx) -> Result<Value, ToolError> {
    let given = path_arg(args, "path", ".");
    let root = confine(ctx, given)?;
    refuse_closed_dir(ctx, &root, given)?;
    let pattern = s(args, "pattern").unwrap_or_default();
    let re = regex::RegexBuilder::new(pattern)
        .case_insensitive(
            args.get("case_insensitive")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        )
        .size_limit(1 << 20)
        .build()
        .map_err(|e| ToolError::invalid(format!("pattern is not a valid regex: {e}")))?;
    let filter = match s(args, "glob") {
        Some(g) => Some(
            globset::Glob::new(g)
                .map_err(|e| ToolError::invalid(format!("glob is not valid: {e}")))?
                .compile_matcher(),
        ),
        None => None,
    };
    let max = args
        .get("max_matches")
        .and_then(Value::as_u64)
        .map(|m| m as usize)
        .unwrap_or(GREP_DEFAULT_MATCHES)
        .min(GREP_MAX_MATCHES);
    let mut lines = Vec::new();
    let mut truncated = false;
    'files: for e in walk(ctx, &root, usize::MAX) {
        // Symlinks are not followed: a link out of the workspace is never read.
        if !e.file_type().is_file() {
            continue;
        }
        let rel = relative_to(&ctx.workspace, e.path());
        if let Some(f) = &filter
            && !f.is_match(Path::new(&rel))
            && !f.is_match(e.file_name())
        {
            continue;
        }
        if e.metadata()
            .map(|m| m.len() > GREP_MAX_FILE_BYTES)
            .unwrap_or(true)
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                if lines.len() >= max {
                    truncated = true;
                    break 'files;
                }
                let shown: String = line.chars().take(GREP_LINE_CHARS).collect();
                lines.push(format!("{rel}:{}: {shown}", i + 1));
            }
        }
    }
    let mut out = if lines.is_empty() {
        "no matches".to_owned()
    } else {
        lines.join("\n")
    };
    if truncated {
        out.push_str(&format!(
            "\n[stopped after {max} matches; narrow the pattern or path]"
        ));
    }
    Ok(Value::String(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn call(ws: &Path, tool: &str, args: Value) -> Result<Value, ToolError> {
        let ctx = CallCtx::for_test(ws.canonicalize().unwrap(), "s");
        let fm = FileManager;
        fm.validate_input(tool, &args, &ctx)?;
        fm.call(tool, args, ctx).await
    }

    #[tokio::test]
    async fn write_read_edit_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        call(
            d.path(),
            "file_manager__write",
            json!({"path":"a/b.txt","content":"one\ntwo\ntwo\n"}),
        )
        .await
        .unwrap();
        assert_eq!(
            call(d.path(), "file_manager__read", json!({"path":"a/b.txt"}))
                .await
                .unwrap(),
            json!("one\ntwo\ntwo\n")
        );
        let e = call(
            d.path(),
            "file_manager__edit",
            json!({"path":"a/b.txt","old_string":"two","new_string":"2"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("occurs 2 times"), "{e}");
        let e = call(
            d.path(),
            "file_manager__edit",
            json!({"path":"a/b.txt","old_string":"zzz","new_string":"2"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
        call(
            d.path(),
            "file_manager__edit",
            json!({"path":"a/b.txt","old_string":"one","new_string":"1"}),
        )
        .await
        .unwrap();
        call(
            d.path(),
            "file_manager__edit",
            json!({"path":"a/b.txt","old_string":"two","new_string":"2","replace_all":true}),
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("a/b.txt")).unwrap(),
            "1\n2\n2\n"
        );
        call(
            d.path(),
            "file_manager__write",
            json!({"path":"a/b.txt","content":"3\n","append":true}),
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("a/b.txt")).unwrap(),
            "1\n2\n2\n3\n"
        );
    }

    #[tokio::test]
    async fn read_pages_by_lines() {
        let d = tempfile::tempdir().unwrap();
        let text: String = (1..=100).map(|i| format!("L{i}\n")).collect();
        std::fs::write(d.path().join("f.txt"), &text).unwrap();
        let v = call(
            d.path(),
            "file_manager__read",
            json!({"path":"f.txt","offset":10,"limit":3}),
        )
        .await
        .unwrap();
        assert_eq!(
            v,
            json!("L10\nL11\nL12\n[lines 10-12 of 100; continue with offset=13]")
        );
        let big: String = (0..5000).map(|i| format!("{i:080}\n")).collect();
        std::fs::write(d.path().join("big.txt"), &big).unwrap();
        let v = call(d.path(), "file_manager__read", json!({"path":"big.txt"}))
            .await
            .unwrap();
        let s = v.as_str().unwrap();
        assert!(
            s.len() < 16 * 1024,
            "a read must stay under the spool threshold"
        );
        assert!(
            s.contains("continue with offset="),
            "{}",
            &s[s.len() - 80..]
        );
        let e = call(
            d.path(),
            "file_manager__read",
            json!({"path":"f.txt","offset":500}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("past the end"));
    }

    #[tokio::test]
    async fn glob_grep_list() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/x")).unwrap();
        std::fs::write(d.path().join("src/a.py"), "import os\nprint('hi')\n").unwrap();
        std::fs::write(d.path().join("src/x/b.py"), "PRINT\n").unwrap();
        std::fs::write(d.path().join("c.txt"), "print\n").unwrap();
        let v = call(d.path(), "file_manager__glob", json!({"pattern":"**/*.py"}))
            .await
            .unwrap();
        assert_eq!(v["matches"], json!(["src/a.py", "src/x/b.py"]));
        let v = call(
            d.path(),
            "file_manager__grep",
            json!({"pattern":"print","glob":"*.py","case_insensitive":true}),
        )
        .await
        .unwrap();
        assert_eq!(v, json!("src/a.py:2: print('hi')\nsrc/x/b.py:1: PRINT"));
        let v = call(
            d.path(),
            "file_manager__grep",
            json!({"pattern":"print","max_matches":1}),
        )
        .await
        .unwrap();
        assert!(v.as_str().unwrap().contains("stopped after 1 matches"));
        let v = call(d.path(), "file_manager__list", json!({}))
            .await
            .unwrap();
        let names: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["c.txt", "src"]);
        let e = call(d.path(), "file_manager__grep", json!({"pattern":"("}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a valid regex"));
    }

    #[tokio::test]
    async fn omicos_state_is_closed_but_the_sessions_own_files() {
        let d = tempfile::tempdir().unwrap();
        let st = d.path().join(".omicos");
        for dir in [
            "trajectories/s",
            "trajectories/s1",
            "outputs/s",
            "outputs/s1",
            "tool_outputs/s",
            "tool_outputs/s1",
            "plans",
            "tasks",
            "kernels",
        ] {
            std::fs::create_dir_all(st.join(dir)).unwrap();
        }
        let secret = "S3CRET-omicos-state";
        for f in [
            "token",
            "sessions.db",
            "memory.db",
            "trajectories/s1/turn.jsonl",
            "outputs/s1/img.txt",
            "tool_outputs/s1/2__d.txt",
            "plans/s1.md",
            "tasks/s1.json",
            "kernels/s1.json",
        ] {
            std::fs::write(st.join(f), format!("{secret} {f}\n")).unwrap();
        }
        for f in [
            "trajectories/s/turn.jsonl",
            "outputs/s/img.txt",
            "tool_outputs/17__c.txt",
            "tool_outputs/s/1__c.txt",
            "plans/s.md",
            "tasks/s.json",
        ] {
            std::fs::write(st.join(f), format!("mine {f}\n")).unwrap();
        }
        std::os::unix::fs::symlink(".omicos/token", d.path().join("t")).unwrap();
        std::os::unix::fs::symlink(".omicos", d.path().join("state")).unwrap();
        // The session's own files, its spool and a spool file of the old
        // flat layout, by name, read as before.
        for f in [
            "trajectories/s/turn.jsonl",
            "outputs/s/img.txt",
            "tool_outputs/17__c.txt",
            "tool_outputs/s/1__c.txt",
            "plans/s.md",
            "tasks/s.json",
        ] {
            let v = call(
                d.path(),
                "file_manager__read",
                json!({"path": format!(".omicos/{f}")}),
            )
            .await
            .unwrap();
            assert!(v.to_string().contains("mine"), "{f}: {v}");
        }
        // The token, the stores and other sessions' files: no read, by any path.
        for p in [
            ".omicos/token",
            "./.omicos/token",
            "sub/../.omicos/token",
            "t",
            "state/token",
            ".omicos/sessions.db",
            ".omicos/memory.db",
            ".omicos/kernels/s1.json",
            ".omicos/trajectories/s1/turn.jsonl",
            ".omicos/outputs/s1/img.txt",
            ".omicos/outputs/s/../s1/img.txt",
            ".omicos/tool_outputs/s1/2__d.txt",
            ".omicos/tool_outputs/s/../s1/2__d.txt",
            ".omicos/tool_outputs/s1",
            ".omicos/plans/s1.md",
            ".omicos/tasks/s1.json",
        ] {
            let e = call(d.path(), "file_manager__read", json!({"path": p}))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("no tool reads it"), "{p}: {e}");
        }
        for (tool, args) in [
            (
                "file_manager__list",
                json!({"path": ".omicos/tool_outputs/s1"}),
            ),
            (
                "file_manager__grep",
                json!({"pattern": "S3CRET", "path": ".omicos/tool_outputs/s1"}),
            ),
            ("file_manager__list", json!({"path": ".omicos/kernels"})),
            ("file_manager__list", json!({"path": "state/outputs/s1"})),
            (
                "file_manager__grep",
                json!({"pattern": "S3CRET", "path": ".omicos/token"}),
            ),
            (
                "file_manager__glob",
                json!({"pattern": "*", "path": ".omicos/trajectories/s1"}),
            ),
        ] {
            let e = call(d.path(), tool, args.clone()).await.unwrap_err();
            assert!(
                e.to_string().contains("no tool reads it"),
                "{tool} {args}: {e}"
            );
        }
        // Walks over the workspace skip what is closed and keep what is the session's.
        let all = call(
            d.path(),
            "file_manager__grep",
            json!({"pattern": "S3CRET|mine"}),
        )
        .await
        .unwrap()
        .to_string();
        assert!(!all.contains("S3CRET"), "{all}");
        assert!(all.contains(".omicos/outputs/s/img.txt"), "{all}");
        let listed = call(d.path(), "file_manager__list", json!({"recursive": true}))
            .await
            .unwrap()
            .to_string();
        for closed in ["token", "sessions.db", "s1", "17__c.txt", "2__d", "kernels"] {
            assert!(!listed.contains(closed), "{closed} listed: {listed}");
        }
        assert!(
            listed.contains("1__c.txt"),
            "the session's own spool: {listed}"
        );
        // The spool lists as far as the session's own directory.
        let spool = call(
            d.path(),
            "file_manager__list",
            json!({"path": ".omicos/tool_outputs", "recursive": true}),
        )
        .await
        .unwrap()
        .to_string();
        assert!(spool.contains("1__c.txt"), "{spool}");
        for closed in ["s1", "2__d", "17__c"] {
            assert!(!spool.contains(closed), "{closed} listed: {spool}");
        }
        let globbed = call(d.path(), "file_manager__glob", json!({"pattern": "**/*"}))
            .await
            .unwrap()
            .to_string();
        assert!(
            !globbed.contains("token") && !globbed.contains("s1"),
            "{globbed}"
        );
        // Nothing there is writable, the session's own files included.
        for (tool, args) in [
            (
                "file_manager__write",
                json!({"path":".omicos/trajectories/s/turn.jsonl","content":"forged"}),
            ),
            (
                "file_manager__write",
                json!({"path":".omicos/new.txt","content":"x"}),
            ),
            (
                "file_manager__write",
                json!({"path":"./.omicos/token","content":"x","append":true}),
            ),
            ("file_manager__write", json!({"path":"t","content":"x"})),
            (
                "file_manager__edit",
                json!({"path":".omicos/outputs/s/img.txt","old_string":"mine","new_string":"x"}),
            ),
        ] {
            let e = call(d.path(), tool, args.clone()).await.unwrap_err();
            assert!(
                e.to_string().contains("no tool writes it"),
                "{tool} {args}: {e}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(st.join("token")).unwrap(),
            format!("{secret} token\n")
        );
        assert_eq!(
            std::fs::read_to_string(st.join("trajectories/s/turn.jsonl")).unwrap(),
            "mine trajectories/s/turn.jsonl\n"
        );
        assert!(!st.join("new.txt").exists());
        // A file merely named like it elsewhere is an ordinary file.
        call(
            d.path(),
            "file_manager__write",
            json!({"path":"notes/.omicos","content":"ok"}),
        )
        .await
        .unwrap();
        call(
            d.path(),
            "file_manager__read",
            json!({"path":"notes/.omicos"}),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s3cret").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        for (tool, args) in [
            ("file_manager__read", json!({"path":"../../etc/passwd"})),
            ("file_manager__read", json!({"path":"/etc/passwd"})),
            ("file_manager__read", json!({"path":"link/secret"})),
            (
                "file_manager__write",
                json!({"path":"link/new","content":"x"}),
            ),
            ("file_manager__list", json!({"path":"link"})),
            (
                "file_manager__grep",
                json!({"pattern":"s3cret","path":"link"}),
            ),
        ] {
            let e = call(d.path(), tool, args.clone()).await.unwrap_err();
            assert!(
                e.to_string().contains("outside the workspace"),
                "{tool} {args}: {e}"
            );
        }
        assert!(!outside.path().join("new").exists());
        // grep over the whole workspace does not follow the link out.
        let v = call(d.path(), "file_manager__grep", json!({"pattern":"s3cret"}))
            .await
            .unwrap();
        assert_eq!(v, json!("no matches"));
    }
}
