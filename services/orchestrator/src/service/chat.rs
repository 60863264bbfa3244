//! The Chat RPC: the first message starts a turn; later messages carry
//! approvals and cancels. The turn itself runs in the engine.

use super::events::{Pump, one_shot_error};
use super::{EventStream, OrchestratorService};
use crate::engine::{RootTurn, TurnSettings};
use crate::hub::{RunningTurn, SessionState};
use omicos_proto::{ChatClientMessage, ChatRequest, Decision, PermissionMode, chat_client_message};
use omicos_sessionstore::{SessionMeta, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status, Streaming};

/// Parses a client's permission mode text; the message says what is accepted.
pub(super) fn parse_mode(text: &str) -> Result<PermissionMode, Status> {
    PermissionMode::parse(text).map_err(|e| Status::invalid_argument(e.to_string()))
}

pub(super) fn busy(session: &str) -> Status {
    Status::failed_precondition(format!(
        "session `{session}` is busy: a turn is running. Wait for its turn_done (Attach follows it) or cancel it with CancelTurn"
    ))
}

impl OrchestratorService {
    /// Chat: starts the turn, then streams its events and relays the client's later messages.
    pub(super) async fn chat_rpc(
        &self,
        req: Request<Streaming<ChatClientMessage>>,
    ) -> Result<EventStream, Status> {
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty Chat stream"))?;
        let Some(chat_client_message::Msg::Request(cr)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first Chat message must be a ChatRequest",
            ));
        };
        tracing::info!(session = %cr.session_id, agent = %cr.agent, "chat request");
        let (state, turn_id, start_seq) = match self.start_turn(cr).await {
            Ok(x) => x,
            Err(Ok(stream)) => return Ok(stream),
            Err(Err(status)) => return Err(status),
        };
        // Subscribe, then backfill from start_seq: nothing between is lost.
        let rx = state.subscribe();
        let (tx, out) = mpsc::channel(512);
        let pump = Pump {
            tx,
            state: state.clone(),
            last_sent: start_seq,
            heartbeat: self.heartbeat(),
            stop: self.streams_stop.clone(),
        };
        let t = turn_id.clone();
        let hub = self.hub.clone();
        let sid = state.id.clone();
        tokio::spawn(async move {
            let mut pump = pump;
            match pump.backfill(&t).await {
                Ok(true) | Err(()) => drop(pump),
                Ok(false) => pump.follow(rx, t).await,
            }
            // Give the turn task a moment to let go of the session, then drop idle state.
            tokio::time::sleep(Duration::from_millis(200)).await;
            hub.release_if_idle(&sid);
        });
        // Later client messages: approvals and cancel. The turn outlives the stream.
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                match m.msg {
                    Some(chat_client_message::Msg::Approval(a)) => {
                        let d = Decision::try_from(a.decision).unwrap_or(Decision::Deny);
                        if !st.resolve_approval(&a.call_id, d) {
                            tracing::warn!(call_id = %a.call_id, "approval for a call that is not waiting");
                        }
                    }
                    Some(chat_client_message::Msg::Cancel(_)) => {
                        if let Some(t) = st.running() {
                            t.cancel.cancel();
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(Box::pin(ReceiverStream::new(out)))
    }

    async fn start_turn(
        &self,
        cr: ChatRequest,
    ) -> Result<(Arc<SessionState>, String, u64), Result<EventStream, Status>> {
        let mode = parse_mode(&cr.permission_mode).map_err(Err)?;
        if cr.message.trim().is_empty() {
            return Err(Err(Status::invalid_argument("message is empty")));
        }
        let store = self.hub.store().clone();
        let existing = if cr.session_id.is_empty() {
            None
        } else {
            match store.get_session(&cr.session_id).await {
                Ok(Some(m)) => Some(m),
                Ok(None) => {
                    return Err(Ok(one_shot_error(
                        &cr.session_id,
                        "session_not_found",
                        format!(
                            "session `{}` does not exist; leave session_id empty to start a new one",
                            cr.session_id
                        ),
                    )));
                }
                Err(e) => return Err(Err(Status::unavailable(e.to_string()))),
            }
        };
        // A continued session keeps its team unless the request names one.
        let members = if cr.team_members.is_empty() {
            existing
                .as_ref()
                .map(|m| m.team_members.clone())
                .unwrap_or_default()
        } else {
            cr.team_members.clone()
        };
        let active = if cr.agent.is_empty() {
            existing
                .as_ref()
                .map(|m| m.agent.clone())
                .unwrap_or_default()
        } else {
            cr.agent.clone()
        };
        let team = self
            .engine
            .agents
            .resolve_team(&members, &active)
            .map_err(|e| Err(Status::failed_precondition(e)))?;
        let session_id = if cr.session_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            cr.session_id.clone()
        };
        let now = now_ms();
        let meta = SessionMeta {
            id: session_id.clone(),
            title: existing
                .as_ref()
                .map(|m| m.title.clone())
                .unwrap_or_else(|| cr.message.chars().take(80).collect()),
            agent: team.active.id.clone(),
            team_members: team.members.clone(),
            created_ms: existing.as_ref().map(|m| m.created_ms).unwrap_or(now),
            last_active_ms: now,
        };
        store
            .put_session(&meta)
            .await
            .map_err(|e| Err(Status::unavailable(e.to_string())))?;
        let state = self.hub.state(&session_id).await;
        let turn_id = uuid::Uuid::new_v4().simple().to_string();
        let owner = format!("{}:{turn_id}", self.instance);
        let lease = Duration::from_secs(self.engine.config.turn_lease_secs.max(5));
        let lease_ms = lease.as_millis() as i64;
        let cancel = CancellationToken::new();
        if !state.start_turn(RunningTurn {
            turn_id: turn_id.clone(),
            cancel: cancel.clone(),
        }) {
            return Err(Err(busy(&session_id)));
        }
        match store.try_lease_turn(&session_id, &owner, lease_ms).await {
            Ok(true) => {}
            Ok(false) => {
                state.end_turn(&turn_id);
                return Err(Err(busy(&session_id)));
            }
            Err(e) => {
                state.end_turn(&turn_id);
                return Err(Err(Status::unavailable(e.to_string())));
            }
        }
        state.sync_seq().await;
        let start_seq = state.last_seq().await;
        let settings = TurnSettings {
            turn_id: turn_id.clone(),
            permission_mode: mode,
            allow_shell: cr.allow_shell,
            allow_file_write: cr.allow_file_write,
            model: cr.model.clone(),
            provider: cr.provider.clone(),
            max_iterations: if cr.max_tool_iterations == 0 {
                self.engine.config.max_tool_iterations
            } else {
                cr.max_tool_iterations
            },
            team: team.members.clone(),
        };
        tokio::spawn(self.engine.clone().run_turn(
            state.clone(),
            RootTurn {
                settings,
                message: cr.message,
                agent: team.active,
                lease_owner: owner,
                lease,
                cancel,
            },
        ));
        Ok((state, turn_id, start_seq))
    }
}
