//! Providers the tool-runner hosts in process: they need the catalog (skills)
//! or only the workspace (think, task, plan).

mod session_file;
mod skill;
mod task;
mod think_plan;

pub use skill::SkillProvider;
pub use task::{TaskProvider, TaskStatus};
pub use think_plan::{PlanProvider, ThinkProvider};

/// Reads a required string argument.
pub(crate) fn str_arg<'a>(
    args: &'a serde_json::Value,
    key: &str,
) -> Result<&'a str, omicos_toolkit::ToolError> {
    args.get(key)
        .and_then(|v| v.as_str())
        .ok_or_else(|| omicos_toolkit::ToolError::invalid(format!("`{key}` must be a string")))
}
