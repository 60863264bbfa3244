//! Live session state: the gap-free event sequence, subscribers, pending
//! approvals, tools allowed for the rest of the session, and the running turn.
//!
//! The hub holds sessions weakly: a session's state lives while something
//! uses it (its running turn, a client's event stream, a call in progress)
//! and is dropped, with its entry, when the last user lets go. An idle
//! session costs this replica nothing; its next use rebuilds the state from
//! the store (the last seq, and at turn start the grants). Pending approvals
//! belong to a running turn, which keeps its session alive, and are in the
//! store too.

use crate::error::OrchestratorError;
use omicos_proto::{ChatEvent, Decision, chat_event};
use omicos_sessionstore::SessionStore;
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

/// A turn in progress on this replica.
#[derive(Clone)]
pub struct RunningTurn {
    /// Turn id.
    pub turn_id: String,
    /// Cancels the turn.
    pub cancel: CancellationToken,
    /// The lease owner (`<replica>:<turn id>`) the turn holds the session with;
    /// pending approvals and cancel requests in the store name it.
    pub lease_owner: String,
    /// Messages steered into the turn (`ChatRequest.steer`).
    pub steer: Arc<SteerQueue>,
}

/// The messages sent to a running turn with `ChatRequest.steer`: its root
/// frame reads them before each model request. Once the turn stops taking
/// them the queue is closed, and a later steer is refused (it starts a
/// turn of its own instead), so none is taken and then forgotten.
#[derive(Debug, Default)]
pub struct SteerQueue {
    inner: Mutex<SteerState>,
}

#[derive(Debug, Default)]
struct SteerState {
    closed: bool,
    messages: Vec<String>,
}

impl SteerQueue {
    /// A queue that takes nothing (a hold that runs no model, as Compact's).
    pub fn closed() -> Self {
        Self {
            inner: Mutex::new(SteerState {
                closed: true,
                messages: vec![],
            }),
        }
    }

    /// Queues a message; false once the turn no longer takes any.
    pub fn push(&self, message: String) -> bool {
        let mut s = self.inner.lock().expect("steer queue");
        if s.closed {
            return false;
        }
        s.messages.push(message);
        true
    }

    /// The messages queued since the last call, oldest first.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.inner.lock().expect("steer queue").messages)
    }

    /// Closes the queue if nothing waits in it: true when it was empty
    /// (the frame may end), false when a message came in the meantime.
    pub fn close_if_empty(&self) -> bool {
        let mut s = self.inner.lock().expect("steer queue");
        if s.messages.is_empty() {
            s.closed = true;
        }
        s.closed
    }

    /// Closes the queue; what was queued and never read.
    pub fn close(&self) -> Vec<String> {
        let mut s = self.inner.lock().expect("steer queue");
        s.closed = true;
        std::mem::take(&mut s.messages)
    }
}

/// The answer to an approval request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalAnswer {
    /// Allow once, allow for the session, or deny.
    pub decision: Decision,
    /// With AllowSession: the allow rule to keep instead of the whole tool
    /// (checked to parse at the edge; the runner checks it against the call).
    pub rule: String,
}

impl ApprovalAnswer {
    /// A decision without a rule.
    pub fn plain(decision: Decision) -> Self {
        Self {
            decision,
            rule: String::new(),
        }
    }

    pub(crate) fn stored(decision: i32, rule: String) -> Self {
        Self {
            decision: Decision::try_from(decision).unwrap_or(Decision::Deny),
            rule,
        }
    }
}

/// The call an approval was asked for, as the runner described it in
/// ApprovalRequired: what an approval answered as a rule must match.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AskedCall {
    /// The tool's canonical name.
    pub tool: String,
    /// The arguments as they would run (validated, after hooks).
    pub arguments: serde_json::Value,
}

/// A call waiting for its approval on this replica.
struct Waiting {
    answer: oneshot::Sender<ApprovalAnswer>,
    call: AskedCall,
}

