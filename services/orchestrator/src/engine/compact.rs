//! A compaction: the `PreCompact` hook, the summarizing model request, the
//! marker appended to the history (the store keeps every message; the
//! marker only changes what the model sees), the `compaction` event and the
//! trajectory record. Auto (at the threshold, before a request), overflow
//! (a context-overflow refusal: compact, retry once) and manual (the
//! Compact RPC) compactions all come here.

use super::budget::Meter;
use super::context::{self, COMPACTION_PROMPT, View};
use super::{Engine, Frame, Outcome, TurnSettings, emit_error};
use crate::hub::SessionState;
use crate::llm::{LlmBackend, LlmError, LlmRequest};
use crate::runner_client::EventTag;
use omicos_history::HistoryItem;
use omicos_proto::{Compaction, chat_event};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What started a compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The next request would pass the threshold.
    Auto,
    /// The model refused the request as too long.
    Overflow,
    /// The Compact RPC.
    Manual,
}

impl Trigger {
    /// `auto`, `overflow` or `manual` (the event's and the trajectory's word).
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Auto => "auto",
            Trigger::Overflow => "overflow",
            Trigger::Manual => "manual",
        }
    }

    /// Claude Code's PreCompact trigger: `manual` or `auto`.
    fn hook_trigger(self) -> &'static str {
        match self {
            Trigger::Manual => "manual",
            _ => "auto",
        }
    }
}

/// A compaction that happened: the marker to append, the event's counts,
/// and the summarizing call's usage.
pub struct Compacted {
    /// The marker (append it to the history).
    pub marker: HistoryItem,
    /// The counts.
    pub event: Compaction,
    /// The summarizing model call.
    pub used: Meter,
}

