//! Where the catalog reads from, and the deployment's tier.

use crate::tier::Tier;
pub use omicos_servicekit::ConfigError;
use omicos_servicekit::config::{Renamed, ServiceConfig, duration};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The catalog section of a service's config file (`OMICOS_...` overrides per
/// key, see `omicos_servicekit::load_config`). Empty paths mean the defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The deployment's subscription tier: community, pro_agent, pro_cloud, lab, enterprise.
    pub tier: String,
    /// The agent catalog cache; empty: `~/.omicos/cloud-agents/agents`.
    pub agent_cache_dir: String,
    /// The skill catalog cache; empty: `~/.omicos/cloud-skills/skills`.
    pub skill_cache_dir: String,
    /// Extra skill roots, searched after `OMICOS_SKILL_ROOTS` and before the cache.
    pub skill_roots: Vec<String>,
    /// Whether the built-in agents shipped with omicos are offered.
    pub builtin_agents: bool,
    /// Quiet time after a file change before the catalog reloads.
    #[serde(with = "duration")]
    pub watch_debounce: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            tier: "community".into(),
            agent_cache_dir: String::new(),
            skill_cache_dir: String::new(),
            skill_roots: Vec::new(),
            builtin_agents: true,
            watch_debounce: Duration::from_millis(300),
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[Renamed::millis("watch_debounce_ms", "watch_debounce")];

    fn validate(&self) -> Result<(), ConfigError> {
        parse_tier(&self.tier).map(|_| ())
    }
}

fn parse_tier(tier: &str) -> Result<Tier, ConfigError> {
    tier.parse()
        .map_err(|e: crate::tier::UnknownTier| ConfigError::key("tier", e.to_string()))
}

/// Everything [`crate::Catalog::load`] needs.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogConfig {
    /// The workspace root (`agents/`, `skills/`, `.omicos/...` live under it).
    pub workspace: PathBuf,
    /// The deployment's tier.
    pub tier: Tier,
    /// The agent catalog cache; None: not read.
    pub agent_cache_dir: Option<PathBuf>,
    /// Skill roots before the cache, highest priority first (`OMICOS_SKILL_ROOTS`, config).
    pub skill_roots: Vec<PathBuf>,
    /// The skill catalog cache; None: not read.
    pub skill_cache_dir: Option<PathBuf>,
    /// Offer the built-in agents.
    pub builtin_agents: bool,
    /// Quiet time after a file change before [`crate::Catalog::watch`] reloads.
    pub watch_debounce: std::time::Duration,
}

fn home_default(rel: &str) -> Option<PathBuf> {
    dirs::home_dir().map(|h| h.join(rel))
}

fn non_empty(p: &str) -> Option<PathBuf> {
    let p = p.trim();
    (!p.is_empty()).then(|| expand_home(p))
}

/// `~/x` → `$HOME/x`, so config files can be shared between users.
fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(p),
    }
}

impl CatalogConfig {
    /// Defaults for `workspace` at `tier`: the home-directory caches, no extra
    /// skill roots, the built-in agents.
    pub fn new(workspace: impl Into<PathBuf>, tier: Tier) -> Self {
        Self {
            workspace: workspace.into(),
            tier,
            agent_cache_dir: home_default(".omicos/cloud-agents/agents"),
            skill_roots: Vec::new(),
            skill_cache_dir: home_default(".omicos/cloud-skills/skills"),
            builtin_agents: true,
            watch_debounce: std::time::Duration::from_millis(300),
        }
    }

    /// From a config section and the environment: `OMICOS_SKILL_ROOTS`
    /// (colon-separated) comes first among the skill roots.
    pub fn from_config(
        workspace: impl Into<PathBuf>,
        cfg: &Config,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let tier = parse_tier(&cfg.tier)?;
        let mut out = Self::new(workspace, tier);
        if let Some(p) = non_empty(&cfg.agent_cache_dir) {
            out.agent_cache_dir = Some(p);
        }
        if let Some(p) = non_empty(&cfg.skill_cache_dir) {
            out.skill_cache_dir = Some(p);
        }
        let from_env = env
            .iter()
            .find(|(k, _)| k == "OMICOS_SKILL_ROOTS")
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        out.skill_roots = from_env
            .split(':')
            .chain(cfg.skill_roots.iter().map(String::as_str))
            .filter_map(non_empty)
            .collect();
        out.builtin_agents = cfg.builtin_agents;
        out.watch_debounce = cfg.watch_debounce;
        Ok(out)
    }

