//! One frame of work: the model is called with the frame's context and
//! tools, and every tool call it asks for is answered exactly once.

use super::{Engine, Frame, Outcome, TurnSettings, emit_error, runner_toolsets};
use crate::hub::SessionState;
use crate::llm::{LlmDelta, LlmError, LlmRequest, ToolCall};
use crate::runner_client::EventTag;
use omicos_proto::{
    Decision, ExecuteStart, TextDelta, ToolCallFinished, ToolCallStarted, ToolStatus, Usage,
    chat_event, model_envelope,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

impl Engine {
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
                emit_error(session, &tag, &e.into()).await;
                return Outcome::Error;
            }
        };
        for _iteration in 0..s.max_iterations {
            if cancel.is_cancelled() {
                return Outcome::Cancelled;
            }
            let tools = match self
                .agent_tools(
                    &frame.agent.toolsets,
                    s.permission_mode,
                    s.allow_shell,
                    s.allow_file_write,
                )
                .await
            {
                Ok(t) => t.defs,
                Err(e) => {
                    emit_error(session, &tag, &e).await;
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
                    emit_error(session, &tag, &e.into()).await;
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
                        s.not_run_reason(),
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
                            s.not_run_reason(),
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
            toolsets: runner_toolsets(&frame.agent.toolsets),
            session_allowed_tools: session.allowed_tools(),
            transcript_path: self.trajectories.path(&session.id).display().to_string(),
            execution_context_id: frame.context.clone(),
        };
        let r = self.runner.execute(start, session, tag, cancel).await;
        if r.approval == Decision::AllowSession as i32 {
            session
                .allow_for_session(if r.tool_name.is_empty() {
                    &call.name
                } else {
                    &r.tool_name
                })
                .await;
        }
        let record = serde_json::from_str::<Value>(&r.record_json).unwrap_or_else(|_| {
            json!({"id": call.id, "name": call.name, "arguments": call.arguments, "status": r.status().as_str(), "result": r.result})
        });
        self.trajectories
            .append(&session.id, json!({"type": "tool_call", "turn_id": s.turn_id, "context": frame.context, "record": record}))
            .await;
        r
    }
}
