//! The Compact RPC: compacts a session's context between turns, as
//! auto-compaction would. The session is held the way a turn holds it (the
//! running slot here, the lease in the store), so no turn runs meanwhile.

use super::OrchestratorService;
use super::guard::Owned;
use crate::error::OrchestratorError;
use crate::hub::RunningTurn;
use omicos_proto::{CompactResponse, Compaction};
use serde_json::json;
use tokio_util::sync::CancellationToken;

impl OrchestratorService {
    /// Compact: summarizes the session's oldest messages into a marker.
    pub(super) async fn compact_rpc(
        &self,
        owned: &Owned,
    ) -> Result<CompactResponse, OrchestratorError> {
        let id = owned.id().to_owned();
        let store = self.hub.store();
        // Re-read: the guard's copy may predate a turn that changed the team.
        let meta = store
            .get_session(&id)
            .await?
            .ok_or_else(|| OrchestratorError::SessionNotFound(id.clone()))?;
        let state = self.hub.state(&id).await?;
        let hold = format!("compact-{}", uuid::Uuid::new_v4().simple());
        let owner = format!("{}:{hold}", self.instance);
        if !state.start_turn(RunningTurn {
            turn_id: hold.clone(),
            cancel: CancellationToken::new(),
            lease_owner: owner.clone(),
            steer: std::sync::Arc::new(crate::hub::SteerQueue::closed()),
        }) {
            return Err(OrchestratorError::SessionBusy(id));
        }
        let lease_ms = self.engine.config.turn_lease.as_millis() as i64;
        let result = match store.try_lease_turn(&id, &owner, lease_ms).await {
            Ok(true) => {
                let r = self
                    .compact_held(&id, &meta.team_members, &meta.agent)
                    .await;
                let _ = store.release_turn(&id, &owner).await;
                r
            }
            Ok(false) => Err(OrchestratorError::SessionBusy(id.clone())),
            Err(e) => Err(e.into()),
        };
        state.end_turn(&hold);
        result
    }

    async fn compact_held(
        &self,
        id: &str,
        team: &[String],
        agent: &str,
    ) -> Result<CompactResponse, OrchestratorError> {
        let store = self.hub.store();
        let history = store
            .messages(id)
            .await
            .map_err(|source| OrchestratorError::History {
                session: id.to_owned(),
                source,
            })?;
        // The active agent's prompt counts toward the request's size.
        let system = self
            .engine
            .agents
            .profile_in_team(team, agent)
            .map(|p| p.system_prompt)
            .unwrap_or_default();
        match self
            .engine
            .compact_session(id, &history, &system, &[])
            .await?
        {
            Some(c) => {
                store
                    .append_messages(id, std::slice::from_ref(&c.marker))
                    .await?;
                self.engine
                    .trajectories
                    .append(
                        id,
                        json!({"type": "compaction", "trigger": "manual",
                               "tokens_before": c.event.tokens_before, "tokens_after": c.event.tokens_after,
                               "messages_summarized": c.event.messages_summarized}),
                    )
                    .await;
                Ok(CompactResponse {
                    compaction: Some(c.event),
                })
            }
            None => Ok(CompactResponse {
                compaction: Some(Compaction {
                    trigger: "manual".into(),
                    ..Default::default()
                }),
            }),
        }
    }
}
