//! Where the orchestrator's hook events fire: each builds Claude Code's
//! payload for its event and runs the configured hooks ([`crate::hooks`]).

use super::{Engine, Frame, TurnSettings};
use crate::hooks::{self, HookDecision};
use crate::hub::SessionState;
use crate::runner_client::EventTag;
use omicos_history::HistoryItem;
use omicos_proto::{PermissionMode, Steer, chat_event};
use serde_json::{Value, json};
use std::sync::Arc;

/// How many times Stop (or SubagentStop) hooks may make one turn go on; past
/// it the turn ends, so a hook that always blocks cannot loop forever.
pub const MAX_STOP_CONTINUATIONS: u32 = 8;

/// Wraps hook context the way the model is told it is not the user's words.
pub fn context_message(event: &str, context: &str) -> String {
    format!("<hook-context event=\"{event}\">\n{context}\n</hook-context>")
}

impl Engine {
    /// The fields every event carries: session_id, transcript_path, cwd,
    /// hook_event_name.
    pub(crate) fn hook_payload(&self, session_id: &str, event: &str) -> Value {
        json!({
            "session_id": session_id,
            "transcript_path": self.trajectories.path(session_id).display().to_string(),
            "cwd": self.config.workspace.display().to_string(),
            "hook_event_name": event,
        })
    }

    /// Whether any hook is configured for `event`.
    pub(crate) fn has_hooks(&self, event: &str) -> bool {
        self.config
            .hooks
            .events()
            .iter()
            .any(|(name, groups)| *name == event && !groups.is_empty())
    }

    /// Runs the hooks of `event` whose matcher matches `target` (None: all).
    /// The transcript is flushed first: a hook may read it.
    pub(crate) async fn run_hooks(
        &self,
        event: &str,
        target: Option<&str>,
        payload: Value,
    ) -> HookDecision {
        let Some((_, groups)) = self
            .config
            .hooks
            .events()
            .into_iter()
            .find(|(name, groups)| *name == event && !groups.is_empty())
        else {
            return HookDecision::default();
        };
        if let Some(s) = payload.get("session_id").and_then(Value::as_str) {
            self.trajectories.flush(s).await;
        }
        let d = hooks::run(event, groups, target, &payload, &self.config.workspace).await;
        if d.block.is_some() || d.stop.is_some() || !d.context.is_empty() {
            tracing::info!(target: "omicos::audit", event, block = ?d.block, stop = ?d.stop, contexts = d.context.len(), "hook decision");
        }
        d
    }
}

impl Engine {
    /// SessionStart (the first turn of the session on this replica:
    /// `startup` when new, else `resume`) and UserPromptSubmit, before the
    /// prompt reaches the history. Ok: the context to add after the prompt;
    /// Err: the prompt is refused, with the hook's reason.
    pub(crate) async fn before_prompt(
        &self,
        st: &SessionState,
        settings: &TurnSettings,
        message: &str,
        new_session: bool,
    ) -> Result<Vec<HistoryItem>, String> {
        let mut context = Vec::new();
        if self.has_hooks("SessionStart")
            && self
                .started_sessions
                .lock()
                .expect("started sessions")
                .insert(st.id.clone())
        {
            let source = if new_session { "startup" } else { "resume" };
            let mut payload = self.hook_payload(&st.id, "SessionStart");
            payload["source"] = source.into();
            payload["model"] = self.model_name(settings).to_owned().into();
            if let Some(c) = self
                .run_hooks("SessionStart", Some(source), payload)
                .await
                .context_text()
            {
                context.push(HistoryItem::user(context_message("SessionStart", &c)));
            }
        }
        if self.has_hooks("UserPromptSubmit") {
            let mut payload = self.hook_payload(&st.id, "UserPromptSubmit");
            payload["permission_mode"] = mode_name(settings).into();
            payload["prompt"] = message.into();
            let d = self.run_hooks("UserPromptSubmit", None, payload).await;
            if let Some(why) = d.block.clone().or(d.stop.clone()) {
                // The session did start: what SessionStart added is kept for
                // the next prompt, though this one never reaches the history.
                if !context.is_empty()
                    && let Err(e) = st.store().append_messages(&st.id, &context).await
                {
                    tracing::error!(session = %st.id, error = %e, "SessionStart context not persisted");
                }
                return Err(if why.is_empty() {
                    "the prompt was blocked by a UserPromptSubmit hook".into()
                } else {
                    format!("the prompt was blocked by a UserPromptSubmit hook: {why}")
                });
            }
            if let Some(c) = d.context_text() {
                context.push(HistoryItem::user(context_message("UserPromptSubmit", &c)));
            }
        }
        Ok(context)
    }

