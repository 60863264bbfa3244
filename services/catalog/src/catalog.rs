//! The catalog: agents and skills from every source, merged by precedence,
//! shared by reference and swapped whole on reload.

use crate::agent::{self, AgentSource, AgentSpec};
use crate::builtin::BUILTIN_AGENTS;
use crate::config::CatalogConfig;
use crate::skill::{self, Skill};
use crate::team::{Team, TeamError};
use crate::tier::Tier;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// One consistent view of the catalog. A reload builds a new one; holders of
/// the old one keep a coherent picture for the rest of their turn.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Every agent, locked ones included, in display order (category rows by
    /// their smallest `category_order`, then `category_order`, then id).
    pub agents: Vec<AgentSpec>,
    /// Every skill, in precedence order of their roots, then by id.
    pub skills: Vec<Skill>,
    /// What was skipped or suspicious during the load.
    pub warnings: Vec<String>,
    /// The deployment's tier the snapshot was built for.
    pub tier: Tier,
}

/// What a reload found.
#[derive(Clone, Debug, PartialEq)]
pub struct RefreshReport {
    /// Agents in the catalog (locked included).
    pub agents: usize,
    /// Skills in the catalog.
    pub skills: usize,
    /// What was skipped or suspicious.
    pub warnings: Vec<String>,
}

impl RefreshReport {
    /// As `RefreshCatalog` returns it.
    pub fn to_proto(&self) -> omicos_proto::RefreshCatalogResponse {
        omicos_proto::RefreshCatalogResponse {
            agents: self.agents as u32,
            skills: self.skills as u32,
            warnings: self.warnings.clone(),
        }
    }
}

/// The agent and skill catalog. Cheap to clone; all clones share one state,
/// so the orchestrator, the skill provider and the watcher see the same reloads.
#[derive(Clone, Debug)]
pub struct Catalog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: CatalogConfig,
    state: RwLock<Arc<Snapshot>>,
}

/// Reads every source. Never fails: what cannot be read becomes a warning.
fn build(config: &CatalogConfig) -> Snapshot {
    let mut warnings = Vec::new();
    let mut agents: Vec<AgentSpec> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut add = |list: Vec<AgentSpec>, agents: &mut Vec<AgentSpec>| {
        for a in list {
            // Earlier sources win: a later file with the same id is an
            // older or more general version of the same agent.
            if seen.insert(a.id.clone()) {
                agents.push(a);
            }
        }
    };
    for (dir, source) in config.agent_dirs() {
        let list = agent::load_dir(&dir, source, config.tier, &mut warnings);
        add(list, &mut agents);
    }
    if config.builtin_agents {
        let mut builtin = Vec::new();
        for (file, text) in BUILTIN_AGENTS {
            match agent::parse_agent(
                text,
                &format!("builtin:{file}"),
                AgentSource::Builtin,
                config.tier,
            ) {
                Ok((a, w)) => {
                    warnings.extend(w);
                    builtin.push(a);
                }
                Err(w) => warnings.push(w),
            }
        }
        add(builtin, &mut agents);
    }
    sort_for_display(&mut agents);

    let mut skills: Vec<Skill> = Vec::new();
    let mut ids: HashSet<String> = HashSet::new();
    for (root, source) in config.skill_dirs() {
        for s in skill::load_root(&root, source, &mut warnings) {
            if ids.insert(s.id.clone()) {
                skills.push(s);
            }
        }
    }
    let mut by_name: HashMap<String, &Skill> = HashMap::new();
    for s in &skills {
        if let Some(other) = by_name.insert(s.name.to_ascii_lowercase(), s) {
            warnings.push(format!(
                "skills `{}` ({}) and `{}` ({}) share the name `{}`: `skill {{name}}` finds the first; use the id to reach the other",
                other.id,
                other.dir.display(),
                s.id,
                s.dir.display(),
                s.name
            ));
        }
    }
    for w in &warnings {
        tracing::warn!(target: "omicos_catalog", "{w}");
    }
    Snapshot {
        agents,
        skills,
        warnings,
        tier: config.tier,
    }
}

/// Category rows are ordered by the smallest `category_order` in them, then
/// agents inside a row by their own `category_order`, then by id.
fn sort_for_display(agents: &mut [AgentSpec]) {
    let mut row: HashMap<String, i64> = HashMap::new();
    for a in agents.iter() {
        let e = row.entry(a.category.clone()).or_insert(a.category_order);
        *e = (*e).min(a.category_order);
    }
    agents.sort_by(|a, b| {
        (row[&a.category], &a.category, a.category_order, &a.id).cmp(&(
            row[&b.category],
            &b.category,
            b.category_order,
            &b.id,
        ))
    });
}

