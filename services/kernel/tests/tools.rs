//! kernel_install, registry_lookup, the notebook tools, and the whole
//! provider through gRPC.

mod common;

use common::*;
use omicos_toolkit::{
    Provider, ProviderEvent, ProviderHosting, ToolError, remote::RemoteProvider, serve_provider,
};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn kernel_install_refuses_then_installs_for_real() {
    let (ws, p) = provider(config(0));
    for (args, expect) in [
        (
            json!({"packages": ["-r", "requirements.txt"]}),
            "-r/--requirement",
        ),
        (
            json!({"packages": ["--requirement=req.txt"]}),
            "-r/--requirement",
        ),
        (json!({"packages": ["six", "--target=/tmp/x"]}), "--target"),
        (json!({"packages": ["--pre"]}), "looks like a pip option"),
        (
            json!({"packages": ["git+https://example.com/x.git"]}),
            "'/'",
        ),
        (
            json!({"packages": ["six"], "index_url": "file:///srv/index"}),
            "http",
        ),
        // Local archives and direct references: pip would resolve them
        // against its cwd (now the workspace) or fetch them around the index.
        (
            json!({"packages": ["six-1.16.0-py2.py3-none-any.whl"]}),
            "local archive",
        ),
        (json!({"packages": ["evil.tar.gz"]}), "local archive"),
        (json!({"packages": ["six@file:six.zip"]}), "local archive"),
        (json!({"packages": ["six@http:x"]}), "direct references"),
        (json!({"packages": ["..\\x"]}), "'\\'"),
        // The index keeps to web_fetch's network rules (omicos-ssrf).
        (
            json!({"packages": ["six"], "index_url": "http://127.0.0.1:9/simple"}),
            "loopback address 127.0.0.1",
        ),
        (
            json!({"packages": ["six"], "index_url": "http://2130706433:9/simple"}),
            "loopback",
        ),
        (
            json!({"packages": ["six"], "index_url": "http://169.254.169.254/latest/"}),
            "link-local address 169.254.169.254",
        ),
        (
            json!({"packages": ["six"], "index_url": "http://[::ffff:10.0.0.1]/simple"}),
            "private (RFC 1918)",
        ),
        (
            json!({"packages": ["six"], "index_url": "http://localhost:9/simple"}),
            "(host localhost)",
        ),
    ] {
        let (c, _) = ctx(&ws, "i");
        let err = call(&p, "kernel_install", args.clone(), c)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::InvalidInput(ref m) if m.contains(expect)),
            "{args}: {err}"
        );
    }

    // A real install of a small pure-Python package, visible to the running kernel.
    let py = python();
    let _ = std::process::Command::new(&py)
        .args(["-m", "pip", "uninstall", "-y", "-q", "six"])
        .output();
    run(
        &p,
        &ws,
        "i",
        "import importlib.util as u\nassert u.find_spec('six') is None",
    )
    .await
    .unwrap();
    let (c, mut rx) = ctx(&ws, "i");
    let r = call(&p, "kernel_install", json!({"packages": ["six"]}), c)
        .await
        .unwrap();
    assert_eq!(r["installed"], json!(["six"]));
    assert!(r["output"].as_str().unwrap().contains("six"), "{r}");
    assert!(
        events(&mut rx)
            .iter()
            .any(|e| matches!(e, ProviderEvent::Output(_))),
        "pip output was not streamed"
    );
    let r = run(&p, &ws, "i", "import six\nsix.__name__").await.unwrap();
    assert_eq!(value(&r), "'six'", "{r}");
    // Leave the project venv as requirements.txt made it.
    let _ = std::process::Command::new(&py)
        .args(["-m", "pip", "uninstall", "-y", "-q", "six"])
        .output();
    p.close().await;
}

