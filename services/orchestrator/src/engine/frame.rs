//! One frame of work: the model is called with the frame's context and
//! tools, and every tool call it asks for is answered exactly once.

use super::budget::Meter;
use super::compact::Trigger;
use super::context;
use super::{Engine, Frame, Outcome, TurnSettings, emit_error, runner_toolsets};
use crate::genai;
use crate::hub::SessionState;
use crate::llm::{LlmDelta, LlmError, LlmRequest, ToolCall};
use crate::runner_client::EventTag;
use omicos_history::{AssistantMessage, HistoryItem, ToolCall as HistoryToolCall};
use omicos_proto::{
    Decision, ExecuteStart, Steer, TextDelta, ToolCallFinished, ToolCallStarted, ToolStatus, Usage,
    chat_event, model_envelope,
};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The most text deltas written as one append (a session's broadcast
/// channel holds 256 events; a subscriber that lags re-reads the store).
const DELTAS_PER_APPEND: usize = 64;

/// How a call was answered.
struct Answered {
    status: ToolStatus,
    result: String,
    spool: String,
}

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
        // The frame's tools are asked for once (the runner confirms the
        // cached list's catalog version) and kept for all its model
        // requests: a registry or catalog change reaches the next frame, and
        // the tools the model sees do not change under it mid-task.
        let (tools, parallel): (_, HashSet<String>) =
            match self.agent_tools(&frame.agent, &s.tool_scope()).await {
                Ok(t) => (
                    t.defs.clone(),
                    t.parallel_safe(&self.config.tool_calls.concurrency_safe),
                ),
                Err(e) => {
                    emit_error(session, &tag, &e).await;
                    return Outcome::Error;
                }
            };
        for _iteration in 0..s.max_iterations {
            if cancel.is_cancelled() {
                return Outcome::Cancelled;
            }
            if let Some(why) =
                frame
                    .meters
                    .exhausted(&self.config.budget, &frame.used, frame.depth > 0)
            {
                return Outcome::Budget(why);
            }
            // Messages steered in since the last request join it here,
            // after every call of the last answer was answered.
            if let Some(q) = frame.steer.clone() {
                for message in q.take() {
                    self.steered(session, s, frame, &tag, message).await;
                }
            }
            let model = self.model_name(s).to_owned();
            let system = frame.agent.system_prompt.clone();
            let fixed = context::fixed_chars(&system, &tools);
            let mut overflow_retried = false;
            let (turn, view, started, span, provider) = loop {
                let mut view = match self
                    .prepare_context(session, s, frame, &tag, &*backend, &model, fixed, cancel)
                    .await
                {
                    Ok(v) => v,
                    Err(o) => return o,
                };
                let req = LlmRequest {
                    system: system.clone(),
                    // Moved: only the view's figures are read after the request.
                    messages: std::mem::take(&mut view.messages),
                    tools: tools.clone(),
                    model: s.model.clone(),
                    agent_id: frame.agent.id.clone(),
                };
                let (dtx, mut drx) = mpsc::channel::<LlmDelta>(256);
                // Runs beside the model's stream in this task (joined, not
                // spawned): a delta reaches the session without waking
                // another task.
                let forward = async {
                    // What the client saw, kept if the stream is cancelled.
                    let mut seen = String::new();
                    let mut ready = Vec::with_capacity(DELTAS_PER_APPEND);
                    // Deltas that arrived while the last ones were being
                    // written go out as one append (each still its own
                    // event and seq): under load a session's deltas do not
                    // queue one commit behind another.
                    while drx.recv_many(&mut ready, DELTAS_PER_APPEND).await > 0 {
                        let evs = ready
                            .drain(..)
                            .map(|LlmDelta::Text(t)| {
                                seen.push_str(&t);
                                tag.event(chat_event::Kind::TextDelta(TextDelta { text: t }))
                            })
                            .collect();
                        session.emit_many(evs).await;
                    }
                    seen
                };
                let started = Instant::now();
                let provider = self.provider_name(s).to_owned();
                let span = genai::chat_span(&provider, &model, &session.id);
                let (answer, seen) = tokio::join!(
                    backend.complete(&req, dtx, cancel).instrument(span.clone()),
                    forward
                );
                let elapsed = started.elapsed();
                crate::metrics::get().llm_request(
                    &model,
                    match &answer {
                        Ok(_) => "ok",
                        Err(LlmError::Cancelled) => "cancelled",
                        Err(LlmError::ContextOverflow(_)) => "context_overflow",
                        Err(_) => "error",
                    },
                    elapsed,
                );
                let response_model = answer.as_ref().map(|t| t.model.as_str()).unwrap_or("");
                crate::metrics::get().genai_operation(
                    &provider,
                    &model,
                    response_model,
                    answer.as_ref().err().map(|e| e.kind().as_str()),
                    elapsed,
                );
                if let Err(e) = &answer {
                    genai::chat_failed(&span, e);
                } else if let Ok(t) = &answer
                    && self.config.telemetry.capture_content
                {
                    genai::chat_content(&span, &req.system, &req.messages, t);
                }
                match answer {
                    Ok(t) => break (t, view, started, span, provider),
                    Err(LlmError::Cancelled) => {
                        if !seen.is_empty() {
                            // The partial answer stays in the history as the user saw it.
                            let partial = AssistantMessage {
                                content: seen.clone(),
                                interrupted: Some(true),
                                ..Default::default()
                            };
                            self.push(session, frame, HistoryItem::Assistant(partial))
                                .await;
                            self.trajectories
                                .append(
                                    &session.id,
                                    json!({"type": "model_turn", "turn_id": s.turn_id, "context": frame.context,
                                           "agent": frame.agent.id, "model": model, "text": seen, "interrupted": true}),
                                )
                                .await;
                        }
                        return Outcome::Cancelled;
                    }
                    Err(LlmError::ContextOverflow(msg)) if !overflow_retried => {
                        // The estimate was short of the server's count: compact, retry once.
                        overflow_retried = true;
                        tracing::warn!(session = %session.id, error = %msg, "context overflow: compacting and retrying once");
                        match self
                            .compact_frame(
                                session,
                                s,
                                frame,
                                &tag,
                                &*backend,
                                &model,
                                fixed,
                                Trigger::Overflow,
                                cancel,
                            )
                            .await
                        {
                            Ok(true) => continue,
                            Ok(false) => {
                                let e = LlmError::ContextOverflow(format!(
                                    "{msg} (and nothing older is left to compact: the latest messages alone are too long for the model)"
                                ));
                                emit_error(session, &tag, &e.into()).await;
                                return Outcome::Error;
                            }
                            Err(o) => return o,
                        }
                    }
                    Err(LlmError::ContextOverflow(msg)) => {
                        let e = LlmError::ContextOverflow(format!(
                            "{msg} (still too long after compacting once)"
                        ));
                        emit_error(session, &tag, &e.into()).await;
                        return Outcome::Error;
                    }
                    Err(e) => {
                        emit_error(session, &tag, &e.into()).await;
                        return Outcome::Error;
                    }
                }
            };
            // Tokens from the backend's usage, else the estimate.
            self.calibrate(&model, view.raw_tokens, turn.input_tokens);
            let input = if turn.input_tokens > 0 {
                turn.input_tokens
            } else {
                view.tokens
            };
            let output = if turn.output_tokens > 0 {
                turn.output_tokens
            } else {
                let chars = turn.text.len()
                    + turn
                        .tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>();
                context::tokens(chars, self.config.context.chars_per_token, 1.0)
            };
            let priced = if turn.model.is_empty() {
                &model
            } else {
                &turn.model
            };
            crate::metrics::get().tokens(&model, input, output);
            crate::metrics::get().genai_tokens(&provider, &model, &turn.model, input, output);
            genai::chat_answered(&span, &turn, input, output);
            // The request's span ends here, before the answer is written.
            drop(span);
            let used = Meter::call(&self.config.budget, priced, input, output);
            frame.used.add(&used);
            frame.meters.turn.lock().expect("turn meter").add(&used);
            session
                .emit(tag.event(chat_event::Kind::Usage(Usage {
                    input_tokens: input,
                    output_tokens: output,
                    model: turn.model.clone(),
                })))
                .await;
            *frame.last_text.lock().expect("last text") = turn.text.clone();
            let assistant = AssistantMessage {
                content: turn.text.clone(),
                usage: Some(used.to_usage()),
                tool_calls: (!turn.tool_calls.is_empty()).then(|| {
                    turn.tool_calls
                        .iter()
                        .map(|c| HistoryToolCall::function(&c.id, &c.name, &c.arguments))
                        .collect()
                }),
                ..Default::default()
            };
            self.push(session, frame, HistoryItem::Assistant(assistant))
                .await;
            self.trajectories
                .append(
                    &session.id,
                    json!({"type": "model_turn", "turn_id": s.turn_id, "context": frame.context, "agent": frame.agent.id,
                        "model": turn.model, "text": turn.text, "reasoning": turn.reasoning, "tool_calls": turn.tool_calls, "elapsed_ms": started.elapsed().as_millis() as u64,
                        "input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens}),
                )
                .await;
            if turn.tool_calls.is_empty() {
                // A message steered in while the model answered is answered
                // in this turn; the queue closes only when none waits.
                if frame.steer.as_ref().is_none_or(|q| q.close_if_empty()) {
                    return Outcome::Completed;
                }
                continue;
            }
            if let Some(why) =
                frame
                    .meters
                    .exhausted(&self.config.budget, &frame.used, frame.depth > 0)
            {
                // Every call is still answered, as not run.
                for call in &turn.tool_calls {
                    let reason = format!("not run: {why}");
                    self.emit_finished(session, &tag, call, ToolStatus::Error, &reason, "", 0)
                        .await;
                    self.push_result(session, frame, call, ToolStatus::Error, &reason, "")
                        .await;
                }
                return Outcome::Budget(why);
            }
            self.run_calls(session, s, frame, &tag, turn.tool_calls, &parallel, cancel)
                .await;
        }
        Outcome::MaxIterations
    }

    /// Runs the calls of one answer. A run of consecutive calls that are safe
    /// side by side (risk Read, or declared concurrency-safe) runs at once, up
    /// to `tool_calls.parallel_limit`; every other call runs alone, in order,
    /// so a read after a write still sees the write. Results go back to the
    /// model in call order, and every call is answered exactly once: a call
    /// not started when a cancel came is answered as not run.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_calls(
        self: &Arc<Self>,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        tag: &EventTag,
        calls: Vec<ToolCall>,
        parallel: &HashSet<String>,
        cancel: &CancellationToken,
    ) {
        let limit = self.config.tool_calls.parallel_limit.max(1);
        let mut rest = calls.into_iter().peekable();
        while let Some(first) = rest.next() {
            let mut batch = vec![first];
            if parallel.contains(&batch[0].name) {
                while let Some(next) = rest.next_if(|c| parallel.contains(&c.name)) {
                    batch.push(next);
                }
            }
            let answers: Vec<Answered> = {
                let frame: &Frame = frame;
                let slots = tokio::sync::Semaphore::new(limit);
                let mut running = Vec::with_capacity(batch.len());
                for call in &batch {
                    running
                        .push(self.run_call_in_slot(&slots, session, s, frame, tag, call, cancel));
                }
                // join_all keeps call order whatever order they finish in.
                futures::future::join_all(running).await
            };
            for (call, a) in batch.iter().zip(answers) {
                self.push_result(session, frame, call, a.status, &a.result, &a.spool)
                    .await;
            }
        }
    }

    /// Runs one call once a slot of the batch's limit is free.
    #[allow(clippy::too_many_arguments)]
    async fn run_call_in_slot(
        self: &Arc<Self>,
        slots: &tokio::sync::Semaphore,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &Frame,
        tag: &EventTag,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> Answered {
        let _slot = slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        self.run_call(session, s, frame, tag, call, cancel).await
    }

    /// Runs one call (a tool, or a team tool served here) between its
    /// started and finished events; a call whose turn was already stopped
    /// does not start and is answered as not run.
    async fn run_call(
        self: &Arc<Self>,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &Frame,
        tag: &EventTag,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> Answered {
        if cancel.is_cancelled() {
            let a = Answered {
                status: ToolStatus::Error,
                result: s.not_run_reason().into(),
                spool: String::new(),
            };
            self.emit_finished(session, tag, call, a.status, &a.result, "", 0)
                .await;
            return a;
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
        let span = genai::tool_span(&call.name, &call.id);
        let run = async {
            match call.name.as_str() {
                "call_agent" => Box::pin(self.delegate(session, s, frame, call, cancel)).await,
                "list_agents" => (
                    ToolStatus::Done,
                    self.list_team(s, frame).await,
                    String::new(),
                ),
                _ => {
                    let r = self.run_tool(session, s, frame, tag, call, cancel).await;
                    (r.status(), r.result, r.spool_path)
                }
            }
        };
        let (status, result, spool) = run.instrument(span.clone()).await;
        if status != ToolStatus::Done {
            genai::tool_failed(&span);
        }
        drop(span);
        let elapsed = started.elapsed().as_millis() as u64;
        self.emit_finished(session, tag, call, status, &result, &spool, elapsed)
            .await;
        Answered {
            status,
            result,
            spool,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn emit_finished(
        &self,
        session: &Arc<SessionState>,
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
    }

    /// The call's result as the `tool` message the model reads next.
    pub(super) async fn push_result(
        &self,
        session: &Arc<SessionState>,
        frame: &mut Frame,
        call: &ToolCall,
        status: ToolStatus,
        result: &str,
        spool: &str,
    ) {
        let content = model_envelope(status, result);
        // Where the whole result is, for a trimmed preview to name (never sent to the model).
        let spool = (!spool.is_empty()).then(|| spool.to_owned());
        let msg = HistoryItem::tool_result(&call.id, content, spool);
        self.push(session, frame, msg).await;
    }

    /// A steered message joins the frame: its event, the history, the trajectory.
    pub(super) async fn steered(
        &self,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        tag: &EventTag,
        message: String,
    ) {
        session
            .emit(tag.event(chat_event::Kind::Steer(Steer {
                message: message.clone(),
            })))
            .await;
        self.trajectories
            .append(
                &session.id,
                json!({"type": "steer", "turn_id": s.turn_id, "context": frame.context, "content": message}),
            )
            .await;
        self.push(session, frame, HistoryItem::user(message)).await;
    }

    pub(super) async fn push(
        &self,
        session: &Arc<SessionState>,
        frame: &mut Frame,
        msg: HistoryItem,
    ) {
        if frame.persist
            && !session.running_is_fenced()
            && let Err(e) = session
                .store()
                .append_messages(&session.id, std::slice::from_ref(&msg))
                .await
        {
            tracing::error!(session = %session.id, error = %e, "message not persisted");
        }
        frame.messages.push(msg);
    }

    pub(super) async fn run_tool(
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
            agent_rules: Some(frame.agent.wire_rules()),
            request_rules: Some(s.rules.clone()),
            session_rules: session.allowed_rules(),
            // A start repeated on a broken connection joins the call on the
            // runner that has it; it never runs twice.
            idempotency_key: format!("{}:{}", s.turn_id, call.id),
        };
        let notify = self.notify_approvals(session, &call.id);
        let r = self
            .runner
            .execute(start, &s.principal, session, tag, cancel)
            .await;
        if let Some(n) = notify {
            n.abort();
        }
        if !r.granted_rule.is_empty() {
            // The runner checked the rule against the call. It is kept with
            // the session's grants (a bare rule is a whole-tool grant).
            session.allow_for_session(&r.granted_rule).await;
        } else if r.approval == Decision::AllowSession as i32 {
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
        self.keep_checkpoint(session, &s.turn_id, &r.file_changes)
            .await;
        self.permission_denied_hook(session, s, call, &record).await;
        self.trajectories
            .append(&session.id, json!({"type": "tool_call", "turn_id": s.turn_id, "context": frame.context, "record": record}))
            .await;
        r
    }
}
