//! `omicos-tool-runner`: the ToolRunner and Registry services with the
//! built-in file_manager and shell providers.

use omicos_servicekit::{Binary, Started, run_main};
use omicos_tool_runner::Config;
use std::process::ExitCode;

const BINARY: Binary = Binary {
    name: "omicos-tool-runner",
    about: "Runs every tool call through the governed pipeline",
};

fn main() -> ExitCode {
    omicos_tool_runner::allocator::return_large_buffers();
    run_main(BINARY, run)
}

async fn run(started: Started<Config>) -> anyhow::Result<()> {
    let listener = omicos_servicekit::host::bind(&started.config.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    omicos_tool_runner::run(started.config, listener, started.shutdown, Vec::new()).await?;
    Ok(())
}
