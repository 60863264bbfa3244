//! Calls that outlive their Execute stream (issue 40: a turn outlives its
//! orchestrator).
//!
//! A call belongs to the runner, not to the stream that started it. When
//! that stream drops without a cancel (the orchestrator was killed, or its
//! connection broke), the call keeps running for the reattach grace period.
//! Any authenticated orchestrator may follow it again by its call id
//! ([`ExecuteReattach`]): it is sent the approval still waiting, what was
//! produced while nobody followed, and then the rest, or the result if the
//! call has finished since. A call nobody follows within the grace period is
//! cancelled; a finished one is kept for the grace period, so a result that
//! was sent to an orchestrator that died before recording it is not lost.
//!
//! A start whose idempotency key this runner already holds for the same
//! tenant, session and call id joins that call: it never runs twice.
//!
//! [`ExecuteReattach`]: omicos_proto::ExecuteReattach

use omicos_proto::{
    ApprovalRequired, ExecuteApproval, ExecuteServerMessage, ToolResult, execute_server_message,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Messages kept for a call while nobody follows it (output chunks and
/// progress beyond this are dropped: the result holds the output anyway).
const MISSED_MAX: usize = 512;
/// Calls (running or finished) this runner keeps at most; the oldest
/// finished ones go first.
const CALLS_MAX: usize = 10_000;

/// Who a call is, as its caller names it: tenant (the forwarded
/// principal's), session, call id.
pub type CallKey = (String, String, String);

/// The calls of this runner, by [`CallKey`].
pub struct Calls {
    map: Mutex<HashMap<CallKey, Arc<LiveCall>>>,
    grace: Duration,
}

/// One call and whoever follows it.
pub struct LiveCall {
    /// The start's idempotency key (empty: none was given).
    idempotency_key: String,
    inner: Mutex<Inner>,
    /// Where a follower's approval decisions go (to the pipeline).
    approvals: mpsc::Sender<ExecuteApproval>,
    /// Cancels the call: a follower's cancel, the grace period's end.
    pub cancel: CancellationToken,
    /// Fires once the result was handed on: followers' streams end.
    finished: CancellationToken,
}

#[derive(Default)]
struct Inner {
    /// The stream following the call now: (its number, its sender).
    follower: Option<(u64, mpsc::Sender<ExecuteServerMessage>)>,
    followers: u64,
    /// The approval asked and not answered yet.
    pending: Option<ApprovalRequired>,
    /// What was produced while nobody followed.
    missed: VecDeque<ExecuteServerMessage>,
    result: Option<ToolResult>,
}

/// A stream following a call: its messages, and the call.
pub struct Following {
    /// The call's messages for this follower, ending with its result.
    pub messages: mpsc::Receiver<ExecuteServerMessage>,
    /// This follower's number (for [`Calls::detach`]).
    pub id: u64,
    /// The call.
    pub call: Arc<LiveCall>,
}

impl LiveCall {
    /// Hands a follower's approval decision to the call.
    pub async fn approve(&self, a: ExecuteApproval) {
        self.inner.lock().expect("call").pending = None;
        let _ = self.approvals.send(a).await;
    }
}

impl Calls {
    /// Calls kept running `grace` after their stream drops, and kept `grace`
    /// after they finish.
    pub fn new(grace: Duration) -> Arc<Self> {
        Arc::new(Self {
            map: Mutex::new(HashMap::new()),
            grace,
        })
    }

    /// The call `key` if it is the one `idempotency_key` started (a
    /// non-empty key only): a start that repeats it joins it.
    pub fn joinable(&self, key: &CallKey, idempotency_key: &str) -> Option<Arc<LiveCall>> {
        if idempotency_key.is_empty() {
            return None;
        }
        self.map
            .lock()
            .expect("calls")
            .get(key)
            .filter(|c| c.idempotency_key == idempotency_key)
            .cloned()
    }

    /// The call `key`, running or finished within the grace period.
    pub fn get(&self, key: &CallKey) -> Option<Arc<LiveCall>> {
        self.map.lock().expect("calls").get(key).cloned()
    }

    /// Registers a new call. Its messages come in on the returned sender
    /// (the pipeline's events, then its result, through [`Self::relay`]);
    /// its approvals go out on `approvals`.
    pub fn register(
        self: &Arc<Self>,
        key: CallKey,
        idempotency_key: &str,
        approvals: mpsc::Sender<ExecuteApproval>,
        cancel: CancellationToken,
    ) -> Arc<LiveCall> {
        let call = Arc::new(LiveCall {
            idempotency_key: idempotency_key.to_owned(),
            inner: Mutex::new(Inner::default()),
            approvals,
            cancel,
            finished: CancellationToken::new(),
        });
        let mut map = self.map.lock().expect("calls");
        if map.len() >= CALLS_MAX {
            // The finished ones first; a runner this busy keeps the running.
            let done: Vec<CallKey> = map
                .iter()
                .filter(|(_, c)| c.inner.lock().expect("call").result.is_some())
                .map(|(k, _)| k.clone())
                .take(map.len() + 1 - CALLS_MAX)
                .collect();
            for k in done {
                map.remove(&k);
            }
        }
        // A reused call id with another key replaces the older entry (which
        // runs on with the stream that started it).
        map.insert(key, call.clone());
        call
    }

    /// Sends the call's messages to whoever follows it, until its result;
    /// keeps the finished call for the grace period, then forgets it.
    pub async fn relay(
        self: Arc<Self>,
        key: CallKey,
        call: Arc<LiveCall>,
        mut from: mpsc::Receiver<ExecuteServerMessage>,
    ) {
        while let Some(m) = from.recv().await {
            let finished = matches!(m.msg, Some(execute_server_message::Msg::Result(_)));
            let to = {
                let mut inner = call.inner.lock().expect("call");
                match &m.msg {
                    Some(execute_server_message::Msg::ApprovalRequired(a)) => {
                        inner.pending = Some(a.clone())
                    }
                    Some(execute_server_message::Msg::Result(r)) => {
                        inner.pending = None;
                        inner.result = Some(r.clone());
                    }
                    _ => {}
                }
                match &inner.follower {
                    Some((id, tx)) => Some((*id, tx.clone())),
                    None => {
                        // The result is kept on its own; an approval asked
                        // while nobody follows is `pending`.
                        if !finished
                            && !matches!(
                                m.msg,
                                Some(execute_server_message::Msg::ApprovalRequired(_))
                            )
                        {
                            if inner.missed.len() == MISSED_MAX {
                                inner.missed.pop_front();
                            }
                            inner.missed.push_back(m.clone());
                        }
                        None
                    }
                }
            };
            if let Some((id, tx)) = to
                && tx.send(m).await.is_err()
            {
                self.detach(&call, id);
            }
            if finished {
                // The follower's stream ends after the result.
                call.inner.lock().expect("call").follower = None;
                call.finished.cancel();
                break;
            }
        }
        // Kept for a late re-attach, then forgotten (unless replaced).
        tokio::time::sleep(self.grace).await;
        let mut map = self.map.lock().expect("calls");
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &call)) {
            map.remove(&key);
        }
    }

    /// A new follower of `call`: it gets the waiting approval and what was
    /// missed (or the result), then everything after. The follower before,
    /// if any, is let go.
    pub fn follow(self: &Arc<Self>, call: &Arc<LiveCall>) -> Following {
        let (tx, rx) = mpsc::channel(MISSED_MAX + 8);
        let mut inner = call.inner.lock().expect("call");
        inner.followers += 1;
        let id = inner.followers;
        if let Some(r) = &inner.result {
            let _ = tx.try_send(ExecuteServerMessage {
                msg: Some(execute_server_message::Msg::Result(r.clone())),
            });
        } else {
            if let Some(a) = &inner.pending {
                let _ = tx.try_send(ExecuteServerMessage {
                    msg: Some(execute_server_message::Msg::ApprovalRequired(a.clone())),
                });
            }
            for m in inner.missed.drain(..) {
                let _ = tx.try_send(m);
            }
            inner.follower = Some((id, tx.clone()));
        }
        let done = inner.result.is_some();
        drop(inner);
        if !done {
            // The follower's stream dropped (its orchestrator is gone):
            // detach. Once the result went out, its sender is let go so
            // the stream ends.
            let (calls, watched) = (self.clone(), call.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = tx.closed() => calls.detach(&watched, id),
                    _ = watched.finished.cancelled() => {}
                }
            });
        }
        Following {
            messages: rx,
            id,
            call: call.clone(),
        }
    }

    /// Follower `id` of `call` is gone: unless another follows it by the
    /// end of the grace period, or it finishes, the call is cancelled.
    pub fn detach(&self, call: &Arc<LiveCall>, id: u64) {
        {
            let mut inner = call.inner.lock().expect("call");
            if inner.follower.as_ref().is_none_or(|(f, _)| *f != id) {
                return;
            }
            inner.follower = None;
            if inner.result.is_some() {
                return;
            }
        }
        tracing::info!(
            grace = ?self.grace,
            "an Execute stream dropped mid-call: the call runs on for the reattach grace period"
        );
        let (call, grace) = (call.clone(), self.grace);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(grace) => {}
                _ = call.cancel.cancelled() => return,
            }
            let inner = call.inner.lock().expect("call");
            if inner.follower.is_none() && inner.result.is_none() && inner.followers == id {
                drop(inner);
                tracing::warn!("nobody re-attached to a call within the grace period: cancelled");
                call.cancel.cancel();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omicos_proto::{ToolOutputChunk, ToolStatus};

    fn key() -> CallKey {
        ("t".into(), "s".into(), "c".into())
    }

    fn chunk(text: &str) -> ExecuteServerMessage {
        ExecuteServerMessage {
            msg: Some(execute_server_message::Msg::Output(ToolOutputChunk {
                text: text.into(),
                ..Default::default()
            })),
        }
    }

    fn result() -> ExecuteServerMessage {
        ExecuteServerMessage {
            msg: Some(execute_server_message::Msg::Result(ToolResult {
                call_id: "c".into(),
                status: ToolStatus::Done as i32,
                result: "ok".into(),
                ..Default::default()
            })),
        }
    }

    #[tokio::test]
    async fn a_call_whose_follower_dropped_runs_on_and_is_followed_again() {
        let calls = Calls::new(Duration::from_secs(30));
        let (atx, _arx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let call = calls.register(key(), "k1", atx, cancel.clone());
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(calls.clone().relay(key(), call.clone(), rx));
        let first = calls.follow(&call);
        tx.send(chunk("a")).await.unwrap();
        drop(first);
        // Produced while nobody follows: kept for the next follower.
        tx.send(chunk("b")).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!cancel.is_cancelled(), "the call runs on");
        let joined = calls.joinable(&key(), "k1").expect("the same key joins");
        assert!(calls.joinable(&key(), "other").is_none());
        assert!(calls.joinable(&key(), "").is_none());
        let mut again = calls.follow(&joined);
        tx.send(result()).await.unwrap();
        let mut got = vec![];
        while let Some(m) = again.messages.recv().await {
            let end = matches!(m.msg, Some(execute_server_message::Msg::Result(_)));
            got.push(m);
            if end {
                break;
            }
        }
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], chunk("b"));
        // Finished: a late follower gets the result alone.
        let mut late = calls.follow(&calls.get(&key()).unwrap());
        assert!(matches!(
            late.messages.recv().await.unwrap().msg,
            Some(execute_server_message::Msg::Result(_))
        ));
    }

    #[tokio::test]
    async fn nobody_back_within_the_grace_period_cancels_the_call() {
        let calls = Calls::new(Duration::from_millis(300));
        let (atx, _arx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let call = calls.register(key(), "", atx, cancel.clone());
        let (_tx, rx) = mpsc::channel(8);
        tokio::spawn(calls.clone().relay(key(), call.clone(), rx));
        drop(calls.follow(&call));
        tokio::task::yield_now().await;
        assert!(!cancel.is_cancelled(), "not at once: the grace period runs");
        tokio::time::timeout(Duration::from_secs(10), cancel.cancelled())
            .await
            .expect("the grace period ended with nobody back: cancelled");
    }

    #[tokio::test]
    async fn a_pending_approval_is_asked_again_of_the_next_follower() {
        let calls = Calls::new(Duration::from_secs(30));
        let (atx, mut arx) = mpsc::channel(1);
        let call = calls.register(key(), "", atx, CancellationToken::new());
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(calls.clone().relay(key(), call.clone(), rx));
        let mut first = calls.follow(&call);
        tx.send(ExecuteServerMessage {
            msg: Some(execute_server_message::Msg::ApprovalRequired(
                ApprovalRequired {
                    call_id: "c".into(),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
        assert!(first.messages.recv().await.is_some());
        drop(first);
        let mut second = calls.follow(&call);
        assert!(matches!(
            second.messages.recv().await.unwrap().msg,
            Some(execute_server_message::Msg::ApprovalRequired(_))
        ));
        second.call.approve(ExecuteApproval::default()).await;
        assert!(arx.recv().await.is_some(), "the answer reaches the call");
        let third = calls.follow(&call);
        drop(second);
        let mut third = third;
        assert!(
            third.messages.try_recv().is_err(),
            "an answered approval is not asked again"
        );
    }
}
