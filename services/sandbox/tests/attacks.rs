//! The attacker's side of the box: hostile code in a session's box tries to
//! reach omicos's state and secrets, the host, other sessions, and to outlive
//! or outgrow its session. Every attempt is one row of [`ROWS`]; each must
//! fail, show no secret, and change nothing on the host (checked after every
//! row and at the end).
//!
//! It runs as the service would: as root (boxes get a uid of their own) and,
//! re-executed as `nobody`, as an ordinary user (user namespaces). Under
//! `CI=true` a missing prerequisite (root, namespaces, Landlock, cgroups as
//! root) fails the test instead of skipping it.

use omicos_sandbox::{Command, Mode, Placement, Sandbox, SandboxConfig, SandboxPolicy, Stdio};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// What every secret here contains: no output may show it.
const SENTINEL: &str = "S3NTINEL-omicos";

/// One attempt.
struct Row {
    category: &'static str,
    technique: &'static str,
    /// A bash script; `{ws}`, `{other}`, `{sock}`, `{abstract}`, `{port}`,
    /// `{host_pid}` are replaced by what the host prepared.
    script: &'static str,
}

/// Every row must exit non-zero and print no secret. A row whose attack is
/// an effect (a file made, a process kept) is judged by the host checks.
const ROWS: &[Row] = &[
    // omicos's own state: the token, the stores, grants, agent files.
    Row {
        category: "state",
        technique: "read the token",
        script: "cat {ws}/.omicos/token",
    },
    Row {
        category: "state",
        technique: "list the state directory",
        script: "ls -la {ws}/.omicos && test -n \"$(ls -A {ws}/.omicos)\"",
    },
    Row {
        category: "state",
        technique: "plant a grant in the session store",
        script: "echo \"INSERT INTO session_grants VALUES('s','shell');\" >> {ws}/.omicos/sessions.db",
    },
    Row {
        category: "state",
        technique: "write an agent file that allows shell",
        script: "mkdir -p {ws}/.omicos/agents && printf -- '---\\nid: x\\npermissions: {allow: [shell]}\\n---\\n' > {ws}/.omicos/agents/x.md",
    },
    Row {
        category: "state",
        technique: "symlink to the token",
        script: "ln -s {ws}/.omicos/token {ws}/t && cat {ws}/t",
    },
    Row {
        category: "state",
        technique: "hard link to the token",
        script: "ln {ws}/.omicos/token {ws}/h && cat {ws}/h",
    },
    Row {
        category: "state",
        technique: "through /proc/self/root",
        script: "cat /proc/self/root{ws}/.omicos/token",
    },
    Row {
        category: "state",
        technique: "through /proc/1/root",
        script: "cat /proc/1/root{ws}/.omicos/token",
    },
    Row {
        category: "state",
        technique: "through /proc/1/cwd",
        script: "cat /proc/1/cwd/.omicos/token",
    },
    Row {
        category: "state",
        technique: "remount the workspace to see under the hidden dir",
        script: "mkdir -p /tmp/m && mount --bind {ws} /tmp/m && cat /tmp/m/.omicos/token",
    },
    Row {
        category: "state",
        technique: "another tenant's workspace",
        script: "cat {other}/secret.txt || ls {other}",
    },
    // The service's environment and secrets.
    Row {
        category: "secrets",
        technique: "the environment",
        script: "env | grep {sentinel}",
    },
    Row {
        category: "secrets",
        technique: "every process's environ",
        script: "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep {sentinel}",
    },
    Row {
        category: "secrets",
        technique: "the service's environ by host pid",
        script: "tr '\\0' '\\n' < /proc/{host_pid}/environ | grep {sentinel}",
    },
    Row {
        category: "secrets",
        technique: "the service's memory",
        script: "python3 -c \"f=open('/proc/{host_pid}/mem','rb')\"",
    },
    // Host sockets and the network.
    Row {
        category: "sockets",
        technique: "a host unix socket by path",
        script: "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect('{sock}');print(s.recv(100))\"",
    },
    Row {
        category: "sockets",
        technique: "a host abstract unix socket",
        script: "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect('\\0{abstract}');print(s.recv(100))\"",
    },
    Row {
        category: "sockets",
        technique: "a host TCP port on loopback",
        script: "python3 -c \"import socket;s=socket.create_connection(('127.0.0.1',{port}),2);print(s.recv(100))\"",
    },
    Row {
        category: "sockets",
        technique: "netlink sock_diag (lists every socket of the namespace)",
        script: "python3 -c \"import socket;s=socket.socket(socket.AF_NETLINK,socket.SOCK_RAW,4);print(s)\"",
    },
    Row {
        category: "sockets",
        technique: "netlink kobject uevents",
        script: "python3 -c \"import socket;print(socket.socket(socket.AF_NETLINK,socket.SOCK_RAW,15))\"",
    },
    Row {
        category: "sockets",
        technique: "netlink audit",
        script: "python3 -c \"import socket;print(socket.socket(socket.AF_NETLINK,socket.SOCK_RAW,9))\"",
    },
    Row {
        category: "sockets",
        technique: "bash /dev/tcp to the host",
        script: "exec 3<>/dev/tcp/127.0.0.1/{port} && cat <&3",
    },
    // The terminal.
    Row {
        category: "terminal",
        technique: "TIOCSTI on stdin",
        script: "python3 -c \"import fcntl,termios,sys;fcntl.ioctl(0,termios.TIOCSTI,b'x')\"",
    },
    Row {
        category: "terminal",
        technique: "TIOCSTI on a pty of its own",
        script: "python3 -c \"import pty,fcntl,termios;m,s=pty.openpty();fcntl.ioctl(s,termios.TIOCSTI,b'x')\"",
    },
    Row {
        category: "terminal",
        technique: "open the controlling terminal",
        script: "echo x > /dev/tty",
    },
    Row {
        category: "terminal",
        technique: "other terminals under /dev/pts",
        script: "test -e /dev/pts/0 && echo x > /dev/pts/0",
    },
    Row {
        category: "terminal",
        technique: "the host's console",
        script: "echo x > /dev/console",
    },
    // Root's powers where Landlock has no hook.
    Row {
        category: "root",
        technique: "chmod a system file 4777",
        script: "chmod 4777 /usr/bin/env",
    },
    Row {
        category: "root",
        technique: "utime a system file",
        script: "touch -d 2001-01-01 /etc/hostname",
    },
    Row {
        category: "root",
        technique: "setxattr a system file",
        script: "python3 -c \"import os;os.setxattr('/etc/hostname','user.x',b'1')\"",
    },
    Row {
        category: "root",
        technique: "chown a system file",
        script: "chown nobody /etc/hostname",
    },
    Row {
        category: "root",
        technique: "write a system directory",
        script: "touch /usr/omicos-escape || touch /etc/omicos-escape",
    },
    Row {
        category: "root",
        technique: "the kernel keyring",
        script: "python3 -c \"import ctypes,sys;l=ctypes.CDLL(None);r=l.syscall(250,0,-3,0,0,0);sys.exit(0 if r>=0 else 1)\"",
    },
    Row {
        category: "root",
        technique: "a setuid binary (su)",
        script: "su root -c 'id -u' </dev/null && test \"$(su root -c 'id -u' </dev/null)\" = 0",
    },
    Row {
        category: "root",
        technique: "become root in a new user namespace",
        script: "unshare -r id -u",
    },
    Row {
        category: "root",
        technique: "load a kernel module",
        script: "python3 -c \"import ctypes,sys;l=ctypes.CDLL(None);sys.exit(0 if l.syscall(175,0,0,b'')>=0 else 1)\"",
    },
    // Processes: ptrace, signals, other sessions.
    Row {
        category: "processes",
        technique: "ptrace the box's init",
        script: "python3 -c \"import ctypes,sys;l=ctypes.CDLL(None);sys.exit(0 if l.ptrace(16,1,0,0)==0 else 1)\"",
    },
    Row {
        category: "processes",
        technique: "signal a host process",
        script: "kill -9 {sleeper}",
    },
    Row {
        category: "processes",
        technique: "see host processes",
        script: "test -d /proc/{host_pid}",
    },
    Row {
        category: "processes",
        technique: "process_vm_readv on init",
        script: "python3 -c \"import ctypes,sys;l=ctypes.CDLL(None);sys.exit(0 if l.syscall(310,1,0,0,0,0,0)>=0 else 1)\"",
    },
    Row {
        category: "sessions",
        technique: "another session's /tmp",
        script: "cat /tmp/other-session.txt",
    },
    Row {
        category: "sessions",
        technique: "another session's processes",
        script: "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep other-session-marke[r]",
    },
];

