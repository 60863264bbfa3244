//! A hook handler's config, as in Claude Code's settings.

use omicos_servicekit::config::duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The longest a handler runs without a timeout of its own, as in Claude Code.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How a handler is reached.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    /// Run with `sh -c` (in [`crate::HOOK_CWD`]), the event's JSON on stdin.
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

/// The variables a `command` hook gets that name the workspace.
const WORKSPACE_VARS: [&str; 2] = ["CLAUDE_PROJECT_DIR", "OMICOS_WORKSPACE"];

/// Checks the handlers of one event's `matchers` (`event` as configured,
/// e.g. `PreToolUse`) as a service must before it runs them: each one's own
/// settings ([`HookHandler::validate`]) and, since a hook runs outside the
/// sandbox, that none of its code comes from the workspace the agent writes
/// ([`HookHandler::check_outside`]). Err: the config key
/// (`hooks.<event>[i].hooks[j].<field>`) and why.
pub fn check_handlers(
    event: &str,
    matchers: &[HookMatcher],
    workspace: &Path,
) -> Result<(), (String, String)> {
    for (i, m) in matchers.iter().enumerate() {
        for (j, h) in m.hooks.iter().enumerate() {
            h.validate()
                .and_then(|()| h.check_outside(workspace))
                .map_err(|(field, why)| (format!("hooks.{event}[{i}].hooks[{j}].{field}"), why))?;
        }
    }
    Ok(())
}

impl HookHandler {
    /// Refuses a `command` whose code could come from `workspace`: a hook
    /// runs outside the box, with the service's rights and environment,
    /// and the agent writes the workspace (its file tools, its box), so a
    /// script there is code the agent chooses. Refused: a word that names
    /// the workspace's variables (`$CLAUDE_PROJECT_DIR/.claude/hooks/x.sh`,
    /// Claude Code's own convention), a path under `workspace`, and a
    /// relative path (`./check.sh`, `hooks/check.sh`: the command runs in
    /// [`crate::HOOK_CWD`], never in the workspace, so such a path would
    /// not mean what it says). `(field, reason)`, as [`Self::validate`].
    pub fn check_outside(&self, workspace: &Path) -> Result<(), (&'static str, String)> {
        if self.kind != HandlerKind::Command {
            return Ok(());
        }
        let ws = workspace
            .canonicalize()
            .unwrap_or_else(|_| workspace.to_path_buf());
        let refuse = |word: &str, why: &str| {
            Err((
                "command",
                format!(
                    "`{word}` {why}: a command hook runs outside the sandbox with the service's \
                     rights, and the agent writes the workspace; give the absolute path of a \
                     script outside it (the workspace is in $OMICOS_WORKSPACE and the event's \
                     `cwd`, to read, not to run)"
                ),
            ))
        };
        for (word, program) in words(&self.command) {
            let word = word.as_str();
            if WORKSPACE_VARS.iter().any(|v| word.contains(v)) {
                return refuse(word, "names the workspace");
            }
            let path = Path::new(word);
            if path.is_absolute() {
                let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
                if real.starts_with(&ws) || path.starts_with(workspace) {
                    return refuse(word, "is in the workspace");
                }
            } else if word.contains('/')
                && !word.starts_with('~')
                && !word.starts_with('$')
                && (program || word.starts_with("./") || word.starts_with("../"))
            {
                return refuse(word, "is a relative path");
            }
        }
        Ok(())
    }
}

/// The words of a shell command, roughly: split at blanks and at the
/// operators that start a new command, quotes dropped; each with whether
/// it is a command's program (its first word after any `VAR=value`).
fn words(command: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for part in command.split([';', '|', '&', '\n', '(', ')', '`']) {
        let mut program = true;
        for w in part.split(|c: char| c.is_whitespace() || c == '<' || c == '>') {
            let w: String = w.chars().filter(|c| !matches!(c, '\'' | '"')).collect();
            if w.is_empty() {
                continue;
            }
            let assignment = program
                && w.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            out.push((w, program && !assignment));
            if !assignment {
                program = false;
            }
        }
    }
    out
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
    fn a_command_may_not_run_code_from_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        let refused = [
            "$CLAUDE_PROJECT_DIR/.claude/hooks/check.sh".to_owned(),
            "\"${CLAUDE_PROJECT_DIR}\"/hooks/x.sh".to_owned(),
            "python3 $OMICOS_WORKSPACE/guard.py".to_owned(),
            "./check.sh".to_owned(),
            "hooks/check-shell.sh".to_owned(),
            "cat >/dev/null; sh ./hooks/x.sh".to_owned(),
            "jq . | ../x.sh".to_owned(),
            format!("{}/hooks/x.sh", w.display()),
            format!("python3 {}/guard.py", w.display()),
        ];
        for c in &refused {
            let e = HookHandler::command(c.clone()).check_outside(w);
            assert_eq!(e.as_ref().map_err(|e| e.0), Err("command"), "{c}");
        }
        for c in [
            "/etc/omicos/hooks/check.sh",
            "cat >/dev/null; echo from command",
            "jq -r .tool_input.command | grep -q 'rm -rf /' && exit 2; exit 0",
            "exit 2",
            "~/hooks/x.sh",
            "python3 guard.py",
        ] {
            HookHandler::command(c)
                .check_outside(w)
                .unwrap_or_else(|e| panic!("{c}: {e:?}"));
        }
        HookHandler::http("http://127.0.0.1:1/h")
            .check_outside(w)
            .unwrap();
    }

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
