//! A turn whose orchestrator was lost (killed, partitioned): its lease stops
//! being renewed and expires. The first replica that notices (an Attach, a
//! Chat on that session, or the periodic sweep) takes the lease — the store's
//! atomic upsert lets exactly one replica have it — and closes the turn in the
//! log: every tool call left open gets an error result ([`INTERRUPTED`]),
//! every call the model asked for gets a `tool` message in the history (so the
//! next turn's request has no orphan tool calls), then turn_done INTERRUPTED.
//! The turn is not resumed: a half-run tool may have had side effects, and
//! the next user message continues the session from the persisted history.

use crate::config::TurnRecovery;
use crate::engine::{Engine, ResumedTurn};
use crate::error::OrchestratorError;
use crate::hub::{Hub, SessionState};
use omicos_history::HistoryItem;
use omicos_proto::{
    ChatEvent, ToolCallFinished, ToolStatus, TurnDone, TurnDoneReason, chat_event, model_envelope,
};
use omicos_sessionstore::now_ms;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;

/// The result every tool call left open by a lost orchestrator gets.
pub const INTERRUPTED: &str = "interrupted: the orchestrator running this turn was lost";

/// A turn the log shows started and not finished, with its calls still open.
#[derive(Debug, Default, PartialEq)]
pub struct OpenTurn {
    /// Turn id.
    pub turn_id: String,
    /// The agent of the TurnStarted event.
    pub agent_id: String,
    /// Calls started and not finished: (call id, name, execution context, agent).
    pub open_calls: Vec<(String, String, String, String)>,
    /// The timestamp of the log's last event.
    pub last_event_ms: i64,
}

/// The open turn of a log, if its last turn has no turn_done.
pub fn open_turn(events: &[ChatEvent]) -> Option<OpenTurn> {
    let mut open: Option<OpenTurn> = None;
    for ev in events {
        match &ev.kind {
            Some(chat_event::Kind::TurnStarted(_)) => {
                open = Some(OpenTurn {
                    turn_id: ev.turn_id.clone(),
                    agent_id: ev.agent_id.clone(),
                    ..Default::default()
                })
            }
            Some(chat_event::Kind::TurnDone(_)) => open = None,
            Some(chat_event::Kind::ToolCallStarted(c)) => {
                if let Some(t) = open.as_mut() {
                    t.open_calls.push((
                        c.call_id.clone(),
                        c.name.clone(),
                        ev.execution_context_id.clone(),
                        ev.agent_id.clone(),
                    ));
                }
            }
            Some(chat_event::Kind::ToolCallFinished(f)) => {
                if let Some(t) = open.as_mut() {
                    t.open_calls.retain(|c| c.0 != f.call_id);
                }
            }
            _ => {}
        }
    }
    if let (Some(t), Some(last)) = (open.as_mut(), events.last()) {
        t.last_event_ms = last.timestamp_ms;
    }
    open
}

/// The decoded log of a session.
async fn log(state: &SessionState) -> Result<Vec<ChatEvent>, OrchestratorError> {
    let rows = state.store().events_since(&state.id, 0).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(_, b)| ChatEvent::decode(b.as_slice()).ok())
        .collect())
}

/// `tool` messages for every call of the history's last assistant message that has none.
pub fn unanswered_tool_messages(history: &[HistoryItem]) -> Vec<HistoryItem> {
    crate::engine::resume::unanswered_calls(history)
        .iter()
        .map(|c| {
            HistoryItem::tool_result(&c.id, model_envelope(ToolStatus::Error, INTERRUPTED), None)
        })
        .collect()
}

