//! An in-process store.

use crate::{
    FileCheckpoint, HistoryItem, Lease, Notice, Notices, SessionMeta, SessionStore, StoreError,
    StoreResult, TurnMark, now_ms,
};
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
struct Entry {
    meta: SessionMeta,
    messages: Vec<HistoryItem>,
    events: Vec<Vec<u8>>,
    lease: Option<(String, i64)>,
    grants: BTreeSet<String>,
    /// call id → (owner, decision).
    approvals: HashMap<String, (String, Option<(i32, String)>)>,
    /// Owners of turns a cancel was requested for.
    cancels: BTreeSet<String>,
    /// Messages a rewind hid (kept, never read as history).
    rewound: Vec<HistoryItem>,
    /// Turn marks, each with whether it was rewound.
    turns: Vec<(TurnMark, bool)>,
    /// (turn id, change), the first change of a path per turn.
    checkpoints: Vec<(String, FileCheckpoint)>,
    /// The (session, turn) it was forked from.
    forked_from: Option<(String, String)>,
}

/// Keeps sessions in memory; lost when the process ends.
#[derive(Default)]
pub struct MemoryStore {
    sessions: Mutex<HashMap<String, Entry>>,
    notices: Notices,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn put_session(&self, meta: &SessionMeta) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s.entry(meta.id.clone()).or_default();
        // The owner is the creator's for good.
        let owner =
            (!e.meta.id.is_empty()).then(|| (e.meta.tenant.clone(), e.meta.subject.clone()));
        e.meta = meta.clone();
        if let Some((tenant, subject)) = owner {
            e.meta.tenant = tenant;
            e.meta.subject = subject;
        }
        Ok(())
    }
    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionMeta>> {
        Ok(self
            .sessions
            .lock()
            .unwrap()
            .get(id)
            .map(|e| e.meta.clone()))
    }
    async fn list_sessions(&self, limit: usize) -> StoreResult<Vec<SessionMeta>> {
        let s = self.sessions.lock().unwrap();
        let mut v: Vec<_> = s.values().map(|e| e.meta.clone()).collect();
        v.sort_by_key(|m| std::cmp::Reverse(m.last_active_ms));
        v.truncate(limit);
        Ok(v)
    }
    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        Ok(self.sessions.lock().unwrap().remove(id).is_some())
    }
    async fn append_messages(&self, id: &str, messages: &[HistoryItem]) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        e.messages.extend_from_slice(messages);
        e.meta.last_active_ms = now_ms();
        Ok(())
    }
    async fn messages(&self, id: &str) -> StoreResult<Vec<HistoryItem>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id).map(|e| e.messages.clone()).unwrap_or_default())
    }
    async fn append_event(&self, id: &str, seq: u64, event: &[u8]) -> StoreResult<()> {
        self.append_events(id, seq, vec![event.to_vec()]).await
    }
    async fn append_events(
        &self,
        id: &str,
        first_seq: u64,
        events: Vec<Vec<u8>>,
    ) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        if first_seq != e.events.len() as u64 + 1 {
            return Err(StoreError::Backend(format!(
                "event seq {first_seq} out of order (last {})",
                e.events.len()
            )));
        }
        let last = first_seq + events.len() as u64 - 1;
        e.events.extend(events);
        drop(s);
        self.notices.publish(Notice::Event {
            session: id.into(),
            seq: last,
        });
        Ok(())
    }
    async fn events_since(&self, id: &str, since: u64) -> StoreResult<Vec<(u64, Vec<u8>)>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id)
            .map(|e| {
                e.events
                    .iter()
                    .enumerate()
                    .skip(since as usize)
                    .map(|(i, b)| (i as u64 + 1, b.clone()))
                    .collect()
            })
            .unwrap_or_default())
    }
    async fn event_at(&self, id: &str, seq: u64) -> StoreResult<Option<Vec<u8>>> {
        let s = self.sessions.lock().unwrap();
        Ok(seq
            .checked_sub(1)
            .and_then(|i| s.get(id)?.events.get(usize::try_from(i).ok()?).cloned()))
    }
    async fn last_seq(&self, id: &str) -> StoreResult<u64> {
        Ok(self
            .sessions
            .lock()
            .unwrap()
            .get(id)
            .map(|e| e.events.len() as u64)
            .unwrap_or(0))
    }
    async fn try_lease_turn(&self, id: &str, owner: &str, ttl_ms: i64) -> StoreResult<bool> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        let now = now_ms();
        match &e.lease {
            Some((o, until)) if o != owner && *until > now => Ok(false),
            _ => {
                e.lease = Some((owner.into(), now + ttl_ms));
                Ok(true)
            }
        }
    }
    async fn release_turn(&self, id: &str, owner: &str) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        if let Some(e) = s.get_mut(id)
            && e.lease.as_ref().is_some_and(|(o, _)| o == owner)
        {
            e.lease = None;
            e.approvals.retain(|_, (o, _)| o != owner);
            e.cancels.remove(owner);
        }
        Ok(())
    }
    async fn lease(&self, id: &str) -> StoreResult<Option<Lease>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id).and_then(|e| {
            e.lease.as_ref().map(|(owner, expires_ms)| Lease {
                owner: owner.clone(),
                expires_ms: *expires_ms,
            })
        }))
    }
    async fn expired_leases(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let s = self.sessions.lock().unwrap();
        let mut v: Vec<String> = s
            .iter()
            .filter(|(_, e)| e.lease.as_ref().is_some_and(|(_, t)| *t <= now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        v.sort();
        v.truncate(limit);
        Ok(v)
    }
    async fn add_grant(&self, id: &str, tool: &str) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        e.grants.insert(tool.into());
        Ok(())
    }
    async fn grants(&self, id: &str) -> StoreResult<Vec<String>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id)
            .map(|e| e.grants.iter().cloned().collect())
            .unwrap_or_default())
    }
    async fn put_approval(&self, id: &str, call_id: &str, owner: &str) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        e.approvals.insert(call_id.into(), (owner.into(), None));
        Ok(())
    }
    async fn decide_approval(
        &self,
        id: &str,
        call_id: &str,
        decision: i32,
        rule: &str,
    ) -> StoreResult<bool> {
        let mut s = self.sessions.lock().unwrap();
        let Some(slot) = s.get_mut(id).and_then(|e| e.approvals.get_mut(call_id)) else {
            return Ok(false);
        };
        if slot.1.is_some() {
            return Ok(false);
        }
        slot.1 = Some((decision, rule.to_owned()));
        drop(s);
        self.notices.publish(Notice::Approval {
            session: id.into(),
            call_id: call_id.into(),
            decision,
            rule: rule.to_owned(),
        });
        Ok(true)
    }
    async fn approval_decision(
        &self,
        id: &str,
        call_id: &str,
    ) -> StoreResult<Option<(i32, String)>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id)
            .and_then(|e| e.approvals.get(call_id))
            .and_then(|(_, d)| d.clone()))
    }
    async fn clear_approval(&self, id: &str, call_id: &str) -> StoreResult<()> {
        if let Some(e) = self.sessions.lock().unwrap().get_mut(id) {
            e.approvals.remove(call_id);
        }
        Ok(())
    }
    async fn request_cancel(&self, id: &str) -> StoreResult<Option<String>> {
        let mut s = self.sessions.lock().unwrap();
        let Some(e) = s.get_mut(id) else {
            return Ok(None);
        };
        let owner = match &e.lease {
            Some((o, until)) if *until > now_ms() => o.clone(),
            _ => return Ok(None),
        };
        e.cancels.insert(owner.clone());
        drop(s);
        self.notices.publish(Notice::Cancel {
            session: id.into(),
            owner: owner.clone(),
        });
        Ok(Some(owner))
    }
    async fn cancel_requested(&self, id: &str, owner: &str) -> StoreResult<bool> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id).is_some_and(|e| e.cancels.contains(owner)))
    }
    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }
    async fn rename_session(&self, id: &str, title: &str) -> StoreResult<bool> {
        let mut s = self.sessions.lock().unwrap();
        Ok(s.get_mut(id)
            .map(|e| e.meta.title = title.to_owned())
            .is_some())
    }
    async fn mark_turn(&self, id: &str, mark: &TurnMark) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        e.turns.retain(|(m, _)| m.turn_id != mark.turn_id);
        e.turns.push((mark.clone(), false));
        Ok(())
    }
    async fn turns(&self, id: &str) -> StoreResult<Vec<TurnMark>> {
        let s = self.sessions.lock().unwrap();
        let mut v: Vec<TurnMark> = s
            .get(id)
            .map(|e| {
                e.turns
                    .iter()
                    .filter(|(_, rewound)| !rewound)
                    .map(|(m, _)| m.clone())
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|m| m.first_message);
        Ok(v)
    }
    async fn keep_file_changes(
        &self,
        id: &str,
        turn_id: &str,
        changes: &[FileCheckpoint],
    ) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        for c in changes {
            if !e
                .checkpoints
                .iter()
                .any(|(t, k)| t == turn_id && k.path == c.path)
            {
                e.checkpoints.push((turn_id.to_owned(), c.clone()));
            }
        }
        Ok(())
    }
    async fn file_checkpoints(
        &self,
        id: &str,
        turn_ids: &[String],
    ) -> StoreResult<Vec<(String, FileCheckpoint)>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id)
            .map(|e| {
                e.checkpoints
                    .iter()
                    .filter(|(t, _)| turn_ids.contains(t))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }
    async fn rewind(&self, id: &str, first_message: u64, turn_ids: &[String]) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let e = s
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.into()))?;
        let from = (first_message as usize).min(e.messages.len());
        let hidden: Vec<HistoryItem> = e.messages.drain(from..).collect();
        e.rewound.extend(hidden);
        for (m, rewound) in &mut e.turns {
            if turn_ids.contains(&m.turn_id) {
                *rewound = true;
            }
        }
        Ok(())
    }
    async fn fork_session(
        &self,
        parent: &str,
        turn_id: &str,
        meta: &SessionMeta,
        messages: &[HistoryItem],
    ) -> StoreResult<()> {
        let mut s = self.sessions.lock().unwrap();
        let p = s
            .get(parent)
            .ok_or_else(|| StoreError::NotFound(parent.into()))?;
        let turns: Vec<(TurnMark, bool)> = p
            .turns
            .iter()
            .filter(|(m, rewound)| !rewound && (m.first_message as usize) < messages.len())
            .map(|(m, _)| {
                let mut m = m.clone();
                m.first_seq = 0;
                (m, false)
            })
            .collect();
        let checkpoints = p
            .checkpoints
            .iter()
            .filter(|(t, _)| turns.iter().any(|(m, _)| &m.turn_id == t))
            .cloned()
            .collect();
        s.insert(
            meta.id.clone(),
            Entry {
                meta: meta.clone(),
                messages: messages.to_vec(),
                turns,
                checkpoints,
                forked_from: Some((parent.to_owned(), turn_id.to_owned())),
                ..Default::default()
            },
        );
        Ok(())
    }
    async fn forked_from(&self, id: &str) -> StoreResult<Option<(String, String)>> {
        let s = self.sessions.lock().unwrap();
        Ok(s.get(id).and_then(|e| e.forked_from.clone()))
    }
}
