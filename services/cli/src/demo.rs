//! `omicos demo`: the whole stack on ephemeral ports, the replay backend on the
//! demo script, and the scripted conversation through the real Chat stream.
//! The model's turns are replayed; the kernel, the file tools, the delegation
//! and the approval are real, and each is checked afterwards.

use crate::render::{Renderer, View};
use crate::style::Style;
use crate::turn::{Approver, Interrupts, TurnError, TurnResult, connect, run_turn};
use omicos_proto::ToolStatus;
use omicos_proto::{ChatRequest, Decision, chat_event::Kind};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The demo's replay script.
pub const DEMO_SCRIPT: &str = include_str!("../../stack/scripts/demo.yaml");

/// What the user says in the demo.
pub const DEMO_PROMPT: &str = "Tabulate n, n² and n³ for n = 1..6 with a plot, write a short report into the workspace and check it reads back.";

/// How to run the demo.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Workspace; None: a fresh directory under the system temp dir.
    pub workspace: Option<PathBuf>,
    /// Environment (`OMICOS_*`, `OMICOS_KERNEL_PYTHON`, `VIRTUAL_ENV`).
    pub env: Vec<(String, String)>,
    /// Where to look for a project `.venv` (this directory and its parents).
    pub cwd: PathBuf,
}

/// One thing the demo promises, and whether it happened.
#[derive(Clone, Debug)]
pub struct Check {
    /// What should have happened.
    pub what: &'static str,
    /// Whether it did.
    pub ok: bool,
    /// Evidence or the reason it failed.
    pub detail: String,
}

/// The demo's outcome.
#[derive(Clone, Debug)]
pub struct DemoReport {
    /// The workspace it ran in.
    pub workspace: PathBuf,
    /// Every check, in order.
    pub checks: Vec<Check>,
}

