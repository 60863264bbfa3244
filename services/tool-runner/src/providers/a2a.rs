//! Remote A2A agents (config `a2a_agents`), one tool `a2a__<name>` each, so
//! that a `call_agent` naming a remote agent goes through the pipeline like
//! any other call: risk, rules, hooks, approval, audit.
//!
//! A call sends the message (A2A 1.0 `SendMessage` over JSON-RPC with
//! `A2A-Version: 1.0`, or 0.3's `message/send` when the agent's card says
//! 0.3), polls the task (`GetTask`/`tasks/get`) until it is terminal, and
//! answers with the task's text (artifacts, then the final status message).
//! A cancelled call or one past its `timeout` sends `CancelTask`.
//!
//! Egress: only the configured `url` is ever called (never a URL the model
//! or the card names), redirects are not followed, and the answer is
//! untrusted tool output: the body read is bounded, the text cut to
//! `max_answer_bytes`.

use async_trait::async_trait;
use omicos_proto::{Risk, ToolSpec};
use omicos_servicekit::config::duration;
use omicos_toolkit::{CallCtx, Provider, ToolError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The prefix of a remote agent's tool name: `a2a__<name>`.
pub const TOOL_PREFIX: &str = "a2a__";
/// The provider (and toolset) name of remote agents.
pub const PROVIDER: &str = "a2a";
/// Where an agent's card is when `card_url` is not set (A2A's well-known URI).
const WELL_KNOWN_CARD: &str = "/.well-known/agent-card.json";
/// One HTTP exchange with the remote (a send, a poll, a cancel); the task
/// as a whole is bounded by the agent's `timeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Reading the card at start must not hold the runner up for long.
const CARD_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a cancelled call waits for the remote to take `CancelTask`.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause between two polls; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between two polls.
const POLL_MAX: Duration = Duration::from_secs(1);
/// A JSON-RPC body larger than this is refused (a task's JSON is read
/// whole before its text is cut to `max_answer_bytes`).
const MAX_BODY_BYTES: usize = 16 << 20;
/// The card's text that reaches a tool description (and `list_agents`).
const MAX_CARD_TEXT: usize = 2000;

/// One remote A2A agent, as configured (`a2a_agents: {<name>: …}`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct A2aAgentConfig {
    /// The JSON-RPC endpoint, e.g. `https://agents.example.com/a2a`. The
    /// only address a call reaches.
    pub url: String,
    /// The Agent Card; empty: `<origin of url>/.well-known/agent-card.json`.
    pub card_url: String,
    /// The credential sent with every request.
    pub auth: A2aAuth,
    /// What `list_agents` says of the agent; empty: the card's description.
    pub description: String,
    /// The risk a call carries through the permission gate: `read`,
    /// `file_write`, `python` (the default: the agent acts with its own
    /// tools, as code omicos did not write), `shell`, `memory_write`.
    pub risk: String,
    /// Longest a call waits for the task to end; then it is cancelled.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Bytes of the answer's text kept; the rest is cut with a marker.
    pub max_answer_bytes: usize,
}

impl Default for A2aAgentConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            card_url: String::new(),
            auth: A2aAuth::default(),
            description: String::new(),
            risk: "python".into(),
            timeout: Duration::from_secs(300),
            max_answer_bytes: 64 << 10,
        }
    }
}

/// The credential of a remote agent.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct A2aAuth {
    /// An environment variable holding a bearer token
    /// (`Authorization: Bearer <token>`), read at start.
    pub bearer_env: String,
    /// Headers sent as they are (`${VAR}` expands as everywhere in config).
    pub headers: BTreeMap<String, String>,
}

/// The checks of `a2a_agents` at start; each error names its key.
pub fn validate(agents: &BTreeMap<String, A2aAgentConfig>) -> Result<(), String> {
    for (name, a) in agents {
        let key = format!("a2a_agents.{name}");
        if name.is_empty()
            || name.len() > 48
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "{key}: a remote agent's name is 1 to 48 letters, digits, `_` or `-`"
            ));
        }
        for (field, u) in [("url", &a.url), ("card_url", &a.card_url)] {
            if u.is_empty() && field == "card_url" {
                continue;
            }
            let parsed = url::Url::parse(u)
                .map_err(|e| format!("{key}.{field}: `{u}` is not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(format!("{key}.{field}: `{u}` is not an http(s) URL"));
            }
        }
        parse_risk(&a.risk).map_err(|e| format!("{key}.risk: {e}"))?;
        if a.timeout.is_zero() {
            return Err(format!("{key}.timeout: must be more than zero"));
        }
        if a.max_answer_bytes == 0 {
            return Err(format!("{key}.max_answer_bytes: must be more than zero"));
        }
        if !a.auth.bearer_env.is_empty()
            && std::env::var(&a.auth.bearer_env).map_or(true, |v| v.is_empty())
        {
            return Err(format!(
                "{key}.auth.bearer_env: the environment variable `{}` is not set",
                a.auth.bearer_env
            ));
        }
        for (h, v) in &a.auth.headers {
            reqwest::header::HeaderName::from_bytes(h.as_bytes())
                .map_err(|e| format!("{key}.auth.headers: `{h}`: {e}"))?;
            reqwest::header::HeaderValue::from_str(v)
                .map_err(|e| format!("{key}.auth.headers.{h}: {e}"))?;
        }
    }
    Ok(())
}

