//! The runner's configuration: defaults, then a YAML file, then `OMICOS_*`
//! environment variables (see `omicos_servicekit::config`).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Everything the tool-runner reads at start.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (ToolRunner, Registry, health and reflection).
    pub listen: String,
    /// Where the Registry is served apart from `listen`, e.g. `0.0.0.0:7011`:
    /// then `listen` serves ToolRunner only, and a network policy can let
    /// providers reach the registry and nothing else of the runner (deploy/
    /// does). Empty (the default): the Registry shares `listen`.
    pub registry_listen: String,
    /// Workspace root every file path is confined to.
    pub workspace: PathBuf,
    /// How long a call waits for the user's approval before it counts as denied.
    #[serde(with = "duration")]
    pub approval_timeout: Duration,
    /// Command hooks, in the Claude Code settings shape.
    pub hooks: HooksConfig,
    /// Whether a PreToolUse hook that times out blocks the call (fail closed).
    pub pre_tool_use_timeout_blocks: bool,
    /// Providers known from config (never expire); described at start and retried.
    pub providers: Vec<StaticProvider>,
    /// How long a registered provider instance lives without a heartbeat
    /// (when it asks for no TTL of its own).
    #[serde(with = "duration")]
    pub registry_ttl: Duration,
    /// The longest TTL a registration may ask for; longer asks are cut to it
    /// (a provider that stops heartbeating is gone within this).
    #[serde(with = "duration")]
    pub registry_max_ttl: Duration,
    /// Tool name → the provider that may serve it, for handing a tool over
    /// from the provider that first registered it (or claiming one before it
    /// registers). Without an entry, a tool name belongs to the first provider
    /// that registered it, and names served in-process are never taken.
    pub registry_tool_owners: std::collections::BTreeMap<String, String>,
    /// Where the registry lives when several runner replicas share it:
    /// `postgres://…`. Empty (the default): in this process's memory only.
    pub registry_store_url: String,
    /// How often a replica re-reads the shared registry in full, in case a
    /// notification was missed (notifications do the real work).
    #[serde(with = "duration")]
    pub registry_resync: Duration,
    /// Where `GET /metrics` (Prometheus) is served, e.g. `0.0.0.0:9464`. Empty: not served.
    pub metrics_addr: String,
    /// Memory scope passed to providers in every call context.
    pub memory_scope: String,
    /// Who shares a memory (issue 39): `principal` (the default) gives each
    /// principal its own (`<tenant scope>/principal/<subject>`), so one
    /// person's memories never reach a colleague's agent; `tenant` shares one
    /// memory among every principal of a tenant (the behaviour before), an
    /// explicit per-deployment choice. The laptop's principal (`local`, and
    /// calls with no forwarded principal) keeps the tenant's scope, so the
    /// rows it wrote before stay its own.
    pub memory_sharing: String,
    /// `memory_sharing` per agent id, over the deployment's: an agent that
    /// keeps a team's shared notes can be `tenant` while the rest stay
    /// `principal` (or the other way round).
    pub memory_sharing_agents: std::collections::BTreeMap<String, String>,
    /// Longest a shell command may run (also the cap of a call's own timeout).
    #[serde(with = "duration")]
    pub shell_timeout: Duration,
    /// Bytes of stdout+stderr a shell command keeps; the rest is dropped.
    pub shell_output_cap_bytes: usize,
    /// Permission mode used when a call names none. `read_only` by default,
    /// because a network service cannot assume a client able to answer approvals.
    pub default_permission_mode: String,
    /// Results of at least this many bytes are spooled to the workspace.
    pub spool_threshold_bytes: usize,
    /// How long a call runs on after its Execute stream dropped without a
    /// cancel (its orchestrator was lost), waiting for an orchestrator to
    /// re-attach by call id; also how long a finished call's result is kept
    /// for one. Longer than the orchestrators' `turn_lease` plus their
    /// recovery sweep, so a survivor can take the turn over in time.
    #[serde(with = "duration")]
    pub reattach_grace: Duration,
    /// Grace period of the drain on SIGINT/SIGTERM.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// How `shell` commands are confined (policy, roots, limits).
    pub sandbox: omicos_sandbox::SandboxConfig,
    /// The deployment's service secret (`OMICOS_SERVICE_SECRET`): required of
    /// every caller (Execute and ListTools only from the orchestrator,
    /// Register/Heartbeat/Deregister only from providers) and sent to
    /// providers. Empty: nothing is checked (a warning at start).
    pub service_secret: String,
    /// TLS, both ways (`tls.cert`, `tls.key`, `tls.ca`, `tls.client_ca`):
    /// the runner's port serves TLS with `cert`/`key`, and with `client_ca`
    /// only callers presenting a certificate from that CA get in (mutual
    /// TLS, in place of the secret). `ca` verifies `https://` providers and
    /// `cert`/`key` is also the runner's client certificate to them.
    pub tls: omicos_servicekit::TlsConfig,
    /// MCP servers whose tools the runner offers, and serving its tools over MCP.
    pub mcp: omicos_mcp::McpConfig,
    /// The deployment's permission rules (`permissions: {allow, ask, deny}`,
    /// Claude Code's syntax): deny, then ask, then allow, first match wins.
    /// Agents' frontmatter adds to them; a ChatRequest can only narrow them.
    pub permissions: omicos_rules::RuleLists,
    /// Remote A2A agents `call_agent` can name (`a2a_agents: {<name>: {url,
    /// card_url, auth, description, risk, timeout, max_answer_bytes}}`),
    /// each served as the tool `a2a__<name>` through this pipeline.
    pub a2a_agents: std::collections::BTreeMap<String, crate::providers::a2a::A2aAgentConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7001".into(),
            registry_listen: String::new(),
            workspace: PathBuf::from("."),
            approval_timeout: Duration::from_secs(300),
            hooks: HooksConfig::default(),
            pre_tool_use_timeout_blocks: true,
            providers: Vec::new(),
            registry_ttl: Duration::from_secs(30),
            registry_max_ttl: Duration::from_secs(300),
            registry_tool_owners: Default::default(),
            registry_store_url: String::new(),
            registry_resync: Duration::from_secs(30),
            metrics_addr: String::new(),
            memory_scope: "workspace".into(),
            memory_sharing: "principal".into(),
            memory_sharing_agents: Default::default(),
            shell_timeout: Duration::from_secs(120),
            shell_output_cap_bytes: 1 << 20,
            default_permission_mode: "read_only".into(),
            spool_threshold_bytes: crate::pipeline::shape::SPOOL_THRESHOLD_BYTES,
            reattach_grace: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(10),
            sandbox: omicos_sandbox::SandboxConfig::default(),
            service_secret: String::new(),
            tls: Default::default(),
            mcp: omicos_mcp::McpConfig::default(),
            permissions: omicos_rules::RuleLists::default(),
            a2a_agents: Default::default(),
        }
    }
}

