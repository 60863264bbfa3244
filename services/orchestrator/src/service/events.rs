//! The event stream a client follows: [`Pump`] (backfill from the store,
//! live events, heartbeats) and the Attach RPC.

use super::{EventStream, OrchestratorService};
use crate::hub::{SessionState, is_turn_done};
use omicos_proto::{
    AttachRequest, ChatEvent, ErrorEvent, Heartbeat, TurnDone, TurnDoneReason, chat_event,
};
use omicos_sessionstore::now_ms;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// A stream of one error event and a TurnDone(ERROR), for a request that
/// cannot start a turn but is answered in-band (an unknown session).
pub(super) fn one_shot_error(session_id: &str, kind: &str, message: String) -> EventStream {
    let mk = |seq, k| ChatEvent {
        session_id: session_id.to_owned(),
        event_seq: seq,
        execution_context_id: "root".into(),
        timestamp_ms: now_ms(),
        kind: Some(k),
        ..Default::default()
    };
    let events = vec![
        Ok(mk(
            0,
            chat_event::Kind::Error(ErrorEvent {
                kind: kind.into(),
                message,
            }),
        )),
        Ok(mk(
            0,
            chat_event::Kind::TurnDone(TurnDone {
                reason: TurnDoneReason::Error as i32,
            }),
        )),
    ];
    Box::pin(tokio_stream::iter(events))
}

/// Sends events to a client: backfills gaps from the store, adds heartbeats,
/// and ends after the TurnDone of `until_turn` (or when the client leaves).
pub(super) struct Pump {
    pub(super) tx: mpsc::Sender<Result<ChatEvent, Status>>,
    pub(super) state: Arc<SessionState>,
    pub(super) last_sent: u64,
    pub(super) heartbeat: Duration,
    pub(super) stop: CancellationToken,
}

impl Pump {
    async fn send(&mut self, ev: ChatEvent) -> bool {
        if ev.event_seq <= self.last_sent {
            return true;
        }
        self.last_sent = ev.event_seq;
        self.tx.send(Ok(ev)).await.is_ok()
    }

    /// Sends stored events after last_sent; returns whether `until_turn` finished.
    pub(super) async fn backfill(&mut self, until_turn: &str) -> Result<bool, ()> {
        let stored = self
            .state
            .store()
            .events_since(&self.state.id, self.last_sent)
            .await
            .map_err(|_| ())?;
        let mut done = false;
        for (_, bytes) in stored {
            if let Ok(ev) = ChatEvent::decode(bytes.as_slice()) {
                done |= is_turn_done(&ev, until_turn);
                if !self.send(ev).await {
                    return Err(());
                }
            }
        }
        Ok(done)
    }

    pub(super) async fn follow(
        mut self,
        mut rx: broadcast::Receiver<ChatEvent>,
        until_turn: String,
    ) {
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.tick().await;
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(ev) => {
                        if ev.event_seq > self.last_sent + 1 {
                            match self.backfill(&until_turn).await {
                                Ok(true) => return,
                                Ok(false) => {}
                                Err(()) => return,
                            }
                        }
                        let done = is_turn_done(&ev, &until_turn);
                        if !self.send(ev).await || done {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => match self.backfill(&until_turn).await {
                        Ok(true) | Err(()) => return,
                        Ok(false) => {}
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    let hb = ChatEvent {
                        session_id: self.state.id.clone(),
                        turn_id: until_turn.clone(),
                        event_seq: self.last_sent,
                        timestamp_ms: now_ms(),
                        kind: Some(chat_event::Kind::Heartbeat(Heartbeat {})),
                        ..Default::default()
                    };
                    if self.tx.send(Ok(hb)).await.is_err() {
                        return;
                    }
                }
                _ = self.tx.closed() => return,
                _ = self.stop.cancelled() => {
                    let _ = self.tx.send(Err(Status::unavailable("the orchestrator is shutting down; attach again with since_seq"))).await;
                    return;
                }
            }
        }
    }
}

impl OrchestratorService {
    /// Attach: replays a session's events after `since_seq`, then follows the live turn.
    pub(super) async fn attach_rpc(&self, req: AttachRequest) -> Result<EventStream, Status> {
        let store = self.hub.store().clone();
        if store
            .get_session(&req.session_id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .is_none()
        {
            return Err(Status::not_found(format!(
                "session `{}` does not exist",
                req.session_id
            )));
        }
        let state = self.hub.state(&req.session_id).await;
        let rx = state.subscribe();
        let running = state.running();
        let (tx, out) = mpsc::channel(512);
        let mut pump = Pump {
            tx,
            state: state.clone(),
            last_sent: req.since_seq,
            heartbeat: self.heartbeat(),
            stop: self.streams_stop.clone(),
        };
        let lease = Duration::from_secs(self.engine.config.turn_lease_secs.max(5));
        tokio::spawn(async move {
            match running {
                Some(t) => {
                    if let Ok(false) = pump.backfill(&t.turn_id).await {
                        pump.follow(rx, t.turn_id).await;
                    }
                }
                None => {
                    // Replay; if the log shows a turn still open (another replica runs it), poll the store.
                    let mut idle_since = tokio::time::Instant::now();
                    // Whether the log shows a turn that has started and not finished
                    // (read from the start when the client resumes mid-log).
                    let mut open = false;
                    if req.since_seq > 0
                        && let Ok(earlier) =
                            pump.state.store().events_since(&pump.state.id, 0).await
                    {
                        for (_, b) in earlier.iter().take_while(|(seq, _)| *seq <= req.since_seq) {
                            match ChatEvent::decode(b.as_slice()).map(|e| e.kind) {
                                Ok(Some(chat_event::Kind::TurnStarted(_))) => open = true,
                                Ok(Some(chat_event::Kind::TurnDone(_))) => open = false,
                                _ => {}
                            }
                        }
                    }
                    loop {
                        let before = pump.last_sent;
                        let Ok(stored) = pump
                            .state
                            .store()
                            .events_since(&pump.state.id, pump.last_sent)
                            .await
                        else {
                            return;
                        };
                        for (_, b) in stored {
                            if let Ok(ev) = ChatEvent::decode(b.as_slice()) {
                                match ev.kind {
                                    Some(chat_event::Kind::TurnStarted(_)) => open = true,
                                    Some(chat_event::Kind::TurnDone(_)) => open = false,
                                    _ => {}
                                }
                                if !pump.send(ev).await {
                                    return;
                                }
                            }
                        }
                        if pump.last_sent > before {
                            idle_since = tokio::time::Instant::now();
                        } else if idle_since.elapsed() > lease * 2 {
                            return;
                        }
                        if !open {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
        });
        Ok(Box::pin(ReceiverStream::new(out)))
    }
}
