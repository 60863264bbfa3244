//! Kernels run confined (workspace-write by default): a cell cannot write
//! outside the workspace or open a network socket, gets a clear Python error,
//! and the kernel lives on with its state.

mod common;

use common::*;
use omicos_kernel::KernelConfig;
use omicos_sandbox::SandboxPolicy;

#[tokio::test]
async fn a_cell_writing_etc_gets_a_permission_error_and_the_kernel_lives_on() {
    let (ws, p) = provider(config(0));
    let r = run(&p, &ws, "s1", "x = 41").await.unwrap();
    assert!(r["error"].is_null(), "{r}");

    let r = run(&p, &ws, "s1", "open('/etc/x', 'w')").await.unwrap();
    let err = r.to_string();
    // /etc is a read-only mount in the box (Landlock would refuse it too).
    assert!(err.contains("Read-only file system: '/etc/x'"), "{r}");
    assert!(!std::path::Path::new("/etc/x").exists());

    // Same kernel, same state.
    let r = run(&p, &ws, "s1", "x + 1").await.unwrap();
    assert_eq!(value(&r), "42", "{r}");

    // The workspace is writable, the service's home is not in the view, and
    // the network is the kernel's private loopback: a listener of the host
    // is not reached.
    let secret = std::path::PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()))
        .join(format!(".omicos-test-secret-{}", std::process::id()));
    std::fs::write(&secret, "s3cret").unwrap();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let code = format!(
        "open('made-by-kernel.txt', 'w').write('ok')\nimport socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    net = 'open'\nexcept OSError as e:\n    net = type(e).__name__\nimport os\ntry:\n    open({secret:?}).read()\n    home = 'readable'\nexcept OSError as e:\n    home = type(e).__name__\n(net, home)"
    );
    let r = run(&p, &ws, "s1", &code).await.unwrap();
    let _ = std::fs::remove_file(&secret);
    assert_eq!(
        value(&r),
        "('ConnectionRefusedError', 'FileNotFoundError')",
        "{r}"
    );
    assert!(
        host.accept().is_err(),
        "the kernel reached the host's loopback"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("made-by-kernel.txt")).unwrap(),
        "ok"
    );
    p.close().await;
}

#[tokio::test]
async fn read_only_kernels_and_danger_full_access_follow_the_config() {
    let mut cfg: KernelConfig = config(0);
    cfg.sandbox.policy = SandboxPolicy::ReadOnly;
    let (ws, p) = provider(cfg);
    std::fs::write(ws.path().join("in.txt"), "data").unwrap();
    let r = run(
        &p,
        &ws,
        "s1",
        "import tempfile\nt = tempfile.NamedTemporaryFile(delete=False); t.write(b'x'); t.close()\ntry:\n    open('out.txt', 'w')\n    w = 'written'\nexcept OSError:\n    w = 'denied'\n(open('in.txt').read(), w)",
    )
    .await
    .unwrap();
    assert_eq!(value(&r), "('data', 'denied')", "{r}");
    assert!(!ws.path().join("out.txt").exists());
    p.close().await;

    let mut cfg: KernelConfig = config(0);
    cfg.sandbox.policy = SandboxPolicy::DangerFullAccess;
    let (ws, p) = provider(cfg);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("free");
    let r = run(
        &p,
        &ws,
        "s1",
        &format!("open({:?}, 'w').write('x')", target.display().to_string()),
    )
    .await
    .unwrap();
    assert!(r["error"].is_null(), "{r}");
    assert!(target.exists());
    p.close().await;
}

#[test]
fn agent_policies_are_refused_for_kernels() {
    let mut cfg = KernelConfig::default();
    cfg.sandbox
        .agent_policies
        .insert("a".into(), SandboxPolicy::Network);
    let e = cfg.validate().unwrap_err();
    assert!(
        e.to_string().contains("kernel.sandbox.agent_policies"),
        "{e}"
    );
}

/// A package index on the host's loopback that counts the requests it gets
/// and answers each with 404 (no such package).
fn counting_index() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    (port, hits)
}

#[tokio::test]
async fn kernel_install_gets_the_network_for_the_install_only() {
    use std::sync::atomic::Ordering;
    // The index is on the host's loopback: a mirror the operator allowed.
    let (ws, p) = provider(KernelConfig {
        install_index_allow: vec!["127.0.0.1".into()],
        ..config(0)
    });
    let (port, hits) = counting_index();
    let probe = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    net = 'open'\nexcept OSError as e:\n    net = type(e).__name__\nnet"
    );
    // Before: a cell of the session's kernel does not reach the host's index.
    let r = run(&p, &ws, "s1", &probe).await.unwrap();
    assert_ne!(value(&r), "'open'", "{r}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // The install does: pip asks the index (and gets 404, a clear failure).
    let (c, _) = ctx(&ws, "s1");
    let err = call(
        &p,
        "kernel_install",
        serde_json::json!({
            "packages": ["omicos-no-such-package"],
            "index_url": format!("http://127.0.0.1:{port}/simple"),
        }),
        c,
    )
    .await
    .expect_err("no such package");
    assert!(err.to_string().contains("pip install failed"), "{err}");
    let asked = hits.load(Ordering::SeqCst);
    assert!(asked > 0, "pip never reached the index: {err}");

    // After: the kernel is still confined, and lives on.
    let r = run(&p, &ws, "s1", &probe).await.unwrap();
    assert_ne!(value(&r), "'open'", "{r}");
    assert_eq!(hits.load(Ordering::SeqCst), asked);
    let r = run(&p, &ws, "s1", "1 + 1").await.unwrap();
    assert_eq!(value(&r), "2", "{r}");
    p.close().await;
}
