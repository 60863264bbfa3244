//! The sandbox against real commands (bash, coreutils, python3, curl), in the
//! manner of codex's landlock suite. These tests run as root on the project's
//! machines: every denial below holds for root too (Landlock, seccomp and the
//! capability drop apply to uid 0; file permission bits would not).

use omicos_sandbox::run::{RunRequest, exit_code};
use omicos_sandbox::{
    Prepared, Rlimits, Roots, Sandbox, SandboxConfig, SandboxPolicy, WhenLandlockMissing,
};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

struct Fixture {
    ws: tempfile::TempDir,
    outside: tempfile::TempDir,
    _tmp_root: tempfile::TempDir,
    sandbox: Sandbox,
}

fn fixture_with(mut cfg: SandboxConfig) -> Fixture {
    let tmp_root = tempfile::tempdir().unwrap();
    cfg.tmp_root = Some(tmp_root.path().canonicalize().unwrap());
    Fixture {
        ws: tempfile::tempdir().unwrap(),
        outside: tempfile::tempdir().unwrap(),
        _tmp_root: tmp_root,
        sandbox: Sandbox::new(cfg).unwrap(),
    }
}

fn fixture() -> Fixture {
    fixture_with(SandboxConfig::default())
}

impl Fixture {
    fn ws(&self) -> PathBuf {
        self.ws.path().canonicalize().unwrap()
    }

    fn outside(&self) -> PathBuf {
        self.outside.path().canonicalize().unwrap()
    }

    fn prepare(&self, policy: SandboxPolicy) -> Prepared {
        let tmp = self.sandbox.session_tmp_dir("test-session").unwrap();
        self.sandbox
            .prepare(policy, &Roots::new(self.ws()).tmp(tmp))
            .unwrap()
    }

    /// `bash -c script` under `policy`, in the workspace.
    fn run(&self, policy: SandboxPolicy, script: &str) -> Out {
        let prepared = self.prepare(policy);
        let mut cmd = Command::new("/usr/bin/bash");
        cmd.arg("-c").arg(script).current_dir(self.ws());
        prepared.apply_to_std(&mut cmd);
        let o = cmd.output().expect("the sandboxed command starts");
        Out {
            code: exit_code(o.status),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

#[test]
fn reads_of_the_system_work() {
    let f = fixture();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("ls /usr/bin >/dev/null && cat /etc/os-release >/dev/null && {PYTHON} -c 'import json, ssl; print(json.dumps([1]))' && echo ok"),
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stdout, "[1]\nok\n", "{o:?}");
    // A login shell, as the shell tool runs it, starts without noise.
    let prepared = f.prepare(SandboxPolicy::WorkspaceWrite);
    let mut cmd = Command::new("bash");
    cmd.args(["-lc", "echo login"]).current_dir(f.ws());
    prepared.apply_to_std(&mut cmd);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "login\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "{o:?}");
}

#[test]
fn writes_outside_the_roots_fail() {
    let f = fixture();
    let outside = f.outside();
    let target = outside.join("escaped");
    for policy in [SandboxPolicy::WorkspaceWrite, SandboxPolicy::Network] {
        let o = f.run(policy, &format!("echo x > {}", target.display()));
        assert_ne!(o.code, 0, "{policy}: {o:?}");
        assert!(o.stderr.contains("Permission denied"), "{o:?}");
        assert!(!target.exists());
    }
    // /etc and the system temp dir are not writable either, for root too.
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        "touch /etc/omicos-sandbox-test; touch /tmp/omicos-sandbox-test-$$; mkdir /usr/omicos-x",
    );
    assert_eq!(o.stderr.matches("Permission denied").count(), 3, "{o:?}");
    assert!(!Path::new("/etc/omicos-sandbox-test").exists());
    // Danger-full-access is the one policy that may.
    let o = f.run(
        SandboxPolicy::DangerFullAccess,
        &format!("echo x > {}", target.display()),
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert!(target.exists());
}

#[test]
fn the_workspace_and_tmp_are_writable() {
    let f = fixture();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        "set -e; mkdir -p a/b; echo one > a/b/f; mv a/b/f a/g; ln -s g a/link; cat a/link; \
         t=$(mktemp); echo two > \"$t\"; cat \"$t\"; echo \"$TMPDIR\"; echo \"$HOME\"; touch ~/.dotfile; rm -r a",
    );
    assert_eq!(o.code, 0, "{o:?}");
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(&lines[..2], ["one", "two"], "{o:?}");
    let tmp = f.sandbox.session_tmp_dir("test-session").unwrap();
    assert_eq!(lines[2], tmp.display().to_string());
    // HOME is a fresh directory in the tmp: the real one holds credentials.
    assert_eq!(lines[3], tmp.join("home").display().to_string());
    assert!(tmp.join("home/.dotfile").exists());
    assert!(!f.ws().join("a").exists());
}

#[test]
fn read_only_keeps_the_workspace_readable_and_tmp_writable() {
    let f = fixture();
    std::fs::write(f.ws().join("data.txt"), "hello\n").unwrap();
    let o = f.run(
        SandboxPolicy::ReadOnly,
        "cat data.txt; echo x > new.txt; echo y >> data.txt; t=$(mktemp) && echo tmp-ok > $t && cat $t",
    );
    assert_eq!(o.stdout, "hello\ntmp-ok\n", "{o:?}");
    assert_eq!(o.stderr.matches("Permission denied").count(), 2, "{o:?}");
    assert!(!f.ws().join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(f.ws().join("data.txt")).unwrap(),
        "hello\n"
    );
}

#[test]
fn secrets_homes_and_other_processes_stay_out_of_reach() {
    let f = fixture();
    let me = std::process::id();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!(
            "cat /etc/shadow; ls /root; cat /proc/{me}/environ; kill -0 {me}; \
             mknod dev c 1 3; grep -E '^(NoNewPrivs|CapEff|CapBnd)' /proc/self/status"
        ),
    );
    // shadow, /root, the parent's environ (Landlock's ptrace scope), the
    // signal (Landlock's signal scope) and mknod (no capability, no right).
    assert!(o.stderr.contains("/etc/shadow: Permission denied"), "{o:?}");
    assert!(o.stderr.contains("'/root': Permission denied"), "{o:?}");
    assert!(
        o.stderr
            .contains(&format!("/proc/{me}/environ: Permission denied")),
        "{o:?}"
    );
    assert!(o.stderr.contains("Operation not permitted"), "{o:?}");
    assert!(!f.ws().join("dev").exists(), "{o:?}");
    assert!(o.stdout.contains("NoNewPrivs:\t1"), "{o:?}");
    assert!(o.stdout.contains("CapEff:\t0000000000000000"), "{o:?}");
    assert!(o.stdout.contains("CapBnd:\t0000000000000000"), "{o:?}");
}

