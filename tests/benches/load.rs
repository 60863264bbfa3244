//! The event path at scale (issue 15): N concurrent Chat streams through the
//! real gRPC server (orchestrator and tool-runner on 127.0.0.1) against an
//! in-process fake OpenAI-compatible LLM. Each turn: one `file_manager__list`
//! call, then 400 characters of text in 80 deltas. For the memory, SQLite and
//! PostgreSQL stores it prints CPU per turn, events/s, event latency p50/p99
//! (a delta leaving the fake server → the client receiving it) and resident
//! memory per idle session; and, in the same run, the floor: the same events
//! over a bare tonic stream with nothing behind it. Every turn is checked:
//! gap-free seqs, every delta once and in order, and the client's events
//! equal to the store's log. Any loss or doubling fails the run.
//!
//! `cargo bench -p omicos-e2e --bench load` (release). Settings:
//! `LOAD_TURNS` (default `100,1000`), `LOAD_IDLE` (10000), `LOAD_STORES`
//! (`memory,sqlite,postgres`; PostgreSQL is skipped when it does not answer),
//! `LOAD_DELTA_MS` (pause between two deltas of one stream, default 10),
//! `LOAD_RAMP_MS` (the turns' starts spread evenly over it; default 0, all
//! at once), `LOAD_ROUNDS` (default 1; each round runs every store once, in
//! turn, and a last table gives each store's median CPU per turn and its
//! ratio to the memory store's of the same round), `LOAD_TAIL_MS` (unset
//! or 0: off; else, after each store's row, where in the run the deltas older
//! than that many ms arrived: per 250 ms window, how many and the oldest).
//!
//! The last column is the host's CPU steal during the run (/proc/stat): on
//! a shared VM, a run with much of it measured the host, not the event path.
//! Before each run the bench writes the machine's dirty pages back
//! (`sync(2)`) and pauses 0.3 s, so that no run pays for the disk writes of
//! the one before.
//!
//! CPU is the orchestrator's own: the threads of the runtime it runs on (and
//! SQLite's worker threads), read from /proc; the client, the fake LLM and
//! the tool-runner run on another runtime. A PostgreSQL server's CPU is not
//! in it.

use axum::body::Body;
use bytes::Bytes;
use omicos_orchestrator::{Parts, agents::SingleAgent, config::Config};
use omicos_proto::orchestrator_server::{Orchestrator, OrchestratorServer};
use omicos_proto::*;
use omicos_servicekit::Shutdown;
use omicos_sessionstore::SessionStore;
use prost::Message;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const DELTAS: usize = 80;
const DELTA_CHARS: usize = 5;
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/// 64^5 µs: the delta's 5 characters carry its send time modulo this (about 18 minutes).
const WRAP: u64 = 1 << 30;

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Five characters that carry the time they were made.
fn stamp() -> String {
    let mut t = now_us() % WRAP;
    let mut out = [0u8; DELTA_CHARS];
    for c in out.iter_mut().rev() {
        *c = ALPHABET[(t % 64) as usize];
        t /= 64;
    }
    String::from_utf8(out.to_vec()).unwrap()
}

/// Microseconds since the delta `text` was made; None when it is not a stamp.
fn age_us(text: &str) -> Option<u64> {
    if text.len() != DELTA_CHARS {
        return None;
    }
    let mut t = 0u64;
    for b in text.bytes() {
        t = t * 64 + ALPHABET.iter().position(|a| *a == b)? as u64;
    }
    Some((now_us() % WRAP + WRAP - t) % WRAP)
}

// ---------------------------------------------------------------- fake LLM

