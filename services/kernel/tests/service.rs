//! The `omicos-kernel` binary: config from the environment, serves, answers
//! over gRPC, and stops its kernels on SIGTERM.

mod common;

use omicos_toolkit::{CallCtx, Provider, remote::RemoteProvider};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Starts the `omicos-kernel` binary on a free port over `ws` with a pool of
/// `pool` kernels and `extra` variables; the child and the endpoint it printed.
async fn spawn_kernel(
    ws: &std::path::Path,
    pool: &str,
    extra: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_omicos-kernel"))
        .env("OMICOS_LISTEN", "127.0.0.1:0")
        .env("OMICOS_WORKSPACE", ws)
        .env("OMICOS_KERNEL_PYTHON", common::python())
        .env("OMICOS_KERNEL_POOL_SIZE", pool)
        .env("OMICOS_SHUTDOWN_GRACE", "1")
        .envs(extra.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let endpoint = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (child, endpoint)
}

/// The host's pid of the kernel that runs `session`'s cells, from the
/// session's marker (the kernel's own `os.getpid()` is its box's).
async fn kernel_pid(remote: &RemoteProvider, ws: &std::path::Path, session: &str) -> i32 {
    let r = remote
        .call(
            "run_python_code",
            json!({"code": "import os\nos.getpid()"}),
            CallCtx::for_test(ws, session),
        )
        .await
        .unwrap();
    assert!(r["error"].is_null(), "{r}");
    let marker = ws.join(".omicos/kernels").join(format!("{session}.json"));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&marker).unwrap()).unwrap();
    m["pid"].as_i64().unwrap() as i32
}

/// Every process below `root` (its children, theirs, ...).
fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, state_and_parent(pid)?.1)))
        .collect();
    let mut out = vec![];
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (pid, ppid) in &all {
            if *ppid == p && !out.contains(pid) {
                out.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    out
}

/// A process's state letter and parent pid, from `/proc/<pid>/stat`
/// (`pid (comm) state ppid …`); None once it is gone.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

#[tokio::test]
async fn binary_serves_and_stops_its_kernels() {
    let ws = tempfile::tempdir().unwrap();
    let (mut child, endpoint) = spawn_kernel(ws.path(), "0", &[]).await;
    let remote = RemoteProvider::connect(&endpoint).await.unwrap();
    let kernel_pid = kernel_pid(&remote, ws.path(), "bin").await;
    assert!(
        unsafe { libc::kill(kernel_pid, 0) } == 0,
        "the kernel is not running"
    );
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    // The kernel went with the service.
    let deadline = Instant::now() + Duration::from_secs(5);
    while unsafe { libc::kill(kernel_pid, 0) } == 0 {
        assert!(
            Instant::now() < deadline,
            "kernel {kernel_pid} outlived the service"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A provider killed with SIGKILL runs no cleanup: its kernels notice their
/// parent is gone and exit by themselves, leaving no orphan ipykernel.
#[tokio::test]
async fn kernels_exit_when_the_service_is_killed_9() {
    let ws = tempfile::tempdir().unwrap();
    // A warm kernel too: pooled kernels must not outlive the service either.
    let (mut child, endpoint) = spawn_kernel(ws.path(), "1", &[]).await;
    let remote = RemoteProvider::connect(&endpoint).await.unwrap();
    let kernel_pid = kernel_pid(&remote, ws.path(), "killed").await;
    let service_pid = child.id().unwrap() as i32;
    // Every ipykernel this service started, warm ones included (each in a
    // box below the service: zygote, init, reaper, kernel).
    let kernels = || -> Vec<i32> {
        descendants(service_pid)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.contains("ipykernel_launcher"))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while kernels().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the warm kernel never started: {:?}",
            kernels()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        kernels().contains(&kernel_pid),
        "{:?} / {kernel_pid}",
        kernels()
    );
    // Everything the service started: the boxes' zygotes, inits and reapers too.
    let started = descendants(service_pid);
    assert!(started.len() > 2, "{started:?}");
    unsafe { libc::kill(service_pid, libc::SIGKILL) };
    let _ = child.wait().await;
    // A zombie is gone for our purpose: it runs nothing (its parent, init, reaps it).
    let alive = |pid: i32| state_and_parent(pid).is_some_and(|(state, _)| state != 'Z');
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<i32> = started.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for p in &left {
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            panic!("processes {left:?} of its boxes outlived the killed service by 15 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[path = "../../toolkit/tests/support/raw_wire.rs"]
mod raw_wire;

#[tokio::test]
async fn invalid_utf8_in_a_call_is_invalid_argument() {
    use raw_wire::{NOT_UTF8, field};
    let ws = tempfile::tempdir().unwrap();
    let (mut child, endpoint) = spawn_kernel(ws.path(), "0", &[]).await;
    // CallToolRequest { tool: "run_python_code", arguments_json: <code that is not UTF-8> }.
    let code = [br#"{"code":"print('"#.as_slice(), NOT_UTF8, br#"')"}"#].concat();
    let body = [field(1, b"run_python_code"), field(2, &code)].concat();
    let s =
        raw_wire::server_stream_status(&endpoint, "/omicos.v1.ToolProvider/CallTool", body).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("UTF-8"), "{s:?}");
    // The tool name itself.
    let s = raw_wire::server_stream_status(
        &endpoint,
        "/omicos.v1.ToolProvider/CallTool",
        field(1, NOT_UTF8),
    )
    .await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    // Still serving.
    let remote = RemoteProvider::connect(&endpoint).await.unwrap();
    assert!(remote.tools().iter().any(|t| t.name == "run_python_code"));
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

/// GET `path` on `addr`, the whole HTTP/1.0 answer.
async fn scrape(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of the first sample of `metric` whose labels contain `label`.
fn sample(body: &str, metric: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn binary_exports_kernels_by_state_on_metrics_addr() {
    let ws = tempfile::tempdir().unwrap();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (mut child, endpoint) =
        spawn_kernel(ws.path(), "1", &[("OMICOS_METRICS_ADDR", metrics.as_str())]).await;
    let gauge = |body: &str, state: &str| {
        sample(body, "omicos_kernel_kernels", &format!("state=\"{state}\""))
    };
    // The pool fills: one warm kernel, no session kernel.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = scrape(&metrics, "/metrics").await;
        if gauge(&body, "warm") == Some(1.0) {
            assert_eq!(gauge(&body, "session"), Some(0.0), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "no warm kernel reported: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let remote = RemoteProvider::connect(&endpoint).await.unwrap();
    remote
        .call(
            "run_python_code",
            json!({"code": "1+1"}),
            CallCtx::for_test(ws.path(), "metrics"),
        )
        .await
        .unwrap();
    let body = scrape(&metrics, "/metrics").await;
    assert_eq!(gauge(&body, "session"), Some(1.0), "{body}");
    let _ = child.kill().await;
}