/// A provider service named in config (`providers: [{name, endpoint}]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticProvider {
    /// Provider name (used until Describe answers).
    pub name: String,
    /// `http://host:port`.
    pub endpoint: String,
}

/// Hooks per event, exactly as in Claude Code's `settings.json` `hooks` object,
/// so existing hook configurations can be pasted in unchanged.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HooksConfig {
    /// Before a tool runs: may allow, deny, ask, rewrite the input, add context.
    #[serde(rename = "PreToolUse")]
    pub pre_tool_use: Vec<HookMatcher>,
    /// When the user would be asked for approval: may allow or deny for them.
    #[serde(rename = "PermissionRequest")]
    pub permission_request: Vec<HookMatcher>,
    /// After a tool succeeded: may block or replace the output, add context.
    #[serde(rename = "PostToolUse")]
    pub post_tool_use: Vec<HookMatcher>,
    /// After a tool failed: may add context.
    #[serde(rename = "PostToolUseFailure")]
    pub post_tool_use_failure: Vec<HookMatcher>,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "SessionStart", default)]
    pub session_start: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "SessionEnd", default)]
    pub session_end: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "UserPromptSubmit", default)]
    pub user_prompt_submit: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "Stop", default)]
    pub stop: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "SubagentStart", default)]
    pub subagent_start: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "SubagentStop", default)]
    pub subagent_stop: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "PreCompact", default)]
    pub pre_compact: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "PostCompact", default)]
    pub post_compact: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "Notification", default)]
    pub notification: serde_json::Value,
    /// The orchestrator's (ignored here: one `hooks` section serves both).
    #[serde(rename = "PermissionDenied", default)]
    pub permission_denied: serde_json::Value,
}

