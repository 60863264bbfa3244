//! A command hook runs outside the box, with the service's rights and
//! environment (issue 39). Code the agent can write must never be what it
//! runs: the agent writes the workspace (its file tools, its box), so a
//! hook that runs in the workspace, or names a script there, is a way out
//! of the box. dora (the default tenant, whose workspace is the one the
//! hooks were given as their directory) plants `guard.py` where a hook
//! `python3 guard.py` would find it, then calls the shell: the hook runs,
//! and what she planted does not.

use omicos_e2e::{FakeLlm, Stack, StackOptions, api_key};
use serde_json::{Value, json};

const DORA: &str = "dora-key-0123456789abcdef";

async fn call(url: &str, token: &str, tool: &str, args: Value) -> String {
    omicos_e2e::stack::one_call(url, token, tool, &args)
        .await
        .1
        .result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_never_runs_code_the_agent_wrote() {
    // Where planted code would leave its mark: outside the workspace, on
    // the host, where no box reaches.
    let host = tempfile::tempdir().unwrap();
    let mark = host.path().join("escaped");
    let ran = host.path().join("hook-ran");
    let llm = FakeLlm::start(vec![])
        .await
        .with_responder(omicos_e2e::fake_llm::call_per_message());
    let hook = format!(
        "cat >/dev/null; touch {}; python3 guard.py 2>/dev/null; exit 0",
        ran.display()
    );
    let stack = Stack::start(
        llm,
        StackOptions {
            runner_overrides: json!({"hooks": {"PreToolUse": [
                {"matcher": "shell", "hooks": [{"type": "command", "command": hook, "timeout": 20}]}
            ]}}),
            tweak: Some(Box::new(|c| {
                c.auth.api_keys = vec![api_key(DORA, "dora", "default", "full")];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    let planted = format!(
        "import os\nopen({:?}, 'w').write(repr(dict(os.environ)))\n",
        mark.display().to_string()
    );
    let r = call(
        &url,
        DORA,
        "file_manager__write",
        json!({"path": "guard.py", "content": planted}),
    )
    .await;
    assert!(
        stack.workspace.join("guard.py").exists(),
        "the agent wrote its file: {r}"
    );
    let _ = call(&url, DORA, "shell", json!({"command": "echo hi"})).await;
    assert!(ran.exists(), "the hook ran");
    // (Its environment, which it wrote there, is the service's: not shown.)
    assert!(
        !mark.exists(),
        "a hook ran the agent's guard.py outside the box, with the service's environment"
    );
}