/// The longest rule an approval may carry (it travels in a NOTIFY payload).
pub const MAX_APPROVAL_RULE_CHARS: usize = 1000;

/// Checks the rule an approval was answered with: only with ALLOW_SESSION,
/// bounded, and it must parse. The runner then checks it names the call's
/// tool and matches the call.
pub fn approval_rule(decision: Decision, rule: &str) -> Result<String, String> {
    let rule = rule.trim();
    if rule.is_empty() {
        return Ok(String::new());
    }
    if decision != Decision::AllowSession {
        return Err("a rule can only come with ALLOW_SESSION".into());
    }
    if rule.chars().count() > MAX_APPROVAL_RULE_CHARS {
        return Err(format!(
            "the rule is longer than {MAX_APPROVAL_RULE_CHARS} characters"
        ));
    }
    omicos_rules::Rule::parse(rule, omicos_rules::Source::Session)
        .map(|r| r.text().to_owned())
        .map_err(|e| e.to_string())
}

/// One session's live state on this replica.
pub struct SessionState {
    /// Session id.
    pub id: String,
    seq: tokio::sync::Mutex<u64>,
    tx: broadcast::Sender<ChatEvent>,
    approvals: Mutex<HashMap<String, Waiting>>,
    allowed: Mutex<HashSet<String>>,
    turn: Mutex<Option<RunningTurn>>,
    /// Turns this replica lost the lease of (another replica took them
    /// over): their events and history are no longer this replica's to write.
    fenced: Mutex<HashSet<String>>,
    store: Arc<dyn SessionStore>,
    /// The hub's map, to take this session's entry out when it is dropped.
    registry: Weak<Registry>,
}

/// The hub's sessions by id, held weakly.
type Registry = Mutex<HashMap<String, Weak<SessionState>>>;

impl Drop for SessionState {
    fn drop(&mut self) {
        // Never run while the map's lock is held: the hub drops no state under it.
        if let Some(reg) = self.registry.upgrade() {
            let mut map = reg.lock().expect("sessions");
            // A newer state of the same session may have taken the entry.
            if map.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&self.id);
            }
        }
    }
}

impl SessionState {
    /// Reloads the latest seq from the store (another replica may have
    /// written). An error leaves the seq as it was and must stop the caller:
    /// emitting on a stale seq would break the gap-free sequence.
    pub async fn sync_seq(&self) -> Result<(), OrchestratorError> {
        let mut seq = self.seq.lock().await;
        *seq = self
            .store
            .last_seq(&self.id)
            .await
            .map_err(|source| OrchestratorError::Seq {
                session: self.id.clone(),
                source,
            })?;
        Ok(())
    }

    /// Assigns the next seq, persists and then broadcasts the event. Returns
    /// its seq; when the store refused it, nothing is sent and the last
    /// durable seq is returned.
    pub async fn emit(&self, ev: ChatEvent) -> u64 {
        self.emit_inner(vec![ev], None).await
    }

    /// Emits events that are ready together (text deltas that queued while
    /// the previous ones were being written) as one append: consecutive
    /// seqs, durable all or none, then broadcast in order. Returns the last
    /// seq; when the store refused them, none is sent and the last durable
    /// seq is returned.
    pub async fn emit_many(&self, evs: Vec<ChatEvent>) -> u64 {
        self.emit_inner(evs, None).await
    }

    /// Emits the last event of a turn and clears the running turn in one step,
    /// so a client that saw turn_done can start the next turn at once, and the
    /// next turn's first event always comes after it.
    pub async fn emit_final(&self, ev: ChatEvent, turn_id: &str) -> u64 {
        self.emit_inner(vec![ev], Some(turn_id)).await
    }

