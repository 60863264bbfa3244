//! `skill_lookup`, `skill` and `skill_resource`: the model finds a skill,
//! reads its instructions, and fetches the files they refer to.

use super::str_arg;
use crate::catalog::Catalog;
use crate::skill::Skill;
use async_trait::async_trait;
use base64::Engine;
use omicos_toolkit::{CallCtx, Provider, ToolError, ToolSpec, tool};
use serde_json::{Value, json};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Resource files larger than this are cut, with `truncated: true`.
pub const MAX_RESOURCE_BYTES: u64 = 1 << 20;
/// At most this many resource files are listed under a skill.
const MAX_LISTED: usize = 100;

/// Serves the skills of a [`Catalog`]. The skills a call can reach are those
/// visible to the calling agent (`ctx.agent_id`); an agent that is not in the
/// catalog sees them all, like the placeholder it stands for.
#[derive(Clone, Debug)]
pub struct SkillProvider {
    catalog: Catalog,
}

impl SkillProvider {
    /// Serves `catalog`'s skills; reloads of the catalog are seen at once.
    pub fn new(catalog: Catalog) -> Self {
        Self { catalog }
    }

    fn visible(&self, ctx: &CallCtx) -> Vec<Skill> {
        match self.catalog.get(&ctx.agent_id) {
            Some(agent) => self.catalog.skills_for(&agent),
            None => self.catalog.skills(),
        }
    }

    fn find(&self, ctx: &CallCtx, name: &str) -> Result<Skill, ToolError> {
        let skills = self.visible(ctx);
        // The id is unique; names may collide, so the id wins.
        if let Some(s) = skills.iter().find(|s| s.id == name.trim()) {
            return Ok(s.clone());
        }
        if let Some(s) = skills.iter().find(|s| s.is_named(name)) {
            return Ok(s.clone());
        }
        let mut names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        let hint = if names.is_empty() {
            "no skills are available to this agent".to_string()
        } else if names.len() <= 30 {
            format!("available: {}", names.join(", "))
        } else {
            "use skill_lookup to find one".to_string()
        };
        Err(ToolError::invalid(format!(
            "no skill named `{}` ({hint})",
            name.trim()
        )))
    }
}

/// How well a skill matches a query: whole-name hits first, then words in
/// the name or id, then words in the description.
fn score(s: &Skill, query: &str) -> u32 {
    let q = query.trim().to_lowercase();
    if q.is_empty() {
        return 1;
    }
    let (name, id, desc) = (
        s.name.to_lowercase(),
        s.id.to_lowercase(),
        s.description.to_lowercase(),
    );
    let mut score = 0;
    if name == q || id == q {
        score += 100;
    }
    for w in q
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if name.contains(w) || id.contains(w) {
            score += 10;
        }
        if desc.contains(w) {
            score += 3;
        }
        if s.category.to_lowercase().contains(w) {
            score += 1;
        }
    }
    score
}

/// Checks a skill-relative path before it touches the disk: relative, no
/// `..`, no hidden segment, no NUL.
fn check_relpath(relpath: &str) -> Result<PathBuf, ToolError> {
    let refuse = |why: &str| {
        Err(ToolError::invalid(format!(
            "relpath `{}` refused: {why}",
            relpath.escape_debug()
        )))
    };
    if relpath.trim().is_empty() {
        return refuse("it is empty");
    }
    if relpath.contains('\0') {
        return refuse("it contains a NUL byte");
    }
    let p = Path::new(relpath);
    if p.is_absolute() || relpath.starts_with('\\') {
        return refuse("it is absolute; give a path inside the skill directory");
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(seg) => {
                if seg.to_string_lossy().starts_with('.') {
                    return refuse("hidden files and directories are not served");
                }
                out.push(seg);
            }
            Component::CurDir => {}
            Component::ParentDir => return refuse("`..` is not allowed"),
            Component::RootDir | Component::Prefix(_) => return refuse("it is absolute"),
        }
    }
    if out.as_os_str().is_empty() {
        return refuse("it names the skill directory itself");
    }
    Ok(out)
}

/// Valid UTF-8 can still be binary (a run of 0x07 bytes is "valid"): text
/// has no control characters other than tab, newline, form feed, carriage
/// return and escape (ANSI colours in logs).
fn looks_binary(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .any(|&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c | 0x1b) || b == 0x7f)
}

/// Reads a resource: text as `content`, anything else as base64, cut at
/// [`MAX_RESOURCE_BYTES`]. Runs on a blocking thread.
fn read_resource(skill: &Skill, relpath: &str) -> Result<Value, ToolError> {
    let rel = check_relpath(relpath)?;
    let root = skill
        .dir
        .canonicalize()
        .map_err(|e| ToolError::failed(format!("skill directory unavailable: {e}")))?;
    let target = root.join(&rel);
    let real = match target.canonicalize() {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ToolError::invalid(format!(
                "skill `{}` has no file `{relpath}`",
                skill.name
            )));
        }
        Err(e) => return Err(ToolError::failed(format!("cannot open `{relpath}`: {e}"))),
    };
    // Symlinks are followed above; the destination must still be in the skill.
    if !real.starts_with(&root) {
        return Err(ToolError::invalid(format!(
            "relpath `{relpath}` refused: it leads out of the skill directory"
        )));
    }
    // A link to a hidden file inside the skill is refused like the hidden path itself.
    let hidden = real
        .strip_prefix(&root)
        .map(|r| {
            r.components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
        })
        .unwrap_or(true);
    if hidden {
        return Err(ToolError::invalid(format!(
            "relpath `{relpath}` refused: it leads to a hidden file"
        )));
    }
    if real.is_dir() {
        return Err(ToolError::invalid(format!(
            "`{relpath}` is a directory; give a file"
        )));
    }
    let file = std::fs::File::open(&real)
        .map_err(|e| ToolError::failed(format!("cannot open `{relpath}`: {e}")))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::with_capacity(size.min(MAX_RESOURCE_BYTES) as usize);
    file.take(MAX_RESOURCE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ToolError::failed(format!("cannot read `{relpath}`: {e}")))?;
    let truncated = buf.len() as u64 > MAX_RESOURCE_BYTES;
    buf.truncate(MAX_RESOURCE_BYTES as usize);
    let (encoding, content) = match std::str::from_utf8(&buf) {
        Ok(s) if !looks_binary(&buf) => ("utf-8", s.to_string()),
        // The cut may have split a character: what comes before it is still text.
        Err(e)
            if truncated && e.error_len().is_none() && !looks_binary(&buf[..e.valid_up_to()]) =>
        {
            (
                "utf-8",
                String::from_utf8_lossy(&buf[..e.valid_up_to()]).into_owned(),
            )
        }
        _ => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(&buf),
        ),
    };
    Ok(json!({
        "skill": skill.name,
        "relpath": rel.to_string_lossy(),
        "encoding": encoding,
        "content": content,
        "size": size,
        "truncated": truncated,
    }))
}

