//! The one-shot commands: `agents`, `tools`, `sessions [show|fork|rewind|rename|value
//! ID]`, `approve`, `kernel setup`. Each returns its output as text so tests and the binary share it.

use crate::error::CliError;
use crate::render::{clip, result_lines, risk_name, short_args};
use crate::style::Style;
use crate::turn::Client;
use omicos_history::HistoryItem;
use omicos_proto::{
    ApproveToolRequest, Decision, EventValue, ForkSessionRequest, GetSessionRequest,
    ListAgentToolsRequest, ListAgentsRequest, ListSessionsRequest, MessageValue, ReadValueRequest,
    RenameSessionRequest, RewindSessionRequest, Risk, ValueRef, fork_session_request,
    rewind_session_request, value_ref,
};
use serde_json::Value;
use std::fmt::Write;

/// `omicos agents`: the catalog, one agent a line.
pub async fn agents(client: &mut Client, st: Style) -> Result<String, CliError> {
    let r = client
        .list_agents(ListAgentsRequest {})
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let mut out = String::new();
    let w = r
        .agents
        .iter()
        .map(|a| a.id.chars().count())
        .max()
        .unwrap_or(2)
        .max(2);
    let _ = writeln!(
        out,
        "{}",
        st.dim(&format!(
            "{} agents · deployment tier {}",
            r.agents.len(),
            r.deployment_tier
        ))
    );
    for a in &r.agents {
        let lock = if a.locked {
            st.yellow(&format!(" (locked: tier {})", a.tier))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} {}  {}{lock}\n{}  {}",
            a.icon,
            st.bold(&format!("{:<w$}", a.id)),
            a.name,
            " ".repeat(w + 2),
            st.dim(&clip(
                &format!("{} · toolsets: {}", a.description, a.toolsets.join(", ")),
                110
            )),
        );
    }
    Ok(out)
}

/// `omicos tools`: what an agent's model would see under a mode.
pub async fn tools(
    client: &mut Client,
    agent: &str,
    mode: &str,
    st: Style,
) -> Result<String, CliError> {
    let r = client
        .list_agent_tools(ListAgentToolsRequest {
            agent: agent.to_owned(),
            permission_mode: mode.to_owned(),
            format: String::new(),
        })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let mut tools = r.tools;
    tools.sort_by(|a, b| {
        (a.toolset.as_str(), a.name.as_str()).cmp(&(b.toolset.as_str(), b.name.as_str()))
    });
    let w = tools
        .iter()
        .map(|t| t.name.chars().count())
        .max()
        .unwrap_or(4);
    let mut out = String::new();
    let who = if agent.is_empty() {
        "the default agent".to_owned()
    } else {
        format!("agent {agent}")
    };
    let how = if mode.is_empty() {
        "the default mode".to_owned()
    } else {
        format!("mode {mode}")
    };
    let _ = writeln!(
        out,
        "{}",
        st.dim(&format!("{} tools for {who} under {how}", tools.len()))
    );
    for t in &tools {
        let risk = Risk::try_from(t.risk).map(risk_name).unwrap_or("?");
        let first = t.description.lines().next().unwrap_or_default();
        let _ = writeln!(
            out,
            "{}  {:<10} {:<18} {}",
            st.cyan(&format!("{:<w$}", t.name)),
            risk,
            t.toolset,
            st.dim(&clip(first, 70))
        );
    }
    Ok(out)
}

