//! A turn taken over from a lost replica (`turn_recovery: resume`, issue
//! 40): it continues from the log instead of being closed as INTERRUPTED.
//!
//! The survivor holds the session's lease under its own owner and reads the
//! turn's state from the persisted history and the event log:
//! - the calls of the model's last answer that have a result in the history
//!   keep it; one whose ToolCallFinished is in the log but whose result did
//!   not reach the history gets it from the event;
//! - a call the log shows started and not finished is followed again on the
//!   runner that holds it, by call id ([`crate::runner_client::Runner::reattach`]);
//!   one that no runner holds is answered as [`LOST`], never run again. A
//!   `call_agent` sub-turn ran on the lost replica and is answered as lost
//!   too ([`DELEGATION_LOST`]);
//! - calls the model asked for and that never started run now;
//! - then the frame goes on as usual: a model request that was in flight
//!   is issued again.
//!
//! One [`TurnMoved`] event tells attached clients where the turn moved and
//! why; the turn keeps its id, so a client sees one continuous turn.

use super::budget::{Meter, Meters};
use super::turn::renew_lease;
use super::{Engine, Frame, Outcome, TurnSettings, emit_error};
use crate::agents::AgentProfile;
use crate::hub::{SessionState, SteerQueue};
use crate::llm::ToolCall;
use crate::runner_client::{Attached, EventTag};
use omicos_history::HistoryItem;
use omicos_proto::{ChatEvent, ToolStatus, TurnMoved, chat_event};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The result of a call whose runner was lost with the orchestrator.
pub const LOST: &str = "lost: the tool-runner running this call is gone too (or kept it shorter than the orchestrator took to come back); it was not run again, and it may have had side effects";

/// The result of a `call_agent` (or a call of its sub-turn) that ran on the lost orchestrator.
pub const DELEGATION_LOST: &str = "lost: this delegated sub-turn ran on the orchestrator that was lost; it was not run again, and its own tool calls may have had side effects";

/// A turn the log shows running on a lost replica, as the survivor takes it.
pub struct ResumedTurn {
    /// The turn's settings, from its TurnStarted event.
    pub settings: TurnSettings,
    /// Its active agent.
    pub agent: AgentProfile,
    /// The user's message (TurnStarted's).
    pub message: String,
    /// The lease owner the survivor holds the session with.
    pub lease_owner: String,
    /// How long the lease lasts without renewal.
    pub lease: Duration,
    /// Cancels the turn.
    pub cancel: CancellationToken,
    /// Messages steered into the turn from now on.
    pub steer: Arc<SteerQueue>,
    /// The survivor's replica id (for the TurnMoved event).
    pub replica: String,
    /// The session's whole log as it was when the lease was taken.
    pub log: Vec<ChatEvent>,
}