    /// Stop (root frame) or SubagentStop (a sub-turn): the frame completed;
    /// a hook that blocks makes it go on, its reason given to the model as
    /// the next user input. True: run the frame again.
    pub(crate) async fn stop_hook_continues(
        &self,
        st: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        continuations: u32,
    ) -> bool {
        let event = if frame.depth == 0 {
            "Stop"
        } else {
            "SubagentStop"
        };
        if !self.has_hooks(event) {
            return false;
        }
        let mut payload = self.hook_payload(&st.id, event);
        payload["permission_mode"] = mode_name(s).into();
        payload["stop_hook_active"] = (continuations > 0).into();
        payload["last_assistant_message"] =
            frame.last_text.lock().expect("last text").clone().into();
        let target = (frame.depth > 0).then(|| frame.agent.id.clone());
        if frame.depth > 0 {
            payload["agent_id"] = frame.context.clone().into();
            payload["agent_type"] = frame.agent.id.clone().into();
        }
        let d = self.run_hooks(event, target.as_deref(), payload).await;
        let Some(reason) = d.block.filter(|_| d.stop.is_none()) else {
            return false;
        };
        if continuations >= MAX_STOP_CONTINUATIONS {
            tracing::warn!(session = %st.id, event, "a stop hook blocked again; the turn ends (continuations are bounded)");
            return false;
        }
        let tag = EventTag {
            turn_id: s.turn_id.clone(),
            context: frame.context.clone(),
            agent_id: frame.agent.id.clone(),
        };
        st.emit(tag.event(chat_event::Kind::Steer(Steer {
            message: reason.clone(),
        })))
        .await;
        self.trajectories
            .append(
                &st.id,
                json!({"type": "hook_continue", "event": event, "turn_id": s.turn_id, "context": frame.context, "content": reason}),
            )
            .await;
        self.push(st, frame, HistoryItem::user(reason)).await;
        true
    }

    /// SubagentStart: a `call_agent` sub-turn starts; its context goes after
    /// the instruction.
    pub(crate) async fn subagent_start(&self, st: &SessionState, frame: &mut Frame) {
        if !self.has_hooks("SubagentStart") {
            return;
        }
        let mut payload = self.hook_payload(&st.id, "SubagentStart");
        payload["agent_id"] = frame.context.clone().into();
        payload["agent_type"] = frame.agent.id.clone().into();
        if let Some(c) = self
            .run_hooks("SubagentStart", Some(&frame.agent.id), payload)
            .await
            .context_text()
        {
            frame
                .messages
                .push(HistoryItem::user(context_message("SubagentStart", &c)));
        }
    }
}

/// Claude Code's name of a permission mode.
fn mode_name(s: &TurnSettings) -> &'static str {
    match s.permission_mode {
        PermissionMode::ReadOnly => "plan",
        PermissionMode::Full => "bypassPermissions",
        _ => "default",
    }
}

impl Engine {
    /// Notification (`permission_prompt`) whenever the call `call_id` waits
    /// for the user's approval; the task ends when the caller aborts it.
    pub(crate) fn notify_approvals(
        &self,
        st: &Arc<SessionState>,
        call_id: &str,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.has_hooks("Notification") {
            return None;
        }
        let mut rx = st.subscribe();
        let groups = self.config.hooks.notification.clone();
        let cwd = self.config.workspace.clone();
        let base = self.hook_payload(&st.id, "Notification");
        let call_id = call_id.to_owned();
        Some(tokio::spawn(async move {
            while let Ok(e) = rx.recv().await {
                let Some(chat_event::Kind::ToolApprovalRequest(a)) = e.kind else {
                    continue;
                };
                if a.call_id != call_id {
                    continue;
                }
                let mut payload = base.clone();
                payload["notification_type"] = "permission_prompt".into();
                payload["message"] =
                    format!("omicos needs your permission to use {}", a.tool_name).into();
                let (groups, cwd) = (groups.clone(), cwd.clone());
                // Not awaited by the call, and not ended with it: a slow
                // hook must not delay the approval, nor be cut short by it.
                tokio::spawn(async move {
                    hooks::run(
                        "Notification",
                        &groups,
                        Some("permission_prompt"),
                        &payload,
                        &cwd,
                    )
                    .await;
                });
            }
        }))
    }

    /// PermissionDenied: the call was refused by the rules, the mode or the
    /// user (its runner record says which).
    pub(crate) async fn permission_denied_hook(
        &self,
        st: &SessionState,
        s: &TurnSettings,
        call: &crate::llm::ToolCall,
        record: &Value,
    ) {
        if !self.has_hooks("PermissionDenied") {
            return;
        }
        let refused = record["permission"]["gate"] == "refuse";
        let denied = record["approval"]["decision"] == "deny";
        if !(refused || denied) {
            return;
        }
        let reason = if refused {
            record["permission"]["reason"]
                .as_str()
                .unwrap_or("refused by the permission rules or mode")
                .to_owned()
        } else {
            format!(
                "denied at approval ({})",
                record["approval"]["source"].as_str().unwrap_or("user")
            )
        };
        let tool = record["name"].as_str().unwrap_or(&call.name).to_owned();
        let mut payload = self.hook_payload(&st.id, "PermissionDenied");
        payload["permission_mode"] = mode_name(s).into();
        payload["tool_name"] = tool.clone().into();
        payload["tool_input"] =
            serde_json::from_str::<Value>(&call.arguments).unwrap_or(Value::Null);
        payload["tool_use_id"] = call.id.clone().into();
        payload["reason"] = reason.into();
        self.run_hooks("PermissionDenied", Some(&tool), payload)
            .await;
    }
}
