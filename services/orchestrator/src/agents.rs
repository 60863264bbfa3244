//! The agents a turn can use. The orchestrator sees agents through
//! [`AgentDirectory`]; the catalog crate implements it over agent files.

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
    fn resolve_team(&self, members: &[String], active: &str) -> Result<TeamView, String>;
    /// The profile of `id` as active agent within `members` (call_agent).
    fn profile_in_team(&self, members: &[String], id: &str) -> Result<AgentProfile, String> {
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
    fn resolve_team(&self, _members: &[String], active: &str) -> Result<TeamView, String> {
        let id = if active.is_empty() { "assistant" } else { active };
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
        RefreshCatalogResponse { agents: 1, skills: 0, warnings: vec![] }
    }
}
