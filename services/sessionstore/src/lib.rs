//! The conversation store: a session's metadata, its history (one
//! [`HistoryItem`] a message, stored as its JSON),
//! and its event log keyed by the gap-free `event_seq`, so that `Attach` works
//! after a restart and any orchestrator replica can serve any session.
//!
//! [`MemoryStore`] keeps everything in process (tests, embedded use without
//! persistence). [`SqlStore`] keeps it in SQLite (the default, one node) or
//! PostgreSQL (replicas sharing sessions). [`open`] picks one from a URL.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use omicos_history::HistoryItem;

pub mod memory;
pub mod notice;
pub mod sql;
pub use memory::MemoryStore;
pub use notice::{Notice, Notices};
pub use sql::{SqlStore, default_url};

use std::sync::Arc;

/// Opens the store named by `url`: `memory:` (in process, lost on exit),
/// `sqlite://PATH` or `postgres://USER@HOST/DB`. SQL stores run their
/// migrations before this returns.
pub async fn open(url: &str) -> Result<Arc<dyn SessionStore>, StoreError> {
    if url == "memory:" || url == "memory://" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    Ok(Arc::new(SqlStore::open(url).await?))
}

/// A session's metadata.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SessionMeta {
    /// The id.
    pub id: String,
    /// A title (the first user message, shortened).
    pub title: String,
    /// The active agent.
    pub agent: String,
    /// The team.
    pub team_members: Vec<String>,
    /// Unix ms.
    pub created_ms: i64,
    /// Unix ms.
    pub last_active_ms: i64,
    /// The tenant of the principal that created it; fixed at creation
    /// (`put_session` never changes it). Sessions from before ownership: `default`.
    pub tenant: String,
    /// The subject of the principal that created it; fixed at creation.
    /// Sessions from before ownership: `local`, the laptop's principal.
    pub subject: String,
}

/// Where a turn starts in its session: RewindSession and ForkSession cut
/// the history at these marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnMark {
    /// The turn id.
    pub turn_id: String,
    /// The index, in the history the model sees, of the turn's first
    /// message (its user message). Rewind hides a suffix of that history,
    /// so a live turn's index never moves.
    pub first_message: u64,
    /// The seq of the event the turn started at (0: a turn copied by a
    /// fork, whose events are in the parent's log).
    pub first_seq: u64,
}

/// A path a file tool changed in a turn, with what it held before the
/// turn's first change of it (the turn's checkpoint).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileCheckpoint {
    /// Workspace-relative path.
    pub path: String,
    /// The path did not exist before the turn (a restore removes it).
    pub created: bool,
    /// The prior content was larger than the runner keeps: not restorable.
    pub too_large: bool,
    /// The prior content (empty when created or too large).
    pub prior: Vec<u8>,
}

/// A session's turn lease: who holds the turn, until when (unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The owner (`<replica>:<turn id>`).
    pub owner: String,
    /// When it expires unless renewed.
    pub expires_ms: i64,
}

impl Lease {
    /// The turn id part of the owner (after the last `:`).
    pub fn turn_id(&self) -> &str {
        self.owner.rsplit(':').next().unwrap_or_default()
    }
}

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The session does not exist.
    #[error("session {0} not found")]
    NotFound(String),
    /// The backend failed.
    #[error("conversation store: {0}")]
    Backend(String),
}

/// Result alias.
pub type StoreResult<T> = Result<T, StoreError>;