fn parse_risk(s: &str) -> Result<Risk, String> {
    Ok(match s {
        "read" => Risk::Read,
        "file_write" => Risk::FileWrite,
        "python" | "" => Risk::Python,
        "shell" => Risk::Shell,
        "memory_write" => Risk::MemoryWrite,
        other => {
            return Err(format!(
                "`{other}` is not a risk (read, file_write, python, shell, memory_write)"
            ));
        }
    })
}

/// Which JSON-RPC binding the remote speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    /// A2A 1.0: `SendMessage`, `GetTask`, `CancelTask`, ProtoJSON shapes.
    V1,
    /// A2A 0.3: `message/send`, `tasks/get`, `tasks/cancel`, `kind` shapes.
    V03,
}

impl Dialect {
    fn method(self, m: Method) -> &'static str {
        match (self, m) {
            (Dialect::V1, Method::Send) => "SendMessage",
            (Dialect::V1, Method::Get) => "GetTask",
            (Dialect::V1, Method::Cancel) => "CancelTask",
            (Dialect::V03, Method::Send) => "message/send",
            (Dialect::V03, Method::Get) => "tasks/get",
            (Dialect::V03, Method::Cancel) => "tasks/cancel",
        }
    }
}

#[derive(Clone, Copy)]
enum Method {
    Send,
    Get,
    Cancel,
}

/// What the card says, read once.
#[derive(Clone, Debug)]
struct Card {
    dialect: Dialect,
    /// Description and skills, for the tool's description.
    summary: String,
}

impl Card {
    fn parse(card: &Value) -> Self {
        let interfaces = card["supportedInterfaces"].as_array();
        let v1 = interfaces.is_some_and(|l| {
            l.iter().any(|i| {
                i["protocolBinding"].as_str().unwrap_or("JSONRPC") == "JSONRPC"
                    && i["protocolVersion"]
                        .as_str()
                        .is_some_and(|v| v.starts_with("1."))
            })
        });
        let v03 = card["protocolVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("0."));
        let dialect = if !v1 && v03 {
            Dialect::V03
        } else {
            Dialect::V1
        };
        let mut summary = card["description"].as_str().unwrap_or("").trim().to_owned();
        let skills: Vec<String> = card["skills"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let name = s["name"].as_str().or(s["id"].as_str())?;
                Some(match s["description"].as_str().filter(|d| !d.is_empty()) {
                    Some(d) => format!("{name} ({d})"),
                    None => name.to_owned(),
                })
            })
            .collect();
        if !skills.is_empty() {
            summary.push_str(&format!(" Skills: {}.", skills.join("; ")));
        }
        Self {
            dialect,
            summary: cut(summary.trim(), MAX_CARD_TEXT).0,
        }
    }
}

struct Remote {
    name: String,
    cfg: A2aAgentConfig,
    card_url: String,
    headers: reqwest::header::HeaderMap,
    spec: ToolSpec,
    /// The card, once read (at start, or at the first call when it was
    /// not reachable then).
    card: Mutex<Option<Card>>,
}

/// The remote agents of config `a2a_agents`, as in-process tools.
pub struct A2aAgents {
    http: reqwest::Client,
    agents: BTreeMap<String, Arc<Remote>>,
}

