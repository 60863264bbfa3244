//! Test support for omicos end-to-end tests: a scripted fake LLM, an
//! in-process stack of real services on loopback ports, a Chat client, and
//! certificates for TLS tests ([`pki`]).

pub mod fake_llm;
pub mod flaky_store;
pub mod idp;
pub mod pki;
pub mod stack;
pub mod stream_shapes;

pub use fake_llm::{FakeLlm, Reasoning, Reply, Shape};
pub use flaky_store::{FlakyStore, Op};
pub use stack::{
    ChatHandle, Client, Stack, StackOptions, TEST_TOKEN, api_key, assert_gap_free, client_at,
    client_with, done_reason, events_text, finished_calls,
};

/// An interpreter whose `python3 -c "import …"` of `imports` succeeds (the
/// A2A tests' a2a-sdk and uvicorn): OMICOS_A2A_PYTHON, the repo's .venv
/// (scripts/bootstrap.sh), or OMICOS_KERNEL_PYTHON; panics naming what to run.
pub fn python_importing(imports: &str) -> String {
    let candidates = [
        std::env::var("OMICOS_A2A_PYTHON").ok(),
        Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../.venv/bin/python3")
                .display()
                .to_string(),
        ),
        std::env::var("OMICOS_KERNEL_PYTHON").ok(),
    ];
    for py in candidates.into_iter().flatten().filter(|p| !p.is_empty()) {
        let ok = std::process::Command::new(&py)
            .args(["-c", &format!("import {imports}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return py;
        }
    }
    panic!("no Python imports {imports}: run scripts/bootstrap.sh (requirements.txt pins them)")
}
