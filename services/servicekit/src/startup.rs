//! How every omicos service binary starts and ends, in one place: parse
//! `--config FILE`, load and validate the config, start logs and traces,
//! install the drain on SIGINT/SIGTERM, run, and on failure print one line
//! that names the service, with one exit code per kind of failure.

use crate::config::{ConfigError, ServiceConfig, load_config_noting, process_env};
use crate::{Shutdown, telemetry};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code of a service that failed while running (bind, store, I/O).
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code of a service whose config (or command line) cannot be used.
pub const EXIT_CONFIG: u8 = 2;

/// What a binary says about itself.
#[derive(Clone, Copy, Debug)]
pub struct Binary {
    /// The binary's name, as in logs and error lines (`omicos-kernel`).
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
}

/// What [`run_main`] hands the service once its config is loaded.
#[derive(Debug)]
pub struct Started<C> {
    /// The validated config.
    pub config: C,
    /// The process environment it was read from (for later look-ups such as API keys).
    pub env: Vec<(String, String)>,
    /// Drains on SIGINT/SIGTERM, with the config's grace period.
    pub shutdown: Shutdown,
}

#[derive(clap::Parser, Debug)]
struct Args {
    /// YAML config file; `OMICOS_*` environment variables override it (see docs/configuration.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Runs a service binary: `fn main() -> ExitCode { run_main(BINARY, |s| async { .. }) }`.
///
/// Exits 0 when `run` returns Ok, [`EXIT_CONFIG`] when the config cannot be
/// used (or `run` fails with a [`ConfigError`] in its chain), and
/// [`EXIT_RUNTIME`] for any other failure; each failure is one line on
/// stderr, `<name>: <error: its causes>`. Bad command-line arguments exit 2
/// with clap's usage message.
pub fn run_main<C, F, Fut>(bin: Binary, run: F) -> ExitCode
where
    C: ServiceConfig,
    F: FnOnce(Started<C>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let args = parse_args(bin);
    let env = process_env();
    let loaded = match load_config_noting::<C>(args.config.as_deref(), &env) {
        Ok(l) => l,
        Err(e) => return fail(bin.name, &anyhow::Error::new(e)),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(bin.name, &anyhow::Error::new(e).context("tokio runtime")),
    };
    runtime.block_on(async move {
        let filter = loaded.config.log_filter().unwrap_or("info").to_owned();
        let _telemetry = telemetry::init(bin.name, &filter);
        let _metrics = match crate::metrics::init(bin.name, loaded.config.metrics_addr()).await {
            Ok(m) => m,
            Err(e) => return fail(bin.name, &anyhow::Error::new(e)),
        };
        for d in &loaded.deprecations {
            d.warn_once();
        }
        let shutdown = Shutdown::new(loaded.config.shutdown_grace());
        shutdown.on_signals();
        let started = Started {
            config: loaded.config,
            env,
            shutdown,
        };
        match run(started).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(bin.name, &e),
        }
    })
}

fn parse_args(bin: Binary) -> Args {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command()
        .name(bin.name)
        .bin_name(bin.name)
        .about(bin.about)
        .version(env!("CARGO_PKG_VERSION"))
        .get_matches();
    Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The exit code for `e`: [`EXIT_CONFIG`] when a [`ConfigError`] is in its chain.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<ConfigError>()) {
        EXIT_CONFIG
    } else {
        EXIT_RUNTIME
    }
}

/// `<name>: <error: causes>` as one line on stderr, and its exit code.
fn fail(name: &str, e: &anyhow::Error) -> ExitCode {
    eprintln!("{name}: {}", one_line(e));
    ExitCode::from(exit_code(e))
}

/// An error and its causes on one line, without repeating a cause that the
/// message above it already quotes.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let t = c.to_string();
        if out.contains(&t) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&t);
    }
    out.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_exit_2_and_the_rest_1_on_one_line() {
        let cfg = anyhow::Error::new(ConfigError::key("kernel.timeout", "must be more than 0"));
        assert_eq!(exit_code(&cfg), EXIT_CONFIG);
        let wrapped = anyhow::Error::new(ConfigError::key("web.allow", "bad entry"))
            .context("starting the web provider");
        assert_eq!(exit_code(&wrapped), EXIT_CONFIG);
        assert_eq!(
            one_line(&wrapped),
            "starting the web provider: config key `web.allow`: bad entry"
        );
        let io = anyhow::Error::new(std::io::Error::other("address in use\nretry"))
            .context("cannot listen on 127.0.0.1:7000");
        assert_eq!(exit_code(&io), EXIT_RUNTIME);
        assert_eq!(
            one_line(&io),
            "cannot listen on 127.0.0.1:7000: address in use retry"
        );
    }
}
