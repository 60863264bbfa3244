//! Agent files: Markdown with a YAML frontmatter whose body is the system prompt.

use crate::frontmatter;
use crate::tier::Tier;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Agent and skill files larger than this are skipped: a prompt that size is a mistake.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where an agent came from, highest precedence first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentSource {
    /// `<workspace>/agents/` (tier lab and above).
    Workspace,
    /// `<workspace>/.omicos/agents/` (legacy).
    LegacyWorkspace,
    /// The catalog cache (default `~/.omicos/cloud-agents/agents/`).
    Cache,
    /// The catalog shipped in this crate.
    Builtin,
    /// Not in the catalog: stands in for an unknown id so that the chat goes on.
    Placeholder,
}

impl AgentSource {
    /// Whether the agents' own tools can write files here: the workspace's
    /// `agents/` is (file tools, shell, kernel); `.omicos/agents/` is not (the
    /// file tools refuse `.omicos/` and the sandbox hides it).
    pub fn agent_writable(self) -> bool {
        self == AgentSource::Workspace
    }

    /// The name shown in `ListAgents`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentSource::Workspace => "workspace",
            AgentSource::LegacyWorkspace => "legacy_workspace",
            AgentSource::Cache => "cache",
            AgentSource::Builtin => "builtin",
            AgentSource::Placeholder => "placeholder",
        }
    }
}

/// One agent: a system prompt, a toolset whitelist, a skill whitelist and a tier.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentSpec {
    /// Stable id, unique in the catalog.
    pub id: String,
    /// Display name (the id when the file has none).
    pub name: String,
    /// One emoji for UI cards.
    pub icon: String,
    /// The subscription tier needed to make it active.
    pub tier: Tier,
    /// UI row (e.g. `literature`).
    pub category: String,
    /// Order inside the category; the smallest in a category orders the rows.
    pub category_order: i64,
    /// UI only: never enters a prompt.
    pub summary: String,
    /// UI only: never enters a prompt.
    pub use_when: String,
    /// UI only: never enters a prompt.
    pub example_prompts: Vec<String>,
    /// Toolset names, only those that resolve (unknown ones were reported and dropped).
    pub toolsets: Vec<String>,
    /// Skill whitelist: empty or `*` means all skills.
    pub skills: Vec<String>,
    /// One line in English; teammates see it in "Available agents".
    pub description: String,
    /// The system prompt (the file's body).
    pub prompt: String,
    /// Where it was loaded from.
    pub source: AgentSource,
    /// The file (`builtin:<file>` for the built-in catalog).
    pub origin: String,
    /// Above the deployment's tier: listed, but cannot be made active.
    pub locked: bool,
    /// Permission rules of the frontmatter (`permissions: {allow, ask, deny}`),
    /// already checked to parse; the orchestrator sends them with every call
    /// the agent makes, and the runner merges them with the deployment's.
    pub permissions: omicos_rules::RuleLists,
}

impl AgentSpec {
    /// The stand-in for an id that is not in the catalog: a generic prompt,
    /// the common toolsets, all skills. Never locked.
    pub fn placeholder(id: &str) -> Self {
        let id = if id.trim().is_empty() {
            "default"
        } else {
            id.trim()
        };
        AgentSpec {
            id: id.to_string(),
            name: id.to_string(),
            icon: "🤖".into(),
            tier: Tier::Community,
            category: "general".into(),
            category_order: i64::MAX,
            summary: String::new(),
            use_when: String::new(),
            example_prompts: Vec::new(),
            toolsets: ["file_manager", "think", "task", "plan"]
                .map(String::from)
                .to_vec(),
            skills: Vec::new(),
            description: "A general assistant.".into(),
            prompt: PLACEHOLDER_PROMPT.into(),
            source: AgentSource::Placeholder,
            origin: String::new(),
            locked: false,
            permissions: omicos_rules::RuleLists::default(),
        }
    }

    /// Whether the skill whitelist lets every skill through.
    pub fn all_skills(&self) -> bool {
        self.skills.is_empty() || self.skills.iter().any(|s| s.trim() == "*")
    }

