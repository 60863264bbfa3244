//! Skills: a directory holding `SKILL.md` (frontmatter + instructions) and any
//! other files the instructions refer to. The directory name is the id.

use crate::agent::{AgentSpec, MAX_FILE_BYTES, valid_id};
use crate::frontmatter;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where a skill root sits in the precedence order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkillSource {
    /// A root named by `OMICOS_SKILL_ROOTS` or the config's `skill_roots`.
    Configured,
    /// The catalog cache (default `~/.omicos/cloud-skills/skills`).
    Cache,
    /// `<workspace>/skills` or `<workspace>/.omicos/skills` (tier lab and
    /// above): visible to every agent, whatever its whitelist.
    Workspace,
}

impl SkillSource {
    /// The name shown to UIs.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillSource::Configured => "configured",
            SkillSource::Cache => "cache",
            SkillSource::Workspace => "workspace",
        }
    }
}

/// One skill.
#[derive(Clone, Debug, PartialEq)]
pub struct Skill {
    /// The directory name.
    pub id: String,
    /// The name the model sees (the id when the file has none).
    pub name: String,
    /// What it is for, for the model.
    pub description: String,
    /// UI only.
    pub category: String,
    /// UI only.
    pub summary: String,
    /// UI only.
    pub use_when: String,
    /// UI only.
    pub example_prompts: Vec<String>,
    /// The instructions (SKILL.md without its frontmatter).
    pub body: String,
    /// The skill's directory.
    pub dir: PathBuf,
    /// The root it was found in.
    pub source: SkillSource,
}

impl Skill {
    /// Whether `key` names this skill (by id or by name, case-insensitive).
    pub fn is_named(&self, key: &str) -> bool {
        let key = key.trim();
        self.id.eq_ignore_ascii_case(key) || self.name.eq_ignore_ascii_case(key)
    }

    /// Whether `agent` may see it: workspace skills always, others through the whitelist.
    pub fn visible_to(&self, agent: &AgentSpec) -> bool {
        self.source == SkillSource::Workspace
            || agent.all_skills()
            || agent.skills.iter().any(|s| self.is_named(s))
    }
}

#[derive(Deserialize, Debug)]
struct Frontmatter {
    name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    category: String,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    use_when: String,
    #[serde(default)]
    example_prompts: crate::agent::OneOrMany,
}

const KNOWN_KEYS: &[&str] = &[
    "name",
    "description",
    "category",
    "summary",
    "use_when",
    "example_prompts",
];

/// Parses a SKILL.md. `Err` is the warning that says why it was skipped.
pub fn parse_skill(
    text: &str,
    id: &str,
    dir: &Path,
    source: SkillSource,
    origin: &str,
) -> Result<(Skill, Vec<String>), String> {
    let doc = frontmatter::parse::<Frontmatter>(text, KNOWN_KEYS)
        .map_err(|e| format!("skill file {origin}:{}: skipped: {}", e.line, e.message))?;
    let mut warnings: Vec<String> = doc
        .unknown_keys
        .iter()
        // Skill files from other ecosystems carry extra keys (license, allowed-tools): note them quietly.
        .map(|(k, line)| format!("skill file {origin}:{line}: unknown key `{k}` ignored"))
        .collect();
    let m = doc.meta;
    if m.description.trim().is_empty() {
        warnings.push(format!(
            "skill file {origin}:1: no `description`: the model will see only the name"
        ));
    }
    Ok((
        Skill {
            id: id.to_string(),
            name: m
                .name
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| id.to_string()),
            description: m.description.trim().to_string(),
            category: m.category,
            summary: m.summary,
            use_when: m.use_when,
            example_prompts: m.example_prompts.into_vec(),
            body: doc.body.trim_end().to_string(),
            dir: dir.to_path_buf(),
            source,
        },
        warnings,
    ))
}

/// Loads the skills of one root: every non-hidden subdirectory with a SKILL.md.
pub fn load_root(root: &Path, source: SkillSource, warnings: &mut Vec<String>) -> Vec<Skill> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            warnings.push(format!(
                "skill root {}: cannot be read: {e}",
                root.display()
            ));
            return Vec::new();
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let Some(id) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if id.starts_with('.') {
            continue;
        }
        let file = dir.join("SKILL.md");
        let origin = file.display().to_string();
        if !valid_id(&id) {
            warnings.push(format!(
                "skill directory {}: skipped: its name is not a usable id",
                dir.display()
            ));
            continue;
        }
        let text = match std::fs::metadata(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Ok(md) if md.len() > MAX_FILE_BYTES => {
                warnings.push(format!(
                    "skill file {origin}:1: skipped: larger than {MAX_FILE_BYTES} bytes"
                ));
                continue;
            }
            _ => match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    warnings.push(format!("skill file {origin}:1: skipped: {e}"));
                    continue;
                }
            },
        };
        match parse_skill(&text, &id, &dir, source, &origin) {
            Ok((s, w)) => {
                warnings.extend(w);
                out.push(s);
            }
            Err(w) => warnings.push(w),
        }
    }
    out
}
