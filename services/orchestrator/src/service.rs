//! The `omicos.v1.Orchestrator` gRPC service.

use crate::engine::{Engine, Frame, TurnSettings};
use crate::hub::{Hub, RunningTurn, SessionState, is_turn_done};
use crate::runner_client::EventTag;
use omicos_proto::{
    ApproveToolRequest, ApproveToolResponse, AttachRequest, CancelTurnRequest, CancelTurnResponse,
    ChatClientMessage, ChatEvent, ChatRequest, Decision, DeleteSessionRequest,
    DeleteSessionResponse, ErrorEvent, GetSessionRequest, Heartbeat, ListAgentToolsRequest,
    ListAgentToolsResponse, ListAgentsRequest, ListAgentsResponse, ListSessionsRequest,
    ListSessionsResponse, ListToolsRequest, PermissionMode, RefreshCatalogRequest,
    RefreshCatalogResponse, Session, SessionSummary, TurnDone, TurnDoneReason, TurnStarted,
    chat_client_message, chat_event, orchestrator_server::Orchestrator,
};
use omicos_sessionstore::{SessionMeta, now_ms};
use prost::Message;
use serde_json::json;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

type EventStream = Pin<Box<dyn Stream<Item = Result<ChatEvent, Status>> + Send>>;

/// The orchestrator service.
pub struct OrchestratorService {
    engine: Arc<Engine>,
    hub: Arc<Hub>,
    instance: String,
    streams_stop: CancellationToken,
}

impl OrchestratorService {
    /// A service over `engine` and `hub`. `streams_stop` ends long streams at the end of the drain.
    pub fn new(engine: Arc<Engine>, hub: Arc<Hub>, streams_stop: CancellationToken) -> Self {
        Self {
            engine,
            hub,
            instance: uuid::Uuid::new_v4().simple().to_string(),
            streams_stop,
        }
    }

    fn heartbeat(&self) -> Duration {
        Duration::from_secs(self.engine.config.heartbeat_secs.max(1))
    }
}