/// Closes the session's open turn in the log, if it has one. The caller holds
/// the session's lease. True when a turn was closed.
pub async fn close_open_turn(state: &SessionState) -> Result<bool, OrchestratorError> {
    state.sync_seq().await?;
    let Some(open) = open_turn(&log(state).await?) else {
        return Ok(false);
    };
    tracing::warn!(session = %state.id, turn = %open.turn_id, open_calls = open.open_calls.len(), "closing a turn whose orchestrator was lost");
    let event = |context: &str, agent: &str, kind| ChatEvent {
        turn_id: open.turn_id.clone(),
        execution_context_id: context.to_owned(),
        agent_id: agent.to_owned(),
        kind: Some(kind),
        ..Default::default()
    };
    for (call_id, name, context, agent) in &open.open_calls {
        state
            .emit(event(
                context,
                agent,
                chat_event::Kind::ToolCallFinished(ToolCallFinished {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    status: ToolStatus::Error as i32,
                    result: INTERRUPTED.into(),
                    ..Default::default()
                }),
            ))
            .await;
    }
    match state.store().messages(&state.id).await {
        Ok(history) => {
            let answers = unanswered_tool_messages(&history);
            if !answers.is_empty()
                && let Err(e) = state.store().append_messages(&state.id, &answers).await
            {
                tracing::error!(session = %state.id, error = %e, "interrupted calls not answered in the history");
            }
        }
        Err(e) => {
            tracing::error!(session = %state.id, error = %e, "history unreadable: interrupted calls not answered in it")
        }
    }
    state
        .emit(event(
            "root",
            &open.agent_id,
            chat_event::Kind::TurnDone(TurnDone {
                reason: TurnDoneReason::Interrupted as i32,
                detail: "the orchestrator running this turn was lost".into(),
                ..Default::default()
            }),
        ))
        .await;
    Ok(true)
}

/// Takes over the session's turn if the replica running it was lost: its
/// lease expired (or, with no lease, the log is open and silent for a whole
/// lease). Exactly one replica does it: the one whose upsert takes the
/// lease. With `turn_recovery: resume` (the default) the turn continues
/// here ([`crate::engine::resume`]); with `interrupt`, or when it cannot be
/// continued (its agent is gone), it is closed as INTERRUPTED.
pub async fn recover_if_lost(
    hub: &Arc<Hub>,
    engine: &Arc<Engine>,
    session: &str,
    instance: &str,
) -> Result<bool, OrchestratorError> {
    if hub.existing(session).and_then(|s| s.running()).is_some() {
        return Ok(false);
    }
    let lease = engine.config.turn_lease;
    let store = hub.store();
    let now = now_ms();
    let lease_ms = lease.as_millis() as i64;
    let dead_owner = match store.lease(session).await? {
        Some(l) if l.expires_ms > now => return Ok(false),
        Some(l) => Some(l.owner),
        None => {
            // A replica lost between releasing the lease and writing turn_done.
            let state = hub.state(session).await?;
            match open_turn(&log(&state).await?) {
                Some(t) if t.last_event_ms + lease_ms < now => None,
                _ => return Ok(false),
            }
        }
    };
    let recovery_id = uuid::Uuid::new_v4().simple().to_string();
    let owner = format!("{instance}:recover-{recovery_id}");
    if !store.try_lease_turn(session, &owner, lease_ms).await? {
        return Ok(false);
    }
    let state = hub.state(session).await?;
    if engine.config.turn_recovery == TurnRecovery::Resume {
        match resume(engine, &state, instance, &owner).await {
            // It runs here now, under the lease `owner` (its turn keeps it).
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(session, error = %e.report(), "lost turn not resumed: closing it");
            }
        }
    }
    let closed = close_open_turn(&state).await;
    if let Some(dead) = dead_owner {
        // The lost turn's pending approvals and cancel requests.
        let _ = store.release_turn(session, &dead).await;
    }
    if let Err(e) = store.release_turn(session, &owner).await {
        tracing::warn!(session, error = %e, "recovery lease not released (it expires)");
    }
    closed
}

