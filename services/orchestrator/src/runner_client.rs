//! Running one tool call through the tool-runner's `Execute` stream, relaying
//! progress, output and approvals to the session.

use crate::error::{OrchestratorError, RunnerStatus};
use crate::hub::SessionState;
use omicos_auth::AuthedChannel;
use omicos_proto::{
    ChatEvent, Decision, ExecuteApproval, ExecuteCancel, ExecuteClientMessage, ExecuteStart,
    ListToolsRequest, ToolApprovalRequest, ToolApprovalResolved, ToolOutputChunkEvent,
    ToolProgressEvent, ToolResult, ToolSpec, chat_event, execute_client_message,
    execute_server_message, tool_runner_client::ToolRunnerClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// A client of the tool-runner.
#[derive(Clone)]
pub struct Runner {
    client: ToolRunnerClient<AuthedChannel>,
}

/// What the event builder needs to tag events.
#[derive(Clone, Debug)]
pub struct EventTag {
    /// Turn id.
    pub turn_id: String,
    /// Execution context ("root", "root/call_x", ...).
    pub context: String,
    /// The agent.
    pub agent_id: String,
}

impl EventTag {
    /// An event of `kind` with these tags.
    pub fn event(&self, kind: chat_event::Kind) -> ChatEvent {
        ChatEvent {
            turn_id: self.turn_id.clone(),
            execution_context_id: self.context.clone(),
            agent_id: self.agent_id.clone(),
            kind: Some(kind),
            ..Default::default()
        }
    }
}

impl Runner {
    /// A lazily connected client whose calls carry no service secret.
    pub fn new(endpoint: &str) -> Result<Self, OrchestratorError> {
        Self::with_secret(endpoint, "")
    }

    /// A lazily connected client whose calls carry the service secret (role orchestrator).
    pub fn with_secret(endpoint: &str, secret: &str) -> Result<Self, OrchestratorError> {
        let creds =
            omicos_auth::Credentials::service(secret, omicos_auth::ServiceRole::Orchestrator)
                .map_err(|e| OrchestratorError::config("service_secret", e.to_string()))?;
        let ch = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .map_err(|source| OrchestratorError::RunnerEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .connect_timeout(std::time::Duration::from_secs(3))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            client: ToolRunnerClient::new(creds.channel(ch))
                .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(omicos_proto::MAX_MESSAGE_BYTES),
        })
    }

    /// The tools for these toolsets under a mode.
    pub async fn list_tools(
        &self,
        req: ListToolsRequest,
    ) -> Result<Vec<ToolSpec>, OrchestratorError> {
        let mut c = self.client.clone();
        Ok(
            c.list_tools(omicos_servicekit::telemetry::traced_request(req))
                .await
                .map_err(|s| OrchestratorError::ToolRunner(RunnerStatus(s)))?
                .into_inner()
                .tools,
        )
    }

    /// Runs one call. Never fails: a broken runner becomes an error result.
    pub async fn execute(
        &self,
        start: ExecuteStart,
        session: &SessionState,
        tag: &EventTag,
        cancel: &CancellationToken,
    ) -> ToolResult {
        let call_id = start.call_id.clone();
        let error = |msg: String| ToolResult {
            call_id: call_id.clone(),
            status: omicos_proto::ToolStatus::Error as i32,
            result: msg,
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel::<ExecuteClientMessage>(8);
        let _ = tx
            .send(ExecuteClientMessage {
                msg: Some(execute_client_message::Msg::Start(start.clone())),
            })
            .await;
        let mut client = self.client.clone();
        let req = omicos_servicekit::telemetry::traced_request(ReceiverStream::new(rx));
        let mut stream = match client.execute(req).await {
            Ok(r) => r.into_inner(),
            Err(e) => return error(format!("the tool-runner is unreachable: {}", e.message())),
        };
        let mut pending: Option<tokio::sync::oneshot::Receiver<Decision>> = None;
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                d = async { pending.as_mut().expect("guarded").await }, if pending.is_some() => {
                    pending = None;
                    let decision = d.unwrap_or(Decision::Deny);
                    session.emit(tag.event(chat_event::Kind::ToolApprovalResolved(ToolApprovalResolved {
                        call_id: call_id.clone(), decision: decision as i32, source: "client".into() }))).await;
                    let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Approval(
                        ExecuteApproval { call_id: call_id.clone(), decision: decision as i32 })) }).await;
                    continue;
                }
                _ = cancel.cancelled() => {
                    let _ = tx.send(ExecuteClientMessage { msg: Some(execute_client_message::Msg::Cancel(ExecuteCancel {})) }).await;
                    session.drop_approval(&call_id);
                    // Give the runner a moment to report the cancelled result, then drop the stream.
                    return match tokio::time::timeout(std::time::Duration::from_secs(2), drain_result(&mut stream)).await {
                        Ok(Some(r)) => r,
                        _ => error("cancelled by the user".into()),
                    };
                }
            };
            let msg = match next {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return error("the tool-runner closed the call without a result".into());
                }
                Err(e) => return error(format!("the tool-runner failed: {}", e.message())),
            };
            match msg.msg {
                Some(execute_server_message::Msg::Progress(p)) => {
                    session
                        .emit(tag.event(chat_event::Kind::ToolProgress(ToolProgressEvent {
                            call_id: call_id.clone(),
                            progress: Some(p),
                        })))
                        .await;
                }
                Some(execute_server_message::Msg::Output(o)) => {
                    session
                        .emit(
                            tag.event(chat_event::Kind::ToolOutputChunk(ToolOutputChunkEvent {
                                call_id: call_id.clone(),
                                chunk: Some(o),
                            })),
                        )
                        .await;
                }
                Some(execute_server_message::Msg::ApprovalRequired(a)) => {
                    pending = Some(session.wait_approval(&call_id));
                    session
                        .emit(tag.event(chat_event::Kind::ToolApprovalRequest(
                            ToolApprovalRequest {
                                call_id: call_id.clone(),
                                tool_name: a.tool_name,
                                risk: a.risk,
                                summary: a.summary,
                                arguments: a.arguments,
                            },
                        )))
                        .await;
                }
                Some(execute_server_message::Msg::Result(r)) => {
                    if pending.is_some() && session.drop_approval(&call_id) {
                        // The runner stopped waiting: its approval timeout counts as a denial.
                        session
                            .emit(tag.event(chat_event::Kind::ToolApprovalResolved(
                                ToolApprovalResolved {
                                    call_id: call_id.clone(),
                                    decision: Decision::Deny as i32,
                                    source: "timeout".into(),
                                },
                            )))
                            .await;
                    }
                    return r;
                }
                None => {}
            }
        }
    }
}

async fn drain_result(
    stream: &mut tonic::Streaming<omicos_proto::ExecuteServerMessage>,
) -> Option<ToolResult> {
    while let Ok(Some(m)) = stream.message().await {
        if let Some(execute_server_message::Msg::Result(r)) = m.msg {
            return Some(r);
        }
    }
    None
}
