//! The agent and skill catalog of omicos, and the small providers that go
//! with it.
//!
//! - [`Catalog`]: agents (Markdown + YAML frontmatter) from the workspace, the
//!   legacy workspace directory, the catalog cache and the built-in catalog,
//!   merged by precedence and gated by [`Tier`]; skills from their roots;
//!   reload on demand ([`Catalog::refresh`]) or on file change ([`Catalog::watch`]).
//! - Teams ([`Catalog::resolve_team`]), system prompts
//!   ([`Catalog::system_prompt`]) and run-time toolsets ([`runtime_toolsets`]).
//! - Providers hosted in process by the tool-runner: [`SkillProvider`]
//!   (`skill`, `skill_lookup`, `skill_resource`), [`ThinkProvider`],
//!   [`TaskProvider`] and [`PlanProvider`].

pub mod agent;
pub mod builtin;
pub mod catalog;
pub mod config;
pub mod frontmatter;
pub mod skill;
pub mod team;
pub mod tier;
pub mod tools;
pub mod watch;

pub use agent::{AgentSource, AgentSpec};
pub use catalog::{Catalog, RefreshReport, Snapshot, runtime_toolsets};
pub use config::{CatalogConfig, Config, ConfigError};
pub use skill::{Skill, SkillSource};
pub use team::{Team, TeamError};
pub use tier::{Tier, UnknownTier};
pub use tools::{PlanProvider, SkillProvider, TaskProvider, ThinkProvider};
pub use watch::{CatalogWatcher, WatchError};