/// An interpreter that is the test's real one for everything but `-m pip`,
/// where it prints the directory it was started in and its arguments, and
/// succeeds without installing anything.
fn pip_recorder(dir: &std::path::Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("python3");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n\
             [ \"$1\" = -I ] && isolated=1 && shift\n\
             if [ \"$1\" = -m ] && [ \"$2\" = pip ]; then\n\
             \x20 echo \"pip-cwd=$(pwd -P)\"\n\
             \x20 echo \"pip-isolated=${{isolated:-0}} env=$(env | grep -c '^PIP_\\|SECRET')\"\n\
             \x20 shift 2\n\
             \x20 echo \"pip-args=$*\"\n\
             \x20 exit 0\n\
             fi\n\
             exec '{}' \"$@\"\n",
            python()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake.display().to_string()
}

/// The directory the recorder says pip ran in.
fn pip_cwd(r: &serde_json::Value) -> String {
    let out = r["output"].as_str().unwrap_or_default();
    out.lines()
        .find_map(|l| l.strip_prefix("pip-cwd="))
        .unwrap_or_else(|| panic!("the recorder did not run as pip: {r}"))
        .to_owned()
}

#[tokio::test]
async fn kernel_install_runs_pip_in_the_workspace_not_the_services_directory() {
    let fake_env = tempfile::tempdir().unwrap();
    let mut cfg = config(0);
    cfg.python = pip_recorder(fake_env.path());
    let (ws, p) = provider(cfg);
    let root = ws.path().canonicalize().unwrap();
    // The service's own directory is elsewhere, so a pip left in it would show.
    let own = std::env::current_dir().unwrap().canonicalize().unwrap();
    assert_ne!(own, root);

    let (c, _) = ctx(&ws, "i");
    let r = call(&p, "kernel_install", json!({"packages": ["six"]}), c)
        .await
        .unwrap();
    assert_eq!(pip_cwd(&r), root.display().to_string(), "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(
        out.contains("pip-args=install ") && out.trim_end().ends_with(" six"),
        "{r}"
    );
    // Isolated: python -I, pip --isolated, into the session's own
    // directory, with no PIP_* or secret in its environment.
    assert!(out.contains("pip-isolated=1 env=0"), "{r}");
    assert!(
        out.contains(" --isolated ") && out.contains("--target /session/site-packages "),
        "{r}"
    );

    // Through gRPC, for a tenant: the tenant's workspace under the
    // provider's own, whatever workspace the caller names.
    let served = Served::start(&p, root.clone()).await;
    let remote = &served.remote;
    let (mut c, _) = ctx(&ws, "t");
    c.tenant = "acme".into();
    c.workspace = own.clone();
    let r = remote
        .call("kernel_install", json!({"packages": ["six"]}), c)
        .await
        .unwrap();
    assert_eq!(
        pip_cwd(&r),
        root.join(".omicos/tenants/acme").display().to_string(),
        "{r}"
    );
    served.stop().await;
    p.close().await;
}

/// A provider served over gRPC on a loopback port, with `workspace` as the
/// root it confines calls to, and a client of it.
struct Served {
    remote: RemoteProvider,
    shutdown: omicos_servicekit::Shutdown,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start<P: Provider>(p: &std::sync::Arc<P>, workspace: std::path::PathBuf) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = omicos_servicekit::Shutdown::new(Duration::from_secs(1));
        let hosting = ProviderHosting {
            registry: None,
            advertise: None,
            workspace,
            ttl_seconds: 0,
        };
        let server = tokio::spawn(serve_provider(
            p.clone(),
            listener,
            hosting,
            shutdown.clone(),
        ));
        let remote = RemoteProvider::connect(&format!("http://{addr}"))
            .await
            .unwrap();
        Self {
            remote,
            shutdown,
            server,
        }
    }

    async fn stop(self) {
        self.shutdown.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
    }
}

