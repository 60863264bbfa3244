//! run_python_code against a real ipykernel: state, outputs, errors,
//! timeouts, deaths, isolation, cancel, progress, pool, markers, cap.

mod common;

use common::*;
use omicos_kernel::KernelConfig;
use omicos_toolkit::{ProviderEvent, ToolError};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn state_outputs_display_and_errors() {
    let (ws, p) = provider(config(0));
    // State across calls, and the last expression's value.
    let r = run(&p, &ws, "s1", "x = 41").await.unwrap();
    assert!(r["execute_result"].is_null(), "{r}");
    let r = run(&p, &ws, "s1", "x + 1").await.unwrap();
    assert_eq!(value(&r), "42");
    assert_eq!(r["execution_count"], 2);

    // stdout and stderr, streamed while the cell runs.
    let (c, mut rx) = ctx(&ws, "s1");
    let r = call(
        &p,
        "python",
        json!({"content": "import sys\nprint('out')\nprint('err', file=sys.stderr)"}),
        c,
    )
    .await
    .unwrap();
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    let ev = events(&mut rx);
    assert!(
        ev.iter().any(
            |e| matches!(e, ProviderEvent::Output(o) if o.stream == "stdout" && o.text == "out\n")
        ),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(
            |e| matches!(e, ProviderEvent::Output(o) if o.stream == "stderr" && o.text == "err\n")
        ),
        "{ev:?}"
    );

    // display_data with HTML, and markdown as the last value.
    let r = run(&p, &ws, "s1", "from IPython.display import HTML, Markdown, display\ndisplay(HTML('<b>hi</b>'))\nMarkdown('# title')").await.unwrap();
    assert_eq!(r["display_data"][0]["text/html"], "<b>hi</b>");
    assert_eq!(r["execute_result"]["text/markdown"], "# title");

    // A matplotlib figure: PNG in the result and saved in the workspace.
    let r = run(
        &p,
        &ws,
        "s1",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    )
    .await
    .unwrap();
    let d = &r["display_data"][0];
    let b64 = d["image/png"].as_str().expect("png in result");
    assert!(
        b64.starts_with("iVBORw0KGgo"),
        "not a PNG: {}",
        &b64[..20.min(b64.len())]
    );
    let rel = d["png_path"].as_str().unwrap();
    assert!(rel.starts_with(".omicos/outputs/s1/"), "{rel}");
    let bytes = std::fs::read(ws.path().join(rel)).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");

    // An error with a clean traceback.
    let r = run(
        &p,
        &ws,
        "s1",
        "def f():\n    raise ValueError('bad value')\nf()",
    )
    .await
    .unwrap();
    let e = &r["error"];
    assert_eq!(e["ename"], "ValueError");
    assert_eq!(e["evalue"], "bad value");
    let tb = e["traceback"].as_str().unwrap();
    assert!(
        tb.contains("raise ValueError('bad value')") && !tb.contains('\x1b'),
        "{tb}"
    );

    // The workspace is the cwd.
    let r = run(&p, &ws, "s1", "import os\nos.getcwd()").await.unwrap();
    assert_eq!(
        value(&r),
        format!("'{}'", ws.path().canonicalize().unwrap().display())
    );

    // Bad input is a clear error.
    let (c, _) = ctx(&ws, "s1");
    let err = call(&p, "run_python_code", json!({}), c).await.unwrap_err();
    assert!(
        matches!(err, ToolError::InvalidInput(ref m) if m.contains("code is required")),
        "{err}"
    );
    p.close().await;
}

#[tokio::test]
async fn timeout_interrupts_keeps_state_or_kills_and_restarts() {
    let (ws, p) = provider(KernelConfig {
        interrupt_grace: Duration::from_millis(500),
        ..config(0)
    });
    run(&p, &ws, "t", "y = 5").await.unwrap();
    let (c, _) = ctx(&ws, "t");
    let started = Instant::now();
    let r = call(
        &p,
        "run_python_code",
        json!({"code": "while True:\n    pass", "timeout": 0.5}),
        c,
    )
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r["timeout"]["stopped_by"], "interrupt_request", "{r}");
    assert_eq!(r["error"]["ename"], "KeyboardInterrupt");
    assert_eq!(value(&run(&p, &ws, "t", "y").await.unwrap()), "5");

    // A cell that ignores the first SIGINT (the one interrupt_request sends):
    // the provider's own SIGINT to the group stops it, state kept.
    let (c, _) = ctx(&ws, "t");
    let second = "import signal, time\nseen = []\ndef h(*a):\n    seen.append(1)\n    if len(seen) >= 2:\n        raise KeyboardInterrupt\nsignal.signal(signal.SIGINT, h)\nwhile True:\n    time.sleep(0.01)";
    let r = call(
        &p,
        "run_python_code",
        json!({"code": second, "timeout": 0.5}),
        c,
    )
    .await
    .unwrap();
    assert_eq!(r["timeout"]["stopped_by"], "sigint", "{r}");
    assert_eq!(
        value(&run(&p, &ws, "t", "(y, len(seen))").await.unwrap()),
        "(5, 2)"
    );

    // A cell that swallows every interrupt: killed, and the next call says so.
    let (c, _) = ctx(&ws, "t");
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n    except KeyboardInterrupt:\n        pass";
    let r = call(
        &p,
        "run_python_code",
        json!({"code": stubborn, "timeout": 0.5}),
        c,
    )
    .await
    .unwrap();
    assert_eq!(r["timeout"]["stopped_by"], "killed_and_restarted", "{r}");
    let r = run(&p, &ws, "t", "y").await.unwrap();
    assert!(
        r["notice"]
            .as_str()
            .unwrap()
            .contains("kernel restarted, variables lost"),
        "{r}"
    );
    assert_eq!(r["error"]["ename"], "NameError");
    p.close().await;
}

