//! ForkSession, RewindSession and RenameSession.
//!
//! A turn's place in the history is its mark (`TurnMark`, written when
//! its user message is), and what its file tools overwrote is its
//! checkpoint (engine::checkpoint). A rewind hides the history from the
//! first rewound turn's mark on (the store keeps the rows, and the event
//! log keeps every event, with a `Rewound` event after them) and writes the
//! checkpoints back through the runner's RestoreFiles. A fork copies the
//! history up to the end of a turn into a new session of the same owner.
//!
//! Both hold the session as a turn does (the running slot here, the lease
//! in the store), so they are refused while a turn runs on any replica,
//! and no turn starts while they work.

use super::OrchestratorService;
use super::guard::Owned;
use crate::error::OrchestratorError;
use crate::hub::{RunningTurn, SessionState};
use crate::runner_client::EventTag;
use omicos_history::HistoryItem;
use omicos_proto::{
    ForkSessionRequest, ForkSessionResponse, RenameSessionResponse, RestoreFile,
    RewindSessionRequest, RewindSessionResponse, Rewound, chat_event, fork_session_request,
    rewind_session_request,
};
use omicos_sessionstore::{FileCheckpoint, SessionMeta, TurnMark};
use prost::Message;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The longest title, in characters after trimming.
pub const MAX_TITLE_CHARS: usize = 200;

/// The session held for a fork or a rewind.
struct Held {
    state: Arc<SessionState>,
    hold: String,
    owner: String,
}

/// What a restore writes back, and the paths it cannot (their prior
/// content was larger than the runner keeps).
#[derive(Debug, Default, PartialEq)]
struct RestorePlan {
    files: Vec<RestoreFile>,
    not_restorable: Vec<String>,
}

impl OrchestratorService {
    /// RenameSession: sets the title ListSessions shows.
    pub(super) async fn rename_session_rpc(
        &self,
        owned: &Owned,
        title: &str,
    ) -> Result<RenameSessionResponse, OrchestratorError> {
        let title = title.trim();
        let n = title.chars().count();
        if n == 0 || n > MAX_TITLE_CHARS {
            return Err(OrchestratorError::InvalidArgument(format!(
                "title must be 1 to {MAX_TITLE_CHARS} characters after trimming; it has {n}"
            )));
        }
        if !self.hub.store().rename_session(owned.id(), title).await? {
            return Err(OrchestratorError::SessionNotFound(owned.id().to_owned()));
        }
        Ok(RenameSessionResponse {})
    }

    /// RewindSession: takes the last turns out of what the model sees and
    /// restores the files their file tools changed.
    pub(super) async fn rewind_session_rpc(
        &self,
        owned: &Owned,
        req: RewindSessionRequest,
    ) -> Result<RewindSessionResponse, OrchestratorError> {
        let held = self.hold(owned.id(), "rewind").await?;
        let r = self.rewind_held(owned, &held, req).await;
        self.release(owned.id(), held).await;
        r
    }

    /// ForkSession: a new session of the same owner with the history up to
    /// the end of a turn.
    pub(super) async fn fork_session_rpc(
        &self,
        owned: &Owned,
        req: ForkSessionRequest,
    ) -> Result<ForkSessionResponse, OrchestratorError> {
        let held = self.hold(owned.id(), "fork").await?;
        let r = self.fork_held(owned, req).await;
        self.release(owned.id(), held).await;
        r
    }

    async fn rewind_held(
        &self,
        owned: &Owned,
        held: &Held,
        req: RewindSessionRequest,
    ) -> Result<RewindSessionResponse, OrchestratorError> {
        let id = owned.id();
        let store = self.hub.store();
        let turns = store.turns(id).await?;
        let from = match req.to {
            Some(rewind_session_request::To::LastTurns(0)) => {
                return Err(OrchestratorError::InvalidArgument(
                    "last_turns must be at least 1".into(),
                ));
            }
            Some(rewind_session_request::To::LastTurns(n)) => {
                let n = n as usize;
                if n > turns.len() {
                    return Err(OrchestratorError::InvalidArgument(format!(
                        "last_turns is {n}, but session `{id}` has {} turn{} in its history",
                        turns.len(),
                        if turns.len() == 1 { "" } else { "s" }
                    )));
                }
                turns.len() - n
            }
            Some(rewind_session_request::To::TurnId(t)) => position(&turns, &t, id)?,
            None => {
                return Err(OrchestratorError::InvalidArgument(
                    "say what to rewind: last_turns (1: the last turn) or turn_id".into(),
                ));
            }
        };
        let removed = &turns[from..];
        let turn_ids: Vec<String> = removed.iter().map(|m| m.turn_id.clone()).collect();
        let first = removed[0].first_message;
        let history = self.history(id).await?;
        let first_message = match history.get(first as usize) {
            Some(HistoryItem::User(u)) => u.content.clone(),
            _ => String::new(),
        };
        let (files_restored, not_restorable) = if req.keep_files {
            (vec![], vec![])
        } else {
            self.restore(owned, &turn_ids).await?
        };
        store.rewind(id, first, &turn_ids).await?;
        let tag = EventTag {
            turn_id: held.hold.clone(),
            context: "root".into(),
            agent_id: owned.meta().agent.clone(),
        };
        let event_seq = held
            .state
            .emit(tag.event(chat_event::Kind::Rewound(Rewound {
                turn_ids: turn_ids.clone(),
                files_restored: files_restored.clone(),
                files_not_restored: not_restorable.clone(),
            })))
            .await;
        self.engine
            .trajectories
            .append(
                id,
                json!({"type": "rewind", "turn_ids": turn_ids, "files_restored": files_restored,
                       "files_not_restored": not_restorable, "event_seq": event_seq}),
            )
            .await;
        Ok(RewindSessionResponse {
            turn_ids,
            files_restored,
            first_message,
            event_seq,
            files_not_restored: not_restorable,
        })
    }

