//! The replicated deployment as separate processes on loopback (issue 13,
//! "Tests"): one PostgreSQL database (a fresh schema), one workspace, two
//! orchestrators, three tool-runners on the shared registry, two kernel
//! providers and a web provider that register through runner A only, and
//! the fake LLM, each its own process, configured through the same
//! `OMICOS_*` keys as deploy/compose.yaml. Faults are real SIGKILLs.
//!
//! It checks, in order: a provider registered through runner A is used
//! through runners B and C; ApproveTool and CancelTurn sent to the
//! orchestrator that does not run the turn; an allow-for-session grant that
//! holds for the next turn on the other orchestrator; kill -9 of the runner
//! running a call; kill -9 of the orchestrator running a turn (a client
//! attached through the other one sees it closed as INTERRUPTED); kill -9 of
//! the kernel provider running a cell. For each it prints one row of the
//! table in docs/operations.md — what the client saw, events lost and
//! duplicated against the store's log (asserted 0), and the time until the
//! client saw the outcome.
//!
//! SKIPPED without PostgreSQL (a failure under CI=true, see omicos-testdb).
//! Needs ipykernel (the README's .venv, or OMICOS_KERNEL_PYTHON).

use omicos_e2e::stack::{
    ChatHandle, TEST_TOKEN, client_at, done_reason, finished_calls, turn_moved,
};
use omicos_e2e::{FakeLlm, Reply};
use omicos_proto::{
    ApproveToolRequest, AttachRequest, CancelTurnRequest, ChatEvent, ChatRequest, Decision,
    ExecuteClientMessage, ExecuteStart, ListProvidersRequest, ToolCallFinished, ToolResult,
    ToolStatus, chat_event, execute_client_message::Msg as In, execute_server_message::Msg as Out,
    registry_client::RegistryClient, tool_runner_client::ToolRunnerClient,
};
use omicos_sessionstore::SessionStore;
use prost::Message;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_stream::wrappers::ReceiverStream;

/// The turn lease of the orchestrators: the shortest allowed, so a lost
/// orchestrator's turn is closed within seconds.
const LEASE: Duration = Duration::from_secs(5);
/// The workspace agent every turn of the test runs as.
const AGENT: &str = "cluster_tester";
/// Generous bound on any wait for a condition (a loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(45);

/// The interpreter with ipykernel: OMICOS_KERNEL_PYTHON, else the repo's .venv.
fn python() -> String {
    let py = std::env::var("OMICOS_KERNEL_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../.venv/bin/python3")
                .display()
                .to_string()
        });
    let ok = std::process::Command::new(&py)
        .args(["-c", "import ipykernel"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{py} cannot import ipykernel: run the README's setup (.venv) or set OMICOS_KERNEL_PYTHON"
    );
    py
}

/// The service binaries, next to this crate's `omicos-fake-llm` in the same
/// target directory; built first (cargo is quick when they are fresh).
struct Bins {
    orchestrator: PathBuf,
    runner: PathBuf,
    kernel: PathBuf,
    web: PathBuf,
    llm: PathBuf,
}

fn binaries() -> Bins {
    let llm = PathBuf::from(env!("CARGO_BIN_EXE_omicos-fake-llm"));
    // Under scripts/test.sh the binaries were built before the suite
    // (OMICOS_TEST_BINS_BUILT): building here while other tests run could
    // relink a binary, or a test executable, at the moment one is started.
    if std::env::var_os("OMICOS_TEST_BINS_BUILT").is_none() {
        let status = std::process::Command::new(env!("CARGO"))
            // The whole workspace's tests, as `cargo nextest run --workspace` builds
            // them: the same feature set, so nothing is rebuilt when it is fresh
            // (a `-p` build unifies features differently and rebuilds the deps).
            // `--bins` too: `--tests` builds a package's binaries only when it has
            // integration tests, and the orchestrator has none.
            .args(["build", "-q", "--workspace", "--bins", "--tests"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the service binaries failed");
    }
    let bin = |name: &str| {
        let p = llm.with_file_name(name);
        assert!(p.exists(), "{} missing after the build", p.display());
        p
    };
    Bins {
        orchestrator: bin("omicos-orchestrator"),
        runner: bin("omicos-tool-runner"),
        kernel: bin("omicos-kernel"),
        web: bin("omicos-web"),
        llm,
    }
}

/// One service process.
struct Proc {
    name: String,
    child: Child,
    /// `http://127.0.0.1:PORT`
    addr: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }
    fn signal(&self, sig: i32) {
        let pid = self.pid();
        if pid > 0 {
            unsafe { libc::kill(pid, sig) };
        }
    }
    fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }
    /// SIGKILL, and waits until the process is gone.
    async fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = tokio::time::timeout(WAIT, self.child.wait()).await;
    }
}

/// Starts `bin`; returns once it printed its address (`<prefix>http://…`).
async fn spawn(
    name: &str,
    bin: &Path,
    args: &[String],
    env: &[(&str, String)],
    prefix: &str,
) -> Proc {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {}: {e}", bin.display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{name} printed no address within {WAIT:?}"))
        .unwrap()
        .unwrap_or_default();
    let addr = line
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{name}: expected `{prefix}…`, got `{line}`"))
        .trim()
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Proc {
        name: name.into(),
        child,
        addr,
    }
}

/// What every process of the deployment shares.
struct Shared {
    bins: Bins,
    ws: tempfile::TempDir,
    db: omicos_testdb::Backend,
    secret: String,
    /// The orchestrators' config file (the client API key).
    config_file: PathBuf,
}

