//! The provider registry: instances announce themselves (or come from config),
//! heartbeat, and expire after missed heartbeats. The runner routes each remote
//! tool to a live instance; sessions of stateful providers (the kernel) are
//! pinned to one instance by rendezvous hashing, so several runner replicas
//! agree on the pin without talking to each other.

use crate::config::StaticProvider;
use omicos_proto::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse,
    ListProvidersRequest, ListProvidersResponse, ProviderInstance, RegisterRequest,
    RegisterResponse, ToolSpec,
    registry_server::{Registry as RegistryRpc, RegistryServer},
};
use omicos_toolkit::remote::RemoteProvider;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

struct Instance {
    info: ProviderInstance,
    last_seen: Instant,
    ttl: Duration,
    client: Arc<RemoteProvider>,
}

impl Instance {
    fn live(&self, now: Instant) -> bool {
        self.info.static_entry || now.duration_since(self.last_seen) <= self.ttl
    }
}

#[derive(Default)]
struct State {
    instances: HashMap<String, Instance>,
    /// (provider, session) → instance id, for session-affine providers.
    pins: HashMap<(String, String), String>,
}

/// Provider instances and session pins. Cheap to share (`Arc`).
pub struct Registry {
    state: Mutex<State>,
    version: AtomicU64,
    ttl: Duration,
    round_robin: AtomicUsize,
}

/// Why a remote tool cannot be routed. The message is what the model reads.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct RouteError(pub String);

impl Registry {
    /// An empty registry whose instances live `ttl` without a heartbeat.
    pub fn new(ttl: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            version: AtomicU64::new(1),
            ttl,
            round_robin: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Moves the version on (an in-process provider's tool list changed, e.g.
    /// an MCP server's `tools/list_changed`), so catalogs rebuild.
    pub fn touch(&self) {
        self.bump();
    }

    /// Changes whenever the set of live instances changes.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The default TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Adds or replaces an instance. `ttl` of zero means the registry default.
    pub fn register(&self, mut info: ProviderInstance, ttl: Duration) -> Result<Duration, String> {
        if info.instance_id.trim().is_empty() {
            return Err("instance_id is empty".into());
        }
        if info.provider.trim().is_empty() {
            return Err("provider name is empty".into());
        }
        for t in info.tools.iter_mut() {
            if t.provider.is_empty() {
                t.provider = info.provider.clone();
            }
        }
        let ttl = if ttl.is_zero() { self.ttl } else { ttl };
        let client = RemoteProvider::lazy(
            &info.provider,
            &info.endpoint,
            info.tools.clone(),
            info.session_affinity,
        )
        .map_err(|e| e.to_string())?;
        info.last_seen_ms = now_ms();
        tracing::info!(provider = %info.provider, instance = %info.instance_id, endpoint = %info.endpoint, tools = info.tools.len(), "provider registered");
        self.lock().instances.insert(
            info.instance_id.clone(),
            Instance {
                info,
                last_seen: Instant::now(),
                ttl,
                client: Arc::new(client),
            },
        );
        self.bump();
        Ok(ttl)
    }

    /// Refreshes an instance; false when it is unknown (expired or never registered).
    pub fn heartbeat(&self, instance_id: &str) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        match st.instances.get_mut(instance_id) {
            Some(i) if i.live(now) => {
                i.last_seen = now;
                i.info.last_seen_ms = now_ms();
                true
            }
            _ => false,
        }
    }

    /// Removes an instance.
    pub fn deregister(&self, instance_id: &str) {
        if self.lock().instances.remove(instance_id).is_some() {
            tracing::info!(instance = %instance_id, "provider deregistered");
            self.bump();
        }
    }

    /// Removes instances that missed their heartbeats.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        let before = st.instances.len();
        st.instances.retain(|id, i| {
            let keep = i.live(now);
            if !keep {
                tracing::warn!(instance = %id, provider = %i.info.provider, "provider instance expired (missed heartbeats)");
            }
            keep
        });
        let changed = st.instances.len() != before;
        drop(st);
        if changed {
            self.bump();
        }
    }

    /// Every live instance.
    pub fn list(&self) -> Vec<ProviderInstance> {
        let now = Instant::now();
        let st = self.lock();
        let mut v: Vec<ProviderInstance> = st
            .instances
            .values()
            .filter(|i| i.live(now))
            .map(|i| i.info.clone())
            .collect();
        v.sort_by(|a, b| {
            a.provider
                .cmp(&b.provider)
                .then_with(|| a.instance_id.cmp(&b.instance_id))
        });
        v
    }

