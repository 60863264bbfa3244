//! `/files/` behind the same credential as gRPC (issue 14): the page's
//! output files are served only to a caller with a valid bearer token (in
//! `Authorization`, or the page's `omicos_token` cookie, since an `<img>`
//! sends no header), from its tenant's workspace, and a session's outputs
//! (`.omicos/outputs/<session>/`) and spooled results
//! (`.omicos/tool_outputs/<session>/`) only to the session's owner. Another
//! owner's file is 404, as a file that does not exist.

use crate::hub::Hub;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use omicos_auth::{Admitted, Gate, Principal};
use omicos_webui::{FileGate, GateFuture};
use std::path::PathBuf;
use std::sync::Arc;

/// The orchestrator's [`FileGate`].
pub struct FilesGate {
    gate: Arc<dyn Gate>,
    root: PathBuf,
    hub: Arc<Hub>,
}

impl FilesGate {
    /// Checks credentials with `gate` (the gRPC one) and owners in `hub`'s store;
    /// `root` is the deployment's workspace root.
    pub fn new(gate: Arc<dyn Gate>, root: PathBuf, hub: Arc<Hub>) -> Self {
        Self { gate, root, hub }
    }

    async fn decide(&self, headers: &HeaderMap, rel: &str) -> Result<PathBuf, StatusCode> {
        let mut h = HeaderMap::new();
        if let Some(v) =
            omicos_webui::bearer_token(headers).and_then(|t| HeaderValue::from_str(&t).ok())
        {
            h.insert(header::AUTHORIZATION, v);
        }
        let who = match self.gate.admit("/files/", &h).await {
            Ok(Admitted::Principal(p)) => p,
            Ok(_) => Principal::anonymous(),
            Err(e) if e.status().code() == tonic::Code::Unauthenticated => {
                return Err(StatusCode::UNAUTHORIZED);
            }
            Err(_) => return Err(StatusCode::FORBIDDEN),
        };
        let ws = omicos_toolkit::tenancy::tenant_workspace(&self.root, &who.tenant)
            .map_err(|_| StatusCode::NOT_FOUND)?;
        // Resolve first: the real file, inside one of the served roots.
        let full = omicos_webui::resolve_workspace_file(&ws, rel).ok_or(StatusCode::NOT_FOUND)?;
        // Then authorize on what was resolved: a file in a session's folder
        // of either root (outputs, the spool) belongs to that session. A
        // spool file directly under the spool root is from before spools
        // had a folder per session, named by its call id: the tenant's.
        for root in omicos_webui::FILE_ROOTS {
            let Some(base) = ws.join(root).canonicalize().ok() else {
                continue;
            };
            let Ok(inside) = full.strip_prefix(&base) else {
                continue;
            };
            let mut parts = inside.components();
            let session = match (parts.next(), parts.next()) {
                (Some(std::path::Component::Normal(s)), Some(_)) => {
                    s.to_string_lossy().into_owned()
                }
                (Some(_), None) if root.ends_with("tool_outputs") => break,
                _ => return Err(StatusCode::NOT_FOUND),
            };
            let owned = match self.hub.store().get_session(&session).await {
                Ok(Some(m)) => who.owns(&m.tenant, &m.subject),
                Ok(None) => false,
                Err(_) => return Err(StatusCode::SERVICE_UNAVAILABLE),
            };
            if !owned {
                tracing::warn!(target: "omicos::audit", event = "file_denied", principal = %who.label(), path = rel, session = %session, "a file of another owner's session was asked for");
                return Err(StatusCode::NOT_FOUND);
            }
            break;
        }
        Ok(full)
    }
}

impl FileGate for FilesGate {
    fn resolve<'a>(&'a self, headers: &'a HeaderMap, rel: &'a str) -> GateFuture<'a> {
        Box::pin(self.decide(headers, rel))
    }
}
