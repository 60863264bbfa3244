//! Claude Code's hook handlers, shared by the two places hooks run: the
//! orchestrator (session, prompt, stop and sub-agent events) and the
//! tool-runner (PreToolUse, PermissionRequest, PostToolUse,
//! PostToolUseFailure), so a handler behaves the same wherever its event
//! happens and hook scripts written for Claude Code work unchanged.
//!
//! - [`HookHandler`] and [`HookMatcher`] are the config, in the shape of
//!   Claude Code's `settings.json` `hooks` object.
//! - [`run_all`] runs the handlers of one event in parallel and gives back
//!   what each said, in config order; what the answers mean is the event's
//!   business (its caller's).

mod config;
mod handler;
mod matcher;

pub use config::{DEFAULT_TIMEOUT, HandlerKind, HookHandler, HookMatcher, check_handlers};
pub use handler::{Answer, HOOK_CWD, Outcome, expand_env, run_all, run_one};
pub use matcher::{Matchers, compile_matcher, matches};