    async fn fork_held(
        &self,
        owned: &Owned,
        req: ForkSessionRequest,
    ) -> Result<ForkSessionResponse, OrchestratorError> {
        let id = owned.id();
        let store = self.hub.store();
        let parent = store
            .get_session(id)
            .await?
            .ok_or_else(|| OrchestratorError::SessionNotFound(id.to_owned()))?;
        let turns = store.turns(id).await?;
        // The index of the last turn the fork holds (None: no turn at all).
        let last = match req.at {
            Some(fork_session_request::At::TurnId(t)) => Some(position(&turns, &t, id)?),
            Some(fork_session_request::At::EventSeq(seq)) => {
                let t = self.turn_of_event(id, seq).await?;
                Some(position(&turns, &t, id).map_err(|_| {
                    OrchestratorError::TurnNotFound(format!(
                        "event {seq} of session `{id}` belongs to turn `{t}`, which is not in its history (rewound, or not a turn)"
                    ))
                })?)
            }
            None => turns.len().checked_sub(1),
        };
        let history = self.history(id).await?;
        let cut = match last {
            Some(i) => turns
                .get(i + 1)
                .map_or(history.len(), |next| next.first_message as usize),
            None => history.len(),
        }
        .min(history.len());
        let at_turn = last.map(|i| turns[i].turn_id.clone()).unwrap_or_default();
        let after: Vec<String> = match last {
            Some(i) => turns[i + 1..].iter().map(|m| m.turn_id.clone()).collect(),
            None => vec![],
        };
        // The files first: a refused restore leaves no fork behind.
        let files_copied = if req.copy_files && !after.is_empty() {
            self.restore(owned, &after).await?.0
        } else {
            vec![]
        };
        let now = omicos_proto::now_ms();
        let meta = SessionMeta {
            id: uuid::Uuid::new_v4().to_string(),
            title: fork_title(&parent.title),
            agent: parent.agent.clone(),
            team_members: parent.team_members.clone(),
            created_ms: now,
            last_active_ms: now,
            tenant: parent.tenant.clone(),
            subject: parent.subject.clone(),
        };
        store
            .fork_session(id, &at_turn, &meta, &history[..cut])
            .await?;
        self.engine
            .trajectories
            .append(
                &meta.id,
                json!({"type": "fork", "parent": id, "turn_id": at_turn, "messages": cut,
                       "files_copied": files_copied}),
            )
            .await;
        Ok(ForkSessionResponse {
            session_id: meta.id,
            messages: cut as u32,
            turns: last.map_or(0, |i| i + 1) as u32,
            files_copied,
        })
    }

    /// Writes back what the file tools of `turn_ids` overwrote (for each
    /// path, the prior content of the earliest of these turns that changed
    /// it); the paths restored and those that could not be.
    async fn restore(
        &self,
        owned: &Owned,
        turn_ids: &[String],
    ) -> Result<(Vec<String>, Vec<String>), OrchestratorError> {
        let checkpoints = self
            .hub
            .store()
            .file_checkpoints(owned.id(), turn_ids)
            .await?;
        let plan = restore_plan(turn_ids, checkpoints);
        if plan.files.is_empty() {
            return Ok((vec![], plan.not_restorable));
        }
        let restored = self
            .engine
            .runner
            .restore_files(owned.id(), owned.principal(), plan.files)
            .await?;
        Ok((restored, plan.not_restorable))
    }

    /// The history the model sees.
    async fn history(&self, id: &str) -> Result<Vec<HistoryItem>, OrchestratorError> {
        self.hub
            .store()
            .messages(id)
            .await
            .map_err(|source| OrchestratorError::History {
                session: id.to_owned(),
                source,
            })
    }

    /// The turn the event `seq` of the session's log belongs to.
    async fn turn_of_event(&self, id: &str, seq: u64) -> Result<String, OrchestratorError> {
        let missing =
            || OrchestratorError::TurnNotFound(format!("session `{id}` has no event {seq}"));
        if seq == 0 {
            return Err(missing());
        }
        let events = self.hub.store().events_since(id, seq - 1).await?;
        let (got, body) = events.first().ok_or_else(missing)?;
        if *got != seq {
            return Err(missing());
        }
        let ev = omicos_proto::ChatEvent::decode(body.as_slice()).map_err(|e| {
            OrchestratorError::Store(omicos_sessionstore::StoreError::Backend(format!(
                "event {seq} of session `{id}` is not a ChatEvent: {e}"
            )))
        })?;
        Ok(ev.turn_id)
    }

