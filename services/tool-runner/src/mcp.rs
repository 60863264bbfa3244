//! MCP in the runner: the configured MCP servers start here, as one
//! in-process provider (their tools join the catalog; a `tools/list_changed`
//! bumps the registry version so the next ListTools and every replica's
//! catalog see it), and the pipeline is what omicos serves to MCP clients.

use crate::pipeline::{CallIo, CallRequest, CallerRules, Pipeline, permission::Legacy};
use crate::{Config, Registry};
use async_trait::async_trait;
use omicos_proto::{
    ExecuteApproval, ExecuteServerMessage, ExecuteStart, PermissionMode, ToolResult, ToolSpec,
};
use omicos_toolkit::Provider;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// [`crate::build`] plus the MCP servers of `config.mcp` (started first, each
/// within its startup timeout; one that fails is logged and left out).
pub async fn build_with_mcp(
    config: &Config,
    extra_providers: Vec<Arc<dyn Provider>>,
    stop: CancellationToken,
) -> Result<Pipeline, String> {
    let registry = Arc::new(
        Registry::new(config.registry_ttl)
            .with_policy(crate::ownership::RegistryPolicy::of(config)),
    );
    build_with_mcp_on(config, registry, extra_providers, stop).await
}

/// [`build_with_mcp`] over a given registry (the shared one, see
/// [`crate::open_registry`]).
pub async fn build_with_mcp_on(
    config: &Config,
    registry: Arc<Registry>,
    mut extra_providers: Vec<Arc<dyn Provider>>,
    stop: CancellationToken,
) -> Result<Pipeline, String> {
    if !config.mcp.servers.is_empty() {
        std::fs::create_dir_all(&config.workspace).map_err(|e| {
            format!(
                "config key `workspace`: cannot create {}: {e}",
                config.workspace.display()
            )
        })?;
        let workspace = config
            .workspace
            .canonicalize()
            .unwrap_or_else(|_| config.workspace.clone());
        let late = registry.clone();
        // The runner's one sandbox (the shell's too): a session's MCP server
        // runs in the session's box, as the session's uid.
        let sandbox = omicos_sandbox::Sandbox::shared(config.sandbox.clone())
            .map_err(|e| format!("the sandbox is not usable: {e}"));
        let provider = omicos_mcp::McpProvider::start_with(
            &config.mcp,
            &workspace,
            sandbox,
            Arc::new(move || late.touch()),
        )
        .await;
        extra_providers.push(provider);
    }
    if !config.a2a_agents.is_empty() {
        let a2a = crate::providers::A2aAgents::start(&config.a2a_agents).await?;
        extra_providers.push(Arc::new(a2a));
    }
    crate::build_on(config, registry, extra_providers, stop).map_err(|e| e.to_string())
}

/// The pipeline as the backend of omicos's MCP server.
pub struct PipelineBackend(pub Pipeline);

#[async_trait]
impl omicos_mcp::ToolBackend for PipelineBackend {
    async fn list_tools(
        &self,
        toolsets: &[String],
        mode: PermissionMode,
    ) -> Result<Vec<ToolSpec>, String> {
        self.0
            .list_tools(
                toolsets,
                mode as i32,
                Legacy::default(),
                &CallerRules::default(),
            )
            .map(|(tools, _)| tools)
            .map_err(|e| e.to_string())
    }

    async fn execute(
        &self,
        start: ExecuteStart,
        events: mpsc::Sender<ExecuteServerMessage>,
        approvals: mpsc::Receiver<ExecuteApproval>,
        cancel: CancellationToken,
    ) -> ToolResult {
        let io = CallIo {
            events: Some(events),
            approvals: Some(approvals),
            cancel,
        };
        self.0
            .execute(CallRequest::from(start), io)
            .await
            .into_result()
    }
}
