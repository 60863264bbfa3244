//! A2A's gRPC binding: `lf.a2a.v1.A2AService` (proto/lf/a2a/v1/a2a.proto)
//! on the orchestrator's port, next to Orchestrator, behind the same
//! credential check and the session guard ([`super::super::guard::METHODS`]
//! lists its methods). Each method reads its request, calls what [`A2a`]
//! does for the JSON-RPC binding too, and writes the [`TaskView`]s back with
//! [`super::task::proto`]. Errors are A2A's ([`RpcError`]), mapped once by
//! [`status`] as A2A 1.0 says (§5.4, §10.6): the gRPC code, and a
//! `google.rpc.ErrorInfo` with domain `a2a-protocol.org` and the error's
//! reason in the status details, which the SDKs turn back into their typed errors.

use super::task::{TaskState, TaskView, proto};
use super::{A2a, ListQuery, RpcError, SendParts, Update, code, push_not_supported};
use crate::service::OrchestratorService;
use futures::Stream;
use omicos_proto::a2a::{self, a2a_service_server::A2aService};
use prost::Message as _;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::StreamExt as _;
use tonic::{Code, Request, Response, Status};

/// The domain of A2A's `ErrorInfo`.
const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// `google.rpc.Status`, the gRPC rich error model's envelope.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
}

/// The one place an A2A error becomes a gRPC status: A2A's errors get the
/// code of A2A 1.0's table and their reason; an omicos error keeps its own
/// code (a busy session is ABORTED-like, not INTERNAL) with A2A's
/// `INTERNAL_ERROR` or `INVALID_PARAMS` reason.
pub fn status(e: RpcError) -> Status {
    let (code, reason) = match e.code {
        code::TASK_NOT_FOUND => (Code::NotFound, "TASK_NOT_FOUND"),
        code::TASK_NOT_CANCELABLE => (Code::FailedPrecondition, "TASK_NOT_CANCELABLE"),
        code::PUSH_NOT_SUPPORTED => (Code::FailedPrecondition, "PUSH_NOTIFICATION_NOT_SUPPORTED"),
        code::UNSUPPORTED_OPERATION => (Code::FailedPrecondition, "UNSUPPORTED_OPERATION"),
        code::CONTENT_TYPE_NOT_SUPPORTED => (Code::InvalidArgument, "CONTENT_TYPE_NOT_SUPPORTED"),
        code::EXTENDED_CARD_NOT_CONFIGURED => (
            Code::FailedPrecondition,
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        ),
        code::INVALID_PARAMS => (Code::InvalidArgument, "INVALID_PARAMS"),
        code::INVALID_REQUEST => (Code::InvalidArgument, "INVALID_REQUEST"),
        code::METHOD_NOT_FOUND => (Code::Unimplemented, "METHOD_NOT_FOUND"),
        _ => (
            e.kind.map_or(Code::Internal, |k| k.grpc_code()),
            "INTERNAL_ERROR",
        ),
    };
    let info = ErrorInfo {
        reason: reason.into(),
        domain: ERROR_DOMAIN.into(),
    };
    let details = RpcStatus {
        code: code as i32,
        message: e.message.clone(),
        details: vec![prost_types::Any {
            type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
            value: info.encode_to_vec(),
        }],
    };
    Status::with_details(code, e.message, details.encode_to_vec().into())
}

/// The session guard's refusal of a context the caller does not own (or
/// that does not exist): A2A's TaskNotFound.
pub fn context_not_found(session: &str) -> Status {
    status(RpcError::new(
        code::TASK_NOT_FOUND,
        format!("no task of context {session} exists"),
    ))
}

/// The gRPC service.
#[derive(Clone)]
pub struct A2aGrpc {
    a2a: A2a,
}

/// `lf.a2a.v1.A2AService` over `svc`, ready to be guarded and added to the port.
pub fn server(svc: Arc<OrchestratorService>) -> a2a::a2a_service_server::A2aServiceServer<A2aGrpc> {
    let max = omicos_proto::MAX_MESSAGE_BYTES;
    a2a::a2a_service_server::A2aServiceServer::new(A2aGrpc { a2a: A2a::new(svc) })
        .max_decoding_message_size(max)
        .max_encoding_message_size(max)
}

/// A string field of a `google.protobuf.Struct` (metadata).
fn meta_str(m: Option<&prost_types::Struct>, key: &str) -> Result<Option<String>, RpcError> {
    use prost_types::value::Kind;
    match m
        .and_then(|m| m.fields.get(key))
        .and_then(|v| v.kind.as_ref())
    {
        None | Some(Kind::NullValue(_)) => Ok(None),
        Some(Kind::StringValue(s)) if s.is_empty() => Ok(None),
        Some(Kind::StringValue(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("metadata `{key}` must be a string"),
        )),
    }
}