pub use omicos_hooks::{HookHandler, HookMatcher};

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[
        Renamed::to("approval_timeout_secs", "approval_timeout"),
        Renamed::to("registry_ttl_secs", "registry_ttl"),
        Renamed::to("shell_timeout_secs", "shell_timeout"),
        Renamed::to("shutdown_grace_secs", "shutdown_grace"),
    ];

    /// Checks what serde cannot: regexes, modes, hook kinds, durations. The
    /// error names the key.
    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        omicos_proto::PermissionMode::parse(&self.default_permission_mode)
            .map_err(|e| ConfigError::key("default_permission_mode", e.to_string()))?;
        let sharing = std::iter::once(("memory_sharing".to_owned(), &self.memory_sharing)).chain(
            self.memory_sharing_agents.iter().map(|(a, v)| {
                (
                    format!("memory_sharing_agents.{}", crate::pipeline::bounded_text(a)),
                    v,
                )
            }),
        );
        for (key, value) in sharing {
            if !matches!(value.as_str(), "principal" | "tenant") {
                return Err(ConfigError::key(
                    key,
                    format!(
                        "is `{}`: principal (each principal its own memory) or tenant (one per tenant)",
                        crate::pipeline::bounded_text(value)
                    ),
                ));
            }
        }
        for (event, list) in self.hooks.events() {
            for (i, m) in list.iter().enumerate() {
                omicos_hooks::compile_matcher(&m.matcher).map_err(|e| {
                    ConfigError::key(format!("hooks.{event}[{i}].matcher"), e.to_string())
                })?;
            }
            omicos_hooks::check_handlers(event, list, &self.workspace)
                .map_err(|(key, why)| ConfigError::key(key, why))?;
        }
        for (i, p) in self.providers.iter().enumerate() {
            if !(p.endpoint.starts_with("http://") || p.endpoint.starts_with("https://")) {
                return Err(ConfigError::key(
                    format!("providers[{i}].endpoint"),
                    format!("expected http://host:port, got `{}`", p.endpoint),
                ));
            }
        }
        self.sandbox
            .validate()
            .map_err(|e| ConfigError::key(format!("sandbox.{}", e.key), e.reason))?;
        self.mcp.validate()?;
        // Each message starts with the key it is about.
        crate::providers::a2a::validate(&self.a2a_agents).map_err(|e| {
            match e.split_once(": ") {
                Some((k, why)) => ConfigError::key(k, why),
                None => ConfigError::key("a2a_agents", e),
            }
        })?;
        for (list, rules) in [
            ("allow", &self.permissions.allow),
            ("ask", &self.permissions.ask),
            ("deny", &self.permissions.deny),
        ] {
            for (i, r) in rules.iter().enumerate() {
                omicos_rules::Rule::parse(r, omicos_rules::Source::Deployment).map_err(|e| {
                    ConfigError::key(format!("permissions.{list}[{i}]"), e.to_string())
                })?;
            }
        }
        require_nonzero("registry_ttl", self.registry_ttl)?;
        require_nonzero("registry_resync", self.registry_resync)?;
        require_nonzero("registry_max_ttl", self.registry_max_ttl)?;
        let url = self.registry_store_url.trim();
        if !(url.is_empty() || url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::key(
                "registry_store_url",
                format!("expected postgres://… (or empty for the in-memory registry), got `{url}`"),
            ));
        }
        require_nonzero("shell_timeout", self.shell_timeout)?;
        require_nonzero("approval_timeout", self.approval_timeout)?;
        Ok(())
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    fn metrics_addr(&self) -> Option<&str> {
        Some(self.metrics_addr.as_str()).filter(|a| !a.trim().is_empty())
    }
}

