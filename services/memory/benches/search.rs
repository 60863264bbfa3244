//! Memory search latency, p50/p99, over 100,000 entries on each backend, with
//! the same queries over 10,000 entries as the baseline of the same run.
//!
//! `cargo bench -p omicos-memory` (PostgreSQL on 127.0.0.1:5432 when it
//! answers; `OMICOS_BENCH_PG_URL` overrides the server URL).

use omicos_memory::{MemoryStore, NewMemory, SearchQuery};
use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};

const VOCABULARY: usize = 5_000;
const WORDS_PER_ENTRY: usize = 14;
const QUERIES: usize = 500;
const WARMUP: usize = 30;

/// A small deterministic generator (no dependency, same data every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    /// A word index with a Zipf-like skew: a few words are common, most rare,
    /// as in real notes.
    fn word(&mut self) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((VOCABULARY as f64).powf(u) as usize)
            .saturating_sub(1)
            .min(VOCABULARY - 1)
    }
}

fn word(i: usize) -> String {
    // Natural text is Zipfian with function words on top: the most frequent
    // ranks are English stopwords (the search drops them when a query has
    // other words), the rest are distinct made-up words.
    if let Some(w) = omicos_memory::terms::STOPWORDS.get(i) {
        return (*w).to_string();
    }
    let mut s = String::from("w");
    let mut n = i;
    loop {
        s.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    s
}

fn entries(n: usize, rng: &mut Lcg) -> Vec<NewMemory> {
    (0..n)
        .map(|i| NewMemory {
            content: (0..WORDS_PER_ENTRY)
                .map(|_| word(rng.word()))
                .collect::<Vec<_>>()
                .join(" "),
            category: ["user", "feedback", "project", "reference"][i % 4].into(),
            tags: vec![format!("tag{}", i % 20)],
            key: None,
        })
        .collect()
}

fn queries(rng: &mut Lcg) -> Vec<SearchQuery> {
    (0..QUERIES)
        .map(|i| {
            let words = 2 + (i % 3);
            SearchQuery {
                text: (0..words)
                    .map(|_| word(rng.word()))
                    .collect::<Vec<_>>()
                    .join(" "),
                // Every fourth query also filters by category.
                category: (i % 4 == 0).then(|| "project".to_string()),
                tags: vec![],
                limit: 10,
                include_expired: false,
            }
        })
        .collect()
}

async fn fill(store: &MemoryStore, n: usize) {
    let mut rng = Lcg(42);
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(5_000);
        store
            .save_many("bench", entries(chunk, &mut rng))
            .await
            .expect("insert");
        done += chunk;
    }
    eprintln!(
        "  {} entries inserted in {:.1}s",
        n,
        started.elapsed().as_secs_f64()
    );
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mean_hits: f64,
}

async fn measure(store: &MemoryStore) -> Figures {
    let qs = queries(&mut Lcg(7));
    for q in qs.iter().take(WARMUP) {
        store.search("bench", q).await.expect("search");
    }
    let mut lat = Vec::with_capacity(qs.len());
    let mut hits = 0usize;
    for q in &qs {
        let t = Instant::now();
        hits += store.search("bench", q).await.expect("search").len();
        lat.push(t.elapsed());
    }
    lat.sort();
    Figures {
        p50: lat[lat.len() / 2],
        p99: lat[lat.len() * 99 / 100],
        mean_hits: hits as f64 / qs.len() as f64,
    }
}

async fn run(backend: &str, url_for: impl Fn(&str) -> String) {
    let mut results = Vec::new();
    for n in [10_000usize, 100_000] {
        let url = url_for(&format!("n{n}"));
        let store = MemoryStore::open(&url).await.expect("open");
        fill(&store, n).await;
        let f = measure(&store).await;
        store.close().await;
        results.push((n, f));
    }
    let base = &results[0].1;
    for (n, f) in &results {
        println!(
            "| {backend} | {n} | {:.2} ms | {:.2} ms | {:.1} | {:.2}x |",
            f.p50.as_secs_f64() * 1e3,
            f.p99.as_secs_f64() * 1e3,
            f.mean_hits,
            f.p50.as_secs_f64() / base.p50.as_secs_f64()
        );
    }
}

#[tokio::main]
async fn main() {
    println!("| backend | entries | p50 | p99 | hits/query | p50 vs 10,000 |");
    println!("|---|---|---|---|---|---|");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    run("sqlite", |name| {
        format!("sqlite://{}", root.join(format!("{name}.db")).display())
    })
    .await;

    let admin = std::env::var("OMICOS_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match tokio::time::timeout(Duration::from_secs(3), PgConnection::connect(&admin)).await {
        Ok(Ok(mut c)) => {
            let prefix = format!("ombench_{}", std::process::id());
            for n in ["n10000", "n100000"] {
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {prefix}_{n}")))
                    .execute(&mut c)
                    .await
                    .expect("schema");
            }
            let sep = if admin.contains('?') { '&' } else { '?' };
            run("postgres", |name| {
                format!("{admin}{sep}options[search_path]={prefix}_{name}")
            })
            .await;
            for n in ["n10000", "n100000"] {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA {prefix}_{n} CASCADE"
                )))
                .execute(&mut c)
                .await;
            }
        }
        _ => println!("\nSKIPPED: PostgreSQL not reachable at {admin}"),
    }
}
