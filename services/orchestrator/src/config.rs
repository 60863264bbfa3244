//! Orchestrator configuration (defaults → YAML file → `OMICOS_*` environment).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The shortest turn lease: it is renewed every third of it, and a store
/// round trip must fit in that with room to spare.
pub const MIN_TURN_LEASE: Duration = Duration::from_secs(5);

/// A string, or a list of strings joined with commas (`tool_runner`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s,
        OneOrMany::Many(v) => v.join(","),
    })
}

/// What a replica does with a lost replica's turn (`turn_recovery`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnRecovery {
    /// Continue it from the log.
    #[default]
    Resume,
    /// Close it as INTERRUPTED (each call left open answered as interrupted).
    Interrupt,
}

/// The orchestrator's settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address (`OMICOS_LISTEN`).
    pub listen: String,
    /// Workspace root shared with the tool-runner and kernels (`OMICOS_WORKSPACE`).
    pub workspace: PathBuf,
    /// The tool-runners: one URL, a comma-separated list
    /// (`OMICOS_TOOL_RUNNER`), or a YAML list. Each host is re-resolved every
    /// `runner_refresh`; every address it resolves to is one runner (a
    /// headless Service). Calls are spread over the healthy ones.
    #[serde(deserialize_with = "one_or_many")]
    pub tool_runner: String,
    /// How often runner names are resolved again and runners health-checked.
    #[serde(with = "duration")]
    pub runner_refresh: Duration,
    /// Conversation store: `sqlite://path`, `postgres://…`, or `memory:`.
    /// Empty: `sqlite://<workspace>/.omicos/sessions.db`.
    pub store_url: String,
    /// The model.
    pub llm: LlmConfig,
    /// Model calls with tool calls per turn before the turn stops (`max_iterations`).
    pub max_tool_iterations: u32,
    /// Time between heartbeats on a Chat or Attach stream.
    #[serde(with = "duration")]
    pub heartbeat_interval: Duration,
    /// call_agent limits.
    pub delegation: DelegationConfig,
    /// Subscription tier of the deployment: community, pro_agent, pro_cloud, lab, enterprise.
    pub tier: String,
    /// Agent catalog cache directory; empty: `~/.omicos/cloud-agents/agents`.
    pub agent_cache_dir: String,
    /// Skill roots (colon-separated, like OMICOS_SKILL_ROOTS).
    pub skill_roots: String,
    /// Grace period of the drain on shutdown.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// How long a turn lease lasts without renewal (replicas); at least 5 s.
    #[serde(with = "duration")]
    pub turn_lease: Duration,
    /// What a replica does with a turn whose replica was lost (its lease
    /// expired): `resume` (the default) continues it from the log (a model
    /// request in flight is issued again, finished calls keep their results,
    /// running ones are followed again on their runner, calls lost with
    /// their runner are answered as lost and never run twice); `interrupt`
    /// closes it as INTERRUPTED, as before.
    pub turn_recovery: TurnRecovery,
    /// Client authentication: API keys, JWTs (see docs/configuration.md, `auth`).
    pub auth: omicos_auth::ClientAuthConfig,
    /// The secret every part of this deployment sends to the others
    /// (`OMICOS_SERVICE_SECRET`); empty: calls to the runner carry none.
    pub service_secret: String,
    /// TLS on the public port (`tls.cert`, `tls.key`; with `tls.client_ca`,
    /// clients must present a certificate from that CA too). gRPC, gRPC-web
    /// and the page still share the one port. Empty: plain HTTP.
    pub tls: omicos_servicekit::TlsConfig,
    /// TLS of the calls to the tool-runners (`https://` entries of
    /// `tool_runner`): `runner_tls.ca` verifies the runners,
    /// `runner_tls.cert`/`key` is the orchestrator's client certificate for
    /// runners that require mutual TLS.
    pub runner_tls: omicos_servicekit::TlsConfig,
    /// How the tool calls of one model answer run.
    pub tool_calls: ToolCallsConfig,
    /// Context windows and compaction.
    pub context: ContextConfig,
    /// Token and cost ceilings, and the price table.
    pub budget: BudgetConfig,
    /// Hooks the orchestrator runs itself (Claude Code's settings shape):
    /// session, prompt, stop, sub-agent, compaction, notification and
    /// denial events. Tool hooks (PreToolUse, ...) are the tool-runner's.
    pub hooks: HooksConfig,
    /// Where `GET /metrics` (Prometheus) is served, e.g. `0.0.0.0:9464`; empty: not served.
    pub metrics_addr: String,
    /// What the GenAI spans record beyond their defaults.
    pub telemetry: TelemetryConfig,
    /// Size limits of files attached to messages (UploadFiles).
    pub uploads: UploadsConfig,
}

