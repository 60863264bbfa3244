//! The `omicos.v1.ToolRunner` gRPC service: one Execute stream per call
//! (ExecuteStart, then approvals or a cancel in; progress, output,
//! approval_required and one result out), and ListTools.

use crate::pipeline::{CallIo, CallRequest, Pipeline, permission::Legacy};
use omicos_proto::{
    EndSessionRequest, EndSessionResponse, ExecuteClientMessage, ExecuteServerMessage,
    ListToolsRequest, ListToolsResponse, MAX_MESSAGE_BYTES, execute_client_message,
    execute_server_message,
    tool_runner_server::{ToolRunner, ToolRunnerServer},
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// The response metadata key that names the runner serving an Execute
/// stream ([`runner_name`]).
pub const RUNNER_NAME_KEY: &str = "omicos-runner";

/// The ToolRunner service over a [`Pipeline`].
pub struct ToolRunnerService {
    pipeline: Pipeline,
    streams: CancellationToken,
    calls: Arc<crate::calls::Calls>,
    name: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// What an upload (RestoreFiles with create_new) is held to.
    disk_bound: crate::upload::DiskBound,
}

impl ToolRunnerService {
    /// Serves `pipeline`; `streams` cancels running calls when the drain's
    /// grace period ends. A call whose stream drops runs on for
    /// `reattach_grace` ([`crate::calls`]).
    pub fn new(pipeline: Pipeline, streams: CancellationToken, reattach_grace: Duration) -> Self {
        Self {
            pipeline,
            streams,
            calls: crate::calls::Calls::new(reattach_grace),
            name: None,
            disk_bound: crate::upload::DiskBound::default(),
        }
    }

    /// Holds uploads to the sandbox's disk bound of a session (the one its
    /// sandboxed code is held to), measured as the sandbox measures it.
    pub fn with_disk_bound(
        mut self,
        limits: &omicos_sandbox::SessionLimits,
        measure: omicos_sandbox::DiskMeasure,
    ) -> Self {
        self.disk_bound = crate::upload::DiskBound {
            workspace_bytes: limits.workspace_bytes,
            min_free_bytes: limits.min_free_bytes,
            measure,
        };
        self
    }

    /// Names this runner on every Execute stream's response metadata
    /// ([`RUNNER_NAME_KEY`]), so that a caller that loses it mid-call can
    /// say which runner was lost (behind a balancer it cannot tell).
    pub fn named(mut self, name: &str) -> Self {
        let ascii: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        self.name = ascii.parse().ok();
        self
    }

    /// Runs a new call through the pipeline, registered so that it can be
    /// followed again after its stream drops; the first follower is the
    /// stream that started it.
    fn start_call(
        &self,
        key: crate::calls::CallKey,
        start: omicos_proto::ExecuteStart,
        principal: Option<omicos_auth::Principal>,
        span: tracing::Span,
    ) -> crate::calls::Following {
        let cancel = self.streams.child_token();
        let (appr_tx, appr_rx) = mpsc::channel(8);
        let call =
            self.calls
                .register(key.clone(), &start.idempotency_key, appr_tx, cancel.clone());
        let following = self.calls.follow(&call);
        let (out_tx, out_rx) = mpsc::channel::<ExecuteServerMessage>(256);
        tokio::spawn(self.calls.clone().relay(key, call, out_rx));
        let pipeline = self.pipeline.clone();
        let io = CallIo {
            events: Some(out_tx.clone()),
            approvals: Some(appr_rx),
            cancel,
        };
        tokio::spawn(
            async move {
                let mut call = CallRequest::from(start);
                if let Some(p) = &principal {
                    call.tenant = p.tenant.clone();
                    call.principal = p.label();
                }
                let result = pipeline.execute(call, io).await.into_result();
                let _ = out_tx
                    .send(ExecuteServerMessage {
                        msg: Some(execute_server_message::Msg::Result(result)),
                    })
                    .await;
            }
            .instrument(span),
        );
        following
    }

    /// The tonic server (64 MiB messages: arguments may carry whole files).
    pub fn into_server(self) -> ToolRunnerServer<Self> {
        ToolRunnerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// This runner's name for callers: the host name (the pod's, in
/// Kubernetes) and the address it listens on.
pub fn runner_name(addr: std::net::SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    match host.trim() {
        "" => format!("tool-runner {addr}"),
        h => format!("tool-runner {h} {addr}"),
    }
}

type OutStream = Pin<Box<dyn Stream<Item = Result<ExecuteServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ToolRunner for ToolRunnerService {
    type ExecuteStream = OutStream;

    async fn restore_files(
        &self,
        req: Request<omicos_proto::RestoreFilesRequest>,
    ) -> Result<Response<omicos_proto::RestoreFilesResponse>, Status> {
        // The workspace is the forwarded principal's tenant's, never a field
        // of the request (as for Execute and EndSession).
        let principal = req.extensions().get::<omicos_auth::Principal>().cloned();
        let tenant = principal
            .as_ref()
            .map(|p| p.tenant.clone())
            .unwrap_or_default();
        let who = principal.map(|p| p.label()).unwrap_or_else(|| "-".into());
        let r = req.into_inner();
        let workspace = self
            .pipeline
            .tenant_workspace(&tenant)
            .map_err(Status::failed_precondition)?;
        let files = r.files;
        let (create_new, bound) = (r.create_new, self.disk_bound);
        let event = if create_new {
            "upload_files"
        } else {
            "restore_files"
        };
        let restored = tokio::task::spawn_blocking(move || {
            if create_new {
                crate::upload::upload(&workspace, &files, bound)
            } else {
                crate::restore::restore(&workspace, &files)
            }
        })
        .await
        .map_err(|e| Status::internal(format!("restore task failed: {e}")))?;
        match &restored {
            Ok(paths) => tracing::info!(
                target: crate::audit::TARGET,
                event,
                principal = %who,
                session = %r.session_id,
                files = paths.len(),
                "files restored"
            ),
            Err(e) => tracing::warn!(
                target: crate::audit::TARGET,
                event,
                principal = %who,
                session = %r.session_id,
                code = ?e.code(),
                refused = %e.message(),
                "restore refused"
            ),
        }
        Ok(Response::new(omicos_proto::RestoreFilesResponse {
            restored: restored?,
        }))
    }

    async fn end_session(
        &self,
        req: Request<EndSessionRequest>,
    ) -> Result<Response<EndSessionResponse>, Status> {
        // The tenant is the forwarded principal's, never the request's field.
        let tenant = req
            .extensions()
            .get::<omicos_auth::Principal>()
            .map(|p| p.tenant.clone())
            .unwrap_or_default();
        let r = req.into_inner();
        if r.session_id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        let stopped = self.pipeline.end_session(&tenant, &r.session_id).await;
        Ok(Response::new(EndSessionResponse { stopped }))
    }

    async fn execute(
        &self,
        req: Request<Streaming<ExecuteClientMessage>>,
    ) -> Result<Response<OutStream>, Status> {
        let span = tracing::info_span!("ToolRunner.Execute", call_id = tracing::field::Empty);
        omicos_servicekit::telemetry::set_parent_from(&span, req.metadata());
        // Set by the guard only for an authenticated orchestrator's forward.
        let principal = req.extensions().get::<omicos_auth::Principal>().cloned();
        let tenant = principal
            .as_ref()
            .map(|p| p.tenant.clone())
            .unwrap_or_default();
        let mut inbound = req.into_inner();
        let following = match inbound.message().await? {
            Some(ExecuteClientMessage {
                msg: Some(execute_client_message::Msg::Start(start)),
            }) => {
                span.record("call_id", start.call_id.as_str());
                let key = (tenant, start.session_id.clone(), start.call_id.clone());
                match self.calls.joinable(&key, &start.idempotency_key) {
                    // The same start again (its first stream broke before the
                    // answer): it joins the call, which never runs twice.
                    Some(call) => {
                        tracing::info!(call_id = %start.call_id, "a repeated start joins the call it names");
                        self.calls.follow(&call)
                    }
                    None => self.start_call(key, start, principal, span),
                }
            }
            Some(ExecuteClientMessage {
                msg: Some(execute_client_message::Msg::Reattach(r)),
            }) => {
                span.record("call_id", r.call_id.as_str());
                let key = (tenant, r.session_id.clone(), r.call_id.clone());
                match self.calls.get(&key) {
                    Some(call) => {
                        tracing::info!(call_id = %r.call_id, session = %r.session_id, "an orchestrator re-attached to a call");
                        self.calls.follow(&call)
                    }
                    None => {
                        return Err(Status::not_found(format!(
                            "this runner holds no call `{}` of session `{}` (it never ran here, or it ended more than the reattach grace period ago)",
                            r.call_id, r.session_id
                        )));
                    }
                }
            }
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message of Execute must be ExecuteStart or ExecuteReattach",
                ));
            }
            None => {
                return Err(Status::invalid_argument(
                    "Execute stream closed before ExecuteStart",
                ));
            }
        };

        // Inbound: approvals go to the call; a cancel cancels it; a broken
        // stream lets it go (it runs on for the reattach grace period).
        let (calls, call, id) = (self.calls.clone(), following.call.clone(), following.id);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Approval(a)) })) => {
                            call.approve(a).await;
                        }
                        Ok(Some(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Cancel(_)) })) => {
                            call.cancel.cancel();
                            return;
                        }
                        Ok(Some(_)) => tracing::warn!("unexpected message on an Execute stream ignored"),
                        // Half-close: no more approvals can come.
                        Ok(None) => return,
                        Err(_) => {
                            calls.detach(&call, id);
                            return;
                        }
                    },
                    _ = call.cancel.cancelled() => return,
                }
            }
        });
        let mut resp: Response<OutStream> =
            Response::new(Box::pin(ReceiverStream::new(following.messages).map(Ok)));
        if let Some(name) = &self.name {
            resp.metadata_mut().insert(RUNNER_NAME_KEY, name.clone());
        }
        Ok(resp)
    }

    async fn list_tools(
        &self,
        req: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let req = req.into_inner();
        let legacy = Legacy {
            allow_shell: req.allow_shell,
            allow_file_write: req.allow_file_write,
        };
        // Read before the list: a catalog that changes in between gives a
        // version older than the list, so the caller asks again next time.
        let catalog_version = self.pipeline.catalog_version();
        if !req.if_version.is_empty() && req.if_version == catalog_version {
            return Ok(Response::new(ListToolsResponse {
                catalog_version,
                unchanged: true,
                ..Default::default()
            }));
        }
        let caller = crate::pipeline::CallerRules {
            agent: crate::pipeline::rule_lists(req.agent_rules),
            request: crate::pipeline::rule_lists(req.request_rules),
        };
        let (tools, unknown_toolsets) =
            self.pipeline
                .list_tools(&req.toolsets, req.permission_mode, legacy, &caller)?;
        Ok(Response::new(ListToolsResponse {
            tools,
            unknown_toolsets,
            catalog_version,
            unchanged: false,
        }))
    }
}
