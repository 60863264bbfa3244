//! Orchestrator configuration (defaults → YAML file → `OMICOS_*` environment).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
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
}
