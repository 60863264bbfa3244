//! Stage 1: find the tool among those visible to this call. Aliases and
//! deprecated names resolve, so old conversations replay; an unknown name
//! lists the closest known names.

use super::normalize::{Failure, Stage};
use crate::catalog::{Catalog, ToolEntry};
use std::sync::Arc;

/// The tool the orchestrator must run itself (a sub-turn with another agent).
pub const CALL_AGENT: &str = "call_agent";

/// How the name matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matched {
    /// The tool's own name.
    Name,
    /// One of its aliases.
    Alias,
    /// One of its deprecated names.
    Deprecated,
}

/// Resolves `name` to a tool visible under `toolsets` (empty: every tool).
pub fn resolve(
    catalog: &Catalog,
    name: &str,
    toolsets: &[String],
) -> Result<(Arc<ToolEntry>, Matched), Failure> {
    let name = name.trim();
    if name == CALL_AGENT {
        return Err(Failure::new(
            Stage::Resolve,
            "call_agent reached the tool-runner: it should have been intercepted by the orchestrator, which runs it as a sub-turn. This is a bug in the orchestrator, not in the call.",
        ));
    }
    if name.is_empty() {
        return Err(Failure::new(
            Stage::Resolve,
            "the tool call has no tool name",
        ));
    }
    let Some((entry, matched)) = catalog.lookup(name) else {
        return Err(Failure::new(
            Stage::Resolve,
            unknown_message(catalog, name, toolsets),
        ));
    };
    if !omicos_toolkit::toolsets::in_toolsets(toolsets, &entry.spec.name) {
        return Err(Failure::new(
            Stage::Resolve,
            format!(
                "tool `{}` is not available to this agent (its toolsets are: {}); use one of: {}",
                entry.spec.name,
                toolsets.join(", "),
                visible_names(catalog, toolsets).join(", ")
            ),
        ));
    }
    Ok((entry, matched))
}

fn visible_names(catalog: &Catalog, toolsets: &[String]) -> Vec<String> {
    catalog
        .entries()
        .filter(|e| omicos_toolkit::toolsets::in_toolsets(toolsets, &e.spec.name))
        .map(|e| e.spec.name.clone())
        .collect()
}

/// "unknown tool `x`; did you mean: a, b, c?" over the visible names and aliases.
fn unknown_message(catalog: &Catalog, name: &str, toolsets: &[String]) -> String {
    let mut scored: Vec<(f64, String)> = catalog
        .entries()
        .filter(|e| omicos_toolkit::toolsets::in_toolsets(toolsets, &e.spec.name))
        .flat_map(|e| std::iter::once(e.spec.name.clone()).chain(e.spec.aliases.iter().cloned()))
        .map(|cand| {
            (
                strsim::jaro_winkler(&name.to_lowercase(), &cand.to_lowercase()),
                cand,
            )
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let close: Vec<String> = scored
        .iter()
        .filter(|(s, _)| *s >= 0.7)
        .take(3)
        .map(|(_, n)| n.clone())
        .collect();
    if close.is_empty() {
        let all: Vec<String> = scored.iter().take(12).map(|(_, n)| n.clone()).collect();
        format!("unknown tool `{name}`; known tools: {}", all.join(", "))
    } else {
        format!(
            "unknown tool `{name}`; closest known names: {}",
            close.join(", ")
        )
    }
}
