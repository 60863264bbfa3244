//! A conversation store that fails on demand: a real store underneath, and
//! chosen operations answering a chosen [`StoreError`] until cleared, so a
//! test can show what the orchestrator does when the store breaks mid-session.

use async_trait::async_trait;
use omicos_sessionstore::{HistoryItem, SessionMeta, SessionStore, StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A store operation that can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `messages` (the history).
    Messages,
    /// `last_seq`.
    LastSeq,
    /// `events_since` (the log).
    EventsSince,
    /// `try_lease_turn` answers that another owner holds the lease (as
    /// when another replica took over a turn this one still runs); the
    /// error given is ignored.
    LeaseTaken,
}

/// Wraps a store; see the module doc.
pub struct FlakyStore {
    inner: Arc<dyn SessionStore>,
    failing: Mutex<HashMap<Op, StoreError>>,
}

impl FlakyStore {
    /// Over `inner`, failing nothing yet.
    pub fn new(inner: Arc<dyn SessionStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            failing: Mutex::new(HashMap::new()),
        })
    }

    /// From now on `op` answers `error`.
    pub fn fail(&self, op: Op, error: StoreError) {
        self.failing.lock().unwrap().insert(op, error);
    }

    /// `op` works again.
    pub fn heal(&self, op: Op) {
        self.failing.lock().unwrap().remove(&op);
    }

    fn check(&self, op: Op) -> StoreResult<()> {
        match self.failing.lock().unwrap().get(&op) {
            Some(StoreError::NotFound(id)) => Err(StoreError::NotFound(id.clone())),
            Some(StoreError::Backend(m)) => Err(StoreError::Backend(m.clone())),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl SessionStore for FlakyStore {
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
        self.check(Op::Messages)?;
        self.inner.messages(id).await
    }
    async fn append_event(&self, id: &str, seq: u64, event: &[u8]) -> StoreResult<()> {
        self.inner.append_event(id, seq, event).await
    }
    async fn events_since(&self, id: &str, since: u64) -> StoreResult<Vec<(u64, Vec<u8>)>> {
        self.check(Op::EventsSince)?;
        self.inner.events_since(id, since).await
    }
    /// One event of the log: fails with the log's reads.
    async fn event_at(&self, id: &str, seq: u64) -> StoreResult<Option<Vec<u8>>> {
        self.check(Op::EventsSince)?;
        self.inner.event_at(id, seq).await
    }
    async fn last_seq(&self, id: &str) -> StoreResult<u64> {
        self.check(Op::LastSeq)?;
        self.inner.last_seq(id).await
    }
    async fn try_lease_turn(&self, id: &str, owner: &str, ttl_ms: i64) -> StoreResult<bool> {
        if self.failing.lock().unwrap().contains_key(&Op::LeaseTaken) {
            return Ok(false);
        }
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
    async fn rename_session(&self, id: &str, title: &str) -> StoreResult<bool> {
        self.inner.rename_session(id, title).await
    }
    async fn mark_turn(&self, id: &str, mark: &omicos_sessionstore::TurnMark) -> StoreResult<()> {
        self.inner.mark_turn(id, mark).await
    }
    async fn turns(&self, id: &str) -> StoreResult<Vec<omicos_sessionstore::TurnMark>> {
        self.inner.turns(id).await
    }
    async fn keep_file_changes(
        &self,
        id: &str,
        turn_id: &str,
        changes: &[omicos_sessionstore::FileCheckpoint],
    ) -> StoreResult<()> {
        self.inner.keep_file_changes(id, turn_id, changes).await
    }
    async fn file_checkpoints(
        &self,
        id: &str,
        turn_ids: &[String],
    ) -> StoreResult<Vec<(String, omicos_sessionstore::FileCheckpoint)>> {
        self.inner.file_checkpoints(id, turn_ids).await
    }
    async fn rewind(&self, id: &str, first_message: u64, turn_ids: &[String]) -> StoreResult<()> {
        self.inner.rewind(id, first_message, turn_ids).await
    }
    async fn fork_session(
        &self,
        parent: &str,
        turn_id: &str,
        meta: &SessionMeta,
        messages: &[HistoryItem],
    ) -> StoreResult<()> {
        self.inner
            .fork_session(parent, turn_id, meta, messages)
            .await
    }
    async fn forked_from(&self, id: &str) -> StoreResult<Option<(String, String)>> {
        self.inner.forked_from(id).await
    }
}