fn when(ms: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let s = ((now - ms) / 1000).max(0);
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// `omicos sessions`: the most recent sessions.
pub async fn sessions(client: &mut Client, st: Style) -> Result<String, CliError> {
    let r = client
        .list_sessions(ListSessionsRequest { limit: 50 })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let mut out = String::new();
    if r.sessions.is_empty() {
        let _ = writeln!(out, "no sessions yet (start one with `omicos chat`)");
        return Ok(out);
    }
    for s in &r.sessions {
        let _ = writeln!(
            out,
            "{}  {:>8}  {:<14} {:>5} events  {}",
            st.bold(&s.session_id),
            when(s.last_active_ms),
            s.agent,
            s.last_event_seq,
            clip(&s.title, 60)
        );
    }
    Ok(out)
}

/// `omicos sessions show ID`: the conversation, one message a block.
pub async fn session_show(client: &mut Client, id: &str, st: Style) -> Result<String, CliError> {
    let s = client
        .get_session(GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let mut out = String::new();
    if let Some(m) = &s.summary {
        let _ = writeln!(
            out,
            "{}",
            st.dim(&format!(
                "session {} · agent {} · team {} · {} events · {}",
                m.session_id,
                m.agent,
                m.team_members.join(", "),
                m.last_event_seq,
                m.title
            ))
        );
    }
    for (i, raw) in s.messages_json.iter().enumerate() {
        // Where this message's cut values are whole (`sessions value`).
        for r in &s.cut_values {
            if let Some(value_ref::At::Message(m)) = &r.at
                && m.index as usize == i
            {
                let _ = writeln!(
                    out,
                    "{}",
                    st.dim(&format!(
                        "[{} bytes cut below; whole: omicos sessions value {id} --message {i} --pointer {}]",
                        r.size_bytes, m.pointer
                    ))
                );
            }
        }
        let m = serde_json::from_str(raw).unwrap_or(HistoryItem::Other(Value::Null));
        match &m {
            HistoryItem::User(u) => {
                let _ = writeln!(out, "{} {}", st.bold("you>"), u.content);
            }
            HistoryItem::Assistant(a) => {
                if !a.content.is_empty() {
                    let _ = writeln!(out, "{}", a.content);
                }
                for c in a.calls() {
                    let (name, args) = (c.name(), c.arguments());
                    let _ = writeln!(
                        out,
                        "{} {} {}",
                        st.cyan("▸"),
                        st.cyan(name),
                        st.dim(&short_args(args, 80))
                    );
                }
            }
            HistoryItem::Tool(t) => {
                // The model saw {"status", "result"}.
                let v: Value = serde_json::from_str(&t.content).unwrap_or(Value::Null);
                let status = v["status"].as_str().unwrap_or("?");
                let result = v["result"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v["result"].to_string());
                let mark = if status == "done" {
                    st.green("✓")
                } else {
                    st.red("✗")
                };
                let _ = writeln!(out, "{mark} {status}");
                for l in result_lines(&result, 3) {
                    let _ = writeln!(out, "  {}", st.dim(&l));
                }
            }
            other => {
                let role = match other.role() {
                    "" => "?",
                    r => r,
                };
                let _ = writeln!(
                    out,
                    "{role}: {}",
                    clip(other.content().unwrap_or_default(), 200)
                );
            }
        }
    }
    Ok(out)
}

/// Where a cut value is (`omicos sessions value`).
pub enum ValueAt {
    /// An event's seq and field.
    Event(u64, String),
    /// A history message's index and a JSON pointer into it.
    Message(u32, String),
}

/// `omicos sessions value ID (--event N --field F | --message I --pointer P)
/// [--offset B]`: the value from byte `offset` on (0: whole) written to `out`
/// as it arrives (it may be far larger than a message); nothing else is printed.
pub async fn session_value(
    client: &mut Client,
    id: &str,
    at: ValueAt,
    offset: u64,
    out: &mut dyn std::io::Write,
) -> Result<String, CliError> {
    let at = match at {
        ValueAt::Event(event_seq, field) => value_ref::At::Event(EventValue { event_seq, field }),
        ValueAt::Message(index, pointer) => value_ref::At::Message(MessageValue { index, pointer }),
    };
    let mut s = client
        .read_value(ReadValueRequest {
            session_id: id.to_owned(),
            value: Some(ValueRef {
                at: Some(at),
                size_bytes: 0,
            }),
            offset,
        })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let io = |source| CliError::Io {
        what: "writing the value".into(),
        source,
    };
    while let Some(chunk) = s.message().await.map_err(CliError::Rpc)? {
        out.write_all(&chunk.data).map_err(io)?;
    }
    out.flush().map_err(io)?;
    Ok(String::new())
}

/// `omicos sessions fork ID [--turn T | --event N] [--files]`: the new
/// session's id first (a script reads the first word).
pub async fn session_fork(
    client: &mut Client,
    id: &str,
    turn: Option<String>,
    event: Option<u64>,
    files: bool,
    st: Style,
) -> Result<String, CliError> {
    let at = match (turn, event) {
        (Some(t), _) => Some(fork_session_request::At::TurnId(t)),
        (None, Some(n)) => Some(fork_session_request::At::EventSeq(n)),
        (None, None) => None,
    };
    let r = client
        .fork_session(ForkSessionRequest {
            session_id: id.to_owned(),
            at,
            copy_files: files,
        })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let mut out = format!(
        "{}  forked from {id}: {} turn{}, {} message{}\n",
        st.bold(&r.session_id),
        r.turns,
        if r.turns == 1 { "" } else { "s" },
        r.messages,
        if r.messages == 1 { "" } else { "s" },
    );
    for f in &r.files_copied {
        let _ = writeln!(out, "  {} {f}", st.dim("restored"));
    }
    Ok(out)
}

/// `omicos sessions rewind ID [--turns N | --to TURN] [--keep-files]`.
pub async fn session_rewind(
    client: &mut Client,
    id: &str,
    turns: Option<u32>,
    to: Option<String>,
    keep_files: bool,
    st: Style,
) -> Result<String, CliError> {
    let to = match (to, turns) {
        (Some(t), _) => rewind_session_request::To::TurnId(t),
        (None, n) => rewind_session_request::To::LastTurns(n.unwrap_or(1)),
    };
    let r = client
        .rewind_session(RewindSessionRequest {
            session_id: id.to_owned(),
            to: Some(to),
            keep_files,
        })
        .await
        .map_err(CliError::Rpc)?
        .into_inner();
    let n = r.turn_ids.len();
    let mut out = format!(
        "rewound {n} turn{} of {id} (event {})\n",
        if n == 1 { "" } else { "s" },
        r.event_seq
    );
    for t in &r.turn_ids {
        let _ = writeln!(out, "  {} {t}", st.dim("turn"));
    }
    for f in &r.files_restored {
        let _ = writeln!(out, "  {} {f}", st.dim("restored"));
    }
    for f in &r.files_not_restored {
        let _ = writeln!(
            out,
            "  {} {f} (its earlier content was too large to keep)",
            st.red("not restored")
        );
    }
    if !r.first_message.is_empty() {
        let _ = writeln!(
            out,
            "{} {}",
            st.dim("the first message taken out:"),
            clip(&r.first_message, 200)
        );
    }
    Ok(out)
}

/// `omicos sessions rename ID TITLE`.
pub async fn session_rename(
    client: &mut Client,
    id: &str,
    title: &str,
) -> Result<String, CliError> {
    client
        .rename_session(RenameSessionRequest {
            session_id: id.to_owned(),
            title: title.to_owned(),
        })
        .await
        .map_err(CliError::Rpc)?;
    Ok(format!("renamed {id}: {}\n", title.trim()))
}

/// Checks a permission mode with the one parser the services use, and
/// returns its canonical spelling, so a bad one fails before anything starts.
pub fn parse_mode(s: &str) -> Result<String, CliError> {
    omicos_proto::PermissionMode::parse(s)
        .map(|m| m.as_str().to_owned())
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Checks `--port-base`: 0 (ephemeral ports) or a port with room for the four that follow it.
pub fn parse_port_base(s: &str) -> Result<u16, CliError> {
    let n: u16 = s
        .trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("`{s}` is not a port number (0-65531)")))?;
    if n > u16::MAX - 4 {
        return Err(CliError::Usage(format!(
            "{n} leaves no room for the four services after it (tool-runner +1 … memory +4): use at most 65531, or 0 for free ports"
        )));
    }
    Ok(n)
}

/// Parses `allow|session|deny` (and the REPL's y/a/n).
pub fn parse_decision(s: &str) -> Result<Decision, CliError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "allow" | "once" | "allow_once" | "y" => Ok(Decision::AllowOnce),
        "session" | "allow_session" | "always" | "a" => Ok(Decision::AllowSession),
        "deny" | "n" | "no" => Ok(Decision::Deny),
        other => Err(CliError::Usage(format!(
            "`{other}` is not a decision: use allow (this call), session (this tool for the session) or deny"
        ))),
    }
}

