//! Trust between the parts over TLS (issue 14, item 6): mutual TLS with
//! certificates and CAs from files, taken again when they rotate, and each
//! part's role read from its certificate (`spiffe://omicos/<role>`). Real
//! runners and providers on 127.0.0.1, certificates made in the test.

use async_trait::async_trait;
use omicos_auth::{Credentials, ServiceRole};
use omicos_e2e::pki::{Ca, Leaf, replace, serial_of, served_cert, subject_of};
use omicos_proto::{
    CallToolRequest, ExecuteClientMessage, ExecuteStart, ListToolsRequest, execute_client_message,
    execute_server_message, tool_provider_client::ToolProviderClient,
    tool_runner_client::ToolRunnerClient,
};
use omicos_servicekit::{ClientTls, Shutdown, TlsConfig};
use omicos_toolkit::{
    CallCtx, Provider, ProviderHosting, ToolError, ToolSpec, serve_provider_over, tool,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// How long anything here may take to happen.
const DEADLINE: Duration = Duration::from_secs(20);

/// A provider with one tool that echoes its argument.
struct Echo;

#[async_trait]
impl Provider for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![tool("echo_say", "says it back", json!({"type": "object"})).build()]
    }
    async fn call(&self, _tool: &str, args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        Ok(json!(format!(
            "echo: {}",
            args["text"].as_str().unwrap_or_default()
        )))
    }
}

fn tls(dir: &Path, leaf: &Leaf, stem: &str, ca: &str, client_ca: &str) -> TlsConfig {
    let (cert, key) = leaf.write(dir, stem);
    TlsConfig {
        cert,
        key,
        ca: ca.to_owned(),
        client_ca: client_ca.to_owned(),
        ..Default::default()
    }
}

/// A client trusting `ca`, presenting `leaf` when given.
fn client(dir: &Path, ca: &str, leaf: Option<(&Leaf, &str)>) -> ClientTls {
    let mut cfg = TlsConfig {
        ca: ca.to_owned(),
        ..Default::default()
    };
    if let Some((l, stem)) = leaf {
        (cfg.cert, cfg.key) = l.write(dir, stem);
    }
    cfg.client("test").unwrap().expect("a client config")
}

/// A lazily connected channel to `url` over `tls` (a new connection each time).
fn channel(tls: &ClientTls, url: &str) -> Channel {
    Channel::new(
        tls.connector(),
        Endpoint::from_shared(url.to_owned()).unwrap(),
    )
}

async fn health(ch: Channel) -> Result<(), tonic::Status> {
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        h.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("no answer"))??;
    assert_eq!(
        r.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    Ok(())
}

/// Refused at the connection (the TLS handshake), not by a gRPC answer.
fn assert_refused_at_handshake(r: Result<(), tonic::Status>, who: &str) {
    let e = r.expect_err(who);
    assert!(
        matches!(e.code(), Code::Unavailable | Code::Unknown | Code::Internal),
        "{who}: refused by the handshake, not by a gRPC answer: {e:?}"
    );
}

async fn start_runner(workspace: &Path, tls: TlsConfig) -> (SocketAddr, Shutdown) {
    start_runner_with(workspace, tls, vec![]).await
}

/// A runner with `providers` in process.
async fn start_runner_with(
    workspace: &Path,
    tls: TlsConfig,
    providers: Vec<Arc<dyn Provider>>,
) -> (SocketAddr, Shutdown) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg: omicos_tool_runner::Config = serde_json::from_value(json!({
        "workspace": workspace,
        "tls": tls,
    }))
    .unwrap();
    let sd = Shutdown::new(Duration::from_millis(500));
    tokio::spawn(omicos_tool_runner::run(
        cfg,
        listener,
        sd.clone(),
        providers,
    ));
    (addr, sd)
}

async fn start_provider(tls: &TlsConfig, registry: Option<String>) -> (SocketAddr, Shutdown) {
    start_provider_with_secret(tls, registry, "").await
}

async fn start_provider_with_secret(
    tls: &TlsConfig,
    registry: Option<String>,
    secret: &'static str,
) -> (SocketAddr, Shutdown) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sd = Shutdown::new(Duration::from_millis(500));
    let hosting = ProviderHosting {
        registry,
        advertise: None,
        workspace: std::env::temp_dir(),
        ttl_seconds: 0,
    };
    let loaded = tls.load("tls").expect("the provider's TLS files");
    tokio::spawn(serve_provider_over(
        Arc::new(Echo),
        listener,
        hosting,
        secret,
        loaded,
        sd.clone(),
    ));
    (addr, sd)
}

