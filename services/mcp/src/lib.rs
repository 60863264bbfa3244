//! MCP both ways.
//!
//! - **MCP servers as a provider** ([`McpProvider`]): the servers listed in
//!   the runner's `mcp.servers` config (stdio or streamable HTTP) are started
//!   in the runner, and their tools join its catalog as
//!   `mcp__<server>__<tool>` (toolsets `mcp:<server>` and `mcp`), with a risk
//!   from `readOnlyHint`, so the governed pipeline (permission modes, hooks,
//!   approvals) applies to them unchanged.
//! - **omicos as an MCP server** ([`serve`]): the runner's tools, through the
//!   same pipeline, for any MCP client over stdio or streamable HTTP.
//!
//! Both sides use the official Rust SDK, rmcp.

pub mod client;
pub mod config;
pub mod naming;
pub mod provider;
pub mod result;
pub mod serve;

pub use config::{McpConfig, ServeConfig, ServerConfig};
pub use provider::{McpProvider, OnChange};
pub use serve::{Bridge, ToolBackend};