    /// Holds the session as a turn does; SessionBusy while a turn (or
    /// another fork, rewind or compaction) holds it on any replica.
    async fn hold(&self, id: &str, what: &str) -> Result<Held, OrchestratorError> {
        let state = self.hub.state(id).await?;
        let hold = format!("{what}-{}", uuid::Uuid::new_v4().simple());
        let owner = format!("{}:{hold}", self.instance);
        if !state.start_turn(RunningTurn {
            turn_id: hold.clone(),
            cancel: CancellationToken::new(),
            lease_owner: owner.clone(),
            steer: Arc::new(crate::hub::SteerQueue::closed()),
        }) {
            return Err(OrchestratorError::SessionBusy(id.to_owned()));
        }
        let lease_ms = self.engine.config.turn_lease.as_millis() as i64;
        match self.hub.store().try_lease_turn(id, &owner, lease_ms).await {
            Ok(true) => Ok(Held { state, hold, owner }),
            Ok(false) => {
                state.end_turn(&hold);
                Err(OrchestratorError::SessionBusy(id.to_owned()))
            }
            Err(e) => {
                state.end_turn(&hold);
                Err(e.into())
            }
        }
    }

    async fn release(&self, id: &str, held: Held) {
        if let Err(e) = self.hub.store().release_turn(id, &held.owner).await {
            tracing::warn!(session = %id, error = %e, "lease not released (it expires on its own)");
        }
        held.state.end_turn(&held.hold);
    }
}

/// The index of turn `t` among `turns`, or TurnNotFound.
fn position(turns: &[TurnMark], t: &str, id: &str) -> Result<usize, OrchestratorError> {
    turns.iter().position(|m| m.turn_id == t).ok_or_else(|| {
        OrchestratorError::TurnNotFound(format!(
            "turn `{t}` is not in the history of session `{id}` (unknown, rewound already, or from before turns were recorded)"
        ))
    })
}

/// A fork's title: the parent's with " (fork)", within [`MAX_TITLE_CHARS`].
fn fork_title(parent: &str) -> String {
    const SUFFIX: &str = " (fork)";
    let keep = MAX_TITLE_CHARS - SUFFIX.chars().count();
    let base: String = parent.trim().chars().take(keep).collect();
    format!("{base}{SUFFIX}")
}

/// For each path, the checkpoint of the earliest turn (in `turn_ids`
/// order) that changed it: what it held before all of them.
fn restore_plan(turn_ids: &[String], checkpoints: Vec<(String, FileCheckpoint)>) -> RestorePlan {
    let order: HashMap<&str, usize> = turn_ids
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut earliest: HashMap<String, (usize, FileCheckpoint)> = HashMap::new();
    for (turn, c) in checkpoints {
        let Some(&i) = order.get(turn.as_str()) else {
            continue;
        };
        match earliest.get(&c.path) {
            Some((j, _)) if *j <= i => {}
            _ => {
                earliest.insert(c.path.clone(), (i, c));
            }
        }
    }
    let mut chosen: Vec<FileCheckpoint> = earliest.into_values().map(|(_, c)| c).collect();
    chosen.sort_by(|a, b| a.path.cmp(&b.path));
    let mut plan = RestorePlan::default();
    for c in chosen {
        if c.too_large {
            plan.not_restorable.push(c.path);
        } else {
            plan.files.push(RestoreFile {
                path: c.path,
                remove: c.created,
                content: c.prior,
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(path: &str, prior: &str, created: bool) -> FileCheckpoint {
        FileCheckpoint {
            path: path.into(),
            created,
            too_large: false,
            prior: prior.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_earliest_rewound_turn_decides_what_a_path_gets_back() {
        let turns = vec!["t1".to_string(), "t2".to_string()];
        let plan = restore_plan(
            &turns,
            vec![
                ("t2".into(), cp("a", "after t1", false)),
                ("t1".into(), cp("a", "before t1", false)),
                ("t2".into(), cp("new", "", true)),
                ("t0".into(), cp("old", "not rewound", false)),
                (
                    "t1".into(),
                    FileCheckpoint {
                        path: "big".into(),
                        too_large: true,
                        ..Default::default()
                    },
                ),
            ],
        );
        assert_eq!(plan.not_restorable, ["big"]);
        assert_eq!(plan.files.len(), 2);
        assert_eq!(
            (
                plan.files[0].path.as_str(),
                plan.files[0].content.as_slice()
            ),
            ("a", &b"before t1"[..])
        );
        assert!(plan.files[1].remove && plan.files[1].path == "new");
    }

    #[test]
    fn a_fork_title_stays_within_the_limit() {
        assert_eq!(fork_title("plan"), "plan (fork)");
        assert_eq!(
            fork_title(&"x".repeat(300)).chars().count(),
            MAX_TITLE_CHARS
        );
    }
}