/// One Execute of `echo_say` through the runner; the result text.
async fn execute(ch: Channel, creds: Credentials) -> Result<String, tonic::Status> {
    let mut c = ToolRunnerClient::new(creds.channel(ch));
    let start = ExecuteClientMessage {
        msg: Some(execute_client_message::Msg::Start(ExecuteStart {
            call_id: "call_1".into(),
            tool_name: "echo_say".into(),
            arguments: json!({"text": "over mTLS"}).to_string(),
            session_id: "s1".into(),
            agent_id: "tester".into(),
            permission_mode: omicos_proto::PermissionMode::Full as i32,
            ..Default::default()
        })),
    };
    // The stream stays open until the result: a half-close is not a cancel, but keep it simple.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(start).await.unwrap();
    let mut out = c
        .execute(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(m) = out.message().await? {
        if let Some(execute_server_message::Msg::Result(r)) = m.msg {
            drop(tx);
            return Ok(format!("{}: {}", r.status, r.result));
        }
    }
    Err(tonic::Status::unknown("no result"))
}

#[tokio::test]
async fn the_parts_talk_over_mutual_tls_and_a_certificate_from_another_ca_is_refused() {
    let _ = omicos_servicekit::telemetry::init("omicos-tests", "warn");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("omicos internal CA");
    let ca_file = ca.write(d, "ca.crt");
    let other = Ca::new("some other CA");
    let stranger = other.leaf("stranger", 66);

    // The runner and a provider, each requiring client certificates from the CA.
    let runner_tls = tls(d, &ca.part("runner", 1), "runner", &ca_file, &ca_file);
    let (runner, _rsd) = start_runner(d, runner_tls).await;
    let registry = format!("https://localhost:{}", runner.port());
    let provider_tls = tls(d, &ca.part("provider", 2), "provider", &ca_file, &ca_file);
    let (provider, _psd) = start_provider(&provider_tls, Some(registry.clone())).await;

    // The orchestrator's client: its own certificate from the CA, through the
    // balanced runner client the orchestrator uses. The provider registered
    // over mutual TLS, so its tool shows.
    let orch_leaf = ca.part("orchestrator", 3);
    let orch_tls = client(d, &ca_file, Some((&orch_leaf, "orchestrator")));
    let runners = omicos_orchestrator::runner_client::Runner::new(
        &registry,
        Duration::from_millis(100),
        "",
        Some(orch_tls.clone()),
    )
    .unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        match runners.list_tools(ListToolsRequest::default()).await {
            Ok(r) if r.tools.iter().any(|t| t.name == "echo_say") => break,
            other => assert!(
                Instant::now() < deadline,
                "the provider's tool never showed over mTLS: {:?}",
                other.map(|r| r.tools.len())
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A call goes orchestrator → runner → provider, each hop over mutual TLS,
    // with no service secret anywhere: the runner's CallTool carries its role.
    let as_orchestrator = Credentials::service_over("", ServiceRole::Orchestrator, true).unwrap();
    let out = execute(channel(&orch_tls, &registry), as_orchestrator.clone())
        .await
        .expect("Execute over mTLS");
    assert!(out.contains("echo: over mTLS"), "{out}");
    assert!(
        out.starts_with(&format!("{}:", omicos_proto::ToolStatus::Done as i32)),
        "{out}"
    );

    // Strangers: a client certificate from another CA, none at all, or plain
    // HTTP, are refused at the connection, on the runner and the provider.
    let provider_url = format!("https://127.0.0.1:{}", provider.port());
    let foreign = client(d, &ca_file, Some((&stranger, "stranger")));
    let anonymous = client(d, &ca_file, None);
    for url in [&registry, &provider_url] {
        health(channel(&orch_tls, url))
            .await
            .expect("a certificate from the CA gets in");
        assert_refused_at_handshake(health(channel(&foreign, url)).await, "another CA");
        assert_refused_at_handshake(health(channel(&anonymous, url)).await, "no certificate");
        let plain = url.replace("https://", "http://");
        assert_refused_at_handshake(
            health(Endpoint::from_shared(plain).unwrap().connect_lazy()).await,
            "plain HTTP",
        );
    }
    // The same seen from the wire: the handshake itself is refused.
    for (addr, who) in [(runner, "runner"), (provider, "provider")] {
        let served = served_cert(addr, &ca.pem, Some(&orch_leaf)).await.unwrap();
        assert_eq!(subject_of(&served), who);
        let e = served_cert(addr, &ca.pem, Some(&stranger))
            .await
            .unwrap_err();
        assert!(e.contains("refused") || e.contains("closed"), "{who}: {e}");
        let e = served_cert(addr, &ca.pem, None).await.unwrap_err();
        assert!(e.contains("refused") || e.contains("closed"), "{who}: {e}");
    }

    // A provider's CallTool from any part but a runner is refused, even
    // with a good certificate: the orchestrator's certificate, whatever
    // role its header claims (runner included) or with none.
    let call = CallToolRequest {
        tool: "echo_say".into(),
        arguments_json: "{}".into(),
        context: None,
    };
    let as_runner = Credentials::service_over("", ServiceRole::Runner, true).unwrap();
    for creds in [as_orchestrator, as_runner.clone(), Credentials::none()] {
        let mut p = ToolProviderClient::new(creds.channel(channel(&orch_tls, &provider_url)));
        let e = p.call_tool(call.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    }
    // A runner's certificate may call, with its role header or without one.
    let runner_client = client(d, &ca_file, Some((&ca.part("runner", 4), "runner-client")));
    for creds in [as_runner, Credentials::none()] {
        let mut p = ToolProviderClient::new(creds.channel(channel(&runner_client, &provider_url)));
        p.call_tool(call.clone()).await.expect("a runner may call");
    }
}

#[tokio::test]
async fn a_part_calls_only_in_the_role_its_certificate_names() {
    let _ = omicos_servicekit::telemetry::init("omicos-tests", "warn");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("omicos internal CA");
    let ca_file = ca.write(d, "ca.crt");
    let runner_tls = tls(d, &ca.part("runner", 1), "runner", &ca_file, &ca_file);
    let (runner, _rsd) = start_runner_with(d, runner_tls, vec![Arc::new(Echo)]).await;
    let runner_url = format!("https://localhost:{}", runner.port());
    let as_orchestrator = Credentials::service_over("", ServiceRole::Orchestrator, true).unwrap();

    // A runner's certificate claiming to be the orchestrator: refused, and
    // the message says which role the certificate carries.
    let runner_cert = client(d, &ca_file, Some((&ca.part("runner", 2), "runner-client")));
    let e = execute(channel(&runner_cert, &runner_url), as_orchestrator.clone())
        .await
        .expect_err("a runner's certificate cannot call as the orchestrator");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("`orchestrator`") && e.message().contains("spiffe://omicos/runner"),
        "{e:?}"
    );
    // The same certificate without a header is a runner: ToolRunner is not for it.
    let e = execute(channel(&runner_cert, &runner_url), Credentials::none())
        .await
        .expect_err("a runner does not run tools on a runner");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // A certificate from the CA that names no role gets in nowhere by
    // default, whatever its header says.
    let roleless = client(d, &ca_file, Some((&ca.leaf("someone", 3), "roleless")));
    let e = execute(channel(&roleless, &runner_url), as_orchestrator.clone())
        .await
        .expect_err("a certificate without a role");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("names no omicos role"), "{e:?}");
    // Another trust domain's SPIFFE ID is no omicos role either.
    let foreign_id = client(
        d,
        &ca_file,
        Some((
            &ca.leaf_with_uris("elsewhere", 4, &["spiffe://example.org/orchestrator"]),
            "foreign-id",
        )),
    );
    let e = execute(channel(&foreign_id, &runner_url), as_orchestrator.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // The orchestrator's certificate runs the call, with its role header or
    // without one (its one role).
    let done = format!("{}:", omicos_proto::ToolStatus::Done as i32);
    let orch = client(d, &ca_file, Some((&ca.part("orchestrator", 5), "orch")));
    for creds in [as_orchestrator.clone(), Credentials::none()] {
        let out = execute(channel(&orch, &runner_url), creds)
            .await
            .expect("the orchestrator's certificate gets in");
        assert!(
            out.starts_with(&done) && out.contains("echo: over mTLS"),
            "{out}"
        );
    }

    // A certificate naming several roles may call in any of them.
    let both = client(
        d,
        &ca_file,
        Some((
            &ca.leaf_with_uris(
                "ops",
                6,
                &["spiffe://omicos/operator", "spiffe://omicos/orchestrator"],
            ),
            "both",
        )),
    );
    execute(channel(&both, &runner_url), as_orchestrator.clone())
        .await
        .expect("one of its roles");

    // A provider with the service secret beside mTLS: a roleless
    // certificate gets in with the secret (a secret call over TLS), not
    // without it; a secret does not let a certificate speak as another role.
    let secret = "s3cret-for-tls";
    let provider_tls = tls(d, &ca.part("provider", 7), "provider", &ca_file, &ca_file);
    let (provider, _psd) = start_provider_with_secret(&provider_tls, None, secret).await;
    let provider_url = format!("https://localhost:{}", provider.port());
    let call = CallToolRequest {
        tool: "echo_say".into(),
        arguments_json: "{}".into(),
        context: None,
    };
    let call_as = |tls: &ClientTls, creds: Credentials| {
        let mut p = ToolProviderClient::new(creds.channel(channel(tls, &provider_url)));
        let call = call.clone();
        async move { p.call_tool(call).await.map(|_| ()) }
    };
    let runner_with_secret = Credentials::service_over(secret, ServiceRole::Runner, true).unwrap();
    let runner_without = Credentials::service_over("", ServiceRole::Runner, true).unwrap();
    let e = call_as(&roleless, runner_without.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    call_as(&roleless, runner_with_secret.clone())
        .await
        .expect("a roleless certificate with the secret");
    let orch_with_secret_as_runner = runner_with_secret.clone();
    let e = call_as(&orch, orch_with_secret_as_runner)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    call_as(&runner_cert, runner_without.clone())
        .await
        .expect("a runner's certificate needs no secret");

    // tls.allow_roleless_client_certs: a roleless certificate is believed
    // in the role its header names (the one-trust-domain setting).
    let mut lenient = tls(d, &ca.part("provider", 8), "provider2", &ca_file, &ca_file);
    lenient.allow_roleless_client_certs = true;
    let (provider2, _p2sd) = start_provider(&lenient, None).await;
    let lenient_url = format!("https://localhost:{}", provider2.port());
    let mut p = ToolProviderClient::new(
        runner_without
            .clone()
            .channel(channel(&roleless, &lenient_url)),
    );
    p.call_tool(call.clone())
        .await
        .expect("a roleless certificate in its header's role, where config allows it");
    let mut p = ToolProviderClient::new(as_orchestrator.channel(channel(&roleless, &lenient_url)));
    let e = p.call_tool(call.clone()).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::PermissionDenied,
        "the role rules still hold: {e:?}"
    );
    // And a certificate that names its role is still held to it there.
    let mut p = ToolProviderClient::new(runner_without.channel(channel(&orch, &lenient_url)));
    let e = p.call_tool(call).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

/// Polls `check` until it holds, within [`DEADLINE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        match check().await {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test]
async fn a_rotated_certificate_and_ca_are_taken_without_a_restart() {
    let _ = omicos_servicekit::telemetry::init("omicos-tests", "warn");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("CA one");
    let ca_file = ca.write(d, "ca.crt");
    let client_ca_file = ca.write(d, "client-ca.crt");
    let first = ca.leaf("provider-one", 101);
    let server = tls(d, &first, "server", &ca_file, &client_ca_file);
    let (addr, _sd) = start_provider(&server, None).await;
    let me = ca.leaf("caller", 7);

    let served = served_cert(addr, &ca.pem, Some(&me)).await.unwrap();
    assert_eq!(
        (serial_of(&served), subject_of(&served).as_str()),
        (101, "provider-one")
    );

    // cert-manager writes a new certificate and key: the next connection gets it.
    let second = ca.leaf("provider-two", 102);
    second.write(d, "server");
    eventually("the rotated certificate is served", || async {
        let served = served_cert(addr, &ca.pem, Some(&me)).await?;
        match serial_of(&served) {
            102 => Ok(()),
            n => Err(format!("still serial {n}")),
        }
    })
    .await;
    assert_eq!(
        subject_of(&served_cert(addr, &ca.pem, Some(&me)).await.unwrap()),
        "provider-two"
    );

    // A garbled rotation keeps the last good certificate.
    replace(
        Path::new(&server.cert),
        "-----BEGIN CERTIFICATE-----\nbroken\n",
    );
    for _ in 0..3 {
        let served = served_cert(addr, &ca.pem, Some(&me)).await.unwrap();
        assert_eq!(serial_of(&served), 102, "the last good certificate stays");
    }
    second.write(d, "server");

    // A new client CA: callers from the old one are refused from the next
    // connection on, callers from the new one get in.
    let ca2 = Ca::new("CA two");
    replace(Path::new(&client_ca_file), &ca2.pem);
    let me2 = ca2.leaf("caller-two", 8);
    eventually("the old CA's callers are refused", || async {
        match served_cert(addr, &ca.pem, Some(&me)).await {
            Err(_) => Ok(()),
            Ok(_) => Err("the old CA's certificate still gets in".into()),
        }
    })
    .await;
    served_cert(addr, &ca.pem, Some(&me2))
        .await
        .expect("the new CA's certificate gets in");

    // The client side rotates too: the server moves to a certificate from
    // CA two; one client's `ca` file follows, and its next connection
    // verifies the server with it (its own certificate from CA two as well).
    let third = ca2.leaf("provider-three", 103);
    third.write(d, "server");
    let client_ca = d.join("client-trust.crt");
    replace(&client_ca, &ca.pem);
    let (cert, key) = me2.write(d, "me2");
    let caller = TlsConfig {
        cert,
        key,
        ca: client_ca.display().to_string(),
        ..Default::default()
    }
    .client("test")
    .unwrap()
    .unwrap();
    let url = format!("https://localhost:{}", addr.port());
    eventually("the server moved to CA two", || async {
        match served_cert(addr, &ca2.pem, Some(&me2)).await {
            Ok(der) if serial_of(&der) == 103 => Ok(()),
            other => Err(format!("{:?}", other.map(|d| serial_of(&d)))),
        }
    })
    .await;
    assert_refused_at_handshake(
        health(channel(&caller, &url)).await,
        "a client still trusting CA one",
    );
    replace(&client_ca, &ca2.pem);
    health(channel(&caller, &url))
        .await
        .expect("the client's rotated CA verifies the server");
    assert!(
        caller.generation() >= 1,
        "the client took its rotated files"
    );
}

#[tokio::test]
async fn a_missing_or_garbled_file_at_start_is_a_config_error_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("CA");
    let ca_file = ca.write(d, "ca.crt");
    let leaf = ca.leaf("runner", 1);
    let (cert, key) = leaf.write(d, "runner");
    std::fs::write(d.join("garbled.key"), "not a key").unwrap();
    for (yaml, key_named, file_named) in [
        (
            format!("tls: {{cert: {cert}, key: {}/missing.key}}", d.display()),
            "tls.key",
            "missing.key",
        ),
        (
            format!("tls: {{cert: {cert}, key: {}/garbled.key}}", d.display()),
            "tls.key",
            "garbled.key",
        ),
        (
            format!(
                "tls: {{cert: {cert}, key: {key}, client_ca: {}/nope.crt}}",
                d.display()
            ),
            "tls.client_ca",
            "nope.crt",
        ),
        (format!("tls: {{cert: {cert}}}"), "tls.key", ""),
    ] {
        let file = d.join("runner.yaml");
        std::fs::write(&file, &yaml).unwrap();
        let e = omicos_servicekit::load_config::<omicos_tool_runner::Config>(Some(&file), &[])
            .unwrap_err();
        assert_eq!(e.key_path(), Some(key_named), "{yaml}: {e}");
        assert!(e.to_string().contains(file_named), "{yaml}: {e}");
    }
    // And the orchestrator's two sections name theirs.
    let file = d.join("orchestrator.yaml");
    std::fs::write(
        &file,
        format!("runner_tls: {{ca: {}/absent-ca.crt}}", d.display()),
    )
    .unwrap();
    let e = omicos_servicekit::load_config::<omicos_orchestrator::config::Config>(Some(&file), &[])
        .unwrap_err();
    assert_eq!(e.key_path(), Some("runner_tls.ca"), "{e}");
    let _ = ca_file;
}
