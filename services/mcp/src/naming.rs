//! Tool names: `mcp__<server>__<tool>`, in the model APIs' charset
//! (`^[a-zA-Z0-9_-]+$`) and at most 64 characters, as codex and goose do.

use std::collections::HashMap;

/// The longest tool name the model APIs accept.
pub const MAX_TOOL_NAME: usize = 64;
/// The prefix of every MCP tool.
pub const PREFIX: &str = "mcp__";

/// `s` with every character outside `[a-zA-Z0-9_-]` replaced by `_`.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() { "_".into() } else { out }
}

/// The name the model sees for `tool` of `server` (a valid server name). Too
/// long a name keeps its head and ends in a hash of the whole, so two long
/// names that share a head stay apart.
pub fn qualified(server: &str, tool: &str) -> String {
    let full = format!("{PREFIX}{server}__{}", sanitize(tool));
    if full.len() <= MAX_TOOL_NAME {
        return full;
    }
    let hash = format!(
        "{:08x}",
        fnv1a(format!("{server}\u{0}{tool}").as_bytes()) as u32
    );
    let keep = MAX_TOOL_NAME - hash.len() - 1;
    format!("{}_{hash}", &full[..keep])
}

/// The toolset patterns of `mcp:<server>`: its tools' common prefix.
pub fn server_prefix(server: &str) -> String {
    format!("{PREFIX}{server}__")
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Two tools of one server that would have the same name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "MCP server `{server}`: its tools `{first}` and `{second}` would both be named `{name}`; refused (disable one with `disabled_tools`)"
)]
pub struct Collision {
    /// The server.
    pub server: String,
    /// The first tool (the server's own name).
    pub first: String,
    /// The second.
    pub second: String,
    /// The name both would take.
    pub name: String,
}

/// The qualified name of each of `tools` (the server's names), or the first collision.
pub fn qualify_all<'a>(
    server: &str,
    tools: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, Collision> {
    let mut by_name: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for t in tools {
        let q = qualified(server, t);
        if let Some(first) = by_name.get(&q) {
            return Err(Collision {
                server: server.into(),
                first: first.clone(),
                second: t.into(),
                name: q,
            });
        }
        by_name.insert(q.clone(), t.into());
        out.push((t.to_owned(), q));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitized_and_bounded() {
        assert_eq!(qualified("fs", "read_file"), "mcp__fs__read_file");
        assert_eq!(qualified("ev", "get-sum"), "mcp__ev__get-sum");
        assert_eq!(qualified("ev", "a.b/c d"), "mcp__ev__a_b_c_d");
        let long = "x".repeat(100);
        let q = qualified("srv", &long);
        assert_eq!(q.len(), MAX_TOOL_NAME);
        assert!(q.starts_with("mcp__srv__xxx"));
        let q2 = qualified("srv", &format!("{long}y"));
        assert_ne!(q, q2, "long names that share a head stay apart");
        let re = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        assert!(re(&q) && re(&qualified("s", "ü→λ")));
    }

    #[test]
    fn collisions_name_both_tools() {
        let e = qualify_all("ev", ["get.sum", "echo", "get_sum"]).unwrap_err();
        assert_eq!(e.first, "get.sum");
        assert_eq!(e.second, "get_sum");
        let msg = e.to_string();
        assert!(
            msg.contains("`get.sum`")
                && msg.contains("`get_sum`")
                && msg.contains("mcp__ev__get_sum"),
            "{msg}"
        );
        assert_eq!(qualify_all("ev", ["a", "b"]).unwrap().len(), 2);
    }
}
