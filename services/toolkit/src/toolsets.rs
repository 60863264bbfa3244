//! Toolset groups: the coarse names agent files use, expanded into tool names.

/// Toolset → tool names. A name ending in `__*` matches every tool with that prefix.
pub const TOOLSET_GROUPS: &[(&str, &[&str])] = &[
    (
        "integrated_notebook",
        &[
            "run_python_code",
            "kernel_install",
            "notebook__*",
            "registry_lookup",
        ],
    ),
    ("web", &["web_search", "web_fetch"]),
    (
        "file_manager",
        &[
            "file_manager__list",
            "file_manager__read",
            "file_manager__write",
            "file_manager__edit",
            "file_manager__glob",
            "file_manager__grep",
        ],
    ),
    ("shell", &["shell"]),
    ("memory", &["memory__*"]),
    ("pdf", &["pdf__*"]),
    ("image_gen", &["image_gen__*"]),
    ("think", &["think"]),
    ("task", &["task__*"]),
    ("plan", &["plan"]),
    ("skill", &["skill", "skill_resource", "skill_lookup"]),
    ("team", &["call_agent", "list_agents"]),
    // Remote A2A agents (the runner's config `a2a_agents`), reached through
    // `call_agent`: an agent with `team` is given this one by the orchestrator.
    ("a2a", &["a2a__*"]),
    // The names the original design used for parts of integrated_notebook.
    ("python", &["run_python_code", "kernel_install"]),
    ("notebook", &["notebook__*"]),
    ("omicverse_lookup", &["registry_lookup"]),
    // Every MCP server's tools; `mcp:<server>` (see `is_known`) is one server's.
    ("mcp", &["mcp__*"]),
];

/// The prefix of a per-server MCP toolset: `mcp:<server>` holds `mcp__<server>__*`.
pub const MCP_SERVER_TOOLSET: &str = "mcp:";

/// Whether `name` is a toolset: a group, or `mcp:<server>`.
pub fn is_known(name: &str) -> bool {
    group(name).is_some() || mcp_server(name).is_some()
}

fn mcp_server(name: &str) -> Option<&str> {
    name.strip_prefix(MCP_SERVER_TOOLSET)
        .filter(|s| !s.is_empty())
}

fn in_toolset(toolset: &str, tool: &str) -> bool {
    if let Some(server) = mcp_server(toolset) {
        return tool
            .strip_prefix("mcp__")
            .and_then(|rest| rest.strip_prefix(server))
            .is_some_and(|rest| rest.starts_with("__"));
    }
    group(toolset).is_some_and(|g| g.iter().any(|p| matches(p, tool)))
}

/// The patterns of a toolset, or None when the name is unknown.
pub fn group(name: &str) -> Option<&'static [&'static str]> {
    TOOLSET_GROUPS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

/// Whether `tool` matches a pattern of a group.
pub fn matches(pattern: &str, tool: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => pattern == tool,
    }
}

/// Whether `tool` is in any of `toolsets` (empty: every tool).
pub fn in_toolsets(toolsets: &[String], tool: &str) -> bool {
    toolsets.is_empty() || toolsets.iter().any(|t| in_toolset(t, tool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion() {
        let ts = vec!["memory".to_string(), "web".to_string()];
        assert!(in_toolsets(&ts, "memory__save"));
        assert!(in_toolsets(&ts, "web_fetch"));
        assert!(!in_toolsets(&ts, "shell"));
        assert!(in_toolsets(&[], "shell"));
        assert!(group("nope").is_none());
        let mcp = vec!["mcp:fs".to_string()];
        assert!(in_toolsets(&mcp, "mcp__fs__read_file"));
        assert!(!in_toolsets(&mcp, "mcp__fsx__read_file"));
        assert!(!in_toolsets(&mcp, "shell"));
        assert!(in_toolsets(&["mcp".to_string()], "mcp__ev__echo"));
        assert!(is_known("mcp:fs") && is_known("mcp") && !is_known("mcp:"));
    }
}
