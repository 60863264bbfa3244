//! Stage 3: validate against the tool's JSON schema (compiled once per tool),
//! then run the tool's own `validate_input` (paths inside the workspace,
//! conflicting parameters, install rules).

use super::normalize::{Failure, Stage};
use crate::catalog::{Route, ToolEntry};
use jsonschema::error::{TypeKind, ValidationErrorKind};
use omicos_toolkit::CallCtx;
use serde_json::Value;

/// At most this many schema errors are quoted.
const MAX_ERRORS: usize = 5;

/// Checks `args` for `tool`. `repairs` are quoted so the model sees what changed.
pub fn validate(
    tool: &ToolEntry,
    args: &Value,
    ctx: &CallCtx,
    repairs: &[String],
) -> Result<(), Failure> {
    schema(tool, args, repairs)?;
    if let Route::Local(p) = &tool.route {
        // Remote providers run their own validate_input on their side.
        p.validate_input(&tool.spec.name, args, ctx)
            .map_err(|e| Failure::new(Stage::Validate, e.to_string()))?;
    }
    Ok(())
}

/// The schema part alone.
pub fn schema(tool: &ToolEntry, args: &Value, repairs: &[String]) -> Result<(), Failure> {
    let compiled = tool.compiled();
    let validator = compiled
        .validator
        .as_ref()
        .map_err(|e| Failure::new(Stage::Validate, e.clone()))?;
    if validator.is_valid(args) {
        return Ok(());
    }
    let problems: Vec<String> = validator
        .iter_errors(args)
        .take(MAX_ERRORS)
        .map(|e| describe(&e))
        .collect();
    let mut msg = format!(
        "invalid arguments for `{}`: {}",
        tool.spec.name,
        problems.join("; ")
    );
    if !repairs.is_empty() {
        msg.push_str(&format!(" (after repairing: {})", repairs.join("; ")));
    }
    Err(Failure::new(Stage::Validate, msg))
}

fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.instance_path().as_str();
    let at = if path.is_empty() { "/" } else { path };
    match e.kind() {
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!(
                "{at}: expected {expected}, got {}",
                super::parse::kind_of(e.instance())
            )
        }
        _ => format!("{at}: {e}"),
    }
}
