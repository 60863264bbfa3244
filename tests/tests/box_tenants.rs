//! The box through the whole path (issue 38): the model asks for a shell
//! command, Chat carries it to the runner, and the runner runs it in the
//! session's box. Four principals attack from there, as a model that read a
//! hostile page would: dora in the default tenant (whose workspace holds
//! omicos's own state), alice and bob in `acme`, mallory in `evil`.
//!
//! Every attack is judged from the host, never by what the box prints
//! alone: the store's grants, the files on disk, a host socket's accept
//! count, a host process that must live or die.

use omicos_e2e::stack::{ChatHandle, client_with, finished_calls};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_proto::{ChatRequest, DeleteSessionRequest};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const DORA: &str = "dora-key-0123456789abcdef";
const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abcdef";

/// The parts' service secret, also in the service's environment and in
/// omicos's state: never in what a box sees.
const SECRET: &str = "S3NTINEL-omicos-service-secret-7f3a";

/// The model: a user message `RUN <cmd>` becomes one shell call, `READ
/// <path>` one file read; after the result it says "done".
fn model() -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let n = AtomicUsize::new(0);
    move |body: &Value| {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        let text = match &last["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<String>(),
            _ => String::new(),
        };
        if last["role"] != "user" {
            return Reply::Text("done".into());
        }
        let id = format!("call_{}", n.fetch_add(1, Ordering::SeqCst));
        if let Some(cmd) = text.strip_prefix("RUN ") {
            let args = json!({"command": cmd, "timeout_secs": 30}).to_string();
            Reply::Tools(String::new(), vec![(id, "shell".into(), args)])
        } else if let Some(path) = text.strip_prefix("READ ") {
            let args = json!({"path": path}).to_string();
            Reply::Tools(String::new(), vec![(id, "file_manager__read".into(), args)])
        } else {
            Reply::Text("done".into())
        }
    }
}

/// One user message as `token` in `session` (empty: a new one); answers
/// the session id and the tool's result as the model saw it.
async fn ask(url: &str, token: &str, session: &str, message: String) -> (String, String) {
    let mut h = ChatHandle::open(
        client_with(url, token).await,
        ChatRequest {
            session_id: session.into(),
            message,
            permission_mode: "full".into(),
            ..Default::default()
        },
    )
    .await
    .expect("chat");
    let events = h.until_done().await;
    let sid = events[0].session_id.clone();
    let calls = finished_calls(&events);
    assert_eq!(calls.len(), 1, "one tool call per message: {events:?}");
    (sid, calls[0].result.clone())
}

/// A shell result's stdout then stderr (the raw text when it is no JSON:
/// a refusal).
fn output(result: &str) -> String {
    match serde_json::from_str::<Value>(result) {
        Ok(v) if v.get("stdout").is_some() => format!(
            "{}{}",
            v["stdout"].as_str().unwrap_or_default(),
            v["stderr"].as_str().unwrap_or_default()
        ),
        _ => result.to_owned(),
    }
}

async fn run(url: &str, token: &str, session: &str, cmd: &str) -> String {
    output(&ask(url, token, session, format!("RUN {cmd}")).await.1)
}

/// A new session running `cmd`: (session id, output).
async fn first(url: &str, token: &str, cmd: &str) -> (String, String) {
    let (sid, out) = ask(url, token, "", format!("RUN {cmd}")).await;
    (sid, output(&out))
}

/// Host pids whose command line holds `marker`.
fn host_pids(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

/// Whether `pid` is a live (not zombie) host process.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Whether the heartbeat file at `path` changes within 400 ms.
async fn beats(path: &Path) -> bool {
    let t0 = std::fs::read_to_string(path).unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(400)).await;
    std::fs::read_to_string(path).unwrap_or_default() != t0
}