/// The whole deployment.
struct Cluster {
    sh: Shared,
    store: Arc<dyn SessionStore>,
    /// The model's URL: the fake LLM process's, or a server in the test.
    llm: String,
    _llm_proc: Option<Proc>,
    runners: Vec<Proc>,
    orchestrators: Vec<Proc>,
    kernels: Vec<Proc>,
    _web: Proc,
}

impl Drop for Cluster {
    /// Whatever still runs in the test's workspace (kernels and shells of
    /// killed providers and runners, or of every part after a failed
    /// assertion, when kill_on_drop SIGKILLs the services): not the test's
    /// to leave behind. Found by working directory, killed by pid.
    fn drop(&mut self) {
        for p in self
            .orchestrators
            .iter()
            .chain(&self.runners)
            .chain(&self.kernels)
        {
            p.signal(libc::SIGKILL);
        }
        let ws = self.sh.ws.path().to_path_buf();
        for pid in pids_in(&ws) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Pids of the processes whose working directory is `dir`.
fn pids_in(dir: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(dir)) {
            out.push(pid);
        }
    }
    out
}

impl Shared {
    fn runner_env(&self, listen: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OMICOS_LISTEN", listen.to_owned()),
            ("OMICOS_WORKSPACE", self.ws.path().display().to_string()),
            ("OMICOS_REGISTRY_STORE_URL", self.db.url.clone()),
            ("OMICOS_SERVICE_SECRET", self.secret.clone()),
            ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
        ]
    }

    async fn start_runner(&self, name: &str, listen: &str) -> Proc {
        spawn(
            name,
            &self.bins.runner,
            &[],
            &self.runner_env(listen),
            "listening on ",
        )
        .await
    }

    async fn start_orchestrator(&self, name: &str, runners: &[Proc], llm: &str) -> Proc {
        let runners: Vec<&str> = runners.iter().map(|r| r.addr.as_str()).collect();
        let env = vec![
            ("OMICOS_LISTEN", "127.0.0.1:0".to_owned()),
            ("OMICOS_WORKSPACE", self.ws.path().display().to_string()),
            // As deploy/ has it, a list here instead of one name: loopback
            // has no DNS name that resolves to every runner.
            ("OMICOS_TOOL_RUNNER", runners.join(",")),
            ("OMICOS_RUNNER_REFRESH", "500ms".into()),
            ("OMICOS_STORE_URL", self.db.url.clone()),
            ("OMICOS_LLM_BACKEND", "openai".into()),
            ("OMICOS_LLM_BASE_URL", llm.to_owned()),
            ("OMICOS_LLM_MODEL", "fake-model".into()),
            ("OMICOS_LLM_API_KEY", "test-key".into()),
            ("OMICOS_LLM_RETRY_BASE_DELAY", "20ms".into()),
            ("OMICOS_LLM_RETRY_MAX_DELAY", "200ms".into()),
            ("OMICOS_TURN_LEASE", format!("{}s", LEASE.as_secs())),
            ("OMICOS_HEARTBEAT_INTERVAL", "2s".into()),
            ("OMICOS_SERVICE_SECRET", self.secret.clone()),
            ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
            // Only the workspace's agents, not the user's catalog cache.
            (
                "OMICOS_AGENT_CACHE_DIR",
                self.ws
                    .path()
                    .join(".omicos/no-agent-cache")
                    .display()
                    .to_string(),
            ),
        ];
        let args = vec![
            "--config".to_owned(),
            self.config_file.display().to_string(),
        ];
        let p = spawn(name, &self.bins.orchestrator, &args, &env, "listening on ").await;
        wait_serving(&p.addr).await;
        p
    }

    async fn start_kernel(&self, name: &str, registry: &Proc) -> Proc {
        let env = vec![
            ("OMICOS_LISTEN", "127.0.0.1:0".to_owned()),
            ("OMICOS_WORKSPACE", self.ws.path().display().to_string()),
            // Every provider registers through runner A only.
            ("OMICOS_REGISTRY", registry.addr.clone()),
            ("OMICOS_KERNEL_PYTHON", python()),
            ("OMICOS_KERNEL_POOL_SIZE", "0".into()),
            // Long: a loss must be seen from the failed call, not from expiry.
            ("OMICOS_REGISTRY_TTL", "60s".into()),
            ("OMICOS_SERVICE_SECRET", self.secret.clone()),
            ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
        ];
        spawn(name, &self.bins.kernel, &[], &env, "listening on ").await
    }

    async fn start_web(&self, registry: &Proc) -> Proc {
        let env = vec![
            ("OMICOS_LISTEN", "127.0.0.1:0".to_owned()),
            ("OMICOS_REGISTRY", registry.addr.clone()),
            // The test's page is on loopback.
            ("OMICOS_WEB_ALLOW", "127.0.0.1".into()),
            ("OMICOS_REGISTRY_TTL", "60s".into()),
            ("OMICOS_SERVICE_SECRET", self.secret.clone()),
            ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
        ];
        spawn("web", &self.bins.web, &[], &env, "listening on ").await
    }
}

impl Cluster {
    /// Starts every part; None without PostgreSQL. `page` is the URL the
    /// script's web_fetch reads.
    async fn start(test: &str, page: &str) -> Option<Cluster> {
        Self::start_with(test, page, None).await
    }