/// `omicos approve SESSION CALL allow|session|deny`.
pub async fn approve(
    client: &mut Client,
    session: &str,
    call: &str,
    decision: Decision,
) -> Result<String, CliError> {
    client
        .approve_tool(ApproveToolRequest {
            session_id: session.to_owned(),
            call_id: call.to_owned(),
            decision: decision as i32,
            rule: String::new(),
        })
        .await
        .map_err(CliError::Rpc)?;
    Ok(format!(
        "{}: {}\n",
        call,
        crate::render::decision_words(decision)
    ))
}

/// `omicos kernel setup`: a venv with ipykernel in `dir`, plus `dir/requirements.txt` when there is one.
pub fn kernel_setup(dir: &std::path::Path) -> Result<String, CliError> {
    let python =
        omicos_kernel::setup_venv(dir).map_err(|e| CliError::KernelSetup(e.to_string()))?;
    let mut out = format!("kernel venv ready: {}\n", python.display());
    let req = dir.join("requirements.txt");
    if req.is_file() {
        let o = std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
            ])
            .arg(&req)
            .output()
            .map_err(|e| CliError::Io {
                what: format!("{} -m pip install -r {}", python.display(), req.display()),
                source: e,
            })?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(CliError::KernelSetup(format!(
                "pip install -r {} failed: {}",
                req.display(),
                clip(err.trim(), 2000)
            )));
        }
        let _ = writeln!(out, "installed {}", req.display());
    }
    let _ = writeln!(
        out,
        "kernels use it when OMICOS_KERNEL_PYTHON={} is set (`omicos demo` finds ./.venv by itself)",
        python.display()
    );
    Ok(out)
}