#[tokio::test]
async fn registry_lookup_finds_installed_functions() {
    let (ws, p) = provider(config(0));
    let (c, _) = ctx(&ws, "l");
    let r = call(
        &p,
        "registry_lookup",
        json!({"query": "savefig", "max_results": 5}),
        c,
    )
    .await
    .unwrap();
    let results = r["results"].as_array().unwrap();
    assert!(!results.is_empty() && results.len() <= 5, "{r}");
    let fig = results
        .iter()
        .find(|x| x["path"] == "matplotlib.figure.Figure.savefig")
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        fig["signature"].as_str().unwrap().starts_with("savefig("),
        "{fig}"
    );
    assert!(!fig["doc"].as_str().unwrap().is_empty(), "{fig}");
    let (c, _) = ctx(&ws, "l");
    let r = call(&p, "registry_lookup", json!({"query": "tqdm trange"}), c)
        .await
        .unwrap();
    assert!(
        r["results"].as_array().unwrap().iter().any(|x| x["path"]
            .as_str()
            .unwrap()
            .starts_with("tqdm.")
            && x["path"].as_str().unwrap().ends_with("trange")),
        "{r}"
    );
    let (c, _) = ctx(&ws, "l");
    assert!(
        call(&p, "registry_lookup", json!({"query": "  "}), c)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn notebook_round_trip() {
    let (ws, p) = provider(config(0));
    let nb = "work/analysis.ipynb";
    for (i, (src, ty)) in [
        ("# Analysis", "markdown"),
        ("a = 6 * 7\nprint('a is', a)", "code"),
        ("a + 1", "code"),
        ("raise RuntimeError('stop here')", "code"),
        ("a * 100", "code"),
    ]
    .iter()
    .enumerate()
    {
        let (c, _) = ctx(&ws, "n");
        let r = call(
            &p,
            "notebook__edit",
            json!({"path": nb, "action": "insert", "index": i, "source": src, "cell_type": ty}),
            c,
        )
        .await
        .unwrap();
        assert_eq!(r["cell_count"], i + 1);
    }
    let (c, _) = ctx(&ws, "n");
    let r = call(&p, "notebook__run", json!({"path": nb}), c)
        .await
        .unwrap();
    let ran = r["ran"].as_array().unwrap();
    assert_eq!(ran.len(), 3, "stops at the first error: {r}");
    assert_eq!(ran[2]["status"], "error");

    // The file now holds nbformat outputs; inspect summarises them.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join(nb)).unwrap()).unwrap();
    assert_eq!(file["nbformat"], 4);
    assert_eq!(file["cells"][1]["outputs"][0]["output_type"], "stream");
    assert_eq!(file["cells"][1]["outputs"][0]["text"], "a is 42\n");
    assert_eq!(
        file["cells"][2]["outputs"][0]["output_type"],
        "execute_result"
    );
    assert_eq!(file["cells"][2]["outputs"][0]["data"]["text/plain"], "43");
    assert_eq!(
        file["cells"][2]["outputs"][0]["execution_count"],
        file["cells"][2]["execution_count"]
    );
    assert_eq!(file["cells"][3]["outputs"][0]["ename"], "RuntimeError");
    assert!(file["cells"][4]["outputs"].as_array().unwrap().is_empty());
    let (c, _) = ctx(&ws, "n");
    let r = call(&p, "notebook__inspect", json!({"path": nb}), c)
        .await
        .unwrap();
    assert_eq!(r["cells"][0]["cell_type"], "markdown");
    assert_eq!(
        r["cells"][2]["outputs"][0],
        "execute_result [text/plain]: 43"
    );
    assert!(
        r["cells"][3]["outputs"][0]
            .as_str()
            .unwrap()
            .starts_with("error: RuntimeError: stop here"),
        "{r}"
    );

    // Fix the failing cell, run only what is needed, delete a cell.
    let (c, _) = ctx(&ws, "n");
    call(
        &p,
        "notebook__edit",
        json!({"path": nb, "action": "replace", "index": 3, "source": "b = a - 2"}),
        c,
    )
    .await
    .unwrap();
    let (c, _) = ctx(&ws, "n");
    let r = call(&p, "notebook__run", json!({"path": nb, "cells": [3, 4]}), c)
        .await
        .unwrap();
    assert_eq!(
        r["ran"][1]["outputs"][0],
        "execute_result [text/plain]: 4200"
    );
    let (c, _) = ctx(&ws, "n");
    call(
        &p,
        "notebook__edit",
        json!({"path": nb, "action": "delete", "index": 0}),
        c,
    )
    .await
    .unwrap();
    let (c, _) = ctx(&ws, "n");
    let r = call(&p, "notebook__inspect", json!({"path": nb}), c)
        .await
        .unwrap();
    assert_eq!(r["cell_count"], 4);
    assert_eq!(r["cells"][2]["source"], "b = a - 2");

    // Paths stay in the workspace and must be notebooks.
    for bad in ["../x.ipynb", "/etc/passwd", "notes.txt"] {
        let (c, _) = ctx(&ws, "n");
        assert!(
            matches!(
                call(&p, "notebook__inspect", json!({"path": bad}), c).await,
                Err(ToolError::InvalidInput(_))
            ),
            "{bad}"
        );
    }
    let (c, _) = ctx(&ws, "n");
    assert!(
        call(&p, "notebook__run", json!({"path": nb, "cells": [99]}), c)
            .await
            .is_err()
    );
    p.close().await;
}

#[tokio::test]
async fn through_grpc() {
    let (ws, p) = provider(config(1));
    let served = Served::start(&p, ws.path().canonicalize().unwrap()).await;
    let remote = &served.remote;
    assert_eq!(remote.name(), "kernel");
    assert!(remote.session_affinity());
    let names: Vec<String> = remote.tools().into_iter().map(|t| t.name).collect();
    for t in [
        "run_python_code",
        "kernel_install",
        "registry_lookup",
        "notebook__inspect",
        "notebook__edit",
        "notebook__run",
    ] {
        assert!(names.contains(&t.to_string()), "{t} missing from {names:?}");
    }
    let run_spec = remote
        .tools()
        .into_iter()
        .find(|t| t.name == "run_python_code")
        .unwrap();
    assert_eq!(run_spec.aliases, vec!["python"]);
    assert_eq!(run_spec.toolset, "integrated_notebook");

    let (c, mut rx) = ctx(&ws, "g");
    let r = remote
        .call(
            "run_python_code",
            json!({"code": "import sys\nprint('over grpc')\nq = 7\nq * 6"}),
            c,
        )
        .await
        .unwrap();
    assert_eq!(value(&r), "42");
    assert!(
        events(&mut rx)
            .iter()
            .any(|e| matches!(e, ProviderEvent::Output(o) if o.text == "over grpc\n"))
    );
    let (c, _) = ctx(&ws, "g");
    let r = remote
        .call("python", json!({"code": "q"}), c)
        .await
        .unwrap();
    assert_eq!(value(&r), "7");
    // A refused install travels back as an error result.
    let (c, _) = ctx(&ws, "g");
    let err = remote
        .call("kernel_install", json!({"packages": ["--target=/x"]}), c)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--target"), "{err}");
    // Dropping the call (client cancel) interrupts the cell on the provider.
    let (c, _) = ctx(&ws, "g");
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        cancel.cancel();
    });
    let r = remote
        .call(
            "run_python_code",
            json!({"code": "q = 8\nimport time\ntime.sleep(60)"}),
            c,
        )
        .await;
    assert!(matches!(r, Err(ToolError::Cancelled)), "{r:?}");
    let (c, _) = ctx(&ws, "g");
    let started = std::time::Instant::now();
    let r = remote
        .call("run_python_code", json!({"code": "q"}), c)
        .await
        .unwrap();
    assert_eq!(value(&r), "8");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the cancelled cell kept running: {:?}",
        started.elapsed()
    );
    served.stop().await;
    p.close().await;
}
