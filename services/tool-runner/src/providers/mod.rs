//! In-process providers: file_manager and shell, confined to the workspace.

pub mod file_manager;
pub mod shell;

pub use file_manager::FileManager;
pub use shell::Shell;