    /// The agent as `ListAgents` returns it.
    pub fn to_info(&self) -> omicos_proto::AgentInfo {
        omicos_proto::AgentInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            icon: self.icon.clone(),
            tier: self.tier.to_string(),
            category: self.category.clone(),
            category_order: self.category_order.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            summary: self.summary.clone(),
            use_when: self.use_when.clone(),
            example_prompts: self.example_prompts.clone(),
            toolsets: self.toolsets.clone(),
            skills: self.skills.clone(),
            description: self.description.clone(),
            locked: self.locked,
            source: self.source.as_str().into(),
        }
    }
}

const PLACEHOLDER_PROMPT: &str = "You are a helpful, careful assistant working in the user's workspace. \
The agent this conversation was started with is no longer in the catalog, so you stand in for it. \
Answer the user's request directly. Use your tools when they help: read files before you change them, \
keep a task list for multi-step work, and say plainly what you did and what you could not do.";

/// A list of strings that may be written as one string (`skills: "*"`) or
/// left empty. A hand-written visitor rather than `#[serde(untagged)]`, so a
/// wrong value gets an error with its line instead of "no variant matched".
#[derive(Debug, Default)]
pub(crate) struct OneOrMany(Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of names or a single name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<OneOrMany, E> {
                Ok(OneOrMany(Vec::new()))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<OneOrMany, E> {
                Ok(OneOrMany(Vec::new()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl OneOrMany {
    pub(crate) fn into_vec(self) -> Vec<String> {
        self.0
    }
}

#[derive(Deserialize, Debug)]
struct Frontmatter {
    id: Option<String>,
    name: Option<String>,
    #[serde(default)]
    icon: String,
    tier: Option<String>,
    #[serde(default)]
    category: String,
    #[serde(default)]
    category_order: Option<i64>,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    use_when: String,
    #[serde(default)]
    example_prompts: OneOrMany,
    #[serde(default)]
    toolsets: OneOrMany,
    #[serde(default)]
    skills: OneOrMany,
    #[serde(default)]
    description: String,
    #[serde(default)]
    permissions: omicos_rules::RuleLists,
}

const KNOWN_KEYS: &[&str] = &[
    "id",
    "name",
    "icon",
    "tier",
    "category",
    "category_order",
    "summary",
    "use_when",
    "example_prompts",
    "toolsets",
    "skills",
    "description",
    "permissions",
];

/// Whether an id is usable: it names files and travels in tool arguments.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Parses one agent file. `Err` is the warning that says why it was skipped;
/// the `Vec` holds warnings about a file that still loaded.
pub fn parse_agent(
    text: &str,
    origin: &str,
    source: AgentSource,
    deployment: Tier,
) -> Result<(AgentSpec, Vec<String>), String> {
    let doc = frontmatter::parse::<Frontmatter>(text, KNOWN_KEYS)
        .map_err(|e| format!("agent file {origin}:{}: skipped: {}", e.line, e.message))?;
    let mut warnings = Vec::new();
    for (key, line) in &doc.unknown_keys {
        warnings.push(format!(
            "agent file {origin}:{line}: unknown key `{key}` ignored"
        ));
    }
    let m = doc.meta;
    let id = m.id.map(|s| s.trim().to_string()).unwrap_or_default();
    if id.is_empty() {
        return Err(format!(
            "agent file {origin}:1: skipped: the frontmatter has no `id`"
        ));
    }
    if !valid_id(&id) {
        let line = frontmatter::line_of_key(text, "id");
        return Err(format!(
            "agent file {origin}:{line}: skipped: id `{id}` may only hold letters, digits, `_`, `-` and `.`"
        ));
    }
    let tier = match m.tier.as_deref().map(str::trim) {
        None | Some("") => Tier::Community,
        Some(t) => match t.parse::<Tier>() {
            Ok(t) => t,
            Err(e) => {
                // Fail closed: an agent whose tier we cannot read is not given away.
                let line = frontmatter::line_of_key(text, "tier");
                warnings.push(format!(
                    "agent file {origin}:{line}: {e}; treated as enterprise"
                ));
                Tier::Enterprise
            }
        },
    };
    let mut toolsets: Vec<String> = Vec::new();
    for t in m.toolsets.into_vec() {
        let t = t.trim().to_string();
        if t.is_empty() || toolsets.contains(&t) {
            continue;
        }
        if !omicos_toolkit::toolsets::is_known(&t) {
            let line = frontmatter::line_of_key(text, "toolsets");
            warnings.push(format!(
                "agent file {origin}:{line}: agent `{id}`: unknown toolset `{t}` skipped"
            ));
            continue;
        }
        toolsets.push(t);
    }
    // Fail closed: an agent whose rules cannot be read (a deny rule among
    // them, perhaps) is not loaded at all.
    if let Err(e) = omicos_rules::Rules::parse(&m.permissions, omicos_rules::Source::Agent) {
        let line = frontmatter::line_of_key(text, "permissions");
        return Err(format!("agent file {origin}:{line}: skipped: {e}"));
    }
    // `<workspace>/agents/` is a place the agent's own tools can write: a file
    // there may narrow what its agent may do (ask, deny), never widen it. Its
    // allow rules are dropped, loudly.
    let mut permissions = m.permissions;
    if source.agent_writable() && !permissions.allow.is_empty() {
        let line = frontmatter::line_of_key(text, "permissions");
        warnings.push(format!(
            "agent file {origin}:{line}: agent `{id}`: permissions.allow ignored ({}): \
             this directory is writable by agents' tools, so its files may only ask or deny; \
             put allow rules in the deployment's config or an operator-owned agent directory",
            permissions.allow.join(", ")
        ));
        permissions.allow.clear();
    }
    let skills = m
        .skills
        .into_vec()
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    Ok((
        AgentSpec {
            name: m
                .name
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| id.clone()),
            id,
            icon: m.icon,
            tier,
            category: m.category,
            category_order: m.category_order.unwrap_or(i64::MAX / 2),
            summary: m.summary,
            use_when: m.use_when,
            example_prompts: m.example_prompts.into_vec(),
            toolsets,
            skills,
            description: m.description.trim().to_string(),
            prompt: doc.body.trim_end().to_string(),
            source,
            origin: origin.to_string(),
            locked: tier > deployment,
            permissions,
        },
        warnings,
    ))
}

/// Loads every `*.md` file of `dir` (not recursive), in name order. A missing
/// directory is not an error: most deployments have only some sources.
pub fn load_dir(
    dir: &Path,
    source: AgentSource,
    deployment: Tier,
    warnings: &mut Vec<String>,
) -> Vec<AgentSpec> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            warnings.push(format!(
                "agent directory {}: cannot be read: {e}",
                dir.display()
            ));
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "md")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    let mut out: Vec<AgentSpec> = Vec::new();
    for path in files {
        let origin = path.display().to_string();
        match std::fs::metadata(&path) {
            Ok(md) if !md.is_file() => continue,
            Ok(md) if md.len() > MAX_FILE_BYTES => {
                warnings.push(format!(
                    "agent file {origin}:1: skipped: larger than {MAX_FILE_BYTES} bytes"
                ));
                continue;
            }
            Err(e) => {
                warnings.push(format!("agent file {origin}:1: skipped: {e}"));
                continue;
            }
            Ok(_) => {}
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!("agent file {origin}:1: skipped: {e}"));
                continue;
            }
        };
        match parse_agent(&text, &origin, source, deployment) {
            Ok((spec, w)) => {
                warnings.extend(w);
                if let Some(first) = out.iter().find(|a| a.id == spec.id) {
                    warnings.push(format!(
                        "agent file {origin}:1: skipped: id `{}` is already defined by {}",
                        spec.id, first.origin
                    ));
                    continue;
                }
                out.push(spec);
            }
            Err(w) => warnings.push(w),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_locks_by_tier() {
        let text = "---\nid: x\nname: X\ntier: lab\ntoolsets: [web, nope, web]\nskills: \"*\"\ncategory_order: 3\n---\n\nYou are X.\n";
        let (a, w) = parse_agent(text, "x.md", AgentSource::Cache, Tier::ProCloud).unwrap();
        assert_eq!(a.id, "x");
        assert_eq!(a.toolsets, vec!["web"]);
        assert!(a.all_skills());
        assert!(a.locked);
        assert_eq!(a.prompt, "You are X.");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("x.md:5") && w[0].contains("unknown toolset `nope`"),
            "{w:?}"
        );
        let (a, _) = parse_agent(text, "x.md", AgentSource::Cache, Tier::Lab).unwrap();
        assert!(!a.locked);
    }

    #[test]
    fn frontmatter_permissions_are_kept_and_a_bad_rule_skips_the_agent() {
        let text = "---\nid: git\npermissions:\n  allow: [\"shell(git status)\"]\n  deny: [\"shell(git push:*)\"]\n---\nbody";
        let (a, w) = parse_agent(text, "g.md", AgentSource::Cache, Tier::Lab).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(a.permissions.allow, vec!["shell(git status)"]);
        assert_eq!(a.permissions.deny, vec!["shell(git push:*)"]);
        assert!(a.permissions.ask.is_empty());
        let bad = "---\nid: git\npermissions:\n  deny: [\"shell(\"]\n---\nbody";
        let e = parse_agent(bad, "g.md", AgentSource::Cache, Tier::Lab).unwrap_err();
        assert!(
            e.contains("g.md:3") && e.contains("permission rule `shell(`"),
            "{e}"
        );
        let unknown = "---\nid: git\npermissions: {allow: [], maybe: []}\n---\nbody";
        assert!(parse_agent(unknown, "g.md", AgentSource::Cache, Tier::Lab).is_err());
    }

    #[test]
    fn an_agent_writable_file_may_narrow_but_never_widen() {
        let text = "---\nid: default\npermissions:\n  allow: [shell, \"kernel__*\"]\n  ask: [web__fetch]\n  deny: [\"shell(rm:*)\"]\n---\nbody";
        let (a, w) = parse_agent(text, "agents/d.md", AgentSource::Workspace, Tier::Lab).unwrap();
        assert!(a.permissions.allow.is_empty(), "{:?}", a.permissions);
        assert_eq!(a.permissions.ask, vec!["web__fetch"]);
        assert_eq!(a.permissions.deny, vec!["shell(rm:*)"]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("agents/d.md:3") && w[0].contains("permissions.allow ignored"),
            "{w:?}"
        );
        // The same file from an operator-owned directory keeps its allow rules.
        for source in [AgentSource::LegacyWorkspace, AgentSource::Cache] {
            let (a, w) = parse_agent(text, "d.md", source, Tier::Lab).unwrap();
            assert_eq!(
                a.permissions.allow,
                vec!["shell", "kernel__*"],
                "{source:?}"
            );
            assert!(w.is_empty(), "{w:?}");
        }
    }

    #[test]
    fn bad_files_are_refused_with_a_line() {
        let e = parse_agent(
            "---\nname: X\n---\nbody",
            "a.md",
            AgentSource::Cache,
            Tier::Lab,
        )
        .unwrap_err();
        assert!(e.contains("a.md:1") && e.contains("no `id`"), "{e}");
        for (text, want) in [
            (
                "---\n---\nbody",
                "a.md:1: skipped: the frontmatter has no `id`",
            ),
            ("", "a.md:1: skipped: no YAML frontmatter"),
            ("---\nid: [a, b]\n---\n", "a.md:2: skipped"),
            ("---\nid: a\ntoolsets: {x: 1}\n---\n", "a.md:3: skipped"),
        ] {
            let e = parse_agent(text, "a.md", AgentSource::Cache, Tier::Lab).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = parse_agent(
            "---\nid: ../x\n---\nbody",
            "a.md",
            AgentSource::Cache,
            Tier::Lab,
        )
        .unwrap_err();
        assert!(e.contains("a.md:2"), "{e}");
        let (a, w) = parse_agent(
            "---\nid: g\ntier: gold\n---\n",
            "g.md",
            AgentSource::Cache,
            Tier::Lab,
        )
        .unwrap();
        assert!(a.locked && w[0].contains("g.md:3"), "{w:?}");
    }
}