impl DemoReport {
    /// Whether every step happened.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

fn env_get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter()
        .find(|(n, v)| n == k && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// The interpreter for the demo's kernel: `OMICOS_KERNEL_PYTHON`, else a
/// `.venv` in `cwd` or a parent (the repository's), else `$VIRTUAL_ENV`,
/// else `python3` on PATH. Returns (interpreter, where it came from).
pub fn find_kernel_python(env: &[(String, String)], cwd: &Path) -> (PathBuf, String) {
    if let Some(p) = env_get(env, "OMICOS_KERNEL_PYTHON") {
        return (PathBuf::from(p), "OMICOS_KERNEL_PYTHON".into());
    }
    for dir in cwd.ancestors() {
        let p = dir.join(".venv/bin/python3");
        if p.exists() {
            return (p, format!("{}/.venv", dir.display()));
        }
    }
    if let Some(v) = env_get(env, "VIRTUAL_ENV") {
        let p = Path::new(v).join("bin/python3");
        if p.exists() {
            return (p, "VIRTUAL_ENV".into());
        }
    }
    (PathBuf::from("python3"), "python3 on PATH".into())
}

/// Checks that `python` can run the demo (ipykernel and matplotlib import).
pub fn check_python(python: &Path, source: &str) -> Result<(), String> {
    let hint = "set one up from the repository root with `omicos kernel setup` (a ./.venv with ipykernel and requirements.txt, \
                which has matplotlib), or point OMICOS_KERNEL_PYTHON at an interpreter that has ipykernel and matplotlib";
    let out = std::process::Command::new(python)
        .args(["-c", "import ipykernel, matplotlib"])
        .output()
        .map_err(|e| {
            format!(
                "the demo's kernel needs Python, and {} ({source}) does not run: {e}; {hint}",
                python.display()
            )
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        Err(format!(
            "{} ({source}) cannot run the demo's kernel: {last}; {hint}",
            python.display()
        ))
    }
}

/// Runs the demo and prints it as the REPL would. Errors are setup failures
/// (no Python, the stack did not start); a run that misses a step returns a
/// report with failed checks.
pub async fn run(opts: DemoOptions) -> Result<DemoReport, String> {
    let st = Style::for_stdout();
    let (python, source) = find_kernel_python(&opts.env, &opts.cwd);
    check_python(&python, &source)?;
    let workspace = match &opts.workspace {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!(
            "omicos-demo-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )),
    };
    std::fs::create_dir_all(workspace.join(".omicos"))
        .map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
    let script = workspace.join(".omicos/demo-replay.yaml");
    std::fs::write(&script, DEMO_SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;

    let mut env: Vec<(String, String)> = opts
        .env
        .iter()
        .filter(|(k, _)| k != "OMICOS_KERNEL_PYTHON")
        .cloned()
        .collect();
    env.push(("OMICOS_KERNEL_PYTHON".into(), python.display().to_string()));
    let mut up = omicos_stack::UpOptions::new(&workspace);
    up.port_base = 0;
    up.replay_file = Some(script);
    up.env = env;
    up.web = false;
    println!(
        "{}",
        st.bold(
            "omicos demo: a scripted conversation on the replay backend; every tool call is real"
        )
    );
    println!(
        "{}",
        st.dim(&format!("kernel python: {} ({source})", python.display()))
    );
    let stack = omicos_stack::up(up).await?;
    let workspace = stack.workspace.clone();
    println!("{}", st.dim(&format!("workspace: {}", workspace.display())));
    for (name, url) in &stack.endpoints {
        println!("{}", st.dim(&format!("  {name:<13} {url}")));
    }
    println!();

    let result = async {
        let mut client = connect(&stack.orchestrator).await?;
        let mut r = Renderer::new(View::Human);
        let mut ints = Interrupts::install();
        println!("{} {DEMO_PROMPT}", st.bold("you>"));
        let req = ChatRequest {
            message: DEMO_PROMPT.into(),
            agent: "generalist".into(),
            team_members: vec!["generalist".into(), "data_analyst".into()],
            permission_mode: "auto".into(),
            ..Default::default()
        };
        match run_turn(
            &mut client,
            req,
            &mut r,
            &Approver::Auto(Decision::AllowSession),
            &mut ints,
        )
        .await
        {
            Ok(t) => Ok(t),
            Err(TurnError::Exit) => Err("interrupted".to_owned()),
            Err(TurnError::Failed(e)) => Err(e),
        }
    }
    .await;
    let stopped = stack.stop().await;
    let turn = result?;
    if let Err(e) = stopped {
        tracing::warn!("the stack stopped with errors: {e}");
    }
    let checks = checks(&turn, &workspace);
    println!();
    for c in &checks {
        let mark = if c.ok { st.green("✓") } else { st.red("✗") };
        println!("{mark} {} {}", c.what, st.dim(&format!("({})", c.detail)));
    }
    Ok(DemoReport { workspace, checks })
}

fn finished<'a>(t: &'a TurnResult, name: &str) -> Vec<&'a omicos_proto::ToolCallFinished> {
    t.events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolCallFinished(f)) if f.name == name => Some(f),
            _ => None,
        })
        .collect()
}

