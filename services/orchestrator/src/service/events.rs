//! The event stream a client follows: [`Pump`] (backfill from the store,
//! live events, heartbeats) and the Attach RPC.

use super::{EventStream, OrchestratorService};
use crate::error::OrchestratorError;
use crate::hub::{SessionState, is_turn_done};
use async_fn_stream::{StreamEmitter, fn_stream};
use omicos_proto::{
    AttachRequest, ChatEvent, ErrorEvent, Heartbeat, TurnDone, TurnDoneReason, chat_event,
};
use omicos_sessionstore::now_ms;
use prost::Message;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// A stream of one error event and a TurnDone(ERROR), for a request that
/// cannot start a turn but is answered in-band (an unknown session).
/// `hint` is appended to the message (what the client can do instead).
pub(super) fn one_shot_error(
    session_id: &str,
    error: &OrchestratorError,
    hint: &str,
) -> EventStream {
    let events = one_shot_events(session_id, error, hint).into_iter().map(Ok);
    Box::pin(tokio_stream::iter(events.collect::<Vec<_>>()))
}

/// The events of [`one_shot_error`] (the session guard sends them itself).
pub(super) fn one_shot_events(
    session_id: &str,
    error: &OrchestratorError,
    hint: &str,
) -> Vec<ChatEvent> {
    let mk = |k| ChatEvent {
        session_id: session_id.to_owned(),
        event_seq: 0,
        execution_context_id: "root".into(),
        timestamp_ms: now_ms(),
        kind: Some(k),
        ..Default::default()
    };
    vec![
        mk(chat_event::Kind::Error(ErrorEvent {
            kind: error.kind().as_str().into(),
            message: crate::bound::error_message(&format!("{}{hint}", error.report())),
        })),
        mk(chat_event::Kind::TurnDone(TurnDone {
            reason: TurnDoneReason::Error as i32,
            ..Default::default()
        })),
    ]
}

/// Whether a [`Pump`] goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    /// Keep following the session.
    Continue,
    /// Done: the turn it follows finished, or the client left.
    Stop,
}

/// Sends events to a client: backfills gaps from the store, adds heartbeats,
/// and ends after the TurnDone of `until_turn`. It runs inside the client's
/// response stream ([`Pump::stream`]), not as a task of its own: an event goes
/// from the session's broadcast straight into the response body, with no
/// channel and no wake-up of another task in between; when the client
/// leaves, the body and the pump with it are dropped.
pub(super) struct Pump {
    out: StreamEmitter<Result<ChatEvent, Status>>,
    state: Arc<SessionState>,
    last_sent: u64,
    heartbeat: Duration,
    stop: CancellationToken,
}

/// What a [`Pump`] starts from.
pub(super) struct PumpStart {
    /// The session it follows.
    pub(super) state: Arc<SessionState>,
    /// The last seq the client has.
    pub(super) last_sent: u64,
    /// How often to send a heartbeat while nothing happens.
    pub(super) heartbeat: Duration,
    /// Ends the stream at the end of the drain.
    pub(super) stop: CancellationToken,
}

