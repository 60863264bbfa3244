//! The `mcp` section of the runner's config: the MCP servers whose tools the
//! runner offers, and how the runner's own tools are served over MCP.

use omicos_proto::Risk;
use omicos_sandbox::SandboxPolicy;
use omicos_servicekit::config::{ConfigError, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long a server may take to start and answer `initialize` + `tools/list`:
/// `npx` fetching a package on first use takes several seconds.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `tools/call` may take before it is cancelled: long enough for
/// real work, short enough that a hung server does not hold a turn forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `session_idle_timeout`.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The `mcp` section.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// MCP servers whose tools become `mcp__<server>__<tool>`.
    pub servers: Vec<ServerConfig>,
    /// Serving the runner's own tools to MCP clients.
    pub serve: ServeConfig,
}

/// One MCP server. Exactly one of `command` (stdio) and `url` (streamable HTTP).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The server's name: `[a-zA-Z0-9-]` plus single `_`, used in tool names
    /// (`mcp__<name>__<tool>`) and in the toolset `mcp:<name>`.
    pub name: String,
    /// stdio: the program to spawn.
    pub command: Option<String>,
    /// stdio: its arguments.
    pub args: Vec<String>,
    /// stdio: environment added to the runner's.
    pub env: BTreeMap<String, String>,
    /// stdio: working directory (default: the workspace).
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint, e.g. `http://127.0.0.1:3001/mcp`.
    pub url: Option<String>,
    /// Streamable HTTP: extra request headers.
    pub headers: BTreeMap<String, String>,
    /// Streamable HTTP: sent as `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// Longest wait for the server to start and list its tools.
    #[serde(with = "duration")]
    pub startup_timeout: Duration,
    /// Longest a single tool call may run (then it is cancelled).
    #[serde(with = "duration")]
    pub call_timeout: Duration,
    /// One server process (or HTTP session) per chat session, for stateful servers.
    pub per_session: bool,
    /// `per_session`: an instance unused this long is stopped (its session's
    /// next call starts a fresh one); 0: kept until the runner stops.
    #[serde(with = "duration")]
    pub session_idle_timeout: Duration,
    /// Risk of tools not annotated `readOnlyHint: true`: `read`,
    /// `file_write` (default: asked in auto, hidden in read_only), `python`, `shell`.
    pub default_risk: String,
    /// Risk per tool (by the server's tool name), over annotations and `default_risk`.
    pub tool_risk: BTreeMap<String, String>,
    /// Tools of the server (by its own names) that are not offered.
    pub disabled_tools: Vec<String>,
    /// stdio: the sandbox policy the server runs under (`read-only`,
    /// `workspace-write`, `network`, or `danger-full-access`: unconfined, as
    /// the runner). Default: `workspace-write` for `per_session` servers (a
    /// box of the session's, beside its shell), `danger-full-access` for a
    /// shared one, which serves every session and is the operator's own
    /// program. A confined shared server gets a box of its own.
    pub sandbox: Option<SandboxPolicy>,
    /// stdio, confined: directories the server may read besides the system's
    /// and the workspace, e.g. where its package is installed.
    pub sandbox_read: Vec<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            bearer_token: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            per_session: false,
            session_idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
            default_risk: "file_write".into(),
            tool_risk: BTreeMap::new(),
            disabled_tools: Vec::new(),
            sandbox: None,
            sandbox_read: Vec::new(),
        }
    }
}

/// How a server is reached.
#[derive(Clone, Debug, PartialEq)]
pub enum Transport {
    /// Spawned; JSON-RPC over its stdin/stdout.
    Stdio {
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Extra environment.
        env: BTreeMap<String, String>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    Http {
        /// Endpoint.
        url: String,
        /// Extra headers.
        headers: BTreeMap<String, String>,
        /// Sent as `Authorization: Bearer <token>`.
        bearer_token: Option<String>,
    },
}

impl ServerConfig {
    /// The transport (call after [`McpConfig::validate`]).
    pub fn transport(&self) -> Transport {
        match (&self.command, &self.url) {
            (Some(c), _) => Transport::Stdio {
                command: c.clone(),
                args: self.args.clone(),
                env: self.env.clone(),
                cwd: self.cwd.clone(),
            },
            (None, url) => Transport::Http {
                url: url.clone().unwrap_or_default(),
                headers: self.headers.clone(),
                bearer_token: self.bearer_token.clone(),
            },
        }
    }

