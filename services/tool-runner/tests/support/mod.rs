//! Shared test fixtures: a provider with one tool per behaviour the pipeline must handle.
#![allow(dead_code)]

use async_trait::async_trait;
use omicos_proto::{Risk, ToolSpec};
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tools: noop, echo (schema with array/integer/boolean), big (200 KB), boom (panics),
/// slow (waits for cancel), writer (FileWrite), py (Python; alias python, deprecated old_py),
/// sh (Shell), plan (always_ask).
pub struct TestKit {
    pub name: String,
    pub affinity: bool,
    /// Returned by `echo`, to tell instances apart.
    pub tag: String,
    /// Calls that reached the provider, by tool: a refusal is proven by
    /// the tool's count staying 0, not by the message alone.
    pub calls: Arc<Mutex<HashMap<String, usize>>>,
}

impl TestKit {
    /// How many calls of `tool` reached this provider.
    pub fn calls_of(&self, tool: &str) -> usize {
        self.calls.lock().unwrap().get(tool).copied().unwrap_or(0)
    }
}

impl TestKit {
    pub fn new() -> Self {
        Self {
            name: "testkit".into(),
            affinity: false,
            tag: "testkit".into(),
            calls: Default::default(),
        }
    }
}

/// The 200 KB result of `big`: distinct numbered lines with multi-byte characters.
pub fn big_text() -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 200_000 {
        s.push_str(&format!("row {i:06} µ✓ data\n"));
        i += 1;
    }
    s
}

#[async_trait]
impl Provider for TestKit {
    fn name(&self) -> &str {
        &self.name
    }
    fn session_affinity(&self) -> bool {
        self.affinity
    }
    fn tools(&self) -> Vec<ToolSpec> {
        let obj = json!({"type":"object"});
        vec![
            tool("noop", "does nothing", obj.clone()).build(),
            tool(
                "echo",
                "returns its arguments",
                json!({"type":"object","properties":{
                    "packages":{"type":"array","items":{"type":"string"}},
                    "n":{"type":"integer"},
                    "flag":{"type":"boolean"}
                },"additionalProperties":false}),
            )
            .build(),
            tool("big", "returns 200 KB", obj.clone()).build(),
            tool("boom", "panics", obj.clone()).build(),
            tool("slow", "waits until cancelled", obj.clone()).build(),
            tool("writer", "a FileWrite tool", obj.clone())
                .risk(Risk::FileWrite)
                .build(),
            tool("py", "a Python tool", obj.clone())
                .risk(Risk::Python)
                .alias("python")
                .deprecated("old_py")
                .build(),
            tool("sh", "a Shell tool", obj.clone())
                .risk(Risk::Shell)
                .build(),
            tool("plan", "asks every time", obj).always_ask().build(),
        ]
    }
    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(tool.to_owned())
            .or_default() += 1;
        match tool {
            "noop" => Ok(json!("ok")),
            "echo" => {
                Ok(json!({"args": args, "user_modified": ctx.user_modified, "instance": self.tag}))
            }
            "big" => Ok(Value::String(big_text())),
            "boom" => panic!("the test provider panics on purpose"),
            "slow" => {
                ctx.events.output("stdout", "started\n").await;
                tokio::select! {
                    _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
                    _ = tokio::time::sleep(Duration::from_secs(30)) => Ok(json!("slept")),
                }
            }
            "writer" | "py" | "sh" | "plan" => Ok(json!(format!("{tool} ran"))),
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }
}