impl Pump {
    /// The client's event stream, written by `run` through a pump.
    pub(super) fn stream<F, Fut>(start: PumpStart, run: F) -> EventStream
    where
        F: FnOnce(Pump) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Box::pin(fn_stream(move |out| {
            run(Pump {
                out,
                state: start.state,
                last_sent: start.last_sent,
                heartbeat: start.heartbeat,
                stop: start.stop,
            })
        }))
    }

    /// Sends one event unless the client already has it.
    async fn send(&mut self, ev: ChatEvent) {
        if ev.event_seq <= self.last_sent {
            return;
        }
        self.last_sent = ev.event_seq;
        // Large values keep a head (crate::bound): the stream stays under
        // the message limit whatever the model sent.
        self.out.emit(Ok(crate::bound::event(ev))).await;
    }

    /// Ends the client's stream with `error`'s status, so it knows to attach
    /// again with since_seq rather than take a silent end for the end of the turn.
    pub(super) async fn fail(&self, error: OrchestratorError) {
        tracing::warn!(session = %self.state.id, error = %error.report(), "event stream ended on an error");
        self.out.emit(Err(error.into())).await;
    }

    /// Stored events after `last_sent`, in order; the store's error when they cannot be read.
    async fn stored(&self, since: u64) -> Result<Vec<ChatEvent>, OrchestratorError> {
        let stored = self
            .state
            .store()
            .events_since(&self.state.id, since)
            .await?;
        Ok(stored
            .into_iter()
            .filter_map(|(seq, bytes)| match ChatEvent::decode(bytes.as_slice()) {
                Ok(ev) => Some(ev),
                Err(e) => {
                    // A damaged record must not stop the stream; the gap shows in event_seq.
                    tracing::error!(session = %self.state.id, seq, error = %e, "stored event does not decode");
                    None
                }
            })
            .collect())
    }

    /// Sends stored events after last_sent; stops once `until_turn` finished.
    pub(super) async fn backfill(&mut self, until_turn: &str) -> Result<Flow, OrchestratorError> {
        let mut flow = Flow::Continue;
        for ev in self.stored(self.last_sent).await? {
            if is_turn_done(&ev, until_turn) {
                flow = Flow::Stop;
            }
            self.send(ev).await;
        }
        Ok(flow)
    }

    /// Follows live events until `until_turn` finishes or the drain ends.
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
                                Ok(Flow::Continue) => {}
                                Ok(Flow::Stop) => return,
                                Err(e) => return self.fail(e).await,
                            }
                        }
                        let done = is_turn_done(&ev, &until_turn);
                        self.send(ev).await;
                        if done {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => match self.backfill(&until_turn).await {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Stop) => return,
                        Err(e) => return self.fail(e).await,
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
                    self.out.emit(Ok(hb)).await;
                }
                _ = self.stop.cancelled() => return self.fail(OrchestratorError::ShuttingDown).await,
            }
        }
    }

    /// Replays the log when no turn runs on this replica; while the log shows
    /// a turn still open (another replica runs it), follows it through the
    /// store's notices (no polling). When that replica's lease expires, the
    /// turn is closed here if no other replica did it first ([`crate::recovery`]).
    async fn replay(&mut self, since_seq: u64, lost: LostTurns) -> Result<(), OrchestratorError> {
        // Subscribe before reading, so an event written in between is not missed.
        let mut notices = self.state.store().notices();
        // Whether the log shows a turn that has started and not finished
        // (read from the start when the client resumes mid-log).
        let mut open = false;
        if since_seq > 0 {
            for ev in self.stored(0).await? {
                if ev.event_seq > since_seq {
                    break;
                }
                match ev.kind {
                    Some(chat_event::Kind::TurnStarted(_)) => open = true,
                    Some(chat_event::Kind::TurnDone(_)) => open = false,
                    _ => {}
                }
            }
        }
        // How often to look whether the turn's replica is still renewing its lease.
        let check = (lost.lease / 5).max(Duration::from_millis(500));
        let mut next_check = tokio::time::Instant::now() + check;
        loop {
            for ev in self.stored(self.last_sent).await? {
                match ev.kind {
                    Some(chat_event::Kind::TurnStarted(_)) => open = true,
                    Some(chat_event::Kind::TurnDone(_)) => open = false,
                    _ => {}
                }
                self.send(ev).await;
            }
            if !open {
                return Ok(());
            }
            loop {
                tokio::select! {
                    n = notices.recv() => match n {
                        Ok(n) if n.session().is_some_and(|s| s != self.state.id) => continue,
                        Ok(omicos_sessionstore::Notice::Approval { .. } | omicos_sessionstore::Notice::Cancel { .. }) => continue,
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return Ok(()),
                    },
                    _ = tokio::time::sleep_until(next_check) => {
                        next_check = tokio::time::Instant::now() + check;
                        if let Err(e) = crate::recovery::recover_if_lost(&lost.hub, &lost.engine, &self.state.id, &lost.instance).await {
                            tracing::warn!(session = %self.state.id, error = %e.report(), "lost turn not closed");
                        }
                        break;
                    }
                    _ = self.stop.cancelled() => return Err(OrchestratorError::ShuttingDown),
                }
            }
        }
    }
}

/// What an Attach needs to close a turn whose replica was lost.
pub(super) struct LostTurns {
    pub(super) hub: Arc<crate::hub::Hub>,
    pub(super) engine: Arc<crate::engine::Engine>,
    pub(super) instance: String,
    pub(super) lease: Duration,
}

impl OrchestratorService {
    /// Attach: replays a session's events after `since_seq`, then follows the live turn.
    pub(super) async fn attach_rpc(
        &self,
        owned: &super::guard::Owned,
        req: AttachRequest,
    ) -> Result<EventStream, OrchestratorError> {
        let id = owned.id();
        // Deleted since the guard read it: gone.
        if self.hub.store().get_session(id).await?.is_none() {
            return Err(OrchestratorError::SessionNotFound(id.to_owned()));
        }
        let state = self.hub.state(id).await?;
        let rx = state.subscribe();
        let running = state.running();
        let lost = LostTurns {
            hub: self.hub.clone(),
            engine: self.engine.clone(),
            instance: self.instance.clone(),
            lease: self.engine.config.turn_lease,
        };
        let start = PumpStart {
            state,
            last_sent: req.since_seq,
            heartbeat: self.heartbeat(),
            stop: self.streams_stop.clone(),
        };
        Ok(Pump::stream(start, move |mut pump| async move {
            match running {
                Some(t) => match pump.backfill(&t.turn_id).await {
                    Ok(Flow::Continue) => pump.follow(rx, t.turn_id).await,
                    Ok(Flow::Stop) => {}
                    Err(e) => pump.fail(e).await,
                },
                None => {
                    if let Err(e) = pump.replay(req.since_seq, lost).await {
                        pump.fail(e).await;
                    }
                }
            }
        }))
    }
}
