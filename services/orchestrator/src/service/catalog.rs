//! Catalog RPCs: ListAgents, RefreshCatalog, ListAgentTools.

use super::OrchestratorService;
use crate::error::OrchestratorError;
use omicos_proto::{
    ListAgentToolsRequest, ListAgentToolsResponse, ListAgentsResponse, RefreshCatalogResponse,
};

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
    /// and as the model's `tools` JSON: what a turn of this caller with
    /// that agent and mode lists (the caller's ceiling caps the mode, the
    /// agent's frontmatter rules and the deployment's hide what they deny
    /// outright), through the turn's own path.
    pub(super) async fn list_agent_tools_rpc(
        &self,
        who: &omicos_auth::Principal,
        r: ListAgentToolsRequest,
    ) -> Result<ListAgentToolsResponse, OrchestratorError> {
        let mode = who.ceiling_mode(omicos_proto::PermissionMode::parse(&r.permission_mode)?);
        let team = self.engine.agents.resolve_team(&[], &r.agent)?;
        let tools = self
            .engine
            .agent_tools(&team.active, &crate::engine::ToolScope::mode(mode))
            .await?;
        let llm_tools = if r.format == "anthropic" {
            crate::llm::anthropic::tools_json(&tools.defs)
        } else {
            crate::llm::openai::tools_json(&tools.defs)
        };
        Ok(ListAgentToolsResponse {
            tools: tools.specs.clone(),
            llm_tools_json: llm_tools.to_string(),
        })
    }
}