fn sse(v: serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The fake model: the first request of a turn calls `file_manager__list`;
/// the request with its result gets 80 stamped deltas, `pause` apart.
async fn fake_llm(pause: Duration) -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: Bytes| async move {
            let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let after_tool = req["messages"]
                .as_array()
                .and_then(|m| m.last())
                .is_some_and(|m| m["role"] == "tool");
            let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(8);
            tokio::spawn(async move {
                if after_tool {
                    for i in 0..DELTAS {
                        if i > 0 && !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                        let d = serde_json::json!({"choices":[{"index":0,"delta":{"content": stamp()}}]});
                        if tx.send(Ok(sse(d))).await.is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(Ok(sse(serde_json::json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})))).await;
                } else {
                    let call = serde_json::json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"file_manager__list","arguments":"{\"path\":\".\"}"}}]}}]});
                    let _ = tx.send(Ok(sse(call))).await;
                    let _ = tx.send(Ok(sse(serde_json::json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})))).await;
                }
                let _ = tx.send(Ok(sse(serde_json::json!({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":80}})))).await;
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            });
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(ReceiverStream::new(rx)))
                .unwrap()
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", l.local_addr().unwrap());
    // Every real model server flushes each chunk (uvicorn, Go's net/http and
    // Node set TCP_NODELAY): without it, Nagle holds a delta until the
    // client's delayed ACK, up to 40 ms, and the latency measured is that.
    use axum::serve::ListenerExt;
    let l = l.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

// ---------------------------------------------------------------- the floor

/// Chat answers the turn's events (the shape the orchestrator sends: turn
/// started, the call, 80 stamped deltas, turn done) from nothing.
struct Floor {
    pause: Duration,
}

type Events = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ChatEvent, Status>> + Send>>;

fn ev(seq: u64, kind: chat_event::Kind) -> ChatEvent {
    ChatEvent {
        session_id: "floor".into(),
        turn_id: "t".into(),
        event_seq: seq,
        execution_context_id: "root".into(),
        agent_id: "assistant".into(),
        timestamp_ms: omicos_sessionstore::now_ms(),
        kind: Some(kind),
        cut_values: vec![],
    }
}

#[tonic::async_trait]
impl Orchestrator for Floor {
    type ChatStream = Events;
    async fn chat(
        &self,
        _r: Request<Streaming<ChatClientMessage>>,
    ) -> Result<Response<Events>, Status> {
        let (tx, rx) = mpsc::channel(512);
        let pause = self.pause;
        tokio::spawn(async move {
            let mut seq = 0;
            let mut next = |k| {
                seq += 1;
                ev(seq, k)
            };
            let head = [
                next(chat_event::Kind::TurnStarted(TurnStarted::default())),
                next(chat_event::Kind::ToolCallStarted(ToolCallStarted::default())),
                next(chat_event::Kind::ToolCallFinished(
                    ToolCallFinished::default(),
                )),
            ];
            for e in head {
                let _ = tx.send(Ok(e)).await;
            }
            for i in 0..DELTAS {
                if i > 0 && !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                let e = next(chat_event::Kind::TextDelta(TextDelta { text: stamp() }));
                if tx.send(Ok(e)).await.is_err() {
                    return;
                }
            }
            let done = TurnDone {
                reason: TurnDoneReason::Completed as i32,
                ..Default::default()
            };
            let _ = tx.send(Ok(next(chat_event::Kind::TurnDone(done)))).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
    type AttachStream = Events;
    async fn attach(&self, _r: Request<AttachRequest>) -> Result<Response<Events>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn cancel_turn(
        &self,
        _r: Request<CancelTurnRequest>,
    ) -> Result<Response<CancelTurnResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn approve_tool(
        &self,
        _r: Request<ApproveToolRequest>,
    ) -> Result<Response<ApproveToolResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn list_agents(
        &self,
        _r: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn list_sessions(
        &self,
        _r: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn get_session(
        &self,
        _r: Request<GetSessionRequest>,
    ) -> Result<Response<Session>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn delete_session(
        &self,
        _r: Request<DeleteSessionRequest>,
    ) -> Result<Response<DeleteSessionResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn refresh_catalog(
        &self,
        _r: Request<RefreshCatalogRequest>,
    ) -> Result<Response<RefreshCatalogResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn list_agent_tools(
        &self,
        _r: Request<ListAgentToolsRequest>,
    ) -> Result<Response<ListAgentToolsResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn compact(
        &self,
        _r: Request<CompactRequest>,
    ) -> Result<Response<CompactResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn fork_session(
        &self,
        _r: Request<omicos_proto::ForkSessionRequest>,
    ) -> Result<Response<omicos_proto::ForkSessionResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn rewind_session(
        &self,
        _r: Request<omicos_proto::RewindSessionRequest>,
    ) -> Result<Response<omicos_proto::RewindSessionResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn rename_session(
        &self,
        _r: Request<omicos_proto::RenameSessionRequest>,
    ) -> Result<Response<omicos_proto::RenameSessionResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn upload_files(
        &self,
        _r: Request<UploadFilesRequest>,
    ) -> Result<Response<UploadFilesResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    type ReadValueStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ValueChunk, Status>> + Send>>;
    async fn read_value(
        &self,
        _r: Request<ReadValueRequest>,
    ) -> Result<Response<Self::ReadValueStream>, Status> {
        Err(Status::unimplemented("floor"))
    }
}

// ---------------------------------------------------------------- measuring

/// CPU time (ms) of this process's threads that belong to the server side:
/// named `orch` (its runtime), `sqlx-sqlite-*` (SQLite's connection workers)
/// or the orchestrator's trajectory writer. Read from each thread's
/// `schedstat` (time on a CPU, in ns), not from `stat`'s clock ticks, whose
/// 10 ms steps were a tenth of a turn's CPU at 100 turns.
fn server_cpu_ms() -> f64 {
    let mut ns = 0u64;
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = t.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if !(comm.starts_with("orch")
            || comm.starts_with("sqlx-sqlite")
            || comm == omicos_orchestrator::trajectory::WRITER_THREAD)
        {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 / 1e6
}

/// Writes the machine's dirty pages back (`sync(2)`, which waits for them)
/// and pauses, so that a run does not pay for the disk writes of the run
/// before it: a SQLite run at 1,000 turns leaves hundreds of MB for the
/// kernel to write back, and each of PostgreSQL's commits waits for its WAL
/// to reach the same disk.
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_millis(300));
}

/// The machine's CPU steal so far (ticks of all CPUs, /proc/stat): time the
/// host gave the VM's CPUs to others. A run with much of it measured the
/// host, not the event path.
fn steal_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

type Client = OrchestratorClient<omicos_auth::AuthedChannel>;
use omicos_proto::orchestrator_client::OrchestratorClient;

const TOKEN: &str = "omicos-load-bench-token";

async fn connect(url: &str) -> Client {
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    OrchestratorClient::new(omicos_auth::Credentials::bearer(TOKEN).unwrap().channel(ch))
        .max_decoding_message_size(omicos_proto::MAX_MESSAGE_BYTES)
}

/// One turn's Chat stream, checked. Returns (session, events received, per
/// delta (when it arrived, µs on the bench's clock; its age, µs)).
async fn one_turn(
    mut c: Client,
    i: usize,
    full_check: bool,
) -> Result<(String, Vec<ChatEvent>, Vec<(u64, u64)>), String> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(ChatClientMessage {
        msg: Some(chat_client_message::Msg::Request(ChatRequest {
            message: format!("load turn {i}: list the workspace, then talk"),
            permission_mode: "auto".into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut s = c
        .chat(ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("turn {i}: {e}"))?
        .into_inner();
    let mut events = Vec::with_capacity(96);
    let mut ages = Vec::with_capacity(DELTAS);
    loop {
        let m = tokio::time::timeout(Duration::from_secs(120), s.message())
            .await
            .map_err(|_| format!("turn {i}: no event within 120 s"))?
            .map_err(|e| format!("turn {i}: {e}"))?;
        let Some(m) = m else { break };
        match &m.kind {
            Some(chat_event::Kind::Heartbeat(_)) => continue,
            Some(chat_event::Kind::TextDelta(t)) => {
                let age = age_us(&t.text).ok_or_else(|| {
                    format!("turn {i}: delta {:?} is not one the model sent", t.text)
                })?;
                ages.push((now_us(), age));
            }
            _ => {}
        }
        let done = matches!(m.kind, Some(chat_event::Kind::TurnDone(_)));
        events.push(m);
        if done {
            break;
        }
    }
    drop(tx);
    let session = events
        .first()
        .map(|e| e.session_id.clone())
        .unwrap_or_default();
    // Nothing lost or doubled: seqs consecutive, TurnStarted .. TurnDone, every delta once.
    let first = events.first().map(|e| e.event_seq).unwrap_or(0);
    for (k, e) in events.iter().enumerate() {
        if e.event_seq != first + k as u64 {
            return Err(format!(
                "turn {i}: event {k} has seq {} (expected {})",
                e.event_seq,
                first + k as u64
            ));
        }
    }
    if !matches!(
        events.first().and_then(|e| e.kind.as_ref()),
        Some(chat_event::Kind::TurnStarted(_))
    ) {
        return Err(format!("turn {i}: does not start with TurnStarted"));
    }
    match events.last().and_then(|e| e.kind.as_ref()) {
        Some(chat_event::Kind::TurnDone(d)) if d.reason() == TurnDoneReason::Completed => {}
        other => return Err(format!("turn {i}: ends with {other:?}")),
    }
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(chat_event::Kind::ToolCallFinished(f)) => Some(f),
            _ => None,
        })
        .collect();
    if full_check && (finished.len() != 1 || finished[0].status() != ToolStatus::Done) {
        return Err(format!(
            "turn {i}: file_manager__list did not finish once, ok: {finished:?}"
        ));
    }
    if ages.len() != DELTAS {
        return Err(format!(
            "turn {i}: {} deltas, expected {DELTAS}",
            ages.len()
        ));
    }
    Ok((session, events, ages))
}

/// The client's events of a turn equal the store's log (same seqs, same bytes).
async fn check_against_store(
    store: &dyn SessionStore,
    session: &str,
    events: &[ChatEvent],
) -> Result<(), String> {
    let since = events[0].event_seq - 1;
    let stored = store
        .events_since(session, since)
        .await
        .map_err(|e| format!("{session}: {e}"))?;
    if stored.len() != events.len() {
        return Err(format!(
            "{session}: client has {} events, store {}",
            events.len(),
            stored.len()
        ));
    }
    for ((seq, bytes), e) in stored.iter().zip(events) {
        if *seq != e.event_seq || *bytes != e.encode_to_vec() {
            return Err(format!(
                "{session}: seq {seq} differs between client and store"
            ));
        }
    }
    Ok(())
}

struct Figures {
    turns: usize,
    wall: Duration,
    cpu_ms: f64,
    events: u64,
    /// CPU steal ticks during the run (all CPUs).
    steal: u64,
    /// Per delta: when it arrived (µs on the bench's clock) and its age (µs).
    ages: Vec<(u64, u64)>,
}

impl Figures {
    fn per_turn(&self) -> f64 {
        self.cpu_ms / self.turns as f64
    }

    /// The share of the machine's CPU time the host took during the run.
    fn steal_pct(&self) -> f64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // Ticks are 10 ms.
        self.steal as f64 * 10.0 / (self.wall.as_secs_f64() * 1000.0 * cpus) * 100.0
    }

    /// Where the slow deltas were: per 250 ms of the run (by arrival) that
    /// had any delta older than `over_ms`, how many, and the oldest.
    fn tail(&self, over_ms: u64) -> String {
        let Some(start) = self.ages.iter().map(|(at, _)| *at).min() else {
            return String::new();
        };
        let mut windows: std::collections::BTreeMap<u64, (usize, u64)> = Default::default();
        for (at, age) in &self.ages {
            if *age > over_ms * 1000 {
                let w = windows.entry((at - start) / 250_000).or_default();
                w.0 += 1;
                w.1 = w.1.max(*age);
            }
        }
        windows
            .iter()
            .map(|(w, (n, max))| {
                format!(
                    "{:.2}s:{n}<={:.0}ms",
                    *w as f64 * 0.25,
                    *max as f64 / 1000.0
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn row(&self, store: &str) -> String {
        let mut a: Vec<u64> = self.ages.iter().map(|(_, age)| *age).collect();
        a.sort_unstable();
        format!(
            "| {store} | {} | {:.2} | {:.0} | {:.1} | {:.1} | {:.0} |",
            self.turns,
            self.per_turn(),
            self.events as f64 / self.wall.as_secs_f64(),
            pct(&a, 0.50),
            pct(&a, 0.99),
            self.steal_pct(),
        )
    }
}

/// `turns` concurrent turns (at most `window` at a time), all checked; their
/// starts spread evenly over `ramp` (zero: all at once).
async fn run_turns(
    url: &str,
    store: Option<&Arc<dyn SessionStore>>,
    turns: usize,
    window: usize,
    full: bool,
    ramp: Duration,
) -> Figures {
    let clients: Vec<Client> = {
        let mut v = vec![];
        for _ in 0..8 {
            v.push(connect(url).await);
        }
        v
    };
    let started = Instant::now();
    let cpu0 = server_cpu_ms();
    let steal0 = steal_ticks();
    let sem = Arc::new(tokio::sync::Semaphore::new(window));
    let events = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..turns {
        let c = clients[i % clients.len()].clone();
        let permit = sem.clone().acquire_owned().await.unwrap();
        let events = events.clone();
        let start = tokio::time::Instant::from_std(started) + ramp.mul_f64(i as f64 / turns as f64);
        tasks.spawn(async move {
            tokio::time::sleep_until(start).await;
            let r = one_turn(c, i, full).await;
            drop(permit);
            if let Ok((_, ev, _)) = &r {
                events.fetch_add(ev.len() as u64, Ordering::Relaxed);
            }
            r
        });
    }
    let mut ages = Vec::with_capacity(turns * DELTAS);
    let mut done = Vec::with_capacity(turns);
    while let Some(r) = tasks.join_next().await {
        match r.expect("turn task") {
            Ok((s, ev, a)) => {
                ages.extend(a);
                done.push((s, ev));
            }
            Err(e) => panic!("LOST OR DOUBLED: {e}"),
        }
    }
    let wall = started.elapsed();
    let cpu_ms = server_cpu_ms() - cpu0;
    let steal = steal_ticks().saturating_sub(steal0);
    if let Some(store) = store {
        for (s, ev) in &done {
            if let Err(e) = check_against_store(store.as_ref(), s, ev).await {
                panic!("LOST OR DOUBLED: {e}");
            }
        }
    }
    if full {
        let sessions: std::collections::HashSet<&str> =
            done.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(sessions.len(), turns, "every turn had its own session");
    }
    Figures {
        turns,
        wall,
        cpu_ms,
        steal,
        events: events.load(Ordering::Relaxed),
        ages,
    }
}

/// One store's whole stack: tool-runner and fake model on the load
/// runtime, the orchestrator and its store on the orchestrator's runtime.
struct Stack {
    name: String,
    url: String,
    store: Arc<dyn SessionStore>,
    sd: Shutdown,
    /// Keeps the PostgreSQL schema until the store is done with it.
    _pg: Option<omicos_testdb::Backend>,
    _ws: tempfile::TempDir,
}

/// Starts `name`'s stack and waits until a turn goes through; None when
/// PostgreSQL does not answer.
fn start_stack(
    name: &str,
    orch: &tokio::runtime::Runtime,
    load: &tokio::runtime::Runtime,
    pause: Duration,
) -> Option<Stack> {
    let ws = tempfile::tempdir().unwrap();
    let workspace = ws.path().canonicalize().unwrap();
    std::fs::write(workspace.join("README.md"), "load bench\n").unwrap();
    let mut pg = None;
    let url = match name {
        "memory" => "memory:".to_owned(),
        "sqlite" => format!("sqlite://{}/sessions.db", workspace.display()),
        "postgres" => pg
            .insert(load.block_on(omicos_testdb::postgres("load", "olb"))?)
            .url
            .clone(),
        other => panic!("unknown store {other}"),
    };
    let sd = Shutdown::new(Duration::from_secs(2));
    let runner = load.block_on(async {
        let rl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runner = format!("http://{}", rl.local_addr().unwrap());
        let rcfg: omicos_tool_runner::Config =
            serde_json::from_value(serde_json::json!({"workspace": workspace})).unwrap();
        tokio::spawn(omicos_tool_runner::run(rcfg, rl, sd.clone(), vec![]));
        runner
    });
    let llm = load.block_on(fake_llm(pause));
    let (orch_url, store) = orch.block_on(async {
        let mut cfg = Config {
            workspace: workspace.clone(),
            tool_runner: runner.clone(),
            store_url: url.clone(),
            heartbeat_interval: Duration::from_secs(30),
            ..Default::default()
        };
        cfg.llm.backend = "openai".into();
        cfg.llm.base_url = llm.clone();
        cfg.llm.api_key = "k".into();
        cfg.llm.model = "fake".into();
        cfg.llm.idle_timeout = Duration::from_secs(60);
        cfg.auth.api_keys.push(omicos_auth::ApiKeyConfig {
            sha256: omicos_auth::sha256_hex(TOKEN),
            principal: "bench".into(),
            tenant: "default".into(),
            tier: String::new(),
            max_mode: "full".into(),
        });
        let store = omicos_orchestrator::open_store(&cfg).await.expect("store");
        let agents = Arc::new(SingleAgent::from_config(&cfg).expect("agent"));
        let backends = omicos_orchestrator::build_backends(&cfg.llm).expect("backends");
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let orch_url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(omicos_orchestrator::serve(
            Parts {
                config: cfg,
                agents,
                store: store.clone(),
                backends,
            },
            l,
            sd.clone(),
        ));
        (orch_url, store)
    });
    // Ready once a turn goes through (the runner answers ListTools).
    load.block_on(async {
        let mut last = String::new();
        for _ in 0..50 {
            let c = connect(&orch_url).await;
            match one_turn(c, usize::MAX, true).await {
                Ok(_) => return,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{name}: the stack never completed a turn: {last}");
    });
    Some(Stack {
        name: name.to_owned(),
        url: orch_url,
        store,
        sd,
        _pg: pg,
        _ws: ws,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `var` parsed, or `default` when unset or not a number.
fn num<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn main() {
    EPOCH.get_or_init(Instant::now);
    let turns: Vec<usize> = list("LOAD_TURNS", "100,1000")
        .iter()
        .map(|s| s.parse().expect("LOAD_TURNS"))
        .collect();
    let idle: usize = num("LOAD_IDLE", 10_000);
    let stores = list("LOAD_STORES", "memory,sqlite,postgres");
    let pause = Duration::from_millis(num("LOAD_DELTA_MS", 10));
    let ramp = Duration::from_millis(num("LOAD_RAMP_MS", 0));
    let rounds: usize = num("LOAD_ROUNDS", 1).max(1);
    let tail_ms: u64 = num("LOAD_TAIL_MS", 0);

    // The server side on its own runtime, so that its CPU can be told apart.
    let orch = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("orch")
        .enable_all()
        .build()
        .unwrap();
    let load = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .enable_all()
        .build()
        .unwrap();

    println!(
        "load: {DELTAS} deltas of {DELTA_CHARS} chars per turn, {pause:?} apart; turns start over {ramp:?}; {rounds} round(s); idle sessions: {idle}"
    );
    println!();
    println!(
        "| store | concurrent turns | orchestrator CPU ms/turn | events/s | latency p50 ms | latency p99 ms | host steal % |"
    );
    println!("|---|---|---|---|---|---|---|");

    // The floor: the same events over a bare tonic stream.
    let floor_url = orch.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        // TCP_NODELAY on each connection, as the orchestrator sets it.
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(OrchestratorServer::new(Floor { pause }))
                .serve_with_incoming(incoming),
        );
        url
    });

    // Every store's stack is up at once, and the rounds go round the stores
    // (floor, memory, sqlite, postgres, floor, ...): the ratio of a store to
    // the memory store compares runs seconds apart, not minutes.
    let mut stacks: Vec<Stack> = vec![];
    for name in &stores {
        match start_stack(name, &orch, &load, pause) {
            Some(s) => stacks.push(s),
            None => println!("| {name} | (skipped: PostgreSQL does not answer) | | | | | |"),
        }
    }
    // Per store and turn count, each round's CPU ms per turn.
    let mut cpu: std::collections::BTreeMap<(String, usize), Vec<f64>> = Default::default();
    for &n in &turns {
        for _ in 0..rounds {
            settle();
            let f = load.block_on(run_turns(&floor_url, None, n, n, false, ramp));
            println!("{}", f.row("floor (bare tonic)"));
            cpu.entry(("floor (bare tonic)".into(), n))
                .or_default()
                .push(f.per_turn());
            for st in &stacks {
                settle();
                let f = load.block_on(run_turns(&st.url, Some(&st.store), n, n, true, ramp));
                println!("{}", f.row(&st.name));
                if tail_ms > 0 {
                    println!(
                        "<!-- {} slow deltas (> {tail_ms} ms): {} -->",
                        st.name,
                        f.tail(tail_ms)
                    );
                }
                cpu.entry((st.name.clone(), n))
                    .or_default()
                    .push(f.per_turn());
            }
        }
    }
    if rounds > 1 || stacks.iter().any(|s| s.name == "memory") {
        println!();
        println!(
            "| store | concurrent turns | CPU ms/turn per round | median | × memory per round | × memory, medians |"
        );
        println!("|---|---|---|---|---|---|");
        for ((name, n), v) in &cpu {
            let mem = cpu.get(&("memory".to_owned(), *n));
            let per_round = mem
                .map(|m| {
                    v.iter()
                        .zip(m)
                        .map(|(a, b)| format!("{:.2}", a / b))
                        .collect::<Vec<_>>()
                        .join(" / ")
                })
                .unwrap_or_default();
            let ratio = mem
                .map(|m| format!("{:.2}", median(v) / median(m)))
                .unwrap_or_default();
            println!(
                "| {name} | {n} | {} | {:.2} | {per_round} | {ratio} |",
                v.iter()
                    .map(|c| format!("{c:.2}"))
                    .collect::<Vec<_>>()
                    .join(" / "),
                median(v),
            );
        }
    }

    let mut idle_rows = vec![];
    for st in stacks {
        if idle > 0 {
            // Idle sessions: each had its turn; no turn runs and no client follows.
            std::thread::sleep(Duration::from_millis(500));
            let before = rss_kib();
            let f = load.block_on(run_turns(&st.url, None, idle, 200, false, Duration::ZERO));
            std::thread::sleep(Duration::from_secs(1));
            let after = rss_kib();
            let per = (after.saturating_sub(before)) as f64 * 1024.0 / idle as f64;
            idle_rows.push(format!(
                "| {} | {idle} | {:.1} | {:.0} | {:.0} |",
                st.name,
                per / 1024.0,
                f.events as f64 / f.wall.as_secs_f64(),
                f.per_turn(),
            ));
        }
        {
            let _rt = orch.enter();
            st.sd.trigger();
        }
        std::thread::sleep(Duration::from_millis(300));
        drop(st);
    }
    if !idle_rows.is_empty() {
        println!();
        println!(
            "| store | idle sessions | resident KiB per idle session | events/s while making them | CPU ms/turn |"
        );
        println!("|---|---|---|---|---|");
        for r in idle_rows {
            println!("{r}");
        }
    }
}