/// The most one attached file may hold: a spreadsheet, a PDF or a few
/// thousand lines of logs, well under gRPC-web's message limit.
pub const DEFAULT_UPLOAD_FILE_BYTES: u64 = 25 << 20;
/// The most one UploadFiles request may carry: two files at the per-file
/// limit, under the server's message limit (`MAX_MESSAGE_BYTES`, 64 MiB).
pub const DEFAULT_UPLOAD_REQUEST_BYTES: u64 = 50 << 20;
/// The most files one UploadFiles request may carry.
pub const DEFAULT_UPLOAD_FILES: usize = 20;

/// Size limits of UploadFiles (the workspace's disk bound is the
/// tool-runner's, `sandbox.session_limits`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadsConfig {
    /// The most one file may hold, in bytes.
    pub max_file_bytes: u64,
    /// The most all files of one request may hold together, in bytes.
    pub max_request_bytes: u64,
    /// The most files in one request.
    pub max_files: usize,
}

impl Default for UploadsConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_UPLOAD_FILE_BYTES,
            max_request_bytes: DEFAULT_UPLOAD_REQUEST_BYTES,
            max_files: DEFAULT_UPLOAD_FILES,
        }
    }
}

/// What the OpenTelemetry GenAI spans record (docs/observability.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Put the prompts, the system prompt and the answers on the `chat`
    /// spans (`gen_ai.input.messages`, `gen_ai.system_instructions`,
    /// `gen_ai.output.messages`). Off by default: they are users' data, and
    /// a trace backend is rarely where users' data may go.
    pub capture_content: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7000".into(),
            workspace: PathBuf::from("omicos-workspace"),
            tool_runner: "http://127.0.0.1:7001".into(),
            runner_refresh: Duration::from_secs(5),
            store_url: String::new(),
            llm: LlmConfig::default(),
            max_tool_iterations: 100,
            heartbeat_interval: Duration::from_secs(15),
            delegation: DelegationConfig::default(),
            tier: "community".into(),
            agent_cache_dir: String::new(),
            skill_roots: String::new(),
            shutdown_grace: Duration::from_secs(10),
            turn_lease: Duration::from_secs(60),
            turn_recovery: TurnRecovery::Resume,
            auth: omicos_auth::ClientAuthConfig::default(),
            service_secret: String::new(),
            tls: Default::default(),
            runner_tls: Default::default(),
            tool_calls: ToolCallsConfig::default(),
            context: ContextConfig::default(),
            budget: BudgetConfig::default(),
            hooks: HooksConfig::default(),
            metrics_addr: String::new(),
            telemetry: TelemetryConfig::default(),
            uploads: UploadsConfig::default(),
        }
    }
}

/// Which model, where.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// `openai`, `anthropic` or `replay`; empty: replay when `replay_file` is
    /// set, anthropic when only ANTHROPIC_API_KEY is set, otherwise openai.
    pub backend: String,
    /// `OMICOS_LLM_BASE_URL`, e.g. `http://127.0.0.1:11434/v1` for Ollama.
    pub base_url: String,
    /// `OMICOS_LLM_MODEL`.
    pub model: String,
    /// `OMICOS_LLM_API_KEY` (falls back to OPENAI_API_KEY / ANTHROPIC_API_KEY).
    pub api_key: String,
    /// Script for the replay backend.
    pub replay_file: String,
    /// Attempts per model call on 429/5xx/connection errors.
    pub max_attempts: u32,
    /// First retry delay.
    #[serde(with = "duration")]
    pub retry_base_delay: Duration,
    /// Longest retry delay (at least `retry_base_delay`).
    #[serde(with = "duration")]
    pub retry_max_delay: Duration,
    /// A stream with no data for this long is broken.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            backend: String::new(),
            base_url: String::new(),
            model: String::new(),
            api_key: String::new(),
            replay_file: String::new(),
            max_attempts: 4,
            retry_base_delay: Duration::from_millis(500),
            retry_max_delay: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// call_agent limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DelegationConfig {
    /// Deepest delegation chain.
    pub max_depth: u32,
    /// Wall-clock limit of one delegation.
    #[serde(with = "duration")]
    pub deadline: Duration,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        Self {
            max_depth: 6,
            deadline: Duration::from_secs(900),
        }
    }
}

