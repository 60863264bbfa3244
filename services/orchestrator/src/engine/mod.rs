//! The turn loop: the active agent's prompt and history go to the model with
//! the tool schemas; text streams to the client; tool calls run through the
//! tool-runner (or, for `call_agent`, as a sub-turn of another agent); results
//! go back as `tool` messages until the model answers without tool calls.
//!
//! - [`turn`]: a root turn from start to turn_done ([`Engine::run_turn`]);
//! - [`frame`]: one agent's frame of work ([`Engine::run_frame`]);
//! - [`delegate`]: `call_agent` and `list_agents`, served here, never by the runner;
//! - [`tools`]: the tools an agent sees (runner specs → model definitions, team tools);
//! - [`context`]: what of the history the model sees (windows, trimming, compaction);
//! - [`compact`]: a compaction (the summarizing request, the marker, the hook, the event);
//! - [`budget`]: usage and the token and cost ceilings.

pub mod budget;
mod checkpoint;
mod compact;
pub mod context;
mod delegate;
mod frame;
pub mod hook_events;
pub mod resume;
pub mod tools;
mod turn;

pub use delegate::team_tools;
pub use resume::ResumedTurn;
pub use tools::{AgentTools, TEAM_TOOLSET, ToolScope, runner_toolsets, tool_def};
pub use turn::{PROMPT_BLOCKED, RootTurn};

use crate::agents::{AgentDirectory, AgentProfile};
use crate::config::Config;
use crate::error::OrchestratorError;
use crate::hub::SessionState;
use crate::llm::{LlmBackend, LlmError};
use crate::runner_client::{EventTag, Runner};
use crate::trajectory::Trajectories;
use omicos_proto::{ErrorEvent, PermissionMode, TurnDoneReason, chat_event};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// Per model: reported input tokens / estimated tokens of its last
    /// request, so estimates follow the model's own tokenizer.
    pub calibration: Mutex<HashMap<String, f64>>,
    /// The agents' tool lists by catalog version ([`tools::ToolCache`]).
    pub tool_cache: tools::ToolCache,
    /// Sessions whose SessionStart hooks ran on this replica (a later turn
    /// of theirs is not a start; one after a restart is a `resume`).
    pub started_sessions: Mutex<std::collections::HashSet<String>>,
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
    /// The deadline passed: the root turn's (the client's `grpc-timeout`),
    /// or a sub-turn's delegation deadline (which its caller reads as a tool error).
    Deadline,
    /// A token or cost budget was reached (which one, in words).
    Budget(String),
    /// A UserPromptSubmit hook refused the prompt (the error event says why).
    Blocked,
}

impl Outcome {
    /// The `TurnDone.reason` of a root turn that ended so.
    pub fn reason(&self) -> TurnDoneReason {
        match self {
            Outcome::Completed => TurnDoneReason::Completed,
            Outcome::Cancelled => TurnDoneReason::Cancelled,
            Outcome::Error => TurnDoneReason::Error,
            Outcome::MaxIterations => TurnDoneReason::MaxIterations,
            Outcome::Deadline => TurnDoneReason::Deadline,
            Outcome::Budget(_) => TurnDoneReason::Budget,
            // The proto has no reason of its own for it yet; the error event
            // before (kind `prompt_blocked`) tells it apart.
            Outcome::Blocked => TurnDoneReason::Error,
        }
    }

    /// Whether the turn ended short of an answer for a reason other than
    /// the user's cancel (its agent span is marked as an error).
    pub fn failed(&self) -> bool {
        !matches!(self, Outcome::Completed | Outcome::Cancelled)
    }