/// What the host prepared for the attacks, and what it checks afterwards.
struct Host {
    ws: PathBuf,
    other: PathBuf,
    state: Vec<(PathBuf, Vec<u8>)>,
    sock_dir: tempfile::TempDir,
    abstract_name: String,
    port: u16,
    accepted: Arc<AtomicUsize>,
    sleeper: std::process::Child,
    system: Vec<(PathBuf, u32, i64, u32)>,
}

impl Host {
    fn prepare(root: &Path) -> Self {
        let ws = root.join("ws");
        let other = root.join("other-tenant");
        for d in [ws.join(".omicos/agents"), other.clone()] {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(other.join("secret.txt"), SENTINEL).unwrap();
        let mut state = Vec::new();
        for (f, body) in [
            ("token", format!("{SENTINEL}-token")),
            ("sessions.db", format!("{SENTINEL}-store")),
        ] {
            let p = ws.join(".omicos").join(f);
            std::fs::write(&p, &body).unwrap();
            state.push((p, body.into_bytes()));
        }
        // Sockets on the host, each counting the connections it accepts.
        let accepted = Arc::new(AtomicUsize::new(0));
        let sock_dir = tempfile::tempdir().unwrap();
        let serve = |l: std::os::unix::net::UnixListener, n: Arc<AtomicUsize>| {
            std::thread::spawn(move || {
                for mut c in l.incoming().flatten() {
                    n.fetch_add(1, Ordering::SeqCst);
                    let _ = c.write_all(SENTINEL.as_bytes());
                }
            });
        };
        serve(
            std::os::unix::net::UnixListener::bind(sock_dir.path().join("host.sock")).unwrap(),
            accepted.clone(),
        );
        let abstract_name = format!("omicos-attack-{}", std::process::id());
        {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
                .unwrap();
            serve(
                std::os::unix::net::UnixListener::bind_addr(&addr).unwrap(),
                accepted.clone(),
            );
        }
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let n = accepted.clone();
        std::thread::spawn(move || {
            for mut c in tcp.incoming().flatten() {
                n.fetch_add(1, Ordering::SeqCst);
                let _ = c.write_all(SENTINEL.as_bytes());
            }
        });
        let sleeper = std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let system = ["/usr/bin/env", "/etc/hostname"]
            .iter()
            .map(|p| {
                let m = std::fs::metadata(p).unwrap();
                (PathBuf::from(p), m.mode(), m.mtime(), m.uid())
            })
            .collect();
        Self {
            ws,
            other,
            state,
            sock_dir,
            abstract_name,
            port,
            accepted,
            sleeper,
            system,
        }
    }

    fn script(&self, s: &str) -> String {
        s.replace("{ws}", &self.ws.display().to_string())
            .replace("{other}", &self.other.display().to_string())
            .replace(
                "{sock}",
                &self.sock_dir.path().join("host.sock").display().to_string(),
            )
            .replace("{abstract}", &self.abstract_name)
            .replace("{port}", &self.port.to_string())
            .replace("{host_pid}", &std::process::id().to_string())
            .replace("{sleeper}", &self.sleeper.id().to_string())
            .replace("{sentinel}", SENTINEL)
    }

    /// Nothing the attacks aimed at changed.
    fn unchanged(&mut self, after: &str) {
        for (p, body) in &self.state {
            assert_eq!(
                &std::fs::read(p).unwrap(),
                body,
                "after {after}: {} changed",
                p.display()
            );
        }
        let agents: Vec<_> = std::fs::read_dir(self.ws.join(".omicos/agents"))
            .unwrap()
            .collect();
        assert!(
            agents.is_empty(),
            "after {after}: an agent file was planted"
        );
        for (p, mode, mtime, uid) in &self.system {
            let m = std::fs::metadata(p).unwrap();
            assert_eq!(
                (m.mode(), m.mtime(), m.uid()),
                (*mode, *mtime, *uid),
                "after {after}: {} changed",
                p.display()
            );
            assert!(
                xattr_names(p).iter().all(|n| n != "user.x"),
                "after {after}: an xattr was set on {}",
                p.display()
            );
        }
        for p in ["/usr/omicos-escape", "/etc/omicos-escape", "/tmp/m"] {
            assert!(
                !Path::new(p).exists(),
                "after {after}: {p} was made on the host"
            );
        }
        assert_eq!(
            self.accepted.load(Ordering::SeqCst),
            0,
            "after {after}: a host socket accepted a connection from the box"
        );
        assert!(
            self.sleeper.try_wait().unwrap().is_none(),
            "after {after}: a host process was killed"
        );
        assert_eq!(
            std::fs::read_to_string(self.other.join("secret.txt")).unwrap(),
            SENTINEL
        );
    }
}

fn xattr_names(p: &Path) -> Vec<String> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: listxattr(2) into a buffer of the given size.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `script` in `place`'s box: (exit code, stdout + stderr).
async fn run(sb: &Sandbox, place: &Placement, script: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script])
        .stdout(Stdio::Piped)
        .stderr(Stdio::Piped);
    let mut p = sb.spawn(place, cmd).await.expect("spawn in the box");
    let (mut out, mut err) = (String::new(), String::new());
    let (mut o, mut e) = (p.stdout.take().unwrap(), p.stderr.take().unwrap());
    let read = async {
        let _ = tokio::join!(o.read_to_string(&mut out), e.read_to_string(&mut err));
    };
    if tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .is_err()
    {
        p.end().await;
        panic!("`{script}` did not finish within 30 s");
    }
    let st = p.wait().await.unwrap();
    p.end().await;
    (st.code(), format!("{out}{err}"))
}

