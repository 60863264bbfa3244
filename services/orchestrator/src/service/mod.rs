//! The `omicos.v1.Orchestrator` gRPC service: one struct, one `impl` spread
//! over files by concern (goose-style):
//! - [`chat`]: the Chat RPC and the start of a turn;
//! - [`events`]: the event stream a client follows (Pump, Attach);
//! - [`sessions`]: List/Get/Delete sessions, CancelTurn, ApproveTool;
//! - [`catalog`]: ListAgents, RefreshCatalog, ListAgentTools;
//! - [`uploads`]: UploadFiles and the attachment line of a message;
//! - [`values`]: ReadValue, a cut value whole;
//! - [`web`]: the OrchestratorWeb service (StartTurn, GetClientConfig);
//! - [`guard`]: the session guard every call passes before it gets here;
//! - [`a2a`]: the same turns as an A2A agent (JSON-RPC on the HTTP port).
//!
//! The trait impl below only dispatches. A handler that works on a session
//! reaches it only through the [`guard::Owned`] the guard put in the request.

pub mod a2a;
mod catalog;
mod chat;
mod compact;
mod events;
mod fork;
pub mod guard;
mod sessions;
pub mod uploads;
mod values;
mod web;

use crate::engine::Engine;
use crate::error::grpc;
use crate::hub::Hub;
use omicos_auth::principal;
use omicos_proto::{
    ApproveToolRequest, ApproveToolResponse, AttachRequest, CancelTurnRequest, CancelTurnResponse,
    ChatClientMessage, ChatEvent, CompactRequest, CompactResponse, DeleteSessionRequest,
    DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse, GetSessionRequest,
    ListAgentToolsRequest, ListAgentToolsResponse, ListAgentsRequest, ListAgentsResponse,
    ListSessionsRequest, ListSessionsResponse, ReadValueRequest, RefreshCatalogRequest,
    RefreshCatalogResponse, RenameSessionRequest, RenameSessionResponse, RewindSessionRequest,
    RewindSessionResponse, Session, UploadFilesRequest, UploadFilesResponse,
    orchestrator_server::Orchestrator,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

type EventStream = Pin<Box<dyn Stream<Item = Result<ChatEvent, Status>> + Send>>;

/// The orchestrator service.
pub struct OrchestratorService {
    engine: Arc<Engine>,
    hub: Arc<Hub>,
    instance: String,
    streams_stop: CancellationToken,
}

impl OrchestratorService {
    /// A service over `engine` and `hub`. `streams_stop` ends long streams at the end of the drain.
    pub fn new(engine: Arc<Engine>, hub: Arc<Hub>, streams_stop: CancellationToken) -> Self {
        Self {
            engine,
            hub,
            instance: uuid::Uuid::new_v4().simple().to_string(),
            streams_stop,
        }
    }

    /// This replica's id (the first part of its lease owners).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn heartbeat(&self) -> Duration {
        self.engine.config.heartbeat_interval
    }
}

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    type ChatStream = EventStream;

    async fn chat(
        &self,
        req: Request<Streaming<ChatClientMessage>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        self.chat_rpc(req).await.map(Response::new)
    }

    type AttachStream = EventStream;

    async fn attach(
        &self,
        req: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.attach_rpc(&owned, req.into_inner()).await).map(Response::new)
    }

    async fn cancel_turn(
        &self,
        req: Request<CancelTurnRequest>,
    ) -> Result<Response<CancelTurnResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.cancel_turn_rpc(&owned).await).map(Response::new)
    }

    async fn approve_tool(
        &self,
        req: Request<ApproveToolRequest>,
    ) -> Result<Response<ApproveToolResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        let who = owned.principal().clone();
        let req = req.into_inner();
        let (session, call, decision) = (owned.id().to_owned(), req.call_id.clone(), req.decision);
        let r = self.approve_tool_rpc(&owned, req).await;
        tracing::info!(
            target: "omicos::audit",
            event = "approval",
            principal = %who.label(),
            session = %session,
            call_id = %call,
            decision = omicos_proto::Decision::try_from(decision)
                .map(|d| d.as_str_name())
                .unwrap_or("UNKNOWN"),
            accepted = r.is_ok(),
            "approval answered"
        );
        grpc(r).map(Response::new)
    }

    async fn list_agents(
        &self,
        _req: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        Ok(Response::new(self.list_agents_rpc()))
    }

    async fn list_sessions(
        &self,
        req: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        let who = principal::of(&req)?;
        grpc(self.list_sessions_rpc(&who, req.into_inner()).await).map(Response::new)
    }

    async fn get_session(
        &self,
        req: Request<GetSessionRequest>,
    ) -> Result<Response<Session>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.get_session_rpc(&owned).await).map(Response::new)
    }

    async fn delete_session(
        &self,
        req: Request<DeleteSessionRequest>,
    ) -> Result<Response<DeleteSessionResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.delete_session_rpc(&owned).await).map(Response::new)
    }

    async fn refresh_catalog(
        &self,
        _req: Request<RefreshCatalogRequest>,
    ) -> Result<Response<RefreshCatalogResponse>, Status> {
        Ok(Response::new(self.refresh_catalog_rpc()))
    }

    async fn list_agent_tools(
        &self,
        req: Request<ListAgentToolsRequest>,
    ) -> Result<Response<ListAgentToolsResponse>, Status> {
        let who = principal::of(&req)?;
        grpc(self.list_agent_tools_rpc(&who, req.into_inner()).await).map(Response::new)
    }

    async fn compact(
        &self,
        req: Request<CompactRequest>,
    ) -> Result<Response<CompactResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.compact_rpc(&owned).await).map(Response::new)
    }

    async fn fork_session(
        &self,
        req: Request<ForkSessionRequest>,
    ) -> Result<Response<ForkSessionResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        let r = self.fork_session_rpc(&owned, req.into_inner()).await;
        audit(&owned, "fork_session", &r);
        grpc(r).map(Response::new)
    }

    async fn rewind_session(
        &self,
        req: Request<RewindSessionRequest>,
    ) -> Result<Response<RewindSessionResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        let r = self.rewind_session_rpc(&owned, req.into_inner()).await;
        audit(&owned, "rewind_session", &r);
        grpc(r).map(Response::new)
    }

    async fn rename_session(
        &self,
        req: Request<RenameSessionRequest>,
    ) -> Result<Response<RenameSessionResponse>, Status> {
        let owned = guard::owned_of(&req)?;
        let r = self
            .rename_session_rpc(&owned, &req.into_inner().title)
            .await;
        audit(&owned, "rename_session", &r);
        grpc(r).map(Response::new)
    }

    type ReadValueStream = values::ValueStream;

    async fn read_value(
        &self,
        req: Request<ReadValueRequest>,
    ) -> Result<Response<Self::ReadValueStream>, Status> {
        let owned = guard::owned_of(&req)?;
        grpc(self.read_value_rpc(&owned, req.into_inner()).await).map(Response::new)
    }

    async fn upload_files(
        &self,
        req: Request<UploadFilesRequest>,
    ) -> Result<Response<UploadFilesResponse>, Status> {
        let who = principal::of(&req)?;
        let owned = guard::maybe_owned(&req);
        let r = self.upload_files_rpc(&who, owned, req.into_inner()).await;
        match &r {
            Ok(done) => tracing::info!(
                target: "omicos::audit",
                event = "upload_files",
                principal = %who.label(),
                files = done.files.len(),
                bytes = done.files.iter().map(|f| f.size_bytes).sum::<u64>(),
                accepted = true,
                "files uploaded"
            ),
            Err(e) => tracing::info!(
                target: "omicos::audit",
                event = "upload_files",
                principal = %who.label(),
                accepted = false,
                refused = e.kind().as_str(),
                reason = %e.report(),
                "upload refused"
            ),
        }
        grpc(r).map(Response::new)
    }
}

/// Logs a session-changing RPC on the audit target, refused or not (a
/// caller refused by the guard never gets here: the guard logs it).
fn audit<T>(owned: &guard::Owned, event: &str, r: &Result<T, crate::error::OrchestratorError>) {
    let who = owned.principal().label();
    match r {
        Ok(_) => tracing::info!(
            target: "omicos::audit",
            event,
            principal = %who,
            session = %owned.id(),
            accepted = true,
            "session changed"
        ),
        Err(e) => tracing::info!(
            target: "omicos::audit",
            event,
            principal = %who,
            session = %owned.id(),
            accepted = false,
            refused = e.kind().as_str(),
            reason = %e.report(),
            "session change refused"
        ),
    }
}
