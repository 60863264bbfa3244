//! The agents a turn can use. The orchestrator sees agents through
//! [`AgentDirectory`]; the catalog crate implements it over agent files.

use crate::error::OrchestratorError;
use omicos_proto::{AgentInfo, RefreshCatalogResponse};

/// An agent as the turn loop needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentProfile {
    /// Stable id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// One line for teammates' prompts.
    pub description: String,
    /// The full system prompt, teammates and skills included.
    pub system_prompt: String,
    /// Toolsets, runtime defaults (team, skill, memory) included.
    pub toolsets: Vec<String>,
    /// The permission rules of its frontmatter, sent with each of its calls.
    pub permissions: omicos_rules::RuleLists,
}

impl AgentProfile {
    /// The frontmatter's rules as the runner takes them, with each call of
    /// the agent and with each listing of its tools.
    pub fn wire_rules(&self) -> omicos_proto::PermissionRules {
        omicos_proto::PermissionRules {
            allow: self.permissions.allow.clone(),
            ask: self.permissions.ask.clone(),
            deny: self.permissions.deny.clone(),
        }
    }
}

/// The agents of one conversation.
#[derive(Clone, Debug)]
pub struct TeamView {
    /// The agent that speaks.
    pub active: AgentProfile,
    /// Everyone in the team, the active agent included.
    pub members: Vec<String>,
}

/// Where agents come from.
pub trait AgentDirectory: Send + Sync + 'static {
    /// Resolves the team of a ChatRequest. Unknown ids become placeholders;
    /// an error means the request cannot run (a locked agent made active).
    fn resolve_team(&self, members: &[String], active: &str)
    -> Result<TeamView, OrchestratorError>;
    /// The profile of `id` as active agent within `members` (call_agent).
    fn profile_in_team(
        &self,
        members: &[String],
        id: &str,
    ) -> Result<AgentProfile, OrchestratorError> {
        self.resolve_team(members, id).map(|t| t.active)
    }
    /// Catalog listing for UIs.
    fn list(&self) -> (Vec<AgentInfo>, String);
    /// Reloads from disk.
    fn refresh(&self) -> RefreshCatalogResponse;
}

/// A directory with one general agent that may use every tool. Used when no
/// catalog is configured. It reports the deployment's configured tier and
/// the one agent it really runs.
#[derive(Clone, Debug)]
pub struct SingleAgent {
    tier: omicos_catalog::Tier,
}

/// The id of [`SingleAgent`]'s agent.
pub const SINGLE_AGENT_ID: &str = "assistant";

const SINGLE_NAME: &str = "Assistant";
const SINGLE_DESCRIPTION: &str = "A general assistant";
const SINGLE_PROMPT: &str = "You are omicos, a careful assistant that works in the user's workspace. \
Use the tools to look before you answer, keep changes minimal, and say what you did.";

impl SingleAgent {
    /// One agent in a deployment of `tier`.
    pub fn new(tier: omicos_catalog::Tier) -> Self {
        Self { tier }
    }

    /// One agent in the deployment's configured tier (`tier`).
    pub fn from_config(cfg: &crate::config::Config) -> Result<Self, OrchestratorError> {
        Ok(Self::new(parse_tier(&cfg.tier)?))
    }

    fn profile(id: &str) -> AgentProfile {
        AgentProfile {
            id: id.into(),
            name: SINGLE_NAME.into(),
            description: SINGLE_DESCRIPTION.into(),
            system_prompt: SINGLE_PROMPT.into(),
            toolsets: vec![],
            permissions: omicos_rules::RuleLists::default(),
        }
    }
}

impl AgentDirectory for SingleAgent {
    fn resolve_team(
        &self,
        _members: &[String],
        active: &str,
    ) -> Result<TeamView, OrchestratorError> {
        // An unknown id is a placeholder with the same prompt, never a refusal.
        let id = if active.is_empty() {
            SINGLE_AGENT_ID
        } else {
            active
        };
        Ok(TeamView {
            active: Self::profile(id),
            members: vec![id.into()],
        })
    }
    fn list(&self) -> (Vec<AgentInfo>, String) {
        let p = Self::profile(SINGLE_AGENT_ID);
        (
            vec![AgentInfo {
                id: p.id,
                name: p.name,
                description: p.description,
                // Open to every deployment: nothing is locked.
                tier: omicos_catalog::Tier::Community.as_str().into(),
                toolsets: p.toolsets,
                locked: false,
                ..Default::default()
            }],
            self.tier.as_str().to_owned(),
        )
    }
    fn refresh(&self) -> RefreshCatalogResponse {
        RefreshCatalogResponse {
            agents: self.list().0.len() as u32,
            skills: 0,
            warnings: vec![],
        }
    }
}