/// Parses a client's permission mode text; the message says what is accepted.
fn parse_mode(text: &str) -> Result<PermissionMode, Status> {
    PermissionMode::parse(text).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn one_shot_error(session_id: &str, kind: &str, message: String) -> EventStream {
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
struct Pump {
    tx: mpsc::Sender<Result<ChatEvent, Status>>,
    state: Arc<SessionState>,
    last_sent: u64,
    heartbeat: Duration,
    stop: CancellationToken,
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
    async fn backfill(&mut self, until_turn: &str) -> Result<bool, ()> {
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

    async fn follow(mut self, mut rx: broadcast::Receiver<ChatEvent>, until_turn: String) {
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
    async fn start_turn(
        &self,
        cr: ChatRequest,
    ) -> Result<(Arc<SessionState>, String, u64), Result<EventStream, Status>> {
        let mode = parse_mode(&cr.permission_mode).map_err(Err)?;
        if cr.message.trim().is_empty() {
            return Err(Err(Status::invalid_argument("message is empty")));
        }
        let store = self.hub.store().clone();
        let existing = if cr.session_id.is_empty() {
            None
        } else {
            match store.get_session(&cr.session_id).await {
                Ok(Some(m)) => Some(m),
                Ok(None) => {
                    return Err(Ok(one_shot_error(
                        &cr.session_id,
                        "session_not_found",
                        format!(
                            "session `{}` does not exist; leave session_id empty to start a new one",
                            cr.session_id
                        ),
                    )));
                }
                Err(e) => return Err(Err(Status::unavailable(e.to_string()))),
            }
        };
        // A continued session keeps its team unless the request names one.
        let members = if cr.team_members.is_empty() {
            existing
                .as_ref()
                .map(|m| m.team_members.clone())
                .unwrap_or_default()
        } else {
            cr.team_members.clone()
        };
        let active = if cr.agent.is_empty() {
            existing
                .as_ref()
                .map(|m| m.agent.clone())
                .unwrap_or_default()
        } else {
            cr.agent.clone()
        };
        let team = self
            .engine
            .agents
            .resolve_team(&members, &active)
            .map_err(|e| Err(Status::failed_precondition(e)))?;
        let session_id = if cr.session_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            cr.session_id.clone()
        };
        let now = now_ms();
        let meta = SessionMeta {
            id: session_id.clone(),
            title: existing
                .as_ref()
                .map(|m| m.title.clone())
                .unwrap_or_else(|| cr.message.chars().take(80).collect()),
            agent: team.active.id.clone(),
            team_members: team.members.clone(),
            created_ms: existing.as_ref().map(|m| m.created_ms).unwrap_or(now),
            last_active_ms: now,
        };
        store
            .put_session(&meta)
            .await
            .map_err(|e| Err(Status::unavailable(e.to_string())))?;
        let state = self.hub.state(&session_id).await;
        let turn_id = uuid::Uuid::new_v4().simple().to_string();
        let owner = format!("{}:{turn_id}", self.instance);
        let lease_ms = (self.engine.config.turn_lease_secs.max(5) * 1000) as i64;
        let cancel = CancellationToken::new();
        if !state.start_turn(RunningTurn {
            turn_id: turn_id.clone(),
            cancel: cancel.clone(),
        }) {
            return Err(Err(busy(&session_id)));
        }
        match store.try_lease_turn(&session_id, &owner, lease_ms).await {
            Ok(true) => {}
            Ok(false) => {
                state.end_turn(&turn_id);
                return Err(Err(busy(&session_id)));
            }
            Err(e) => {
                state.end_turn(&turn_id);
                return Err(Err(Status::unavailable(e.to_string())));
            }
        }
        state.sync_seq().await;
        let start_seq = state.last_seq().await;
        let settings = TurnSettings {
            turn_id: turn_id.clone(),
            permission_mode: mode,
            allow_shell: cr.allow_shell,
            allow_file_write: cr.allow_file_write,
            model: cr.model.clone(),
            provider: cr.provider.clone(),
            max_iterations: if cr.max_tool_iterations == 0 {
                self.engine.config.max_tool_iterations
            } else {
                cr.max_tool_iterations
            },
            team: team.members.clone(),
        };
        let engine = self.engine.clone();
        let st = state.clone();
        let message = cr.message.clone();
        let turn_id_out = turn_id.clone();
        let active_agent = team.active.clone();
        tokio::spawn(async move {
            // Renew the lease while the turn runs.
            let renew = {
                let st = st.clone();
                let owner = owner.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(lease_ms as u64 / 3)).await;
                        let _ = st.store().try_lease_turn(&st.id, &owner, lease_ms).await;
                    }
                })
            };
            let tag = EventTag {
                turn_id: turn_id.clone(),
                context: "root".into(),
                agent_id: active_agent.id.clone(),
            };
            st.emit(tag.event(chat_event::Kind::TurnStarted(TurnStarted {
                message: message.clone(),
                agent: active_agent.id.clone(),
                team_members: settings.team.clone(),
                permission_mode: settings.permission_mode as i32,
            })))
            .await;
            engine
                .trajectories
                .append(&st.id, json!({"type": "user", "turn_id": turn_id, "agent": active_agent.id, "content": message}))
                .await;
            let mut history = st.store().messages(&st.id).await.unwrap_or_default();
            let user = json!({"role": "user", "content": message});
            if let Err(e) = st
                .store()
                .append_messages(&st.id, std::slice::from_ref(&user))
                .await
            {
                tracing::error!(error = %e, "user message not persisted");
            }
            history.push(user);
            let mut frame = Frame {
                agent: active_agent,
                messages: history,
                depth: 0,
                chain: vec![],
                context: "root".into(),
                persist: true,
                last_text: Arc::new(Mutex::new(String::new())),
            };
            let outcome = engine.run_frame(&st, &settings, &mut frame, &cancel).await;
            let reason = outcome.reason();
            engine
                .trajectories
                .append(
                    &st.id,
                    json!({"type": "turn_done", "turn_id": turn_id, "reason": reason.as_str()}),
                )
                .await;
            renew.abort();
            let _ = st.store().release_turn(&st.id, &owner).await;
            st.emit_final(
                tag.event(chat_event::Kind::TurnDone(TurnDone {
                    reason: reason as i32,
                })),
                &turn_id,
            )
            .await;
        });
        Ok((state, turn_id_out, start_seq))
    }
}