    async fn emit_inner(&self, mut evs: Vec<ChatEvent>, ending: Option<&str>) -> u64 {
        let mut seq = self.seq.lock().await;
        if let Some(t) = ending {
            self.end_turn(t);
        }
        {
            let fenced = self.fenced.lock().expect("fenced");
            if !fenced.is_empty() {
                evs.retain(|e| !fenced.contains(&e.turn_id));
            }
        }
        if evs.is_empty() {
            return *seq;
        }
        let first = *seq + 1;
        let now = omicos_sessionstore::now_ms();
        let mut bodies = Vec::with_capacity(evs.len());
        for (i, ev) in evs.iter_mut().enumerate() {
            ev.event_seq = first + i as u64;
            ev.session_id.clone_from(&self.id);
            if ev.timestamp_ms == 0 {
                ev.timestamp_ms = now;
            }
            bodies.push(ev.encode_to_vec());
        }
        // Published only once durable: a client never sees an event that a
        // crash could lose, and the seq advances only with the log.
        if let Err(e) = self.store.append_events(&self.id, first, bodies).await {
            tracing::error!(session = %self.id, events = evs.len(), error = %e, "events not persisted, not sent");
            return *seq;
        }
        *seq += evs.len() as u64;
        for ev in evs {
            let _ = self.tx.send(ev);
        }
        *seq
    }

    /// The conversation store.
    pub fn store(&self) -> &dyn SessionStore {
        self.store.as_ref()
    }

    /// The latest seq.
    pub async fn last_seq(&self) -> u64 {
        *self.seq.lock().await
    }

