//! The omicos orchestrator: owns agents, teams, sessions, the turn loop with
//! the LLM, `call_agent` dispatch and the `Chat` stream clients hold.

pub mod agents;
pub mod config;
pub mod engine;
pub mod error;
pub mod hub;
pub mod llm;
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
    let runner = runner_client::Runner::new(&config.tool_runner, config.runner_refresh).map_err(std::io::Error::other)?;
    let engine = Arc::new(Engine {
        trajectories: trajectory::Trajectories::new(&config.workspace),
        runner: runner.clone(),
        backends: backends.0,
        default_backend: backends.1,
        agents,
        config,
    });
    let hub = Arc::new(Hub::new(store));
    let host = Host::new(HostOptions {
        name: "orchestrator",
        services: vec!["omicos.v1.Orchestrator"],
    })
    .await;
    let lease = engine.config.turn_lease;
    let svc = service::OrchestratorService::new(engine, hub.clone(), shutdown.streams_token());
    // Decisions and cancels made on other replicas reach this replica's turns.
    tokio::spawn(hub.clone().dispatch_notices());
    // Turns of lost replicas are closed within a lease and a fifth.
    tokio::spawn(recovery::sweep(
        hub,
        svc.instance().to_owned(),
        lease,
        (lease / 5).max(Duration::from_secs(1)),
        shutdown.streams_token(),
    ));
    let router = host.router().add_service(
        OrchestratorServer::new(svc)
            .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES),
    );
    // Ready once the tool-runner answers.
    let reporter = host.reporter();
    let sd = shutdown.clone();
    tokio::spawn(async move {
        loop {
            if sd.is_draining() {
                return;
            }
            if runner.list_tools(Default::default()).await.is_ok() {
                reporter
                    .set_service_status(
                        "omicos.v1.Orchestrator",
                        tonic_health::ServingStatus::Serving,
                    )
                    .await;
                reporter
                    .set_service_status("", tonic_health::ServingStatus::Serving)
                    .await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    host.serve(router, listener, shutdown).await
}
