//! The `omicos` command line: `up` runs the whole stack, `chat` talks to it
//! (a REPL on a terminal, one turn from piped stdin, or JSON lines), the
//! one-shot commands inspect agents, tools and sessions and answer approvals,
//! and `demo` runs the scripted offline conversation end to end.

pub mod attach;
pub mod chat;
pub mod commands;
pub mod demo;
pub mod error;
pub mod input;
pub mod mcp;
pub mod render;
pub mod sandbox;
pub mod style;
pub mod turn;
pub mod up;
