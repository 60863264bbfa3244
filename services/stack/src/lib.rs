//! The whole omicos stack in one process, as `omicos up` and `omicos demo` run
//! it: the tool-runner (with its registry and the in-process providers), the
//! kernel, web and memory providers (each registered with the registry) and
//! the orchestrator, every service on its own loopback port.
//!
//! Configuration: each service reads its own defaults and `OMICOS_*`
//! variables, as when it runs alone; an optional YAML file has one section per
//! service (`orchestrator`, `tool_runner`, `kernel`, `web`, `memory`, `pdf`).

use omicos_servicekit::config::whole_secs_u32;
use omicos_servicekit::config::{Value, load_config_value};
use omicos_servicekit::{ConfigError, ServiceConfig, Shutdown};
use omicos_toolkit::{Provider, ProviderHosting, serve_provider_with};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Why the stack did not start, or stopped with errors.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// The config file, a section of it, or a value in it cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The workspace cannot be created or read.
    #[error("workspace {path}: {source}")]
    Workspace {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A port cannot be bound (the message names the address).
    #[error(transparent)]
    Bind(std::io::Error),
    /// A service could not be built from its config.
    #[error("{service}: {source}")]
    Start {
        /// The service.
        service: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A service did not report SERVING in time.
    #[error("{url} did not become ready within {limit:?}")]
    NotReady {
        /// Its URL.
        url: String,
        /// How long it was given.
        limit: Duration,
    },
    /// Services that failed while running (each `service: error`).
    #[error("{}", .0.join("; "))]
    Stopped(Vec<String>),
}

impl StackError {
    /// A short name for logs and exit codes.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Workspace { .. } => "workspace",
            Self::Bind(_) => "bind",
            Self::Start { .. } => "start",
            Self::NotReady { .. } => "not_ready",
            Self::Stopped(_) => "stopped",
        }
    }

    fn start(
        service: &'static str,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Start {
            service,
            source: e.into(),
        }
    }
}

/// The replay script `omicos up` uses when no model is configured.
pub const DEFAULT_REPLAY: &str = include_str!("../scripts/offline.yaml");

/// How to start the stack.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Workspace root (created if missing).
    pub workspace: PathBuf,
    /// Whole-stack YAML file.
    pub config_file: Option<PathBuf>,
    /// Host to bind.
    pub host: String,
    /// Orchestrator port; the others follow (+1 runner, +2 kernel, +3 web, +4 memory, +5 image_gen). 0: ephemeral ports.
    pub port_base: u16,
    /// Use this replay script (forces the replay backend).
    pub replay_file: Option<PathBuf>,
    /// The environment to read `OMICOS_*` from.
    pub env: Vec<(String, String)>,
    /// Start the kernel provider.
    pub kernel: bool,
    /// Start the web provider.
    pub web: bool,
    /// Start the memory provider.
    pub memory: bool,
    /// Start the image_gen provider (it explains how to configure itself when unconfigured).
    pub image_gen: bool,
    /// Require a credential at the orchestrator: the workspace's token
    /// (`<workspace>/.omicos/token`, made at first start) and any key the
    /// config names. false (`omicos up --no-auth`): anyone who reaches the port is let in.
    pub auth: bool,
}

impl UpOptions {
    /// Defaults for a workspace: ports from 7000, every provider, the process environment.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self {
            workspace: workspace.into(),
            config_file: None,
            host: "127.0.0.1".into(),
            port_base: 7000,
            replay_file: None,
            env: omicos_servicekit::config::process_env(),
            kernel: true,
            web: true,
            memory: true,
            image_gen: true,
            auth: true,
        }
    }
}

