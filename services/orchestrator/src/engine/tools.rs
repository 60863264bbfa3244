//! The tools an agent sees: the tool-runner's specs for the agent's
//! toolsets, turned into the model's tool definitions, plus the team tools
//! the orchestrator serves itself. The one place a `ToolSpec` becomes a
//! [`ToolDef`] and the `team` toolset is kept away from the runner.

use super::{Engine, team_tools};
use crate::agents::AgentProfile;
use crate::error::OrchestratorError;
use crate::llm::{ToolDef, ToolSet};
use omicos_proto::{ListToolsRequest, PermissionMode, PermissionRules, Risk, ToolSpec};
use serde_json::json;
use std::collections::HashSet;

/// The toolset the orchestrator serves itself (`call_agent`, `list_agents`);
/// it never reaches the runner.
pub const TEAM_TOOLSET: &str = "team";

/// The provider name team tools are listed under.
const TEAM_PROVIDER: &str = "orchestrator";

/// The runner's toolset of remote A2A agents (tools `a2a__<name>`).
pub const REMOTE_AGENTS_TOOLSET: &str = "a2a";

/// The prefix of a remote A2A agent's tool name on the runner.
pub const REMOTE_AGENT_PREFIX: &str = "a2a__";

/// The toolsets the tool-runner serves: all of the agent's but `team`, and
/// with `team` the remote A2A agents (`call_agent` reaches them through the runner).
pub fn runner_toolsets(toolsets: &[String]) -> Vec<String> {
    let mut out: Vec<String> = toolsets
        .iter()
        .filter(|t| *t != TEAM_TOOLSET)
        .cloned()
        .collect();
    if toolsets.iter().any(|t| t == TEAM_TOOLSET) && !out.iter().any(|t| t == REMOTE_AGENTS_TOOLSET)
    {
        out.push(REMOTE_AGENTS_TOOLSET.into());
    }
    out
}

/// A runner's tool spec as the model's tool definition. A schema that does
/// not parse becomes an open object, so one bad spec cannot hide the others.
pub fn tool_def(spec: &ToolSpec) -> ToolDef {
    ToolDef {
        name: spec.name.clone(),
        description: spec.description.clone(),
        parameters: serde_json::from_str(&spec.input_schema_json)
            .unwrap_or_else(|_| json!({"type": "object"})),
    }
}

/// An agent's tools, as specs (for UIs) and as the model's definitions, in the same order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentTools {
    /// The specs: the runner's, then the team tools.
    pub specs: Vec<ToolSpec>,
    /// The model's definitions of the same tools (their JSON made once).
    pub defs: std::sync::Arc<ToolSet>,
    /// The remote A2A agents the runner serves (`a2a__<name>`): never a
    /// tool of the model's, a name `call_agent` and `list_agents` know.
    pub remote_agents: Vec<ToolSpec>,
}

impl AgentTools {
    /// The runner's `specs` for an agent with `toolsets`, plus the team tools
    /// when it has the `team` toolset.
    pub fn assemble(specs: Vec<ToolSpec>, toolsets: &[String]) -> Self {
        let (remote_agents, mut specs): (Vec<ToolSpec>, Vec<ToolSpec>) = specs
            .into_iter()
            .partition(|s| s.name.starts_with(REMOTE_AGENT_PREFIX));
        let mut defs: Vec<ToolDef> = specs.iter().map(tool_def).collect();
        if toolsets.iter().any(|t| t == TEAM_TOOLSET) {
            for d in team_tools() {
                specs.push(ToolSpec {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    input_schema_json: d.parameters.to_string(),
                    toolset: TEAM_TOOLSET.into(),
                    provider: TEAM_PROVIDER.into(),
                    ..Default::default()
                });
                defs.push(d);
            }
        }
        Self {
            specs,
            defs: std::sync::Arc::new(ToolSet::new(defs)),
            remote_agents,
        }
    }

    /// The names (and aliases) of the tools that may run side by side with
    /// others: risk Read, or named in `declared` (`tool_calls.concurrency_safe`).
    /// `call_agent` never does: a sub-turn runs alone.
    pub fn parallel_safe(&self, declared: &[String]) -> HashSet<String> {
        let mut out = HashSet::new();
        for spec in &self.specs {
            if spec.name == "call_agent" && spec.toolset == TEAM_TOOLSET {
                continue;
            }
            let read = Risk::try_from(spec.risk).unwrap_or(Risk::Shell) == Risk::Read;
            if read || declared.contains(&spec.name) {
                out.insert(spec.name.clone());
                out.extend(spec.aliases.iter().cloned());
            }
        }
        out
    }
}

/// What decides the tools an agent lists, besides the agent itself: the
/// turn's permission mode (already capped by the principal's ceiling), its
/// legacy switches and the ChatRequest's rules. A turn makes it from its
/// settings, ListAgentTools from a mode alone; both then list through
/// [`Engine::agent_tools`], so what a client is shown is what the model is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ToolScope {
    /// Permission mode (unspecified: the runner's default).
    pub mode: PermissionMode,
    /// Legacy switch.
    pub allow_shell: Option<bool>,
    /// Legacy switch.
    pub allow_file_write: Option<bool>,
    /// The ChatRequest's rules (they only narrow).
    pub request_rules: PermissionRules,
}