/// Continues the session's open turn here, under the lease `owner` this
/// replica holds. False: there is no open turn, or it cannot be continued
/// (its TurnStarted is missing, its agent is gone, a turn runs here).
async fn resume(
    engine: &Arc<Engine>,
    state: &Arc<SessionState>,
    instance: &str,
    owner: &str,
) -> Result<bool, OrchestratorError> {
    state.sync_seq().await?;
    let events = log(state).await?;
    let Some(open) = open_turn(&events) else {
        return Ok(false);
    };
    let Some(started) = events.iter().find_map(|e| match &e.kind {
        Some(chat_event::Kind::TurnStarted(t)) if e.turn_id == open.turn_id => Some(t.clone()),
        _ => None,
    }) else {
        return Ok(false);
    };
    let Some(meta) = state.store().get_session(&state.id).await? else {
        return Ok(false);
    };
    let team = match engine
        .agents
        .resolve_team(&started.team_members, &started.agent)
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(session = %state.id, agent = %started.agent, error = %e.report(), "the lost turn's agent is gone: it cannot be resumed");
            return Ok(false);
        }
    };
    let settings = crate::engine::TurnSettings::from_wire(
        &open.turn_id,
        &started,
        &meta.tenant,
        &meta.subject,
        engine.config.max_tool_iterations,
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let steer = Arc::new(crate::hub::SteerQueue::default());
    if !state.start_turn(crate::hub::RunningTurn {
        turn_id: open.turn_id.clone(),
        cancel: cancel.clone(),
        lease_owner: owner.to_owned(),
        steer: steer.clone(),
    }) {
        return Ok(false);
    }
    if let Err(e) = state.load_grants().await {
        state.end_turn(&open.turn_id);
        return Err(e.into());
    }
    tokio::spawn(engine.clone().resume_turn(
        state.clone(),
        ResumedTurn {
            settings,
            agent: team.active,
            message: started.message,
            lease_owner: owner.to_owned(),
            lease: engine.config.turn_lease,
            cancel,
            steer,
            replica: instance.to_owned(),
            log: events,
        },
    ));
    Ok(true)
}

/// Closes the turns of lost replicas, every `every`, until `stop`.
pub async fn sweep(
    hub: Arc<Hub>,
    engine: Arc<Engine>,
    instance: String,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let expired = match hub.store().expired_leases(now_ms(), 100).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "lost-turn sweep: leases unreadable");
                continue;
            }
        };
        for session in expired {
            if let Err(e) = recover_if_lost(&hub, &engine, &session, &instance).await {
                tracing::warn!(session, error = %e.report(), "lost turn not closed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omicos_proto::{ToolCallStarted, TurnStarted};
    use serde_json::json;

    fn ev(turn: &str, kind: chat_event::Kind) -> ChatEvent {
        ChatEvent {
            turn_id: turn.into(),
            execution_context_id: "root".into(),
            agent_id: "a".into(),
            timestamp_ms: 5,
            kind: Some(kind),
            ..Default::default()
        }
    }

    #[test]
    fn the_open_turn_and_its_open_calls_come_from_the_log() {
        let started = |id: &str| {
            chat_event::Kind::ToolCallStarted(ToolCallStarted {
                call_id: id.into(),
                name: "shell".into(),
                arguments: "{}".into(),
            })
        };
        let finished = |id: &str| {
            chat_event::Kind::ToolCallFinished(ToolCallFinished {
                call_id: id.into(),
                ..Default::default()
            })
        };
        let mut log = vec![
            ev("t1", chat_event::Kind::TurnStarted(TurnStarted::default())),
            ev("t1", chat_event::Kind::TurnDone(TurnDone::default())),
        ];
        assert_eq!(open_turn(&log), None, "a finished turn is not open");
        log.push(ev(
            "t2",
            chat_event::Kind::TurnStarted(TurnStarted::default()),
        ));
        log.push(ev("t2", started("c1")));
        log.push(ev("t2", finished("c1")));
        log.push(ev("t2", started("c2")));
        let open = open_turn(&log).unwrap();
        assert_eq!(open.turn_id, "t2");
        assert_eq!(open.open_calls.len(), 1);
        assert_eq!(open.open_calls[0].0, "c2");
        assert_eq!(open.last_event_ms, 5);
    }

    #[test]
    fn every_call_of_the_last_assistant_message_is_answered_once() {
        let history: Vec<HistoryItem> = [
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "y", "arguments": "{}"}},
                {"id": "c3", "type": "function", "function": {"name": "z", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{}"}),
        ]
        .into_iter()
        .map(HistoryItem::from_value)
        .collect();
        let answers = unanswered_tool_messages(&history);
        let ids: Vec<&str> = answers
            .iter()
            .map(|m| match m {
                HistoryItem::Tool(t) => t.tool_call_id.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, ["c2", "c3"]);
        assert!(answers[0].content().unwrap().contains(INTERRUPTED));
        assert!(unanswered_tool_messages(&history[..1]).is_empty());
    }
}
