//! A root turn from start to end: lease renewal, the user message, the
//! history, the frame of the active agent, the trajectory, the lease's
//! release and the turn_done that ends it.

use super::{Engine, Frame, Outcome, TurnSettings, emit_error};
use crate::agents::AgentProfile;
use crate::error::OrchestratorError;
use crate::hub::{SessionState, SteerQueue};
use crate::runner_client::EventTag;
use omicos_history::HistoryItem;
use omicos_proto::{ErrorEvent, TurnDone, TurnStarted, chat_event};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Renews the turn's lease every third of it while the turn runs (the
/// caller aborts the task before it releases the lease). A renewal the
/// store refuses means another replica took the lease (this one looked
/// lost: a partition, a stalled store): the turn is fenced here (its events
/// and history are no longer written from this replica) and cancelled, so
/// it never runs on two replicas at once.
pub(super) fn renew_lease(
    st: &Arc<SessionState>,
    owner: &str,
    lease: Duration,
    turn_id: &str,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (st, owner, turn_id, cancel) = (
        st.clone(),
        owner.to_owned(),
        turn_id.to_owned(),
        cancel.clone(),
    );
    let lease_ms = lease.as_millis() as i64;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(lease / 3).await;
            if let Ok(false) = st.store().try_lease_turn(&st.id, &owner, lease_ms).await {
                tracing::error!(session = %st.id, turn = %turn_id, "another replica took this turn's lease: it stops here (that replica continues it)");
                st.fence(&turn_id);
                cancel.cancel();
                return;
            }
        }
    })
}

/// The error kind of a prompt a UserPromptSubmit hook refused.
pub const PROMPT_BLOCKED: &str = "prompt_blocked";

/// Everything a root turn needs, decided when the Chat request was accepted.
pub struct RootTurn {
    /// The turn's settings (id, mode, team, limits).
    pub settings: TurnSettings,
    /// The user's message.
    pub message: String,
    /// The active agent.
    pub agent: AgentProfile,
    /// The lease owner this turn holds the session with.
    pub lease_owner: String,
    /// How long the lease lasts without renewal.
    pub lease: Duration,
    /// Cancels the turn (CancelTurn, a cancel on the stream).
    pub cancel: CancellationToken,
    /// The session was created for this turn: it has no history to read.
    pub new_session: bool,
    /// Messages steered into the turn while it runs.
    pub steer: Arc<SteerQueue>,
}

impl Engine {
    /// Runs a root turn whose lease is already held, and always ends it with
    /// a turn_done (which also clears the session's running turn).
    pub async fn run_turn(self: Arc<Self>, st: Arc<SessionState>, turn: RootTurn) {
        let RootTurn {
            settings,
            message,
            agent,
            lease_owner,
            lease,
            cancel,
            new_session,
            steer,
        } = turn;
        let turn_id = settings.turn_id.clone();
        let renew = renew_lease(&st, &lease_owner, lease, &settings.turn_id, &cancel);
        let tag = EventTag {
            turn_id: turn_id.clone(),
            context: "root".into(),
            agent_id: agent.id.clone(),
        };
        let started_seq = st
            .emit(tag.event(chat_event::Kind::TurnStarted(TurnStarted {
                message: message.clone(),
                agent: agent.id.clone(),
                team_members: settings.team.clone(),
                permission_mode: settings.permission_mode as i32,
                settings: Some(settings.to_wire()),
            })))
            .await;
        // Not waited for: the turn's next awaited record (its model turn,
        // before any hook can read the transcript) is written after it.
        self.trajectories.append_queued(
            &st.id,
            json!({"type": "user", "turn_id": turn_id, "agent": agent.id, "content": message}),
        );
        let mut meters = super::budget::Meters::default();
        let outcome = match self
            .before_prompt(&st, &settings, &message, new_session)
            .await
        {
            Err(why) => {
                // Refused before anything reached the history or the model.
                tracing::info!(session = %st.id, reason = %why, "prompt blocked by a hook");
                st.emit(tag.event(chat_event::Kind::Error(ErrorEvent {
                    kind: PROMPT_BLOCKED.into(),
                    message: why,
                })))
                .await;
                for message in steer.close() {
                    tracing::warn!(session = %st.id, message, "steered message dropped: the prompt was blocked");
                }
                Outcome::Blocked
            }
            Ok(context) => match self
                .load_history(&st, &message, new_session, context, (&turn_id, started_seq))
                .await
            {
                Ok(history) => {
                    meters.session_before = super::budget::Meter::of_history(&history);
                    let mut frame = Frame {
                        agent,
                        messages: history,
                        depth: 0,
                        chain: vec![],
                        context: "root".into(),
                        persist: true,
                        last_text: Arc::new(Mutex::new(String::new())),
                        meters: meters.clone(),
                        used: Default::default(),
                        steer: Some(steer.clone()),
                    };
                    self.drive(&st, &settings, &mut frame, &cancel, &steer, &tag)
                        .await
                }
                Err(e) => {
                    for message in steer.close() {
                        tracing::warn!(session = %st.id, message, "steered message dropped: the history was unreadable");
                    }
                    // Without its history the model would answer out of context: fail the turn clearly.
                    emit_error(&st, &tag, &e).await;
                    Outcome::Error
                }
            },
        };
        self.finish_turn(&st, &settings, &tag, outcome, &meters, renew, &lease_owner)
            .await;
    }