fn config() -> SandboxConfig {
    let mut c = SandboxConfig::default();
    c.session_limits.memory_bytes = Some(256 << 20);
    c.session_limits.processes = Some(128);
    c.session_limits.workspace_bytes = Some(64 << 20);
    c
}

/// The whole table, with the bounds and the session's end; `who` names the
/// service's user in messages.
async fn attack_table(who: &str) {
    let sb = Sandbox::new(config()).unwrap();
    let report = sb.report();
    eprintln!("{who}: {:#?}", report.lines);
    if report.mode == Mode::NoNamespaces {
        assert!(
            !ci(),
            "{who}: no namespaces under CI=true: {:?}",
            report.lines
        );
        eprintln!("SKIPPED ({who}): no namespaces here");
        return;
    }
    if is_root() && ci() {
        assert!(
            report.cgroups.is_ok(),
            "root under CI=true without box cgroups: {:?}",
            report.cgroups
        );
        assert_eq!(report.mode, Mode::Privileged, "{:?}", report.lines);
    }
    assert!(
        matches!(sb.landlock(), omicos_sandbox::LandlockSupport::Available(_)) || !ci(),
        "{who}: no Landlock under CI=true"
    );
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    let mut host = Host::prepare(&root_path);
    // SAFETY: set before any box starts; nextest runs each test in its own process.
    unsafe { std::env::set_var("OMICOS_SERVICE_SECRET", format!("{SENTINEL}-env")) };
    let place = Placement::new("acme", "attacker", &host.ws, SandboxPolicy::WorkspaceWrite);
    // Another session of the same tenant, with a file in its /tmp and a process.
    let other = Placement::new("acme", "victim", &host.ws, SandboxPolicy::WorkspaceWrite);
    let mut victim = Command::new("bash");
    victim.args([
        "-c",
        "echo victim > /tmp/other-session.txt && exec -a other-session-marker sleep 600",
    ]);
    let mut victim = sb.spawn(&other, victim).await.unwrap();
    let (code, out) = run(&sb, &other, "for i in $(seq 100); do test -s /tmp/other-session.txt && exit 0; sleep 0.05; done; exit 1").await;
    assert_eq!(code, Some(0), "the victim session's file: {out}");
    // The box works at all: the workspace is writable, the uid is not the service's.
    let (code, out) = run(
        &sb,
        &place,
        "echo ok > {ws}/made && id -u"
            .replace("{ws}", &host.ws.display().to_string())
            .as_str(),
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        std::fs::read_to_string(host.ws.join("made")).unwrap(),
        "ok\n"
    );
    if is_root() {
        assert_ne!(out.trim(), "0", "a box runs as root");
    }
    let mut failures = Vec::new();
    for row in ROWS {
        let script = host.script(row.script);
        let (code, out) = run(&sb, &place, &script).await;
        let what = format!("[{}] {}", row.category, row.technique);
        if code == Some(0) {
            failures.push(format!("{what}: succeeded: {out}"));
        }
        if out.contains(SENTINEL) {
            failures.push(format!("{what}: showed a secret: {out}"));
        }
        host.unchanged(&what);
        eprintln!("{who}: held: {what}");
    }
    assert!(
        failures.is_empty(),
        "{who}: attacks that worked:\n{}",
        failures.join("\n")
    );

    bounds(&sb, &place, &host).await;

    // Nothing outlives the session: a double-forked, setsid'd heartbeat, left
    // by a process that lives on (as a kernel does), stops when it ends.
    let mut lives_on = Command::new("bash");
    lives_on.args([
        "-c",
        &host.script("(setsid nohup sh -c 'while :; do date +%s%N > {ws}/beat; sleep 0.05; done' >/dev/null 2>&1 &) ; exec sleep 600"),
    ]);
    let mut lives_on = sb.spawn(&place, lives_on).await.unwrap();
    let beat = host.ws.join("beat");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !beat.exists() {
        assert!(Instant::now() < deadline, "the heartbeat never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sb.end_session("acme", "attacker") > 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = std::fs::read_to_string(&beat).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        std::fs::read_to_string(&beat).unwrap(),
        before,
        "a process outlived its session"
    );
    let _ = tokio::time::timeout(Duration::from_secs(10), lives_on.wait())
        .await
        .expect("the session's process ended with it");
    sb.end_session("acme", "victim");
    let _ = tokio::time::timeout(Duration::from_secs(10), victim.wait())
        .await
        .expect("the victim's process ended with its session");
    host.unchanged("the end of the sessions");
    host.sleeper.kill().unwrap();
}

/// Memory, processes and disk: passing a bound is a clear error, and the
/// session's box serves the next call.
async fn bounds(sb: &Sandbox, place: &Placement, host: &Host) {
    let cgroups = sb.report().cgroups.is_ok();
    // Memory: 600 MiB touched against a 256 MiB bound.
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "a = bytearray(600 << 20)\nfor i in range(0, len(a), 4096): a[i] = 1\nprint('survived')",
    ])
    .stdout(Stdio::Piped)
    .stderr(Stdio::Piped);
    let mut p = sb.spawn(place, cmd).await.unwrap();
    let mut out = String::new();
    p.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let st = p.wait().await.unwrap();
    if cgroups {
        assert!(
            !st.success() && !out.contains("survived"),
            "600 MiB in a 256 MiB box: {st:?} {out}"
        );
        assert_eq!(
            p.hit_memory_bound(),
            Some(256 << 20),
            "the OOM kill is named"
        );
    }
    p.end().await;
    // Processes: a fork bomb is held, and the box still works after.
    let (_, out) = run(
        sb,
        place,
        "python3 -c \"\nimport os,time\nn=0\ntry:\n  while n<400:\n    if os.fork()==0:\n      os.closerange(0, 3); time.sleep(30); os._exit(0)\n    n+=1\nexcept OSError as e:\n  print('held at', n, e)\n\"",
    )
    .await;
    if cgroups {
        let held: usize = out
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the fork bomb was not held: {out}"));
        assert!(
            held <= 128,
            "{held} processes in a box bounded at 128: {out}"
        );
    }
    let (code, out2) = run(sb, place, "echo fine").await;
    assert_eq!(
        code,
        Some(0),
        "the box serves after the fork bomb ({out}): {out2}"
    );
    // Disk: 1 MiB files written in a loop against a 64 MiB workspace bound.
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        &host.script("for i in $(seq 400); do head -c 1048576 /dev/zero > {ws}/fill$i || exit 2; sleep 0.02; done; echo filled"),
    ])
    .stdout(Stdio::Piped);
    let mut p = sb.spawn(place, cmd).await.unwrap();
    let mut out = String::new();
    p.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let st = p.wait().await.unwrap();
    assert!(
        !st.success() && !out.contains("filled"),
        "400 MiB in a 64 MiB workspace: {st:?}"
    );
    let note = p.hit_disk_bound().expect("the disk bound is named");
    assert!(note.contains("workspace_bytes"), "{note}");
    p.end().await;
    let written = std::fs::read_dir(&host.ws)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fill"))
        .count();
    assert!(
        (32..400).contains(&written),
        "{written} MiB written before the stop"
    );
    // Over the bound, a call that deletes runs; the session goes on.
    let (code, out) = run(sb, place, &host.script("rm -f {ws}/fill* && echo cleaned")).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("cleaned"));
    // Nothing else of the session was lost.
    assert_eq!(
        std::fs::read_to_string(host.ws.join("made")).unwrap(),
        "ok\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_from_inside_the_box_fail_and_change_nothing() {
    if std::env::var_os("OMICOS_ATTACK_AS_USER").is_some() {
        // The re-executed copy, as nobody (below).
        attack_table("an ordinary user").await;
        return;
    }
    if !is_root() {
        assert!(!ci(), "the attack table runs as root under CI=true");
        eprintln!("SKIPPED: not root; the table runs as this user only");
        attack_table("this user").await;
        return;
    }
    attack_table("root").await;
}

/// The same table with the service running as an ordinary user: this test
/// binary re-executed as `nobody`, where boxes come from user namespaces.
#[test]
fn attacks_fail_as_an_ordinary_user_too() {
    if !is_root() {
        assert!(!ci(), "re-executing as nobody needs root");
        eprintln!("SKIPPED: not root, cannot become nobody");
        return;
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(&exe)
        .args([
            "attacks_from_inside_the_box_fail_and_change_nothing",
            "--exact",
            "--nocapture",
        ])
        .env("OMICOS_ATTACK_AS_USER", "1")
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .env_remove("XDG_RUNTIME_DIR")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "as nobody:\n{text}");
    assert!(
        text.contains("1 passed") && !text.contains("0 passed"),
        "the table did not run as nobody:\n{text}"
    );
    let _ = std::io::stdout().write_all(text.as_bytes());
}
