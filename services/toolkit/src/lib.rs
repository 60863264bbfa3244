//! The tool provider contract shared by the tool-runner and every provider
//! service: tool specs and risk, the call context, the in-process
//! [`Provider`] trait, the gRPC adapters around it (serve a provider, call a
//! remote one), self-registration with the registry, toolset groups, and
//! workspace path confinement.

pub mod checkpoint;
pub mod confine;
pub mod hosting;
pub mod provider;
pub mod registration;
pub mod remote;
pub mod server;
pub mod spec;
pub mod tenancy;
pub mod toolsets;

pub use checkpoint::FileChanges;
pub use confine::{
    ConfineError, OpenFor, confine_path, confine_tool_path, open_confined, replace_confined,
};
pub use hosting::{
    ProviderHosting, serve_provider, serve_provider_over, serve_provider_tls, serve_provider_with,
};
pub use omicos_proto::{Risk, ToolOutputChunk, ToolProgress, ToolSpec};
pub use provider::{CallCtx, EventSink, Provider, ProviderEvent, ToolError};
pub use spec::{ToolSpecBuilder, tool};