    /// [`Self::start`], with the model at `llm` (a server in the test) instead
    /// of the fake LLM process with the script of [`script_json`].
    async fn start_with(test: &str, page: &str, llm: Option<String>) -> Option<Cluster> {
        let db = omicos_testdb::postgres(test, "clu").await?;
        let bins = binaries();
        let ws = tempfile::tempdir().unwrap();
        let secret = format!("s-{}", uuid::Uuid::new_v4().simple());
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let tmp = std::env::temp_dir();
        // The client API key, in the orchestrators' config file (as an
        // operator mounts it from a Secret).
        let config_file = tmp.join(format!("omicos-cluster-{unique}.yaml"));
        std::fs::write(
            &config_file,
            format!(
                "auth:\n  api_keys:\n    - sha256: {}\n      principal: tester\n      tenant: default\n      max_mode: full\n",
                omicos_auth::sha256_hex(TEST_TOKEN)
            ),
        )
        .unwrap();
        let script = tmp.join(format!("omicos-cluster-script-{unique}.json"));
        std::fs::write(
            &script,
            script_json(page, &ws.path().join(CELL_MARKER)).to_string(),
        )
        .unwrap();
        // The agent the test's turns name: every toolset the scenarios
        // call (the default agent has no kernel, shell or web tools).
        let agents = ws.path().join(".omicos/agents");
        std::fs::create_dir_all(&agents).unwrap();
        std::fs::write(
            agents.join(format!("{AGENT}.md")),
            format!(
                "---\nid: {AGENT}\nname: Cluster tester\ndescription: runs the cluster test's tools\n\
                 toolsets: [integrated_notebook, shell, web, file_manager, think]\n---\n\
                 You run the tools the test asks for.\n"
            ),
        )
        .unwrap();
        let sh = Shared {
            bins,
            ws,
            db,
            secret,
            config_file,
        };
        let (llm, llm_proc) = match llm {
            Some(url) => (url, None),
            None => {
                let p = spawn(
                    "fake-llm",
                    &sh.bins.llm,
                    &[script.display().to_string()],
                    &[],
                    "openai ",
                )
                .await;
                (p.addr.clone(), Some(p))
            }
        };
        let _ = std::fs::remove_file(&script);
        let store = omicos_sessionstore::open(&sh.db.url).await.unwrap();
        let mut runners = vec![];
        for name in ["runner-a", "runner-b", "runner-c"] {
            runners.push(sh.start_runner(name, "127.0.0.1:0").await);
        }
        let mut kernels = vec![];
        for name in ["kernel-1", "kernel-2"] {
            kernels.push(sh.start_kernel(name, &runners[0]).await);
        }
        let web = sh.start_web(&runners[0]).await;
        let mut orchestrators = vec![];
        for name in ["orchestrator-1", "orchestrator-2"] {
            orchestrators.push(sh.start_orchestrator(name, &runners, &llm).await);
        }
        Some(Cluster {
            sh,
            store,
            llm,
            _llm_proc: llm_proc,
            runners,
            orchestrators,
            kernels,
            _web: web,
        })
    }

    /// The session's log in the store: (seq, event).
    async fn log(&self, session: &str) -> Vec<ChatEvent> {
        self.store
            .events_since(session, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, b)| ChatEvent::decode(b.as_slice()).unwrap())
            .collect()
    }

    /// Events the client missed and saw twice, against the store's log of
    /// the turns the client saw (all turns when `turns` is None).
    async fn lost_and_dup(&self, session: &str, seen: &[ChatEvent], all: bool) -> (usize, usize) {
        let turns: BTreeSet<&str> = seen.iter().map(|e| e.turn_id.as_str()).collect();
        let stored: BTreeSet<u64> = self
            .log(session)
            .await
            .iter()
            .filter(|e| all || turns.contains(e.turn_id.as_str()))
            .map(|e| e.event_seq)
            .collect();
        let seqs: Vec<u64> = seen.iter().map(|e| e.event_seq).collect();
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        let lost = stored.difference(&unique).count();
        (lost, seqs.len() - unique.len())
    }
}