/// What the demo promises, checked against the events and the workspace.
pub fn checks(t: &TurnResult, ws: &Path) -> Vec<Check> {
    let mut out = vec![];
    let mut check =
        |what: &'static str, ok: bool, detail: String| out.push(Check { what, ok, detail });

    check(
        "the turn completed",
        t.reason == omicos_proto::TurnDoneReason::Completed,
        format!(
            "turn_done: {}",
            match t.reason {
                omicos_proto::TurnDoneReason::Unspecified => "none",
                r => r.as_str(),
            }
        ),
    );

    let delegated = t.events.iter().any(|e| matches!(&e.kind, Some(Kind::AgentSwitch(s)) if s.reason == "delegate" && s.to_agent == "data_analyst"));
    let returned = t.events.iter().any(|e| matches!(&e.kind, Some(Kind::AgentSwitch(s)) if s.reason == "return" && s.from_agent == "data_analyst"));
    let call_agent = finished(t, "call_agent");
    let ca_ok = call_agent
        .iter()
        .any(|f| f.status() == ToolStatus::Done && f.result.contains("441"));
    check(
        "a sub-agent was called (generalist → data_analyst and back)",
        delegated && returned && ca_ok,
        format!(
            "delegate {delegated}, return {returned}, call_agent done with the analyst's answer {ca_ok}"
        ),
    );

    let py = finished(t, "run_python_code");
    let outputs: Vec<Value> = py
        .iter()
        .map(|f| serde_json::from_str(&f.result).unwrap_or(Value::Null))
        .collect();
    let clean = py
        .iter()
        .zip(&outputs)
        .all(|(f, v)| f.status() == ToolStatus::Done && v["error"].is_null());
    let table = outputs.iter().any(|v| {
        v["stdout"]
            .as_str()
            .is_some_and(|s| s.contains("sum of cubes: 441"))
    });
    check(
        "Python computed the table in the kernel",
        py.len() == 2 && clean && table,
        format!(
            "{} run_python_code calls, all without error {clean}, table printed {table}",
            py.len()
        ),
    );

    let png = std::fs::read(ws.join("demo/plot.png")).unwrap_or_default();
    let is_png = png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000;
    check(
        "matplotlib drew the plot",
        is_png,
        format!("demo/plot.png: {} bytes", png.len()),
    );

    let asked: Vec<&omicos_proto::ToolApprovalRequest> = t
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolApprovalRequest(a)) => Some(a),
            _ => None,
        })
        .collect();
    let granted = t.events.iter().any(|e| {
        matches!(&e.kind, Some(Kind::ToolApprovalResolved(r)) if r.decision == Decision::AllowSession as i32 && r.source == "client")
    });
    let py_asked = asked
        .iter()
        .filter(|a| a.tool_name == "run_python_code")
        .count();
    check(
        "an approval was asked and granted for the session",
        !asked.is_empty() && granted && py_asked == 1,
        format!(
            "{} asked, granted for the session {granted}; run_python_code asked {py_asked}× for 2 calls",
            asked.len()
        ),
    );

    let wrote = finished(t, "file_manager__write")
        .iter()
        .any(|f| f.status() == ToolStatus::Done);
    let read_back = finished(t, "file_manager__read")
        .iter()
        .any(|f| f.status() == ToolStatus::Done && f.result.contains("omicos demo report"));
    let on_disk =
        std::fs::read_to_string(ws.join("demo/report.md")).is_ok_and(|s| s.contains("441 = 21^2"));
    check(
        "a file was written and read back",
        wrote && read_back && on_disk,
        format!("write {wrote}, read back {read_back}, demo/report.md on disk {on_disk}"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_script_parses_and_names_every_agent() {
        let v: serde_json::Value = serde_yaml::from_str(DEMO_SCRIPT).expect("demo.yaml is YAML");
        let steps = v["steps"].as_array().expect("steps");
        assert!(steps.len() >= 6);
        // An unnamed step would be taken by whichever agent asks first.
        assert!(
            steps.iter().all(|s| s["agent"].is_string()),
            "every step names its agent"
        );
        let tools: Vec<&str> = steps
            .iter()
            .flat_map(|s| s["tool_calls"].as_array().into_iter().flatten())
            .filter_map(|c| c["name"].as_str())
            .collect();
        for t in [
            "call_agent",
            "run_python_code",
            "file_manager__write",
            "file_manager__read",
        ] {
            assert!(tools.contains(&t), "{t} is scripted");
        }
    }

    #[test]
    fn python_is_found_from_the_environment_first_then_a_project_venv() {
        let dir = std::env::temp_dir().join(format!("omicos-cli-venv-{}", std::process::id()));
        let nested = dir.join("a/b");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::create_dir_all(dir.join(".venv/bin")).unwrap();
        std::fs::write(dir.join(".venv/bin/python3"), "").unwrap();
        let (p, src) = find_kernel_python(&[], &nested);
        assert_eq!(p, dir.join(".venv/bin/python3"));
        assert!(src.ends_with("/.venv"));
        let env = vec![("OMICOS_KERNEL_PYTHON".to_owned(), "/x/python".to_owned())];
        assert_eq!(
            find_kernel_python(&env, &nested).0,
            PathBuf::from("/x/python")
        );
        let err = check_python(Path::new("/nonexistent/python3"), "test").unwrap_err();
        assert!(err.contains("omicos kernel setup"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
