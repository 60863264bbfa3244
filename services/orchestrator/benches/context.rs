//! The cost of deciding whether to compact, per model request, at 1,000
//! messages (issue 16; target < 1 ms): `engine::context::measure` with the
//! threshold limit, which is what `prepare_context` runs before every model
//! request. Also timed: building the request's messages from that decision
//! (`Measure::view`, which every request pays, compaction or not). Baseline,
//! in the same run and interleaved: serializing the same messages to the JSON
//! body the backend sends anyway (`serde_json::to_vec`).
//!
//! Three histories of 1,000 messages (user → assistant with a tool call →
//! tool result → assistant text, results of 200 B to 12 KB, every fifth a
//! `task__*` or `file_manager__write` call):
//! - *fits*: under the threshold (the common case: one walk, no trimming);
//! - *trims*: over the threshold, old tool results cut to previews until it fits;
//! - *after a marker*: a compaction marker at message 600, so the view starts
//!   with the checkpoint rebuilt from the whole history.
//!
//! `cargo bench -p omicos-orchestrator --bench context` (release).
//! `BENCH_ROUNDS=N` changes the rounds (default 20 × 50 decisions per case).

use omicos_history::HistoryItem;
use omicos_orchestrator::config::ContextConfig;
use omicos_orchestrator::engine::context::{self, View};
use omicos_orchestrator::llm::ToolDef;
use serde_json::json;
use std::hint::black_box;
use std::time::{Duration, Instant};

const MESSAGES: usize = 1_000;
const PER_ROUND: usize = 50;

/// A deterministic pseudo-random sequence (no dependency, same every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn text(rng: &mut Lcg, chars: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "data", "frame", "column", "mean", "value", "plot", "error", "file", "rows",
        "result", "kernel", "import", "numpy", "pandas", "and", "of", "is", "42", "3.14",
    ];
    let mut s = String::with_capacity(chars + 8);
    while s.len() < chars {
        s.push_str(WORDS[rng.next() as usize % WORDS.len()]);
        s.push(' ');
    }
    s
}

/// 1,000 messages as a long analysis session leaves them in the history.
fn history() -> Vec<HistoryItem> {
    let mut rng = Lcg(7);
    let mut h = vec![
        json!({"role": "user", "content": "Load sales.csv, clean it and plot monthly revenue by region."}),
    ];
    let mut call = 0usize;
    while h.len() < MESSAGES {
        call += 1;
        let id = format!("call_{call}");
        let (name, args) = match call % 5 {
            0 => (
                "file_manager__write",
                json!({"path": format!("out/part_{call}.py"), "content": text(&mut rng, 300)}),
            ),
            1 => ("task__update", json!({"id": call % 7, "status": "done"})),
            _ => ("run_python_code", {
                let len = 120 + (rng.next() % 400) as usize;
                json!({"code": text(&mut rng, len)})
            }),
        };
        h.push(json!({"role": "assistant", "content": text(&mut rng, 80), "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}));
        let size = [200usize, 800, 2_000, 5_000, 12_000][(rng.next() % 5) as usize];
        let result = json!({"status": "done", "result": text(&mut rng, size)}).to_string();
        let mut tool = json!({"role": "tool", "tool_call_id": id, "content": result});
        if size >= 5_000 {
            tool["spool_path"] = json!(format!(".omicos/tool_outputs/1700000000000__{id}.txt"));
        }
        h.push(tool);
        if call.is_multiple_of(3) {
            h.push(json!({"role": "assistant", "content": text(&mut rng, 400)}));
            h.push(json!({"role": "user", "content": text(&mut rng, 60)}));
        }
    }
    h.truncate(MESSAGES);
    // As the store reads them.
    h.into_iter().map(HistoryItem::from_value).collect()
}

fn tools() -> Vec<ToolDef> {
    (0..30)
        .map(|i| ToolDef {
            name: format!("tool_{i}"),
            description: "a tool the agent may call, with a description of a realistic length"
                .repeat(3),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "a path"},
                "content": {"type": "string"}}, "required": ["path"]}),
        })
        .collect()
}

fn pct(v: &mut [Duration], q: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e6
}

