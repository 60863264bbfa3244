//! Session RPCs: ListSessions, GetSession, DeleteSession, and the
//! out-of-band turn controls CancelTurn and ApproveTool.

use super::OrchestratorService;
use super::guard::Owned;
use crate::error::OrchestratorError;
use omicos_proto::{
    ApproveToolRequest, ApproveToolResponse, CancelTurnResponse, Decision, DeleteSessionResponse,
    ListSessionsRequest, ListSessionsResponse, Session, SessionSummary,
};
use omicos_sessionstore::{SessionMeta, SessionStore};

impl OrchestratorService {
    /// CancelTurn: cancels the session's running turn on this replica, or
    /// records the request in the store, whose notice reaches the replica
    /// running the turn.
    pub(super) async fn cancel_turn_rpc(
        &self,
        owned: &Owned,
    ) -> Result<CancelTurnResponse, OrchestratorError> {
        let id = owned.id();
        if let Some(t) = self.hub.existing(id).and_then(|s| s.running()) {
            t.cancel.cancel();
            return Ok(CancelTurnResponse { cancelled: true });
        }
        let owner = self.hub.store().request_cancel(id).await?;
        Ok(CancelTurnResponse {
            cancelled: owner.is_some(),
        })
    }

    /// ApproveTool: delivers a decision to a call waiting for one, on this
    /// replica directly, or through the store to the replica running the turn.
    pub(super) async fn approve_tool_rpc(
        &self,
        owned: &Owned,
        r: ApproveToolRequest,
    ) -> Result<ApproveToolResponse, OrchestratorError> {
        let session_id = owned.id().to_owned();
        let decision = Decision::try_from(r.decision)
            .ok()
            .filter(|d| *d != Decision::Unspecified)
            .ok_or_else(|| {
                OrchestratorError::InvalidArgument(
                    "decision must be ALLOW_ONCE, ALLOW_SESSION or DENY".into(),
                )
            })?;
        let refused = |e: String| OrchestratorError::InvalidArgument(format!("rule: {e}"));
        let rule = crate::hub::approval_rule(decision, &r.rule).map_err(refused)?;
        let session = self.hub.existing(&session_id);
        // Where the call waits on this replica, the rule is checked against
        // it now, so the client hears why while its question is still open
        // (the runner checks again; elsewhere its check is the only one, and
        // a rule it refuses lets the call run once and keeps nothing).
        if !rule.is_empty()
            && let Some(call) = session.as_ref().and_then(|s| s.asked_call(&r.call_id))
        {
            let workspace = std::fs::canonicalize(&self.engine.config.workspace)
                .unwrap_or_else(|_| self.engine.config.workspace.clone());
            omicos_rules::session_grant(
                &rule,
                &omicos_rules::Call {
                    tool: &call.tool,
                    args: &call.arguments,
                    workspace: &workspace,
                },
            )
            .map_err(refused)?;
        }
        let answer = crate::hub::ApprovalAnswer {
            decision,
            rule: rule.clone(),
        };
        let local = session.is_some_and(|s| s.resolve_approval(&r.call_id, answer));
        let ok = local
            || self
                .hub
                .store()
                .decide_approval(&session_id, &r.call_id, decision as i32, &rule)
                .await?;
        if ok {
            Ok(ApproveToolResponse {})
        } else {
            Err(OrchestratorError::ApprovalNotPending {
                session: session_id,
                call_id: r.call_id,
            })
        }
    }

    /// ListSessions: the caller's most recently active sessions.
    pub(super) async fn list_sessions_rpc(
        &self,
        who: &omicos_auth::Principal,
        req: ListSessionsRequest,
    ) -> Result<ListSessionsResponse, OrchestratorError> {
        let limit = match req.limit {
            0 => 100,
            n => n as usize,
        };
        let store = self.hub.store();
        let metas = store
            .list_sessions_of(&who.tenant, &who.subject, limit)
            .await?;
        let mut sessions = Vec::with_capacity(metas.len());
        for m in metas {
            let last = last_seq(store.as_ref(), &m.id).await?;
            sessions.push(summary(m, last));
        }
        Ok(ListSessionsResponse { sessions })
    }

    /// GetSession: a session's summary and history.
    pub(super) async fn get_session_rpc(
        &self,
        owned: &Owned,
    ) -> Result<Session, OrchestratorError> {
        let id = owned.id().to_owned();
        let store = self.hub.store();
        let meta = store
            .get_session(&id)
            .await?
            .ok_or_else(|| OrchestratorError::SessionNotFound(id.clone()))?;
        let messages = store.messages(&id).await.map_err(|source| match source {
            // Deleted between the two reads: the session is gone, not the store.
            omicos_sessionstore::StoreError::NotFound(_) => {
                OrchestratorError::SessionNotFound(id.clone())
            }
            source => OrchestratorError::History {
                session: id.clone(),
                source,
            },
        })?;
        let last = last_seq(store.as_ref(), &id).await?;
        // Large values keep a head (crate::bound): the session stays
        // readable, and cut_values says where each is whole (ReadValue).
        let (mut messages_json, mut cut_values) = (Vec::with_capacity(messages.len()), Vec::new());
        for (i, m) in messages.iter().enumerate() {
            let (json, refs) = crate::bound::message(i, m);
            messages_json.push(json);
            cut_values.extend(refs);
        }
        Ok(Session {
            summary: Some(summary(meta, last)),
            messages_json,
            cut_values,
        })
    }

    /// DeleteSession: refused while a turn runs here. The runners end what
    /// the session left running (its boxes, kernel, per-session servers).
    pub(super) async fn delete_session_rpc(
        &self,
        owned: &Owned,
    ) -> Result<DeleteSessionResponse, OrchestratorError> {
        let (id, who) = (owned.id().to_owned(), owned.principal());
        if self.hub.existing(&id).and_then(|s| s.running()).is_some() {
            return Err(OrchestratorError::SessionBusy(id));
        }
        if self.engine.has_hooks("SessionEnd") {
            let mut payload = self.engine.hook_payload(&id, "SessionEnd");
            payload["reason"] = "other".into();
            self.engine
                .run_hooks("SessionEnd", Some("other"), payload)
                .await;
        }
        let deleted = self.hub.store().delete_session(&id).await?;
        self.engine
            .started_sessions
            .lock()
            .expect("started sessions")
            .remove(&id);
        self.hub.forget(&id);
        match self.engine.runner.end_session(&id, who).await {
            Ok(stopped) => {
                tracing::info!(session = %id, stopped, "session deleted; what it ran was ended")
            }
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "session deleted, but the runners could not end what it ran (idle timeouts end it)")
            }
        }
        Ok(DeleteSessionResponse { deleted })
    }
}

/// A session's latest seq; an unreadable one fails the RPC rather than report 0.
async fn last_seq(store: &dyn SessionStore, id: &str) -> Result<u64, OrchestratorError> {
    store
        .last_seq(id)
        .await
        .map_err(|source| OrchestratorError::Seq {
            session: id.to_owned(),
            source,
        })
}

fn summary(m: SessionMeta, last_event_seq: u64) -> SessionSummary {
    SessionSummary {
        session_id: m.id,
        title: m.title,
        agent: m.agent,
        team_members: m.team_members,
        created_ms: m.created_ms,
        last_active_ms: m.last_active_ms,
        last_event_seq,
    }
}
