//! Serves any [`Provider`] as an `omicos.v1.ToolProvider` gRPC service.

use crate::provider::{CallCtx, EventSink, Provider, ProviderEvent, ToolError};
use omicos_proto::{
    CallToolEvent, CallToolRequest, DescribeRequest, DescribeResponse, EndSessionRequest,
    EndSessionResponse, MAX_MESSAGE_BYTES, ProviderResult, ToolStatus, call_tool_event,
    tool_provider_server::{ToolProvider, ToolProviderServer},
};
use std::{path::PathBuf, pin::Pin, sync::Arc};
use tokio::sync::mpsc;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The gRPC face of a provider.
pub struct ProviderService<P: Provider> {
    provider: Arc<P>,
    workspace: PathBuf,
    shutdown: CancellationToken,
}

impl<P: Provider> ProviderService<P> {
    /// Wraps `provider`, confined to `workspace` (each tenant to its
    /// directory under it; a caller never names the workspace);
    /// `shutdown` cancels running calls when the service stops.
    pub fn new(provider: Arc<P>, workspace: PathBuf, shutdown: CancellationToken) -> Self {
        Self {
            provider,
            workspace,
            shutdown,
        }
    }

    /// The tonic server for it.
    pub fn into_server(self) -> ToolProviderServer<Self> {
        ToolProviderServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// Encodes a provider outcome for the wire.
pub fn encode_result(r: Result<serde_json::Value, ToolError>) -> ProviderResult {
    match r {
        Ok(v) => ProviderResult {
            is_error: false,
            value_json: v.to_string(),
        },
        Err(e) => ProviderResult {
            is_error: true,
            value_json: serde_json::Value::String(e.to_string()).to_string(),
        },
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<CallToolEvent, Status>> + Send>>;

#[tonic::async_trait]
impl<P: Provider> ToolProvider for ProviderService<P> {
    async fn describe(
        &self,
        _req: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        let name = self.provider.name().to_owned();
        let tools = self
            .provider
            .tools()
            .into_iter()
            .map(|mut t| {
                if t.provider.is_empty() {
                    t.provider = name.clone();
                }
                t
            })
            .collect();
        Ok(Response::new(DescribeResponse {
            provider: name,
            tools,
            session_affinity: self.provider.session_affinity(),
        }))
    }

    type CallToolStream = EventStream;

    async fn end_session(
        &self,
        req: Request<EndSessionRequest>,
    ) -> Result<Response<EndSessionResponse>, Status> {
        let r = req.into_inner();
        if r.session_id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        if !crate::tenancy::is_root(&r.tenant) {
            crate::tenancy::check_tenant(&r.tenant).map_err(Status::invalid_argument)?;
        }
        let stopped = self.provider.end_session(&r.tenant, &r.session_id).await;
        if stopped > 0 {
            tracing::info!(session = %r.session_id, stopped, "session ended");
        }
        Ok(Response::new(EndSessionResponse { stopped }))
    }

    async fn call_tool(
        &self,
        req: Request<CallToolRequest>,
    ) -> Result<Response<Self::CallToolStream>, Status> {
        let span = tracing::info_span!(
            "provider.call_tool",
            tool_name = tracing::field::Empty,
            status = tracing::field::Empty
        );
        omicos_servicekit::telemetry::set_parent_from(&span, req.metadata());
        let req = req.into_inner();
        span.record("tool_name", req.tool.as_str());
        let args: serde_json::Value = serde_json::from_str(&req.arguments_json)
            .map_err(|e| Status::invalid_argument(format!("arguments_json is not JSON: {e}")))?;
        let c = req.context.unwrap_or_default();
        // The provider's own workspace, never the one the call names.
        let workspace = crate::tenancy::tenant_workspace(&self.workspace, &c.tenant)
            .map_err(Status::invalid_argument)?;
        let cancel = self.shutdown.child_token();
        let (ev_tx, mut ev_rx) = mpsc::channel::<ProviderEvent>(256);
        let ctx = CallCtx {
            call_id: c.call_id,
            session_id: c.session_id,
            agent_id: c.agent_id,
            user_modified: c.user_modified,
            // Set by the runner, already within the call's tenant (tenancy::tenant_scope).
            scope: if c.scope.is_empty() {
                "workspace".into()
            } else {
                c.scope
            },
            workspace,
            tenant: c.tenant,
            events: EventSink::new(ev_tx),
            cancel: cancel.clone(),
            // A remote provider's file changes are not tracked (only the
            // runner's own file tools are).
            file_changes: Default::default(),
        };
        let (out_tx, out_rx) = mpsc::channel::<Result<CallToolEvent, Status>>(256);
        let provider = self.provider.clone();
        let tool = req.tool;
        // The whole call runs inside the span (the provider's own task too), so
        // its logs carry the call and the fields recorded at the end land on it.
        tokio::spawn(
            async move {
                let run = {
                    let provider = provider.clone();
                    let tool = tool.clone();
                    let ctx = ctx.clone();
                    async move {
                        provider.validate_input(&tool, &args, &ctx)?;
                        provider.call(&tool, args, ctx).await
                    }
                };
                // The provider runs in its own task so that a panic becomes an error result.
                let mut handle = tokio::spawn(run.in_current_span());
                drop(ctx);
                let outcome = loop {
                    tokio::select! {
                        ev = ev_rx.recv() => {
                            if let Some(ev) = ev
                                && out_tx.send(Ok(CallToolEvent { event: Some(ev.into()) })).await.is_err()
                            {
                                cancel.cancel();
                            }
                        }
                        r = &mut handle => break r,
                        _ = out_tx.closed() => {
                            // The runner dropped the stream: stop the call.
                            cancel.cancel();
                            break (&mut handle).await;
                        }
                    }
                };
                // Drain the events produced before the result.
                while let Ok(ev) = ev_rx.try_recv() {
                    let _ = out_tx
                        .send(Ok(CallToolEvent {
                            event: Some(ev.into()),
                        }))
                        .await;
                }
                let result = match outcome {
                    Ok(r) => r,
                    Err(join) if join.is_panic() => Err(ToolError::failed(format!(
                        "the {tool} tool crashed (panic); the provider is still running"
                    ))),
                    Err(_) => Err(ToolError::Cancelled),
                };
                tracing::Span::current()
                    .record("status", ToolStatus::from_ok(result.is_ok()).as_str());
                let _ = out_tx
                    .send(Ok(CallToolEvent {
                        event: Some(call_tool_event::Event::Result(encode_result(result))),
                    }))
                    .await;
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }
}