/// Asks `addr`'s grpc.health.v1 about `service` (`""`: the whole server).
/// `SERVING` is Ok; any other answer, or no answer within 3 s, is an error.
/// An `https://` address is verified with `--ca` and, for a server under
/// mutual TLS, given the `--cert`/`--key` client certificate.
pub async fn health(addr: &str, service: &str) -> Result<String, CliError> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let channel =
        crate::turn::channel(addr, None, "the service", std::time::Duration::from_secs(3)).await?;
    let mut client = HealthClient::new(channel);
    let check = client.check(HealthCheckRequest {
        service: service.to_owned(),
    });
    let reply = tokio::time::timeout(std::time::Duration::from_secs(3), check)
        .await
        .map_err(|_| CliError::Connect(format!("{addr} did not answer within 3 s")))?
        .map_err(|s| crate::turn::call_error(addr, s))?
        .into_inner();
    let status = ServingStatus::try_from(reply.status).unwrap_or(ServingStatus::Unknown);
    if status == ServingStatus::Serving {
        Ok(format!("{addr}: serving\n"))
    } else {
        Err(CliError::NotServing(format!(
            "{addr}: {}",
            status.as_str_name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_parse_and_bad_ones_say_why() {
        assert_eq!(parse_decision("allow").unwrap(), Decision::AllowOnce);
        assert_eq!(parse_decision("Session").unwrap(), Decision::AllowSession);
        assert_eq!(parse_decision("deny").unwrap(), Decision::Deny);
        assert!(
            parse_decision("perhaps")
                .unwrap_err()
                .to_string()
                .contains("allow")
        );
    }

    #[test]
    fn modes_and_port_bases_are_checked_before_anything_starts() {
        assert_eq!(parse_mode("Read-Only").unwrap(), "read_only");
        assert_eq!(parse_mode("full_access").unwrap(), "full");
        assert!(
            parse_mode("yolo")
                .unwrap_err()
                .to_string()
                .contains("read_only")
        );
        assert_eq!(parse_port_base("0").unwrap(), 0);
        assert_eq!(parse_port_base("65531").unwrap(), 65531);
        assert!(
            parse_port_base("65535")
                .unwrap_err()
                .to_string()
                .contains("at most 65531")
        );
        assert!(parse_port_base("seven").is_err());
    }
}
