//! The sandbox's cost per shell call: `bash -lc true` as the shell tool runs
//! it (own process group), unsandboxed and sandboxed, in one run; each
//! iteration runs every variant once, in a shuffled order (a cgroup migration
//! is cheaper right after another one, so a fixed order would bias the
//! figures). Prints p50/p90 and the p50 overhead against the baseline.
//!
//! `cargo bench -p omicos-sandbox` (OMICOS_BENCH_ITERS to change the count).

use omicos_sandbox::{ProcessCgroup, Roots, Sandbox, SandboxConfig, SandboxPolicy};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The call as the shell tool makes it. The sandbox gives the command a
/// fresh HOME and TMPDIR in the session's tmp; the baseline gets the same, so
/// that both read the same (system-only) login profile.
fn command(ws: &Path, tmp: &Path) -> Command {
    let mut cmd = Command::new("bash");
    cmd.args(["-lc", "true"])
        .current_dir(ws)
        .env("HOME", tmp.join("home"))
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    cmd
}

fn check(status: std::io::Result<std::process::ExitStatus>) {
    let status = status.expect("bash runs");
    assert!(status.success(), "bash -lc true failed: {status}");
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Variant {
    name: &'static str,
    sandbox: Option<Sandbox>,
    times: Vec<Duration>,
    /// Calls whose process a parked launcher forked inside its cgroup.
    launched: usize,
}

fn main() {
    let iters: usize = std::env::var("OMICOS_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let tmp_root = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        tmp_root: Some(tmp_root.path().to_path_buf()),
        ..SandboxConfig::default()
    };
    let make = |c: SandboxConfig| Some(Sandbox::new(c).unwrap());
    let default = make(config.clone());
    let cgroup_in_use = default.as_ref().unwrap().process_limit_enforced();
    let tmp = default.as_ref().unwrap().session_tmp_dir("bench").unwrap();
    std::fs::create_dir_all(tmp.join("home")).unwrap();
    let roots = Roots::new(&ws).tmp(&tmp);
    let mut variants = vec![
        Variant {
            name: "unsandboxed",
            sandbox: None,
            times: vec![],
            launched: 0,
        },
        Variant {
            name: "workspace-write (default config)",
            sandbox: default,
            times: vec![],
            launched: 0,
        },
        Variant {
            name: "workspace-write, launchers: 0 (old path)",
            sandbox: make(SandboxConfig {
                process_cgroup_launchers: 0,
                ..config.clone()
            }),
            times: vec![],
            launched: 0,
        },
        Variant {
            name: "workspace-write, process_cgroup: off",
            sandbox: make(SandboxConfig {
                process_cgroup: ProcessCgroup::Off,
                ..config.clone()
            }),
            times: vec![],
            launched: 0,
        },
        Variant {
            name: "workspace-write, private_loopback",
            sandbox: make(SandboxConfig {
                private_loopback: true,
                ..config.clone()
            }),
            times: vec![],
            launched: 0,
        },
    ];
    // True when a parked launcher forked the process.
    let call = |sandbox: &Option<Sandbox>| match sandbox {
        None => {
            check(command(&ws, &tmp).status());
            false
        }
        Some(s) => {
            let prepared = s.prepare(SandboxPolicy::WorkspaceWrite, &roots).unwrap();
            let launched = prepared.has_launcher();
            let mut cmd = command(&ws, &tmp);
            check(prepared.spawn_std(&mut cmd).and_then(|mut c| c.wait()));
            drop(prepared);
            launched
        }
    };
    for _ in 0..20 {
        for v in &variants {
            call(&v.sandbox);
        }
    }
    for v in &variants {
        if let Some(s) = &v.sandbox {
            s.wait_for_launchers(Duration::from_secs(5));
        }
    }
    let mut order: Vec<usize> = (0..variants.len()).collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..iters {
        // Fisher-Yates with a small LCG: a fresh order every iteration.
        for i in (1..order.len()).rev() {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            order.swap(i, (seed >> 33) as usize % (i + 1));
        }
        for &i in &order {
            let t = Instant::now();
            let launched = call(&variants[i].sandbox);
            variants[i].times.push(t.elapsed());
            variants[i].launched += usize::from(launched);
        }
    }
    let mut prep = Vec::new();
    let s = variants[1].sandbox.as_ref().unwrap();
    for _ in 0..iters {
        let t = Instant::now();
        drop(s.prepare(SandboxPolicy::WorkspaceWrite, &roots).unwrap());
        prep.push(t.elapsed());
    }
    // As root the default config's process limit is a pids cgroup per call
    // (the kernel never applies RLIMIT_NPROC to uid 0); otherwise RLIMIT_NPROC.
    let root = unsafe { libc::geteuid() } == 0;
    println!(
        "sandbox overhead per shell call (bash -lc true), {iters} iterations, shuffled; euid {}; default config's process limit: {}",
        unsafe { libc::geteuid() },
        match (cgroup_in_use, root) {
            (true, true) => "a pids cgroup per call",
            (true, false) => "RLIMIT_NPROC",
            (false, _) => "none (no writable pids cgroup found)",
        }
    );
    let base = pct(&mut variants[0].times, 0.5);
    for v in &mut variants {
        let p50 = pct(&mut v.times, 0.5);
        let p90 = pct(&mut v.times, 0.9);
        println!(
            "  {:<42} p50 {:7.3} ms  p90 {:7.3} ms  overhead p50 {:+7.3} ms  launcher {}/{iters}",
            v.name,
            ms(p50),
            ms(p90),
            ms(p50) - ms(base),
            v.launched
        );
    }
    println!(
        "  {:<42} p50 {:7.3} ms  p90 {:7.3} ms",
        "prepare + drop alone (default config)",
        ms(pct(&mut prep, 0.5)),
        ms(pct(&mut prep, 0.9))
    );
}
