//! TLS at the client edge (issue 14, item 8): the orchestrator's one port
//! over TLS with a certificate and key from config (gRPC, gRPC-web and the
//! page still share it), reached through the CLI's own client code and the
//! `omicos` binary with `--ca`; without the CA the client fails and says so.
//! And `omicos health --cert --key` against a part under mutual TLS, as a
//! Kubernetes exec probe runs it.

use omicos_e2e::pki::{Ca, https_get};
use omicos_e2e::{ChatHandle, FakeLlm, Reply, TEST_TOKEN, api_key, events_text};
use omicos_servicekit::{Shutdown, TlsConfig};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_omicos");

/// A runner (plain, on loopback) and an orchestrator serving TLS with a
/// certificate from `ca`; the orchestrator's `https://localhost:<port>`.
async fn start(dir: &std::path::Path, ca: &Ca, llm: &FakeLlm) -> (String, Shutdown) {
    let runner_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runner_url = format!("http://{}", runner_l.local_addr().unwrap());
    let rcfg: omicos_tool_runner::Config =
        serde_json::from_value(serde_json::json!({"workspace": dir})).unwrap();
    let sd = Shutdown::new(Duration::from_millis(500));
    tokio::spawn(omicos_tool_runner::run(rcfg, runner_l, sd.clone(), vec![]));

    let (cert, key) = ca.leaf("orchestrator.example", 1).write(dir, "edge");
    let mut cfg = omicos_orchestrator::config::Config {
        workspace: dir.to_path_buf(),
        tool_runner: runner_url,
        store_url: "memory:".into(),
        tls: TlsConfig {
            cert,
            key,
            ..Default::default()
        },
        ..Default::default()
    };
    cfg.llm.backend = "openai".into();
    cfg.llm.base_url = llm.openai_url();
    cfg.llm.api_key = "test-key".into();
    cfg.llm.model = "fake-model".into();
    cfg.auth
        .api_keys
        .push(api_key(TEST_TOKEN, "tester", "default", "full"));
    let agents = Arc::new(omicos_orchestrator::agents::SingleAgent::from_config(&cfg).unwrap());
    let parts = omicos_orchestrator::Parts {
        backends: omicos_orchestrator::build_backends(&cfg.llm).unwrap(),
        store: omicos_orchestrator::open_store(&cfg).await.unwrap(),
        agents,
        config: cfg,
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://localhost:{}", l.local_addr().unwrap().port());
    tokio::spawn(omicos_orchestrator::serve(parts, l, sd.clone()));
    (url, sd)
}

fn omicos(url: &str, extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["--server", url, "--token", TEST_TOKEN])
        .args(extra)
        .env_remove("OMICOS_CA")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_answers_over_tls_with_ca_and_a_client_without_it_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("edge CA");
    let ca_file = ca.write(d, "ca.crt");
    let llm = FakeLlm::start(vec![Reply::Text("hello over tls".into())]).await;
    let (url, sd) = start(d, &ca, &llm).await;

    // `omicos health --ca`: SERVING once the runner answers (polled, with a deadline).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = omicos(&url, &["--ca", &ca_file, "health"]);
        if out.status.success() {
            assert!(String::from_utf8_lossy(&out.stdout).contains("serving"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never serving over TLS: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A chat through the CLI's client code, verified with the CA.
    let client = omicos_cli::turn::connect_with_ca(&url, TEST_TOKEN, Some(&ca_file))
        .await
        .expect("connects over TLS with the CA");
    let mut chat = ChatHandle::open(
        client,
        omicos_proto::ChatRequest {
            message: "hi".into(),
            permission_mode: "full".into(),
            ..Default::default()
        },
    )
    .await
    .expect("chat over TLS");
    let events = chat.until_done().await;
    assert!(
        events_text(&events).contains("hello over tls"),
        "{events:?}"
    );

    // The page shares the port: HTTP/1.1 over the same TLS listener.
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let page = https_get(([127, 0, 0, 1], port).into(), &ca.pem, "/")
        .await
        .unwrap();
    assert!(
        page.starts_with("HTTP/1.1 200"),
        "{}",
        &page[..page.len().min(200)]
    );

    // Without the CA: the binary fails and says to pass --ca; so does the client code.
    let out = omicos(&url, &["health"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ca"), "{err}");
    let e = match omicos_cli::turn::connect_with_ca(&url, TEST_TOKEN, Some("")).await {
        Ok(_) => panic!("a client without the CA got in"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("not signed by a CA this client trusts"), "{e}");
    // And plain HTTP to the TLS port gets nowhere.
    let plain = url.replace("https://", "http://");
    assert!(!omicos(&plain, &["health"]).status.success());
    sd.trigger();
}

/// `omicos [args]` with no TLS settings from the environment.
fn omicos_bare(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("OMICOS_CA")
        .env_remove("OMICOS_CLIENT_CERT")
        .env_remove("OMICOS_CLIENT_KEY")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_a_part_under_mutual_tls_with_its_certificate_and_says_why_without() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("internal CA");
    let ca_file = ca.write(d, "ca.crt");
    // A runner that requires client certificates from the CA.
    let (cert, key) = ca.part("runner", 1).write(d, "runner");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://localhost:{}", l.local_addr().unwrap().port());
    let cfg: omicos_tool_runner::Config = serde_json::from_value(serde_json::json!({
        "workspace": d,
        "tls": {"cert": cert, "key": key, "ca": ca_file, "client_ca": ca_file},
    }))
    .unwrap();
    let sd = Shutdown::new(Duration::from_millis(500));
    tokio::spawn(omicos_tool_runner::run(cfg, l, sd.clone(), vec![]));

    // The probe a pod runs: its own mounted certificate and key.
    let probe = [
        "--ca", &ca_file, "--cert", &cert, "--key", &key, "health", &url,
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = omicos_bare(&probe);
        if out.status.success() {
            assert!(String::from_utf8_lossy(&out.stdout).contains("serving"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never serving under mTLS with the certificate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Without a client certificate: refused, and the message says to pass
    // one. A few times: the refusal reaches the client either as the TLS
    // alert or as a connection closed under the call, and both must say it.
    for _ in 0..5 {
        let out = omicos_bare(&["--ca", &ca_file, "health", &url]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("asks for a client certificate")
                && err.contains("--cert <file> --key <file>"),
            "{err}"
        );
    }

    // A certificate from another CA: refused, and said so.
    let (other_cert, other_key) = Ca::new("other CA").part("runner", 2).write(d, "other");
    for _ in 0..5 {
        let out = omicos_bare(&[
            "--ca",
            &ca_file,
            "--cert",
            &other_cert,
            "--key",
            &other_key,
            "health",
            &url,
        ]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("refused this client's certificate") && err.contains("tls.client_ca"),
            "{err}"
        );
    }

    // Half a pair is a usage error, before anything is dialled.
    let out = omicos_bare(&["--ca", &ca_file, "--cert", &cert, "health", &url]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--key"),
        "{out:?}"
    );
    // A key that is not the certificate's: refused naming the flag.
    let out = omicos_bare(&[
        "--ca", &ca_file, "--cert", &cert, "--key", &other_key, "health", &url,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--key") && err.contains("does not belong"),
        "{err}"
    );
    sd.trigger();
}
