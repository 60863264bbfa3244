//! The provider registry: instances announce themselves (or come from config),
//! heartbeat, and expire after missed heartbeats. The runner routes each remote
//! tool to a live instance; sessions of stateful providers (the kernel) are
//! pinned to one instance by rendezvous hashing, so several runner replicas
//! agree on the pin without talking to each other.

use crate::config::StaticProvider;
use crate::error::RunnerError;
use crate::ownership::{KeyCheck, Owners, RegistryPolicy, key_digest};
use crate::shared_registry::SharedStore;
use omicos_proto::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse,
    ListProvidersRequest, ListProvidersResponse, ProviderInstance, RegisterRequest,
    RegisterResponse, ToolSpec,
    registry_server::{Registry as RegistryRpc, RegistryServer},
};
use omicos_toolkit::remote::RemoteProvider;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

struct Instance {
    info: ProviderInstance,
    /// Live until then (refreshed by heartbeats); static entries never expire.
    deadline: Instant,
    /// How long a heartbeat keeps it live.
    ttl: Duration,
    client: Arc<RemoteProvider>,
}

impl Instance {
    fn live(&self, now: Instant) -> bool {
        self.info.static_entry || now <= self.deadline
    }
}

/// Where a remote call goes: the instance chosen, and its client.
#[derive(Clone)]
pub struct Routed {
    /// The instance's id.
    pub instance_id: String,
    /// Its gRPC client.
    pub client: Arc<RemoteProvider>,
    /// Whether sessions are pinned to it (its state lives there: the kernel).
    pub affine: bool,
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
    /// The shared store (PostgreSQL) when replicas share the registry; the
    /// state above is then its cached view, refreshed by notifications.
    store: OnceLock<Arc<SharedStore>>,
    /// What config allows (TTL cap, tool owners).
    policy: RegistryPolicy,
    /// Who owns which instance id and tool name (in memory; the shared store
    /// keeps its own), and the built-in names.
    owners: Mutex<Owners>,
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
            store: OnceLock::new(),
            policy: RegistryPolicy::default(),
            owners: Mutex::new(Owners::default()),
        }
    }

    /// This registry under `policy` (TTL cap, tool owners from config).
    pub fn with_policy(mut self, policy: RegistryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RegistryPolicy {
        &self.policy
    }

    /// Names served in-process: no provider may register them.
    pub fn reserve_builtin(&self, names: impl IntoIterator<Item = String>) {
        self.owners().reserve_builtin(names);
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shares this registry through `store`: registrations, heartbeats,
    /// deregistrations and pins are written there, and the cached view follows
    /// the store's notifications. Set once, before serving.
    pub fn attach_store(&self, store: Arc<SharedStore>) -> Result<(), String> {
        self.store
            .set(store)
            .map_err(|_| "the registry already has a store".to_owned())
    }

    /// The shared store, if any.
    pub fn store(&self) -> Option<&Arc<SharedStore>> {
        self.store.get()
    }

    /// `memory` or `postgres`.
    pub fn backend(&self) -> &'static str {
        if self.store.get().is_some() {
            "postgres"
        } else {
            "memory"
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

    /// Checks an announced instance and fills in what it may leave out.
    fn prepare(&self, info: &mut ProviderInstance) -> Result<(), RunnerError> {
        if info.instance_id.trim().is_empty() {
            return Err(RunnerError::Registration("instance_id is empty".into()));
        }
        if info.provider.trim().is_empty() {
            return Err(RunnerError::Registration("provider name is empty".into()));
        }
        for t in info.tools.iter_mut() {
            if t.provider.is_empty() {
                t.provider = info.provider.clone();
            }
        }
        tonic::transport::Endpoint::from_shared(info.endpoint.clone()).map_err(|e| {
            RunnerError::Registration(format!("bad endpoint `{}`: {e}", info.endpoint))
        })?;
        Ok(())
    }

    /// Adds or replaces an instance in this process's view. `ttl` of zero
    /// means the registry default. (The gRPC face calls [`Registry::announce`],
    /// which also writes the shared store.)
    pub fn register(
        &self,
        mut info: ProviderInstance,
        ttl: Duration,
    ) -> Result<Duration, RunnerError> {
        self.prepare(&mut info)?;
        let ttl = if ttl.is_zero() { self.ttl } else { ttl };
        if info.last_seen_ms == 0 {
            info.last_seen_ms = now_ms();
        }
        tracing::info!(provider = %info.provider, instance = %info.instance_id, endpoint = %info.endpoint, tools = info.tools.len(), "provider registered");
        self.insert(info, ttl, ttl)?;
        self.bump();
        Ok(ttl)
    }

    /// Puts `info` in the view, live for `remaining`; keeps the existing client
    /// (and its connection) when the endpoint is unchanged.
    fn insert(
        &self,
        info: ProviderInstance,
        remaining: Duration,
        ttl: Duration,
    ) -> Result<(), RunnerError> {
        let mut st = self.lock();
        let client = match st.instances.get(&info.instance_id) {
            Some(old)
                if old.info.endpoint == info.endpoint
                    && old.info.tools == info.tools
                    && old.info.session_affinity == info.session_affinity =>
            {
                old.client.clone()
            }
            _ => Arc::new(
                RemoteProvider::lazy(
                    &info.provider,
                    &info.endpoint,
                    info.tools.clone(),
                    info.session_affinity,
                )
                .map_err(|e| RunnerError::Registration(e.to_string()))?,
            ),
        };
        st.instances.insert(
            info.instance_id.clone(),
            Instance {
                info,
                deadline: Instant::now() + remaining,
                ttl,
                client,
            },
        );
        Ok(())
    }

    /// Register through the gRPC face, as the holder of `key` (the
    /// instance key header; None when the caller sent none): checks the
    /// claims ([`crate::ownership`]), writes the shared store (which tells
    /// every replica) when there is one, then this process's view. The TTL
    /// is capped; static entries come from config only.
    pub async fn announce(
        &self,
        mut info: ProviderInstance,
        ttl: Duration,
        key: Option<&str>,
    ) -> Result<Duration, RunnerError> {
        if info.static_entry {
            return Err(RunnerError::RegistrationDenied(
                "static entries come from the runner's config (`providers`), not from Register"
                    .into(),
            ));
        }
        self.prepare(&mut info)?;
        let ttl = self.policy.cap_ttl(ttl, self.ttl);
        info.last_seen_ms = now_ms();
        let claims = self.owners().check_claims(&self.policy, &info)?;
        let key = key_digest(key);
        if let Some(store) = self.store.get() {
            store
                .upsert(&info, ttl, &key, &claims)
                .await
                .map_err(|e| RunnerError::RegistryStore(format!("refused the registration: {e}")))?
                .map_err(RunnerError::RegistrationDenied)?;
        } else {
            self.owners().claim(&info, &key, &claims)?;
        }
        self.register(info, ttl)
    }

    /// Heartbeat through the gRPC face, as the holder of `key`: false when
    /// the instance is unknown (expired or never registered), so the
    /// provider registers again; refused for another's instance.
    pub async fn refresh(&self, instance_id: &str, key: Option<&str>) -> Result<bool, RunnerError> {
        let key = key_digest(key);
        let Some(store) = self.store.get() else {
            return match self.owners().check(instance_id, &key) {
                KeyCheck::NotOwner => Err(not_yours(instance_id)),
                KeyCheck::Owner => Ok(self.heartbeat(instance_id)),
                // Nobody registered it through Register: nothing to keep alive.
                KeyCheck::Unknown => Ok(false),
            };
        };
        match store
            .heartbeat(instance_id, &key)
            .await
            .map_err(|e| RunnerError::RegistryStore(format!("did not answer: {e}")))?
        {
            (KeyCheck::Owner, Some(ttl)) => {
                if !self.apply_heartbeat(instance_id, ttl) {
                    // Registered through another replica and not seen here yet.
                    store.reload_soon();
                }
                Ok(true)
            }
            (KeyCheck::NotOwner, _) => Err(not_yours(instance_id)),
            _ => Ok(false),
        }
    }

    /// Deregister through the gRPC face, as the holder of `key`: only one's
    /// own instance (an id nobody holds is already gone: nothing to do).
    pub async fn withdraw(&self, instance_id: &str, key: Option<&str>) -> Result<(), RunnerError> {
        let key = key_digest(key);
        if let Some(store) = self.store.get() {
            if !store
                .delete_owned(instance_id, &key)
                .await
                .map_err(|e| RunnerError::RegistryStore(format!("did not answer: {e}")))?
            {
                return Err(not_yours(instance_id));
            }
        } else {
            let mut owners = self.owners();
            match owners.check(instance_id, &key) {
                KeyCheck::Owner => owners.forget(instance_id),
                KeyCheck::NotOwner => return Err(not_yours(instance_id)),
                // Known here without an owner: a static entry, from config.
                KeyCheck::Unknown if self.lock().instances.contains_key(instance_id) => {
                    return Err(not_yours(instance_id));
                }
                KeyCheck::Unknown => return Ok(()),
            }
        }
        self.deregister(instance_id);
        Ok(())
    }

    /// A heartbeat seen in the shared store: the instance lives `ttl` more.
    /// False when this view does not know it.
    pub fn apply_heartbeat(&self, instance_id: &str, ttl: Duration) -> bool {
        let mut st = self.lock();
        match st.instances.get_mut(instance_id) {
            Some(i) => {
                i.ttl = ttl;
                i.deadline = Instant::now() + ttl;
                i.info.last_seen_ms = now_ms();
                true
            }
            None => false,
        }
    }

    /// Replaces every non-static instance of this view with the shared
    /// store's live set: `(instance, time it still lives, its TTL)`.
    pub fn apply_live_set(&self, rows: Vec<(ProviderInstance, Duration, Duration)>) {
        let before = self.fingerprint();
        let ids: std::collections::HashSet<String> =
            rows.iter().map(|(i, _, _)| i.instance_id.clone()).collect();
        for (info, remaining, ttl) in rows {
            if let Err(e) = self.insert(info, remaining, ttl) {
                tracing::warn!(error = %e, "shared registry row skipped");
            }
        }
        self.lock()
            .instances
            .retain(|id, i| i.info.static_entry || ids.contains(id));
        if self.fingerprint() != before {
            self.bump();
        }
    }

    /// Replaces every session pin with the shared store's.
    pub fn apply_pins(&self, pins: Vec<(String, String, String)>) {
        let mut st = self.lock();
        st.pins = pins.into_iter().map(|(p, s, i)| ((p, s), i)).collect();
    }

    /// One pin set (or dropped, `None`) through another replica.
    pub fn apply_pin(&self, provider: &str, session: &str, instance: Option<&str>) {
        let key = (provider.to_owned(), session.to_owned());
        let mut st = self.lock();
        match instance {
            Some(i) => st.pins.insert(key, i.to_owned()),
            None => st.pins.remove(&key),
        };
    }

    /// What changes the catalog: ids, endpoints and tools of the instances.
    fn fingerprint(&self) -> Vec<(String, String, usize)> {
        let st = self.lock();
        let mut v: Vec<(String, String, usize)> = st
            .instances
            .values()
            .map(|i| {
                (
                    i.info.instance_id.clone(),
                    i.info.endpoint.clone(),
                    i.info
                        .tools
                        .iter()
                        .map(|t| t.name.len() + t.input_schema_json.len())
                        .sum(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Number of live instances per provider (the `registry entries` gauge).
    pub fn live_counts(&self) -> Vec<(String, u64)> {
        let mut by: HashMap<String, u64> = HashMap::new();
        for i in self.list() {
            *by.entry(i.provider).or_default() += 1;
        }
        let mut v: Vec<(String, u64)> = by.into_iter().collect();
        v.sort();
        v
    }

    /// Refreshes an instance; false when it is unknown (expired or never registered).
    pub fn heartbeat(&self, instance_id: &str) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        match st.instances.get_mut(instance_id) {
            Some(i) if i.live(now) => {
                i.deadline = now + i.ttl;
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
        let live: std::collections::HashSet<String> = st.instances.keys().cloned().collect();
        drop(st);
        self.owners().prune(&|id| live.contains(id));
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

    /// The clients of every live instance (EndSession goes to all of them).
    pub fn live_clients(&self) -> Vec<Arc<RemoteProvider>> {
        let now = Instant::now();
        self.lock()
            .instances
            .values()
            .filter(|i| i.live(now))
            .map(|i| i.client.clone())
            .collect()
    }

    /// The tools of live instances, one spec per tool name (the newest
    /// registration's; the provider config names, when it names one).
    pub fn live_tools(&self) -> Vec<ToolSpec> {
        let mut by_name: HashMap<String, (i64, ToolSpec)> = HashMap::new();
        for inst in self.list() {
            for t in inst.tools {
                if self
                    .policy
                    .tool_owners
                    .get(&t.name)
                    .is_some_and(|p| *p != inst.provider)
                {
                    continue;
                }
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
    /// first call pins by rendezvous hashing over the live instances (so every
    /// replica picks the same one, even before the pin reaches it). When the
    /// pinned instance is gone the error says the session's state is lost, and
    /// the pin is dropped so the next call starts fresh elsewhere.
    pub fn route(&self, provider: &str, tool: &str, session: &str) -> Result<Routed, RouteError> {
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
        let routed = |i: &Instance| Routed {
            instance_id: i.info.instance_id.clone(),
            client: i.client.clone(),
            affine: i.info.session_affinity,
        };
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
            return Ok(routed(sorted[n % sorted.len()]));
        }
        let key = (provider.to_owned(), session.to_owned());
        if let Some(pinned) = st.pins.get(&key).cloned() {
            if let Some(i) = candidates.iter().find(|i| i.info.instance_id == pinned) {
                return Ok(routed(i));
            }
            st.pins.remove(&key);
            drop(st);
            if let Some(store) = self.store.get() {
                store.spawn_pin(provider, session, None);
            }
            return Err(RouteError(lost_message(
                provider, &pinned, session, "is gone",
            )));
        }
        let best = candidates
            .iter()
            .max_by_key(|i| {
                (
                    rendezvous_score(session, &i.info.instance_id),
                    i.info.instance_id.clone(),
                )
            })
            .ok_or_else(|| {
                RouteError(format!(
                    "the `{provider}` provider that serves `{tool}` is not running (no live instance is registered); try again later"
                ))
            })?;
        let chosen = routed(best);
        st.pins.insert(key, chosen.instance_id.clone());
        drop(st);
        if let Some(store) = self.store.get() {
            store.spawn_pin(provider, session, Some(&chosen.instance_id));
        }
        Ok(chosen)
    }

    /// A call to a session-affine instance failed because the instance did
    /// not answer (killed, unreachable): its sessions' state is gone. Drops it
    /// from the live set (here and, through the store, on every replica) and
    /// unpins `session`, so the next call lands on a live instance; other
    /// sessions pinned there hear it on their next call. A provider that was
    /// only briefly unreachable is told `known: false` on its next heartbeat
    /// and registers again. Returns what the model reads.
    ///
    /// With a shared store the two writes (instance gone, pin dropped) are
    /// awaited, bounded by [`LOSS_WRITE_WAIT`], before the caller hears of the
    /// loss: the session's next call may land on another replica at once, and
    /// that replica must already be hearing that the instance is gone, or it
    /// would route there again and report the same loss a second time.
    pub async fn instance_lost(
        &self,
        provider: &str,
        instance_id: &str,
        session: &str,
        why: &str,
    ) -> String {
        let removed = {
            let mut st = self.lock();
            let removed = match st.instances.get(instance_id) {
                Some(i) if !i.info.static_entry => st.instances.remove(instance_id).is_some(),
                _ => false,
            };
            st.pins.remove(&(provider.to_owned(), session.to_owned()));
            removed
        };
        if removed {
            tracing::warn!(instance = %instance_id, provider, error = why, "provider instance lost: dropped from the live set");
            self.bump();
        }
        if let Some(store) = self.store.get() {
            let writes = store.lost(instance_id, provider, session);
            match tokio::time::timeout(LOSS_WRITE_WAIT, writes).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(instance = %instance_id, error = %e, "shared registry: the lost instance could not be dropped for the other replicas")
                }
                Err(_) => {
                    tracing::warn!(instance = %instance_id, "shared registry: dropping the lost instance takes over {LOSS_WRITE_WAIT:?}; the call's result goes out first")
                }
            }
        }
        lost_message(
            provider,
            instance_id,
            session,
            &format!("stopped answering ({why})"),
        )
    }

    /// A call to `instance_id` could not connect (it never reached the
    /// provider). When another replica already dropped that instance from the
    /// shared store — it reported the loss to the session, and this replica
    /// has not applied the notification yet — drops it here too and returns
    /// true: the call may be routed again instead of reporting the same loss
    /// a second time. Without a shared store, or when the store still lists
    /// it: false.
    pub async fn lost_elsewhere(&self, provider: &str, instance_id: &str, session: &str) -> bool {
        let Some(store) = self.store.get() else {
            return false;
        };
        match tokio::time::timeout(LOSS_WRITE_WAIT, store.instance_listed(instance_id)).await {
            Ok(Ok(false)) => {
                let mut st = self.lock();
                let removed = match st.instances.get(instance_id) {
                    Some(i) if !i.info.static_entry => st.instances.remove(instance_id).is_some(),
                    _ => false,
                };
                st.pins.remove(&(provider.to_owned(), session.to_owned()));
                drop(st);
                if removed {
                    self.bump();
                }
                true
            }
            _ => false,
        }
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

/// How long the loss of an instance waits for the shared store to record it
/// before the call's result goes out anyway (the store may be the thing that
/// is slow; the replicas' periodic re-read catches up then).
pub const LOSS_WRITE_WAIT: Duration = Duration::from_secs(3);

/// What the model reads when the instance holding its session's state is gone.
pub fn lost_message(provider: &str, instance_id: &str, session: &str, what: &str) -> String {
    format!(
        "the `{provider}` instance `{instance_id}` that held session `{session}` {what}: the session's kernel state (variables, imports, loaded data) is lost. The next call starts a fresh kernel on another instance; re-create the state you need first."
    )
}

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

fn not_yours(instance_id: &str) -> RunnerError {
    RunnerError::RegistrationDenied(format!(
        "the instance `{instance_id}` is not yours: it was registered with another instance key"
    ))
}

/// The instance key a registry call carries (`x-omicos-instance-key`).
fn instance_key<T>(req: &Request<T>) -> Option<String> {
    req.metadata()
        .get(omicos_auth::service::INSTANCE_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

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
        let key = instance_key(&req);
        let req = req.into_inner();
        let info = req.instance.ok_or_else(|| {
            RunnerError::Registration("RegisterRequest.instance is missing".into())
        })?;
        let (provider, id) = (info.provider.clone(), info.instance_id.clone());
        let ttl = self
            .registry
            .announce(info, Duration::from_secs(req.ttl_seconds as u64), key.as_deref())
            .await
            .inspect_err(|e| {
                if matches!(e, RunnerError::RegistrationDenied(_)) {
                    tracing::warn!(target: "omicos::audit", event = "registration_denied", provider = %provider, instance = %id, error = %e, "registration refused");
                }
            })?;
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
        let key = instance_key(&req);
        let id = req.into_inner().instance_id;
        let known = self
            .registry
            .refresh(&id, key.as_deref())
            .await
            .inspect_err(|e| {
                tracing::warn!(target: "omicos::audit", event = "heartbeat_denied", instance = %id, error = %e, "heartbeat refused");
            })?;
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn deregister(
        &self,
        req: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        let key = instance_key(&req);
        let id = req.into_inner().instance_id;
        self.registry
            .withdraw(&id, key.as_deref())
            .await
            .inspect_err(|e| {
                tracing::warn!(target: "omicos::audit", event = "deregister_denied", instance = %id, error = %e, "deregistration refused");
            })?;
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
