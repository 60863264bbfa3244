//! The hooks the orchestrator runs itself (session, prompt, stop,
//! sub-agent, compaction, notification and denial events), with Claude
//! Code's contract so hook scripts written for Claude Code work unchanged.
//! The handlers themselves (`command`, `http`, timeouts, exit codes) run in
//! [`omicos_hooks`], the same code the tool-runner uses for tool events.
//!
//! - The hooks of one event run in parallel; their decisions combine: any
//!   block wins (reasons joined in config order), contexts are concatenated
//!   in config order; plain text on stdout is context.
//! - A failed handler (another exit code, a non-2xx answer, a timeout, an
//!   unreachable server) blocks nothing: it is logged.

use crate::config::HookMatcher;
use omicos_hooks::{Answer, HookHandler, Outcome};
use serde_json::Value;
use std::path::Path;

pub use omicos_hooks::matches;

/// What the hooks of one event decided, combined.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HookDecision {
    /// `decision: "block"` or exit 2: the reasons, in config order.
    pub block: Option<String>,
    /// `continue: false`: stop, with the `stopReason` (may be empty).
    pub stop: Option<String>,
    /// `hookSpecificOutput.additionalContext` or plain stdout, in config order.
    pub context: Vec<String>,
}

impl HookDecision {
    /// The contexts joined, or None when there is none.
    pub fn context_text(&self) -> Option<String> {
        let parts: Vec<&str> = self
            .context
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }
}

/// Runs the hooks of `event` whose matcher matches `target` (None: every
/// group) in parallel, each with `payload`, and combines their decisions.
pub async fn run(
    event: &str,
    groups: &[HookMatcher],
    target: Option<&str>,
    payload: &Value,
    cwd: &Path,
) -> HookDecision {
    let handlers: Vec<&HookHandler> = groups
        .iter()
        .filter(|g| target.is_none_or(|t| matches(&g.matcher, t)))
        .flat_map(|g| g.hooks.iter())
        .collect();
    let outcomes = omicos_hooks::run_all(&handlers, payload, cwd).await;
    for (h, o) in handlers.iter().zip(&outcomes) {
        match &o.answer {
            Answer::Failed(e) => {
                tracing::warn!(event, hook = %h.label(), error = %e, "hook failed (non-blocking)")
            }
            Answer::TimedOut(t) => {
                tracing::warn!(event, hook = %h.label(), timeout = ?t, "hook timed out (non-blocking)")
            }
            _ => {}
        }
    }
    combine(outcomes.into_iter().map(|o: Outcome| o.answer).collect())
}

fn combine(answers: Vec<Answer>) -> HookDecision {
    let mut out = HookDecision::default();
    let mut blocks = Vec::new();
    for a in answers {
        match a {
            Answer::Block(r) => blocks.push(r),
            Answer::Text(t) => out.context.push(t),
            Answer::Nothing | Answer::Failed(_) | Answer::TimedOut(_) => {}
            Answer::Json(j) => {
                if j.get("continue") == Some(&Value::Bool(false)) {
                    let why = j.get("stopReason").and_then(Value::as_str).unwrap_or("");
                    out.stop.get_or_insert_with(|| why.to_owned());
                }
                if j.get("decision").and_then(Value::as_str) == Some("block") {
                    let why = j
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("blocked by a hook");
                    blocks.push(why.to_owned());
                }
                if let Some(c) = j
                    .get("hookSpecificOutput")
                    .and_then(|h| h.get("additionalContext"))
                    .and_then(Value::as_str)
                {
                    out.context.push(c.to_owned());
                }
            }
        }
    }
    if !blocks.is_empty() {
        out.block = Some(blocks.join("\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_block_wins_and_contexts_keep_config_order() {
        let d = combine(vec![
            Answer::Json(json!({"hookSpecificOutput": {"additionalContext": "one"}})),
            Answer::Json(json!({"decision": "block", "reason": "no"})),
            Answer::Text("two".into()),
            Answer::Nothing,
        ]);
        assert_eq!(d.block.as_deref(), Some("no"));
        assert_eq!(d.context_text().as_deref(), Some("one\n\ntwo"));
        assert_eq!(d.stop, None);
    }

    #[test]
    fn continue_false_stops_with_its_reason() {
        let d = combine(vec![Answer::Json(
            json!({"continue": false, "stopReason": "enough"}),
        )]);
        assert_eq!(d.stop.as_deref(), Some("enough"));
        assert_eq!(d.block, None);
    }
}
