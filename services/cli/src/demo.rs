//! `omicos demo`: the whole stack on ephemeral ports, the replay backend on the
//! demo script, and the scripted conversation through the real Chat stream.
//! The model's turns are replayed; the kernel, the file tools, the delegation
//! and the approval are real, and each is checked afterwards.

use crate::error::CliError;
use crate::render::{Renderer, View};
use crate::style::Style;
use crate::turn::{Approver, Interrupts, TurnError, TurnResult, run_turn};
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
pub fn check_python(python: &Path, source: &str) -> Result<(), CliError> {
    let hint = "set one up from the repository root with `omicos kernel setup` (a ./.venv with ipykernel and requirements.txt, \
                which has matplotlib), or point OMICOS_KERNEL_PYTHON at an interpreter that has ipykernel and matplotlib";
    let out = std::process::Command::new(python)
        .args(["-c", "import ipykernel, matplotlib"])
        .output()
        .map_err(|e| {
            CliError::Python(format!(
                "the demo's kernel needs Python, and {} ({source}) does not run: {e}; {hint}",
                python.display()
            ))
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        Err(CliError::Python(format!(
            "{} ({source}) cannot run the demo's kernel: {last}; {hint}",
            python.display()
        )))
    }
}

/// Runs the demo and prints it as the REPL would. Errors are setup failures
/// (no Python, the stack did not start); a run that misses a step returns a
/// report with failed checks.
pub async fn run(opts: DemoOptions) -> Result<DemoReport, CliError> {
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
    std::fs::create_dir_all(workspace.join(".omicos")).map_err(|e| CliError::Io {
        what: format!("workspace {}", workspace.display()),
        source: e,
    })?;
    let script = workspace.join(".omicos/demo-replay.yaml");
    std::fs::write(&script, DEMO_SCRIPT).map_err(|e| CliError::Io {
        what: script.display().to_string(),
        source: e,
    })?;

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
        let mut client = crate::turn::connect_with(
            &stack.orchestrator,
            stack.token.as_deref().unwrap_or_default(),
        )
        .await?;
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
            None,
        )
        .await
        {
            Ok(t) => Ok(t),
            Err(TurnError::Exit) => Err(CliError::Turn("interrupted".to_owned())),
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

/// The arguments the model gave the first call of `name`, as JSON.
fn started_args(t: &TurnResult, name: &str) -> Value {
    t.events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolCallStarted(s)) if s.name == name => {
                serde_json::from_str(&s.arguments).ok()
            }
            _ => None,
        })
        .unwrap_or(Value::Null)
}

/// The table the demo asks for, computed here rather than taken from the
/// script, to hold the kernel's output against.
fn expected_rows() -> Vec<[u64; 3]> {
    (1..=6u64).map(|n| [n, n * n, n * n * n]).collect()
}

/// Rows of three integers in `text`, in order: the kernel's printed table
/// (`  1     1     1`) or the report's (`| 1 | 1 | 1 |`).
fn rows_in(text: &str) -> Vec<[u64; 3]> {
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .split(|c: char| c.is_whitespace() || c == '|')
                .filter(|c| !c.is_empty())
                .collect();
            match cells.as_slice() {
                [a, b, c] => Some([a.parse().ok()?, b.parse().ok()?, c.parse().ok()?]),
                _ => None,
            }
        })
        .collect()
}

/// `(N, M)` from the kernel's `sum of cubes: N = M^2` line.
fn printed_sum(stdout: &str) -> Option<(u64, u64)> {
    let rest = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("sum of cubes:"))?;
    let (n, m) = rest.split_once('=')?;
    Some((
        n.trim().parse().ok()?,
        m.trim().strip_suffix("^2")?.trim().parse().ok()?,
    ))
}

/// The size the kernel reported for the plot it saved (`saved demo/plot.png (N bytes)`).
fn saved_bytes(stdout: &str) -> Option<u64> {
    let rest = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("saved demo/plot.png ("))?;
    rest.strip_suffix(" bytes)")?.trim().parse().ok()
}

