//! Sessions belong to their creator: every RPC that names a session finds
//! it only when the caller's tenant and subject created it. Another owner's
//! session answers NOT_FOUND, exactly as a session that does not exist, so a
//! probe learns nothing about whether it exists.

use super::OrchestratorService;
use crate::error::OrchestratorError;
use omicos_auth::Principal;
use omicos_sessionstore::SessionMeta;

impl OrchestratorService {
    /// The session `id` when `who` owns it; SessionNotFound otherwise.
    pub(super) async fn owned(
        &self,
        who: &Principal,
        id: &str,
    ) -> Result<SessionMeta, OrchestratorError> {
        match self.hub.store().get_session(id).await? {
            Some(m) if who.owns(&m.tenant, &m.subject) => Ok(m),
            Some(_) => {
                tracing::warn!(principal = %who.label(), session = id, "a session of another owner was asked for");
                Err(OrchestratorError::SessionNotFound(id.to_owned()))
            }
            None => Err(OrchestratorError::SessionNotFound(id.to_owned())),
        }
    }
}