/// A unix socket on the host that counts who connects.
fn host_unix_socket(path: &Path) -> Arc<AtomicUsize> {
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            if s.is_ok() {
                c.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    n
}

/// A TCP listener on the host's loopback that counts who connects.
fn host_tcp() -> (u16, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            if s.is_ok() {
                c.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, n)
}

fn connect_unix(path: &Path) -> String {
    format!(
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect('{}'); print('CONNECTED')\" 2>&1",
        path.display()
    )
}

#[test]
fn agents_attack_from_their_boxes_through_chat_and_nothing_gives() {
    // SAFETY: no other thread exists yet (the runtime starts below).
    unsafe {
        std::env::set_var("OMICOS_SERVICE_SECRET", SECRET);
        std::env::set_var("OPENAI_API_KEY", SECRET);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(attacks());
}

async fn attacks() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().to_path_buf();
    let state = ws.join(".omicos");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("token"), SECRET).unwrap();
    let db = state.join("sessions.db");
    let llm = FakeLlm::start(vec![]).await.with_responder(model());
    let stack = Stack::start(
        llm,
        StackOptions {
            workspace: Some(ws.clone()),
            store_url: format!("sqlite://{}", db.display()),
            // The parts trust each other by the secret, as `omicos up` and
            // deploy/ configure them: the runner takes the tenant only from
            // an authenticated orchestrator.
            runner_overrides: json!({"service_secret": SECRET}),
            tweak: Some(Box::new(|c| {
                c.service_secret = SECRET.into();
                c.auth.api_keys = vec![
                    api_key(DORA, "dora", "default", "full"),
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    let store = omicos_sessionstore::open(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();

    // ── dora, in the workspace that holds omicos's state ──
    let (dora, out) = first(&url, DORA, "id -u; echo ok").await;
    assert!(out.contains("ok"), "the shell runs in its box: {out}");
    assert_ne!(
        out.lines().next().unwrap_or_default().trim(),
        "0",
        "root in the box"
    );
    // The token and the stores: not there to read.
    let out = run(
        &url,
        DORA,
        &dora,
        "cat .omicos/token; head -c 64 .omicos/sessions.db | od -c | head -2; ls -la .omicos",
    )
    .await;
    assert!(!out.contains(SECRET) && !out.contains("S   Q   L"), "{out}");
    // A grant planted in the store, an agent file that allows the shell:
    // neither reaches the host.
    let grant = format!(
        "python3 -c \"import sqlite3; c=sqlite3.connect('.omicos/sessions.db'); c.execute('CREATE TABLE IF NOT EXISTS session_grants (session_id TEXT, tool TEXT)'); c.execute(\\\"INSERT INTO session_grants VALUES ('{dora}', 'shell')\\\"); c.commit(); print('planted')\" 2>&1; \
         mkdir -p .omicos/agents && printf -- '---\\nname: pwn\\npermissions: {{allow: [shell]}}\\n---\\nx\\n' > .omicos/agents/pwn.md; echo '{{}}' > .omicos/token.new; ls .omicos"
    );
    let _ = run(&url, DORA, &dora, &grant).await;
    assert!(
        store.grants(&dora).await.unwrap().is_empty(),
        "a grant reached the store"
    );
    assert!(
        !state.join("agents/pwn.md").exists(),
        "an agent file reached the host"
    );
    assert!(!state.join("token.new").exists());
    assert_eq!(
        std::fs::read_to_string(state.join("token")).unwrap(),
        SECRET
    );
    // The file tools read none of it either.
    let (_, out) = ask(&url, DORA, &dora, "READ .omicos/token".into()).await;
    assert!(
        !out.contains(SECRET) && out.contains("no tool reads it"),
        "{out}"
    );

    // The service's environment: nowhere in the box, not in /proc either.
    let out = run(
        &url,
        DORA,
        &dora,
        "env; for f in /proc/*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; echo end",
    )
    .await;
    assert!(out.contains("end") && !out.contains(SECRET), "{out}");
    assert!(!out.contains("OMICOS_SERVICE_SECRET"), "{out}");

    // Host sockets: a unix socket in the host's /tmp, PostgreSQL's, a TCP
    // listener on the host's loopback, the runner's own port.
    let sock = std::env::temp_dir().join(format!("omicos-box-host-{}.sock", std::process::id()));
    let unix_hits = host_unix_socket(&sock);
    let (port, tcp_hits) = host_tcp();
    let runner_port = stack.runner.rsplit(':').next().unwrap().to_owned();
    let cmd = format!(
        "{}; {}; ls /run /var/run/postgresql 2>&1; \
         python3 -c \"import socket\nfor p in ({port}, {runner_port}):\n  s=socket.socket(); s.settimeout(3)\n  try:\n    s.connect(('127.0.0.1', p)); print('TCP-CONNECTED', p)\n  except Exception as e:\n    print('refused', p, e)\" 2>&1",
        connect_unix(&sock),
        connect_unix(Path::new("/var/run/postgresql/.s.PGSQL.5432")),
    );
    let out = run(&url, DORA, &dora, &cmd).await;
    assert!(!out.contains("CONNECTED"), "a host socket answered: {out}");
    assert!(out.contains("refused"), "the attempt ran: {out}");
    assert_eq!(
        unix_hits.load(Ordering::SeqCst),
        0,
        "the host unix socket was reached"
    );
    assert_eq!(
        tcp_hits.load(Ordering::SeqCst),
        0,
        "the host's loopback was reached"
    );
    // The control: the same socket from the host counts.
    std::os::unix::net::UnixStream::connect(&sock).unwrap();
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(unix_hits.load(Ordering::SeqCst), 1);
    assert_eq!(tcp_hits.load(Ordering::SeqCst), 1);
    let _ = std::fs::remove_file(&sock);

    // ── tenants: alice's files are not mallory's ──
    let (alice, out) = first(&url, ALICE, "echo alice-private > notes.txt; pwd; id -u").await;
    let acme = ws.join(".omicos/tenants/acme");
    assert_eq!(
        std::fs::read_to_string(acme.join("notes.txt"))
            .unwrap_or_default()
            .trim(),
        "alice-private",
        "{out}"
    );
    let alice_uid = out.lines().last().unwrap_or_default().trim().to_owned();
    let (mallory, out) = first(
        &url,
        MALLORY,
        &format!(
            "cat {0}/notes.txt {1}/.omicos/tenants/acme/notes.txt ../acme/notes.txt ../../notes.txt 2>&1; ls {1} {1}/.omicos/tenants 2>&1; id -u",
            acme.display(),
            ws.display()
        ),
    )
    .await;
    assert!(
        !out.contains("alice-private"),
        "mallory read alice's tenant: {out}"
    );
    let mallory_uid = out.lines().last().unwrap_or_default().trim().to_owned();
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(alice_uid, mallory_uid, "two sessions share a uid");
        assert_ne!(alice_uid, "0");
    }
    // The other tenant's state is out of its view: a grant for alice's
    // session planted by mallory reaches no store.
    let _ = run(
        &url,
        MALLORY,
        &mallory,
        &format!(
            "for d in {0} {0}/.omicos ../.. ../../..; do python3 -c \"import sqlite3; c=sqlite3.connect('$d/sessions.db'); c.execute(\\\"INSERT INTO session_grants VALUES ('{alice}', 'shell')\\\"); c.commit()\" 2>/dev/null; done; echo tried",
            state.display()
        ),
    )
    .await;
    assert!(store.grants(&alice).await.unwrap().is_empty());

    // ── bob, same tenant: alice's session's files and processes are hers ──
    let outputs = acme.join(".omicos/outputs").join(&alice);
    std::fs::create_dir_all(&outputs).unwrap();
    std::fs::write(outputs.join("secret.txt"), SECRET).unwrap();
    let spool = acme.join(".omicos/tool_outputs").join(&alice);
    std::fs::create_dir_all(&spool).unwrap();
    std::fs::write(spool.join("1__call_0.txt"), SECRET).unwrap();
    // alice's call leaves a double-forked, setsid'd heartbeat behind and
    // stays a while; bob attacks it meanwhile.
    let marker = "beat-7331";
    let beat = acme.join(marker);
    let task = {
        let (url, alice) = (url.clone(), alice.clone());
        tokio::spawn(async move {
            run(
                &url,
                ALICE,
                &alice,
                &format!(
                    "(setsid nohup sh -c 'while :; do date +%s%N > {marker}; sleep 0.05; done' >/dev/null 2>&1 &) ; sleep 8; echo alice-slept"
                ),
            )
            .await
        })
    };
    // The heartbeat's own shell: in two looks 200 ms apart (a fork of it,
    // or of alice's call, on its way to exec `date` or `sleep` still shows
    // the marker for a moment, and is gone by the next look), and not
    // alice's call itself (it ends after its own `sleep 8`).
    let heartbeat = || {
        host_pids(marker)
            .into_iter()
            .filter(|pid| {
                !std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("alice-slept"))
                    .unwrap_or(true)
            })
            .collect::<Vec<_>>()
    };
    let mut sleepers = vec![];
    for _ in 0..100 {
        let before = heartbeat();
        tokio::time::sleep(Duration::from_millis(200)).await;
        sleepers = heartbeat();
        sleepers.retain(|p| before.contains(p));
        if !sleepers.is_empty() && beat.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!sleepers.is_empty(), "alice's background process runs");
    let pids: Vec<String> = sleepers.iter().map(|p| p.to_string()).collect();
    let (bob, out) = first(
        &url,
        BOB,
        &format!(
            "cat .omicos/outputs/{alice}/secret.txt .omicos/tool_outputs/{alice}/1__call_0.txt 2>&1; ps -eo pid,args 2>&1; ls /proc; pkill -9 -f beat-$((7330+1)); pkill -9 sleep; for p in {}; do kill -9 $p; done 2>&1; echo bob-done",
            pids.join(" ")
        ),
    )
    .await;
    assert!(out.contains("bob-done"), "{out}");
    assert!(
        !out.contains(SECRET),
        "bob read alice's session files: {out}"
    );
    assert!(!out.contains(marker), "bob saw alice's processes: {out}");
    let (_, out) = ask(
        &url,
        BOB,
        &bob,
        format!("READ .omicos/tool_outputs/{alice}/1__call_0.txt"),
    )
    .await;
    assert!(
        !out.contains(SECRET) && out.contains("no tool reads it"),
        "{out}"
    );
    for p in &sleepers {
        assert!(alive(*p), "bob's kill reached alice's process {p}");
    }
    assert!(
        beats(&beat).await,
        "alice's heartbeat stopped while bob attacked"
    );
    // Nothing outlives the call that started it.
    let out = task.await.unwrap();
    assert!(out.contains("alice-slept"), "{out}");
    let mut left = sleepers.clone();
    for _ in 0..100 {
        left.retain(|p| alive(*p));
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "alice's heartbeat outlived its call: {left:?}"
    );
    assert!(
        !beats(&beat).await,
        "alice's heartbeat beats after her call"
    );
    // alice reads her own spool.
    let (_, out) = ask(
        &url,
        ALICE,
        &alice,
        format!("READ .omicos/tool_outputs/{alice}/1__call_0.txt"),
    )
    .await;
    assert!(out.contains(SECRET), "{out}");

    // ── the session's end: its files are the owner's to delete ──
    client_with(&url, ALICE)
        .await
        .delete_session(DeleteSessionRequest {
            session_id: alice.clone(),
        })
        .await
        .unwrap();
    assert!(store.get_session(&alice).await.unwrap().is_none());
}