/// A started stack.
pub struct RunningStack {
    /// (service, URL), in start order.
    pub endpoints: Vec<(&'static str, String)>,
    /// The orchestrator's URL.
    pub orchestrator: String,
    /// The tool-runner's URL (also the registry).
    pub runner: String,
    /// The workspace.
    pub workspace: PathBuf,
    /// Drains every service.
    pub shutdown: Shutdown,
    /// Which LLM backend the orchestrator uses by default.
    pub llm_backend: String,
    /// The workspace's token, when auth is on.
    pub token: Option<String>,
    /// The secret the stack's services require of each other.
    pub service_secret: String,
    /// Whether the token file was made by this start.
    pub token_created: bool,
    /// The interpreter the kernels use, and the rule that chose it (None
    /// without the kernel provider).
    pub kernel_python: Option<omicos_kernel::Interpreter>,
    tasks: JoinSet<(&'static str, std::io::Result<()>)>,
    kernel: Option<Arc<omicos_kernel::KernelProvider>>,
}

fn section(file: &Option<serde_yaml::Mapping>, name: &str) -> Option<Value> {
    file.as_ref().and_then(|m| m.get(name)).cloned()
}

/// The stack file's top-level `hooks` (Claude Code's settings.json shape),
/// given to both services: each runs the events that happen in it (tool
/// events in the runner, the others in the orchestrator). A service's own
/// `hooks` key comes first.
fn with_hooks(service: Option<Value>, file: &Option<serde_yaml::Mapping>) -> Option<Value> {
    let Some(hooks) = section(file, "hooks") else {
        return service;
    };
    let mut m = match service {
        Some(Value::Mapping(m)) => m,
        None | Some(Value::Null) => serde_yaml::Mapping::new(),
        other => return other,
    };
    if !m.contains_key("hooks") {
        m.insert(Value::String("hooks".into()), hooks);
    }
    Some(Value::Mapping(m))
}

fn known_sections(m: &serde_yaml::Mapping) -> Result<(), ConfigError> {
    for k in m.keys() {
        let k = k.as_str().unwrap_or_default();
        if ![
            "orchestrator",
            "tool_runner",
            "kernel",
            "web",
            "memory",
            "pdf",
            "image_gen",
            "hooks",
        ]
        .contains(&k)
        {
            return Err(ConfigError::key(
                k,
                "unknown section (known: orchestrator, tool_runner, kernel, web, memory, pdf, image_gen, hooks)",
            ));
        }
    }
    Ok(())
}

async fn bind(host: &str, base: u16, offset: u16) -> Result<TcpListener, StackError> {
    let port = if base == 0 { 0 } else { base + offset };
    let addr = format!("{host}:{port}");
    omicos_servicekit::host::bind(&addr)
        .await
        .map_err(StackError::Bind)
}

fn url(l: &TcpListener) -> String {
    format!(
        "http://{}",
        l.local_addr().expect("bound listener has an address")
    )
}

/// Whether the environment configures a real model.
pub fn llm_configured(env: &[(String, String)]) -> bool {
    let set = |k: &str| env.iter().any(|(n, v)| n == k && !v.is_empty());
    set("OMICOS_LLM_BASE_URL")
        || set("OMICOS_LLM_BACKEND")
        || set("OMICOS_LLM_REPLAY_FILE")
        || set("OPENAI_API_KEY")
        || set("ANTHROPIC_API_KEY")
}

/// Starts every service. Returns once the orchestrator is ready.
pub async fn up(opts: UpOptions) -> Result<RunningStack, StackError> {
    // The runner lives in this process: large call buffers go back to the
    // system when the call ends, as in the runner's own binary.
    omicos_tool_runner::allocator::return_large_buffers();
    let ws_err = |path: &Path| {
        let path = path.to_owned();
        move |source| StackError::Workspace { path, source }
    };
    std::fs::create_dir_all(&opts.workspace).map_err(ws_err(&opts.workspace))?;
    let workspace = opts
        .workspace
        .canonicalize()
        .map_err(ws_err(&opts.workspace))?;
    std::fs::create_dir_all(workspace.join(".omicos")).map_err(ws_err(&workspace))?;
    let file: Option<serde_yaml::Mapping> = match &opts.config_file {
        Some(p) => match omicos_servicekit::config::read_yaml(p, &opts.env)? {
            Value::Mapping(m) => {
                known_sections(&m)?;
                Some(m)
            }
            Value::Null => None,
            _ => {
                return Err(ConfigError::Syntax {
                    path: p.display().to_string(),
                    message: "expected a mapping of sections".into(),
                }
                .into());
            }
        },
        None => None,
    };
    let env = &opts.env;
    let shutdown = Shutdown::new(Duration::from_secs(5));
    let mut tasks = JoinSet::new();
    let mut endpoints = Vec::new();

    // Orchestrator config first: the catalog feeds the runner's skill provider.
    let mut ocfg: omicos_orchestrator::config::Config = load_config_value(
        with_hooks(section(&file, "orchestrator"), &file),
        env,
        "orchestrator",
    )?;
    ocfg.workspace = workspace.clone();
    if let Some(r) = &opts.replay_file {
        ocfg.llm.backend = "replay".into();
        ocfg.llm.replay_file = r.display().to_string();
    } else if !llm_configured(env) && ocfg.llm.backend.is_empty() && ocfg.llm.base_url.is_empty() {
        let p = workspace.join(".omicos").join("offline-replay.yaml");
        std::fs::write(&p, DEFAULT_REPLAY).map_err(ws_err(&p))?;
        ocfg.llm.backend = "replay".into();
        ocfg.llm.replay_file = p.display().to_string();
    }
    // A laptop is not an exception: the workspace's token is the local principal's key.
    let (token, token_created) = if opts.auth {
        let p = omicos_auth::token::path(&workspace);
        let (t, created) = omicos_auth::token::ensure(&workspace).map_err(ws_err(&p))?;
        ocfg.auth.enabled = true;
        ocfg.auth.api_keys.push(omicos_auth::ApiKeyConfig {
            sha256: omicos_auth::sha256_hex(&t),
            principal: omicos_auth::config::LOCAL_SUBJECT.into(),
            tenant: omicos_auth::config::DEFAULT_TENANT.into(),
            tier: String::new(),
            max_mode: "full".into(),
        });
        (Some(t), created)
    } else {
        ocfg.auth.enabled = false;
        (None, false)
    };
    ocfg.validate().map_err(|e| e.in_section("orchestrator"))?;
    refuse_tls(&ocfg.tls, "orchestrator.tls")?;
    refuse_tls(&ocfg.runner_tls, "orchestrator.runner_tls")?;
    let (agents, warnings) = omicos_orchestrator::agents::CatalogAgents::load(&ocfg)
        .map_err(|e| StackError::start("orchestrator", e))?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    let catalog = agents.catalog().clone();

    // Tool-runner with the registry and the in-process providers.
    let runner_l = bind(&opts.host, opts.port_base, 1).await?;
    let runner_url = url(&runner_l);
    let mut rcfg: omicos_tool_runner::Config = load_config_value(
        with_hooks(section(&file, "tool_runner"), &file),
        env,
        "tool_runner",
    )?;
    rcfg.workspace = workspace.clone();
    rcfg.listen = runner_l.local_addr().map_err(StackError::Bind)?.to_string();
    // One service secret for the whole stack: the configured one, else a new one per start.
    if rcfg.service_secret.is_empty() {
        rcfg.service_secret = if ocfg.service_secret.is_empty() {
            omicos_auth::token::generate()
        } else {
            ocfg.service_secret.clone()
        };
    }
    let service_secret = rcfg.service_secret.clone();
    ocfg.service_secret = service_secret.clone();
    rcfg.validate().map_err(|e| e.in_section("tool_runner"))?;
    refuse_tls(&rcfg.tls, "tool_runner.tls")?;
    let pdf_cfg: omicos_pdf::Config = load_config_value(section(&file, "pdf"), env, "pdf")?;
    let local: Vec<Arc<dyn Provider>> = vec![
        Arc::new(omicos_pdf::PdfProvider::new(pdf_cfg)),
        Arc::new(omicos_catalog::SkillProvider::new(catalog)),
        Arc::new(omicos_catalog::ThinkProvider),
        Arc::new(omicos_catalog::TaskProvider),
        Arc::new(omicos_catalog::PlanProvider),
    ];
    let sd = shutdown.clone();
    tasks.spawn(async move {
        (
            "tool-runner",
            omicos_tool_runner::run(rcfg, runner_l, sd, local).await,
        )
    });
    endpoints.push(("tool-runner", runner_url.clone()));

    let hosting = |ttl: u32| ProviderHosting {
        registry: Some(runner_url.clone()),
        advertise: None,
        workspace: workspace.clone(),
        ttl_seconds: ttl,
    };

    let mut kernel = None;
    let mut kernel_python = None;
    if opts.kernel {
        let kcfg: omicos_kernel::Config =
            load_config_value(section(&file, "kernel"), env, "kernel")?;
        refuse_tls(&kcfg.tls, "kernel.tls")?;
        let l = bind(&opts.host, opts.port_base, 2).await?;
        endpoints.push(("kernel", url(&l)));
        let p =
            omicos_kernel::KernelProvider::new(kcfg.kernel.clone(), workspace.clone(), env.clone())
                .map_err(|e| StackError::start("kernel", e))?;
        kernel_python = Some(p.kernels().interpreter(&workspace));
        kernel = Some(p.clone());
        let (h, sd) = (hosting(whole_secs_u32(kcfg.registry_ttl)), shutdown.clone());
        let secret = service_secret.clone();
        tasks.spawn(async move { ("kernel", serve_provider_with(p, l, h, &secret, sd).await) });
    }
    if opts.web {
        let wcfg: omicos_web::Config = load_config_value(section(&file, "web"), env, "web")?;
        refuse_tls(&wcfg.tls, "web.tls")?;
        let l = bind(&opts.host, opts.port_base, 3).await?;
        endpoints.push(("web", url(&l)));
        let p = Arc::new(
            omicos_web::WebProvider::with_parts(
                &wcfg.web,
                env,
                Arc::new(omicos_web::ssrf::SystemLookup),
            )
            .map_err(|e| StackError::start("web", e))?,
        );
        let (h, sd) = (hosting(whole_secs_u32(wcfg.registry_ttl)), shutdown.clone());
        let secret = service_secret.clone();
        tasks.spawn(async move { ("web", serve_provider_with(p, l, h, &secret, sd).await) });
    }
    if opts.memory {
        let mut mcfg: omicos_memory::Config =
            load_config_value(section(&file, "memory"), env, "memory")?;
        refuse_tls(&mcfg.tls, "memory.tls")?;
        mcfg.workspace = workspace.clone();
        let store_url = mcfg.store_url();
        let store = omicos_memory::MemoryStore::open(&store_url)
            .await
            .map_err(|e| StackError::start("memory store", e))?;
        let l = bind(&opts.host, opts.port_base, 4).await?;
        endpoints.push(("memory", url(&l)));
        let p = Arc::new(omicos_memory::MemoryProvider::new(store));
        let (h, sd) = (hosting(whole_secs_u32(mcfg.registry_ttl)), shutdown.clone());
        let secret = service_secret.clone();
        tasks.spawn(async move { ("memory", serve_provider_with(p, l, h, &secret, sd).await) });
    }

    if opts.image_gen {
        let icfg: omicos_image_gen::Config =
            load_config_value(section(&file, "image_gen"), env, "image_gen")?;
        refuse_tls(&icfg.tls, "image_gen.tls")?;
        let l = bind(&opts.host, opts.port_base, 5).await?;
        endpoints.push(("image_gen", url(&l)));
        let p = Arc::new(
            omicos_image_gen::ImageGenProvider::new(icfg.image_gen.clone().with_env_fallbacks(env))
                .map_err(|e| StackError::start("image_gen", e.to_string()))?,
        );
        let (h, sd) = (hosting(whole_secs_u32(icfg.registry_ttl)), shutdown.clone());
        let secret = service_secret.clone();
        tasks.spawn(async move { ("image_gen", serve_provider_with(p, l, h, &secret, sd).await) });
    }

    // The orchestrator last: it is ready once the runner answers.
    let orch_l = bind(&opts.host, opts.port_base, 0).await?;
    let orch_url = url(&orch_l);
    ocfg.listen = orch_l.local_addr().map_err(StackError::Bind)?.to_string();
    ocfg.tool_runner = runner_url.clone();
    let backends = omicos_orchestrator::build_backends(&ocfg.llm)
        .map_err(|e| StackError::start("orchestrator", e))?;
    let llm_backend = backends.1.clone();
    let store = omicos_orchestrator::open_store(&ocfg)
        .await
        .map_err(|e| StackError::start("orchestrator", e))?;
    let parts = omicos_orchestrator::Parts {
        config: ocfg,
        agents: Arc::new(agents),
        store,
        backends,
    };
    let sd = shutdown.clone();
    tasks.spawn(async move {
        (
            "orchestrator",
            omicos_orchestrator::serve(parts, orch_l, sd).await,
        )
    });
    endpoints.insert(0, ("orchestrator", orch_url.clone()));

    let stack = RunningStack {
        endpoints,
        orchestrator: orch_url,
        runner: runner_url,
        workspace,
        shutdown,
        llm_backend,
        token,
        token_created,
        service_secret: service_secret.clone(),
        kernel_python,
        tasks,
        kernel,
    };
    wait_serving(&stack.orchestrator, Duration::from_secs(30)).await?;
    if opts.kernel || opts.web || opts.memory || opts.image_gen {
        wait_providers(
            &stack.runner,
            &stack.service_secret,
            opts.kernel as usize + opts.web as usize + opts.memory as usize,
        )
        .await;
    }
    Ok(stack)
}

/// The one-process stack's parts talk over loopback, and its clients (the
/// CLI, the readiness checks) over plain HTTP: TLS is for parts deployed
/// apart. A TLS section is refused rather than half applied.
fn refuse_tls(tls: &omicos_servicekit::TlsConfig, key: &str) -> Result<(), ConfigError> {
    if tls.is_empty() {
        return Ok(());
    }
    Err(ConfigError::key(
        key,
        "`omicos up` runs every part in one process on loopback and serves plain HTTP; \
         TLS is for parts deployed as separate services (see docs/operations.md, TLS)",
    ))
}

/// Waits until `url`'s health says SERVING.
pub async fn wait_serving(url: &str, limit: Duration) -> Result<(), StackError> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Ok(ch) = tonic::transport::Channel::from_shared(url.to_owned())
            .map_err(|e| StackError::start("orchestrator", e))?
            .connect()
            .await
        {
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
            if let Ok(r) = h
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                && r.into_inner().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(StackError::NotReady {
        url: url.to_owned(),
        limit,
    })
}

async fn wait_providers(runner: &str, secret: &str, n: usize) {
    let Ok(ep) = tonic::transport::Channel::from_shared(runner.to_owned()) else {
        return;
    };
    let Ok(ch) = ep.connect().await else { return };
    let Ok(creds) = omicos_auth::Credentials::service(secret, omicos_auth::ServiceRole::Operator)
    else {
        return;
    };
    let mut c = omicos_proto::registry_client::RegistryClient::new(creds.channel(ch));
    for _ in 0..100 {
        if let Ok(r) = c.list(omicos_proto::ListProvidersRequest {}).await
            && r.into_inner().instances.len() >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!("not every provider registered within 5 s");
}

impl RunningStack {
    /// Drains every service and waits for them to stop.
    pub async fn stop(self) -> Result<(), StackError> {
        self.shutdown.trigger();
        self.wait().await
    }

    /// Waits until every service stopped (after a drain), stopping kernels last.
    pub async fn wait(mut self) -> Result<(), StackError> {
        let mut errors = vec![];
        while let Some(r) = self.tasks.join_next().await {
            match r {
                Ok((name, Err(e))) => {
                    errors.push(format!("{name}: {e}"));
                    // One service failing stops the others.
                    self.shutdown.trigger();
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        if let Some(k) = self.kernel.take() {
            k.close().await;
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(StackError::Stopped(errors))
        }
    }

    /// The web page's URL: the orchestrator serves it, and gRPC-web for it,
    /// on its own port. With auth on, the token rides in the fragment
    /// (`#token=…`, as Jupyter prints its URL): a browser never sends a
    /// fragment, and the page moves it into the tab's sessionStorage.
    pub fn page_url(&self) -> String {
        match &self.token {
            Some(t) => format!("{}/#token={t}", self.orchestrator),
            None => format!("{}/", self.orchestrator),
        }
    }

    /// The workspace path.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> Option<serde_yaml::Mapping> {
        Some(serde_yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn the_top_level_hooks_reach_both_services_and_each_keeps_its_events() {
        let f = file(
            "hooks:\n  Stop: [{hooks: [{type: command, command: /etc/omicos/hooks/stop.sh}]}]\n  PreToolUse: [{matcher: shell, hooks: [{type: command, command: /etc/omicos/hooks/pre.sh}]}]\ntool_runner: {approval_timeout: 2m}\n",
        );
        let o: omicos_orchestrator::config::Config = load_config_value(
            with_hooks(section(&f, "orchestrator"), &f),
            &[],
            "orchestrator",
        )
        .unwrap();
        assert_eq!(
            o.hooks.stop[0].hooks[0].command,
            "/etc/omicos/hooks/stop.sh"
        );
        let r: omicos_tool_runner::Config = load_config_value(
            with_hooks(section(&f, "tool_runner"), &f),
            &[],
            "tool_runner",
        )
        .unwrap();
        assert_eq!(
            r.hooks.pre_tool_use[0].hooks[0].command,
            "/etc/omicos/hooks/pre.sh"
        );
        assert_eq!(r.approval_timeout, Duration::from_secs(120));
    }
}
