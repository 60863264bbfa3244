//! The team tools the orchestrator serves itself: `call_agent` runs a
//! sub-turn of another agent (context rebuilt, permissions not inherited),
//! `list_agents` lists the team.

use super::{Engine, Frame, Outcome, TurnSettings};
use crate::hub::SessionState;
use crate::llm::{ToolCall, ToolDef};
use crate::runner_client::EventTag;
use omicos_proto::{AgentSwitch, ToolStatus, chat_event};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

impl Engine {
    pub(super) fn list_team(&self, s: &TurnSettings) -> String {
        let team: Vec<Value> = s
            .team
            .iter()
            .filter_map(|id| self.agents.profile_in_team(&s.team, id).ok())
            .map(|a| json!({"id": a.id, "name": a.name, "description": a.description}))
            .collect();
        Value::Array(team).to_string()
    }

    pub(super) async fn delegate(
        self: &Arc<Self>,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        caller: &Frame,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> (ToolStatus, String) {
        let err = |m: String| (ToolStatus::Error, m);
        let args: Value = match serde_json::from_str(&call.arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return err(format!(
                    "call_agent arguments are not a JSON object: {}",
                    call.arguments
                ));
            }
        };
        let (Some(name), Some(instruction)) =
            (args["agent_name"].as_str(), args["instruction"].as_str())
        else {
            return err(
                "call_agent needs {\"agent_name\": string, \"instruction\": string}".into(),
            );
        };
        if !s.team.iter().any(|m| m == name) {
            return err(format!(
                "agent `{name}` is not in this team ({}); use list_agents",
                s.team.join(", ")
            ));
        }
        if name == caller.agent.id {
            return err(format!("agent `{name}` cannot delegate to itself"));
        }
        if caller.chain.iter().any(|a| a == name) {
            return err(format!(
                "delegation cycle refused: {} -> {name}",
                caller
                    .chain
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ));
        }
        let max = self.config.delegation.max_depth;
        if caller.depth + 1 > max {
            return err(format!(
                "delegation depth limit ({max}) reached; do the work yourself or answer"
            ));
        }
        let callee = match self.agents.profile_in_team(&s.team, name) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        let depth = caller.depth + 1;
        let context = format!("{}/{}", caller.context, call.id);
        let root_tag = EventTag {
            turn_id: s.turn_id.clone(),
            context: caller.context.clone(),
            agent_id: caller.agent.id.clone(),
        };
        session
            .emit(root_tag.event(chat_event::Kind::AgentSwitch(AgentSwitch {
                from_agent: caller.agent.id.clone(),
                to_agent: callee.id.clone(),
                reason: "delegate".into(),
                depth,
            })))
            .await;
        let mut chain = caller.chain.clone();
        chain.push(caller.agent.id.clone());
        let mut frame = Frame {
            agent: callee.clone(),
            messages: vec![omicos_history::HistoryItem::user(instruction)],
            depth,
            chain,
            context,
            persist: false,
            last_text: Arc::new(Mutex::new(String::new())),
            meters: caller.meters.clone(),
            used: Default::default(),
            // Steered messages go to the root frame.
            steer: None,
        };
        self.subagent_start(session, &mut frame).await;
        let last = frame.last_text.clone();
        let deadline = self.config.delegation.deadline;
        let sub_cancel = cancel.child_token();
        let run = async {
            let mut continuations = 0;
            loop {
                let o = self.run_frame(session, s, &mut frame, &sub_cancel).await;
                if o != Outcome::Completed
                    || !self
                        .stop_hook_continues(session, s, &mut frame, continuations)
                        .await
                {
                    break o;
                }
                continuations += 1;
            }
        };
        let span = crate::genai::agent_span(&callee.id, &session.id);
        let outcome = match tokio::time::timeout(deadline, run.instrument(span.clone())).await {
            Ok(o) => o,
            Err(_) => {
                sub_cancel.cancel();
                Outcome::Deadline
            }
        };
        if outcome.failed() {
            crate::genai::agent_failed(&span, outcome.reason().as_str());
        }
        drop(span);
        session
            .emit(root_tag.event(chat_event::Kind::AgentSwitch(AgentSwitch {
                from_agent: callee.id.clone(),
                to_agent: caller.agent.id.clone(),
                reason: "return".into(),
                depth: caller.depth,
            })))
            .await;
        let text = last.lock().expect("last text").clone();
        match outcome {
            Outcome::Completed => (ToolStatus::Done, text),
            Outcome::Cancelled => err(format!(
                "the delegation to {name} was cancelled; what it had: {text}"
            )),
            Outcome::Error => err(format!("{name} stopped on an error; what it had: {text}")),
            Outcome::MaxIterations => err(format!(
                "{name} ran out of tool iterations before finishing; what it had: {text}"
            )),
            Outcome::Budget(why) => err(format!("{name} stopped: {why}; what it had: {text}")),
            // Only a root turn's prompt goes through UserPromptSubmit.
            Outcome::Blocked => err(format!("{name} was blocked; what it had: {text}")),
            Outcome::Deadline => err(format!(
                "{name} passed the delegation deadline ({}s); what it had: {text}",
                deadline.as_secs()
            )),
        }
    }
}

/// The team tools the orchestrator serves itself.
pub fn team_tools() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: "call_agent".into(),
            description: "Delegate a task to another agent of the team. It works with its own tools and a fresh context \
                          holding only your instruction, and its final answer comes back as this tool's result."
                .into(),
            parameters: json!({"type": "object", "properties": {
                "agent_name": {"type": "string", "description": "id of the agent (see list_agents)"},
                "instruction": {"type": "string", "description": "everything the agent needs to know to do the task"}},
                "required": ["agent_name", "instruction"]}),
        },
        ToolDef {
            name: "list_agents".into(),
            description: "List the agents of this team: id, name and description.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ]
}