impl HooksConfig {
    /// The four events with their matchers, for iteration.
    pub fn events(&self) -> [(&'static str, &Vec<HookMatcher>); 4] {
        [
            ("PreToolUse", &self.pre_tool_use),
            ("PermissionRequest", &self.permission_request),
            ("PostToolUse", &self.post_tool_use),
            ("PostToolUseFailure", &self.post_tool_use_failure),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str, env: &[(&str, &str)]) -> Result<Config, String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("runner.yaml");
        std::fs::write(&file, yaml).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        omicos_servicekit::load_config(Some(&file), &env).map_err(|e| e.to_string())
    }

    /// Claude Code's convention, a script under the project directory, is
    /// code the agent can write: refused, with the key and the reason.
    #[test]
    fn a_hook_script_in_the_workspace_is_refused() {
        for command in ["$CLAUDE_PROJECT_DIR/.claude/hooks/check.sh", "./log.sh"] {
            let yaml = format!(
                "hooks:\n  PostToolUse:\n    - matcher: \"\"\n      hooks: [{{type: command, command: \"{command}\"}}]\n"
            );
            let e = load(&yaml, &[]).unwrap_err();
            assert!(
                e.contains("hooks.PostToolUse[0].hooks[0].command") && e.contains("sandbox"),
                "{command}: {e}"
            );
        }
    }

    #[test]
    fn claude_code_hook_settings_load_unchanged() {
        let cfg = load(
            r#"
hooks:
  PreToolUse:
    - matcher: "Bash|shell"
      hooks:
        - type: command
          command: "/etc/omicos/hooks/check.sh"
          timeout: 30
  PostToolUse:
    - matcher: ""
      hooks: [{type: command, command: "/usr/local/bin/log.sh"}]
providers:
  - {name: kernel, endpoint: "http://127.0.0.1:7010"}
"#,
            &[
                ("OMICOS_APPROVAL_TIMEOUT", "42"),
                ("OMICOS_DEFAULT_PERMISSION_MODE", "auto"),
            ],
        )
        .unwrap();
        assert_eq!(
            cfg.hooks.pre_tool_use[0].hooks[0].timeout,
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            cfg.hooks.pre_tool_use[0].hooks[0].kind,
            omicos_hooks::HandlerKind::Command
        );
        assert_eq!(cfg.hooks.post_tool_use[0].hooks[0].timeout, None);
        assert_eq!(
            cfg.providers,
            vec![StaticProvider {
                name: "kernel".into(),
                endpoint: "http://127.0.0.1:7010".into()
            }]
        );
        assert_eq!(cfg.approval_timeout, Duration::from_secs(42));
        assert_eq!(cfg.default_permission_mode, "auto");
        assert_eq!(Config::default().default_permission_mode, "read_only");
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = load(
            "hooks:\n  PreToolUse:\n    - matcher: \"(\"\n      hooks: []\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("hooks.PreToolUse[0].matcher"), "{e}");
        let e = load("hooks:\n  OnSomething: []\n", &[]).unwrap_err();
        assert!(e.contains("hooks.OnSomething"), "{e}");
        let e = load("default_permission_mode: yolo\n", &[]).unwrap_err();
        assert!(e.contains("default_permission_mode"), "{e}");
        let e = load("registry_store_url: redis://x\n", &[]).unwrap_err();
        assert!(e.contains("registry_store_url"), "{e}");
        let cfg = load(
            "",
            &[
                ("OMICOS_REGISTRY_STORE_URL", "postgres://h/db"),
                ("OMICOS_METRICS_ADDR", "127.0.0.1:9464"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.registry_store_url, "postgres://h/db");
        assert_eq!(
            omicos_servicekit::ServiceConfig::metrics_addr(&cfg),
            Some("127.0.0.1:9464")
        );
        let e = load("providers: [{name: k, endpoint: \"127.0.0.1:1\"}]\n", &[]).unwrap_err();
        assert!(e.contains("providers[0].endpoint"), "{e}");
        let e = load(
            "hooks:\n  PreToolUse:\n    - hooks: [{type: prompt, command: x}]\n",
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains("hooks.PreToolUse[0].hooks[0].type") && e.contains("`command` or `http`"),
            "{e}"
        );
        let e = load(
            "hooks:\n  PreToolUse:\n    - hooks: [{type: http, url: \"ftp://x\"}]\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("hooks.PreToolUse[0].hooks[0].url"), "{e}");
    }

    #[test]
    fn permission_rules_load_from_the_file_and_the_environment() {
        let cfg = load(
            "permissions:\n  allow: [\"shell(git status)\"]\n  deny: [\"shell(rm:*)\"]\n",
            &[("OMICOS_PERMISSIONS_ASK", "shell(git push:*), web_fetch")],
        )
        .unwrap();
        assert_eq!(cfg.permissions.allow, vec!["shell(git status)"]);
        assert_eq!(cfg.permissions.ask, vec!["shell(git push:*)", "web_fetch"]);
        assert_eq!(cfg.permissions.deny, vec!["shell(rm:*)"]);
        let e = load("permissions:\n  deny: [ok, \"shell(\"]\n", &[]).unwrap_err();
        assert!(
            e.contains("permissions.deny[1]") && e.contains("`shell(`"),
            "{e}"
        );
        let e = load("permissions:\n  maybe: []\n", &[]).unwrap_err();
        assert!(e.contains("maybe"), "{e}");
    }

    #[test]
    fn old_key_names_load_for_one_release() {
        let cfg = load(
            "approval_timeout_secs: 7\nshutdown_grace_secs: 3\n",
            &[("OMICOS_SHELL_TIMEOUT_SECS", "9")],
        )
        .unwrap();
        assert_eq!(cfg.approval_timeout, Duration::from_secs(7));
        assert_eq!(cfg.shutdown_grace, Duration::from_secs(3));
        assert_eq!(cfg.shell_timeout, Duration::from_secs(9));
        let e = load("registry_ttl: 0s\n", &[]).unwrap_err();
        assert!(
            e.contains("`registry_ttl`") && e.contains("more than 0"),
            "{e}"
        );
        let e = load(
            "hooks:\n  PreToolUse:\n    - hooks: [{command: x, timeout: 0}]\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("hooks.PreToolUse[0].hooks[0].timeout"), "{e}");
    }
}