    /// The tools of live instances, one spec per tool name (the newest registration's).
    pub fn live_tools(&self) -> Vec<ToolSpec> {
        let mut by_name: HashMap<String, (i64, ToolSpec)> = HashMap::new();
        for inst in self.list() {
            for t in inst.tools {
                match by_name.get(&t.name) {
                    Some((seen, _)) if *seen >= inst.last_seen_ms => {}
                    _ => {
                        by_name.insert(t.name.clone(), (inst.last_seen_ms, t));
                    }
                }
            }
        }
        let mut v: Vec<ToolSpec> = by_name.into_values().map(|(_, t)| t).collect();
        v.sort_by(|a, b| {
            a.provider
                .cmp(&b.provider)
                .then_with(|| a.name.cmp(&b.name))
        });
        v
    }

    /// A live instance of `provider` that serves `tool` for `session`.
    ///
    /// Session-affine providers: the session stays on its pinned instance; the
    /// first call pins by rendezvous hashing over the live instances. When the
    /// pinned instance is gone the error says the session's state is lost, and
    /// the pin is dropped so the next call starts fresh elsewhere.
    pub fn route(
        &self,
        provider: &str,
        tool: &str,
        session: &str,
    ) -> Result<Arc<RemoteProvider>, RouteError> {
        let now = Instant::now();
        let mut st = self.lock();
        let candidates: Vec<&Instance> = st
            .instances
            .values()
            .filter(|i| {
                i.info.provider == provider
                    && i.live(now)
                    && i.info.tools.iter().any(|t| t.name == tool)
            })
            .collect();
        let affine = candidates.iter().any(|i| i.info.session_affinity);
        if !affine {
            if candidates.is_empty() {
                return Err(RouteError(format!(
                    "the `{provider}` provider that serves `{tool}` is not running (no live instance is registered); try again later or use another tool"
                )));
            }
            let mut sorted = candidates;
            sorted.sort_by(|a, b| a.info.instance_id.cmp(&b.info.instance_id));
            let n = self.round_robin.fetch_add(1, Ordering::Relaxed);
            return Ok(sorted[n % sorted.len()].client.clone());
        }
        let key = (provider.to_owned(), session.to_owned());
        if let Some(pinned) = st.pins.get(&key).cloned() {
            if let Some(i) = candidates.iter().find(|i| i.info.instance_id == pinned) {
                return Ok(i.client.clone());
            }
            st.pins.remove(&key);
            return Err(RouteError(format!(
                "the `{provider}` instance `{pinned}` that held session `{session}` is gone: the session's kernel state (variables, imports, loaded data) is lost. The next call starts a fresh kernel on another instance; re-create the state you need first."
            )));
        }
        let best = candidates
            .iter()
            .max_by_key(|i| (rendezvous_score(session, &i.info.instance_id), i.info.instance_id.clone()))
            .ok_or_else(|| {
                RouteError(format!(
                    "the `{provider}` provider that serves `{tool}` is not running (no live instance is registered); try again later"
                ))
            })?;
        let (id, client) = (best.info.instance_id.clone(), best.client.clone());
        st.pins.insert(key, id);
        Ok(client)
    }

    /// The instance a session is pinned to, if any.
    pub fn pinned(&self, provider: &str, session: &str) -> Option<String> {
        self.lock()
            .pins
            .get(&(provider.to_owned(), session.to_owned()))
            .cloned()
    }

    /// Sweeps expired instances every second until `stop`.
    pub fn spawn_sweeper(self: &Arc<Self>, stop: CancellationToken) {
        let me = self.clone();
        tokio::spawn(async move {
            let period = (me.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(period) => me.sweep(),
                    _ = stop.cancelled() => return,
                }
            }
        });
    }

    /// Describes each configured provider and adds it as a static entry;
    /// retries in the background (with backoff) until it answers.
    pub fn spawn_static(self: &Arc<Self>, providers: Vec<StaticProvider>, stop: CancellationToken) {
        for p in providers {
            let me = self.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut wait = Duration::from_millis(200);
                loop {
                    match RemoteProvider::connect(&p.endpoint).await {
                        Ok(remote) => {
                            let name = if remote.name().is_empty() {
                                p.name.clone()
                            } else {
                                remote.name().to_owned()
                            };
                            let info = ProviderInstance {
                                instance_id: format!("static:{}@{}", p.name, p.endpoint),
                                provider: name,
                                endpoint: p.endpoint.clone(),
                                tools: omicos_toolkit::Provider::tools(&remote),
                                session_affinity: omicos_toolkit::Provider::session_affinity(
                                    &remote,
                                ),
                                static_entry: true,
                                last_seen_ms: 0,
                            };
                            if let Err(e) = me.register(info, Duration::ZERO) {
                                tracing::error!(provider = %p.name, error = %e, "static provider refused");
                            }
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(provider = %p.name, endpoint = %p.endpoint, error = %e, "static provider not answering yet; retrying");
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.cancelled() => return,
                    }
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
            });
        }
    }
}