impl Engine {
    /// The view for the next request of `frame`, compacted first when it
    /// would pass the threshold. Err: the outcome that ends the frame.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn prepare_context(
        &self,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        tag: &EventTag,
        backend: &dyn LlmBackend,
        model: &str,
        fixed: usize,
        cancel: &CancellationToken,
    ) -> Result<View, Outcome> {
        let cfg = &self.config.context;
        let limit = if cfg.auto_compact {
            (cfg.window(model) as f64 * cfg.compact_threshold) as u64
        } else {
            u64::MAX
        };
        let calibration = self.calibration_of(model);
        // The decision costs a walk over lengths; the messages are built only for the request.
        let m = context::measure(&frame.messages, fixed, cfg, calibration, limit);
        if m.tokens <= limit {
            return Ok(m.view(&frame.messages));
        }
        match self
            .compact_frame(
                session,
                s,
                frame,
                tag,
                backend,
                model,
                fixed,
                Trigger::Auto,
                cancel,
            )
            .await?
        {
            true => Ok(context::view(
                &frame.messages,
                fixed,
                cfg,
                self.calibration_of(model),
                limit,
            )),
            // Nothing older to fold: send it and let the server decide.
            false => Ok(m.view(&frame.messages)),
        }
    }

    /// Compacts a frame's history: appends (and, for the root, persists)
    /// the marker, emits the `compaction` event. Ok(false): nothing to fold.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn compact_frame(
        &self,
        session: &Arc<SessionState>,
        s: &TurnSettings,
        frame: &mut Frame,
        tag: &EventTag,
        backend: &dyn LlmBackend,
        model: &str,
        fixed: usize,
        trigger: Trigger,
        cancel: &CancellationToken,
    ) -> Result<bool, Outcome> {
        let done = match self
            .compact_history(
                &session.id,
                &frame.messages,
                backend,
                &s.model,
                model,
                fixed,
                trigger,
                cancel,
            )
            .await
        {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(false),
            Err(LlmError::Cancelled) => return Err(Outcome::Cancelled),
            Err(e) => {
                emit_error(session, tag, &e.into()).await;
                return Err(Outcome::Error);
            }
        };
        frame.used.add(&done.used);
        frame
            .meters
            .turn
            .lock()
            .expect("turn meter")
            .add(&done.used);
        self.push(session, frame, done.marker).await;
        self.trajectories
            .append(
                &session.id,
                json!({"type": "compaction", "turn_id": s.turn_id, "context": frame.context,
                       "trigger": trigger.as_str(), "tokens_before": done.event.tokens_before,
                       "tokens_after": done.event.tokens_after,
                       "messages_summarized": done.event.messages_summarized}),
            )
            .await;
        session
            .emit(tag.event(chat_event::Kind::Compaction(done.event)))
            .await;
        Ok(true)
    }

    /// Compacts a session between turns (the Compact RPC): the marker is
    /// appended to the stored history. None: nothing to fold.
    pub async fn compact_session(
        &self,
        session_id: &str,
        history: &[HistoryItem],
        system: &str,
        tools: &[crate::llm::ToolDef],
    ) -> Result<Option<Compacted>, LlmError> {
        let backend = self.backend("")?;
        let model = self.config.llm.model.clone();
        let fixed = context::fixed_chars(system, tools);
        self.compact_history(
            session_id,
            history,
            &*backend,
            "",
            &model,
            fixed,
            Trigger::Manual,
            &CancellationToken::new(),
        )
        .await
    }

    /// Summarizes the oldest part of `history` (everything before the part
    /// kept verbatim) into a marker. None: nothing old enough to fold.
    #[allow(clippy::too_many_arguments)]
    async fn compact_history(
        &self,
        session_id: &str,
        history: &[HistoryItem],
        backend: &dyn LlmBackend,
        model_override: &str,
        model: &str,
        fixed: usize,
        trigger: Trigger,
        cancel: &CancellationToken,
    ) -> Result<Option<Compacted>, LlmError> {
        let cfg = &self.config.context;
        let calibration = self.calibration_of(model);
        let before = context::measure(history, fixed, cfg, calibration, u64::MAX);
        let window = match trigger {
            // The server refused a request of about `before.tokens`: its real
            // window is smaller than that, whatever the config says, so the
            // verbatim part and the summarizing request are sized from it.
            Trigger::Overflow => cfg.window(model).min(before.tokens.max(1)),
            _ => cfg.window(model),
        };
        let recent = (window as f64 * cfg.keep_recent_ratio) as u64;
        let from = before.verbatim_from;
        let Some(at) = context::split_point(history, from, recent, cfg, calibration) else {
            return Ok(None);
        };
        self.pre_compact_hook(session_id, trigger).await;
        let previous = history.iter().rev().find_map(|m| match m {
            HistoryItem::Compaction(c) => Some(c.summary.as_str()),
            _ => None,
        });
        let folded: Vec<HistoryItem> = history[from..at]
            .iter()
            .filter(|m| !matches!(m, HistoryItem::Compaction(_)))
            .cloned()
            .collect();
        // The summarizing request gets half the window.
        let budget_chars =
            ((window as f64 * 0.5) * cfg.chars_per_token / calibration.max(1.0)) as usize;
        let mut text = String::new();
        if let Some(p) = previous {
            text.push_str(&format!(
                "[The summary so far]\n{p}\n\n[What happened next]\n"
            ));
        }
        let room = budget_chars.saturating_sub(text.len()).max(1000);
        text.push_str(&context::transcript(
            &folded,
            cfg.tool_result_preview_chars.max(400),
            room,
        ));
        let prompt = if cfg.compaction_prompt.is_empty() {
            COMPACTION_PROMPT
        } else {
            &cfg.compaction_prompt
        };
        let req = LlmRequest {
            system: prompt.to_owned(),
            messages: vec![HistoryItem::user(format!(
                "{text}\n\nWrite the summary now."
            ))],
            tools: Default::default(),
            model: model_override.to_owned(),
            agent_id: "compaction".into(),
        };
        let (tx, _rx) = mpsc::channel(1024);
        let max_summary = ((window as f64 * 0.2) * cfg.chars_per_token) as usize;
        let (summary, used) = match backend.complete(&req, tx, cancel).await {
            Ok(t) if !t.text.trim().is_empty() => {
                let input = if t.input_tokens > 0 {
                    t.input_tokens
                } else {
                    context::tokens(text.len(), cfg.chars_per_token, 1.0)
                };
                let output = if t.output_tokens > 0 {
                    t.output_tokens
                } else {
                    context::tokens(t.text.len(), cfg.chars_per_token, 1.0)
                };
                (
                    t.text,
                    Meter::call(&self.config.budget, model, input, output),
                )
            }
            Err(LlmError::Cancelled) => return Err(LlmError::Cancelled),
            other => {
                // Without a summary the work still goes on: keep an excerpt instead.
                let why = match other {
                    Err(e) => e.to_string(),
                    _ => "it answered with no text".into(),
                };
                tracing::warn!(session = %session_id, error = %why, "compaction summary failed; keeping an excerpt");
                (
                    format!(
                        "(The model could not summarize the earlier conversation: {why}. An excerpt of it:)\n{}",
                        context::transcript(&folded, 300, max_summary / 2)
                    ),
                    Meter::default(),
                )
            }
        };
        let summary: String = summary.chars().take(max_summary.max(500)).collect();
        let summary = self.post_compact_hooks(session_id, trigger, &summary).await;
        let mut marker = context::marker(
            &summary,
            at,
            before.tokens,
            0,
            folded.len(),
            trigger.as_str(),
        );
        // The counts after: the view with the marker in place.
        let mut after_history = Vec::with_capacity(history.len() + 1);
        after_history.extend_from_slice(history);
        after_history.push(HistoryItem::Compaction(marker.clone()));
        let after = context::measure(&after_history, fixed, cfg, calibration, u64::MAX);
        marker.tokens_after = after.tokens;
        Ok(Some(Compacted {
            marker: HistoryItem::Compaction(marker),
            event: Compaction {
                tokens_before: before.tokens,
                tokens_after: after.tokens,
                messages_summarized: folded.len() as u32,
                trigger: trigger.as_str().into(),
                tool_results_trimmed: 0,
            },
            used,
        }))
    }

    /// Runs the PreCompact hooks whose matcher matches, with Claude Code's
    /// payload. A hook cannot stop a compaction (as in Claude Code).
    async fn pre_compact_hook(&self, session_id: &str, trigger: Trigger) {
        let t = trigger.hook_trigger();
        let mut payload = self.hook_payload(session_id, "PreCompact");
        payload["trigger"] = t.into();
        payload["custom_instructions"] = "".into();
        self.run_hooks("PreCompact", Some(t), payload).await;
    }

    /// Runs PostCompact (told the summary), then SessionStart with source
    /// `compact`, whose context is kept after the summary, where the model
    /// reads it from now on.
    async fn post_compact_hooks(
        &self,
        session_id: &str,
        trigger: Trigger,
        summary: &str,
    ) -> String {
        let t = trigger.hook_trigger();
        if self.has_hooks("PostCompact") {
            let mut payload = self.hook_payload(session_id, "PostCompact");
            payload["trigger"] = t.into();
            payload["compact_summary"] = summary.into();
            self.run_hooks("PostCompact", Some(t), payload).await;
        }
        if !self.has_hooks("SessionStart") {
            return summary.to_owned();
        }
        let mut payload = self.hook_payload(session_id, "SessionStart");
        payload["source"] = "compact".into();
        payload["model"] = self.config.llm.model.clone().into();
        match self
            .run_hooks("SessionStart", Some("compact"), payload)
            .await
            .context_text()
        {
            Some(c) => format!(
                "{summary}\n\n{}",
                super::hook_events::context_message("SessionStart", &c)
            ),
            None => summary.to_owned(),
        }
    }
}