/// Width and height from a PNG's IHDR chunk, when `png` is one.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if !png.starts_with(b"\x89PNG\r\n\x1a\n") || png.get(12..16)? != b"IHDR" {
        return None;
    }
    let be = |r: std::ops::Range<usize>| -> Option<u32> {
        Some(u32::from_be_bytes(png.get(r)?.try_into().ok()?))
    };
    Some((be(16..20)?, be(20..24)?))
}

/// What the demo promises, checked against what the tools really produced:
/// the kernel's output in the tool results, the files on disk, and the
/// approval events. Nothing the replay script says is taken as evidence.
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

    // The sub-agent really ran: the switches, a call_agent that finished, and
    // the kernel calls made by the analyst inside the delegation's context.
    let delegated = t.events.iter().any(|e| matches!(&e.kind, Some(Kind::AgentSwitch(s)) if s.reason == "delegate" && s.to_agent == "data_analyst"));
    let returned = t.events.iter().any(|e| matches!(&e.kind, Some(Kind::AgentSwitch(s)) if s.reason == "return" && s.from_agent == "data_analyst"));
    let ca_ok = finished(t, "call_agent")
        .iter()
        .any(|f| f.status() == ToolStatus::Done);
    let by_analyst = t
        .events
        .iter()
        .filter(
            |e| matches!(&e.kind, Some(Kind::ToolCallFinished(f)) if f.name == "run_python_code"),
        )
        .all(|e| e.agent_id == "data_analyst" && e.execution_context_id.starts_with("root/"));
    check(
        "a sub-agent was called (generalist → data_analyst and back)",
        delegated && returned && ca_ok && by_analyst,
        format!(
            "delegate {delegated}, return {returned}, call_agent done {ca_ok}, kernel calls made by the analyst {by_analyst}"
        ),
    );

    let py = finished(t, "run_python_code");
    let outputs: Vec<Value> = py
        .iter()
        .map(|f| serde_json::from_str(&f.result).unwrap_or(Value::Null))
        .collect();
    let stdout = |i: usize| {
        outputs
            .get(i)
            .and_then(|v| v["stdout"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let clean = py
        .iter()
        .zip(&outputs)
        .all(|(f, v)| f.status() == ToolStatus::Done && v["error"].is_null());
    let want = expected_rows();
    let cubes: u64 = want.iter().map(|r| r[2]).sum();
    let printed = rows_in(&stdout(0));
    let table = printed == want;
    let sum = printed_sum(&stdout(0));
    let sum_ok = sum.is_some_and(|(n, m)| n == cubes && m * m == n);
    check(
        "Python computed the table in the kernel",
        py.len() == 2 && clean && table && sum_ok,
        format!(
            "{} run_python_code calls, all without error {clean}; the kernel printed {} rows, as computed here {table}; its sum of cubes {} (expected {cubes})",
            py.len(),
            printed.len(),
            sum.map(|(n, m)| format!("{n} = {m}^2"))
                .unwrap_or_else(|| "missing".into())
        ),
    );

    let png = std::fs::read(ws.join("demo/plot.png")).unwrap_or_default();
    let dims = png_size(&png);
    let said = saved_bytes(&stdout(1));
    let plot_ok = dims.is_some_and(|(w, h)| w > 0 && h > 0) && said == Some(png.len() as u64);
    check(
        "matplotlib drew the plot",
        plot_ok,
        format!(
            "demo/plot.png on disk: {} bytes, {}; the kernel reported {}",
            png.len(),
            dims.map(|(w, h)| format!("a {w}×{h} PNG"))
                .unwrap_or_else(|| "not a PNG".into()),
            said.map(|n| format!("{n} bytes"))
                .unwrap_or_else(|| "no size".into())
        ),
    );

    // Every approval asked was answered by the client; the kernel was asked
    // about once and allowed for the session, so its second call ran unasked.
    let asked: Vec<&omicos_proto::ToolApprovalRequest> = t
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolApprovalRequest(a)) => Some(a),
            _ => None,
        })
        .collect();
    let resolved = |call: &str| {
        t.events.iter().find_map(|e| match &e.kind {
            Some(Kind::ToolApprovalResolved(r)) if r.call_id == call => Some(r),
            _ => None,
        })
    };
    let answered = asked.iter().all(|a| {
        resolved(&a.call_id)
            .is_some_and(|r| r.source == "client" && r.decision != Decision::Deny as i32)
    });
    let py_asked: Vec<&&omicos_proto::ToolApprovalRequest> = asked
        .iter()
        .filter(|a| a.tool_name == "run_python_code")
        .collect();
    let granted = py_asked.first().is_some_and(|a| {
        resolved(&a.call_id).is_some_and(|r| r.decision == Decision::AllowSession as i32)
    });
    check(
        "an approval was asked and granted for the session",
        !asked.is_empty() && answered && granted && py_asked.len() == 1 && py.len() == 2,
        format!(
            "{} asked, each answered by the client {answered}; run_python_code asked {}× for {} calls, allowed for the session {granted}",
            asked.len(),
            py_asked.len(),
            py.len()
        ),
    );

    // The file on disk is what the write was given, the read returned it,
    // and its table agrees with what the kernel computed.
    let wrote = finished(t, "file_manager__write")
        .iter()
        .any(|f| f.status() == ToolStatus::Done);
    let disk = std::fs::read_to_string(ws.join("demo/report.md")).unwrap_or_default();
    let given = started_args(t, "file_manager__write")["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let as_written = !disk.is_empty() && disk == given;
    let read_back = finished(t, "file_manager__read").iter().any(|f| {
        f.status() == ToolStatus::Done && !disk.is_empty() && f.result.contains(disk.trim_end())
    });
    let agrees = rows_in(&disk) == printed && !printed.is_empty();
    check(
        "a file was written and read back",
        wrote && as_written && read_back && agrees,
        format!(
            "write done {wrote}; demo/report.md on disk ({} bytes) is what was written {as_written}, read back whole {read_back}, its table matches the kernel's {agrees}",
            disk.len()
        ),
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
        let err = check_python(Path::new("/nonexistent/python3"), "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains("omicos kernel setup"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The events a good run produces, with the files the tools wrote.
    fn good_run(ws: &Path) -> TurnResult {
        use omicos_proto::{
            AgentSwitch, ChatEvent, ToolApprovalRequest, ToolApprovalResolved, ToolCallFinished,
            ToolCallStarted,
        };
        let ev = |agent: &str, ctx: &str, kind: Kind| ChatEvent {
            agent_id: agent.into(),
            execution_context_id: ctx.into(),
            kind: Some(kind),
            ..Default::default()
        };
        let done = |id: &str, name: &str, result: String| {
            Kind::ToolCallFinished(ToolCallFinished {
                call_id: id.into(),
                name: name.into(),
                status: ToolStatus::Done as i32,
                result,
                ..Default::default()
            })
        };
        std::fs::create_dir_all(ws.join("demo")).unwrap();
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x01\x40\0\0\0\xf0".to_vec();
        png.resize(2000, 0);
        std::fs::write(ws.join("demo/plot.png"), &png).unwrap();
        let report = "# omicos demo report\n\n| n | n^2 | n^3 |\n|---|-----|-----|\n| 1 | 1 | 1 |\n| 2 | 4 | 8 |\n| 3 | 9 | 27 |\n| 4 | 16 | 64 |\n| 5 | 25 | 125 |\n| 6 | 36 | 216 |\n";
        std::fs::write(ws.join("demo/report.md"), report).unwrap();
        let table = "  n   n^2   n^3\n  1     1     1\n  2     4     8\n  3     9    27\n  4    16    64\n  5    25   125\n  6    36   216\nsum of cubes: 441 = 21^2\n";
        let sub = "root/c1";
        TurnResult {
            reason: omicos_proto::TurnDoneReason::Completed,
            events: vec![
                ev(
                    "generalist",
                    "root",
                    Kind::AgentSwitch(AgentSwitch {
                        from_agent: "generalist".into(),
                        to_agent: "data_analyst".into(),
                        reason: "delegate".into(),
                        depth: 1,
                    }),
                ),
                ev(
                    "data_analyst",
                    sub,
                    Kind::ToolApprovalRequest(ToolApprovalRequest {
                        call_id: "p1".into(),
                        tool_name: "run_python_code".into(),
                        ..Default::default()
                    }),
                ),
                ev(
                    "data_analyst",
                    sub,
                    Kind::ToolApprovalResolved(ToolApprovalResolved {
                        call_id: "p1".into(),
                        decision: Decision::AllowSession as i32,
                        source: "client".into(),
                    }),
                ),
                ev(
                    "data_analyst",
                    sub,
                    done(
                        "p1",
                        "run_python_code",
                        json!({"stdout": table}).to_string(),
                    ),
                ),
                ev(
                    "data_analyst",
                    sub,
                    done(
                        "p2",
                        "run_python_code",
                        json!({"stdout": "saved demo/plot.png (2000 bytes)\n"}).to_string(),
                    ),
                ),
                ev(
                    "generalist",
                    "root",
                    Kind::AgentSwitch(AgentSwitch {
                        from_agent: "data_analyst".into(),
                        to_agent: "generalist".into(),
                        reason: "return".into(),
                        depth: 1,
                    }),
                ),
                ev(
                    "generalist",
                    "root",
                    done("c1", "call_agent", "the analyst's answer".into()),
                ),
                ev(
                    "generalist",
                    "root",
                    Kind::ToolCallStarted(ToolCallStarted {
                        call_id: "w1".into(),
                        name: "file_manager__write".into(),
                        arguments: json!({"path": "demo/report.md", "content": report}).to_string(),
                    }),
                ),
                ev(
                    "generalist",
                    "root",
                    done("w1", "file_manager__write", "wrote".into()),
                ),
                ev(
                    "generalist",
                    "root",
                    done(
                        "r1",
                        "file_manager__read",
                        format!("{report}[lines 1-10 of 10; end of file]"),
                    ),
                ),
            ],
            ..Default::default()
        }
    }

    use serde_json::json;

    fn failed(t: &TurnResult, ws: &Path) -> Vec<&'static str> {
        checks(t, ws)
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| c.what)
            .collect()
    }

    fn replace_stdout(t: &mut TurnResult, from: &str, to: &str) {
        for e in &mut t.events {
            if let Some(Kind::ToolCallFinished(f)) = &mut e.kind {
                f.result = f.result.replace(from, to);
            }
        }
    }

    #[test]
    fn the_checks_hold_what_the_tools_produced_not_what_the_script_says() {
        let ws = tempfile::tempdir().unwrap();
        let t = good_run(ws.path());
        assert!(
            failed(&t, ws.path()).is_empty(),
            "{:?}",
            checks(&t, ws.path())
        );

        // The kernel printing a wrong sum, or a wrong row, fails the table check.
        let mut bad = good_run(ws.path());
        replace_stdout(&mut bad, "441 = 21^2", "440 = 21^2");
        assert_eq!(
            failed(&bad, ws.path()),
            ["Python computed the table in the kernel"]
        );
        let mut bad = good_run(ws.path());
        replace_stdout(&mut bad, "36   216", "36   215");
        assert!(failed(&bad, ws.path()).contains(&"Python computed the table in the kernel"));

        // A plot whose size is not what the kernel saved, or that is not a PNG.
        let t = good_run(ws.path());
        std::fs::write(ws.path().join("demo/plot.png"), b"not a png").unwrap();
        assert_eq!(failed(&t, ws.path()), ["matplotlib drew the plot"]);

        // A report on disk that differs from what was written.
        let t = good_run(ws.path());
        std::fs::write(ws.path().join("demo/report.md"), "# omicos demo report\n").unwrap();
        assert_eq!(failed(&t, ws.path()), ["a file was written and read back"]);

        // An approval nobody answered, or a kernel call made outside the sub-agent.
        let mut bad = good_run(ws.path());
        bad.events
            .retain(|e| !matches!(e.kind, Some(Kind::ToolApprovalResolved(_))));
        assert_eq!(
            failed(&bad, ws.path()),
            ["an approval was asked and granted for the session"]
        );
        let mut bad = good_run(ws.path());
        for e in &mut bad.events {
            e.agent_id = "generalist".into();
        }
        assert_eq!(
            failed(&bad, ws.path()),
            ["a sub-agent was called (generalist → data_analyst and back)"]
        );
    }
}