/// The files of a skill other than SKILL.md, for the model to ask for.
fn list_resources(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if out.len() >= MAX_LISTED {
                return;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(ft) = e.file_type() else { continue };
            if name.starts_with('.') || ft.is_symlink() {
                continue;
            }
            let path = e.path();
            if ft.is_dir() && depth < 4 {
                walk(root, &path, depth + 1, out);
            } else if ft.is_file()
                && !(depth == 0 && name == "SKILL.md")
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out);
    out
}

#[async_trait]
impl Provider for SkillProvider {
    fn name(&self) -> &str {
        "skill"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "skill_lookup",
                "Find skills (tested procedures) by words in their name or description.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Words describing the task."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            )
            .toolset("skill")
            .provider("skill")
            .build(),
            tool(
                "skill",
                "Load a skill's instructions by name. Follow them for the task they cover.",
                json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": "The skill's name (or id)."}},
                    "required": ["name"],
                    "additionalProperties": false
                }),
            )
            .toolset("skill")
            .provider("skill")
            .build(),
            tool(
                "skill_resource",
                "Read another file of a skill (a script, a template, reference data) by its path inside the skill. \
                 Text comes back as `content`; binary files as base64; files over 1 MB are cut (`truncated`).",
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The skill's name (or id)."},
                        "relpath": {"type": "string", "description": "Path inside the skill directory, e.g. scripts/run.py."}
                    },
                    "required": ["name", "relpath"],
                    "additionalProperties": false
                }),
            )
            .toolset("skill")
            .provider("skill")
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        if tool == "skill_resource" {
            check_relpath(str_arg(args, "relpath")?)?;
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        match tool {
            "skill_lookup" => {
                let query = str_arg(&args, "query")?;
                let limit = args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .unwrap_or(10)
                    .clamp(1, 50) as usize;
                let mut hits: Vec<(u32, Skill)> = self
                    .visible(&ctx)
                    .into_iter()
                    .map(|s| (score(&s, query), s))
                    .filter(|(n, _)| *n > 0)
                    .collect();
                hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
                let total = hits.len();
                let skills: Vec<Value> = hits
                    .into_iter()
                    .take(limit)
                    .map(|(_, s)| json!({"name": s.name, "id": s.id, "description": s.description, "category": s.category}))
                    .collect();
                Ok(json!({"skills": skills, "total": total}))
            }
            "skill" => {
                let s = self.find(&ctx, str_arg(&args, "name")?)?;
                let dir = s.dir.clone();
                let resources = tokio::task::spawn_blocking(move || list_resources(&dir))
                    .await
                    .map_err(|e| ToolError::failed(e.to_string()))?;
                let mut out = format!("Skill: {} (id `{}`)\n", s.name, s.id);
                if !s.description.is_empty() {
                    out.push_str(&format!("Description: {}\n", s.description));
                }
                out.push_str(&format!(
                    "\n----- BEGIN SKILL -----\n{}\n----- END SKILL -----\n",
                    s.body.trim()
                ));
                if !resources.is_empty() {
                    out.push_str(
                        "\nFiles of this skill (read them with skill_resource {name, relpath}):\n",
                    );
                    for r in resources {
                        out.push_str(&format!("- {r}\n"));
                    }
                }
                Ok(Value::String(out))
            }
            "skill_resource" => {
                let s = self.find(&ctx, str_arg(&args, "name")?)?;
                let rel = str_arg(&args, "relpath")?.to_string();
                tokio::task::spawn_blocking(move || read_resource(&s, &rel))
                    .await
                    .map_err(|e| ToolError::failed(e.to_string()))?
            }
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_detection() {
        assert!(!looks_binary(
            "plain\ttext\r\n\x1b[1mbold\x1b[0m é".as_bytes()
        ));
        assert!(looks_binary(&[7, 7, 7]));
        assert!(looks_binary(b"a\0b"));
        assert!(looks_binary(b"del\x7f"));
    }

    #[test]
    fn relpaths_are_checked_before_the_disk() {
        assert_eq!(
            check_relpath("scripts/run.py").unwrap(),
            PathBuf::from("scripts/run.py")
        );
        assert_eq!(check_relpath("./a.txt").unwrap(), PathBuf::from("a.txt"));
        for bad in [
            "",
            "..",
            "a/../../b",
            "/etc/passwd",
            ".env",
            "a/.git/config",
            "a\0b",
            ".",
            "\\x",
        ] {
            assert!(check_relpath(bad).is_err(), "{bad:?}");
        }
    }
}