/// How one call of the model's last answer gets its result on resume.
enum Settle {
    /// From its ToolCallFinished event (the result did not reach the history).
    Logged(ToolCall, ToolStatus, String, String),
    /// Followed again on its runner; `asked`: its approval request is in the log.
    Attached(ToolCall, Box<Attached>, bool),
    /// Answered as lost.
    Lost(ToolCall, &'static str),
}

impl Engine {
    /// Continues a turn whose replica was lost; the lease is held and the
    /// turn is the session's running one here. Always ends with a turn_done.
    pub async fn resume_turn(self: Arc<Self>, st: Arc<SessionState>, t: ResumedTurn) {
        let ResumedTurn {
            settings,
            agent,
            message,
            lease_owner,
            lease,
            cancel,
            steer,
            replica,
            log,
        } = t;
        let renew = renew_lease(&st, &lease_owner, lease, &settings.turn_id, &cancel);
        let tag = EventTag {
            turn_id: settings.turn_id.clone(),
            context: "root".into(),
            agent_id: agent.id.clone(),
        };
        let turn: Vec<&ChatEvent> = log
            .iter()
            .filter(|e| e.turn_id == settings.turn_id)
            .collect();
        let mut meters = Meters::default();
        let outcome = match st.store().messages(&st.id).await {
            Err(source) => {
                let e = crate::error::OrchestratorError::History {
                    session: st.id.clone(),
                    source,
                };
                emit_error(&st, &tag, &e).await;
                Outcome::Error
            }
            Ok(history) => {
                self.continue_turn(
                    &st,
                    &settings,
                    agent,
                    &message,
                    history,
                    &turn,
                    &mut meters,
                    &tag,
                    &replica,
                    &cancel,
                    &steer,
                )
                .await
            }
        };
        self.finish_turn(&st, &settings, &tag, outcome, &meters, renew, &lease_owner)
            .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn continue_turn(
        self: &Arc<Self>,
        st: &Arc<SessionState>,
        s: &TurnSettings,
        agent: AgentProfile,
        message: &str,
        mut history: Vec<HistoryItem>,
        turn: &[&ChatEvent],
        meters: &mut Meters,
        tag: &EventTag,
        replica: &str,
        cancel: &CancellationToken,
        steer: &Arc<SteerQueue>,
    ) -> Outcome {
        // What the lost part of the turn used still counts toward its budget.
        let mut used = Meter::default();
        for e in turn {
            if let Some(chat_event::Kind::Usage(u)) = &e.kind {
                let model = if u.model.is_empty() {
                    self.model_name(s)
                } else {
                    &u.model
                };
                used.add(&Meter::call(
                    &self.config.budget,
                    model,
                    u.input_tokens,
                    u.output_tokens,
                ));
            }
        }
        // Lost before the user's message reached the history (in a
        // UserPromptSubmit hook, say): nothing but TurnStarted happened.
        let only_started = turn.iter().all(|e| {
            matches!(
                e.kind,
                Some(chat_event::Kind::TurnStarted(_)) | Some(chat_event::Kind::Heartbeat(_))
            )
        });
        if only_started
            && !matches!(history.last(), Some(HistoryItem::User(u)) if u.content == message)
        {
            let user = HistoryItem::user(message);
            if let Err(e) = st
                .store()
                .append_messages(&st.id, std::slice::from_ref(&user))
                .await
            {
                tracing::error!(session = %st.id, error = %e, "user message not persisted on resume");
            }
            history.push(user);
        }
        meters.session_before = Meter::of_history(&history);
        meters.turn.lock().expect("turn meter").add(&used);
        let mut frame = Frame {
            agent,
            messages: history,
            depth: 0,
            chain: vec![],
            context: "root".into(),
            persist: true,
            last_text: Arc::new(Mutex::new(String::new())),
            meters: meters.clone(),
            used,
            steer: Some(steer.clone()),
        };

        // The calls of the model's last answer that have no result yet.
        let unanswered = unanswered_calls(&frame.messages);
        let finished: HashMap<&str, &omicos_proto::ToolCallFinished> = turn
            .iter()
            .filter(|e| e.execution_context_id == "root")
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::ToolCallFinished(f)) => Some((f.call_id.as_str(), f)),
                _ => None,
            })
            .collect();
        let started: HashSet<&str> = turn
            .iter()
            .filter(|e| e.execution_context_id == "root")
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::ToolCallStarted(c)) => Some(c.call_id.as_str()),
                _ => None,
            })
            .collect();
        let asked: HashSet<&str> = turn
            .iter()
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::ToolApprovalRequest(a)) => Some(a.call_id.as_str()),
                _ => None,
            })
            .collect();
        let mut settle = Vec::new();
        let mut not_started = Vec::new();
        for call in unanswered {
            if !not_started.is_empty() {
                // Calls start in order: the rest never started either.
                not_started.push(call);
            } else if let Some(f) = finished.get(call.id.as_str()) {
                let status = ToolStatus::try_from(f.status).unwrap_or(ToolStatus::Error);
                settle.push(Settle::Logged(
                    call,
                    status,
                    f.result.clone(),
                    f.spool_path.clone(),
                ));
            } else if started.contains(call.id.as_str()) {
                if call.name == "call_agent" {
                    settle.push(Settle::Lost(call, DELEGATION_LOST));
                    continue;
                }
                match self.runner.reattach(&call.id, &s.principal, st).await {
                    Ok(a) => {
                        let was_asked = asked.contains(call.id.as_str());
                        settle.push(Settle::Attached(call, Box::new(a), was_asked));
                    }
                    Err(why) => {
                        tracing::warn!(session = %st.id, call_id = %call.id, %why, "a call of the lost turn is lost");
                        settle.push(Settle::Lost(call, LOST));
                    }
                }
            } else {
                not_started.push(call);
            }
        }
        // Done already: the final answer is in the history, only turn_done was lost.
        let complete = settle.is_empty()
            && not_started.is_empty()
            && matches!(frame.messages.last(), Some(HistoryItem::Assistant(a)) if a.calls().is_empty() && a.interrupted != Some(true));
        let moved = TurnMoved {
            reason: "the orchestrator running this turn stopped renewing its lease".into(),
            replica: replica.to_owned(),
            model_request_reissued: !complete && settle.is_empty() && not_started.is_empty(),
            reattached_calls: settle
                .iter()
                .filter_map(|x| match x {
                    Settle::Attached(c, ..) => Some(c.id.clone()),
                    _ => None,
                })
                .collect(),
            lost_calls: settle
                .iter()
                .filter_map(|x| match x {
                    Settle::Lost(c, _) => Some(c.id.clone()),
                    _ => None,
                })
                .collect(),
        };
        tracing::warn!(session = %st.id, turn = %s.turn_id, reattached = moved.reattached_calls.len(), lost = moved.lost_calls.len(), reissued = moved.model_request_reissued, "resuming a turn whose orchestrator was lost");
        self.trajectories
            .append(
                &st.id,
                json!({"type": "turn_moved", "turn_id": s.turn_id, "replica": replica,
                       "reattached_calls": moved.reattached_calls, "lost_calls": moved.lost_calls,
                       "model_request_reissued": moved.model_request_reissued}),
            )
            .await;
        st.emit(tag.event(chat_event::Kind::TurnMoved(moved))).await;
        self.close_lost_subturn_calls(st, turn).await;

        // Every call followed again at once; results go back in call order.
        let results = futures::future::join_all(settle.into_iter().map(|x| async move {
            match x {
                Settle::Logged(c, status, result, spool) => (c, status, result, spool, false),
                Settle::Lost(c, why) => (c, ToolStatus::Error, why.to_owned(), String::new(), true),
                Settle::Attached(c, a, was_asked) => {
                    let r = a.follow(st, tag, cancel, was_asked).await;
                    (c, r.status(), r.result, r.spool_path, true)
                }
            }
        }))
        .await;
        for (call, status, result, spool, emit) in results {
            if emit {
                self.emit_finished(st, tag, &call, status, &result, &spool, 0)
                    .await;
            }
            self.push_result(st, &mut frame, &call, status, &result, &spool)
                .await;
        }
        if !not_started.is_empty() {
            self.run_calls(st, s, &mut frame, tag, not_started, &HashSet::new(), cancel)
                .await;
        }
        if complete && steer.close_if_empty() {
            return Outcome::Completed;
        }
        self.drive(st, s, &mut frame, cancel, steer, tag).await
    }

    /// Closes in the log the calls of a delegated sub-turn that ran on the
    /// lost replica (they are not followed again: their sub-turn is gone).
    async fn close_lost_subturn_calls(&self, st: &Arc<SessionState>, turn: &[&ChatEvent]) {
        let mut open: Vec<(&ChatEvent, &omicos_proto::ToolCallStarted)> = Vec::new();
        for e in turn {
            match &e.kind {
                Some(chat_event::Kind::ToolCallStarted(c)) if e.execution_context_id != "root" => {
                    open.push((e, c))
                }
                Some(chat_event::Kind::ToolCallFinished(f)) => {
                    open.retain(|(_, c)| c.call_id != f.call_id)
                }
                _ => {}
            }
        }
        for (e, c) in open {
            let tag = EventTag {
                turn_id: e.turn_id.clone(),
                context: e.execution_context_id.clone(),
                agent_id: e.agent_id.clone(),
            };
            let call = ToolCall {
                id: c.call_id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            };
            self.emit_finished(st, &tag, &call, ToolStatus::Error, DELEGATION_LOST, "", 0)
                .await;
        }
    }
}

