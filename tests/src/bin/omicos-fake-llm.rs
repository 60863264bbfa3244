//! The scripted fake LLM ([`omicos_e2e::FakeLlm`]) as a process, for stacks
//! started outside a Rust test (scripts/ui-stack-test.sh runs `omicos up`
//! against it for the browser tests):
//!
//! ```text
//! omicos-fake-llm SCRIPT.json
//! ```
//!
//! SCRIPT.json is in the format of ui/tests/stack-script.json (one reply per
//! model request). Prints `openai http://127.0.0.1:PORT/v1` once it listens,
//! answers OpenAI Chat Completions and Anthropic Messages SSE, and exits on
//! SIGTERM or Ctrl-C, printing how many requests it answered.

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: omicos-fake-llm SCRIPT.json");
        return ExitCode::from(2);
    };
    let script = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        .and_then(|v| omicos_e2e::fake_llm::script_from_json(&v))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("omicos-fake-llm: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let replies = script.len();
    let llm = omicos_e2e::FakeLlm::start(script).await;
    println!("openai {}", llm.openai_url());
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("omicos-fake-llm: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let n = llm.requests().len();
    println!("answered {n} requests ({replies} scripted)");
    ExitCode::SUCCESS
}
