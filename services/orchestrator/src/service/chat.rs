//! The Chat RPC: the first message starts a turn; later messages carry
//! approvals and cancels. The turn itself runs in the engine
//! ([`crate::engine::Engine::run_turn`]).

use super::events::{Pump, PumpStart, one_shot_error};
use super::{EventStream, OrchestratorService};
use crate::engine::{RootTurn, TurnSettings};
use crate::error::OrchestratorError;
use crate::hub::{RunningTurn, SessionState, SteerQueue};
use omicos_proto::{
    ChatClientMessage, ChatEvent, ChatRequest, Decision, PermissionMode, chat_client_message,
};
use omicos_sessionstore::{SessionMeta, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status, Streaming};
use tracing::Instrument;

/// The deadline a client set on its call: the `grpc-timeout` header of the
/// gRPC over HTTP/2 spec (at most 8 digits, then H, M, S, m, u or n). tonic
/// bounds only the handler's future with it, not the stream, so the turn
/// applies it itself. A malformed value is ignored, as tonic ignores it.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let unit = v.chars().last()?;
    let digits = &v[..v.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A turn that has started: its session, its id, the seq before its first
/// event, and a subscription made before the turn could emit anything (so
/// every event of the turn reaches it, and nothing needs reading back).
pub(super) struct Started {
    pub(super) state: Arc<SessionState>,
    pub(super) turn_id: String,
    pub(super) start_seq: u64,
    pub(super) events: broadcast::Receiver<ChatEvent>,
    /// The message was steered into a turn already running.
    pub(super) steered: bool,
}

impl OrchestratorService {
    /// Chat: starts the turn, then streams its events and relays the client's later messages.
    pub(super) async fn chat_rpc(
        &self,
        req: Request<Streaming<ChatClientMessage>>,
    ) -> Result<EventStream, Status> {
        let deadline = grpc_timeout(req.metadata()).map(|t| tokio::time::Instant::now() + t);
        let who = omicos_auth::principal::of(&req)?;
        let owned = super::guard::maybe_owned(&req);
        let mut inbound = req.into_inner();
        // A first message that does not decode is already INVALID_ARGUMENT (the codec's).
        let first = inbound.message().await?.ok_or_else(|| {
            Status::from(OrchestratorError::InvalidArgument(
                "empty Chat stream".into(),
            ))
        })?;
        let Some(chat_client_message::Msg::Request(cr)) = first.msg else {
            return Err(OrchestratorError::InvalidArgument(
                "the first Chat message must be a ChatRequest".into(),
            )
            .into());
        };
        tracing::info!(session = %cr.session_id, agent = %cr.agent, "chat request");
        let session_id = cr.session_id.clone();
        let Started {
            state,
            turn_id,
            start_seq,
            events: rx,
            ..
        } = match self.start_turn(&who, owned, cr, deadline).await {
            Ok(s) => s,
            // Answered in-band, so a client that resumes a lost session sees why in its event stream.
            Err(e @ OrchestratorError::SessionNotFound(_)) => {
                return Ok(one_shot_error(
                    &session_id,
                    &e,
                    "; leave session_id empty to start a new one",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        // Subscribed before the turn started: every event after start_seq
        // comes through rx (a lagging pump re-reads the store).
        // The pump holds the session while the client follows it; once it and
        // the turn are done, the hub drops the session's live state.
        let events = Pump::stream(
            PumpStart {
                state: state.clone(),
                last_sent: start_seq,
                heartbeat: self.heartbeat(),
                stop: self.streams_stop.clone(),
            },
            move |pump| pump.follow(rx, turn_id),
        );
        // Later client messages: approvals and cancel. The turn outlives the
        // stream; this task does not keep an idle session alive.
        let st = Arc::downgrade(&state);
        drop(state);
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let Some(st) = st.upgrade() else { break };
                match m.msg {
                    Some(chat_client_message::Msg::Approval(a)) => {
                        let d = Decision::try_from(a.decision).unwrap_or(Decision::Deny);
                        let answer = match crate::hub::approval_rule(d, &a.rule) {
                            Ok(rule) => crate::hub::ApprovalAnswer { decision: d, rule },
                            // Never wider than asked: the call runs once, nothing is kept.
                            Err(e) => {
                                tracing::warn!(call_id = %a.call_id, error = %e, "approval rule refused; allowed once");
                                crate::hub::ApprovalAnswer::plain(if d == Decision::Deny {
                                    d
                                } else {
                                    Decision::AllowOnce
                                })
                            }
                        };
                        if !st.resolve_approval(&a.call_id, answer) {
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
        Ok(events)
    }

    /// Decides whether the request may start a turn (session, team, lease)
    /// and, when it may, starts it in the engine. Chat and
    /// OrchestratorWeb/StartTurn both start turns here.
    pub(super) async fn start_turn(
        &self,
        who: &omicos_auth::Principal,
        owned: Option<super::guard::Owned>,
        mut cr: ChatRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Started, OrchestratorError> {
        // A new session's title is what the person typed, not the attachment
        // line below (files alone: their names).
        let title: String = if cr.message.trim().is_empty() && !cr.attachments.is_empty() {
            cr.attachments
                .iter()
                .map(|a| a.path.rsplit('/').next().unwrap_or(&a.path))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            cr.message.clone()
        }
        .chars()
        .take(80)
        .collect();
        // The model reads which files came with the message, and where.
        cr.message = super::uploads::with_attachments(&cr.message, &cr.attachments)?;
        // The principal's ceiling caps the mode and the legacy switches alike.
        let mode = who.ceiling_mode(PermissionMode::parse(&cr.permission_mode)?);
        let rules = cr.permissions.clone().unwrap_or_default();
        omicos_rules::Rules::parse(
            &omicos_rules::RuleLists {
                allow: rules.allow.clone(),
                ask: rules.ask.clone(),
                deny: rules.deny.clone(),
            },
            omicos_rules::Source::Request,
        )
        .map_err(|e| OrchestratorError::InvalidArgument(format!("permissions: {e}")))?;
        if cr.message.trim().is_empty() {
            return Err(OrchestratorError::InvalidArgument(
                "message is empty".into(),
            ));
        }
        let store = self.hub.store().clone();
        let existing = if cr.session_id.is_empty() {
            None
        } else {
            // The session guard admitted the session it names (another
            // owner's was answered as one that does not exist).
            match owned {
                Some(o) if o.id() == cr.session_id => Some(o.meta().clone()),
                _ => return Err(OrchestratorError::SessionNotFound(cr.session_id.clone())),
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
        if cr.steer
            && let Some(meta) = &existing
            && let Some(steered) = self.steer(&meta.id, &cr.message).await
        {
            return Ok(steered);
        }
        let team = self.engine.agents.resolve_team(&members, &active)?;
        let session_id = if cr.session_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            cr.session_id.clone()
        };
        let now = now_ms();
        let meta = SessionMeta {
            id: session_id.clone(),
            title: existing.as_ref().map(|m| m.title.clone()).unwrap_or(title),
            agent: team.active.id.clone(),
            team_members: team.members.clone(),
            created_ms: existing.as_ref().map(|m| m.created_ms).unwrap_or(now),
            last_active_ms: now,
            tenant: who.tenant.clone(),
            subject: who.subject.clone(),
        };
        // A session made for this turn (its id was drawn just now) has
        // nothing to read back: no events, grants, history or open turn;
        // it is written with the turn's lease, below, in one write.
        let new_session = existing.is_none();
        if !new_session {
            store.put_session(&meta).await?;
        }
        let state = if new_session {
            self.hub.new_session(&session_id)
        } else {
            self.hub.state(&session_id).await?
        };
        let turn_id = uuid::Uuid::new_v4().simple().to_string();
        let owner = format!("{}:{turn_id}", self.instance);
        let lease = self.engine.config.turn_lease;
        let lease_ms = lease.as_millis() as i64;
        let cancel = CancellationToken::new();
        let steer = Arc::new(SteerQueue::default());
        if !state.start_turn(RunningTurn {
            turn_id: turn_id.clone(),
            cancel: cancel.clone(),
            lease_owner: owner.clone(),
            steer: steer.clone(),
        }) {
            return Err(OrchestratorError::SessionBusy(session_id));
        }
        let leased = if new_session {
            store.create_leased_session(&meta, &owner, lease_ms).await
        } else {
            store.try_lease_turn(&session_id, &owner, lease_ms).await
        };
        match leased {
            Ok(true) => {}
            Ok(false) => {
                state.end_turn(&turn_id);
                return Err(OrchestratorError::SessionBusy(session_id));
            }
            Err(e) => {
                state.end_turn(&turn_id);
                return Err(e.into());
            }
        }
        // The lease may have been taken over from a lost replica: close its
        // turn first, then read the grants made on any replica.
        let ready = async {
            if new_session {
                return Ok(());
            }
            crate::recovery::close_open_turn(&state).await?;
            state.load_grants().await?;
            state.sync_seq().await
        };
        if let Err(e) = ready.await {
            let _ = store.release_turn(&session_id, &owner).await;
            state.end_turn(&turn_id);
            return Err(e);
        }
        let start_seq = state.last_seq().await;
        let events = state.subscribe();
        let settings = TurnSettings {
            turn_id: turn_id.clone(),
            permission_mode: mode,
            allow_shell: who.ceiling_switch(cr.allow_shell),
            allow_file_write: who.ceiling_switch(cr.allow_file_write),
            model: cr.model.clone(),
            provider: cr.provider.clone(),
            max_iterations: if cr.max_tool_iterations == 0 {
                self.engine.config.max_tool_iterations
            } else {
                cr.max_tool_iterations
            },
            team: team.members.clone(),
            deadline,
            rules,
            principal: who.clone(),
        };
        // The turn's `invoke_agent` span: every model request and tool call
        // of the turn is under it, wherever the turn's task runs.
        let span = crate::genai::agent_span(&team.active.id, &state.id);
        tokio::spawn(
            self.engine
                .clone()
                .run_turn(
                    state.clone(),
                    RootTurn {
                        settings,
                        message: cr.message,
                        agent: team.active,
                        lease_owner: owner,
                        lease,
                        cancel,
                        new_session,
                        steer,
                    },
                )
                .instrument(span),
        );
        Ok(Started {
            state,
            turn_id,
            start_seq,
            events,
            steered: false,
        })
    }
}

impl OrchestratorService {
    /// Hands `message` to the turn running on this session here, if it
    /// still takes messages; the caller then follows that turn to its end.
    /// None: no turn here takes it (the message starts a turn of its own).
    async fn steer(&self, session_id: &str, message: &str) -> Option<Started> {
        let state = self.hub.existing(session_id)?;
        let turn = state.running()?;
        // Subscribed before the message is handed over: the turn's Steer
        // event, and everything after it, reaches this stream.
        let start_seq = state.last_seq().await;
        let events = state.subscribe();
        if !turn.steer.push(message.to_owned()) {
            return None;
        }
        tracing::info!(session = %session_id, turn = %turn.turn_id, "message steered into the running turn");
        Some(Started {
            state,
            turn_id: turn.turn_id,
            start_seq,
            events,
            steered: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(v: &str) -> Option<Duration> {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&md)
    }

    #[test]
    fn grpc_timeout_follows_the_spec() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("30S"), Some(Duration::from_secs(30)));
        assert_eq!(timeout_of("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(
            timeout_of("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout_of("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "10x", "-1S", "1.5S", "10 S"] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&tonic::metadata::MetadataMap::new()), None);
        // What a tonic client sends for Request::set_timeout.
        let mut r = tonic::Request::new(());
        r.set_timeout(Duration::from_millis(250));
        assert_eq!(grpc_timeout(r.metadata()), Some(Duration::from_millis(250)));
    }
}
