//! Configuration of the pdf tools (the `pdf:` section of a whole-stack file).

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Configuration of the pdf tools (a `pdf:` section of the tool-runner's
/// config; environment `OMICOS_PDF_*` when nested so).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Largest PDF opened, in MiB.
    pub max_file_mb: u64,
    /// Largest decompressed content of one page, in MiB.
    pub max_page_content_mb: usize,
    /// Characters `pdf__read` returns when the call names no `max_chars`.
    pub default_max_chars: usize,
    /// Most characters `pdf__read` returns whatever the call asks.
    pub max_chars_limit: usize,
    /// Time one call may spend parsing (at most an hour is used).
    #[serde(with = "duration")]
    pub time_budget: Duration,
    /// Files parsed at once; further calls wait for a slot.
    pub max_parallel: usize,
    /// Matches `pdf__search` lists when the call names no `max_results`.
    pub default_max_results: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_file_mb: 100,
            max_page_content_mb: 32,
            default_max_chars: 20_000,
            max_chars_limit: 200_000,
            time_budget: Duration::from_secs(30),
            max_parallel: 2,
            default_max_results: 20,
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[Renamed::to("time_budget_secs", "time_budget")];

    fn validate(&self) -> Result<(), ConfigError> {
        require_nonzero("time_budget", self.time_budget)
    }
}
