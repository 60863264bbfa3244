//! `think` (a scratchpad the trajectory records) and `plan` (a plan the user
//! approves before it is written).

use super::{session_file, str_arg};
use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, tool};
use serde_json::{Value, json};

/// `think {thought}`: lets the model reason in the open between tool calls.
/// The runner's trajectory records the call with its input, so the tool
/// itself stores nothing and answers with a short acknowledgement.
#[derive(Debug, Default, Clone)]
pub struct ThinkProvider;

/// A thought longer than this is refused: it is a scratchpad, not a document.
const MAX_THOUGHT_BYTES: usize = 64 * 1024;

#[async_trait]
impl Provider for ThinkProvider {
    fn name(&self) -> &str {
        "think"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "think",
                "Think step by step before acting: weigh options, check what you know, decide the next step. \
                 Nothing is fetched or changed; the thought is kept in the session's record.",
                json!({
                    "type": "object",
                    "properties": {"thought": {"type": "string", "description": "Your reasoning."}},
                    "required": ["thought"],
                    "additionalProperties": false
                }),
            )
            .toolset("think")
            .provider("think")
            .build(),
        ]
    }

    fn validate_input(&self, _tool: &str, args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        let t = str_arg(args, "thought")?;
        if t.trim().is_empty() {
            return Err(ToolError::invalid("`thought` is empty"));
        }
        if t.len() > MAX_THOUGHT_BYTES {
            return Err(ToolError::invalid(format!(
                "`thought` is longer than {MAX_THOUGHT_BYTES} bytes"
            )));
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        if tool != "think" {
            return Err(ToolError::UnknownTool(tool.into()));
        }
        self.validate_input(tool, &args, &ctx)?;
        Ok(Value::String("Thought noted. Continue.".into()))
    }
}

/// `plan {plan}`: writes the plan to `<workspace>/.omicos/plans/<session>.md`.
/// The spec is `always_ask`, so the runner asks the client to approve every
/// call through the normal approval path; when this runs, the user said yes.
#[derive(Debug, Default, Clone)]
pub struct PlanProvider;

/// Plans larger than this are refused.
const MAX_PLAN_BYTES: usize = 256 * 1024;

#[async_trait]
impl Provider for PlanProvider {
    fn name(&self) -> &str {
        "plan"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "plan",
                "Propose a plan for multi-step work and ask the user to approve it before you start. Write it in \
                 Markdown: the goal, numbered steps, what each step produces, and what you need from the user. \
                 If the user declines, ask what to change.",
                json!({
                    "type": "object",
                    "properties": {"plan": {"type": "string", "description": "The plan, in Markdown."}},
                    "required": ["plan"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::FileWrite)
            .always_ask()
            .toolset("plan")
            .provider("plan")
            .build(),
        ]
    }

    fn validate_input(&self, _tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        let p = str_arg(args, "plan")?;
        if p.trim().is_empty() {
            return Err(ToolError::invalid("`plan` is empty"));
        }
        if p.len() > MAX_PLAN_BYTES {
            return Err(ToolError::invalid(format!(
                "`plan` is longer than {MAX_PLAN_BYTES} bytes"
            )));
        }
        session_file::path(&ctx.workspace, "plans", &ctx.session_id, "md").map(|_| ())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        if tool != "plan" {
            return Err(ToolError::UnknownTool(tool.into()));
        }
        self.validate_input(tool, &args, &ctx)?;
        let plan = str_arg(&args, "plan")?;
        let path = session_file::path(&ctx.workspace, "plans", &ctx.session_id, "md")?;
        let mut text = plan.trim_end().to_string();
        text.push('\n');
        session_file::write_atomic(&path, text.as_bytes()).await?;
        let rel = format!(".omicos/plans/{}.md", ctx.session_id);
        Ok(json!({
            "status": "approved",
            "path": rel,
            "bytes": text.len(),
            "message": format!("The user approved the plan; it is saved at {rel}. Carry it out step by step."),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn think_acknowledges_and_refuses_empty() {
        let ws = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(ws.path(), "s1");
        let out = ThinkProvider
            .call(
                "think",
                json!({"thought": "first read the data"}),
                ctx.clone(),
            )
            .await
            .unwrap();
        assert_eq!(out, json!("Thought noted. Continue."));
        assert!(matches!(
            ThinkProvider
                .call("think", json!({"thought": "  "}), ctx.clone())
                .await,
            Err(ToolError::InvalidInput(_))
        ));
        assert!(matches!(
            ThinkProvider.call("think", json!({}), ctx.clone()).await,
            Err(ToolError::InvalidInput(_))
        ));
        // It stores nothing: the trajectory is the record.
        assert!(std::fs::read_dir(ws.path()).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn plan_writes_the_session_file_and_asks_first() {
        let spec = &PlanProvider.tools()[0];
        assert!(spec.always_ask);
        assert_eq!(spec.risk, Risk::FileWrite as i32);
        let ws = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(ws.path(), "sess-7");
        let out = PlanProvider
            .call("plan", json!({"plan": "1. read\n2. plot\n\n"}), ctx.clone())
            .await
            .unwrap();
        assert_eq!(out["path"], ".omicos/plans/sess-7.md");
        let written = std::fs::read_to_string(ws.path().join(".omicos/plans/sess-7.md")).unwrap();
        assert_eq!(written, "1. read\n2. plot\n");
        // A second plan replaces the first.
        PlanProvider
            .call("plan", json!({"plan": "new"}), ctx.clone())
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.path().join(".omicos/plans/sess-7.md")).unwrap(),
            "new\n"
        );
        let bad = CallCtx::for_test(ws.path(), "../escape");
        assert!(matches!(
            PlanProvider.call("plan", json!({"plan": "x"}), bad).await,
            Err(ToolError::InvalidInput(_))
        ));
        assert!(matches!(
            PlanProvider.call("plan", json!({"plan": ""}), ctx).await,
            Err(ToolError::InvalidInput(_))
        ));
    }

    #[tokio::test]
    async fn plan_refuses_a_plans_directory_that_links_out() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join(".omicos")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join(".omicos/plans")).unwrap();
        let ctx = CallCtx::for_test(ws.path(), "s");
        assert!(
            PlanProvider
                .call("plan", json!({"plan": "x"}), ctx)
                .await
                .is_err()
        );
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }
}