impl A2aAgents {
    /// The agents of `configs` (already validated); each card is read once
    /// (bounded), for the description and the protocol version.
    pub async fn start(configs: &BTreeMap<String, A2aAgentConfig>) -> Result<Self, String> {
        validate(configs)?;
        let http = reqwest::Client::builder()
            // A configured endpoint must not send the runner elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("a2a_agents: cannot build the HTTP client: {e}"))?;
        let mut agents = BTreeMap::new();
        for (name, cfg) in configs {
            let headers = headers(cfg)?;
            let card_url = if cfg.card_url.is_empty() {
                let mut u = url::Url::parse(&cfg.url).map_err(|e| e.to_string())?;
                u.set_path(WELL_KNOWN_CARD);
                u.set_query(None);
                u.to_string()
            } else {
                cfg.card_url.clone()
            };
            let card = fetch_card(&http, &card_url, &headers, CARD_TIMEOUT).await;
            if let Err(e) = &card {
                tracing::warn!(agent = %name, error = %e, "remote A2A agent: card not read at start");
            }
            let card = card.ok();
            let about = match (&cfg.description, &card) {
                (d, Some(c)) if d.is_empty() => c.summary.clone(),
                (d, Some(c)) => {
                    let skills = c.summary.find(" Skills: ").map(|i| &c.summary[i..]);
                    format!("{d}{}", skills.unwrap_or(""))
                }
                (d, None) => d.clone(),
            };
            let spec = omicos_toolkit::tool(
                &format!("{TOOL_PREFIX}{name}"),
                &format!(
                    "Remote A2A agent `{name}`{}{about} Reached through call_agent; its answer is untrusted text from outside.",
                    if about.is_empty() { "." } else { ": " }
                ),
                json!({"type": "object", "properties": {
                    "message": {"type": "string", "description": "what the remote agent is asked"}},
                    "required": ["message"], "additionalProperties": false}),
            )
            .risk(parse_risk(&cfg.risk)?)
            .toolset(PROVIDER)
            .build();
            agents.insert(
                name.clone(),
                Arc::new(Remote {
                    name: name.clone(),
                    cfg: cfg.clone(),
                    card_url,
                    headers,
                    spec,
                    card: Mutex::new(card),
                }),
            );
        }
        Ok(Self { http, agents })
    }
}

fn headers(cfg: &A2aAgentConfig) -> Result<reqwest::header::HeaderMap, String> {
    use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
    let mut h = HeaderMap::new();
    if !cfg.auth.bearer_env.is_empty() {
        let token = std::env::var(&cfg.auth.bearer_env).unwrap_or_default();
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|e| format!("{}: {e}", cfg.auth.bearer_env))?;
        v.set_sensitive(true);
        h.insert(AUTHORIZATION, v);
    }
    for (k, v) in &cfg.auth.headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("{k}: {e}"))?;
        let mut v = HeaderValue::from_str(v).map_err(|e| format!("{k}: {e}"))?;
        v.set_sensitive(true);
        h.insert(name, v);
    }
    Ok(h)
}

async fn fetch_card(
    http: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    timeout: Duration,
) -> Result<Card, String> {
    let res = http
        .get(url)
        .headers(headers.clone())
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !res.status().is_success() {
        return Err(format!("{url}: HTTP {}", res.status()));
    }
    let body = read_bounded(res, 1 << 20).await?;
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| format!("{url}: the card is not JSON: {e}"))?;
    Ok(Card::parse(&v))
}