/// The conversation store. Every write is atomic: a crash loses at most the
/// write in progress.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Creates a session (error if it exists is not required: upsert metadata).
    async fn put_session(&self, meta: &SessionMeta) -> StoreResult<()>;
    /// A session's metadata.
    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionMeta>>;
    /// Sessions, most recently active first.
    async fn list_sessions(&self, limit: usize) -> StoreResult<Vec<SessionMeta>>;
    /// The sessions of one owner (tenant and subject), most recently active first.
    /// The default filters [`SessionStore::list_sessions`] (a store with many
    /// owners should answer it with an index, as the SQL store does).
    async fn list_sessions_of(
        &self,
        tenant: &str,
        subject: &str,
        limit: usize,
    ) -> StoreResult<Vec<SessionMeta>> {
        let mut v = self.list_sessions(usize::MAX).await?;
        v.retain(|m| m.tenant == tenant && m.subject == subject);
        v.truncate(limit);
        Ok(v)
    }
    /// Deletes a session with its messages and events. False if it did not exist.
    async fn delete_session(&self, id: &str) -> StoreResult<bool>;
    /// Appends messages and bumps last_active.
    async fn append_messages(&self, id: &str, messages: &[HistoryItem]) -> StoreResult<()>;
    /// All messages of a session, in order.
    async fn messages(&self, id: &str) -> StoreResult<Vec<HistoryItem>>;
    /// Appends one event. `seq` must be last_seq + 1; otherwise an error.
    async fn append_event(&self, id: &str, seq: u64, event: &[u8]) -> StoreResult<()>;
    /// Appends events with consecutive seqs from `first_seq` (which must be
    /// last_seq + 1), all or none: one write where the store can (the SQL
    /// store's writer puts them in one batch). The default appends them one
    /// by one, so a failure part-way leaves the first ones written: stores
    /// that can do better override it.
    async fn append_events(
        &self,
        id: &str,
        first_seq: u64,
        events: Vec<Vec<u8>>,
    ) -> StoreResult<()> {
        for (i, e) in events.iter().enumerate() {
            self.append_event(id, first_seq + i as u64, e).await?;
        }
        Ok(())
    }
    /// Events with seq > since, in order.
    async fn events_since(&self, id: &str, since: u64) -> StoreResult<Vec<(u64, Vec<u8>)>>;
    /// The event with this seq (None: the session has none, or no such
    /// session). The default reads [`SessionStore::events_since`] and keeps
    /// the first; the stores read the one row by its key.
    async fn event_at(&self, id: &str, seq: u64) -> StoreResult<Option<Vec<u8>>> {
        if seq == 0 {
            return Ok(None);
        }
        Ok(self
            .events_since(id, seq - 1)
            .await?
            .into_iter()
            .next()
            .filter(|(s, _)| *s == seq)
            .map(|(_, body)| body))
    }
    /// The latest event seq (0 when none).
    async fn last_seq(&self, id: &str) -> StoreResult<u64>;
    /// Takes the session's turn lease for `owner` for `ttl_ms`; false if another owner holds a live lease.
    async fn try_lease_turn(&self, id: &str, owner: &str, ttl_ms: i64) -> StoreResult<bool>;
    /// [`put_session`](SessionStore::put_session) then
    /// [`try_lease_turn`](SessionStore::try_lease_turn) for `meta.id`, as
    /// one write where the store can: a turn on a session made for it (its
    /// id drawn just now) starts with both. The SQL store writes a new
    /// session and its lease in one statement (PostgreSQL) or one job of
    /// its writer (SQLite), and a session that was already there as the two
    /// calls would.
    async fn create_leased_session(
        &self,
        meta: &SessionMeta,
        owner: &str,
        ttl_ms: i64,
    ) -> StoreResult<bool> {
        self.put_session(meta).await?;
        self.try_lease_turn(&meta.id, owner, ttl_ms).await
    }
    /// Releases the lease if `owner` holds it, with the approvals and cancel
    /// requests of that turn.
    async fn release_turn(&self, id: &str, owner: &str) -> StoreResult<()>;

    // Session state that must outlive a replica (issue 13): the lease row, grants,
    // pending approvals, cancel requests, and the notices that wake the replica
    // that must act on them.

    /// The session's lease row, live or expired (None: no turn holds it).
    async fn lease(&self, id: &str) -> StoreResult<Option<Lease>>;
    /// Sessions whose lease expired at or before `now_ms`: the replica that ran
    /// their turn stopped renewing it (it was lost, or its release failed).
    async fn expired_leases(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>>;
    /// Records an allow-for-session grant of `tool`.
    async fn add_grant(&self, id: &str, tool: &str) -> StoreResult<()>;
    /// The session's allow-for-session grants, sorted.
    async fn grants(&self, id: &str) -> StoreResult<Vec<String>>;
    /// Records that the turn held by `owner` waits for a decision on `call_id`.
    async fn put_approval(&self, id: &str, call_id: &str, owner: &str) -> StoreResult<()>;
    /// Records a decision for a pending, undecided approval, with the allow
    /// rule it was answered with (empty: none), and announces it
    /// ([`Notice::Approval`]); false when no such approval is pending.
    async fn decide_approval(
        &self,
        id: &str,
        call_id: &str,
        decision: i32,
        rule: &str,
    ) -> StoreResult<bool>;
    /// The decision recorded for a pending approval and its rule (None:
    /// pending and undecided, or unknown).
    async fn approval_decision(
        &self,
        id: &str,
        call_id: &str,
    ) -> StoreResult<Option<(i32, String)>>;
    /// Forgets a pending approval (answered, or the runner stopped waiting).
    async fn clear_approval(&self, id: &str, call_id: &str) -> StoreResult<()>;
    /// Records a cancel request for the turn holding the session's live lease
    /// and announces it ([`Notice::Cancel`]). Returns that turn's lease owner;
    /// None when no live turn holds the session.
    async fn request_cancel(&self, id: &str) -> StoreResult<Option<String>>;
    /// Whether a cancel was requested for the turn held by `owner`.
    async fn cancel_requested(&self, id: &str, owner: &str) -> StoreResult<bool>;
    /// A subscriber to this store's notices (events appended, approvals
    /// decided, cancels requested), from every replica on the store.
    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice>;

    // Turns, checkpoints, rewind and fork (issue 40). The defaults answer
    // that the store keeps none: a wrapper forwards them.

    /// Sets a session's title; false when the session does not exist.
    async fn rename_session(&self, id: &str, title: &str) -> StoreResult<bool> {
        let Some(mut meta) = self.get_session(id).await? else {
            return Ok(false);
        };
        meta.title = title.to_owned();
        self.put_session(&meta).await?;
        Ok(true)
    }
    /// Records where a turn starts (written when the turn's user message is).
    async fn mark_turn(&self, id: &str, mark: &TurnMark) -> StoreResult<()> {
        let _ = (id, mark);
        Err(no_checkpoints())
    }
    /// The session's turns still in its history (not rewound), oldest first.
    async fn turns(&self, id: &str) -> StoreResult<Vec<TurnMark>> {
        let _ = id;
        Err(no_checkpoints())
    }
    /// Adds a tool call's file changes to its turn's checkpoint; a path
    /// already there keeps its first prior content.
    async fn keep_file_changes(
        &self,
        id: &str,
        turn_id: &str,
        changes: &[FileCheckpoint],
    ) -> StoreResult<()> {
        let _ = (id, turn_id, changes);
        Err(no_checkpoints())
    }
    /// The checkpoints of these turns, as (turn id, change), in no
    /// particular order.
    async fn file_checkpoints(
        &self,
        id: &str,
        turn_ids: &[String],
    ) -> StoreResult<Vec<(String, FileCheckpoint)>> {
        let _ = (id, turn_ids);
        Err(no_checkpoints())
    }
    /// Takes `turn_ids` out of the history the model sees: every message
    /// from index `first_message` on is hidden (kept in the store, never
    /// read by [`SessionStore::messages`] again) and the turns' marks are
    /// set aside, in one write.
    async fn rewind(&self, id: &str, first_message: u64, turn_ids: &[String]) -> StoreResult<()> {
        let _ = (id, first_message, turn_ids);
        Err(no_checkpoints())
    }
    /// Creates `meta` (a new session) holding `messages` (the parent's
    /// history up to the fork point), with the parent's marks and
    /// checkpoints of the turns that start before `messages.len()`, and
    /// records that it was forked from (`parent`, `turn_id`).
    async fn fork_session(
        &self,
        parent: &str,
        turn_id: &str,
        meta: &SessionMeta,
        messages: &[HistoryItem],
    ) -> StoreResult<()> {
        let _ = (parent, turn_id, meta, messages);
        Err(no_checkpoints())
    }
    /// The (session, turn) a session was forked from, if it was.
    async fn forked_from(&self, id: &str) -> StoreResult<Option<(String, String)>> {
        let _ = id;
        Ok(None)
    }
}

fn no_checkpoints() -> StoreError {
    StoreError::Backend("this conversation store keeps no turn checkpoints".into())
}

pub use omicos_proto::now_ms;
