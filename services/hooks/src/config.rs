//! A hook handler's config, as in Claude Code's settings.

use omicos_servicekit::config::duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The longest a handler runs without a timeout of its own, as in Claude Code.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How a handler is reached.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    /// Run with `sh -c` in the workspace, the event's JSON on stdin.
    #[default]
    Command,
    /// POST the event's JSON to `url`; the answer's body is read as a
    /// command's stdout would be.
    Http,
}

/// One hook handler, as in Claude Code's settings: `command` runs with
/// `sh -c`, the event's JSON on stdin; `http` POSTs the same JSON to `url`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HookHandler {
    /// `command` (the default) or `http`.
    #[serde(rename = "type")]
    pub kind: HandlerKind,
    /// `command`: run with `sh -c`, the event's JSON on stdin.
    pub command: String,
    /// `http`: where the event's JSON is POSTed.
    pub url: String,
    /// `http`: extra request headers; `$VAR` and `${VAR}` in a value are
    /// expanded from the environment.
    pub headers: BTreeMap<String, String>,
    /// `http`: the variables a header may expand (Claude Code's
    /// `allowedEnvVars`); others expand to nothing. Absent: any variable.
    #[serde(rename = "allowedEnvVars", skip_serializing_if = "Option::is_none")]
    pub allowed_env_vars: Option<Vec<String>>,
    /// Seconds (a number, as in Claude Code) or a value with a unit
    /// (`500ms`, `5s`); default 60 s.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Claude Code's spinner text: accepted so its settings paste in
    /// unchanged, and otherwise unused.
    #[serde(rename = "statusMessage", skip_serializing_if = "String::is_empty")]
    pub status_message: String,
}

impl HookHandler {
    /// A `command` handler.
    pub fn command(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Default::default()
        }
    }

    /// An `http` handler.
    pub fn http(url: impl Into<String>) -> Self {
        Self {
            kind: HandlerKind::Http,
            url: url.into(),
            ..Default::default()
        }
    }

    /// Its timeout, or the default.
    pub fn limit(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }

    /// What the handler is, for logs and records: the command or the url.
    pub fn label(&self) -> &str {
        match self.kind {
            HandlerKind::Command => &self.command,
            HandlerKind::Http => &self.url,
        }
    }

    /// What serde cannot check: `(field, reason)` of the first problem.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        match self.kind {
            HandlerKind::Command if self.command.trim().is_empty() => {
                return Err(("command", "a `command` hook needs a command".into()));
            }
            HandlerKind::Http
                if !(self.url.starts_with("http://") || self.url.starts_with("https://")) =>
            {
                return Err((
                    "url",
                    format!("an `http` hook needs an http(s) url, got `{}`", self.url),
                ));
            }
            _ => {}
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(("timeout", "must be more than 0".into()));
        }
        Ok(())
    }
}

/// Handlers of one event whose matcher matches.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HookMatcher {
    /// What the event is matched on (a tool's name, a session's source, an
    /// agent, ...): an anchored regex; empty or `*` match all.
    pub matcher: String,
    /// The handlers.
    pub hooks: Vec<HookHandler>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_settings_parse_with_either_timeout_form() {
        let m: HookMatcher = serde_json::from_value(serde_json::json!({
            "matcher": "Bash",
            "hooks": [
                {"type": "command", "command": "./check.sh", "timeout": 5, "statusMessage": "checking"},
                {"type": "http", "url": "http://127.0.0.1:1/h", "timeout": "500ms",
                 "headers": {"Authorization": "Bearer $TOKEN"}, "allowedEnvVars": ["TOKEN"]},
                {"command": "./default-kind.sh"}
            ]
        }))
        .unwrap();
        assert_eq!(m.hooks[0].limit(), Duration::from_secs(5));
        assert_eq!(m.hooks[1].kind, HandlerKind::Http);
        assert_eq!(m.hooks[1].limit(), Duration::from_millis(500));
        assert_eq!(m.hooks[2].kind, HandlerKind::Command);
        assert!(m.hooks.iter().all(|h| h.validate().is_ok()));
    }

    #[test]
    fn bad_handlers_name_the_field() {
        assert_eq!(
            HookHandler::command(" ").validate().unwrap_err().0,
            "command"
        );
        assert_eq!(
            HookHandler::http("ftp://x").validate().unwrap_err().0,
            "url"
        );
        let h = HookHandler {
            timeout: Some(Duration::ZERO),
            ..HookHandler::command("x")
        };
        assert_eq!(h.validate().unwrap_err().0, "timeout");
        let e = serde_json::from_value::<HookHandler>(serde_json::json!({"type": "grpc"}));
        assert!(e.unwrap_err().to_string().contains("unknown variant"));
    }
}