/// Reads a SendMessageRequest as the JSON-RPC binding reads its params.
fn parse_send(req: &a2a::SendMessageRequest) -> Result<super::Send, RpcError> {
    let msg = req
        .message
        .as_ref()
        .ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "`message` is missing"))?;
    let meta = |k: &str| -> Result<Option<String>, RpcError> {
        Ok(match meta_str(req.metadata.as_ref(), k)? {
            Some(v) => Some(v),
            None => meta_str(msg.metadata.as_ref(), k)?,
        })
    };
    let role = a2a::Role::try_from(msg.role).unwrap_or_default();
    SendParts {
        from_user: role == a2a::Role::User,
        role: role.as_str_name().into(),
        texts: msg
            .parts
            .iter()
            .map(|p| match &p.content {
                Some(a2a::part::Content::Text(t)) => Some(t.clone()),
                _ => None,
            })
            .collect(),
        context: Some(msg.context_id.clone()),
        task: Some(msg.task_id.clone()),
        agent: meta("agent")?,
        mode: meta("permissionMode")?,
        blocking: !req
            .configuration
            .as_ref()
            .is_some_and(|c| c.return_immediately),
    }
    .check()
}

/// A task written with at most the last `history_length` messages
/// (None: all of them), and its artifacts unless left out.
fn shaped(t: &TaskView, history_length: Option<i32>, artifacts: bool) -> a2a::Task {
    let mut task = proto::task(t);
    if let Some(n) = history_length {
        let keep = n.max(0) as usize;
        let drop = task.history.len().saturating_sub(keep);
        task.history.drain(..drop);
    }
    if !artifacts {
        task.artifacts.clear();
    }
    task
}

/// A stream of a followed task's updates.
type Updates = Pin<Box<dyn Stream<Item = Result<a2a::StreamResponse, Status>> + Send>>;

fn updates(rx: tokio::sync::mpsc::Receiver<Update>) -> Updates {
    Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|u| match u {
            Update::Task(t) => Ok(proto::task_event(&t)),
            Update::Status(t, _) => Ok(proto::status_event(&t)),
            Update::Artifact(t) => Ok(proto::artifact_event(&t)),
            Update::Failed(e) => Err(status(e)),
        }),
    )
}

