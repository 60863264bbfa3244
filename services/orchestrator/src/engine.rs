//! The turn loop: the active agent's prompt and history go to the model with
//! the tool schemas; text streams to the client; tool calls run through the
//! tool-runner (or, for `call_agent`, as a sub-turn of another agent); results
//! go back as `tool` messages until the model answers without tool calls.

use crate::agents::{AgentDirectory, AgentProfile};
use crate::config::Config;
use crate::hub::SessionState;
use crate::llm::{LlmBackend, LlmDelta, LlmError, LlmRequest, ToolCall, ToolDef};
use crate::runner_client::{EventTag, Runner};
use crate::trajectory::Trajectories;
use omicos_proto::{
    AgentSwitch, Decision, ErrorEvent, ExecuteStart, ListToolsRequest, PermissionMode, TextDelta,
    ToolCallFinished, ToolCallStarted, ToolStatus, TurnDoneReason, Usage, chat_event,
    model_envelope,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Shared by every turn of this replica.
pub struct Engine {
    /// Settings.
    pub config: Config,
    /// The tool-runner.
    pub runner: Runner,
    /// Backends by name.
    pub backends: HashMap<String, Arc<dyn LlmBackend>>,
    /// The default backend name.
    pub default_backend: String,
    /// Agents.
    pub agents: Arc<dyn AgentDirectory>,
    /// Trajectory files.
    pub trajectories: Trajectories,
}

/// How a turn (or sub-turn) ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The model answered without tool calls.
    Completed,
    /// The client cancelled.
    Cancelled,
    /// A model error ended it.
    Error,
    /// The iteration limit was reached.
    MaxIterations,
    /// The delegation deadline passed (sub-turns only).
    Deadline,
}

impl Outcome {
    /// The `TurnDone.reason`.
    pub fn reason(&self) -> TurnDoneReason {
        match self {
            Outcome::Completed => TurnDoneReason::Completed,
            Outcome::Cancelled => TurnDoneReason::Cancelled,
            Outcome::Error => TurnDoneReason::Error,
            Outcome::MaxIterations => TurnDoneReason::MaxIterations,
            Outcome::Deadline => TurnDoneReason::Deadline,
        }
    }
}

/// The per-turn settings taken from the ChatRequest.
#[derive(Clone, Debug)]
pub struct TurnSettings {
    /// Turn id.
    pub turn_id: String,
    /// Permission mode (unspecified: the runner's default).
    pub permission_mode: PermissionMode,
    /// Legacy switch.
    pub allow_shell: Option<bool>,
    /// Legacy switch.
    pub allow_file_write: Option<bool>,
    /// Model override.
    pub model: String,
    /// Backend override.
    pub provider: String,
    /// Iteration limit.
    pub max_iterations: u32,
    /// The team.
    pub team: Vec<String>,
}

/// One agent's frame of work: the root turn, or a delegated sub-turn.
pub struct Frame {
    /// The agent.
    pub agent: AgentProfile,
    /// Its context (history for the root, the instruction for a sub-turn).
    pub messages: Vec<Value>,
    /// Delegation depth (0 = root).
    pub depth: u32,
    /// Agents on the delegation chain, root first.
    pub chain: Vec<String>,
    /// Execution context id.
    pub context: String,
    /// Persist messages to the session history (root only).
    pub persist: bool,
    /// Latest text, so a stopped sub-turn can return what it has.
    pub last_text: Arc<Mutex<String>>,
}