use omicos_toolkit::Provider as _;

/// Highest-random-weight score of (session, instance): stable across
/// processes and Rust versions (FNV-1a then a splitmix64 finalizer).
pub fn rendezvous_score(session: &str, instance_id: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in session.bytes().chain([0xff]).chain(instance_id.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d049bb133111eb);
    h ^ (h >> 31)
}

use omicos_proto::now_ms;

/// The `omicos.v1.Registry` gRPC face of a [`Registry`].
pub struct RegistryService {
    registry: Arc<Registry>,
}

impl RegistryService {
    /// Serves `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }
    /// The tonic server.
    pub fn into_server(self) -> RegistryServer<Self> {
        RegistryServer::new(self)
    }
}

#[tonic::async_trait]
impl RegistryRpc for RegistryService {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let req = req.into_inner();
        let info = req
            .instance
            .ok_or_else(|| Status::invalid_argument("RegisterRequest.instance is missing"))?;
        let ttl = self
            .registry
            .register(info, Duration::from_secs(req.ttl_seconds as u64))
            .map_err(|e| Status::invalid_argument(format!("cannot register: {e}")))?;
        let secs = ttl.as_secs().max(1) as u32;
        Ok(Response::new(RegisterResponse {
            ttl_seconds: secs,
            heartbeat_seconds: (secs / 3).max(1),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        Ok(Response::new(HeartbeatResponse {
            known: self.registry.heartbeat(&req.into_inner().instance_id),
        }))
    }

    async fn deregister(
        &self,
        req: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        self.registry.deregister(&req.into_inner().instance_id);
        Ok(Response::new(DeregisterResponse {}))
    }

    async fn list(
        &self,
        _req: Request<ListProvidersRequest>,
    ) -> Result<Response<ListProvidersResponse>, Status> {
        Ok(Response::new(ListProvidersResponse {
            instances: self.registry.list(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, affinity: bool) -> ProviderInstance {
        ProviderInstance {
            instance_id: id.into(),
            provider: "kernel".into(),
            endpoint: "http://127.0.0.1:1".into(),
            tools: vec![
                omicos_toolkit::tool("run_python_code", "", serde_json::json!({"type": "object"}))
                    .build(),
            ],
            session_affinity: affinity,
            static_entry: false,
            last_seen_ms: 0,
        }
    }

    #[tokio::test]
    async fn ttl_expiry_and_heartbeat() {
        let r = Registry::new(Duration::from_millis(150));
        r.register(inst("a", false), Duration::ZERO).unwrap();
        assert!(r.heartbeat("a"));
        assert_eq!(r.list().len(), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(r.list().is_empty(), "expired instance still listed");
        assert!(
            !r.heartbeat("a"),
            "heartbeat of an expired instance must say unknown"
        );
        let v = r.version();
        r.sweep();
        assert!(r.version() > v);
        assert!(r.route("kernel", "run_python_code", "s").is_err());
    }

    #[tokio::test]
    async fn affinity_pins_by_rendezvous_and_reports_lost_state() {
        let r = Registry::new(Duration::from_secs(30));
        for id in ["k1", "k2", "k3"] {
            r.register(inst(id, true), Duration::ZERO).unwrap();
        }
        // A second registry with the same instances (another runner replica) agrees.
        let r2 = Registry::new(Duration::from_secs(30));
        for id in ["k3", "k1", "k2"] {
            r2.register(inst(id, true), Duration::ZERO).unwrap();
        }
        for s in ["s1", "s2", "s3", "s4", "s5"] {
            r.route("kernel", "run_python_code", s).unwrap();
            r2.route("kernel", "run_python_code", s).unwrap();
            assert_eq!(r.pinned("kernel", s), r2.pinned("kernel", s));
        }
        let pinned = r.pinned("kernel", "s1").unwrap();
        // The pin survives a new instance joining.
        r.register(inst("k4", true), Duration::ZERO).unwrap();
        r.route("kernel", "run_python_code", "s1").unwrap();
        assert_eq!(r.pinned("kernel", "s1").as_deref(), Some(pinned.as_str()));
        r.deregister(&pinned);
        let err = r
            .route("kernel", "run_python_code", "s1")
            .err()
            .expect("the pinned instance is gone")
            .0;
        assert!(
            err.contains("kernel state") && err.contains("lost"),
            "{err}"
        );
        // The next call is pinned afresh.
        r.route("kernel", "run_python_code", "s1").unwrap();
        assert_ne!(r.pinned("kernel", "s1").as_deref(), Some(pinned.as_str()));
    }
}
