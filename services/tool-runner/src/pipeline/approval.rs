//! Asking the user: ApprovalRequired goes out on the call's stream and the
//! decision comes back on the same stream, within a timeout. No answer counts
//! as denied. A decision for another call id is refused (it belongs to some
//! other call, maybe of another session) and the wait goes on.

use super::CallIo;
use super::normalize::{Failure, Stage};
use crate::record::{ApprovalDecision, ApprovalRecord, ApprovalSource};
use omicos_proto::{ApprovalRequired, Decision, ExecuteServerMessage, execute_server_message};
use std::time::Duration;

/// The user's decision on one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// AllowOnce or AllowSession (a deny is a [`Failure`]).
    pub decision: Decision,
    /// What to record.
    pub record: ApprovalRecord,
    /// With AllowSession: the allow rule to keep instead of the whole tool
    /// (not yet validated; empty: none).
    pub rule: String,
}

/// Sends `request` and waits for the matching decision.
pub async fn ask(
    io: &mut CallIo,
    request: ApprovalRequired,
    timeout: Duration,
) -> Result<Answer, (Failure, ApprovalRecord)> {
    let mut record = ApprovalRecord {
        asked: true,
        decision: ApprovalDecision::Deny,
        source: ApprovalSource::None,
        reason: request.reason.clone(),
        ..Default::default()
    };
    let call_id = request.call_id.clone();
    let sent = match &io.events {
        Some(tx) => tx
            .send(ExecuteServerMessage {
                msg: Some(execute_server_message::Msg::ApprovalRequired(request)),
            })
            .await
            .is_ok(),
        None => false,
    };
    let Some(rx) = io.approvals.as_mut().filter(|_| sent) else {
        record.source = ApprovalSource::Closed;
        return Err((
            Failure::new(
                Stage::Permission,
                "denied: this call needs the user's approval, but no client is connected to answer",
            ),
            record,
        ));
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = tokio::select! {
            m = tokio::time::timeout_at(deadline, rx.recv()) => m,
            _ = io.cancel.cancelled() => {
                record.source = ApprovalSource::Cancelled;
                return Err((Failure::new(Stage::Permission, "cancelled while waiting for the user's approval"), record));
            }
        };
        match next {
            Err(_) => {
                record.source = ApprovalSource::Timeout;
                return Err((
                    Failure::new(
                        Stage::Permission,
                        format!(
                            "denied: no approval within {}s (an unanswered request counts as denied)",
                            timeout.as_secs()
                        ),
                    ),
                    record,
                ));
            }
            Ok(None) => {
                record.source = ApprovalSource::Closed;
                return Err((
                    Failure::new(
                        Stage::Permission,
                        "denied: the client stopped sending before answering the approval request",
                    ),
                    record,
                ));
            }
            Ok(Some(a)) if a.call_id != call_id => {
                tracing::warn!(expected = %call_id, got = %a.call_id, "approval for another call refused");
                continue;
            }
            Ok(Some(a)) => {
                record.source = ApprovalSource::Client;
                match Decision::try_from(a.decision).unwrap_or(Decision::Unspecified) {
                    d @ (Decision::AllowOnce | Decision::AllowSession) => {
                        record.decision = if d == Decision::AllowOnce {
                            ApprovalDecision::AllowOnce
                        } else {
                            ApprovalDecision::AllowSession
                        };
                        return Ok(Answer {
                            decision: d,
                            record,
                            rule: a.rule.trim().to_owned(),
                        });
                    }
                    Decision::Deny => {
                        return Err((Failure::new(Stage::Permission, "denied by user"), record));
                    }
                    Decision::Unspecified => {
                        tracing::warn!(call_id = %call_id, "approval without a decision ignored");
                        continue;
                    }
                }
            }
        }
    }
}
