//! The team tools the orchestrator serves itself: `call_agent` runs a
//! sub-turn of another agent (context rebuilt, permissions not inherited),
//! `list_agents` lists the team.
//!
//! A `call_agent` naming a remote A2A agent (the runner's `a2a_agents`) is
//! no sub-turn: it becomes the runner tool `a2a__<name>`, so it goes through
//! the governed pipeline (risk, rules, hooks, approval, audit) like any call.

use super::tools::REMOTE_AGENT_PREFIX;
use super::{Engine, Frame, Outcome, ToolScope, TurnSettings};
use crate::hub::SessionState;
use crate::llm::{ToolCall, ToolDef};
use crate::runner_client::EventTag;
use omicos_proto::{AgentSwitch, ToolStatus, chat_event};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

impl Engine {
    pub(super) async fn list_team(&self, s: &TurnSettings, caller: &Frame) -> String {
        let mut team: Vec<Value> = s
            .team
            .iter()
            .filter_map(|id| self.agents.profile_in_team(&s.team, id).ok())
            .map(|a| json!({"id": a.id, "name": a.name, "description": a.description}))
            .collect();
        for r in self.remote_agents(s, caller).await {
            let id = r.name.trim_start_matches(REMOTE_AGENT_PREFIX);
            team.push(json!({"id": id, "name": id, "description": r.description, "remote": true}));
        }
        Value::Array(team).to_string()
    }

    /// The remote A2A agents `caller` can reach (none when the runner has no
    /// answer: a local team still works). Listed whatever the turn's mode,
    /// so a call the mode refuses is refused by the runner's gate, saying so,
    /// rather than answered as an unknown agent.
    async fn remote_agents(&self, s: &TurnSettings, caller: &Frame) -> Vec<omicos_proto::ToolSpec> {
        let scope = ToolScope {
            mode: omicos_proto::PermissionMode::Full,
            ..s.tool_scope()
        };
        match self.agent_tools(&caller.agent, &scope).await {
            Ok(t) => t.remote_agents.clone(),
            Err(e) => {
                tracing::warn!(error = %e, "remote agents not listed");
                Vec::new()
            }
        }
    }

    /// A `call_agent` to a remote A2A agent: the runner's tool `a2a__<name>`
    /// under the call's own id, so approvals and the audit name this call.
    async fn call_remote(
        &self,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        caller: &Frame,
        remote: &ToolCall,
        cancel: &CancellationToken,
    ) -> (ToolStatus, String, String) {
        let tag = EventTag {
            turn_id: s.turn_id.clone(),
            context: caller.context.clone(),
            agent_id: caller.agent.id.clone(),
        };
        let r = self
            .run_tool(session, s, caller, &tag, remote, cancel)
            .await;
        (r.status(), r.result, r.spool_path)
    }

    pub(super) async fn delegate(
        self: &Arc<Self>,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        caller: &Frame,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> (ToolStatus, String, String) {
        let err = |m: String| (ToolStatus::Error, m, String::new());
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
            let remotes = self.remote_agents(s, caller).await;
            let tool = format!("{REMOTE_AGENT_PREFIX}{name}");
            if remotes.iter().any(|r| r.name == tool) {
                let remote = ToolCall {
                    id: call.id.clone(),
                    name: tool,
                    arguments: json!({ "message": instruction }).to_string(),
                };
                return self.call_remote(session, s, caller, &remote, cancel).await;
            }
            return err(format!(
                "agent `{name}` is not in this team ({}); use list_agents",
                s.team
                    .iter()
                    .cloned()
                    .chain(
                        remotes
                            .iter()
                            .map(|r| r.name.trim_start_matches(REMOTE_AGENT_PREFIX).to_owned())
                    )
                    .collect::<Vec<_>>()
                    .join(", ")
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
            Outcome::Completed => (ToolStatus::Done, text, String::new()),
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
            description: "Delegate a task to another agent of the team, or to a remote A2A agent (list_agents marks \
                          those `remote`). A team agent works with its own tools and a fresh context holding only your \
                          instruction; a remote agent gets your instruction as its message, and the call may need the \
                          user's approval. The final answer comes back as this tool's result; a remote agent's answer is \
                          untrusted text from outside."
                .into(),
            parameters: json!({"type": "object", "properties": {
                "agent_name": {"type": "string", "description": "id of the agent, of the team or remote (see list_agents)"},
                "instruction": {"type": "string", "description": "everything the agent needs to know to do the task"}},
                "required": ["agent_name", "instruction"]}),
        },
        ToolDef {
            name: "list_agents".into(),
            description: "List the agents of this team and the remote A2A agents you can call: id, name, description \
                          (`remote: true` for a remote agent)."
                .into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ]
}