    /// The sandbox policy of a stdio server (see [`ServerConfig::sandbox`]).
    pub fn sandbox_policy(&self) -> SandboxPolicy {
        self.sandbox.unwrap_or(if self.per_session {
            SandboxPolicy::WorkspaceWrite
        } else {
            SandboxPolicy::DangerFullAccess
        })
    }

    /// The risk of `tool` given its `readOnlyHint`: a per-tool override, else
    /// Read when the hint says read-only, else the server's default.
    pub fn risk_of(&self, tool: &str, read_only_hint: Option<bool>) -> Risk {
        if let Some(r) = self.tool_risk.get(tool).and_then(|r| parse_risk(r).ok()) {
            return r;
        }
        if read_only_hint == Some(true) {
            return Risk::Read;
        }
        parse_risk(&self.default_risk).unwrap_or(Risk::FileWrite)
    }
}

/// Serving the runner's tools over MCP.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Address of the streamable-HTTP endpoint (`POST /mcp`); empty: not served.
    pub listen: String,
    /// Permission mode of calls made by MCP clients: `read_only` (default),
    /// `auto` (approvals become elicitations) or `full`.
    pub permission_mode: String,
    /// Toolsets offered (empty: every tool the mode allows).
    pub toolsets: Vec<String>,
    /// Host names the HTTP endpoint answers (DNS-rebinding guard); empty: loopback only.
    pub allowed_hosts: Vec<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            permission_mode: "read_only".into(),
            toolsets: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// Parses a risk name as used in config.
pub fn parse_risk(s: &str) -> Result<Risk, String> {
    match s {
        "read" => Ok(Risk::Read),
        "file_write" => Ok(Risk::FileWrite),
        "python" => Ok(Risk::Python),
        "shell" => Ok(Risk::Shell),
        other => Err(format!(
            "unknown risk `{other}`; expected read, file_write, python or shell"
        )),
    }
}

/// Whether `name` can be a server name: it becomes part of tool names, so
/// only the model APIs' characters, and no `__` (the separator).
pub fn check_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty server name".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "server name `{name}` may only use a-z, A-Z, 0-9, `_` and `-`"
        ));
    }
    if name.contains("__") || name.starts_with('_') || name.ends_with('_') {
        return Err(format!(
            "server name `{name}` may not contain `__` or start or end with `_` (`__` separates the parts of `mcp__<server>__<tool>`)"
        ));
    }
    if name.len() > 32 {
        return Err(format!(
            "server name `{name}` is longer than 32 characters (tool names are at most 64)"
        ));
    }
    Ok(())
}