    /// The words behind the reason, when there are any.
    pub fn detail(&self) -> String {
        match self {
            Outcome::Budget(why) => why.clone(),
            Outcome::Blocked => "blocked by a UserPromptSubmit hook".into(),
            _ => String::new(),
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
    /// When the root turn must end (the client's `grpc-timeout`); None: no deadline.
    pub deadline: Option<tokio::time::Instant>,
    /// The ChatRequest's permission rules (they only narrow; checked to parse).
    pub rules: omicos_proto::PermissionRules,
    /// Who the turn acts for: forwarded to the runner with every call (its
    /// tenant picks the workspace, memory scope and kernels there).
    pub principal: omicos_auth::Principal,
}

impl TurnSettings {
    /// What TurnStarted keeps of these settings (for a replica that
    /// continues the turn: [`Self::from_wire`]).
    pub fn to_wire(&self) -> omicos_proto::TurnRunSettings {
        let deadline_ms = self.deadline.map_or(0, |at| {
            let left = at.saturating_duration_since(tokio::time::Instant::now());
            omicos_sessionstore::now_ms() + left.as_millis() as i64
        });
        omicos_proto::TurnRunSettings {
            model: self.model.clone(),
            provider: self.provider.clone(),
            max_tool_iterations: self.max_iterations,
            permissions: Some(self.rules.clone()),
            allow_shell: self.allow_shell,
            allow_file_write: self.allow_file_write,
            tier: self.principal.tier.clone(),
            max_mode: self.principal.max_mode as i32,
            deadline_ms,
        }
    }

    /// The settings of a turn the log shows started, for the session of
    /// `tenant` and `subject` (its owner, whom the turn acts for).
    pub fn from_wire(
        turn_id: &str,
        started: &omicos_proto::TurnStarted,
        tenant: &str,
        subject: &str,
        default_iterations: u32,
    ) -> Self {
        let w = started.settings.clone().unwrap_or_default();
        let deadline = (w.deadline_ms > 0).then(|| {
            let left = (w.deadline_ms - omicos_sessionstore::now_ms()).max(0) as u64;
            tokio::time::Instant::now() + std::time::Duration::from_millis(left)
        });
        Self {
            turn_id: turn_id.to_owned(),
            permission_mode: PermissionMode::try_from(started.permission_mode)
                .unwrap_or(PermissionMode::Unspecified),
            allow_shell: w.allow_shell,
            allow_file_write: w.allow_file_write,
            model: w.model,
            provider: w.provider,
            max_iterations: if w.max_tool_iterations == 0 {
                default_iterations
            } else {
                w.max_tool_iterations
            },
            team: started.team_members.clone(),
            deadline,
            rules: w.permissions.unwrap_or_default(),
            principal: omicos_auth::Principal {
                subject: subject.to_owned(),
                tenant: tenant.to_owned(),
                tier: w.tier,
                // A log from before the field: the mode already capped the turn.
                max_mode: PermissionMode::try_from(w.max_mode)
                    .ok()
                    .filter(|m| *m != PermissionMode::Unspecified)
                    .unwrap_or(PermissionMode::Full),
                // Acting for the session's owner, as the lost replica did.
                via: omicos_auth::principal::Via::Forwarded,
            },
        }
    }

    /// What decides the tools the turn's agents list, besides each agent.
    pub fn tool_scope(&self) -> ToolScope {
        ToolScope {
            mode: self.permission_mode,
            allow_shell: self.allow_shell,
            allow_file_write: self.allow_file_write,
            request_rules: self.rules.clone(),
        }
    }

    /// Why a call the model asked for was not run after the turn was stopped.
    pub fn not_run_reason(&self) -> &'static str {
        if self
            .deadline
            .is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            "the turn passed its deadline before it ran"
        } else {
            "cancelled by the user before it ran"
        }
    }
}

/// One agent's frame of work: the root turn, or a delegated sub-turn.
pub struct Frame {
    /// The agent.
    pub agent: AgentProfile,
    /// Its context (history for the root, the instruction for a sub-turn).
    pub messages: Vec<omicos_history::HistoryItem>,
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
    /// The turn's meters (shared with sub-turns).
    pub meters: budget::Meters,
    /// What this frame's own model calls used.
    pub used: budget::Meter,
    /// Messages steered into the turn (the root frame only).
    pub steer: Option<Arc<crate::hub::SteerQueue>>,
}

impl Engine {
    /// The model a request of these settings is for (the override, else the configured one).
    pub(crate) fn model_name<'a>(&'a self, s: &'a TurnSettings) -> &'a str {
        if s.model.is_empty() {
            &self.config.llm.model
        } else {
            &s.model
        }
    }

    /// The calibration of `model`'s estimates (1.0 until its usage was seen).
    pub(crate) fn calibration_of(&self, model: &str) -> f64 {
        self.calibration
            .lock()
            .expect("calibration")
            .get(model)
            .copied()
            .unwrap_or(1.0)
    }

    /// Learns from a request estimated at `raw` tokens (calibration 1.0) that
    /// the backend counted `reported`.
    pub(crate) fn calibrate(&self, model: &str, raw: u64, reported: u64) {
        if raw == 0 || reported == 0 {
            return;
        }
        let r = (reported as f64 / raw as f64).clamp(0.25, 4.0);
        self.calibration
            .lock()
            .expect("calibration")
            .insert(model.to_owned(), r);
    }

    /// The backend a turn's requests go to (its `provider`, else the default).
    pub(crate) fn provider_name<'a>(&'a self, s: &'a TurnSettings) -> &'a str {
        if s.provider.is_empty() {
            &self.default_backend
        } else {
            &s.provider
        }
    }

    pub(crate) fn backend(&self, name: &str) -> Result<Arc<dyn LlmBackend>, LlmError> {
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
}

/// Emits an error event.
pub async fn emit_error(session: &SessionState, tag: &EventTag, error: &OrchestratorError) {
    tracing::warn!(session = %session.id, turn = %tag.turn_id, kind = %error.kind(), error = %error.report(), "turn error");
    session
        .emit(tag.event(chat_event::Kind::Error(ErrorEvent {
            kind: error.kind().as_str().into(),
            message: error.report(),
        })))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_has_its_own_turn_done_reason() {
        let all = [
            (Outcome::Completed, TurnDoneReason::Completed),
            (Outcome::Cancelled, TurnDoneReason::Cancelled),
            (Outcome::Error, TurnDoneReason::Error),
            (Outcome::MaxIterations, TurnDoneReason::MaxIterations),
            (Outcome::Deadline, TurnDoneReason::Deadline),
            (Outcome::Budget("x".into()), TurnDoneReason::Budget),
        ];
        for (o, r) in all {
            assert_eq!(o.reason(), r, "{o:?}");
        }
    }
}