/// The toolsets an agent gets in a turn: its own, then `team` when the team
/// has two or more agents, `skill` when there are skills to load, and
/// `memory` always. No duplicates, order kept.
pub fn runtime_toolsets(agent: &AgentSpec, team_len: usize, skills_nonempty: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let extra = [
        (team_len >= 2, "team"),
        (skills_nonempty, "skill"),
        (true, "memory"),
    ];
    for t in agent
        .toolsets
        .iter()
        .map(String::as_str)
        .chain(extra.iter().filter(|(on, _)| *on).map(|(_, t)| *t))
    {
        if !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    }
    out
}

impl Catalog {
    /// Loads every source. The warnings name each skipped or suspicious file
    /// and line; they are also logged.
    pub fn load(config: CatalogConfig) -> (Catalog, Vec<String>) {
        let snap = build(&config);
        let warnings = snap.warnings.clone();
        (
            Catalog {
                inner: Arc::new(Inner {
                    config,
                    state: RwLock::new(Arc::new(snap)),
                }),
            },
            warnings,
        )
    }

    /// The configuration it reads from.
    pub fn config(&self) -> &CatalogConfig {
        &self.inner.config
    }

    /// The deployment's tier.
    pub fn tier(&self) -> Tier {
        self.inner.config.tier
    }

    /// The current state. Hold it for the length of a turn to see one version.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a panic elsewhere mid-swap; the Arc inside is still whole.
        self.inner
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads every source again and swaps the result in.
    pub fn refresh(&self) -> RefreshReport {
        let snap = build(&self.inner.config);
        let report = RefreshReport {
            agents: snap.agents.len(),
            skills: snap.skills.len(),
            warnings: snap.warnings.clone(),
        };
        *self.inner.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
        report
    }

    /// The warnings of the last load.
    pub fn warnings(&self) -> Vec<String> {
        self.snapshot().warnings.clone()
    }

    /// Every agent, locked ones included (see [`AgentSpec::locked`] and
    /// [`AgentSpec::source`]), in display order.
    pub fn agents(&self) -> Vec<AgentSpec> {
        self.snapshot().agents.clone()
    }

    /// The agent with this id.
    pub fn get(&self, id: &str) -> Option<AgentSpec> {
        self.snapshot().agents.iter().find(|a| a.id == id).cloned()
    }

    /// Every skill.
    pub fn skills(&self) -> Vec<Skill> {
        self.snapshot().skills.clone()
    }

    /// The skills `agent` may see: all when its whitelist is empty or `*`,
    /// else the listed ones (by id or name); workspace skills always.
    pub fn skills_for(&self, agent: &AgentSpec) -> Vec<Skill> {
        self.snapshot()
            .skills
            .iter()
            .filter(|s| s.visible_to(agent))
            .cloned()
            .collect()
    }

    /// The team of a chat request; see [`crate::team`] for the rules.
    pub fn resolve_team(&self, team_members: &[String], active: &str) -> Result<Team, TeamError> {
        crate::team::resolve(&self.snapshot(), team_members, active)
    }

    /// The active agent's system prompt with its teammates and its skills.
    pub fn system_prompt(&self, team: &Team) -> String {
        // References, not clones: skill bodies can be large and this runs every turn.
        let snap = self.snapshot();
        let visible: Vec<&Skill> = snap
            .skills
            .iter()
            .filter(|s| s.visible_to(&team.active))
            .collect();
        crate::team::system_prompt(team, &visible)
    }

    /// [`runtime_toolsets`] with the skill condition taken from this catalog:
    /// `skill` is added when the agent can see at least one skill.
    pub fn runtime_toolsets(&self, agent: &AgentSpec, team_len: usize) -> Vec<String> {
        runtime_toolsets(
            agent,
            team_len,
            self.snapshot().skills.iter().any(|s| s.visible_to(agent)),
        )
    }

    /// Reloads when a source directory changes, after `config.watch_debounce`
    /// of quiet. Stops when the handle is dropped.
    pub fn watch(&self) -> Result<crate::watch::CatalogWatcher, crate::watch::WatchError> {
        crate::watch::CatalogWatcher::start(self.clone(), None)
    }

    /// Like [`Catalog::watch`], calling `on_reload` after each reload (to log
    /// it, or to tell clients that the catalog changed).
    pub fn watch_with(
        &self,
        on_reload: impl Fn(&RefreshReport) + Send + 'static,
    ) -> Result<crate::watch::CatalogWatcher, crate::watch::WatchError> {
        crate::watch::CatalogWatcher::start(self.clone(), Some(Box::new(on_reload)))
    }
}