    /// Defaults plus the environment alone: `OMICOS_TIER` and `OMICOS_SKILL_ROOTS`.
    pub fn from_env_and_workspace(
        workspace: impl Into<PathBuf>,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut cfg = Config::default();
        if let Some((_, t)) = env.iter().find(|(k, _)| k == "OMICOS_TIER") {
            cfg.tier = t.clone();
        }
        Self::from_config(workspace, &cfg, env)
    }

    /// The agent directories in precedence order, with their source. The
    /// workspace's `agents/` is there only for tier lab and above.
    pub fn agent_dirs(&self) -> Vec<(PathBuf, crate::AgentSource)> {
        use crate::AgentSource::*;
        let mut v = Vec::new();
        if self.tier >= Tier::Lab {
            v.push((self.workspace.join("agents"), Workspace));
        }
        v.push((self.workspace.join(".omicos/agents"), LegacyWorkspace));
        if let Some(c) = &self.agent_cache_dir {
            v.push((c.clone(), Cache));
        }
        v
    }

    /// The skill roots in precedence order, with their source. Workspace roots
    /// are there only for tier lab and above.
    pub fn skill_dirs(&self) -> Vec<(PathBuf, crate::SkillSource)> {
        use crate::SkillSource::*;
        let mut v: Vec<(PathBuf, crate::SkillSource)> = self
            .skill_roots
            .iter()
            .map(|p| (p.clone(), Configured))
            .collect();
        if let Some(c) = &self.skill_cache_dir {
            v.push((c.clone(), Cache));
        }
        if self.tier >= Tier::Lab {
            v.push((self.workspace.join("skills"), Workspace));
            v.push((self.workspace.join(".omicos/skills"), Workspace));
        }
        v
    }

    /// Whether `path` is inside one of the directories the catalog reads.
    pub(crate) fn watches(&self, path: &Path) -> bool {
        self.agent_dirs()
            .iter()
            .map(|(d, _)| d)
            .chain(self.skill_dirs().iter().map(|(d, _)| d))
            .any(|d| path.starts_with(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_roots_come_first_and_tier_gates_workspace() {
        let env = vec![
            ("OMICOS_SKILL_ROOTS".to_string(), "/a::/b".to_string()),
            ("OMICOS_TIER".to_string(), "lab".to_string()),
        ];
        let mut cfg = Config {
            skill_roots: vec!["/c".into()],
            skill_cache_dir: "/cache".into(),
            ..Config::default()
        };
        cfg.tier = "pro_cloud".into();
        let c = CatalogConfig::from_config("/ws", &cfg, &env).unwrap();
        let roots: Vec<_> = c.skill_dirs().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            roots,
            ["/a", "/b", "/c", "/cache"].map(PathBuf::from).to_vec()
        );
        assert_eq!(c.agent_dirs().len(), 2);
        let c = CatalogConfig::from_env_and_workspace("/ws", &env).unwrap();
        assert_eq!(c.tier, Tier::Lab);
        assert_eq!(c.agent_dirs()[0].0, PathBuf::from("/ws/agents"));
        assert!(
            c.skill_dirs()
                .iter()
                .any(|(p, _)| p == Path::new("/ws/.omicos/skills"))
        );
        let bad = Config {
            tier: "gold".into(),
            ..Config::default()
        };
        assert!(
            CatalogConfig::from_config("/ws", &bad, &[])
                .unwrap_err()
                .to_string()
                .contains("gold")
        );
    }

    #[test]
    fn loads_through_the_service_config_layers() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("catalog.yaml");
        std::fs::write(
            &file,
            "tier: pro_agent\nskill_roots: [\"/x\"]\nwatch_debounce_ms: 50\n",
        )
        .unwrap();
        let env = vec![("OMICOS_TIER".to_string(), "lab".to_string())];
        let cfg: Config = omicos_servicekit::load_config(Some(&file), &env).unwrap();
        // The old key (milliseconds) still reads, for one release.
        assert_eq!(
            (cfg.tier.as_str(), cfg.watch_debounce),
            ("lab", Duration::from_millis(50))
        );
        let c = CatalogConfig::from_config("/ws", &cfg, &env).unwrap();
        assert_eq!(c.tier, Tier::Lab);
        assert_eq!(c.skill_roots, vec![PathBuf::from("/x")]);
        std::fs::write(&file, "tiers: lab\n").unwrap();
        let e = omicos_servicekit::load_config::<Config>(Some(&file), &[]).unwrap_err();
        assert!(e.to_string().contains("tiers"), "{e}");
    }
}