#[tokio::test]
async fn kernel_death_is_reported_never_rerun() {
    let (ws, p) = provider(config(0));
    run(&p, &ws, "d", "z = 1").await.unwrap();
    let r = run(&p, &ws, "d", "import os\nos._exit(1)").await.unwrap();
    assert_eq!(r["error"]["ename"], "KernelDied", "{r}");
    assert!(
        r["error"]["evalue"]
            .as_str()
            .unwrap()
            .contains("exited with code 1"),
        "{r}"
    );
    let r = run(&p, &ws, "d", "z").await.unwrap();
    assert!(
        r["notice"]
            .as_str()
            .unwrap()
            .contains("kernel restarted, variables lost"),
        "{r}"
    );
    assert_eq!(r["error"]["ename"], "NameError");

    // Killed from outside while idle (an OOM kill): noticed by its exit.
    run(&p, &ws, "d", "z = 2").await.unwrap();
    let k = p.kernels().session_kernel("d").unwrap();
    k.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = run(&p, &ws, "d", "'z' in dir()").await.unwrap();
    let notice = r["notice"].as_str().unwrap();
    assert!(
        notice.contains("kernel restarted, variables lost") && notice.contains("SIGKILL"),
        "{notice}"
    );
    assert_eq!(value(&r), "False");
    p.close().await;
}

#[tokio::test]
async fn sessions_are_isolated_and_concurrent() {
    let (ws, p) = provider(config(0));
    // Start both kernels first so the timing below measures cells only.
    run(&p, &ws, "a", "v = 'a'").await.unwrap();
    run(&p, &ws, "b", "v = 'b'").await.unwrap();
    let cell = "import time\ntime.sleep(1.0)\nv";
    let started = Instant::now();
    let (ra, rb) = tokio::join!(run(&p, &ws, "a", cell), run(&p, &ws, "b", cell));
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "sessions ran one after the other: {:?}",
        started.elapsed()
    );
    assert_eq!(value(&ra.unwrap()), "'a'");
    assert_eq!(value(&rb.unwrap()), "'b'");
    assert_ne!(
        p.kernels().session_kernel("a").unwrap().pid(),
        p.kernels().session_kernel("b").unwrap().pid()
    );
    p.close().await;
}

#[tokio::test]
async fn cancel_interrupts_the_running_cell() {
    let (ws, p) = provider(config(0));
    run(&p, &ws, "c", "w = 0").await.unwrap();
    let (c, _) = ctx(&ws, "c");
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let r = call(
        &p,
        "run_python_code",
        json!({"code": "w = 1\nimport time\ntime.sleep(60)\nw = 2"}),
        c,
    )
    .await;
    assert!(matches!(r, Err(ToolError::Cancelled)), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The cell was interrupted, not left running: the kernel answers at once, state kept.
    let started = Instant::now();
    let r = run(&p, &ws, "c", "w").await.unwrap();
    assert_eq!(value(&r), "1");
    assert!(started.elapsed() < Duration::from_secs(2));
    p.close().await;
}

#[tokio::test]
async fn tqdm_bars_become_progress_events() {
    let (ws, p) = provider(config(0));
    let (c, mut rx) = ctx(&ws, "q");
    let code = "from tqdm import tqdm\nimport time\nfor i in tqdm(range(5), desc='steps'):\n    time.sleep(0.12)\nprint('done')";
    let r = call(&p, "run_python_code", json!({"code": code}), c)
        .await
        .unwrap();
    let bars: Vec<_> = events(&mut rx)
        .into_iter()
        .filter_map(|e| match e {
            ProviderEvent::Progress(p) => Some(p),
            _ => None,
        })
        .collect();
    assert!(bars.len() >= 2, "{bars:?}");
    assert!(
        bars.iter().all(|b| b.label == "steps"
            && b.bar_id == bars[0].bar_id
            && b.total == 5.0
            && b.unit == "it"),
        "{bars:?}"
    );
    let last = bars.last().unwrap();
    assert!(
        last.done && last.current == 5.0 && last.percent == 100.0,
        "{last:?}"
    );
    assert_eq!(r["stdout"], "done\n");
    // The result keeps the bar's final state, not every redraw.
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("5/5") && !stderr.contains('\r') && !stderr.contains("0/5"),
        "{stderr:?}"
    );
    p.close().await;
}