struct Case {
    name: &'static str,
    history: Vec<HistoryItem>,
    limit: u64,
    decide: Vec<Duration>,
    build: Vec<Duration>,
    serialize: Vec<Duration>,
    last: View,
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let cfg = ContextConfig::default();
    let system = "You are a data analyst. ".repeat(40);
    let tools = tools();
    let fixed = context::fixed_chars(&system, &tools);
    let base = history();
    let whole = context::view(&base, fixed, &cfg, 1.0, u64::MAX).tokens;
    let threshold = (cfg.window("bench-model") as f64 * cfg.compact_threshold) as u64;
    // The window is scaled so that the cases are what their names say.
    let mut marked = base.clone();
    marked.insert(
        600,
        HistoryItem::Compaction(context::marker(
            &text(&mut Lcg(3), 4_000),
            560,
            whole,
            whole / 3,
            560,
            "auto",
        )),
    );
    let mut cases = vec![
        Case {
            name: "fits (under the threshold)",
            history: base.clone(),
            limit: whole + 1_000,
            decide: vec![],
            build: vec![],
            serialize: vec![],
            last: View::default(),
        },
        Case {
            name: "trims old tool results to fit",
            history: base.clone(),
            limit: whole * 2 / 3,
            decide: vec![],
            build: vec![],
            serialize: vec![],
            last: View::default(),
        },
        Case {
            name: "after a compaction marker (checkpoint rebuilt)",
            history: marked,
            limit: whole + 1_000,
            decide: vec![],
            build: vec![],
            serialize: vec![],
            last: View::default(),
        },
    ];
    // Warm-up.
    for c in &mut cases {
        for _ in 0..5 {
            c.last = context::view(&c.history, fixed, &cfg, 1.0, c.limit);
            black_box(serde_json::to_vec(&c.last.messages).unwrap());
        }
    }
    for _ in 0..rounds {
        for c in &mut cases {
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                let m = context::measure(black_box(&c.history), fixed, &cfg, 1.0, c.limit);
                // The decision itself: does the request pass the limit?
                black_box(m.tokens <= c.limit);
                c.decide.push(t.elapsed());
                let t = Instant::now();
                let v = m.view(black_box(&c.history));
                c.build.push(t.elapsed());
                let t = Instant::now();
                black_box(serde_json::to_vec(black_box(&v.messages)).unwrap());
                c.serialize.push(t.elapsed());
                c.last = v;
            }
        }
    }
    println!(
        "Deciding whether to compact, per model request, {MESSAGES} messages \
         ({} KiB of history, ~{whole} estimated tokens; default threshold {threshold} tokens), \
         {} decisions per case, interleaved",
        serde_json::to_vec(&base).unwrap().len() / 1024,
        rounds * PER_ROUND
    );
    println!(
        "{:<50} {:>10} {:>10} {:>10} {:>14} {:>10} {:>8} {:>8}",
        "case", "p50 µs", "p99 µs", "build p50", "serialize p50", "ratio", "trimmed", "msgs"
    );
    for c in &mut cases {
        let (d50, d99) = (pct(&mut c.decide, 0.5), pct(&mut c.decide, 0.99));
        let s50 = pct(&mut c.serialize, 0.5);
        let b50 = pct(&mut c.build, 0.5);
        println!(
            "{:<50} {:>10.1} {:>10.1} {:>10.1} {:>14.1} {:>10.2} {:>8} {:>8}",
            c.name,
            d50,
            d99,
            b50,
            s50,
            d50 / s50,
            c.last.trimmed,
            c.last.messages.len()
        );
        println!(
            "{:<50} view {} tokens, limit {}: {}",
            "",
            c.last.tokens,
            c.limit,
            if c.last.tokens <= c.limit {
                "sent as is"
            } else {
                "compaction follows"
            }
        );
    }
    println!(
        "target: p50 < 1000 µs per decision at {MESSAGES} messages (ratio = decision / serialize); \
         build = the request's messages from the decision"
    );
    load(&base, rounds);
}

/// What a turn pays once, reading its history: the stored rows parsed as
/// typed items, against parsing them as JSON values (the store's read
/// before the history was typed), interleaved.
fn load(history: &[HistoryItem], rounds: usize) {
    let rows: Vec<String> = history.iter().map(HistoryItem::to_json).collect();
    let (mut typed, mut values) = (vec![], vec![]);
    for _ in 0..rounds.max(5) {
        let t = Instant::now();
        let items: Vec<HistoryItem> = rows
            .iter()
            .map(|r| serde_json::from_str(black_box(r)).unwrap())
            .collect();
        typed.push(t.elapsed());
        black_box(items);
        let t = Instant::now();
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::from_str(black_box(r)).unwrap())
            .collect();
        values.push(t.elapsed());
        black_box(v);
    }
    let (t50, v50) = (pct(&mut typed, 0.5), pct(&mut values, 0.5));
    println!(
        "reading the history ({MESSAGES} stored rows) once per turn: typed p50 {t50:.1} µs, \
         as JSON values p50 {v50:.1} µs, ratio {:.2}",
        t50 / v50
    );
}