/// The default number of calls of one answer running at once: enough for a
/// model's usual fan-out of reads, few enough not to flood the runner.
pub const DEFAULT_PARALLEL_TOOL_CALLS: usize = 8;

/// How the tool calls of one model answer run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolCallsConfig {
    /// Most calls running at once; read-only calls (risk Read) and the
    /// `concurrency_safe` ones run side by side, the others one at a time.
    pub parallel_limit: usize,
    /// Tools that are not risk Read but are safe to run beside others.
    pub concurrency_safe: Vec<String>,
}

impl Default for ToolCallsConfig {
    fn default() -> Self {
        Self {
            parallel_limit: DEFAULT_PARALLEL_TOOL_CALLS,
            concurrency_safe: Vec::new(),
        }
    }
}

/// The window of a model the config does not name: what most current
/// models offer at least.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

/// Context windows and compaction.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextConfig {
    /// Tokens of a model not in `windows`.
    pub default_window: u64,
    /// Tokens per model name (the name the backend is asked for).
    pub windows: BTreeMap<String, u64>,
    /// Compact when the next request would pass this share of the window.
    pub compact_threshold: f64,
    /// Compact automatically at the threshold (false: only on Compact and on
    /// a context-overflow refusal).
    pub auto_compact: bool,
    /// Share of the window kept verbatim (the latest messages) by a compaction.
    pub keep_recent_ratio: f64,
    /// The latest messages whose tool results are never trimmed.
    pub keep_recent_messages: usize,
    /// Characters an old tool result keeps when it is trimmed.
    pub tool_result_preview_chars: usize,
    /// Characters per token of the estimate used where the backend reports no usage.
    pub chars_per_token: f64,
    /// The summarizing request's system prompt; empty: the built-in one.
    pub compaction_prompt: String,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            default_window: DEFAULT_CONTEXT_WINDOW,
            windows: BTreeMap::new(),
            compact_threshold: 0.85,
            auto_compact: true,
            keep_recent_ratio: 0.3,
            keep_recent_messages: 6,
            tool_result_preview_chars: 1000,
            chars_per_token: 4.0,
            compaction_prompt: String::new(),
        }
    }
}

impl ContextConfig {
    /// The window of `model`.
    pub fn window(&self, model: &str) -> u64 {
        self.windows
            .get(model)
            .copied()
            .unwrap_or(self.default_window)
    }
}

/// The price of a model, per million tokens.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Price {
    /// Per million input (prompt) tokens.
    pub input_per_mtok: f64,
    /// Per million output (completion) tokens.
    pub output_per_mtok: f64,
}

/// Token and cost ceilings (0: none). Tokens are input plus output tokens of
/// every model call; cost comes from `prices`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Tokens of one root turn, its sub-turns included.
    pub turn_tokens: u64,
    /// Tokens of a session, every turn included.
    pub session_tokens: u64,
    /// Tokens of one `call_agent` sub-turn.
    pub sub_turn_tokens: u64,
    /// Cost of one root turn.
    pub turn_cost: f64,
    /// Cost of a session.
    pub session_cost: f64,
    /// Cost of one `call_agent` sub-turn.
    pub sub_turn_cost: f64,
    /// Prices per model name; a model without one costs nothing.
    pub prices: BTreeMap<String, Price>,
}

pub use omicos_hooks::{HookHandler, HookMatcher};