#[tokio::test]
async fn warm_pool_markers_and_cap() {
    // No culling here: which kernels count against the cap must not depend
    // on how long the steps take on a loaded machine.
    let (ws, p) = provider(KernelConfig {
        pool_size: 1,
        max_kernels: 2,
        idle_timeout: Duration::ZERO,
        ..config(1)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.kernels().warm_count() < 1 {
        assert!(Instant::now() < deadline, "the warm pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let r = run(&p, &ws, "w1", "1 + 1").await.unwrap();
    assert_eq!(value(&r), "2");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "first call with a warm kernel took {:?}",
        started.elapsed()
    );
    assert!(r.get("notice").is_none(), "{r}");

    // At once: w1's kernel and the one the pool is starting make the cap,
    // so w2 waits for that kernel instead of being refused.
    let r = run(&p, &ws, "w2", "2").await.unwrap();
    assert_eq!(value(&r), "2");
    // Now two sessions hold both kernels and nothing is starting: refused, clearly.
    let err = run(&p, &ws, "w3", "3").await.unwrap_err();
    assert!(err.to_string().contains("kernel.max_kernels"), "{err}");
    assert_eq!(p.kernels().session_count(), 2);

    // The marker names this instance.
    let marker: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ws.path().join(".omicos/kernels/w1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(marker["instance"], p.kernels().instance_id());

    // Another instance that gets this session says the state is lost.
    let other =
        omicos_kernel::KernelProvider::new(config(0), ws.path().canonicalize().unwrap(), vec![])
            .unwrap();
    let r = run(&other, &ws, "w1", "1").await.unwrap();
    let notice = r["notice"].as_str().unwrap();
    assert!(
        notice.contains(p.kernels().instance_id())
            && notice.contains("variables")
            && notice.contains("lost"),
        "{notice}"
    );
    other.close().await;
    p.close().await;
}

#[tokio::test]
async fn idle_kernels_are_culled_and_the_next_call_says_so() {
    let (ws, p) = provider(KernelConfig {
        pool_size: 0,
        idle_timeout: Duration::from_secs(1),
        ..config(0)
    });
    let r = run(&p, &ws, "c1", "x = 1\nx").await.unwrap();
    assert_eq!(value(&r), "1");
    // After 1 s unused (the culler looks every second), c1's kernel is stopped.
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.kernels().session_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle kernel was never culled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = run(&p, &ws, "c1", "'x' in globals()").await.unwrap();
    assert_eq!(value(&r), "False", "a fresh kernel: {r}");
    assert!(r["notice"].as_str().unwrap().contains("without use"), "{r}");
    p.close().await;
}

#[tokio::test]
async fn missing_ipykernel_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("bare");
    let base = python();
    let ok = std::process::Command::new(&base)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(ok.success());
    let cfg = omicos_kernel::KernelConfig {
        python: venv.join("bin/python3").display().to_string(),
        pool_size: 0,
        ..Default::default()
    };
    let (ws, p) = provider(cfg);
    let err = run(&p, &ws, "m", "1").await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("ipykernel is not installed") && msg.contains("omicos kernel setup"),
        "{msg}"
    );
    let cfg = omicos_kernel::KernelConfig {
        python: "/nonexistent/python3".into(),
        pool_size: 0,
        ..Default::default()
    };
    let (ws, p) = provider(cfg);
    let msg = run(&p, &ws, "m", "1").await.unwrap_err().to_string();
    assert!(msg.contains("does not exist"), "{msg}");
}

#[tokio::test]
async fn hung_kernel_is_caught_by_the_heartbeat() {
    let (ws, p) = provider(KernelConfig {
        heartbeat_interval: Duration::from_millis(500),
        ..config(0)
    });
    run(&p, &ws, "h", "h = 1").await.unwrap();
    let k = p.kernels().session_kernel("h").unwrap();
    // A stopped process neither answers nor exits: only the heartbeat can tell.
    unsafe { libc::kill(k.pid(), libc::SIGSTOP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while k.death().is_none() {
        assert!(
            Instant::now() < deadline,
            "the heartbeat never declared the kernel dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(k.death().unwrap().contains("heartbeat"), "{:?}", k.death());
    let r = run(&p, &ws, "h", "'h' in dir()").await.unwrap();
    assert!(
        r["notice"]
            .as_str()
            .unwrap()
            .contains("kernel restarted, variables lost"),
        "{r}"
    );
    assert_eq!(value(&r), "False");
    p.close().await;
}

#[tokio::test]
async fn a_warm_kernel_moves_to_the_sessions_workspace() {
    let (_default_ws, p) = provider(config(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.kernels().warm_count() < 1 {
        assert!(Instant::now() < deadline, "the warm pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("data.txt"), "from the other workspace").unwrap();
    let r = run(&p, &other, "o", "open('data.txt').read()")
        .await
        .unwrap();
    assert_eq!(value(&r), "'from the other workspace'", "{r}");
    assert!(other.path().join(".omicos/kernels/o.json").exists());
    p.close().await;
}
