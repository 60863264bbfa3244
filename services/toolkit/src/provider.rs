//! The in-process provider trait and the context a call runs in.

use async_trait::async_trait;
use omicos_proto::{
    ToolOutputChunk, ToolProgress, ToolSpec, call_tool_event, execute_server_message,
};
use serde_json::Value;
use std::path::PathBuf;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Something a running tool reports before its result.
#[derive(Clone, Debug)]
pub enum ProviderEvent {
    /// A progress bar moved.
    Progress(ToolProgress),
    /// Output was produced.
    Output(ToolOutputChunk),
}

// The one conversion of a provider's event to the wire: the provider service
// sends it as a `CallToolEvent`, the runner forwards it on the Execute stream.

impl From<ProviderEvent> for call_tool_event::Event {
    fn from(ev: ProviderEvent) -> Self {
        match ev {
            ProviderEvent::Progress(p) => Self::Progress(p),
            ProviderEvent::Output(o) => Self::Output(o),
        }
    }
}

impl From<ProviderEvent> for execute_server_message::Msg {
    fn from(ev: ProviderEvent) -> Self {
        match ev {
            ProviderEvent::Progress(p) => Self::Progress(p),
            ProviderEvent::Output(o) => Self::Output(o),
        }
    }
}

/// Where a tool sends progress and output while it runs. Sending never blocks
/// the tool for long: when the consumer is gone, events are dropped.
#[derive(Clone, Debug)]
pub struct EventSink(Option<mpsc::Sender<ProviderEvent>>);

impl EventSink {
    /// A sink that forwards into `tx`.
    pub fn new(tx: mpsc::Sender<ProviderEvent>) -> Self {
        Self(Some(tx))
    }
    /// A sink that drops everything.
    pub fn discard() -> Self {
        Self(None)
    }
    /// Reports progress.
    pub async fn progress(&self, p: ToolProgress) {
        self.send(ProviderEvent::Progress(p)).await
    }
    /// Reports a chunk of output on `stream` ("stdout" or "stderr").
    pub async fn output(&self, stream: &str, text: impl Into<String>) {
        self.send(ProviderEvent::Output(ToolOutputChunk {
            stream: stream.into(),
            text: text.into(),
        }))
        .await
    }
    async fn send(&self, ev: ProviderEvent) {
        if let Some(tx) = &self.0 {
            let _ = tx.send(ev).await;
        }
    }
}

/// The context of one tool call.
#[derive(Clone, Debug)]
pub struct CallCtx {
    /// The model's tool call id.
    pub call_id: String,
    /// The chat session.
    pub session_id: String,
    /// The agent that made the call.
    pub agent_id: String,
    /// The user or a hook changed the input before it ran.
    pub user_modified: bool,
    /// Memory scope, set by the runner from the deployment, never by the model.
    pub scope: String,
    /// The workspace this call works in: the provider's own (configured)
    /// root, or its tenant's directory under it ([`crate::tenancy`]).
    pub workspace: PathBuf,
    /// The tenant the call acts for (empty: the root tenant), as the runner
    /// learnt it from an authenticated orchestrator.
    pub tenant: String,
    /// Progress and output.
    pub events: EventSink,
    /// Cancelled when the client cancels or the stream drops.
    pub cancel: CancellationToken,
    /// The paths a file tool changed in this call, with their prior content
    /// (the turn's checkpoint for RewindSession).
    pub file_changes: crate::checkpoint::FileChanges,
}

impl CallCtx {
    /// A context for tests and direct calls.
    pub fn for_test(workspace: impl Into<PathBuf>, session_id: &str) -> Self {
        Self {
            call_id: "call_test".into(),
            session_id: session_id.into(),
            agent_id: "test".into(),
            user_modified: false,
            scope: "workspace".into(),
            workspace: workspace.into(),
            tenant: String::new(),
            events: EventSink::discard(),
            cancel: CancellationToken::new(),
            file_changes: Default::default(),
        }
    }
}

/// Why a tool call failed. The message is what the model reads: make it clear.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolError {
    /// The input is wrong for this tool (beyond the schema).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// The provider cannot be reached or is not configured.
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    /// The call was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The tool is not served here.
    #[error("unknown tool: {0}")]
    UnknownTool(String),
}

impl ToolError {
    /// Shorthand for [`ToolError::Failed`].
    pub fn failed(msg: impl Into<String>) -> Self {
        Self::Failed(msg.into())
    }
    /// Shorthand for [`ToolError::InvalidInput`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidInput(msg.into())
    }
}

/// A set of tools served by one implementation: in process (file_manager,
/// shell, ...) or as its own service behind [`crate::server::ProviderService`].
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Provider name (`kernel`, `web`, `memory`, ...).
    fn name(&self) -> &str;
    /// The tools, with schemas, risk and aliases.
    fn tools(&self) -> Vec<ToolSpec>;
    /// Stateful providers are pinned per session by the registry.
    fn session_affinity(&self) -> bool {
        false
    }
    /// The tool's own checks after the schema passed: paths, conflicting
    /// parameters, install rules. `args` is already schema-valid.
    fn validate_input(&self, _tool: &str, _args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        Ok(())
    }
    /// Runs `tool`. Report progress and output through `ctx.events`; stop when
    /// `ctx.cancel` fires.
    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError>;
    /// The session ended (deleted or expired): stop what it left running
    /// (kernels, sandbox boxes, per-session servers). Returns how many
    /// things were stopped. Idempotent.
    async fn end_session(&self, _tenant: &str, _session: &str) -> u32 {
        0
    }
}