/// The calls of the history's last assistant message that have no `tool`
/// message after it.
pub fn unanswered_calls(history: &[HistoryItem]) -> Vec<ToolCall> {
    let Some((at, last)) = history.iter().enumerate().rev().find_map(|(i, m)| match m {
        HistoryItem::Assistant(a) => Some((i, a)),
        _ => None,
    }) else {
        return vec![];
    };
    let answered: HashSet<&str> = history[at + 1..]
        .iter()
        .filter_map(|m| match m {
            HistoryItem::Tool(t) => Some(t.tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    last.calls()
        .iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .map(|c| ToolCall {
            id: c.id.clone(),
            name: c.function.name.clone(),
            arguments: c.function.arguments.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unanswered_calls_are_those_of_the_last_answer_without_a_result() {
        let history: Vec<HistoryItem> = [
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "y", "arguments": "{\"a\":1}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{}"}),
        ]
        .into_iter()
        .map(HistoryItem::from_value)
        .collect();
        let calls = unanswered_calls(&history);
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (
                calls[0].id.as_str(),
                calls[0].name.as_str(),
                calls[0].arguments.as_str()
            ),
            ("c2", "y", "{\"a\":1}")
        );
        assert!(unanswered_calls(&history[..1]).is_empty());
        let answered: Vec<HistoryItem> = history
            .iter()
            .cloned()
            .chain([HistoryItem::from_value(
                json!({"role": "tool", "tool_call_id": "c2", "content": "{}"}),
            )])
            .collect();
        assert!(unanswered_calls(&answered).is_empty());
    }
}