impl ToolScope {
    /// A mode and nothing else (ListAgentTools).
    pub fn mode(mode: PermissionMode) -> Self {
        Self {
            mode,
            ..Default::default()
        }
    }
}

/// What decides a ListTools answer besides the runner's catalog.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ToolKey {
    toolsets: Vec<String>,
    agent_rules: PermissionRules,
    scope: ToolScope,
}

/// The agents' tool lists, per request (toolsets, mode, switches), with the
/// runner catalog version each came from. Every model request still asks a
/// runner, but with `if_version`: while the catalog is unchanged the answer
/// is one small `unchanged` message, and the cached [`AgentTools`] (specs,
/// definitions, their pre-serialized JSON) are reused as they are. The
/// version is a digest of the catalog, so any runner with the same tools
/// confirms it; a runner whose tools differ answers in full and replaces it.
#[derive(Default)]
pub struct ToolCache {
    entries:
        std::sync::Mutex<std::collections::HashMap<ToolKey, (String, std::sync::Arc<AgentTools>)>>,
}

impl ToolCache {
    fn get(&self, key: &ToolKey) -> Option<(String, std::sync::Arc<AgentTools>)> {
        self.entries.lock().expect("tool cache").get(key).cloned()
    }

    fn put(&self, key: ToolKey, version: String, tools: std::sync::Arc<AgentTools>) {
        let mut map = self.entries.lock().expect("tool cache");
        // Bounded: keys come from configured agents and modes; a flood of
        // distinct keys only costs re-listing.
        if map.len() >= 1024 {
            map.clear();
        }
        map.insert(key, (version, tools));
    }
}

impl Engine {
    /// The tools `agent` sees in `scope`: its toolsets, with what its
    /// frontmatter rules, the deployment's and the request's refuse
    /// outright left out by the runner (a call of the agent carries the
    /// same rules).
    pub async fn agent_tools(
        &self,
        agent: &AgentProfile,
        scope: &ToolScope,
    ) -> Result<std::sync::Arc<AgentTools>, OrchestratorError> {
        let key = ToolKey {
            toolsets: agent.toolsets.clone(),
            agent_rules: agent.wire_rules(),
            scope: scope.clone(),
        };
        let cached = self.tool_cache.get(&key);
        let r = self
            .runner
            .list_tools(ListToolsRequest {
                toolsets: runner_toolsets(&key.toolsets),
                permission_mode: scope.mode as i32,
                allow_shell: scope.allow_shell,
                allow_file_write: scope.allow_file_write,
                if_version: cached.as_ref().map(|c| c.0.clone()).unwrap_or_default(),
                agent_rules: Some(key.agent_rules.clone()),
                request_rules: Some(scope.request_rules.clone()),
            })
            .await?;
        if let Some((version, tools)) = cached
            && r.unchanged
            && r.catalog_version == version
        {
            return Ok(tools);
        }
        let tools = std::sync::Arc::new(AgentTools::assemble(r.tools, &key.toolsets));
        if !r.catalog_version.is_empty() && !r.unchanged {
            self.tool_cache.put(key, r.catalog_version, tools.clone());
        }
        Ok(tools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, schema: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} does it"),
            input_schema_json: schema.into(),
            toolset: "file_manager".into(),
            ..Default::default()
        }
    }

    #[test]
    fn team_stays_with_the_orchestrator_and_its_tools_come_last() {
        let toolsets: Vec<String> = ["file_manager", "team", "memory"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            runner_toolsets(&toolsets),
            ["file_manager", "memory", "a2a"]
        );
        let tools = AgentTools::assemble(
            vec![spec(
                "file_manager__read",
                r#"{"type":"object","required":["path"]}"#,
            )],
            &toolsets,
        );
        let names: Vec<&str> = tools.defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["file_manager__read", "call_agent", "list_agents"]);
        assert_eq!(
            tools
                .specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            names
        );
        assert_eq!(tools.specs[1].provider, "orchestrator");
        assert_eq!(tools.defs[0].parameters["required"][0], "path");
        assert_eq!(tool_def(&tools.specs[1]), tools.defs[1]);
    }

    #[test]
    fn read_tools_and_declared_ones_run_side_by_side_but_never_call_agent() {
        let mut write = spec("file_manager__write", "{}");
        write.risk = Risk::FileWrite as i32;
        let mut read = spec("file_manager__read", "{}");
        read.aliases = vec!["read".into()];
        let mut kernel = spec("kernel__inspect", "{}");
        kernel.risk = Risk::Python as i32;
        let tools = AgentTools::assemble(vec![write, read, kernel], &["team".into()]);
        let safe = tools.parallel_safe(&["kernel__inspect".into()]);
        let mut names: Vec<&str> = safe.iter().map(String::as_str).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "file_manager__read",
                "kernel__inspect",
                "list_agents",
                "read"
            ]
        );
    }

    #[test]
    fn no_team_tools_without_the_team_toolset_and_a_bad_schema_is_an_open_object() {
        let tools = AgentTools::assemble(vec![spec("x", "not json")], &["web".into()]);
        assert_eq!(tools.defs.len(), 1);
        assert_eq!(tools.defs[0].parameters, json!({"type": "object"}));
    }
}