impl Engine {
    fn backend(&self, name: &str) -> Result<Arc<dyn LlmBackend>, LlmError> {
        let name = if name.is_empty() {
            &self.default_backend
        } else {
            name
        };
        self.backends.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<_> = self.backends.keys().cloned().collect();
            known.sort();
            LlmError::Config(format!(
                "provider `{name}` is not configured (configured: {})",
                known.join(", ")
            ))
        })
    }

    async fn tools_for(
        &self,
        agent: &AgentProfile,
        s: &TurnSettings,
    ) -> Result<Vec<ToolDef>, String> {
        let specs = self
            .runner
            .list_tools(ListToolsRequest {
                toolsets: agent
                    .toolsets
                    .iter()
                    .filter(|t| *t != "team")
                    .cloned()
                    .collect(),
                permission_mode: s.permission_mode as i32,
                allow_shell: s.allow_shell,
                allow_file_write: s.allow_file_write,
            })
            .await
            .map_err(|e| format!("the tool-runner did not list tools: {}", e.message()))?;
        let mut tools: Vec<ToolDef> = specs
            .into_iter()
            .map(|t| ToolDef {
                parameters: serde_json::from_str(&t.input_schema_json)
                    .unwrap_or_else(|_| json!({"type": "object"})),
                name: t.name,
                description: t.description,
            })
            .collect();
        if agent.toolsets.iter().any(|t| t == "team") {
            tools.extend(team_tools());
        }
        Ok(tools)
    }

    /// Runs one frame until the model stops calling tools.
    pub async fn run_frame(
        self: &Arc<Self>,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        cancel: &CancellationToken,
    ) -> Outcome {
        let tag = EventTag {
            turn_id: s.turn_id.clone(),
            context: frame.context.clone(),
            agent_id: frame.agent.id.clone(),
        };
        let backend = match self.backend(&s.provider) {
            Ok(b) => b,
            Err(e) => {
                emit_error(session, &tag, e.kind(), &e.to_string()).await;
                return Outcome::Error;
            }
        };
        for _iteration in 0..s.max_iterations {
            if cancel.is_cancelled() {
                return Outcome::Cancelled;
            }
            let tools = match self.tools_for(&frame.agent, s).await {
                Ok(t) => t,
                Err(e) => {
                    emit_error(session, &tag, "tool_runner_unavailable", &e).await;
                    return Outcome::Error;
                }
            };
            let req = LlmRequest {
                system: frame.agent.system_prompt.clone(),
                messages: frame.messages.clone(),
                tools,
                model: s.model.clone(),
                agent_id: frame.agent.id.clone(),
            };
            let (dtx, mut drx) = mpsc::channel::<LlmDelta>(256);
            let forward = {
                let session = session.clone();
                let tag = tag.clone();
                tokio::spawn(async move {
                    while let Some(LlmDelta::Text(t)) = drx.recv().await {
                        session
                            .emit(tag.event(chat_event::Kind::TextDelta(TextDelta { text: t })))
                            .await;
                    }
                })
            };
            let started = Instant::now();
            let answer = backend.complete(&req, dtx, cancel).await;
            let _ = forward.await;
            let turn = match answer {
                Ok(t) => t,
                Err(LlmError::Cancelled) => return Outcome::Cancelled,
                Err(e) => {
                    emit_error(session, &tag, e.kind(), &e.to_string()).await;
                    return Outcome::Error;
                }
            };
            session
                .emit(tag.event(chat_event::Kind::Usage(Usage {
                    input_tokens: turn.input_tokens,
                    output_tokens: turn.output_tokens,
                    model: turn.model.clone(),
                })))
                .await;
            *frame.last_text.lock().expect("last text") = turn.text.clone();
            let mut assistant = json!({"role": "assistant", "content": turn.text});
            if !turn.tool_calls.is_empty() {
                assistant["tool_calls"] = Value::Array(
                    turn.tool_calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect(),
                );
            }
            self.push(session, frame, assistant).await;
            self.trajectories
                .append(
                    &session.id,
                    json!({"type": "model_turn", "turn_id": s.turn_id, "context": frame.context, "agent": frame.agent.id,
                        "model": turn.model, "text": turn.text, "tool_calls": turn.tool_calls, "elapsed_ms": started.elapsed().as_millis() as u64,
                        "input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens}),
                )
                .await;
            if turn.tool_calls.is_empty() {
                return Outcome::Completed;
            }
            let mut calls = turn.tool_calls.into_iter();
            while let Some(call) = calls.next() {
                if cancel.is_cancelled() {
                    // Every tool call is answered exactly once, even when cancelled.
                    self.answer(
                        session,
                        frame,
                        &tag,
                        &call,
                        ToolStatus::Error,
                        "cancelled by the user before it ran",
                        "",
                        0,
                    )
                    .await;
                    for rest in calls.by_ref() {
                        self.answer(
                            session,
                            frame,
                            &tag,
                            &rest,
                            ToolStatus::Error,
                            "cancelled by the user before it ran",
                            "",
                            0,
                        )
                        .await;
                    }
                    return Outcome::Cancelled;
                }
                session
                    .emit(
                        tag.event(chat_event::Kind::ToolCallStarted(ToolCallStarted {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        })),
                    )
                    .await;
                let started = Instant::now();
                let (status, result, spool) = match call.name.as_str() {
                    "call_agent" => {
                        let (st, r) =
                            Box::pin(self.delegate(session, s, frame, &call, cancel)).await;
                        (st, r, String::new())
                    }
                    "list_agents" => (ToolStatus::Done, self.list_team(s), String::new()),
                    _ => {
                        let r = self.run_tool(session, s, frame, &tag, &call, cancel).await;
                        (r.status(), r.result, r.spool_path)
                    }
                };
                let elapsed = started.elapsed().as_millis() as u64;
                self.answer(
                    session, frame, &tag, &call, status, &result, &spool, elapsed,
                )
                .await;
            }
        }
        Outcome::MaxIterations
    }

    #[allow(clippy::too_many_arguments)]
    async fn answer(
        &self,
        session: &Arc<SessionState>,
        frame: &mut Frame,
        tag: &EventTag,
        call: &ToolCall,
        status: ToolStatus,
        result: &str,
        spool: &str,
        elapsed_ms: u64,
    ) {
        session
            .emit(
                tag.event(chat_event::Kind::ToolCallFinished(ToolCallFinished {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    status: status as i32,
                    result: result.into(),
                    spool_path: spool.into(),
                    elapsed_ms,
                })),
            )
            .await;
        let content = model_envelope(status, result);
        self.push(
            session,
            frame,
            json!({"role": "tool", "tool_call_id": call.id, "content": content}),
        )
        .await;
    }

    async fn push(&self, session: &Arc<SessionState>, frame: &mut Frame, msg: Value) {
        if frame.persist
            && let Err(e) = session
                .store()
                .append_messages(&session.id, std::slice::from_ref(&msg))
                .await
        {
            tracing::error!(session = %session.id, error = %e, "message not persisted");
        }
        frame.messages.push(msg);
    }

    async fn run_tool(
        &self,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &Frame,
        tag: &EventTag,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> omicos_proto::ToolResult {
        let start = ExecuteStart {
            call_id: call.id.clone(),
            tool_name: call.name.clone(),
            arguments: call.arguments.clone(),
            session_id: session.id.clone(),
            agent_id: frame.agent.id.clone(),
            permission_mode: s.permission_mode as i32,
            allow_shell: s.allow_shell,
            allow_file_write: s.allow_file_write,
            toolsets: frame
                .agent
                .toolsets
                .iter()
                .filter(|t| *t != "team")
                .cloned()
                .collect(),
            session_allowed_tools: session.allowed_tools(),
            transcript_path: self.trajectories.path(&session.id).display().to_string(),
            execution_context_id: frame.context.clone(),
        };
        let r = self.runner.execute(start, session, tag, cancel).await;
        if r.approval == Decision::AllowSession as i32 {
            session.allow_for_session(if r.tool_name.is_empty() {
                &call.name
            } else {
                &r.tool_name
            });
        }
        let record = serde_json::from_str::<Value>(&r.record_json).unwrap_or_else(|_| {
            json!({"id": call.id, "name": call.name, "arguments": call.arguments, "status": r.status().as_str(), "result": r.result})
        });
        self.trajectories
            .append(&session.id, json!({"type": "tool_call", "turn_id": s.turn_id, "context": frame.context, "record": record}))
            .await;
        r
    }

    fn list_team(&self, s: &TurnSettings) -> String {
        let team: Vec<Value> = s
            .team
            .iter()
            .filter_map(|id| self.agents.profile_in_team(&s.team, id).ok())
            .map(|a| json!({"id": a.id, "name": a.name, "description": a.description}))
            .collect();
        Value::Array(team).to_string()
    }

    async fn delegate(
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
            Err(e) => return err(e),
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
            messages: vec![json!({"role": "user", "content": instruction})],
            depth,
            chain,
            context,
            persist: false,
            last_text: Arc::new(Mutex::new(String::new())),
        };
        let last = frame.last_text.clone();
        let deadline = Duration::from_secs(self.config.delegation.deadline_secs.max(1));
        let sub_cancel = cancel.child_token();
        let outcome = match tokio::time::timeout(
            deadline,
            self.run_frame(session, s, &mut frame, &sub_cancel),
        )
        .await
        {
            Ok(o) => o,
            Err(_) => {
                sub_cancel.cancel();
                Outcome::Deadline
            }
        };
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
            Outcome::Deadline => err(format!(
                "{name} passed the delegation deadline ({}s); what it had: {text}",
                deadline.as_secs()
            )),
        }
    }
}

/// Emits an error event.
pub async fn emit_error(session: &SessionState, tag: &EventTag, kind: &str, message: &str) {
    session
        .emit(tag.event(chat_event::Kind::Error(ErrorEvent {
            kind: kind.into(),
            message: message.into(),
        })))
        .await;
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
