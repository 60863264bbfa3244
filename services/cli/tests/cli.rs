//! The `omicos` binary against a real stack on loopback ports (the whole
//! stack of `omicos up`, with the scripted fake LLM speaking OpenAI SSE):
//! the REPL driven in a pseudo-terminal, piped mode and its exit codes, the
//! one-shot commands, re-attach through a proxy that cuts the stream, `omicos
//! up` as a child process, and `omicos demo` on a fresh workspace.

use expectrl::{ControlCode, Session};
use omicos_e2e::fake_llm::{FakeLlm, Reply};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_omicos");

/// The token of the stack this test started (each test is its own process
/// under nextest); every `omicos` child gets it as OMICOS_TOKEN, as a user
/// would export it.
static TOKEN: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn set_token(t: &str) {
    *TOKEN.lock().unwrap() = t.to_owned();
}

fn token() -> String {
    TOKEN.lock().unwrap().clone()
}

/// The repository root (where `.venv` lives).
fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

struct Stack {
    stack: Option<omicos_stack::RunningStack>,
    url: String,
    workspace: tempfile::TempDir,
}

impl Stack {
    /// The stack with the fake LLM as its model; no kernel, web or memory provider (not needed here).
    async fn start(llm: &FakeLlm) -> Stack {
        let workspace = tempfile::tempdir().unwrap();
        let mut o = omicos_stack::UpOptions::new(workspace.path());
        o.port_base = 0;
        o.kernel = false;
        o.web = false;
        o.memory = false;
        o.env = vec![
            ("OMICOS_LLM_BACKEND".into(), "openai".into()),
            ("OMICOS_LLM_BASE_URL".into(), llm.openai_url()),
            ("OMICOS_LLM_API_KEY".into(), "test-key".into()),
            ("OMICOS_LLM_MODEL".into(), "fake-model".into()),
            ("OMICOS_LLM_RETRY_BASE_MS".into(), "20".into()),
        ];
        let stack = omicos_stack::up(o).await.expect("stack up");
        set_token(stack.token.as_deref().expect("the stack makes a token"));
        let url = stack.orchestrator.clone();
        Stack {
            stack: Some(stack),
            url,
            workspace,
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stack.take() {
            let _ = s.stop().await;
        }
    }
}

/// Runs `omicos ARGS` with `stdin` piped in; returns (code, stdout, stderr).
async fn run_piped(args: &[&str], stdin: &str) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(BIN)
            .args(&args)
            .env("NO_COLOR", "1")
            .env("OMICOS_TOKEN", token())
            .env_remove("OMICOS_SERVER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn omicos");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// Spawns `omicos chat` in a pseudo-terminal (a dumb one: plain line editing, no progress bars).
fn spawn_chat(args: &[&str]) -> Session {
    spawn_chat_on("dumb", args)
}

/// Spawns `omicos chat` in a pseudo-terminal of type `term`.
fn spawn_chat_on(term: &str, args: &[&str]) -> Session {
    let mut cmd = Command::new(BIN);
    cmd.arg("chat")
        .args(args)
        .env("NO_COLOR", "1")
        .env("OMICOS_TOKEN", token())
        .env("TERM", term);
    let mut s = Session::spawn(cmd).expect("spawn in a pty");
    s.set_expect_timeout(Some(Duration::from_secs(20)));
    s
}

/// The exit code of a pty session's process.
fn exit_code(s: &Session) -> i32 {
    match s.get_process().wait().expect("wait") {
        expectrl::WaitStatus::Exited(_, code) => code,
        other => panic!("omicos did not exit normally: {other:?}"),
    }
}

fn write_call(id: &str, path: &str, content: &str) -> Reply {
    let args = serde_json::json!({"path": path, "content": content}).to_string();
    Reply::Tools(
        "Let me write it.".into(),
        vec![(id.into(), "file_manager__write".into(), args)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repl_streams_text_and_answers_an_approval_at_the_prompt() {
    let llm = FakeLlm::start(vec![
        write_call("call_w1", "hello.txt", "hi from the pty"),
        Reply::Slow(
            "The file hello.txt is written and holds the greeting, as asked.".into(),
            Duration::from_millis(100),
        ),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.clone();
    let ws = stack.workspace.path().to_path_buf();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = spawn_chat(&["--server", &url, "--mode", "auto"]);
        s.expect("you> ").unwrap();
        s.send_line("please write hello.txt").unwrap();
        s.expect("Let me write it.").unwrap();
        s.expect("file_manager__write").unwrap();
        s.expect("wants to run").unwrap();
        s.expect("allow? [y] once").unwrap();
        // Nothing ran before the answer.
        assert!(
            !ws.join("hello.txt").exists(),
            "the write waited for the approval"
        );
        s.send_line("y").unwrap();
        s.expect("allowed once").unwrap();
        s.expect("file_manager__write done").unwrap();
        // Streamed: the first words show before the model has sent the rest.
        s.expect("The file").unwrap();
        let all_at_once = !s.check("as asked.").unwrap().is_empty();
        s.expect("as asked.").unwrap();
        s.expect("you> ").unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.join("hello.txt")).unwrap(),
            "hi from the pty"
        );
        s.send(ControlCode::EndOfTransmission).unwrap();
        (exit_code(&s), all_at_once)
    })
    .await
    .unwrap();
    assert_eq!(code.0, 0, "Ctrl-D at the prompt exits 0");
    assert!(!code.1, "the answer arrived in pieces, not all at once");
    llm.assert_invariants();
    stack.stop().await;
}

/// `/attach PATH` at the REPL's prompt: the file is uploaded at once and goes
/// with the next message (the model is told where it is); a missing file or
/// no path is said at the prompt and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repl_attaches_a_file_to_the_next_message() {
    let llm = FakeLlm::start(vec![Reply::Text("Lisboa is warmer.".into())]).await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.clone();
    let local = tempfile::tempdir().unwrap();
    let csv = "city,temp\nOslo,-3\nLisboa,17\n";
    let file = local.path().join("data.csv");
    std::fs::write(&file, csv).unwrap();
    let path = file.display().to_string();
    let missing = local.path().join("nope.csv").display().to_string();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = spawn_chat(&["--server", &url]);
        s.expect("you> ").unwrap();
        s.send_line("/attach").unwrap();
        s.expect("usage: /attach PATH").unwrap();
        s.expect("you> ").unwrap();
        s.send_line(format!("/attach {missing}")).unwrap();
        s.expect("cannot attach").unwrap();
        s.expect("you> ").unwrap();
        s.send_line(format!("/attach {path}")).unwrap();
        s.expect(
            format!(
                "attached data.csv as uploads/data.csv ({} bytes)",
                csv.len()
            )
            .as_str(),
        )
        .unwrap();
        s.expect("it goes with your next message").unwrap();
        s.expect("you> ").unwrap();
        s.send_line("Which city is warmer?").unwrap();
        s.expect("Lisboa is warmer.").unwrap();
        s.expect("you> ").unwrap();
        s.send(ControlCode::EndOfTransmission).unwrap();
        exit_code(&s)
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    let landed = files_ending_with(stack.workspace.path(), "uploads/data.csv");
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(std::fs::read(&landed[0]).unwrap(), csv.as_bytes());
    assert!(files_ending_with(stack.workspace.path(), "nope.csv").is_empty());
    // One model request, for the message; it names the file.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1);
    let sent = omicos_e2e::fake_llm::user_messages(&reqs[0].body).join("\n");
    assert!(
        sent.starts_with(&format!(
            "Which city is warmer?\n\nAttached files (in the workspace): uploads/data.csv ({} bytes)",
            csv.len()
        )),
        "{sent}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_typed_while_a_turn_streams_is_steered_into_it() {
    let llm = FakeLlm::start(vec![
        Reply::Streamed {
            text: "Counting the files slowly, one by one, before I list them.".into(),
            chunks: 12,
            delay: Duration::from_millis(300),
            calls: vec![(
                "call_s1".into(),
                "file_manager__list".into(),
                r#"{"path": "."}"#.into(),
            )],
        },
        Reply::Text("Listed, and named the biggest one.".into()),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.clone();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = spawn_chat(&["--server", &url]);
        s.expect("you> ").unwrap();
        s.send_line("count the files").unwrap();
        s.expect("Counting").unwrap();
        // Typed while the answer streams: it goes to the running turn.
        s.send_line("and name the biggest one").unwrap();
        s.expect("sent to the running turn").unwrap();
        // It joined the turn at the next model request, after the list call.
        s.expect("you (steer)> and name the biggest one").unwrap();
        s.expect("named the biggest one.").unwrap();
        s.expect("you> ").unwrap();
        s.send(ControlCode::EndOfTransmission).unwrap();
        exit_code(&s)
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one turn, two model requests");
    let users = omicos_e2e::fake_llm::user_messages(&reqs[1].body);
    assert!(
        users.iter().any(|m| m.contains("and name the biggest one")),
        "the model read the steered message: {users:?}"
    );
    assert!(
        !omicos_e2e::fake_llm::user_messages(&reqs[0].body)
            .iter()
            .any(|m| m.contains("and name the biggest one")),
        "not before it was typed"
    );
    llm.assert_invariants();
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_the_turn_and_a_second_ctrl_c_exits() {
    let slow = "This answer is long and slow on purpose, so that there is time to press Ctrl-C in the middle of it. ".repeat(4);
    let llm = FakeLlm::start(vec![
        Reply::Slow(slow.clone(), Duration::from_millis(100)),
        Reply::Slow(slow, Duration::from_millis(100)),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.clone();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = spawn_chat(&["--server", &url]);
        s.expect("you> ").unwrap();
        s.send_line("talk slowly").unwrap();
        s.expect("This answer").unwrap();
        s.send(ControlCode::EndOfText).unwrap();
        s.expect("cancelling the turn").unwrap();
        s.expect("(turn cancelled)").unwrap();
        // The REPL is back and the session goes on.
        s.expect("you> ").unwrap();
        s.send_line("again, slowly").unwrap();
        s.expect("This answer").unwrap();
        s.send(ControlCode::EndOfText).unwrap();
        s.expect("cancelling the turn").unwrap();
        s.send(ControlCode::EndOfText).unwrap();
        exit_code(&s)
    })
    .await
    .unwrap();
    assert_eq!(code, 130, "a second Ctrl-C exits with 128+SIGINT");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_mode_prints_the_answer_and_exit_codes_tell_success_from_error() {
    let llm = FakeLlm::start(vec![
        Reply::Text("Four.".into()),
        Reply::Text("Still four.".into()),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.as_str();

    let (code, out, err) = run_piped(&["chat", "--server", url], "What is 2 + 2?\n").await;
    assert_eq!(code, 0, "stderr: {err}");
    assert_eq!(out, "Four.\n", "only the answer on stdout");
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .expect("the session id on stderr")
        .to_owned();

    // The same session, as JSON lines: every line an event, the last one turn_done.
    let (code, out, err) = run_piped(
        &["chat", "--server", url, "--session", &session, "--json"],
        "And now?",
    )
    .await;
    assert_eq!(code, 0, "stderr: {err}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(events.first().unwrap()["type"], "turn_started");
    assert_eq!(events.last().unwrap()["type"], "turn_done");
    assert_eq!(events.last().unwrap()["reason"], "completed");
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Still four.");
    assert!(events.iter().all(|e| e["session_id"] == session.as_str()));
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["event_seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gap-free: {seqs:?}"
    );

    // An unknown session: the error is said and the exit code is not 0.
    let (code, _, err) = run_piped(
        &["chat", "--server", url, "--session", "no-such-session"],
        "hello",
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("session_not_found") && err.contains("no-such-session"),
        "{err}"
    );

    // An unreachable server.
    let (code, _, err) = run_piped(&["chat", "--server", "http://127.0.0.1:9"], "hello").await;
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the orchestrator at http://127.0.0.1:9"),
        "{err}"
    );

    // A bad permission mode is refused before anything is sent, clearly.
    let (code, _, err) = run_piped(&["chat", "--server", url, "--mode", "yolo"], "hello").await;
    assert_eq!(code, 2);
    assert!(err.contains("unknown permission mode `yolo`"), "{err}");
    let (code, _, err) = run_piped(&["up", "--port-base", "65535"], "").await;
    assert_eq!(code, 2);
    assert!(err.contains("at most 65531"), "{err}");

    // Nothing to say.
    let (code, _, err) = run_piped(&["chat", "--server", url], "  \n").await;
    assert_eq!(code, 2);
    assert!(err.contains("no message on stdin"), "{err}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_mode_denies_approvals_it_cannot_ask_for() {
    let llm = FakeLlm::start(vec![
        write_call("call_w2", "nope.txt", "x"),
        Reply::Text("Understood, I will not write it.".into()),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let (code, out, err) = run_piped(
        &["chat", "--server", &stack.url, "--mode", "auto"],
        "write nope.txt",
    )
    .await;
    assert_eq!(code, 0, "the turn itself completed: {err}");
    assert!(err.contains("stdin is not a terminal: denied"), "{err}");
    assert!(out.contains("Understood"), "{out}");
    assert!(!stack.workspace.path().join("nope.txt").exists());
    stack.stop().await;
}

/// Every file under `root` whose path ends with `rel` (the caller's
/// workspace is the root, or a tenant's folder under it).
fn files_ending_with(root: &std::path::Path, rel: &str) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.to_string_lossy().ends_with(&format!("/{rel}")) {
                out.push(p);
            }
        }
    }
    out
}

/// `omicos chat --attach FILE`, piped: the file lands in the workspace
/// under uploads/ with its bytes, the model's request names it, and a
/// second copy of the same name is kept beside the first. A file that
/// cannot be read is refused up front (exit 2), and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_chat_attaches_files_and_refuses_a_missing_one() {
    let llm = FakeLlm::start(vec![
        Reply::Text("Lisboa is warmer.".into()),
        Reply::Text("Two copies.".into()),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.as_str();
    let local = tempfile::tempdir().unwrap();
    let csv = "city,temp\nOslo,-3\nLisboa,17\nnaïve ✓\n";
    let file = local.path().join("data.csv");
    std::fs::write(&file, csv).unwrap();
    let path = file.to_str().unwrap();

    let (code, out, err) = run_piped(
        &["chat", "--server", url, "--attach", path],
        "Which city is warmer?\n",
    )
    .await;
    assert_eq!(code, 0, "stderr: {err}");
    assert_eq!(out, "Lisboa is warmer.\n", "only the answer on stdout");
    assert!(
        err.contains(&format!(
            "attached data.csv as uploads/data.csv ({} bytes)",
            csv.len()
        )),
        "{err}"
    );
    let landed = files_ending_with(stack.workspace.path(), "uploads/data.csv");
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(std::fs::read(&landed[0]).unwrap(), csv.as_bytes());
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1);
    let sent = omicos_e2e::fake_llm::user_messages(&reqs[0].body).join("\n");
    assert!(
        sent.starts_with(&format!(
            "Which city is warmer?\n\nAttached files (in the workspace): uploads/data.csv ({} bytes)",
            csv.len()
        )),
        "{sent}"
    );
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .expect("the session id on stderr")
        .to_owned();

    // The same name again, into the same session: kept beside the first.
    std::fs::write(&file, "second\n").unwrap();
    let (code, _, err) = run_piped(
        &[
            "chat",
            "--server",
            url,
            "--session",
            &session,
            "--attach",
            path,
        ],
        "And now?",
    )
    .await;
    assert_eq!(code, 0, "stderr: {err}");
    assert!(
        err.contains("attached data.csv as uploads/data (1).csv (7 bytes)"),
        "{err}"
    );
    let second = files_ending_with(stack.workspace.path(), "uploads/data (1).csv");
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(std::fs::read(&second[0]).unwrap(), b"second\n");
    assert_eq!(std::fs::read(&landed[0]).unwrap(), csv.as_bytes());
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    assert!(
        omicos_e2e::fake_llm::user_messages(&reqs[1].body)
            .iter()
            .any(|m| m.contains(
                "And now?\n\nAttached files (in the workspace): uploads/data (1).csv (7 bytes)"
            )),
        "{:?}",
        omicos_e2e::fake_llm::user_messages(&reqs[1].body)
    );

    // A file that is not there: said with its path, exit 2, nothing sent.
    let missing = local.path().join("missing.csv");
    let (code, out, err) = run_piped(
        &[
            "chat",
            "--server",
            url,
            "--attach",
            missing.to_str().unwrap(),
        ],
        "Read this",
    )
    .await;
    assert_eq!(code, 2, "stderr: {err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(&format!("cannot attach {}", missing.display()))
            && err.contains("nothing was sent"),
        "{err}"
    );
    assert_eq!(
        llm.requests().len(),
        2,
        "no model request for a refused attach"
    );
    assert!(files_ending_with(stack.workspace.path(), "uploads/missing.csv").is_empty());
    stack.stop().await;
}

/// `omicos sessions fork|rewind|rename` against the stack: a rewind puts
/// back what the last turn's file tool wrote; errors exit 1 and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_fork_rewind_and_rename_commands() {
    let llm = FakeLlm::start(vec![
        write_call("c1", "notes.txt", "v1"),
        Reply::Text("done one".into()),
        write_call("c2", "notes.txt", "v2"),
        Reply::Text("done two".into()),
    ])
    .await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.as_str();
    let notes = stack.workspace.path().join("notes.txt");
    let (code, _, err) = run_piped(&["chat", "--server", url, "--mode", "full"], "one").await;
    assert_eq!(code, 0, "{err}");
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap()
        .to_owned();
    let (code, _, err) = run_piped(
        &[
            "chat",
            "--server",
            url,
            "--mode",
            "full",
            "--session",
            &session,
        ],
        "two",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v2");

    // A fork at the first event holds the first turn.
    let (code, out, err) = run_piped(
        &[
            "sessions", "fork", &session, "--event", "1", "--server", url,
        ],
        "",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 turn,"), "{out}");
    let fork = out.split_whitespace().next().unwrap().to_owned();
    let (code, out, _) = run_piped(&["sessions", "show", &fork, "--server", url], "").await;
    assert_eq!(code, 0);
    assert!(
        out.contains("you> one") && !out.contains("you> two"),
        "{out}"
    );

    let (code, out, err) = run_piped(&["sessions", "rewind", &session, "--server", url], "").await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("rewound 1 turn") && out.contains("restored notes.txt"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v1");
    let (_, out, _) = run_piped(&["sessions", "show", &session, "--server", url], "").await;
    assert!(
        out.contains("you> one") && !out.contains("you> two"),
        "{out}"
    );

    let (code, _, err) = run_piped(
        &[
            "sessions",
            "rename",
            &session,
            "Release notes",
            "--server",
            url,
        ],
        "",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = run_piped(&["sessions", "--server", url], "").await;
    assert!(out.contains("Release notes"), "{out}");

    let (code, _, err) = run_piped(
        &[
            "sessions", "rewind", &session, "--turns", "5", "--server", url,
        ],
        "",
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("last_turns is 5"), "{err}");
    let (code, _, err) = run_piped(
        &[
            "sessions", "fork", &session, "--turn", "nope", "--files", "--server", url,
        ],
        "",
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("turn `nope` is not in the history"), "{err}");
    let (code, _, _) = run_piped(&["sessions", "rename", &session, " ", "--server", url], "").await;
    assert_eq!(code, 1);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_tools_sessions_and_approve_commands() {
    let llm = FakeLlm::start(vec![Reply::Text("Hello there.".into())]).await;
    let stack = Stack::start(&llm).await;
    let url = stack.url.as_str();

    let (code, out, err) = run_piped(&["agents", "--server", url], "").await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("generalist") && out.contains("data_analyst"),
        "{out}"
    );

    // What the demo relies on: the generalist writes and reads files and delegates; the analyst runs Python.
    let (code, out, err) = run_piped(
        &[
            "tools",
            "--server",
            url,
            "--agent",
            "generalist",
            "--mode",
            "auto",
        ],
        "",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    for t in ["file_manager__write", "file_manager__read", "call_agent"] {
        assert!(out.contains(t), "{t} missing:\n{out}");
    }
    let (code, out, _) = run_piped(
        &[
            "tools",
            "--server",
            url,
            "--agent",
            "generalist",
            "--mode",
            "read_only",
        ],
        "",
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        !out.contains("file_manager__write"),
        "read_only hides writes:\n{out}"
    );

    let (code, _, err) = run_piped(
        &["chat", "--server", url, "--agent", "generalist"],
        "Say hello",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap()
        .to_owned();

    let (code, out, _) = run_piped(&["sessions", "--server", url], "").await;
    assert_eq!(code, 0);
    assert!(out.contains(&session) && out.contains("Say hello"), "{out}");
    let (code, out, _) = run_piped(&["sessions", "show", &session, "--server", url], "").await;
    assert_eq!(code, 0);
    assert!(
        out.contains("you> Say hello") && out.contains("Hello there."),
        "{out}"
    );
    let (code, _, err) = run_piped(&["sessions", "show", "missing", "--server", url], "").await;
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    // A value of the session, whole, and nothing else on stdout.
    let value = |id: &str, args: &[&str]| {
        let mut a = vec!["sessions", "value", id];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--server", url]);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| async move {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run_piped(&a, "").await
    };
    let (code, out, err) = run(value(
        &session,
        &["--message", "0", "--pointer", "/content"],
    ))
    .await;
    assert_eq!((code, out.as_str()), (0, "Say hello"), "{err}");
    // Resumed: the rest from the offset; past the end, a clear refusal.
    let (code, out, err) = run(value(
        &session,
        &["--message", "0", "--pointer", "/content", "--offset", "4"],
    ))
    .await;
    assert_eq!((code, out.as_str()), (0, "hello"), "{err}");
    let (code, out, err) = run(value(
        &session,
        &["--message", "0", "--pointer", "/content", "--offset", "10"],
    ))
    .await;
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("offset 10 is past the end of the value (9 bytes)"),
        "{err}"
    );
    let (code, _, err) = run(value(
        "missing",
        &["--message", "0", "--pointer", "/content"],
    ))
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    let (code, _, err) = run(value(&session, &["--event", "1", "--field", "nope"])).await;
    assert_eq!(code, 1);
    assert!(err.contains("no event carries a field `nope`"), "{err}");
    let (code, _, err) = run(value(&session, &[])).await;
    assert_ne!(code, 0);
    assert!(err.contains("--event N --field F"), "{err}");

    let (code, _, err) = run_piped(
        &["approve", &session, "call_x", "allow", "--server", url],
        "",
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("no approval is pending for call `call_x`"),
        "{err}"
    );
    let (code, _, err) = run_piped(
        &["approve", &session, "call_x", "perhaps", "--server", url],
        "",
    )
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("not a decision"), "{err}");
    stack.stop().await;
}

/// A TCP proxy in front of the orchestrator that can cut every open connection,
/// as a flaky network or a load balancer would.
struct CuttingProxy {
    url: String,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl CuttingProxy {
    async fn start(target: &str) -> CuttingProxy {
        let target = target.trim_start_matches("http://").to_owned();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let c2 = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c2.lock().unwrap().push(h.abort_handle());
            }
        });
        CuttingProxy { url, conns }
    }

    /// Drops every connection open now.
    fn cut(&self) -> usize {
        let mut c = self.conns.lock().unwrap();
        let n = c.len();
        for h in c.drain(..) {
            h.abort();
        }
        n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_is_reattached_without_losing_or_repeating_events() {
    let text: String = (1..=30).map(|i| format!("w{i} ")).collect();
    let llm = FakeLlm::start(vec![Reply::Slow(text.clone(), Duration::from_millis(60))]).await;
    let stack = Stack::start(&llm).await;
    let proxy = CuttingProxy::start(&stack.url).await;
    let mut child = tokio::process::Command::new(BIN)
        .args(["chat", "--json", "--server", &proxy.url])
        .env("NO_COLOR", "1")
        .env("OMICOS_TOKEN", token())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"count slowly").await.unwrap();
    }
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut events = vec![];
    let mut cut = 0;
    while let Some(l) = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("events keep coming")
        .unwrap()
    {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        if v["type"] == "text_delta" && cut == 0 && v["text"].as_str().unwrap().contains("w3") {
            cut = proxy.cut();
        }
        events.push(v);
    }
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(cut >= 1, "the proxy had a connection to cut");
    assert!(out.status.success(), "stderr: {err}");
    assert!(err.contains("re-attached after event"), "{err}");
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["event_seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "nothing lost or repeated across the re-attach: {seqs:?}"
    );
    let got: String = events
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(got, text);
    assert_eq!(events.last().unwrap()["reason"], "completed");
    stack.stop().await;
}

/// `omicos up` as a person runs it: prints the URLs, serves (here the offline
/// replay, no model configured), and drains on Ctrl-C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_prints_its_urls_serves_offline_and_stops_on_ctrl_c() {
    let ws = tempfile::tempdir().unwrap();
    // From the repository root, as the README says, with no interpreter
    // configured: the kernels find the root's .venv by themselves.
    let (mut child, mut lines, printed) = start_up(ws.path(), &repo_root()).await;
    // `omicos up` made the workspace's token (0600) and said where it is.
    let token_file = ws.path().canonicalize().unwrap().join(".omicos/token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the token is the owner's only");
    assert!(
        printed
            .iter()
            .any(|l| l.contains(&token_file.display().to_string())),
        "{printed:?}"
    );
    let (code, _, err) = run_piped(
        &["chat", "--server", &printed_url(&printed), "--mode", "full"],
        "hello",
    )
    .await;
    assert_ne!(code, 0, "no token, no chat");
    assert!(err.contains("Unauthenticated"), "{err}");
    set_token(std::fs::read_to_string(&token_file).unwrap().trim());
    let url = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("orchestrator"))
        .map(|u| u.trim().to_owned())
        .unwrap_or_else(|| panic!("no orchestrator URL in {printed:?}"));
    let venv_python = format!(
        "kernel python {} ({})",
        repo_root().join(".venv/bin/python3").display(),
        repo_root().join(".venv").display()
    );
    for s in [
        "tool-runner",
        "kernel",
        "web",
        "memory",
        "llm backend   replay",
        &venv_python,
    ] {
        assert!(
            printed.iter().any(|l| l.contains(s)),
            "{s} not printed: {printed:?}"
        );
    }
    assert!(
        !printed.iter().any(|l| l.contains("python3 from PATH")),
        "{printed:?}"
    );
    // The page, on the orchestrator's own port, as a browser asks for it.
    let page = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("page "))
        .map(|u| u.trim().to_owned())
        .unwrap_or_else(|| panic!("no page URL in {printed:?}"));
    let token = std::fs::read_to_string(ws.path().join(".omicos/token")).unwrap();
    assert_eq!(page, format!("{url}/#token={}", token.trim()));
    let res = http_get(page.split('#').next().unwrap()).await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    assert!(res.contains(r#"<div id="app">"#), "{res}");
    let (code, out, err) = run_piped(&["chat", "--server", &url, "--mode", "full"], "hello").await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("offline replay"), "{out}");
    assert!(
        ws.path().join("notes/offline.md").exists(),
        "the offline script's tool calls are real"
    );

    // Ctrl-C, as the terminal would send it.
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("drains in time")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let mut rest = vec![];
    while let Ok(Some(l)) = lines.next_line().await {
        rest.push(l);
    }
    assert!(
        rest.iter().any(|l| l.contains("draining")) && rest.iter().any(|l| l == "stopped"),
        "{rest:?}"
    );
}

/// A plain HTTP/1.1 GET of `url` (`http://host:port/path`): the whole response, head and body.
async fn http_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut conn = tokio::net::TcpStream::connect(host).await.unwrap();
    conn.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out))
        .await
        .expect("the page answers")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn printed_url(printed: &[String]) -> String {
    printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("orchestrator"))
        .map(|u| u.trim().to_owned())
        .unwrap_or_else(|| panic!("no orchestrator URL in {printed:?}"))
}

/// Starts `omicos up` on free ports in `cwd`, with no model and no Python
/// interpreter configured, and returns what it printed up to its hint line.
async fn start_up(
    workspace: &std::path::Path,
    cwd: &std::path::Path,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    Vec<String>,
) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["up", "--port-base", "0", "--workspace"])
        .arg(workspace)
        .current_dir(cwd)
        .env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("OMICOS_LLM_")
            || k == "OPENAI_API_KEY"
            || k == "ANTHROPIC_API_KEY"
            || k == "OMICOS_SERVER"
            || k == "OMICOS_KERNEL_PYTHON"
            || k == "OMICOS_ENV_DIR"
            || k == "VIRTUAL_ENV"
            || k == "CONDA_PREFIX"
        {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut printed = vec![];
    while let Some(l) = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("omicos up prints")
        .unwrap()
    {
        printed.push(l.clone());
        if l.contains("talk to it") {
            break;
        }
    }
    (child, lines, printed)
}

/// Where no project venv can be found, `omicos up` says at start that the
/// kernels fall back to python3 from PATH, and what to do about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_says_when_the_kernels_fall_back_to_python3_on_path() {
    let ws = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let (mut child, _lines, printed) = start_up(ws.path(), elsewhere.path()).await;
    assert!(
        printed
            .iter()
            .any(|l| l.contains("kernel python python3 (python3 on PATH)")),
        "{printed:?}"
    );
    assert!(
        printed.iter().any(|l| l.contains("python3 from PATH")
            && l.contains("OMICOS_KERNEL_PYTHON")
            && l.contains("omicos kernel setup")),
        "{printed:?}"
    );
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("drains in time")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_completes_offline_on_a_fresh_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(["demo", "--workspace"])
        .arg(ws.path())
        .current_dir(repo_root())
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("demo passed"), "{stdout}");
    assert!(!stdout.contains('✗'), "every check passed:\n{stdout}");
    assert!(
        stdout.contains(
            "(demo) answering the approval for run_python_code: allowed for this session"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("hands over to data_analyst"), "{stdout}");
    assert!(
        std::fs::read(ws.path().join("demo/plot.png"))
            .unwrap()
            .starts_with(b"\x89PNG")
    );
    assert!(
        std::fs::read_to_string(ws.path().join("demo/report.md"))
            .unwrap()
            .contains("441")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_setup_reuses_an_existing_venv_and_says_where_it_is() {
    // A venv that already has ipykernel (the repository's): setup keeps it and needs no download.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo_root().join(".venv"), dir.path().join(".venv")).unwrap();
    let (code, out, err) = run_piped(
        &["kernel", "setup", "--dir", dir.path().to_str().unwrap()],
        "",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kernel venv ready") && out.contains(".venv/bin/python3"),
        "{out}"
    );
    // A directory where no venv can be made fails with the step that failed.
    let (code, _, err) = run_piped(
        &["kernel", "setup", "--dir", "/proc/omicos-no-such-dir"],
        "",
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("omicos kernel setup:") && err.contains("venv"),
        "{err}"
    );
}

/// Tool progress (a tqdm bar in the real kernel) shows as a progress bar, and
/// the REPL still prints the call's end and the answer after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repl_shows_kernel_progress_as_a_progress_bar() {
    let code = "from tqdm import tqdm\nimport time\nfor i in tqdm(range(40), desc='crunching'):\n    time.sleep(0.05)\nprint('crunched')";
    let args = serde_json::json!({"code": code}).to_string();
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![("call_p1".into(), "run_python_code".into(), args)],
        ),
        Reply::Text("Crunched all forty.".into()),
    ])
    .await;
    let workspace = tempfile::tempdir().unwrap();
    let mut o = omicos_stack::UpOptions::new(workspace.path());
    o.port_base = 0;
    o.web = false;
    o.memory = false;
    o.env = vec![
        ("OMICOS_LLM_BACKEND".into(), "openai".into()),
        ("OMICOS_LLM_BASE_URL".into(), llm.openai_url()),
        ("OMICOS_LLM_API_KEY".into(), "test-key".into()),
        ("OMICOS_LLM_MODEL".into(), "fake-model".into()),
        (
            "OMICOS_KERNEL_PYTHON".into(),
            repo_root().join(".venv/bin/python3").display().to_string(),
        ),
    ];
    let stack = omicos_stack::up(o).await.expect("stack up");
    set_token(stack.token.as_deref().expect("the stack makes a token"));
    let url = stack.orchestrator.clone();
    let code = tokio::task::spawn_blocking(move || {
        // A real terminal type: indicatif hides bars on a dumb one.
        let mut s = spawn_chat_on(
            "xterm-256color",
            &[
                "--server",
                &url,
                "--agent",
                "data_analyst",
                "--mode",
                "full",
            ],
        );
        s.expect("you> ").unwrap();
        s.send_line("crunch").unwrap();
        s.expect("run_python_code").unwrap();
        // indicatif's bar: "<label> [====>   ] <pos>/<len>".
        s.expect(expectrl::Regex(r"crunching \[=*>? *\] \d+/40"))
            .unwrap();
        s.expect("run_python_code done").unwrap();
        s.expect("Crunched all forty.").unwrap();
        s.expect("you> ").unwrap();
        s.send(ControlCode::EndOfTransmission).unwrap();
        exit_code(&s)
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    let _ = stack.stop().await;
}