async fn wait_serving(url: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(ch) = tonic::transport::Channel::from_shared(url.to_owned())
            .unwrap()
            .connect()
            .await
        {
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
            if let Ok(r) = h
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                && r.into_inner().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{url} never became SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the registry of `runner` lists `kernels` kernel instances and `web` web ones.
async fn wait_instances(runner: &Proc, secret: &str, kernels: usize, web: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let ch = tonic::transport::Channel::from_shared(runner.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let creds =
            omicos_auth::Credentials::service(secret, omicos_auth::ServiceRole::Orchestrator)
                .unwrap();
        let list = RegistryClient::new(creds.channel(ch))
            .list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances;
        let count = |p: &str| list.iter().filter(|i| i.provider == p).count();
        if count("kernel") == kernels && count("web") == web {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} sees {} kernel and {} web instances, expected {kernels} and {web}",
            runner.name,
            count("kernel"),
            count("web")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `run_python_code` call straight to one runner (as an orchestrator).
async fn direct_call(runner: &Proc, secret: &str, session: &str, code: &str) -> ToolResult {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ExecuteClientMessage {
        msg: Some(In::Start(ExecuteStart {
            call_id: format!("c-{}", uuid::Uuid::new_v4().simple()),
            tool_name: "run_python_code".into(),
            arguments: json!({ "code": code }).to_string(),
            session_id: session.into(),
            agent_id: "tester".into(),
            permission_mode: omicos_proto::PermissionMode::Full as i32,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let ch = tonic::transport::Channel::from_shared(runner.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let creds =
        omicos_auth::Credentials::service(secret, omicos_auth::ServiceRole::Orchestrator).unwrap();
    let mut resp = ToolRunnerClient::new(creds.channel(ch))
        .execute(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    while let Some(m) = resp.message().await.unwrap() {
        if let Some(Out::Result(r)) = m.msg {
            return r;
        }
    }
    panic!("stream ended without a result");
}

/// The text/plain value of a successful cell.
fn cell_value(status: ToolStatus, result: &str) -> String {
    assert_eq!(status, ToolStatus::Done, "{result}");
    let v: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    v["execute_result"]["text/plain"]
        .as_str()
        .or_else(|| {
            // Through the orchestrator the result may be wrapped once more.
            v["result"]["execute_result"]["text/plain"].as_str()
        })
        .map(str::to_owned)
        .unwrap_or_else(|| {
            // Fall back to the first integer pair or value in the text.
            result.to_owned()
        })
}

fn req(session: &str, message: &str, mode: &str) -> ChatRequest {
    ChatRequest {
        session_id: session.into(),
        message: message.into(),
        agent: AGENT.into(),
        permission_mode: mode.into(),
        ..Default::default()
    }
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"tool_calls": [{"id": id, "name": name, "arguments": args}]})
}

fn text(t: &str) -> Value {
    json!({"text": t})
}

/// Marker file a slow kernel cell writes once it runs.
const CELL_MARKER: &str = "cell-running.marker";

/// One reply per model request, in the order the scenarios below make them.
fn script_json(page: &str, marker: &Path) -> Value {
    let marker = marker.display().to_string();
    json!({"replies": [
        // 1. The registry: a kernel call and a web fetch through the cluster.
        call("c_k0", "run_python_code", json!({"code": "21 * 2"})),
        call("c_web", "web_fetch", json!({"url": page})),
        text("registry ok"),
        // 2. Approval through the other orchestrator, then the grant on it.
        call("c_w1", "file_manager__write", json!({"path": "one.txt", "content": "x"})),
        text("one"),
        call("c_w2", "file_manager__write", json!({"path": "two.txt", "content": "y"})),
        text("two"),
        // 3. CancelTurn through the other orchestrator.
        call("c_cancel", "shell", json!({"command": "sleep 30.1"})),
        // 4. A runner killed mid-call; the next call on a live runner.
        call("c_long", "shell", json!({"command": "sleep 31.7"})),
        call("c_next", "shell", json!({"command": "echo next"})),
        text("went on"),
        // 5. The orchestrator running the turn killed mid-call.
        call("c_orphan", "shell", json!({"command": "sleep 3.3; echo once >> orphan-side.txt; echo orphan-ran"})),
        text("the orphan came back"),
        // 6. The kernel provider killed mid-cell.
        call("c_k1", "run_python_code", json!({"code": "import os\nx = 41\n(os.getppid(), os.getpid())"})),
        call("c_k2", "run_python_code", json!({"code": format!("import time\nopen({marker:?}, 'w').close()\ntime.sleep(30)\n'finished'")})),
        call("c_k3", "run_python_code", json!({"code": "'x' in globals()"})),
        call("c_k4", "run_python_code", json!({"code": "6 * 7"})),
        text("kernel back"),
    ]})
}

/// One row of the fault table.
struct Row {
    fault: &'static str,
    saw: String,
    lost: usize,
    dup: usize,
    took: Duration,
}

/// Pids of the processes whose command line contains `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            out.push(pid);
        }
    }
    out
}

fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Which of `procs` has `pid` among its descendants.
fn ancestor_of(pid: i32, procs: &[Proc]) -> Option<usize> {
    let mut p = pid;
    for _ in 0..64 {
        if let Some(i) = procs.iter().position(|r| r.pid() == p) {
            return Some(i);
        }
        p = parent(p)?;
        if p <= 1 {
            return None;
        }
    }
    None
}

/// Waits for a process running `needle` and returns the index of the runner it runs under.
async fn runner_running(needle: &str, runners: &[Proc]) -> (usize, i32) {
    let deadline = Instant::now() + WAIT;
    loop {
        for pid in pids_with(needle) {
            if let Some(i) = ancestor_of(pid, runners) {
                return (i, pid);
            }
        }
        assert!(Instant::now() < deadline, "no runner runs `{needle}`");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_gone(needle: &str) -> bool {
    let deadline = Instant::now() + WAIT;
    while !pids_with(needle).is_empty() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

async fn attach(url: &str, session: &str) -> tonic::Streaming<ChatEvent> {
    client_at(url)
        .await
        .attach(AttachRequest {
            session_id: session.into(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Reads an Attach stream until turn_done; heartbeats are skipped.
async fn until_done(s: &mut tonic::Streaming<ChatEvent>, out: &mut Vec<ChatEvent>) {
    loop {
        let ev = tokio::time::timeout(WAIT, s.message())
            .await
            .expect("an event on the attached stream")
            .expect("the attached stream is healthy")
            .expect("the attached stream stays open until turn_done");
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        let done = matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)));
        out.push(ev);
        if done {
            return;
        }
    }
}

fn finished(events: &[ChatEvent], id: &str) -> ToolCallFinished {
    finished_calls(events)
        .into_iter()
        .find(|f| f.call_id == id)
        .unwrap_or_else(|| panic!("no result for {id}: {events:#?}"))
}

fn short(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() > 90 {
        format!("{}…", s.chars().take(90).collect::<String>())
    } else {
        s
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_as_processes_survives_kill_9_of_each_part() {
    // A page on loopback for web_fetch (the web provider allows 127.0.0.1).
    let app = axum::Router::new().route(
        "/page",
        axum::routing::get(|| async {
            axum::response::Html(
                "<html><head><title>Cluster Page</title></head><body><article><h1>Shared</h1>\
                 <p>The registry is shared by every runner replica of the cluster.</p></article></body></html>",
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = format!("http://{}/page", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    let Some(mut c) = Cluster::start("cluster_processes", &page).await else {
        return;
    };
    let t_start = Instant::now();
    let secret = c.sh.secret.clone();
    let mut rows: Vec<Row> = vec![];

    // --- 1. A provider registered through runner A, used through B and C.
    for r in &c.runners {
        wait_instances(r, &secret, 2, 1).await;
    }
    for (i, r) in c.runners.iter().enumerate().skip(1) {
        for s in 0..4 {
            let res = direct_call(r, &secret, &format!("direct-{i}-{s}"), "6 * 7").await;
            assert_eq!(
                cell_value(res.status(), &res.result),
                "42",
                "{} runs a kernel registered through runner A: {}",
                r.name,
                res.result
            );
        }
    }
    // And through an orchestrator: the kernel and the web provider.
    let [o1, o2] = [
        c.orchestrators[0].addr.clone(),
        c.orchestrators[1].addr.clone(),
    ];
    let events = ChatHandle::open(client_at(&o2).await, req("", "registry", "full"))
        .await
        .unwrap()
        .until_done()
        .await;
    let k0 = finished(&events, "c_k0");
    assert_eq!(k0.status(), ToolStatus::Done, "{}", k0.result);
    assert!(k0.result.contains("42"), "{}", k0.result);
    let web = finished(&events, "c_web");
    assert_eq!(web.status(), ToolStatus::Done, "{}", web.result);
    assert!(
        web.result.contains("shared by every runner"),
        "{}",
        web.result
    );
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));

    // --- 2. ApproveTool through the other orchestrator; the grant holds there.
    let mut chat = ChatHandle::open(client_at(&o1).await, req("", "write one", "auto"))
        .await
        .unwrap();
    let call_id = chat.until_approval().await;
    let session = chat.events[0].session_id.clone();
    let asked = Instant::now();
    client_at(&o2)
        .await
        .approve_tool(ApproveToolRequest {
            session_id: session.clone(),
            call_id: call_id.clone(),
            decision: Decision::AllowSession as i32,
            ..Default::default()
        })
        .await
        .expect("the other orchestrator accepts the decision");
    let mut took = None;
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolApprovalResolved(_))) && took.is_none() {
            took = Some(asked.elapsed());
        }
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            break;
        }
    }
    let events = chat.events.clone();
    assert_eq!(finished(&events, "c_w1").status(), ToolStatus::Done);
    assert_eq!(
        std::fs::read_to_string(c.sh.ws.path().join("one.txt")).unwrap(),
        "x"
    );
    let (lost, dup) = c.lost_and_dup(&session, &events, false).await;
    rows.push(Row {
        fault: "ApproveTool (allow for session) sent to the other orchestrator",
        saw: "approval resolved, the write done, turn completed".into(),
        lost,
        dup,
        took: took.expect("the approval was resolved"),
    });
    let events = ChatHandle::open(client_at(&o2).await, req(&session, "write two", "auto"))
        .await
        .unwrap()
        .until_done()
        .await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, Some(chat_event::Kind::ToolApprovalRequest(_)))),
        "the grant made through orchestrator 1 holds on orchestrator 2: {events:#?}"
    );
    assert_eq!(finished(&events, "c_w2").status(), ToolStatus::Done);
    assert!(c.sh.ws.path().join("two.txt").exists());

    // --- 3. CancelTurn through the other orchestrator.
    let mut chat = ChatHandle::open(client_at(&o1).await, req(&session, "sleep", "full"))
        .await
        .unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            break;
        }
    }
    let asked = Instant::now();
    let r = client_at(&o2)
        .await
        .cancel_turn(CancelTurnRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.cancelled,
        "the other orchestrator found the turn to cancel"
    );
    let events = chat.until_done().await;
    let took = asked.elapsed();
    assert_eq!(done_reason(&events).as_deref(), Some("cancelled"));
    assert!(
        took < Duration::from_secs(20),
        "not the 30 s sleep: {took:?}"
    );
    let (lost, dup) = c.lost_and_dup(&session, &events, false).await;
    rows.push(Row {
        fault: "CancelTurn sent to the other orchestrator",
        saw: "turn_done CANCELLED".into(),
        lost,
        dup,
        took,
    });
    assert!(
        wait_gone("sleep 30.1").await,
        "the cancelled sleep still runs"
    );

    // --- 4. kill -9 of the runner running a call.
    let mut chat = ChatHandle::open(client_at(&o1).await, req("", "long then short", "full"))
        .await
        .unwrap();
    let (victim, sleep_pid) = runner_running("sleep 31.7", &c.runners).await;
    let killed = Instant::now();
    let victim_port = c.runners[victim].port();
    let victim_name = c.runners[victim].name.clone();
    c.runners[victim].kill9().await;
    let mut took = None;
    while let Some(ev) = chat.next().await {
        if let Some(chat_event::Kind::ToolCallFinished(f)) = &ev.kind
            && f.call_id == "c_long"
        {
            took = Some(killed.elapsed());
        }
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            break;
        }
    }
    // The killed runner's shell is an orphan now: not the test's to keep.
    for pid in pids_with("sleep 31.7").into_iter().chain([sleep_pid]) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let events = chat.events.clone();
    let session = events[0].session_id.clone();
    let long = finished(&events, "c_long");
    assert_eq!(long.status(), ToolStatus::Error, "{}", long.result);
    assert!(
        long.result
            .contains(omicos_orchestrator::runner_client::RUNNER_LOST),
        "{}",
        long.result
    );
    assert!(
        long.result.contains(&format!("127.0.0.1:{victim_port}")),
        "the error names the lost runner: {}",
        long.result
    );
    let next = finished(&events, "c_next");
    assert_eq!(
        next.status(),
        ToolStatus::Done,
        "the next call ran on a live runner: {}",
        next.result
    );
    assert!(next.result.contains("next"), "{}", next.result);
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let (lost, dup) = c.lost_and_dup(&session, &events, false).await;
    rows.push(Row {
        fault: "kill -9 of the runner running a call (`shell sleep`)",
        saw: format!(
            "that call: error `{}`; the next call done; turn completed",
            short(&long.result)
        ),
        lost,
        dup,
        took: took.unwrap(),
    });
    // The runner comes back on its port (a replaced pod): providers that
    // registered through it find it again.
    let r =
        c.sh.start_runner(&victim_name, &format!("127.0.0.1:{victim_port}"))
            .await;
    c.runners[victim] = r;
    wait_instances(&c.runners[victim], &secret, 2, 1).await;
    // It reaches the providers it found in the shared store at start (their
    // clients carry the service secret: they are built before it serves).
    let res = direct_call(&c.runners[victim], &secret, "direct-restarted", "6 * 7").await;
    assert_eq!(
        cell_value(res.status(), &res.result),
        "42",
        "the restarted runner runs a kernel registered before it started: {}",
        res.result
    );

    // --- 5. kill -9 of the orchestrator running a turn.
    let mut chat = ChatHandle::open(client_at(&o1).await, req("", "sleep long", "full"))
        .await
        .unwrap();
    while let Some(ev) = chat.next().await {
        if matches!(ev.kind, Some(chat_event::Kind::ToolCallStarted(_))) {
            break;
        }
    }
    let session = chat.events[0].session_id.clone();
    let mut attached = attach(&o2, &session).await;
    let killed = Instant::now();
    c.orchestrators[0].kill9().await;
    let mut seen = vec![];
    until_done(&mut attached, &mut seen).await;
    let took = killed.elapsed();
    // Resumed on the survivor: the call, still running on its runner, is
    // followed again by call id; it ran once; the turn completes.
    let orphan = finished(&seen, "c_orphan");
    assert_eq!(orphan.status(), ToolStatus::Done, "{}", orphan.result);
    assert!(orphan.result.contains("orphan-ran"), "{}", orphan.result);
    assert_eq!(done_reason(&seen).as_deref(), Some("completed"));
    let moved = turn_moved(&seen);
    assert_eq!(moved.reattached_calls, ["c_orphan"], "{moved:?}");
    assert!(
        took < LEASE + WAIT,
        "within the lease and the call's own time: {took:?}"
    );
    assert_eq!(
        std::fs::read_to_string(c.sh.ws.path().join("orphan-side.txt")).unwrap(),
        "once\n",
        "the call ran exactly once"
    );
    let (lost, dup) = c.lost_and_dup(&session, &seen, true).await;
    rows.push(Row {
        fault: "kill -9 of the orchestrator running a turn (client attached to the other)",
        saw: "TurnMoved; the running call followed again on its runner, ran once; turn_done COMPLETED".into(),
        lost,
        dup,
        took,
    });
    let o =
        c.sh.start_orchestrator("orchestrator-1", &c.runners, &c.llm)
            .await;
    c.orchestrators[0] = o;
    let o1 = c.orchestrators[0].addr.clone();

    // --- 6. kill -9 of the kernel provider running a cell.
    let mut chat = ChatHandle::open(client_at(&o1).await, req("", "kernel", "full"))
        .await
        .unwrap();
    let mut pids = None;
    let marker = c.sh.ws.path().join(CELL_MARKER);
    while let Some(ev) = chat.next().await {
        if let Some(chat_event::Kind::ToolCallFinished(f)) = &ev.kind
            && f.call_id == "c_k1"
        {
            let v = cell_value(f.status(), &f.result);
            assert!(v.starts_with('('), "the first cell answered: {v}");
            // Inside its box the kernel's pids are the box's own: the host's
            // is in the session's kernel marker.
            let kernel = kernel_host_pid(c.sh.ws.path(), &ev.session_id);
            let provider = c
                .kernels
                .iter()
                .map(|k| k.pid())
                .find(|p| descends_from(kernel, *p))
                .expect("the kernel's parent is one of the providers");
            pids = Some((provider, kernel));
        }
        if let Some(chat_event::Kind::ToolCallStarted(s)) = &ev.kind
            && s.call_id == "c_k2"
        {
            break;
        }
    }
    let (provider_pid, kernel_pid) = pids.expect("the first cell answered");
    let victim = c
        .kernels
        .iter()
        .position(|k| k.pid() == provider_pid)
        .expect("the kernel's parent is one of the providers");
    let deadline = Instant::now() + WAIT;
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the slow cell never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = Instant::now();
    c.kernels[victim].kill9().await;
    let mut took = None;
    while let Some(ev) = chat.next().await {
        if let Some(chat_event::Kind::ToolCallFinished(f)) = &ev.kind
            && f.call_id == "c_k2"
        {
            took = Some(killed.elapsed());
        }
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            break;
        }
    }
    unsafe { libc::kill(kernel_pid, libc::SIGKILL) };
    let events = chat.events.clone();
    let session = events[0].session_id.clone();
    let k2 = finished(&events, "c_k2");
    assert_eq!(k2.status(), ToolStatus::Error, "{}", k2.result);
    let k3 = finished(&events, "c_k3");
    let k4 = finished(&events, "c_k4");
    eprintln!(
        "after the kernel loss: c_k2 {:?} / c_k3 {:?} / c_k4 {:?}",
        k2.result, k3.result, k4.result
    );
    assert!(
        k2.result.contains("kernel state") && k2.result.contains("lost"),
        "the failed call says the kernel state was lost: {}",
        k2.result
    );
    assert_eq!(
        cell_value(k3.status(), &k3.result),
        "False",
        "a fresh kernel on a live provider"
    );
    assert_eq!(cell_value(k4.status(), &k4.result), "42");
    assert_eq!(done_reason(&events).as_deref(), Some("completed"));
    let (lost, dup) = c.lost_and_dup(&session, &events, false).await;
    rows.push(Row {
        fault: "kill -9 of the kernel provider running a cell",
        saw: format!(
            "that call: error `{}`; the next runs on a fresh kernel; turn completed",
            short(&k2.result)
        ),
        lost,
        dup,
        took: took.unwrap(),
    });

    eprintln!(
        "\n| fault | what the client saw | events lost | events duplicated | time to the outcome |"
    );
    eprintln!("|---|---|---|---|---|");
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {} | {:.2} s |",
            r.fault,
            r.saw,
            r.lost,
            r.dup,
            r.took.as_secs_f64()
        );
    }
    eprintln!("(whole scenario {:.1} s)", t_start.elapsed().as_secs_f64());
    for r in &rows {
        assert_eq!(r.lost, 0, "{}: events lost", r.fault);
        assert_eq!(r.dup, 0, "{}: events duplicated", r.fault);
    }
    for p in c.orchestrators.iter().chain(&c.runners).chain(&c.kernels) {
        p.signal(libc::SIGTERM);
    }
    for k in c.kernels.iter_mut() {
        let _ = tokio::time::timeout(Duration::from_secs(10), k.child.wait()).await;
    }
    let _ = std::fs::remove_file(&c.sh.config_file);
}

/// The host's pid of the kernel running `session`'s cells, from its marker.
fn kernel_host_pid(ws: &std::path::Path, session: &str) -> i32 {
    let marker = ws.join(".omicos/kernels").join(format!("{session}.json"));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&marker).unwrap()).unwrap();
    m["pid"].as_i64().unwrap() as i32
}