#[tonic::async_trait]
impl A2aService for A2aGrpc {
    async fn send_message(
        &self,
        req: Request<a2a::SendMessageRequest>,
    ) -> Result<Response<a2a::SendMessageResponse>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let send = parse_send(req.get_ref()).map_err(status)?;
        let view = self.a2a.send(&who, send).await.map_err(status)?;
        Ok(Response::new(a2a::SendMessageResponse {
            payload: Some(a2a::send_message_response::Payload::Task(proto::task(
                &view,
            ))),
        }))
    }

    type SendStreamingMessageStream = Updates;

    async fn send_streaming_message(
        &self,
        req: Request<a2a::SendMessageRequest>,
    ) -> Result<Response<Updates>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let send = parse_send(req.get_ref()).map_err(status)?;
        let f = self.a2a.start(&who, send).await.map_err(status)?;
        Ok(Response::new(updates(self.a2a.follow(f))))
    }

    async fn get_task(
        &self,
        req: Request<a2a::GetTaskRequest>,
    ) -> Result<Response<a2a::Task>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let r = req.get_ref();
        let view = self.a2a.find(&who, &r.id).await.map_err(status)?;
        Ok(Response::new(shaped(&view, r.history_length, true)))
    }

    async fn list_tasks(
        &self,
        req: Request<a2a::ListTasksRequest>,
    ) -> Result<Response<a2a::ListTasksResponse>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let r = req.into_inner();
        let state = match a2a::TaskState::try_from(r.status) {
            Ok(a2a::TaskState::Unspecified) => None,
            Ok(s) => Some(TaskState::from_proto(s).ok_or_else(|| {
                status(RpcError::new(
                    code::INVALID_PARAMS,
                    format!("omicos tasks are never {}", s.as_str_name()),
                ))
            })?),
            Err(_) => {
                return Err(status(RpcError::new(
                    code::INVALID_PARAMS,
                    format!("`status` {} is not a task state", r.status),
                )));
            }
        };
        let q = ListQuery {
            context: Some(r.context_id).filter(|c| !c.is_empty()),
            state,
            after_ms: r
                .status_timestamp_after
                .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
            page_size: r.page_size.map(i64::from),
            page_token: r.page_token,
        };
        let page = self.a2a.list(&who, q).await.map_err(status)?;
        let artifacts = r.include_artifacts.unwrap_or(false);
        Ok(Response::new(a2a::ListTasksResponse {
            tasks: page
                .tasks
                .iter()
                .map(|t| shaped(t, r.history_length, artifacts))
                .collect(),
            next_page_token: page.next_page_token,
            page_size: page.page_size as i32,
            total_size: page.total_size as i32,
        }))
    }

    async fn cancel_task(
        &self,
        req: Request<a2a::CancelTaskRequest>,
    ) -> Result<Response<a2a::Task>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let view = self
            .a2a
            .cancel(&who, &req.get_ref().id)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::task(&view)))
    }

    type SubscribeToTaskStream = Updates;

    async fn subscribe_to_task(
        &self,
        req: Request<a2a::SubscribeToTaskRequest>,
    ) -> Result<Response<Updates>, Status> {
        let who = omicos_auth::principal::of(&req)?;
        let rx = self
            .a2a
            .subscribe(&who, &req.get_ref().id)
            .await
            .map_err(status)?;
        Ok(Response::new(updates(rx)))
    }

    async fn create_task_push_notification_config(
        &self,
        _: Request<a2a::TaskPushNotificationConfig>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        Err(status(push_not_supported()))
    }

    async fn get_task_push_notification_config(
        &self,
        _: Request<a2a::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        Err(status(push_not_supported()))
    }

    async fn list_task_push_notification_configs(
        &self,
        _: Request<a2a::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<a2a::ListTaskPushNotificationConfigsResponse>, Status> {
        Err(status(push_not_supported()))
    }

    async fn get_extended_agent_card(
        &self,
        _: Request<a2a::GetExtendedAgentCardRequest>,
    ) -> Result<Response<a2a::AgentCard>, Status> {
        Err(status(super::extended_card_not_configured()))
    }

    async fn delete_task_push_notification_config(
        &self,
        _: Request<a2a::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        Err(status(push_not_supported()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A2A's errors carry their reason in `google.rpc.ErrorInfo`, with the
    /// code of A2A 1.0's table; the details' code and message are the status's.
    #[test]
    fn errors_carry_a2as_reason_and_code() {
        for (e, code, reason) in [
            (
                RpcError::task_not_found("s:t"),
                Code::NotFound,
                "TASK_NOT_FOUND",
            ),
            (
                push_not_supported(),
                Code::FailedPrecondition,
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
            ),
            (
                RpcError::new(super::code::CONTENT_TYPE_NOT_SUPPORTED, "x"),
                Code::InvalidArgument,
                "CONTENT_TYPE_NOT_SUPPORTED",
            ),
            (
                crate::error::OrchestratorError::SessionBusy("s".into()).into(),
                crate::error::ErrorKind::SessionBusy.grpc_code(),
                "INTERNAL_ERROR",
            ),
        ] {
            let message = e.message.clone();
            let s = status(e);
            assert_eq!(s.code(), code, "{s:?}");
            let d = RpcStatus::decode(s.details()).unwrap();
            assert_eq!(
                (d.code, d.message.as_str()),
                (code as i32, message.as_str())
            );
            let info = ErrorInfo::decode(d.details[0].value.as_slice()).unwrap();
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (reason, ERROR_DOMAIN)
            );
        }
    }

    #[test]
    fn a_send_request_is_read_as_the_json_one_is() {
        let text = |t: &str| a2a::Part {
            content: Some(a2a::part::Content::Text(t.into())),
            ..Default::default()
        };
        let mut meta = prost_types::Struct::default();
        meta.fields.insert(
            "agent".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("lead".into())),
            },
        );
        let ok = a2a::SendMessageRequest {
            message: Some(a2a::Message {
                role: a2a::Role::User as i32,
                context_id: "s1".into(),
                parts: vec![text("hello"), text("world")],
                ..Default::default()
            }),
            configuration: Some(a2a::SendMessageConfiguration {
                return_immediately: true,
                ..Default::default()
            }),
            metadata: Some(meta),
            ..Default::default()
        };
        let s = parse_send(&ok).unwrap();
        assert_eq!(
            (
                s.request.session_id.as_str(),
                s.request.message.as_str(),
                s.request.agent.as_str()
            ),
            ("s1", "hello\nworld", "lead")
        );
        assert!(!s.blocking);
        let mut agent = ok.clone();
        agent.message.as_mut().unwrap().role = a2a::Role::Agent as i32;
        let mut raw = ok.clone();
        raw.message.as_mut().unwrap().parts = vec![a2a::Part {
            content: Some(a2a::part::Content::Raw(vec![1, 2])),
            ..Default::default()
        }];
        let mut other_task = ok.clone();
        other_task.message.as_mut().unwrap().task_id = "s2:t".into();
        for (req, c) in [
            (a2a::SendMessageRequest::default(), code::INVALID_PARAMS),
            (agent, code::INVALID_PARAMS),
            (raw, code::CONTENT_TYPE_NOT_SUPPORTED),
            (other_task, code::INVALID_PARAMS),
        ] {
            let e = parse_send(&req)
                .err()
                .unwrap_or_else(|| panic!("{req:?} accepted"));
            assert_eq!(e.code, c, "{e:?}");
        }
    }
}