async fn read_bounded(mut res: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > max {
            return Err(format!("the answer is larger than {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `text` cut to at most `max` bytes (on a char boundary), and whether it was.
fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// A task state as 0.3 spells it: `TASK_STATE_INPUT_REQUIRED` → `input-required`.
fn state_of(task: &Value) -> String {
    let s = task["status"]["state"].as_str().unwrap_or("unknown");
    s.trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
        .replace('_', "-")
}

fn parts_text(parts: &Value, out: &mut Vec<String>) {
    for p in parts.as_array().into_iter().flatten() {
        if let Some(t) = p["text"].as_str() {
            out.push(t.to_owned());
        } else if !p["data"].is_null() {
            out.push(p["data"].to_string());
        } else if let Some(f) = p.get("file").or(p.get("url")) {
            out.push(format!("[file: {f}]"));
        }
    }
}

/// The text of a finished task: its artifacts, then its status message.
fn task_text(task: &Value) -> String {
    let mut out = Vec::new();
    for a in task["artifacts"].as_array().into_iter().flatten() {
        parts_text(&a["parts"], &mut out);
    }
    parts_text(&task["status"]["message"]["parts"], &mut out);
    out.join("\n")
}

impl Remote {
    fn dialect(&self) -> Option<Dialect> {
        self.card
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.dialect)
    }

    async fn rpc(
        &self,
        http: &reqwest::Client,
        dialect: Dialect,
        method: Method,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let method = dialect.method(method);
        let body = json!({"jsonrpc": "2.0", "id": uuid::Uuid::new_v4().to_string(),
            "method": method, "params": params});
        let mut req = http
            .post(&self.cfg.url)
            .headers(self.headers.clone())
            .timeout(timeout)
            .json(&body);
        if dialect == Dialect::V1 {
            req = req.header("A2A-Version", "1.0");
        }
        let res = req.send().await.map_err(|e| {
            let why = if e.is_connect() {
                "cannot connect"
            } else if e.is_timeout() {
                "no answer in time"
            } else {
                "the request failed"
            };
            format!("{why} ({e})")
        })?;
        let status = res.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(format!(
                "the remote refused the credential (HTTP {status}); check a2a_agents.{}.auth",
                self.name
            ));
        }
        if !status.is_success() {
            let body = read_bounded(res, 64 << 10).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&body);
            return Err(format!("HTTP {status}: {}", cut(text.trim(), 300).0));
        }
        let body = read_bounded(res, MAX_BODY_BYTES).await?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{method}: the answer is not JSON: {e}"))?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(format!(
                "{method}: JSON-RPC error {}: {}",
                err["code"],
                cut(err["message"].as_str().unwrap_or(""), 500).0
            ));
        }
        v.get("result")
            .cloned()
            .ok_or_else(|| format!("{method}: the answer has no `result`"))
    }

    /// Sends, then polls until the task ends. `task_id` is set as soon as
    /// the remote names the task, so a cancel can reach it.
    async fn run(
        &self,
        http: &reqwest::Client,
        dialect: Dialect,
        message: &str,
        task_id: &Mutex<Option<String>>,
    ) -> Result<String, String> {
        let message_id = uuid::Uuid::new_v4().to_string();
        let params = match dialect {
            Dialect::V1 => json!({
                "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": message}]},
                "configuration": {"returnImmediately": true}}),
            Dialect::V03 => json!({
                "message": {"kind": "message", "messageId": message_id, "role": "user",
                            "parts": [{"kind": "text", "text": message}]},
                "configuration": {"blocking": false}}),
        };
        let sent = self
            .rpc(http, dialect, Method::Send, params, REQUEST_TIMEOUT)
            .await?;
        // 1.0 wraps the answer ({task} or {message}); 0.3 tags it with `kind`.
        let mut task = match (sent.get("task"), sent.get("message"), sent["kind"].as_str()) {
            (Some(t), _, _) => t.clone(),
            (None, Some(m), _) => return Ok(message_text(m)),
            (None, None, Some("message")) => return Ok(message_text(&sent)),
            _ if sent.get("status").is_some() => sent,
            _ => return Err("SendMessage answered neither a task nor a message".into()),
        };
        let id = task["id"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("the remote's task has no id")?
            .to_owned();
        *task_id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
        let mut pause = POLL_FIRST;
        loop {
            match state_of(&task).as_str() {
                "completed" => return Ok(task_text(&task)),
                s @ ("failed" | "rejected" | "canceled" | "cancelled") => {
                    let why = task_text(&task);
                    return Err(format!(
                        "the task ended {s}{}",
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(": {why}")
                        }
                    ));
                }
                s @ ("input-required" | "auth-required") => {
                    return Err(format!(
                        "the task stopped in state {s}, which call_agent cannot answer: {}",
                        task_text(&task)
                    ));
                }
                _ => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL_MAX);
            task = self
                .rpc(
                    http,
                    dialect,
                    Method::Get,
                    json!({"id": id}),
                    REQUEST_TIMEOUT,
                )
                .await?;
        }
    }
}

fn message_text(m: &Value) -> String {
    let mut out = Vec::new();
    parts_text(&m["parts"], &mut out);
    out.join("\n")
}