/// Whether `ancestor` started `pid` (its parent, the parent's parent, ...),
/// from the host's `/proc`.
fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        let Some(ppid) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|stat| {
                // The fields after the command's closing parenthesis: state, ppid, ...
                stat.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse::<i32>()
                    .ok()
            })
        else {
            return false;
        };
        if ppid == ancestor {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        p = ppid;
    }
    false
}

/// A turn whose orchestrator is killed (-9) at each point of its life
/// continues on the other one (turn_recovery: resume, the default): before
/// the model's answer, while it streams, during a tool call, and while an
/// approval waits. The client attached through the survivor sees the turn
/// complete, with no event lost or doubled, and no call runs twice (each
/// call's side effect is a file it appends to).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_survives_kill_9_of_its_orchestrator_at_each_point() {
    let llm = FakeLlm::start(vec![
        // a. Killed before the model answers: the first request is never answered.
        Reply::Streamed {
            text: "never seen".into(),
            chunks: 1,
            delay: Duration::from_secs(20),
            calls: vec![],
        },
        Reply::Text("a: answered after the move".into()),
        // b. Killed while the answer streams: it is asked again.
        Reply::Streamed {
            text: "b: the first answer, streaming slowly word by word until it is cut".into(),
            chunks: 30,
            delay: Duration::from_millis(300),
            calls: vec![],
        },
        Reply::Text("b: answered again".into()),
        // c. Killed during a tool call: followed again on its runner.
        Reply::Tools(
            String::new(),
            vec![(
                "c_side".into(),
                "shell".into(),
                json!({"command": "sleep 3; echo once >> side-c.txt; echo c-ran"}).to_string(),
            )],
        ),
        Reply::Text("c: done".into()),
        // d. Killed while an approval waits: answered through the survivor.
        Reply::Tools(
            String::new(),
            vec![(
                "c_write".into(),
                "file_manager__write".into(),
                json!({"path": "side-d.txt", "content": "written once"}).to_string(),
            )],
        ),
        Reply::Text("d: done".into()),
    ])
    .await;
    let Some(mut c) = Cluster::start_with(
        "cluster_resume",
        "http://127.0.0.1:9/",
        Some(llm.openai_url()),
    )
    .await
    else {
        return;
    };
    let mut rows: Vec<Row> = vec![];
    let t0 = Instant::now();
    eprintln!("cluster up");
    for point in ["a", "b", "c", "d"] {
        eprintln!("point {point}: starts at {:?}", t0.elapsed());
        let (o1, o2) = (
            c.orchestrators[0].addr.clone(),
            c.orchestrators[1].addr.clone(),
        );
        let mode = if point == "d" { "auto" } else { "full" };
        let requests_before = llm.requests().len();
        let mut chat = ChatHandle::open(client_at(&o1).await, req("", point, mode))
            .await
            .unwrap();
        // Up to the point of the kill.
        while let Some(ev) = chat.next().await {
            let at = matches!(
                (point, &ev.kind),
                ("a", Some(chat_event::Kind::TurnStarted(_)))
                    | ("b", Some(chat_event::Kind::TextDelta(_)))
                    | ("c", Some(chat_event::Kind::ToolCallStarted(_)))
                    | ("d", Some(chat_event::Kind::ToolApprovalRequest(_)))
            );
            if at {
                break;
            }
        }
        if point == "a" {
            // The request reached the model (it holds its answer back).
            let deadline = Instant::now() + WAIT;
            while llm.requests().len() == requests_before {
                assert!(Instant::now() < deadline, "the model request never came");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let session = chat.events[0].session_id.clone();
        let last_seen = chat.events.last().map(|e| e.event_seq).unwrap_or(0);
        let mut attached = attach(&o2, &session).await;
        let killed = Instant::now();
        c.orchestrators[0].kill9().await;
        let mut seen = vec![];
        let mut first_after: Option<Duration> = None;
        loop {
            let ev = tokio::time::timeout(WAIT, attached.message())
                .await
                .expect("an event on the attached stream")
                .expect("the attached stream is healthy")
                .expect("the attached stream stays open until turn_done");
            if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
                continue;
            }
            if ev.event_seq > last_seen && first_after.is_none() {
                first_after = Some(killed.elapsed());
            }
            if point == "d" && matches!(ev.kind, Some(chat_event::Kind::TurnMoved(_))) {
                // The approval still waits: answered through the survivor.
                client_at(&o2)
                    .await
                    .approve_tool(ApproveToolRequest {
                        session_id: session.clone(),
                        call_id: "c_write".into(),
                        decision: Decision::AllowOnce as i32,
                        rule: String::new(),
                    })
                    .await
                    .expect("the waiting approval is answered through the survivor");
            }
            let done = matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)));
            seen.push(ev);
            if done {
                break;
            }
        }
        let took = killed.elapsed();
        assert_eq!(
            done_reason(&seen).as_deref(),
            Some("completed"),
            "point {point}: {seen:#?}"
        );
        let moved = turn_moved(&seen);
        let (lost, dup) = c.lost_and_dup(&session, &seen, true).await;
        assert_eq!(
            (lost, dup),
            (0, 0),
            "point {point}: no event lost or doubled"
        );
        let turn_ids: BTreeSet<&str> = seen.iter().map(|e| e.turn_id.as_str()).collect();
        assert_eq!(turn_ids.len(), 1, "one continuous turn");
        let answer: String = seen
            .iter()
            .skip_while(|e| !matches!(e.kind, Some(chat_event::Kind::TurnMoved(_))))
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::TextDelta(t)) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        let saw = match point {
            "a" | "b" => {
                assert!(moved.model_request_reissued, "{moved:?}");
                assert!(moved.reattached_calls.is_empty() && moved.lost_calls.is_empty());
                let want = if point == "a" {
                    "a: answered after the move"
                } else {
                    "b: answered again"
                };
                assert_eq!(answer, want);
                "TurnMoved (model request issued again); the answer; COMPLETED"
            }
            "c" => {
                assert_eq!(moved.reattached_calls, ["c_side"], "{moved:?}");
                let f = finished(&seen, "c_side");
                assert_eq!(f.status(), ToolStatus::Done, "{}", f.result);
                assert!(f.result.contains("c-ran"), "{}", f.result);
                assert_eq!(
                    std::fs::read_to_string(c.sh.ws.path().join("side-c.txt")).unwrap(),
                    "once\n",
                    "the shell call ran exactly once"
                );
                assert_eq!(answer, "c: done");
                "TurnMoved; the shell call followed again, ran once; COMPLETED"
            }
            _ => {
                assert_eq!(moved.reattached_calls, ["c_write"], "{moved:?}");
                let f = finished(&seen, "c_write");
                assert_eq!(f.status(), ToolStatus::Done, "{}", f.result);
                assert_eq!(
                    std::fs::read_to_string(c.sh.ws.path().join("side-d.txt")).unwrap(),
                    "written once"
                );
                let asked = c
                    .log(&session)
                    .await
                    .iter()
                    .filter(|e| matches!(e.kind, Some(chat_event::Kind::ToolApprovalRequest(_))))
                    .count();
                assert_eq!(
                    asked, 1,
                    "the approval was asked once, and waited for again"
                );
                assert_eq!(answer, "d: done");
                "TurnMoved; the approval answered through the survivor; the write ran once; COMPLETED"
            }
        };
        eprintln!(
            "point {point}: done at {:?} ({took:?} after the kill)",
            t0.elapsed()
        );
        let first = first_after.expect("an event after the kill");
        eprintln!("point {point}: first event after kill -9 in {first:?} (lease {LEASE:?})");
        rows.push(Row {
            fault: match point {
                "a" => "kill -9 before the model's answer",
                "b" => "kill -9 while the model streams",
                "c" => "kill -9 during a tool call",
                _ => "kill -9 while an approval waits",
            },
            saw: saw.into(),
            lost,
            dup,
            took: first,
        });
        let _ = took;
        // The replica comes back for the next point.
        let o =
            c.sh.start_orchestrator("orchestrator-1", &c.runners, &c.llm)
                .await;
        c.orchestrators[0] = o;
    }
    eprintln!(
        "| kill -9 of the orchestrator | the client saw | lost | doubled | first event after the kill |"
    );
    eprintln!("|---|---|---|---|---|");
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {} | {:.1} s |",
            r.fault,
            r.saw,
            r.lost,
            r.dup,
            r.took.as_secs_f64()
        );
    }
    llm.assert_invariants();
    eprintln!("test body done at {:?}", t0.elapsed());
}
