//! Orchestrator configuration (defaults → YAML file → `OMICOS_*` environment).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The orchestrator's settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address (`OMICOS_LISTEN`).
    pub listen: String,
    /// Workspace root shared with the tool-runner and kernels (`OMICOS_WORKSPACE`).
    pub workspace: PathBuf,
    /// The tool-runner's endpoint (`OMICOS_TOOL_RUNNER`).
    pub tool_runner: String,
    /// Conversation store: `sqlite://path`, `postgres://…`, or `memory:`.
    /// Empty: `sqlite://<workspace>/.omicos/sessions.db`.
    pub store_url: String,
    /// The model.
    pub llm: LlmConfig,
    /// Model calls with tool calls per turn before the turn stops (`max_iterations`).
    pub max_tool_iterations: u32,
    /// Seconds between heartbeats on a Chat stream.
    pub heartbeat_secs: u64,
    /// call_agent limits.
    pub delegation: DelegationConfig,
    /// Subscription tier of the deployment: community, pro_agent, pro_cloud, lab, enterprise.
    pub tier: String,
    /// Agent catalog cache directory; empty: `~/.omicos/cloud-agents/agents`.
    pub agent_cache_dir: String,
    /// Skill roots (colon-separated, like OMICOS_SKILL_ROOTS).
    pub skill_roots: String,
    /// Grace period of the drain on shutdown, seconds.
    pub grace_secs: u64,
    /// How long a turn lease lasts without renewal, seconds (replicas).
    pub turn_lease_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7000".into(),
            workspace: PathBuf::from("omicos-workspace"),
            tool_runner: "http://127.0.0.1:7001".into(),
            store_url: String::new(),
            llm: LlmConfig::default(),
            max_tool_iterations: 100,
            heartbeat_secs: 15,
            delegation: DelegationConfig::default(),
            tier: "community".into(),
            agent_cache_dir: String::new(),
            skill_roots: String::new(),
            grace_secs: 10,
            turn_lease_secs: 60,
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
    /// First retry delay, ms.
    pub retry_base_ms: u64,
    /// Longest retry delay, ms.
    pub retry_max_ms: u64,
    /// A stream with no data for this long is broken, seconds.
    pub idle_timeout_secs: u64,
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
            retry_base_ms: 500,
            retry_max_ms: 20_000,
            idle_timeout_secs: 120,
        }
    }
}

/// call_agent limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DelegationConfig {
    /// Deepest delegation chain.
    pub max_depth: u32,
    /// Wall-clock limit of one delegation, seconds.
    pub deadline_secs: u64,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        Self {
            max_depth: 6,
            deadline_secs: 900,
        }
    }
}

impl Config {
    /// Checks values that serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_tool_iterations == 0 {
            return Err("config key `max_tool_iterations`: must be at least 1".into());
        }
        if !matches!(
            self.llm.backend.as_str(),
            "" | "openai" | "anthropic" | "replay"
        ) {
            return Err(format!(
                "config key `llm.backend`: `{}` is not one of openai, anthropic, replay",
                self.llm.backend
            ));
        }
        if !self.tool_runner.starts_with("http://") && !self.tool_runner.starts_with("https://") {
            return Err(format!(
                "config key `tool_runner`: `{}` is not an http(s) URL",
                self.tool_runner
            ));
        }
        if !matches!(
            self.tier.as_str(),
            "community" | "pro_agent" | "pro_cloud" | "lab" | "enterprise"
        ) {
            return Err(format!(
                "config key `tier`: `{}` is not a known tier",
                self.tier
            ));
        }
        Ok(())
    }
}
