//! Building [`ToolSpec`]s.

use omicos_proto::{Risk, ToolSpec};
use serde_json::Value;

/// Starts a tool spec: name, description and JSON schema of the arguments.
pub fn tool(name: &str, description: &str, schema: Value) -> ToolSpecBuilder {
    ToolSpecBuilder(ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema_json: schema.to_string(),
        risk: Risk::Read as i32,
        ..Default::default()
    })
}

/// A [`ToolSpec`] under construction.
pub struct ToolSpecBuilder(ToolSpec);

impl ToolSpecBuilder {
    /// Sets the risk class (Read by default).
    pub fn risk(mut self, risk: Risk) -> Self {
        self.0.risk = risk as i32;
        self
    }
    /// Adds an alias.
    pub fn alias(mut self, name: &str) -> Self {
        self.0.aliases.push(name.into());
        self
    }
    /// Adds a deprecated name, kept so that old conversations replay.
    pub fn deprecated(mut self, name: &str) -> Self {
        self.0.deprecated_names.push(name.into());
        self
    }
    /// Sets the toolset.
    pub fn toolset(mut self, toolset: &str) -> Self {
        self.0.toolset = toolset.into();
        self
    }
    /// Asks the client before every call, whatever the mode.
    pub fn always_ask(mut self) -> Self {
        self.0.always_ask = true;
        self
    }
    /// Sets the provider name.
    pub fn provider(mut self, provider: &str) -> Self {
        self.0.provider = provider.into();
        self
    }
    /// Sets the JSON Schema of its structured result (MCP `outputSchema`).
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.0.output_schema_json = schema.to_string();
        self
    }
    /// The finished spec.
    pub fn build(self) -> ToolSpec {
        self.0
    }
}
