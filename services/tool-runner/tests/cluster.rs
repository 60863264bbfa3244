//! Runner replicas as separate processes on one PostgreSQL database (the
//! shared registry), real kernel providers registering through one replica
//! and called through the other, a kernel provider killed with SIGKILL
//! mid-cell, the metrics endpoint, and one trace across runner → kernel
//! checked by a real OTLP receiver.

use omicos_proto::{
    ExecuteClientMessage, ExecuteStart, ListProvidersRequest, ToolResult,
    execute_client_message::Msg as In, execute_server_message::Msg as Out,
    registry_client::RegistryClient, tool_runner_client::ToolRunnerClient,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_stream::wrappers::ReceiverStream;

/// The interpreter with ipykernel: OMICOS_KERNEL_PYTHON, else the repo's .venv.
fn python() -> String {
    let py = std::env::var("OMICOS_KERNEL_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.venv/bin/python3")
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

/// The `omicos-kernel` binary next to this crate's binary, built when missing
/// or stale (cargo is quick when it is fresh).
fn kernel_binary() -> PathBuf {
    let runner = Path::new(env!("CARGO_BIN_EXE_omicos-tool-runner"));
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
        assert!(status.success(), "building omicos-kernel failed");
    }
    let k = runner.with_file_name("omicos-kernel");
    assert!(k.exists(), "{} missing after the build", k.display());
    k
}

struct Proc {
    child: Child,
    addr: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }
    fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }
}

/// Starts `bin` with `env`; returns once it printed `listening on <addr>`.
async fn spawn(bin: &Path, env: &[(&str, String)]) -> Proc {
    let mut cmd = Command::new(bin);
    cmd.env("OMICOS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the service printed its address")
        .unwrap()
        .unwrap_or_default();
    let addr = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{}: {line}", bin.display()))
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Proc { child, addr }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn runner_env(ws: &Path, store: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OMICOS_WORKSPACE", ws.display().to_string()),
        ("OMICOS_REGISTRY_STORE_URL", store.to_owned()),
        ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
    ]
}

fn kernel_env(ws: &Path, registry: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OMICOS_WORKSPACE", ws.display().to_string()),
        ("OMICOS_REGISTRY", registry.to_owned()),
        ("OMICOS_KERNEL_PYTHON", python()),
        ("OMICOS_KERNEL_POOL_SIZE", "0".into()),
        // Long: the loss must be seen from the failed call, not from expiry.
        ("OMICOS_REGISTRY_TTL", "60s".into()),
        ("OMICOS_SHUTDOWN_GRACE", "1s".into()),
    ]
}

async fn call(runner: &str, session: &str, code: &str) -> ToolResult {
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
    let mut resp = ToolRunnerClient::connect(runner.to_owned())
        .await
        .unwrap()
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
fn value(r: &ToolResult) -> String {
    assert_eq!(r.status().as_str(), "done", "{}", r.result);
    let v: Value = serde_json::from_str(&r.result).unwrap_or(Value::Null);
    v["execute_result"]["text/plain"]
        .as_str()
        .unwrap_or_else(|| panic!("no execute_result: {}", r.result))
        .to_owned()
}

async fn wait_instances(runner: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let have = RegistryClient::connect(runner.to_owned())
            .await
            .unwrap()
            .list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances
            .iter()
            .filter(|i| i.provider == "kernel")
            .count();
        if have == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{runner} sees {have} kernel instances, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The host's pid of the kernel running `session`'s cells, from its marker
/// (inside its box, the kernel's `os.getpid()` and `os.getppid()` are the
/// box's own numbers).
fn kernel_host_pid(ws: &Path, session: &str) -> i32 {
    let marker = ws.join(".omicos/kernels").join(format!("{session}.json"));
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&marker).unwrap()).unwrap();
    m["pid"].as_i64().unwrap() as i32
}

/// Whether `ancestor` started `pid` (its parent, the parent's parent, ...),
/// from the host's `/proc`.
fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            return false;
        };
        // The fields after the command's closing parenthesis: state, ppid, ...
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i32>().ok())
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