/// The hooks the orchestrator runs itself, in Claude Code's settings shape.
/// Tool hooks (PreToolUse, PermissionRequest, PostToolUse,
/// PostToolUseFailure) are run by the tool-runner, where the call runs; they
/// are accepted here so one `hooks` section can serve both.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HooksConfig {
    /// Before a compaction.
    #[serde(rename = "PreCompact")]
    pub pre_compact: Vec<HookMatcher>,
    /// After a compaction.
    #[serde(rename = "PostCompact")]
    pub post_compact: Vec<HookMatcher>,
    /// A session starts (`startup`), is resumed on this replica (`resume`),
    /// or goes on after a compaction (`compact`); may add context.
    #[serde(rename = "SessionStart")]
    pub session_start: Vec<HookMatcher>,
    /// A session is deleted (`reason`).
    #[serde(rename = "SessionEnd")]
    pub session_end: Vec<HookMatcher>,
    /// Before a prompt reaches the model: may refuse it or add context.
    #[serde(rename = "UserPromptSubmit")]
    pub user_prompt_submit: Vec<HookMatcher>,
    /// The root agent is about to end its turn: may make it go on.
    #[serde(rename = "Stop")]
    pub stop: Vec<HookMatcher>,
    /// A `call_agent` sub-turn starts: may add context.
    #[serde(rename = "SubagentStart")]
    pub subagent_start: Vec<HookMatcher>,
    /// A `call_agent` sub-turn is about to end: may make it go on.
    #[serde(rename = "SubagentStop")]
    pub subagent_stop: Vec<HookMatcher>,
    /// An approval is waiting for the user.
    #[serde(rename = "Notification")]
    pub notification: Vec<HookMatcher>,
    /// A tool call was refused by the rules, the mode or the user.
    #[serde(rename = "PermissionDenied")]
    pub permission_denied: Vec<HookMatcher>,
    /// The tool-runner's (ignored here).
    #[serde(rename = "PreToolUse")]
    pub pre_tool_use: serde_json::Value,
    /// The tool-runner's (ignored here).
    #[serde(rename = "PermissionRequest")]
    pub permission_request: serde_json::Value,
    /// The tool-runner's (ignored here).
    #[serde(rename = "PostToolUse")]
    pub post_tool_use: serde_json::Value,
    /// The tool-runner's (ignored here).
    #[serde(rename = "PostToolUseFailure")]
    pub post_tool_use_failure: serde_json::Value,
}