fn busy(session: &str) -> Status {
    Status::failed_precondition(format!(
        "session `{session}` is busy: a turn is running. Wait for its turn_done (Attach follows it) or cancel it with CancelTurn"
    ))
}

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    type ChatStream = EventStream;

    async fn chat(
        &self,
        req: Request<Streaming<ChatClientMessage>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty Chat stream"))?;
        let Some(chat_client_message::Msg::Request(cr)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first Chat message must be a ChatRequest",
            ));
        };
        tracing::info!(session = %cr.session_id, agent = %cr.agent, "chat request");
        let (state, turn_id, start_seq) = match self.start_turn(cr).await {
            Ok(x) => x,
            Err(Ok(stream)) => return Ok(Response::new(stream)),
            Err(Err(status)) => return Err(status),
        };
        // Subscribe, then backfill from start_seq: nothing between is lost.
        let rx = state.subscribe();
        let (tx, out) = mpsc::channel(512);
        let pump = Pump {
            tx,
            state: state.clone(),
            last_sent: start_seq,
            heartbeat: self.heartbeat(),
            stop: self.streams_stop.clone(),
        };
        let t = turn_id.clone();
        let hub = self.hub.clone();
        let sid = state.id.clone();
        tokio::spawn(async move {
            let mut pump = pump;
            match pump.backfill(&t).await {
                Ok(true) | Err(()) => drop(pump),
                Ok(false) => pump.follow(rx, t).await,
            }
            // Give the turn task a moment to let go of the session, then drop idle state.
            tokio::time::sleep(Duration::from_millis(200)).await;
            hub.release_if_idle(&sid);
        });
        // Later client messages: approvals and cancel. The turn outlives the stream.
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                match m.msg {
                    Some(chat_client_message::Msg::Approval(a)) => {
                        let d = Decision::try_from(a.decision).unwrap_or(Decision::Deny);
                        if !st.resolve_approval(&a.call_id, d) {
                            tracing::warn!(call_id = %a.call_id, "approval for a call that is not waiting");
                        }
                    }
                    Some(chat_client_message::Msg::Cancel(_)) => {
                        if let Some(t) = st.running() {
                            t.cancel.cancel();
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    type AttachStream = EventStream;

    async fn attach(
        &self,
        req: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let req = req.into_inner();
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
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn cancel_turn(
        &self,
        req: Request<CancelTurnRequest>,
    ) -> Result<Response<CancelTurnResponse>, Status> {
        let id = req.into_inner().session_id;
        let cancelled = self
            .hub
            .existing(&id)
            .and_then(|s| s.running())
            .map(|t| t.cancel.cancel())
            .is_some();
        Ok(Response::new(CancelTurnResponse { cancelled }))
    }

    async fn approve_tool(
        &self,
        req: Request<ApproveToolRequest>,
    ) -> Result<Response<ApproveToolResponse>, Status> {
        let r = req.into_inner();
        let decision = Decision::try_from(r.decision)
            .ok()
            .filter(|d| *d != Decision::Unspecified)
            .ok_or_else(|| {
                Status::invalid_argument("decision must be ALLOW_ONCE, ALLOW_SESSION or DENY")
            })?;
        let ok = self
            .hub
            .existing(&r.session_id)
            .is_some_and(|s| s.resolve_approval(&r.call_id, decision));
        if ok {
            Ok(Response::new(ApproveToolResponse {}))
        } else {
            Err(Status::not_found(format!(
                "no approval is pending for call `{}` in session `{}`",
                r.call_id, r.session_id
            )))
        }
    }

    async fn list_agents(
        &self,
        _req: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        let (agents, deployment_tier) = self.engine.agents.list();
        Ok(Response::new(ListAgentsResponse {
            agents,
            deployment_tier,
        }))
    }

    async fn list_sessions(
        &self,
        req: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        let limit = match req.into_inner().limit {
            0 => 100,
            n => n as usize,
        };
        let store = self.hub.store();
        let metas = store
            .list_sessions(limit)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut sessions = Vec::with_capacity(metas.len());
        for m in metas {
            let last = store.last_seq(&m.id).await.unwrap_or(0);
            sessions.push(summary(m, last));
        }
        Ok(Response::new(ListSessionsResponse { sessions }))
    }

    async fn get_session(
        &self,
        req: Request<GetSessionRequest>,
    ) -> Result<Response<Session>, Status> {
        let id = req.into_inner().session_id;
        let store = self.hub.store();
        let meta = store
            .get_session(&id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("session `{id}` does not exist")))?;
        let messages = store
            .messages(&id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let last = store.last_seq(&id).await.unwrap_or(0);
        Ok(Response::new(Session {
            summary: Some(summary(meta, last)),
            messages_json: messages.iter().map(|m| m.to_string()).collect(),
        }))
    }

    async fn delete_session(
        &self,
        req: Request<DeleteSessionRequest>,
    ) -> Result<Response<DeleteSessionResponse>, Status> {
        let id = req.into_inner().session_id;
        if self.hub.existing(&id).and_then(|s| s.running()).is_some() {
            return Err(busy(&id));
        }
        let deleted = self
            .hub
            .store()
            .delete_session(&id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        self.hub.forget(&id);
        Ok(Response::new(DeleteSessionResponse { deleted }))
    }

    async fn refresh_catalog(
        &self,
        _req: Request<RefreshCatalogRequest>,
    ) -> Result<Response<RefreshCatalogResponse>, Status> {
        Ok(Response::new(self.engine.agents.refresh()))
    }

    async fn list_agent_tools(
        &self,
        req: Request<ListAgentToolsRequest>,
    ) -> Result<Response<ListAgentToolsResponse>, Status> {
        let r = req.into_inner();
        let mode = parse_mode(&r.permission_mode)?;
        let team = self
            .engine
            .agents
            .resolve_team(&[], &r.agent)
            .map_err(Status::failed_precondition)?;
        let toolsets: Vec<String> = team
            .active
            .toolsets
            .iter()
            .filter(|t| *t != "team")
            .cloned()
            .collect();
        let mut tools = self
            .engine
            .runner
            .list_tools(ListToolsRequest {
                toolsets,
                permission_mode: mode as i32,
                allow_shell: None,
                allow_file_write: None,
            })
            .await?;
        let mut defs: Vec<crate::llm::ToolDef> = tools
            .iter()
            .map(|t| crate::llm::ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: serde_json::from_str(&t.input_schema_json)
                    .unwrap_or_else(|_| json!({"type": "object"})),
            })
            .collect();
        if team.active.toolsets.iter().any(|t| t == "team") {
            for d in crate::engine::team_tools() {
                tools.push(omicos_proto::ToolSpec {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    input_schema_json: d.parameters.to_string(),
                    toolset: "team".into(),
                    provider: "orchestrator".into(),
                    ..Default::default()
                });
                defs.push(d);
            }
        }
        let llm_tools = if r.format == "anthropic" {
            crate::llm::anthropic::tools_json(&defs)
        } else {
            crate::llm::openai::tools_json(&defs)
        };
        Ok(Response::new(ListAgentToolsResponse {
            tools,
            llm_tools_json: llm_tools.to_string(),
        }))
    }
}

fn summary(m: SessionMeta, last_event_seq: u64) -> SessionSummary {
    SessionSummary {
        session_id: m.id,
        title: m.title,
        agent: m.agent,
        team_members: m.team_members,
        created_ms: m.created_ms,
        last_active_ms: m.last_active_ms,
        last_event_seq,
    }
}