    /// Runs the root frame until it ends (a Stop hook may send it on), then
    /// keeps what was steered in after its last model request.
    pub(super) async fn drive(
        self: &Arc<Self>,
        st: &Arc<SessionState>,
        settings: &TurnSettings,
        frame: &mut Frame,
        cancel: &CancellationToken,
        steer: &SteerQueue,
        tag: &EventTag,
    ) -> Outcome {
        let mut continuations = 0;
        let outcome = loop {
            let outcome = self.run_root_frame(st, settings, frame, cancel).await;
            if outcome != Outcome::Completed
                || !self
                    .stop_hook_continues(st, settings, frame, continuations)
                    .await
            {
                break outcome;
            }
            continuations += 1;
        };
        // Steered in after the frame's last model request (it was
        // cancelled, or stopped at a limit): kept in the history,
        // where the next turn reads it.
        for message in steer.close() {
            self.steered(st, settings, frame, tag, message).await;
        }
        outcome
    }

    /// Ends a root turn: its trajectory record, the lease's release and the
    /// turn_done (which also clears the session's running turn).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finish_turn(
        &self,
        st: &Arc<SessionState>,
        settings: &TurnSettings,
        tag: &EventTag,
        outcome: Outcome,
        meters: &super::budget::Meters,
        renew: tokio::task::JoinHandle<()>,
        lease_owner: &str,
    ) {
        let turn_id = &settings.turn_id;
        let reason = outcome.reason();
        crate::metrics::get().turn_done(reason.as_str());
        if outcome.failed() {
            // The turn runs inside its `invoke_agent` span (service/chat.rs).
            crate::genai::agent_failed(&tracing::Span::current(), reason.as_str());
        }
        let usage = meters.summary();
        self.trajectories
            .append(
                &st.id,
                json!({"type": "turn_done", "turn_id": turn_id, "reason": reason.as_str(), "detail": outcome.detail(),
                       "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                 "cost": usage.cost, "model_calls": usage.model_calls}}),
            )
            .await;
        // Stopped before the release: a renewal polled at this moment on
        // another thread queues its write before the release's, not after.
        renew.abort();
        let _ = renew.await;
        if let Err(e) = st.store().release_turn(&st.id, lease_owner).await {
            // Not fatal: the lease expires on its own after `lease`.
            tracing::warn!(session = %st.id, error = %e, "turn lease not released");
        }
        st.emit_final(
            tag.event(chat_event::Kind::TurnDone(TurnDone {
                reason: reason as i32,
                usage: Some(usage),
                detail: outcome.detail(),
            })),
            turn_id,
        )
        .await;
    }

    /// Runs the root frame, bounded by the turn's deadline when it has one.
    /// At the deadline the frame is stopped the way a cancel stops it (every
    /// call it started is still answered), and the turn reports DEADLINE.
    async fn run_root_frame(
        self: &Arc<Self>,
        st: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        cancel: &CancellationToken,
    ) -> Outcome {
        let Some(at) = s.deadline else {
            return self.run_frame(st, s, frame, cancel).await;
        };
        let stop = cancel.child_token();
        let run = self.run_frame(st, s, frame, &stop);
        tokio::pin!(run);
        tokio::select! {
            o = &mut run => o,
            _ = tokio::time::sleep_until(at) => {
                stop.cancel();
                match run.await {
                    // It finished in the same instant: the answer stands.
                    Outcome::Completed => Outcome::Completed,
                    _ => Outcome::Deadline,
                }
            }
        }
    }

    /// The session's history with the user's message appended (and persisted).
    /// The message is persisted only after the history was read, so a failed
    /// read leaves the history as it was (the message stays in TurnStarted
    /// and the trajectory).
    async fn load_history(
        &self,
        st: &SessionState,
        message: &str,
        new_session: bool,
        context: Vec<HistoryItem>,
        (turn_id, started_seq): (&str, u64),
    ) -> Result<Vec<HistoryItem>, OrchestratorError> {
        let mut history = if new_session {
            Vec::new()
        } else {
            st.store()
                .messages(&st.id)
                .await
                .map_err(|source| OrchestratorError::History {
                    session: st.id.clone(),
                    source,
                })?
        };
        // The hooks' context follows the prompt, and is kept with it.
        let mut new = vec![HistoryItem::user(message)];
        new.extend(context);
        // Where the turn starts: RewindSession and ForkSession cut here.
        self.mark_turn(st, turn_id, history.len(), started_seq)
            .await;
        if let Err(e) = st.store().append_messages(&st.id, &new).await {
            tracing::error!(session = %st.id, error = %e, "user message not persisted");
        }
        history.extend(new);
        Ok(history)
    }
}
