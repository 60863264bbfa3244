//! The `omicos.v1.OrchestratorWeb` service: what a client without bidi
//! streams needs beside Orchestrator (the web page over gRPC-web, grpcurl).
//! StartTurn starts a turn through the same path as Chat's first message
//! ([`OrchestratorService::start_turn`]); the client then follows it with
//! Attach and answers with ApproveTool and CancelTurn.

use super::OrchestratorService;
use super::chat::Started;
use crate::error::{OrchestratorError, grpc};
use omicos_proto::{
    ChatRequest, ClientConfig, GetClientConfigRequest, PermissionMode, StartTurnResponse,
    chat_event, orchestrator_web_server::OrchestratorWeb,
};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

/// The mode a request without one runs in: the tool-runner's default for
/// PERMISSION_MODE_UNSPECIFIED (nothing with side effects runs).
const DEFAULT_PERMISSION_MODE: PermissionMode = PermissionMode::ReadOnly;

impl OrchestratorService {
    /// StartTurn: starts the turn and returns once its TurnStarted is in the
    /// session's log, so an Attach made after this returns sees it. The
    /// call's own deadline (grpc-timeout) bounds this call, not the turn.
    pub(super) async fn start_turn_rpc(
        &self,
        who: &omicos_auth::Principal,
        owned: Option<super::guard::Owned>,
        cr: ChatRequest,
    ) -> Result<StartTurnResponse, OrchestratorError> {
        tracing::info!(session = %cr.session_id, agent = %cr.agent, "start turn");
        let Started {
            state,
            turn_id,
            start_seq,
            events: mut rx,
            steered,
        } = self.start_turn(who, owned, cr, None).await?;
        if steered {
            // The turn started long ago; its Steer event comes at its next model request.
            return Ok(StartTurnResponse {
                session_id: state.id.clone(),
                turn_id,
                start_seq: start_seq + 1,
                steered,
            });
        }
        // TurnStarted is the turn's first event, so its seq is start_seq + 1;
        // rx was subscribed before the turn could emit it. Already past it
        // when last_seq says so (the seq lock covers the append and the broadcast).
        if state.last_seq().await <= start_seq {
            loop {
                match rx.recv().await {
                    Ok(ev) if ev.turn_id == turn_id => {
                        if matches!(ev.kind, Some(chat_event::Kind::TurnStarted(_))) {
                            break;
                        }
                    }
                    Ok(_) => {}
                    // Past it already, or the session's state went away with the turn.
                    Err(RecvError::Lagged(_) | RecvError::Closed) => break,
                }
            }
        }
        Ok(StartTurnResponse {
            session_id: state.id.clone(),
            turn_id,
            start_seq: start_seq + 1,
            steered,
        })
    }

    /// GetClientConfig: the providers (the default first), the default model
    /// and mode, the tier, the heartbeat period of Attach streams and the
    /// upload limits.
    pub(super) fn client_config_rpc(&self) -> ClientConfig {
        let e = &self.engine;
        let mut others: Vec<String> = e
            .backends
            .keys()
            .filter(|k| **k != e.default_backend)
            .cloned()
            .collect();
        others.sort();
        let mut providers = vec![e.default_backend.clone()];
        providers.extend(others);
        let (_, deployment_tier) = e.agents.list();
        ClientConfig {
            providers,
            default_model: e.config.llm.model.clone(),
            // ChatRequest.model and .provider reach the backend (engine/frame.rs).
            model_override: true,
            default_permission_mode: DEFAULT_PERMISSION_MODE as i32,
            deployment_tier,
            heartbeat_secs: self.heartbeat().as_secs().clamp(1, u32::MAX as u64) as u32,
            upload_max_file_bytes: e.config.uploads.max_file_bytes,
            upload_max_request_bytes: e.config.uploads.max_request_bytes,
            upload_max_files: e.config.uploads.max_files.min(u32::MAX as usize) as u32,
        }
    }
}

#[tonic::async_trait]
impl OrchestratorWeb for OrchestratorService {
    async fn start_turn(
        &self,
        req: Request<ChatRequest>,
    ) -> Result<Response<StartTurnResponse>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let owned = super::guard::maybe_owned(&req);
        grpc(self.start_turn_rpc(&who, owned, req.into_inner()).await).map(Response::new)
    }

    async fn get_client_config(
        &self,
        _req: Request<GetClientConfigRequest>,
    ) -> Result<Response<ClientConfig>, Status> {
        Ok(Response::new(self.client_config_rpc()))
    }
}