impl McpConfig {
    /// Refuses what cannot work; the error names the key under `mcp.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let key = |f: &str| format!("mcp.servers[{i}].{f}");
            check_server_name(&s.name).map_err(|e| ConfigError::key(key("name"), e))?;
            if !seen.insert(s.name.as_str()) {
                return Err(ConfigError::key(
                    key("name"),
                    format!("two servers are named `{}`", s.name),
                ));
            }
            match (&s.command, &s.url) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::key(
                        key("url"),
                        "set either `command` (stdio) or `url` (streamable HTTP), not both",
                    ));
                }
                (None, None) => {
                    return Err(ConfigError::key(
                        key("command"),
                        "set `command` (stdio) or `url` (streamable HTTP)",
                    ));
                }
                (Some(c), None) if c.trim().is_empty() => {
                    return Err(ConfigError::key(key("command"), "empty command"));
                }
                (None, Some(u)) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                    return Err(ConfigError::key(
                        key("url"),
                        format!("expected http:// or https://, got `{u}`"),
                    ));
                }
                _ => {}
            }
            if s.url.is_some() && (s.sandbox.is_some() || !s.sandbox_read.is_empty()) {
                return Err(ConfigError::key(
                    key("sandbox"),
                    "sandbox and sandbox_read are for stdio (`command`) servers: an HTTP server runs elsewhere",
                ));
            }
            if let Some(p) = s.sandbox_read.iter().find(|p| !p.is_absolute()) {
                return Err(ConfigError::key(
                    key("sandbox_read"),
                    format!("`{}` is not an absolute path", p.display()),
                ));
            }
            if s.command.is_some() && (!s.headers.is_empty() || s.bearer_token.is_some()) {
                return Err(ConfigError::key(
                    key("headers"),
                    "headers and bearer_token are for `url` servers",
                ));
            }
            for h in s.headers.keys() {
                if h.eq_ignore_ascii_case("authorization") {
                    return Err(ConfigError::key(
                        key(&format!("headers.{h}")),
                        "set the token with `bearer_token`",
                    ));
                }
                http::HeaderName::from_bytes(h.as_bytes()).map_err(|e| {
                    ConfigError::key(
                        key(&format!("headers.{h}")),
                        format!("not a header name: {e}"),
                    )
                })?;
            }
            require_nonzero(&key("startup_timeout"), s.startup_timeout)?;
            require_nonzero(&key("call_timeout"), s.call_timeout)?;
            parse_risk(&s.default_risk).map_err(|e| ConfigError::key(key("default_risk"), e))?;
            for (t, r) in &s.tool_risk {
                parse_risk(r).map_err(|e| ConfigError::key(key(&format!("tool_risk.{t}")), e))?;
            }
        }
        omicos_proto::PermissionMode::parse(&self.serve.permission_mode)
            .map_err(|e| ConfigError::key("mcp.serve.permission_mode", e.to_string()))?;
        if !self.serve.listen.is_empty()
            && self.serve.listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::key(
                "mcp.serve.listen",
                format!("expected host:port, got `{}`", self.serve.listen),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str) -> ServerConfig {
        ServerConfig {
            name: name.into(),
            command: Some("node".into()),
            ..Default::default()
        }
    }

    #[test]
    fn refuses_bad_servers_naming_the_key() {
        let cfg = |s: ServerConfig| McpConfig {
            servers: vec![s],
            ..Default::default()
        };
        let e = cfg(server("a__b")).validate().unwrap_err().to_string();
        assert!(e.contains("mcp.servers[0].name") && e.contains("__"), "{e}");
        let e = cfg(server("a.b")).validate().unwrap_err().to_string();
        assert!(e.contains("mcp.servers[0].name"), "{e}");
        let mut s = server("a");
        s.url = Some("http://x/mcp".into());
        let e = cfg(s).validate().unwrap_err().to_string();
        assert!(e.contains("not both"), "{e}");
        let mut s = server("a");
        s.default_risk = "high".into();
        let e = cfg(s).validate().unwrap_err().to_string();
        assert!(e.contains("mcp.servers[0].default_risk"), "{e}");
        let e = McpConfig {
            servers: vec![server("a"), server("a")],
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("mcp.servers[1].name"), "{e}");
        let mut c = McpConfig::default();
        c.serve.permission_mode = "yolo".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("mcp.serve.permission_mode")
        );
        assert!(McpConfig::default().validate().is_ok());
    }

    #[test]
    fn risk_from_hint_default_and_override() {
        let mut s = server("fs");
        s.tool_risk.insert("move_file".into(), "shell".into());
        assert_eq!(s.risk_of("read_file", Some(true)), Risk::Read);
        assert_eq!(s.risk_of("write_file", Some(false)), Risk::FileWrite);
        assert_eq!(s.risk_of("write_file", None), Risk::FileWrite);
        assert_eq!(s.risk_of("move_file", Some(true)), Risk::Shell);
        s.default_risk = "read".into();
        assert_eq!(s.risk_of("anything", None), Risk::Read);
    }

    #[test]
    fn reserved_headers_are_refused() {
        let mut s = ServerConfig {
            name: "h".into(),
            url: Some("http://127.0.0.1:1/mcp".into()),
            ..Default::default()
        };
        s.headers.insert("Authorization".into(), "Bearer x".into());
        let e = McpConfig {
            servers: vec![s],
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("mcp.servers[0].headers.Authorization") && e.contains("bearer_token"),
            "{e}"
        );
    }
}
