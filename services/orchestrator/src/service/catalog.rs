//! Catalog RPCs: ListAgents, RefreshCatalog, ListAgentTools.

use super::OrchestratorService;
use crate::error::OrchestratorError;
use omicos_proto::{
    ListAgentToolsRequest, ListAgentToolsResponse, ListAgentsResponse, ListToolsRequest,
    RefreshCatalogResponse,
};
use serde_json::json;

impl OrchestratorService {
    /// ListAgents: the catalog and the deployment's tier.
    pub(super) fn list_agents_rpc(&self) -> ListAgentsResponse {
        let (agents, deployment_tier) = self.engine.agents.list();
        ListAgentsResponse {
            agents,
            deployment_tier,
        }
    }

    /// RefreshCatalog: reloads agents and skills from disk.
    pub(super) fn refresh_catalog_rpc(&self) -> RefreshCatalogResponse {
        self.engine.agents.refresh()
    }

    /// ListAgentTools: the tools an agent would see under a mode, as specs
    /// and as the model's `tools` JSON.
    pub(super) async fn list_agent_tools_rpc(
        &self,
        r: ListAgentToolsRequest,
    ) -> Result<ListAgentToolsResponse, OrchestratorError> {
        let mode = omicos_proto::PermissionMode::parse(&r.permission_mode)?;
        let team = self.engine.agents.resolve_team(&[], &r.agent)?;
        let toolsets: Vec<String> = team
            .active
            .toolsets
            .iter()
            .filter(|t| *t != "team")
            .cloned()
            .collect();
        let mut tools = self
            .engine
            .runner
            .list_tools(ListToolsRequest {
                toolsets,
                permission_mode: mode as i32,
                allow_shell: None,
                allow_file_write: None,
            })
            .await?;
        let mut defs: Vec<crate::llm::ToolDef> = tools
            .iter()
            .map(|t| crate::llm::ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: serde_json::from_str(&t.input_schema_json)
                    .unwrap_or_else(|_| json!({"type": "object"})),
            })
            .collect();
        if team.active.toolsets.iter().any(|t| t == "team") {
            for d in crate::engine::team_tools() {
                tools.push(omicos_proto::ToolSpec {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    input_schema_json: d.parameters.to_string(),
                    toolset: "team".into(),
                    provider: "orchestrator".into(),
                    ..Default::default()
                });
                defs.push(d);
            }
        }
        let llm_tools = if r.format == "anthropic" {
            crate::llm::anthropic::tools_json(&defs)
        } else {
            crate::llm::openai::tools_json(&defs)
        };
        Ok(ListAgentToolsResponse {
            tools,
            llm_tools_json: llm_tools.to_string(),
        })
    }
}
