//! `omicos mcp serve`: omicos's tools for an MCP client (Claude Code, codex,
//! goose, ...) over stdio, each call through the runner's pipeline. With
//! `--runner URL` it uses a running tool-runner (e.g. the one `omicos up`
//! started); without, it starts the whole stack in this process on ephemeral
//! ports (kernel, memory, web, ...) and serves its runner.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The command line of `omicos mcp serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A running tool-runner (`http://host:port`); default: start the stack here.
    #[arg(long)]
    pub runner: Option<String>,
    /// Workspace of the stack started here.
    #[arg(long, default_value = "omicos-workspace")]
    pub workspace: PathBuf,
    /// Whole-stack YAML config of the stack started here; its
    /// `tool_runner.mcp.serve` section gives the permission mode and toolsets.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Permission mode of the calls: read_only, auto (approvals become MCP
    /// elicitations) or full. Overrides the config.
    #[arg(long)]
    pub mode: Option<String>,
}

fn serve_config(
    args: &ServeArgs,
    env: &[(String, String)],
) -> Result<omicos_mcp::ServeConfig, String> {
    let mut cfg = match &args.config {
        Some(p) => {
            let v = omicos_servicekit::config::read_yaml(p, env).map_err(|e| e.to_string())?;
            let section = v
                .get("tool_runner")
                .cloned()
                .unwrap_or(serde_yaml::Value::Null);
            let rcfg: omicos_tool_runner::Config =
                omicos_servicekit::config::load_config_value(Some(section), env, "tool_runner")
                    .map_err(|e| e.to_string())?;
            rcfg.mcp.serve
        }
        None => omicos_mcp::ServeConfig::default(),
    };
    if let Some(m) = &args.mode {
        omicos_proto::PermissionMode::parse(m).map_err(|e| format!("--mode: {e}"))?;
        cfg.permission_mode = m.clone();
    }
    Ok(cfg)
}

/// Serves until the client closes stdin.
pub async fn serve(args: ServeArgs) -> ExitCode {
    let env = omicos_servicekit::config::process_env();
    let cfg = match serve_config(&args, &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("omicos mcp serve: {e}");
            return ExitCode::from(2);
        }
    };
    let mut stack = None;
    // A running runner takes the deployment's secret from the environment;
    // the stack started here has its own.
    let mut secret = env
        .iter()
        .find(|(k, _)| k == "OMICOS_SERVICE_SECRET")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let runner = match args.runner.clone() {
        Some(r) => r,
        None => {
            let mut opts = omicos_stack::UpOptions::new(&args.workspace);
            opts.config_file = args.config.clone();
            opts.port_base = 0;
            opts.env = env;
            match omicos_stack::up(opts).await {
                Ok(s) => {
                    let r = s.runner.clone();
                    secret = s.service_secret.clone();
                    stack = Some(s);
                    r
                }
                Err(e) => {
                    eprintln!("omicos mcp serve: cannot start the stack: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    };
    let backend = match omicos_mcp::serve::RunnerBackend::with_secret(&runner, &secret) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("omicos mcp serve: {e}");
            return ExitCode::from(2);
        }
    };
    let r = omicos_mcp::serve::serve_stdio(backend, &cfg).await;
    if let Some(s) = stack {
        s.shutdown.trigger();
    }
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omicos mcp serve: {e}");
            ExitCode::from(1)
        }
    }
}
