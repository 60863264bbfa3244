//! The omicos orchestrator: owns agents, teams, sessions, the turn loop with
//! the LLM, `call_agent` dispatch and the `Chat` stream clients hold.

pub mod agents;
pub mod bound;
pub mod config;
pub mod engine;
pub mod error;
pub mod files;
pub mod genai;
pub mod hooks;
pub mod hub;
pub mod llm;
pub mod metrics;
pub mod recovery;
pub mod runner_client;
pub mod service;
pub mod trajectory;

use agents::AgentDirectory;
use config::Config;
use engine::Engine;
use error::OrchestratorError;
use hub::Hub;
use llm::LlmBackend;
use llm::retry::RetryPolicy;
use omicos_proto::orchestrator_server::OrchestratorServer;
use omicos_proto::orchestrator_web_server::OrchestratorWebServer;
use omicos_servicekit::{Host, HostOptions, Shutdown};
use omicos_sessionstore::SessionStore;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The configured backends by name, and the default's name.
pub type Backends = (HashMap<String, Arc<dyn LlmBackend>>, String);

/// Builds the LLM backends the configuration allows, and picks the default.
pub fn build_backends(cfg: &config::LlmConfig) -> Result<Backends, OrchestratorError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let retry = RetryPolicy {
        max_attempts: cfg.max_attempts,
        base_delay: cfg.retry_base_delay,
        max_delay: cfg.retry_max_delay,
    };
    let idle = cfg.idle_timeout;
    let default = match cfg.backend.as_str() {
        "" if !cfg.replay_file.is_empty() => "replay",
        "" if env("ANTHROPIC_API_KEY").is_some()
            && env("OPENAI_API_KEY").is_none()
            && cfg.base_url.is_empty() =>
        {
            "anthropic"
        }
        "" => "openai",
        b => b,
    }
    .to_owned();
    let mut map: HashMap<String, Arc<dyn LlmBackend>> = HashMap::new();
    let pick = |name: &str, default_url: &str| {
        if default == name && !cfg.base_url.is_empty() {
            cfg.base_url.clone()
        } else {
            default_url.to_owned()
        }
    };
    let openai_key = if default == "openai" && !cfg.api_key.is_empty() {
        cfg.api_key.clone()
    } else {
        env("OPENAI_API_KEY").unwrap_or_default()
    };
    let openai_model = if default == "openai" && !cfg.model.is_empty() {
        cfg.model.clone()
    } else {
        "gpt-4o-mini".into()
    };
    map.insert(
        "openai".into(),
        Arc::new(llm::openai::OpenAiBackend::new(
            &pick("openai", "https://api.openai.com/v1"),
            &openai_key,
            &openai_model,
            retry.clone(),
            idle,
        )),
    );
    let anthropic_key = if default == "anthropic" && !cfg.api_key.is_empty() {
        cfg.api_key.clone()
    } else {
        env("ANTHROPIC_API_KEY").unwrap_or_default()
    };
    if !anthropic_key.is_empty() || default == "anthropic" {
        let model = if default == "anthropic" && !cfg.model.is_empty() {
            cfg.model.clone()
        } else {
            "claude-sonnet-4-5".into()
        };
        map.insert(
            "anthropic".into(),
            Arc::new(llm::anthropic::AnthropicBackend::new(
                &pick("anthropic", "https://api.anthropic.com"),
                &anthropic_key,
                &model,
                retry,
                idle,
            )),
        );
    }
    if !cfg.replay_file.is_empty() {
        let b = llm::replay::ReplayBackend::from_file(std::path::Path::new(&cfg.replay_file))
            .map_err(|e| OrchestratorError::Config {
                key: "llm.replay_file",
                source: Box::new(e),
            })?;
        map.insert("replay".into(), Arc::new(b));
    } else if default == "replay" {
        return Err(OrchestratorError::config(
            "llm.replay_file",
            "the replay backend needs a script",
        ));
    }
    Ok((map, default))
}

/// Opens the conversation store named by the configuration.
pub async fn open_store(cfg: &Config) -> Result<Arc<dyn SessionStore>, OrchestratorError> {
    let url = if cfg.store_url.is_empty() {
        format!(
            "sqlite://{}",
            cfg.workspace.join(".omicos").join("sessions.db").display()
        )
    } else {
        cfg.store_url.clone()
    };
    omicos_sessionstore::open(&url)
        .await
        .map_err(|e| OrchestratorError::Config {
            key: "store_url",
            source: Box::new(e),
        })
}

/// Everything needed to serve, already built (tests can pass their own pieces).
pub struct Parts {
    /// Settings.
    pub config: Config,
    /// Agents.
    pub agents: Arc<dyn AgentDirectory>,
    /// Conversation store.
    pub store: Arc<dyn SessionStore>,
    /// Model backends and the default's name.
    pub backends: Backends,
}

