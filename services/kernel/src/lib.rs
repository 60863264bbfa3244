//! The kernel provider: a persistent Jupyter kernel (real ipykernel, spoken to
//! over the Jupyter protocol on IPC sockets) for every chat session, and the
//! tools that use it: run_python_code, kernel_install, registry_lookup and the
//! notebook tools. Served as its own gRPC service with
//! [`omicos_toolkit::serve_provider`]; the registry pins sessions to it.

pub mod config;
pub mod install;
pub mod interpreter;
pub mod kernel;
pub mod lookup;
pub mod metrics;
pub mod notebook;
pub mod output;
pub mod provider;
pub mod sandboxing;
pub mod sessions;

pub use config::{Config, KernelConfig};
pub use interpreter::{Interpreter, setup_venv, write_kernel_choice};
pub use provider::KernelProvider;