impl HooksConfig {
    /// Every event the orchestrator runs, with its name.
    pub fn events(&self) -> [(&'static str, &[HookMatcher]); 10] {
        [
            ("PreCompact", &self.pre_compact),
            ("PostCompact", &self.post_compact),
            ("SessionStart", &self.session_start),
            ("SessionEnd", &self.session_end),
            ("UserPromptSubmit", &self.user_prompt_submit),
            ("Stop", &self.stop),
            ("SubagentStart", &self.subagent_start),
            ("SubagentStop", &self.subagent_stop),
            ("Notification", &self.notification),
            ("PermissionDenied", &self.permission_denied),
        ]
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[
        Renamed::to("heartbeat_secs", "heartbeat_interval"),
        Renamed::to("grace_secs", "shutdown_grace"),
        Renamed::to("turn_lease_secs", "turn_lease"),
        Renamed::millis("llm.retry_base_ms", "llm.retry_base_delay"),
        Renamed::millis("llm.retry_max_ms", "llm.retry_max_delay"),
        Renamed::to("llm.idle_timeout_secs", "llm.idle_timeout"),
        Renamed::to("delegation.deadline_secs", "delegation.deadline"),
    ];

    /// Checks values that serde cannot; the error names the key.
    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        self.runner_tls.load("runner_tls")?;
        if self.max_tool_iterations == 0 {
            return Err(ConfigError::key(
                "max_tool_iterations",
                "must be at least 1",
            ));
        }
        if !matches!(
            self.llm.backend.as_str(),
            "" | "openai" | "anthropic" | "replay"
        ) {
            return Err(ConfigError::key(
                "llm.backend",
                format!(
                    "`{}` is not one of openai, anthropic, replay",
                    self.llm.backend
                ),
            ));
        }
        if self.llm.max_attempts == 0 {
            return Err(ConfigError::key(
                "llm.max_attempts",
                "must be at least 1 (1: no retries)",
            ));
        }
        if self.llm.retry_max_delay < self.llm.retry_base_delay {
            return Err(ConfigError::key(
                "llm.retry_max_delay",
                format!(
                    "{} is shorter than llm.retry_base_delay ({})",
                    duration::format(self.llm.retry_max_delay),
                    duration::format(self.llm.retry_base_delay)
                ),
            ));
        }
        require_nonzero("llm.idle_timeout", self.llm.idle_timeout)?;
        let c = &self.context;
        if !(c.compact_threshold > 0.0 && c.compact_threshold <= 1.0) {
            return Err(ConfigError::key(
                "context.compact_threshold",
                format!(
                    "{} is not a share of the window in (0, 1]",
                    c.compact_threshold
                ),
            ));
        }
        if !(c.keep_recent_ratio >= 0.0 && c.keep_recent_ratio < c.compact_threshold) {
            return Err(ConfigError::key(
                "context.keep_recent_ratio",
                format!(
                    "{} must be at least 0 and below context.compact_threshold ({})",
                    c.keep_recent_ratio, c.compact_threshold
                ),
            ));
        }
        if c.chars_per_token.is_nan() || c.chars_per_token < 0.5 {
            return Err(ConfigError::key(
                "context.chars_per_token",
                "must be at least 0.5",
            ));
        }
        if c.default_window < 256 {
            return Err(ConfigError::key(
                "context.default_window",
                "must be at least 256 tokens",
            ));
        }
        if let Some((m, _)) = c.windows.iter().find(|(_, w)| **w < 256) {
            return Err(ConfigError::key(
                format!("context.windows.{m}"),
                "must be at least 256 tokens",
            ));
        }
        let b = &self.budget;
        for (key, v) in [
            ("budget.turn_cost", b.turn_cost),
            ("budget.session_cost", b.session_cost),
            ("budget.sub_turn_cost", b.sub_turn_cost),
        ] {
            if v.is_nan() || v < 0.0 {
                return Err(ConfigError::key(key, "must be 0 (none) or more"));
            }
        }
        for (event, list) in self.hooks.events() {
            omicos_hooks::check_handlers(event, list, &self.workspace)
                .map_err(|(key, why)| ConfigError::key(key, why))?;
        }
        if self.tool_calls.parallel_limit == 0 {
            return Err(ConfigError::key(
                "tool_calls.parallel_limit",
                "must be at least 1 (1: every call alone)",
            ));
        }
        // The request travels in one gRPC message (and one runner call):
        // room is kept for the names and the framing.
        let room = (omicos_proto::MAX_MESSAGE_BYTES as u64).saturating_sub(1 << 20);
        let u = &self.uploads;
        if u.max_file_bytes == 0 || u.max_request_bytes == 0 || u.max_files == 0 {
            return Err(ConfigError::key(
                "uploads",
                "max_file_bytes, max_request_bytes and max_files must each be at least 1",
            ));
        }
        if u.max_request_bytes > room {
            return Err(ConfigError::key(
                "uploads.max_request_bytes",
                format!(
                    "{} is more than one gRPC message carries here (at most {room})",
                    u.max_request_bytes
                ),
            ));
        }
        require_nonzero("heartbeat_interval", self.heartbeat_interval)?;
        require_nonzero("delegation.deadline", self.delegation.deadline)?;
        if self.turn_lease < MIN_TURN_LEASE {
            return Err(ConfigError::key(
                "turn_lease",
                format!(
                    "{} is too short: at least {} (it is renewed every third of it)",
                    duration::format(self.turn_lease),
                    duration::format(MIN_TURN_LEASE)
                ),
            ));
        }
        crate::runner_client::parse_targets(&self.tool_runner)
            .map_err(|m| ConfigError::key("tool_runner", m))?;
        require_nonzero("runner_refresh", self.runner_refresh)?;
        self.auth.validate("auth")?;
        if !matches!(
            self.tier.as_str(),
            "community" | "pro_agent" | "pro_cloud" | "lab" | "enterprise"
        ) {
            return Err(ConfigError::key(
                "tier",
                format!("`{}` is not a known tier", self.tier),
            ));
        }
        Ok(())
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    fn metrics_addr(&self) -> Option<&str> {
        Some(self.metrics_addr.as_str()).filter(|a| !a.trim().is_empty())
    }
}
