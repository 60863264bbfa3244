//! Teams: the agents of a conversation and the one that speaks this turn.
//!
//! Rules (from the chat request's `team_members` and `agent`):
//! - `team_members` non-empty: exactly those agents, never the whole catalog;
//!   empty: every unlocked agent of the catalog.
//! - An id that is not in the catalog (an old conversation's agent, say)
//!   becomes a placeholder agent with a generic prompt: the chat goes on.
//! - `agent` names the active one; empty means the first member. An active
//!   agent that is not among the members joins the team (a team always holds
//!   its active agent).
//! - A locked agent (above the deployment's tier) cannot be made active: that
//!   is a [`TeamError::Locked`]. Locked members are left out of the team, so
//!   they cannot be reached through `call_agent` either, and listed in
//!   [`Team::skipped_locked`].

use crate::agent::AgentSpec;
use crate::catalog::Snapshot;
use crate::skill::Skill;
use crate::tier::Tier;

/// The agents of a turn.
#[derive(Clone, Debug, PartialEq)]
pub struct Team {
    /// The agent that speaks this turn.
    pub active: AgentSpec,
    /// Every agent of the team, the active one included, in request order.
    pub agents: Vec<AgentSpec>,
    /// Members that were left out because they are locked.
    pub skipped_locked: Vec<String>,
}

impl Team {
    /// The agents other than the active one.
    pub fn teammates(&self) -> impl Iterator<Item = &AgentSpec> {
        self.agents.iter().filter(|a| a.id != self.active.id)
    }

    /// Number of agents in the team.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Never true: a team holds at least its active agent.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// A member by id (the target of `call_agent`).
    pub fn get(&self, id: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.id == id)
    }

    /// What `list_agents` returns: every member with id, name, description,
    /// and which one is speaking. UI-only fields stay out: the model reads it.
    pub fn listing(&self) -> serde_json::Value {
        let agents: Vec<serde_json::Value> = self
            .agents
            .iter()
            .map(|a| {
                serde_json::json!({
                    "id": a.id,
                    "name": a.name,
                    "description": a.description,
                    "active": a.id == self.active.id,
                })
            })
            .collect();
        serde_json::json!({ "agents": agents })
    }

    /// The same team with another member active (for a `call_agent` sub-turn).
    /// None when `id` is not a member.
    pub fn with_active(&self, id: &str) -> Option<Team> {
        let active = self.get(id)?.clone();
        Some(Team {
            active,
            agents: self.agents.clone(),
            skipped_locked: self.skipped_locked.clone(),
        })
    }
}

/// A team that cannot be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TeamError {
    /// The requested active agent needs a higher tier than the deployment's.
    #[error("agent `{id}` needs tier {required}; this deployment is {deployment}")]
    Locked {
        /// The agent.
        id: String,
        /// Its tier.
        required: Tier,
        /// The deployment's tier.
        deployment: Tier,
    },
    /// Every requested member is locked, so none can be active.
    #[error("every requested team member is locked at tier {deployment}: {}", members.join(", "))]
    AllLocked {
        /// The members asked for.
        members: Vec<String>,
        /// The deployment's tier.
        deployment: Tier,
    },
}

/// Applies the team rules to one catalog snapshot.
pub fn resolve(snap: &Snapshot, team_members: &[String], active: &str) -> Result<Team, TeamError> {
    let find = |id: &str| snap.agents.iter().find(|a| a.id == id);
    let active = active.trim();
    if let Some(a) = find(active).filter(|a| a.locked) {
        return Err(TeamError::Locked {
            id: a.id.clone(),
            required: a.tier,
            deployment: snap.tier,
        });
    }
    let mut members: Vec<&str> = Vec::new();
    for m in team_members
        .iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
    {
        if !members.contains(&m) {
            members.push(m);
        }
    }
    let mut agents: Vec<AgentSpec> = Vec::new();
    let mut skipped_locked = Vec::new();
    if members.is_empty() {
        agents = snap.agents.iter().filter(|a| !a.locked).cloned().collect();
    } else {
        for id in &members {
            match find(id) {
                Some(a) if a.locked => skipped_locked.push(a.id.clone()),
                Some(a) => agents.push(a.clone()),
                None => agents.push(AgentSpec::placeholder(id)),
            }
        }
        if agents.is_empty() && active.is_empty() {
            return Err(TeamError::AllLocked {
                members: members.iter().map(|s| s.to_string()).collect(),
                deployment: snap.tier,
            });
        }
    }
    let active = if active.is_empty() {
        match agents.first() {
            Some(a) => a.clone(),
            None => {
                // An empty catalog (no built-ins, nothing on disk): a placeholder keeps the chat going.
                let p = AgentSpec::placeholder("default");
                agents.push(p.clone());
                p
            }
        }
    } else if let Some(a) = agents.iter().find(|a| a.id == active) {
        a.clone()
    } else {
        let a = find(active)
            .cloned()
            .unwrap_or_else(|| AgentSpec::placeholder(active));
        agents.insert(0, a.clone());
        a
    };
    Ok(Team {
        active,
        agents,
        skipped_locked,
    })
}

/// The active agent's prompt, then "Available agents" when it has teammates,
/// then "Available skills" when it can see skills. UI-only fields (summary,
/// use_when, example_prompts) never appear.
pub fn system_prompt(team: &Team, skills: &[&Skill]) -> String {
    let mut out = team.active.prompt.trim_end().to_string();
    let mates: Vec<&AgentSpec> = team.teammates().collect();
    if !mates.is_empty() {
        out.push_str(
            "\n\n## Available agents\n\nYou work in a team. Hand a self-contained piece of work to a teammate with \
             `call_agent {agent_name, instruction}`. The teammate starts fresh with only your instruction, its own \
             tools and skills, so put every fact it needs in the instruction. Its final answer comes back to you as \
             the tool result.\n\n",
        );
        for a in mates {
            let desc = if a.description.is_empty() {
                "(no description)"
            } else {
                a.description.as_str()
            };
            out.push_str(&format!("- `{}` ({}): {}\n", a.id, a.name, desc));
        }
    }
    if !skills.is_empty() {
        out.push_str(
            "\n\n## Available skills\n\nA skill is a tested procedure. Before you do a task a skill covers, load it \
             with `skill {name}` and follow it; fetch the files it mentions with `skill_resource {name, relpath}`.\n\n",
        );
        for s in skills {
            let desc = if s.description.is_empty() {
                "(no description)"
            } else {
                s.description.as_str()
            };
            out.push_str(&format!("- **{}**: {}\n", s.name, desc));
        }
    }
    // One trailing newline whatever the sections were.
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.push('\n');
    out
}