fn parse_tier(text: &str) -> Result<omicos_catalog::Tier, OrchestratorError> {
    text.parse()
        .map_err(|e: omicos_catalog::UnknownTier| OrchestratorError::Config {
            key: "tier",
            source: Box::new(e),
        })
}

/// Agents from the catalog (agent files, built-ins, skills), reloaded on
/// `RefreshCatalog` and when files change.
pub struct CatalogAgents {
    catalog: omicos_catalog::Catalog,
    _watcher: Option<omicos_catalog::CatalogWatcher>,
}

impl CatalogAgents {
    /// Loads the catalog for the orchestrator's configuration and starts watching it.
    pub fn load(cfg: &crate::config::Config) -> Result<(Self, Vec<String>), OrchestratorError> {
        let tier: omicos_catalog::Tier =
            cfg.tier.parse().map_err(|e: omicos_catalog::UnknownTier| {
                OrchestratorError::Config {
                    key: "tier",
                    source: Box::new(e),
                }
            })?;
        let mut cc = omicos_catalog::CatalogConfig::new(&cfg.workspace, tier);
        if !cfg.agent_cache_dir.is_empty() {
            cc.agent_cache_dir = Some(cfg.agent_cache_dir.clone().into());
        }
        let env_roots = std::env::var("OMICOS_SKILL_ROOTS").unwrap_or_default();
        cc.skill_roots = env_roots
            .split(':')
            .chain(cfg.skill_roots.split(':'))
            .filter(|s| !s.trim().is_empty())
            .map(std::path::PathBuf::from)
            .collect();
        let (catalog, warnings) = omicos_catalog::Catalog::load(cc);
        let watcher = match catalog.watch() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "catalog files are not watched; use RefreshCatalog");
                None
            }
        };
        Ok((
            Self {
                catalog,
                _watcher: watcher,
            },
            warnings,
        ))
    }

    /// Wraps an already loaded catalog (tests).
    pub fn from_catalog(catalog: omicos_catalog::Catalog) -> Self {
        Self {
            catalog,
            _watcher: None,
        }
    }

    /// The catalog.
    pub fn catalog(&self) -> &omicos_catalog::Catalog {
        &self.catalog
    }

    fn profile(&self, team: &omicos_catalog::Team) -> AgentProfile {
        AgentProfile {
            id: team.active.id.clone(),
            name: team.active.name.clone(),
            description: team.active.description.clone(),
            system_prompt: self.catalog.system_prompt(team),
            toolsets: self.catalog.runtime_toolsets(&team.active, team.len()),
            permissions: team.active.permissions.clone(),
        }
    }
}

impl AgentDirectory for CatalogAgents {
    fn resolve_team(
        &self,
        members: &[String],
        active: &str,
    ) -> Result<TeamView, OrchestratorError> {
        let team = self.catalog.resolve_team(members, active)?;
        Ok(TeamView {
            active: self.profile(&team),
            members: team.agents.iter().map(|a| a.id.clone()).collect(),
        })
    }

    fn list(&self) -> (Vec<AgentInfo>, String) {
        (
            self.catalog.agents().iter().map(|a| a.to_info()).collect(),
            self.catalog.tier().as_str().to_owned(),
        )
    }

    fn refresh(&self) -> RefreshCatalogResponse {
        self.catalog.refresh().to_proto()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_agent_reports_the_configured_tier_and_the_agent_it_runs() {
        let cfg = crate::config::Config {
            tier: "lab".into(),
            ..Default::default()
        };
        let d = SingleAgent::from_config(&cfg).unwrap();
        let (agents, tier) = d.list();
        assert_eq!(tier, "lab");
        let ran = d.resolve_team(&[], "").unwrap();
        assert_eq!(
            agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            [ran.active.id.as_str()]
        );
        assert_eq!(agents[0].name, ran.active.name);
        assert!(!agents[0].locked);
        assert_eq!(d.refresh().agents as usize, agents.len());

        let bad = crate::config::Config {
            tier: "gold".into(),
            ..Default::default()
        };
        let e = SingleAgent::from_config(&bad).unwrap_err();
        assert!(
            e.report().starts_with("config key `tier`"),
            "{}",
            e.report()
        );
    }
}