#[test]
fn python_open_etc_for_writing_fails_clearly() {
    let f = fixture();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("{PYTHON} -c \"open('/etc/x', 'w')\""),
    );
    assert_ne!(o.code, 0);
    assert!(
        o.stderr
            .contains("PermissionError: [Errno 13] Permission denied: '/etc/x'"),
        "{o:?}"
    );
    assert!(!Path::new("/etc/x").exists());
}

#[test]
fn symlinks_and_hard_links_inside_the_workspace_cannot_escape() {
    let f = fixture();
    let outside = f.outside();
    std::fs::write(outside.join("secret"), "secret\n").unwrap();
    // A directory swapped for a symlink between two commands.
    let o = f.run(SandboxPolicy::WorkspaceWrite, "mkdir d && echo in > d/f");
    assert_eq!(o.code, 0, "{o:?}");
    std::fs::remove_dir_all(f.ws().join("d")).unwrap();
    std::os::unix::fs::symlink(&outside, f.ws().join("d")).unwrap();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!(
            "echo out > d/f; cat d/secret; ln -s {o} l2 && echo out > l2/g; ln {o}/secret hard; cp d/secret copy",
            o = outside.display()
        ),
    );
    assert_eq!(o.stderr.matches("Permission denied").count(), 4, "{o:?}");
    // Landlock refuses to link a file in from outside (EXDEV: no Refer right there).
    assert!(o.stderr.contains("failed to create hard link"), "{o:?}");
    assert!(!outside.join("f").exists() && !outside.join("g").exists());
    assert!(!f.ws().join("hard").exists() && !f.ws().join("copy").exists());
    // The swap made inside the sandbox itself changes nothing either.
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("rm d && ln -s {} d && echo out > d/h", outside.display()),
    );
    assert_ne!(o.code, 0, "{o:?}");
    assert!(!outside.join("h").exists());
}