    /// Live events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ChatEvent> {
        self.tx.subscribe()
    }

    /// Waits for the decision on `call_id` (asked for `call`), and records
    /// the wait in the store (with the turn's lease owner) so that
    /// ApproveTool on any replica reaches it. A decision recorded meanwhile
    /// is delivered at once.
    pub async fn wait_approval(
        &self,
        call_id: &str,
        call: AskedCall,
    ) -> oneshot::Receiver<ApprovalAnswer> {
        let (tx, rx) = oneshot::channel();
        self.approvals
            .lock()
            .expect("approvals")
            .insert(call_id.to_owned(), Waiting { answer: tx, call });
        if let Some(t) = self.running() {
            if let Err(e) = self
                .store
                .put_approval(&self.id, call_id, &t.lease_owner)
                .await
            {
                // Still answerable on this replica (the Chat stream, ApproveTool here).
                tracing::warn!(session = %self.id, call_id, error = %e, "pending approval not stored: other replicas cannot answer it");
            } else if let Ok(Some((d, rule))) =
                self.store.approval_decision(&self.id, call_id).await
            {
                self.resolve_approval(call_id, ApprovalAnswer::stored(d, rule));
            }
        }
        rx
    }

    /// Waits again for an approval a lost replica asked for (its request is
    /// in the log and its row in the store): the waiter is registered before
    /// the stored decision is read, so an answer given through any replica,
    /// before or after, is not missed; the row is not reset (an answer
    /// already in it stands).
    pub async fn wait_approval_again(
        &self,
        call_id: &str,
        call: AskedCall,
    ) -> oneshot::Receiver<ApprovalAnswer> {
        let (tx, rx) = oneshot::channel();
        self.approvals
            .lock()
            .expect("approvals")
            .insert(call_id.to_owned(), Waiting { answer: tx, call });
        match self.store.approval_decision(&self.id, call_id).await {
            Ok(Some((d, rule))) => {
                self.resolve_approval(call_id, ApprovalAnswer::stored(d, rule));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = %self.id, call_id, error = %e, "stored approval unreadable: waiting for an answer here");
            }
        }
        rx
    }

    /// Forgets the stored pending approval (answered or timed out).
    pub async fn clear_stored_approval(&self, call_id: &str) {
        if let Err(e) = self.store.clear_approval(&self.id, call_id).await {
            tracing::warn!(session = %self.id, call_id, error = %e, "pending approval not cleared");
        }
    }

    /// Delivers a decision; false when no such call is waiting in this session.
    pub fn resolve_approval(&self, call_id: &str, decision: ApprovalAnswer) -> bool {
        match self.approvals.lock().expect("approvals").remove(call_id) {
            Some(w) => w.answer.send(decision).is_ok(),
            None => false,
        }
    }

    /// The call `call_id` waits with on this replica, if it does.
    pub fn asked_call(&self, call_id: &str) -> Option<AskedCall> {
        self.approvals
            .lock()
            .expect("approvals")
            .get(call_id)
            .map(|w| w.call.clone())
    }

    /// Forgets a pending approval (the runner timed out).
    pub fn drop_approval(&self, call_id: &str) -> bool {
        self.approvals
            .lock()
            .expect("approvals")
            .remove(call_id)
            .is_some()
    }

    /// Tools allowed for the rest of the session (whole tools).
    pub fn allowed_tools(&self) -> Vec<String> {
        self.grants(false)
    }

    /// Allow rules the session was granted (`shell(git *)`): approvals
    /// answered as a rule. Kept in the same grants as whole tools; a grant
    /// with a specifier is a rule (a tool name has no parentheses).
    pub fn allowed_rules(&self) -> Vec<String> {
        self.grants(true)
    }

    fn grants(&self, rules: bool) -> Vec<String> {
        let mut v: Vec<_> = self
            .allowed
            .lock()
            .expect("allowed")
            .iter()
            .filter(|g| g.contains('(') == rules)
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Remembers an allow-for-session decision (a whole tool, or an allow
    /// rule), here and in the store (so that it holds for the session's next
    /// turn on any replica).
    pub async fn allow_for_session(&self, tool: &str) {
        self.allowed
            .lock()
            .expect("allowed")
            .insert(tool.to_owned());
        if let Err(e) = self.store.add_grant(&self.id, tool).await {
            tracing::warn!(session = %self.id, tool, error = %e, "allow-for-session grant not stored: it holds on this replica only");
        }
    }

    /// Loads the session's stored grants (made on any replica) into this replica's set.
    pub async fn load_grants(&self) -> Result<(), omicos_sessionstore::StoreError> {
        let stored = self.store.grants(&self.id).await?;
        self.allowed.lock().expect("allowed").extend(stored);
        Ok(())
    }

    /// Marks a turn as running; false if one already runs here.
    pub fn start_turn(&self, t: RunningTurn) -> bool {
        let mut cur = self.turn.lock().expect("turn");
        if cur.is_some() {
            return false;
        }
        *cur = Some(t);
        true
    }

    /// Clears the running turn.
    pub fn end_turn(&self, turn_id: &str) {
        let mut cur = self.turn.lock().expect("turn");
        if cur.as_ref().is_some_and(|t| t.turn_id == turn_id) {
            *cur = None;
        }
    }

    /// This replica lost turn `turn_id`'s lease to another replica, which
    /// continues it: from now on its events are dropped here and its
    /// history is not written (the caller cancels it).
    pub fn fence(&self, turn_id: &str) {
        self.fenced
            .lock()
            .expect("fenced")
            .insert(turn_id.to_owned());
    }

    /// Whether the turn running here lost its lease ([`Self::fence`]).
    pub fn running_is_fenced(&self) -> bool {
        self.running()
            .is_some_and(|t| self.fenced.lock().expect("fenced").contains(&t.turn_id))
    }

    /// The running turn, if any.
    pub fn running(&self) -> Option<RunningTurn> {
        self.turn.lock().expect("turn").clone()
    }
}

/// All live sessions of this replica.
pub struct Hub {
    sessions: Arc<Registry>,
    store: Arc<dyn SessionStore>,
}

impl Hub {
    /// A hub over `store`.
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        Self {
            sessions: Arc::new(Mutex::new(HashMap::new())),
            store,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// The live state of `id`, created (with seq loaded from the store) on
    /// first use. A seq that cannot be read is an error, never 0: a session
    /// whose sequence restarted would overwrite or skip its own events.
    pub async fn state(&self, id: &str) -> Result<Arc<SessionState>, OrchestratorError> {
        if let Some(s) = self.existing(id) {
            return Ok(s);
        }
        let last = self
            .store
            .last_seq(id)
            .await
            .map_err(|source| OrchestratorError::Seq {
                session: id.to_owned(),
                source,
            })?;
        Ok(self.insert(id, last))
    }

    /// The state of a session created just now, with nothing in the store
    /// yet: its seq starts at 0 without a read.
    pub fn new_session(&self, id: &str) -> Arc<SessionState> {
        self.insert(id, 0)
    }

    /// Builds the state at `last` unless someone else built it meanwhile
    /// (theirs is the one).
    fn insert(&self, id: &str, last: u64) -> Arc<SessionState> {
        let mut map = self.sessions.lock().expect("sessions");
        if let Some(s) = map.get(id).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(SessionState {
            id: id.to_owned(),
            seq: tokio::sync::Mutex::new(last),
            // Small on purpose: a subscriber that lags re-reads the store.
            tx: broadcast::channel(256).0,
            approvals: Mutex::new(HashMap::new()),
            allowed: Mutex::new(HashSet::new()),
            turn: Mutex::new(None),
            fenced: Mutex::new(HashSet::new()),
            store: self.store.clone(),
            registry: Arc::downgrade(&self.sessions),
        });
        map.insert(id.to_owned(), Arc::downgrade(&s));
        s
    }

    /// The live state if this replica has it.
    pub fn existing(&self, id: &str) -> Option<Arc<SessionState>> {
        let map = self.sessions.lock().expect("sessions");
        map.get(id).and_then(Weak::upgrade)
    }

    /// How many of the live sessions run a turn (for the metrics).
    pub fn running_turns(&self) -> usize {
        self.live().iter().filter(|s| s.running().is_some()).count()
    }

    /// Forgets a session's live state (it was deleted); whoever still holds
    /// it keeps it until they let go.
    pub fn forget(&self, id: &str) {
        let gone = self.sessions.lock().expect("sessions").remove(id);
        drop(gone);
    }

    /// How many sessions have live state on this replica (each has a turn,
    /// a client following it, or a call in progress).
    pub fn live_sessions(&self) -> usize {
        let map = self.sessions.lock().expect("sessions");
        map.values().filter(|w| w.strong_count() > 0).count()
    }

    /// The states alive now; taken out of the lock before anyone can drop them.
    fn live(&self) -> Vec<Arc<SessionState>> {
        let map = self.sessions.lock().expect("sessions");
        map.values().filter_map(Weak::upgrade).collect()
    }
}

impl Hub {
    /// Acts on the store's notices for the turns this replica runs: a decision
    /// made on another replica reaches its waiting call, a cancel requested
    /// there cancels the turn. Runs until the store's bus closes.
    pub async fn dispatch_notices(self: Arc<Self>) {
        use omicos_sessionstore::Notice;
        let mut rx = self.store.notices();
        loop {
            let n = match rx.recv().await {
                Ok(n) => n,
                Err(broadcast::error::RecvError::Lagged(_)) => Notice::Resync,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match n {
                Notice::Approval {
                    session,
                    call_id,
                    decision,
                    rule,
                } => {
                    if let Some(s) = self.existing(&session) {
                        s.resolve_approval(&call_id, ApprovalAnswer::stored(decision, rule));
                    }
                }
                Notice::Cancel { session, owner } => {
                    if let Some(t) = self.existing(&session).and_then(|s| s.running())
                        && t.lease_owner == owner
                    {
                        t.cancel.cancel();
                    }
                }
                Notice::Resync => self.resync().await,
                Notice::Event { .. } => {}
            }
        }
    }

    /// Re-reads what this replica's turns wait for (notices may have been missed).
    async fn resync(&self) {
        for s in self.live() {
            let Some(t) = s.running() else { continue };
            if let Ok(true) = self.store.cancel_requested(&s.id, &t.lease_owner).await {
                t.cancel.cancel();
            }
            let waiting: Vec<String> = s
                .approvals
                .lock()
                .expect("approvals")
                .keys()
                .cloned()
                .collect();
            for call_id in waiting {
                if let Ok(Some((d, rule))) = self.store.approval_decision(&s.id, &call_id).await {
                    s.resolve_approval(&call_id, ApprovalAnswer::stored(d, rule));
                }
            }
        }
    }
}

/// Whether `ev` ends the turn `turn_id`.
pub fn is_turn_done(ev: &ChatEvent, turn_id: &str) -> bool {
    ev.turn_id == turn_id && matches!(ev.kind, Some(chat_event::Kind::TurnDone(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use omicos_sessionstore::HistoryItem;
    use omicos_sessionstore::{MemoryStore, SessionMeta, StoreError, StoreResult};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A memory store whose `last_seq` fails while `broken` is set.
    #[derive(Default)]
    struct SeqFails {
        inner: MemoryStore,
        broken: AtomicBool,
    }

    #[async_trait]
    impl SessionStore for SeqFails {
        async fn put_session(&self, meta: &SessionMeta) -> StoreResult<()> {
            self.inner.put_session(meta).await
        }
        async fn get_session(&self, id: &str) -> StoreResult<Option<SessionMeta>> {
            self.inner.get_session(id).await
        }
        async fn list_sessions(&self, limit: usize) -> StoreResult<Vec<SessionMeta>> {
            self.inner.list_sessions(limit).await
        }
        async fn delete_session(&self, id: &str) -> StoreResult<bool> {
            self.inner.delete_session(id).await
        }
        async fn append_messages(&self, id: &str, messages: &[HistoryItem]) -> StoreResult<()> {
            self.inner.append_messages(id, messages).await
        }
        async fn messages(&self, id: &str) -> StoreResult<Vec<HistoryItem>> {
            self.inner.messages(id).await
        }
        async fn append_event(&self, id: &str, seq: u64, event: &[u8]) -> StoreResult<()> {
            self.inner.append_event(id, seq, event).await
        }
        async fn events_since(&self, id: &str, since: u64) -> StoreResult<Vec<(u64, Vec<u8>)>> {
            self.inner.events_since(id, since).await
        }
        async fn last_seq(&self, id: &str) -> StoreResult<u64> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("connection reset".into()));
            }
            self.inner.last_seq(id).await
        }
        async fn try_lease_turn(&self, id: &str, owner: &str, ttl_ms: i64) -> StoreResult<bool> {
            self.inner.try_lease_turn(id, owner, ttl_ms).await
        }
        async fn release_turn(&self, id: &str, owner: &str) -> StoreResult<()> {
            self.inner.release_turn(id, owner).await
        }
        async fn lease(&self, id: &str) -> StoreResult<Option<omicos_sessionstore::Lease>> {
            self.inner.lease(id).await
        }
        async fn expired_leases(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
            self.inner.expired_leases(now_ms, limit).await
        }
        async fn add_grant(&self, id: &str, tool: &str) -> StoreResult<()> {
            self.inner.add_grant(id, tool).await
        }
        async fn grants(&self, id: &str) -> StoreResult<Vec<String>> {
            self.inner.grants(id).await
        }
        async fn put_approval(&self, id: &str, call_id: &str, owner: &str) -> StoreResult<()> {
            self.inner.put_approval(id, call_id, owner).await
        }
        async fn decide_approval(
            &self,
            id: &str,
            call_id: &str,
            decision: i32,
            rule: &str,
        ) -> StoreResult<bool> {
            self.inner
                .decide_approval(id, call_id, decision, rule)
                .await
        }
        async fn approval_decision(
            &self,
            id: &str,
            call_id: &str,
        ) -> StoreResult<Option<(i32, String)>> {
            self.inner.approval_decision(id, call_id).await
        }
        async fn clear_approval(&self, id: &str, call_id: &str) -> StoreResult<()> {
            self.inner.clear_approval(id, call_id).await
        }
        async fn request_cancel(&self, id: &str) -> StoreResult<Option<String>> {
            self.inner.request_cancel(id).await
        }
        async fn cancel_requested(&self, id: &str, owner: &str) -> StoreResult<bool> {
            self.inner.cancel_requested(id, owner).await
        }
        fn notices(&self) -> tokio::sync::broadcast::Receiver<omicos_sessionstore::Notice> {
            self.inner.notices()
        }
    }

    /// Creates session "s" in `store`.
    async fn put_s(store: &dyn SessionStore) {
        store
            .put_session(&SessionMeta {
                id: "s".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn an_unreadable_seq_is_an_error_never_a_restart_at_zero() {
        let store = Arc::new(SeqFails::default());
        put_s(store.as_ref()).await;
        for seq in 1..=3 {
            store.append_event("s", seq, b"").await.unwrap();
        }
        let hub = Hub::new(store.clone());
        store.broken.store(true, Ordering::SeqCst);
        let e = hub.state("s").await.err().expect("the seq cannot be read");
        assert!(matches!(e, OrchestratorError::Seq { .. }), "{e:?}");
        assert_eq!(e.kind().grpc_code(), tonic::Code::Unavailable);
        assert!(
            hub.existing("s").is_none(),
            "no state is kept with a guessed seq"
        );

        store.broken.store(false, Ordering::SeqCst);
        let st = hub.state("s").await.unwrap();
        assert_eq!(st.last_seq().await, 3);
        // Another replica wrote one more; a failed sync keeps the seq and says so.
        store.append_event("s", 4, b"").await.unwrap();
        store.broken.store(true, Ordering::SeqCst);
        assert!(st.sync_seq().await.is_err());
        assert_eq!(st.last_seq().await, 3);
        store.broken.store(false, Ordering::SeqCst);
        st.sync_seq().await.unwrap();
        assert_eq!(st.last_seq().await, 4);
    }

    #[tokio::test]
    async fn an_idle_session_is_dropped_and_rebuilt_from_the_store() {
        let store = Arc::new(MemoryStore::new());
        put_s(store.as_ref()).await;
        let hub = Arc::new(Hub::new(store.clone()));
        tokio::spawn(hub.clone().dispatch_notices());
        // Let the dispatcher subscribe before anything is announced.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let st = hub.state("s").await.unwrap();
        let rx = st.subscribe();
        // The turn task holds the session while the turn runs.
        let turn = st.clone();
        assert!(turn.start_turn(RunningTurn {
            turn_id: "t1".into(),
            cancel: CancellationToken::new(),
            lease_owner: "r:t1".into(),
            steer: Default::default(),
        }));
        assert_eq!(turn.emit(ChatEvent::default()).await, 1);
        turn.allow_for_session("shell").await;
        let decision = turn.wait_approval("c1", AskedCall::default()).await;
        drop((st, rx));
        assert_eq!(hub.live_sessions(), 1, "the running turn keeps it");

        // A decision made through the store (ApproveTool, any replica) reaches it.
        assert!(
            store
                .decide_approval("s", "c1", Decision::AllowOnce as i32, "")
                .await
                .unwrap()
        );
        let d = tokio::time::timeout(std::time::Duration::from_secs(5), decision)
            .await
            .expect("decided within 5 s")
            .unwrap();
        assert_eq!(d.decision, Decision::AllowOnce);
        assert_eq!(turn.emit_final(ChatEvent::default(), "t1").await, 2);
        drop(turn);

        // Idle: nothing of it is left on this replica, not even its entry.
        assert_eq!(hub.live_sessions(), 0);
        assert!(hub.existing("s").is_none());
        assert!(hub.sessions.lock().unwrap().is_empty());

        // Next use: rebuilt from the store, the seq continues, the grant holds.
        let again = hub.state("s").await.unwrap();
        assert_eq!(again.last_seq().await, 2);
        again.load_grants().await.unwrap();
        assert_eq!(again.allowed_tools(), ["shell"]);
        assert!(again.running().is_none());
        assert_eq!(again.emit(ChatEvent::default()).await, 3);
        let seqs: Vec<u64> = store
            .events_since("s", 0)
            .await
            .unwrap()
            .into_iter()
            .map(|(seq, _)| seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[tokio::test]
    async fn events_ready_together_are_one_append_with_consecutive_seqs() {
        let store = Arc::new(MemoryStore::new());
        put_s(store.as_ref()).await;
        let hub = Hub::new(store.clone());
        let st = hub.state("s").await.unwrap();
        let mut rx = st.subscribe();
        assert_eq!(st.emit(ChatEvent::default()).await, 1);
        let delta = |t: &str| ChatEvent {
            kind: Some(chat_event::Kind::TextDelta(omicos_proto::TextDelta {
                text: t.into(),
            })),
            ..Default::default()
        };
        assert_eq!(
            st.emit_many(vec![delta("a"), delta("b"), delta("c")]).await,
            4
        );
        assert_eq!(
            st.emit_many(vec![]).await,
            4,
            "nothing to emit takes no seq"
        );
        let sent: Vec<(u64, String)> = (0..4)
            .map(|_| {
                let e = rx.try_recv().unwrap();
                let text = match e.kind {
                    Some(chat_event::Kind::TextDelta(d)) => d.text,
                    _ => String::new(),
                };
                (e.event_seq, text)
            })
            .collect();
        assert_eq!(
            sent,
            [(1, ""), (2, "a"), (3, "b"), (4, "c")].map(|(q, t)| (q, t.to_owned()))
        );
        // What the client saw is what the log holds, byte for byte.
        let stored = store.events_since("s", 1).await.unwrap();
        assert_eq!(stored.len(), 3);
        for (q, bytes) in stored {
            let ev = ChatEvent::decode(bytes.as_slice()).unwrap();
            assert_eq!(ev.event_seq, q);
            assert_eq!(ev.session_id, "s");
        }
        // A group the store refuses is not sent and takes no seq.
        store.delete_session("s").await.unwrap();
        assert_eq!(st.emit_many(vec![delta("x"), delta("y")]).await, 4);
        assert_eq!(st.last_seq().await, 4);
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn an_event_the_store_refused_is_not_sent_and_takes_no_seq() {
        let store = Arc::new(MemoryStore::new());
        let hub = Hub::new(store.clone());
        // No such session in the store: every append fails.
        let st = hub.state("ghost").await.unwrap();
        let mut rx = st.subscribe();
        assert_eq!(st.emit(ChatEvent::default()).await, 0);
        assert_eq!(st.last_seq().await, 0);
        assert!(
            rx.try_recv().is_err(),
            "nothing that is not durable is published"
        );
    }

    #[test]
    fn a_steer_is_either_read_by_the_turn_or_refused() {
        let q = SteerQueue::default();
        assert!(q.push("a".into()));
        assert!(!q.close_if_empty(), "a message waits: the frame goes on");
        assert!(q.push("b".into()), "still open");
        assert_eq!(q.take(), ["a", "b"]);
        assert!(q.close_if_empty(), "nothing waits: closed");
        assert!(!q.push("late".into()), "refused once closed");
        assert!(q.take().is_empty());
        let r = SteerQueue::default();
        assert!(r.push("unread".into()));
        assert_eq!(r.close(), ["unread"], "what a stopped turn never read");
        assert!(!SteerQueue::closed().push("x".into()));
    }
}