/// Serves the orchestrator on `listener` until `shutdown` drains.
pub async fn serve(parts: Parts, listener: TcpListener, shutdown: Shutdown) -> std::io::Result<()> {
    let Parts {
        config,
        agents,
        store,
        backends,
    } = parts;
    std::fs::create_dir_all(config.workspace.join(".omicos"))?;
    // Every RPC but health and reflection (unless configured) needs a credential.
    let gate: Arc<dyn omicos_auth::Gate> =
        Arc::new(omicos_auth::ClientAuth::new(&config.auth).map_err(std::io::Error::other)?);
    let (open_health, open_reflection) = (config.auth.open_health, config.auth.open_reflection);
    let edge_tls = config
        .tls
        .server("tls")
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let runner_tls = config
        .runner_tls
        .client("runner_tls")
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let runner = runner_client::Runner::new(
        &config.tool_runner,
        config.runner_refresh,
        &config.service_secret,
        runner_tls,
    )
    .map_err(std::io::Error::other)?;
    let engine = Arc::new(Engine {
        trajectories: trajectory::Trajectories::new(&config.workspace),
        runner: runner.clone(),
        backends: backends.0,
        default_backend: backends.1,
        agents,
        config,
        calibration: Default::default(),
        tool_cache: Default::default(),
        started_sessions: Default::default(),
    });
    let hub_store = store.clone();
    let hub = Arc::new(Hub::new(store));
    let _gauges = metrics::hub_gauges(&hub);
    let tls = edge_tls.is_some();
    let host = Host::new(HostOptions {
        name: "orchestrator",
        services: vec![
            "omicos.v1.Orchestrator",
            "omicos.v1.OrchestratorWeb",
            "lf.a2a.v1.A2AService",
        ],
    })
    .await
    .tls(edge_tls);
    let files = Arc::new(files::FilesGate::new(
        gate.clone(),
        engine.config.workspace.clone(),
        hub.clone(),
    ));
    let lease = engine.config.turn_lease;
    let sweeping = engine.clone();
    let svc = Arc::new(service::OrchestratorService::new(
        engine,
        hub.clone(),
        shutdown.streams_token(),
    ));
    // Decisions and cancels made on other replicas reach this replica's turns.
    tokio::spawn(hub.clone().dispatch_notices());
    // Turns of lost replicas are closed within a lease and a fifth.
    tokio::spawn(recovery::sweep(
        hub,
        sweeping,
        svc.instance().to_owned(),
        (lease / 5).max(Duration::from_secs(1)),
        shutdown.streams_token(),
    ));
    let routes = omicos_auth::guarded_routes(&host, gate.clone(), open_health, open_reflection);
    let a2a = service::a2a::router(svc.clone(), gate.clone(), tls);
    let app = web_app(routes, svc, files, gate, hub_store, a2a);
    // Ready once the tool-runner answers.
    let reporter = host.reporter();
    let sd = shutdown.clone();
    tokio::spawn(async move {
        loop {
            if sd.is_draining() {
                return;
            }
            if runner.list_tools(Default::default()).await.is_ok() {
                for name in [
                    "omicos.v1.Orchestrator",
                    "omicos.v1.OrchestratorWeb",
                    "lf.a2a.v1.A2AService",
                ] {
                    reporter
                        .set_service_status(name, tonic_health::ServingStatus::Serving)
                        .await;
                }
                reporter
                    .set_service_status("", tonic_health::ServingStatus::Serving)
                    .await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    host.serve_http(app, listener, shutdown).await
}

/// One port for every client: the gRPC services (`routes`, Orchestrator and
/// OrchestratorWeb) over HTTP/2, the same over gRPC-web (HTTP/1.1, what a
/// browser speaks), the A2A agent card and JSON-RPC endpoint (`a2a`), and the web page with the workspace's output files as
/// the fallback. tonic-web's layer wraps the gRPC routes only: it answers
/// 400 to plain HTTP/1.1 requests, which the page's router must get. Same
/// origin, so no CORS.
fn web_app(
    routes: tonic::service::Routes,
    svc: Arc<service::OrchestratorService>,
    files: Arc<dyn omicos_webui::FileGate>,
    gate: Arc<dyn omicos_auth::Gate>,
    store: Arc<dyn SessionStore>,
    a2a: axum::Router,
) -> axum::Router {
    use service::guard::SessionGuard;
    let max = omicos_proto::MAX_MESSAGE_BYTES;
    // Credentials first, then the session guard: every call is decided by
    // method before a handler runs (service::guard::METHODS).
    routes
        .add_service(omicos_auth::Guard::new(
            SessionGuard::new(
                OrchestratorServer::from_arc(svc.clone())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max),
                store.clone(),
            ),
            gate.clone(),
        ))
        .add_service(omicos_auth::Guard::new(
            SessionGuard::new(
                OrchestratorWebServer::from_arc(svc.clone())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max),
                store.clone(),
            ),
            gate.clone(),
        ))
        // A2A's gRPC binding, with the same credentials and ownership.
        .add_service(omicos_auth::Guard::new(
            SessionGuard::new(service::a2a::grpc::server(svc), store),
            gate,
        ))
        .into_axum_router()
        .layer(tonic_web::GrpcWebLayer::new())
        // After the gRPC-web layer, which would refuse its plain HTTP/1.1 requests.
        .merge(a2a)
        .fallback_service(page_or_unimplemented(omicos_webui::router_with(files)))
}

/// The page's router for browsers; a gRPC or gRPC-web call to a method no
/// service has gets UNIMPLEMENTED, as from a plain tonic server, not an HTTP error.
fn page_or_unimplemented(
    page: axum::Router,
) -> impl tower::Service<
    axum::extract::Request,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |req: axum::extract::Request| {
        let page = page.clone();
        async move {
            let grpc = req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .filter(|v| v.as_bytes().starts_with(b"application/grpc"))
                .cloned();
            let res = match grpc {
                Some(content_type) => {
                    let status = tonic::Status::unimplemented(format!(
                        "no method {} on this server",
                        req.uri().path()
                    ));
                    let mut res: axum::response::Response = status.into_http();
                    res.headers_mut()
                        .insert(http::header::CONTENT_TYPE, content_type);
                    res
                }
                None => tower::ServiceExt::oneshot(page, req).await?,
            };
            Ok(res)
        }
    })
}
