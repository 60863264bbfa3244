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
/// catalog is configured.
pub struct SingleAgent;

const SINGLE_PROMPT: &str = "You are omicos, a careful assistant that works in the user's workspace. \
Use the tools to look before you answer, keep changes minimal, and say what you did.";

impl AgentDirectory for SingleAgent {
    fn resolve_team(
        &self,
        _members: &[String],
        active: &str,
    ) -> Result<TeamView, OrchestratorError> {
        let id = if active.is_empty() {
            "assistant"
        } else {
            active
        };
        Ok(TeamView {
            active: AgentProfile {
                id: id.into(),
                name: "Assistant".into(),
                description: "A general assistant".into(),
                system_prompt: SINGLE_PROMPT.into(),
                toolsets: vec![],
            },
            members: vec![id.into()],
        })
    }
    fn list(&self) -> (Vec<AgentInfo>, String) {
        (
            vec![AgentInfo {
                id: "assistant".into(),
                name: "Assistant".into(),
                description: "A general assistant".into(),
                ..Default::default()
            }],
            "community".into(),
        )
    }
    fn refresh(&self) -> RefreshCatalogResponse {
        RefreshCatalogResponse {
            agents: 1,
            skills: 0,
            warnings: vec![],
        }
    }
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