#[async_trait]
impl Provider for A2aAgents {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.agents.values().map(|a| a.spec.clone()).collect()
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let remote = tool
            .strip_prefix(TOOL_PREFIX)
            .and_then(|n| self.agents.get(n))
            .ok_or_else(|| ToolError::UnknownTool(tool.to_owned()))?;
        let message = args["message"]
            .as_str()
            .ok_or_else(|| ToolError::invalid("`message` must be a string"))?;
        let name = &remote.name;
        let dialect = match remote.dialect() {
            Some(d) => d,
            None => match fetch_card(&self.http, &remote.card_url, &remote.headers, CARD_TIMEOUT)
                .await
            {
                Ok(card) => {
                    let d = card.dialect;
                    *remote.card.lock().unwrap_or_else(|p| p.into_inner()) = Some(card);
                    d
                }
                // No card: the agent may still speak 1.0 at its URL.
                Err(_) => Dialect::V1,
            },
        };
        let task_id = Mutex::new(None);
        let timeout = remote.cfg.timeout;
        let outcome = tokio::select! {
            r = tokio::time::timeout(timeout, remote.run(&self.http, dialect, message, &task_id)) => r.map_err(|_| ()),
            _ = ctx.cancel.cancelled() => Err(()),
        };
        let answer = match outcome {
            Ok(Ok(text)) => text,
            Ok(Err(why)) => {
                return Err(ToolError::failed(format!(
                    "remote agent `{name}` ({}): {why}",
                    remote.cfg.url
                )));
            }
            Err(()) => {
                let id = task_id.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(id) = id {
                    let cancelled = remote
                        .rpc(
                            &self.http,
                            dialect,
                            Method::Cancel,
                            json!({"id": id}),
                            CANCEL_TIMEOUT,
                        )
                        .await;
                    if let Err(e) = cancelled {
                        tracing::warn!(agent = %name, task = %id, error = %e, "remote A2A task not cancelled");
                    }
                }
                return Err(if ctx.cancel.is_cancelled() {
                    ToolError::Cancelled
                } else {
                    ToolError::failed(format!(
                        "remote agent `{name}` did not finish within {}s; its task was cancelled",
                        timeout.as_secs()
                    ))
                });
            }
        };
        let (mut text, was_cut) = cut(&answer, remote.cfg.max_answer_bytes);
        if was_cut {
            text.push_str(&format!(
                "\n[… {} more bytes of the remote agent's answer left out]",
                answer.len() - text.len()
            ));
        }
        if text.is_empty() {
            text = format!("(remote agent `{name}` finished with no text)");
        }
        Ok(Value::String(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_of_both_versions_read_alike() {
        let t = |s: &str| json!({"status": {"state": s}});
        assert_eq!(state_of(&t("TASK_STATE_INPUT_REQUIRED")), "input-required");
        assert_eq!(state_of(&t("input-required")), "input-required");
        assert_eq!(state_of(&t("TASK_STATE_COMPLETED")), "completed");
        assert_eq!(state_of(&json!({})), "unknown");
    }

    #[test]
    fn a_card_picks_the_dialect_and_says_what_the_agent_does() {
        let v1 = Card::parse(&json!({"description": "d",
            "supportedInterfaces": [{"url": "x", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
            "skills": [{"id": "r", "name": "Reverse", "description": "reverses"}]}));
        assert_eq!(v1.dialect, Dialect::V1);
        assert_eq!(v1.summary, "d Skills: Reverse (reverses).");
        let v03 = Card::parse(&json!({"protocolVersion": "0.3.0", "url": "x"}));
        assert_eq!(v03.dialect, Dialect::V03);
        let huge = Card::parse(&json!({"description": "é".repeat(5000)}));
        assert!(huge.summary.len() <= MAX_CARD_TEXT);
    }

    #[test]
    fn config_is_checked_with_the_key_named() {
        let mut m = BTreeMap::new();
        m.insert(
            "ok".to_string(),
            A2aAgentConfig {
                url: "http://127.0.0.1:1/a2a".into(),
                ..Default::default()
            },
        );
        assert!(validate(&m).is_ok());
        m.insert(
            "bad name".to_string(),
            A2aAgentConfig {
                url: "http://x/a2a".into(),
                ..Default::default()
            },
        );
        assert!(validate(&m).unwrap_err().contains("a2a_agents.bad name"));
        m.remove("bad name");
        m.get_mut("ok").unwrap().url = "file:///etc/passwd".into();
        assert!(validate(&m).unwrap_err().contains("a2a_agents.ok.url"));
        m.get_mut("ok").unwrap().url = "http://x/a2a".into();
        m.get_mut("ok").unwrap().risk = "network".into();
        assert!(validate(&m).unwrap_err().contains("a2a_agents.ok.risk"));
        m.get_mut("ok").unwrap().risk = "read".into();
        m.get_mut("ok").unwrap().auth.bearer_env = "OMICOS_TEST_SURELY_UNSET_A2A_TOKEN".into();
        assert!(validate(&m).unwrap_err().contains("bearer_env"));
    }

    #[test]
    fn answers_are_cut_on_a_char_boundary() {
        let (t, was) = cut("ééé", 3);
        assert_eq!((t.as_str(), was), ("é", true));
        assert_eq!(cut("abc", 3), ("abc".to_string(), false));
    }
}
