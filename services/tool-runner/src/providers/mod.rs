//! In-process providers: file_manager and shell, confined to the workspace,
//! and the remote A2A agents of config `a2a_agents`.

pub mod a2a;
pub mod file_manager;
pub mod shell;

pub use a2a::A2aAgents;
pub use file_manager::FileManager;
pub use shell::Shell;