async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn two_runner_processes_share_the_registry_and_a_killed_kernel_is_said_lost() {
    let Some(db) = omicos_testdb::postgres("cluster registry", "reg").await else {
        return;
    };
    let kernel = kernel_binary();
    let ws = tempfile::tempdir().unwrap();
    let runner = Path::new(env!("CARGO_BIN_EXE_omicos-tool-runner"));
    let a = spawn(runner, &runner_env(ws.path(), &db.url)).await;
    let metrics_port = free_port();
    let mut env_b = runner_env(ws.path(), &db.url);
    env_b.push(("OMICOS_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")));
    let b = spawn(runner, &env_b).await;

    // Both kernel providers register through runner A only.
    let k1 = spawn(&kernel, &kernel_env(ws.path(), &a.addr)).await;
    let k2 = spawn(&kernel, &kernel_env(ws.path(), &a.addr)).await;
    wait_instances(&a.addr, 2).await;
    wait_instances(&b.addr, 2).await;

    // Called through runner B: it routes to providers it never heard from directly.
    value(&call(&b.addr, "s1", "import os\nx = 41\nos.getppid()").await);
    let kernel_pid = kernel_host_pid(ws.path(), "s1");
    // Pinned to one instance whichever replica serves the session: state is there.
    assert_eq!(value(&call(&a.addr, "s1", "x + 1").await), "42");
    assert_eq!(value(&call(&b.addr, "s1", "x + 1").await), "42");
    let (victim, survivor) = if descends_from(kernel_pid, k1.pid()) {
        (&k1, &k2)
    } else {
        assert!(
            descends_from(kernel_pid, k2.pid()),
            "the kernel {kernel_pid} was started by one of the providers"
        );
        (&k2, &k1)
    };

    // SIGKILL the session's provider while a cell runs on it.
    let b_addr = b.addr.clone();
    let running = tokio::spawn(async move {
        call(&b_addr, "s1", "import time\ntime.sleep(30)\n'finished'").await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed_at = Instant::now();
    victim.signal(libc::SIGKILL);
    let lost = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the running call ended")
        .unwrap();
    let seen_after = killed_at.elapsed();
    unsafe { libc::kill(kernel_pid, libc::SIGKILL) };
    assert_eq!(lost.status().as_str(), "error", "{}", lost.result);
    assert!(
        lost.result.contains("kernel state") && lost.result.contains("lost"),
        "{}",
        lost.result
    );
    eprintln!("kill -9 mid-cell: the client saw the loss after {seen_after:?}");

    // The next call, through either replica, runs on the surviving instance.
    value(&call(&a.addr, "s1", "import os\nos.getppid()").await);
    let kernel2 = kernel_host_pid(ws.path(), "s1");
    assert!(
        descends_from(kernel2, survivor.pid()),
        "the fresh kernel {kernel2} runs on the surviving provider"
    );
    assert_eq!(
        value(&call(&b.addr, "s1", "'x' in globals()").await),
        "False",
        "a fresh kernel"
    );
    // Both replicas dropped the lost instance without waiting for its TTL.
    wait_instances(&a.addr, 1).await;
    wait_instances(&b.addr, 1).await;

    let m = scrape(metrics_port).await;
    // A series with these labels, in whatever order the exporter writes them.
    let has = |metric: &str, labels: &[&str]| {
        m.lines().any(|l| {
            l.strip_prefix(metric).is_some_and(|rest| {
                rest.starts_with('{') && labels.iter().all(|x| rest.contains(x))
            })
        })
    };
    let kernel_call = [r#"tool="run_python_code""#, r#"provider="kernel""#];
    for (metric, labels) in [
        (
            "omicos_tool_runner_calls_total",
            [&kernel_call[..], &[r#"status="error""#]].concat(),
        ),
        (
            "omicos_tool_runner_calls_total",
            [&kernel_call[..], &[r#"status="done""#]].concat(),
        ),
        (
            "omicos_tool_runner_call_duration_seconds_bucket",
            kernel_call.to_vec(),
        ),
        (
            "omicos_tool_runner_registry_entries",
            vec![r#"provider="kernel""#, r#"backend="postgres""#],
        ),
    ] {
        assert!(has(metric, &labels), "missing {metric}{labels:?} in:\n{m}");
    }
    assert!(m.contains("omicos_tool_runner_calls_in_flight"), "{m}");
    for p in [&a, &b, survivor] {
        p.signal(libc::SIGTERM);
    }
    // The surviving provider's kernel runs in the workspace: the test exits
    // (and SIGKILLs the provider) before the provider could stop it.
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>()
            && std::fs::read_link(format!("/proc/{pid}/cwd"))
                .is_ok_and(|c| c.starts_with(ws.path()))
        {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A received span: (trace id, service name, span name).
type SpanSeen = (Vec<u8>, String, String);

/// An OTLP trace receiver: keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<SpanSeen>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s),
                    ) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push((s.trace_id, service.clone(), s.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test]
async fn one_tool_call_is_one_trace_across_runner_and_kernel() {
    let kernel = kernel_binary();
    let rx = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(rx.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let ws = tempfile::tempdir().unwrap();
    let runner_bin = Path::new(env!("CARGO_BIN_EXE_omicos-tool-runner"));
    let mut renv = runner_env(ws.path(), "");
    renv.push(("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.clone()));
    renv.push(("RUST_LOG", "info".into()));
    let mut runner = spawn(runner_bin, &renv).await;
    let mut kenv = kernel_env(ws.path(), &runner.addr);
    kenv.push(("OTEL_EXPORTER_OTLP_ENDPOINT", otlp));
    kenv.push(("RUST_LOG", "info".into()));
    let mut k = spawn(&kernel, &kenv).await;
    wait_instances(&runner.addr, 1).await;
    assert_eq!(value(&call(&runner.addr, "t1", "6 * 7").await), "42");
    // SIGTERM flushes both exporters.
    k.signal(libc::SIGTERM);
    runner.signal(libc::SIGTERM);
    let _ = tokio::time::timeout(Duration::from_secs(15), k.child.wait()).await;
    let _ = tokio::time::timeout(Duration::from_secs(15), runner.child.wait()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans = rx.spans.lock().unwrap().clone();
        // The runner's tool_call span, and a kernel span in the same trace.
        let call_traces: Vec<&Vec<u8>> = spans
            .iter()
            .filter(|(_, svc, name)| svc == "omicos-tool-runner" && name == "tool_call")
            .map(|(t, _, _)| t)
            .collect();
        let joined = call_traces.iter().any(|t| {
            spans
                .iter()
                .any(|(t2, svc, _)| t2 == *t && svc == "omicos-kernel")
        });
        if joined {
            assert_eq!(call_traces.len(), 1, "one tool call, one trace");
            let t = call_traces[0];
            assert!(t.iter().any(|b| *b != 0), "a real trace id");
            let services: std::collections::BTreeSet<&str> = spans
                .iter()
                .filter(|(t2, _, _)| t2 == t)
                .map(|(_, s, _)| s.as_str())
                .collect();
            assert_eq!(
                services.into_iter().collect::<Vec<_>>(),
                ["omicos-kernel", "omicos-tool-runner"]
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no trace joins runner and kernel; spans: {:?}",
            spans
                .iter()
                .map(|(t, s, n)| (
                    t.iter()
                        .take(4)
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>(),
                    s,
                    n
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