/// A loopback HTTP server that counts the connections it accepted.
fn listener() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            // Read the whole request: closing with unread bytes would reset the connection.
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    (port, n)
}

fn network_probes(port: u16) -> [(&'static str, String); 3] {
    [
        (
            "curl",
            format!("curl -sS --max-time 5 http://127.0.0.1:{port}/"),
        ),
        (
            "python",
            format!(
                "{PYTHON} -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100).decode().split()[-1])\""
            ),
        ),
        (
            "/dev/tcp",
            format!(
                "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && tail -c 5 <&3 && echo"
            ),
        ),
    ]
}

#[test]
fn without_network_curl_python_and_dev_tcp_all_fail() {
    let f = fixture();
    let (port, accepted) = listener();
    for policy in [SandboxPolicy::WorkspaceWrite, SandboxPolicy::ReadOnly] {
        for (what, script) in network_probes(port) {
            let o = f.run(policy, &script);
            assert_ne!(
                o.code, 0,
                "{what} under {policy} reached the network: {o:?}"
            );
            assert!(
                o.stderr.contains("Operation not permitted")
                    || o.stderr.contains("Permission denied")
                    || o.stderr.contains("Could not connect")
                    || o.stderr.contains("Failed to connect"),
                "{what}: {o:?}"
            );
        }
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a sandboxed process reached the listener"
    );
    // The listener is really there: the same probes succeed under `network`.
    for (what, script) in network_probes(port) {
        let o = f.run(SandboxPolicy::Network, &script);
        assert_eq!(o.code, 0, "{what} under network: {o:?}");
        assert!(o.stdout.contains("hello"), "{what}: {o:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    // Unix sockets stay usable offline (the kernel's channels are unix sockets).
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!(
            "{PYTHON} -c \"import socket; a, b = socket.socketpair(); a.sendall(b'unix-ok'); print(b.recv(10).decode()); s = socket.socket(socket.AF_UNIX); s.bind('sock'); s.listen(); print('bound')\""
        ),
    );
    assert_eq!(o.stdout, "unix-ok\nbound\n", "{o:?}");
}

fn limited(rlimits: Rlimits) -> Fixture {
    fixture_with(SandboxConfig {
        rlimits,
        ..SandboxConfig::default()
    })
}

#[test]
fn a_fork_bomb_is_contained() {
    let f = limited(Rlimits {
        processes: Some(64),
        ..Rlimits::default()
    });
    if !f.sandbox.process_limit_enforced() {
        eprintln!(
            "SKIPPED: root without a writable pids cgroup: the process limit cannot hold here"
        );
        return;
    }
    let prepared = f.prepare(SandboxPolicy::WorkspaceWrite);
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "bomb() { bomb | bomb & }; bomb; sleep 3"])
        .current_dir(f.ws())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    prepared.apply_to_std(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(3) {
        peak = peak.max(prepared.processes_now().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(peak <= 64, "the bomb reached {peak} processes");
    assert!(peak >= 32, "the bomb never grew ({peak}): did it run?");
    prepared.kill_all();
    // SAFETY: the group is the child's own.
    unsafe {
        libc::killpg(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("Resource temporarily unavailable"), "{err}");
    drop(prepared);
    // The machine is fine: the next command runs.
    let o = f.run(SandboxPolicy::WorkspaceWrite, "echo alive");
    assert_eq!(o.stdout, "alive\n", "{o:?}");
}

#[test]
fn background_processes_die_with_the_call() {
    let f = fixture();
    let marker = f.ws().join("survivor");
    let prepared = f.prepare(SandboxPolicy::WorkspaceWrite);
    if prepared.processes_now().is_none() {
        eprintln!("SKIPPED: no pids cgroup here");
        return;
    }
    // setsid leaves the process group, so killpg alone would miss it.
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(
            "setsid bash -c 'sleep 1; touch {}' >/dev/null 2>&1 & disown; echo started",
            marker.display()
        ))
        .current_dir(f.ws());
    prepared.apply_to_std(&mut cmd);
    let o = cmd.output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "started\n");
    drop(prepared);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!marker.exists(), "a process outlived its call");
}

#[test]
fn a_memory_hog_and_a_cpu_spinner_are_stopped() {
    let f = limited(Rlimits {
        address_space_bytes: Some(512 << 20),
        cpu_seconds: Some(1),
        ..Rlimits::default()
    });
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("{PYTHON} -c 'b = bytearray(2 << 30)'; {PYTHON} -c 'b = bytearray(50 << 20); print(\"small ok\")'"),
    );
    assert!(o.stderr.contains("MemoryError"), "{o:?}");
    assert_eq!(o.stdout, "small ok\n", "{o:?}");
    let started = Instant::now();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("exec {PYTHON} -c 'while True: pass'"),
    );
    assert_eq!(o.code, 128 + libc::SIGXCPU, "{o:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn without_landlock_the_config_refuses_or_warns() {
    let f = fixture_with(SandboxConfig {
        simulate_landlock_missing: true,
        ..SandboxConfig::default()
    });
    let e = f
        .sandbox
        .prepare(SandboxPolicy::WorkspaceWrite, &Roots::new(f.ws()))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("the kernel offers no Landlock, so file access cannot be confined"),
        "{e}"
    );
    // danger-full-access needs no Landlock.
    assert!(
        f.sandbox
            .prepare(SandboxPolicy::DangerFullAccess, &Roots::new(f.ws()))
            .is_ok()
    );

    let f = fixture_with(SandboxConfig {
        simulate_landlock_missing: true,
        when_landlock_missing: WhenLandlockMissing::Warn,
        ..SandboxConfig::default()
    });
    let prepared = f.prepare(SandboxPolicy::WorkspaceWrite);
    assert!(!prepared.confines_files());
    assert!(
        prepared.warnings()[0].contains("without file-access confinement"),
        "{:?}",
        prepared.warnings()
    );
    // It runs; seccomp still holds.
    let (port, accepted) = listener();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!("echo ran; curl -sS --max-time 5 http://127.0.0.1:{port}/"),
    );
    assert!(o.stdout.starts_with("ran\n"), "{o:?}");
    assert_ne!(o.code, 0, "{o:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn the_cli_entry_point_runs_a_command_and_returns_its_code() {
    let f = fixture();
    let req = |policy, argv: &[&str]| RunRequest {
        policy,
        workspace: f.ws(),
        argv: argv.iter().map(Into::into).collect(),
    };
    let code = omicos_sandbox::run::run(
        &f.sandbox,
        &req(
            SandboxPolicy::WorkspaceWrite,
            &["bash", "-c", "echo hi > out; exit 7"],
        ),
    )
    .unwrap();
    assert_eq!(code, 7);
    assert_eq!(std::fs::read_to_string(f.ws().join("out")).unwrap(), "hi\n");
    let code = omicos_sandbox::run::run(
        &f.sandbox,
        &req(SandboxPolicy::ReadOnly, &["bash", "-c", "echo hi > out2"]),
    )
    .unwrap();
    assert_eq!(code, 1);
    assert!(!f.ws().join("out2").exists());
    let e = omicos_sandbox::run::run(&f.sandbox, &req(SandboxPolicy::ReadOnly, &[])).unwrap_err();
    assert!(e.to_string().contains("no command given"), "{e}");
    let e = omicos_sandbox::run::run(
        &f.sandbox,
        &req(SandboxPolicy::ReadOnly, &["/nonexistent/prog"]),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("cannot run /nonexistent/prog"),
        "{e}"
    );
}

#[test]
fn a_private_loopback_works_inside_and_reaches_nothing_outside() {
    let f = fixture_with(SandboxConfig {
        private_loopback: true,
        ..SandboxConfig::default()
    });
    assert!(
        f.sandbox.private_loopback(),
        "namespaces work on the project's machines"
    );
    let (port, accepted) = listener();
    let o = f.run(
        SandboxPolicy::WorkspaceWrite,
        &format!(
            "{PYTHON} -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b'inside'); print(a.recv(10).decode())\"; \
             curl -sS --max-time 5 http://127.0.0.1:{port}/; exec 3<>/dev/tcp/127.0.0.1/{port}"
        ),
    );
    assert!(o.stdout.starts_with("inside\n"), "{o:?}");
    assert!(
        o.stderr.contains("Could not connect") || o.stderr.contains("Failed to connect"),
        "{o:?}"
    );
    assert!(o.stderr.contains("Connection refused"), "{o:?}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the host's loopback was reached"
    );
    // The network policy still means the host's network.
    let o = f.run(
        SandboxPolicy::Network,
        &format!("curl -sS --max-time 5 http://127.0.0.1:{port}/"),
    );
    assert_eq!(o.stdout, "hello", "{o:?}");
}
