//! Calling a provider that runs as its own service.

use crate::provider::{CallCtx, Provider, ToolError};
use async_trait::async_trait;
use omicos_auth::{AuthedChannel, Credentials};
use omicos_proto::{
    CallContext, CallToolRequest, DescribeRequest, EndSessionRequest, ToolSpec, call_tool_event,
    tool_provider_client::ToolProviderClient,
};
use omicos_servicekit::ClientTls;
use serde_json::Value;
use std::sync::RwLock;
use tonic::transport::{Channel, Endpoint};

/// What every call to a provider carries: the service secret with the
/// runner's role, set once by the runner at start ([`set_service_credentials`]).
static OUTGOING: RwLock<Option<Credentials>> = RwLock::new(None);

/// Sets the credentials calls to providers carry (the runner's service secret).
pub fn set_service_credentials(c: Credentials) {
    *OUTGOING.write().unwrap_or_else(|e| e.into_inner()) = Some(c);
}

/// The TLS of calls to `https://` providers, set once by the runner at
/// start ([`set_client_tls`]); None: `https://` endpoints are refused.
static OUTGOING_TLS: RwLock<Option<ClientTls>> = RwLock::new(None);

/// Sets the TLS calls to `https://` providers use (the runner's `tls`:
/// its CA to verify them, its certificate for mutual TLS).
pub fn set_client_tls(tls: Option<ClientTls>) {
    *OUTGOING_TLS.write().unwrap_or_else(|e| e.into_inner()) = tls;
}

fn outgoing_tls() -> Option<ClientTls> {
    OUTGOING_TLS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

fn outgoing() -> Credentials {
    OUTGOING
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

/// A provider reached over gRPC. Implements [`Provider`], so the runner's
/// pipeline treats it like an in-process one.
#[derive(Clone)]
pub struct RemoteProvider {
    name: String,
    endpoint: String,
    tools: Vec<ToolSpec>,
    affinity: bool,
    client: ToolProviderClient<AuthedChannel>,
}

impl RemoteProvider {
    /// A lazily connected client for `endpoint` with already known tools.
    pub fn lazy(
        name: &str,
        endpoint: &str,
        tools: Vec<ToolSpec>,
        affinity: bool,
    ) -> Result<Self, ToolError> {
        let ep = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| ToolError::Unavailable(format!("bad endpoint {endpoint}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(3))
            .tcp_nodelay(true);
        let channel = if ep.uri().scheme_str() == Some("https") {
            let tls = outgoing_tls().ok_or_else(|| {
                ToolError::Unavailable(format!(
                    "{endpoint} is https but the runner has no `tls` configured"
                ))
            })?;
            // Each new connection takes the client config of the moment (rotation).
            Channel::new(
                tls.connector()
                    .with_connect_timeout(std::time::Duration::from_secs(3)),
                ep,
            )
        } else {
            ep.connect_lazy()
        };
        Ok(Self {
            name: name.into(),
            endpoint: endpoint.into(),
            tools,
            affinity,
            client: ToolProviderClient::new(outgoing().channel(channel))
                .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES),
        })
    }

    /// Connects and asks the provider what it serves.
    pub async fn connect(endpoint: &str) -> Result<Self, ToolError> {
        let mut me = Self::lazy("", endpoint, vec![], false)?;
        let d = me
            .client
            .describe(DescribeRequest {})
            .await
            .map_err(|e| ToolError::Unavailable(format!("{endpoint}: {}", e.message())))?
            .into_inner();
        me.name = d.provider;
        me.tools = d.tools;
        me.affinity = d.session_affinity;
        Ok(me)
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

#[async_trait]
impl Provider for RemoteProvider {
    fn name(&self) -> &str {
        &self.name
    }
    fn tools(&self) -> Vec<ToolSpec> {
        self.tools.clone()
    }
    fn session_affinity(&self) -> bool {
        self.affinity
    }
    async fn end_session(&self, tenant: &str, session: &str) -> u32 {
        let mut client = self.client.clone();
        let req = omicos_servicekit::telemetry::traced_request(EndSessionRequest {
            session_id: session.into(),
            tenant: tenant.into(),
        });
        match tokio::time::timeout(std::time::Duration::from_secs(10), client.end_session(req))
            .await
        {
            Ok(Ok(r)) => r.into_inner().stopped,
            Ok(Err(e)) => {
                tracing::warn!(provider = %self.name, endpoint = %self.endpoint, error = %e.message(), "EndSession failed");
                0
            }
            Err(_) => {
                tracing::warn!(provider = %self.name, endpoint = %self.endpoint, "EndSession timed out");
                0
            }
        }
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let mut client = self.client.clone();
        let req = omicos_servicekit::telemetry::traced_request(CallToolRequest {
            tool: tool.into(),
            arguments_json: args.to_string(),
            context: Some(CallContext {
                call_id: ctx.call_id.clone(),
                session_id: ctx.session_id.clone(),
                agent_id: ctx.agent_id.clone(),
                user_modified: ctx.user_modified,
                scope: ctx.scope.clone(),
                // Informational only: the provider works in its own workspace.
                workspace: ctx.workspace.display().to_string(),
                tenant: ctx.tenant.clone(),
            }),
        });
        let unavailable = |e: tonic::Status| {
            ToolError::Unavailable(format!(
                "the {} provider at {} did not answer: {}",
                self.name,
                self.endpoint,
                e.message()
            ))
        };
        let call = async {
            let mut stream = client
                .call_tool(req)
                .await
                .map_err(unavailable)?
                .into_inner();
            loop {
                match stream.message().await.map_err(unavailable)? {
                    Some(ev) => match ev.event {
                        Some(call_tool_event::Event::Progress(p)) => ctx.events.progress(p).await,
                        Some(call_tool_event::Event::Output(o)) => {
                            ctx.events.output(&o.stream, o.text).await
                        }
                        Some(call_tool_event::Event::Result(r)) => {
                            let v: Value = serde_json::from_str(&r.value_json).map_err(|e| {
                                ToolError::failed(format!(
                                    "the {} provider sent a result that is not JSON: {e}",
                                    self.name
                                ))
                            })?;
                            return if r.is_error {
                                Err(ToolError::Failed(
                                    v.as_str()
                                        .map(str::to_owned)
                                        .unwrap_or_else(|| v.to_string()),
                                ))
                            } else {
                                Ok(v)
                            };
                        }
                        None => {}
                    },
                    None => {
                        return Err(ToolError::Unavailable(format!(
                            "the {} provider at {} closed the call without a result",
                            self.name, self.endpoint
                        )));
                    }
                }
            }
        };
        tokio::select! {
            r = call => r,
            // Dropping the stream tells the provider to stop.
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }
}
