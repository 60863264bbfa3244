//! Throughput of `pdf__read` against unguarded baselines, measured in the same
//! run: `cargo bench -p omicos-pdf --bench read` (release profile).
//!
//! - omicos: `PdfProvider::call("pdf__read")`: worker thread, size cap, page
//!   checks (content bounds, form cycles), quote rewriting, layout, tidying.
//! - pdf-extract: `extract_text_from_mem_by_pages`, no guards at all.
//! - lopdf: `Document::extract_text` page by page.

#[path = "../tests/common/mod.rs"]
mod common;

use omicos_pdf::{Config, PdfProvider};
use omicos_toolkit::{CallCtx, Provider};
use serde_json::json;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let ws = tempfile::tempdir().expect("tempdir");
    let real = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/replicate-design-note.pdf"
    ))
    .expect("test data");
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("generated, 500 pages", common::long(500), 5),
        ("groff+gs note, 3 pages", real, 30),
    ];
    let provider = PdfProvider::new(Config {
        max_chars_limit: 10_000_000,
        ..Config::default()
    });
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "file", "omicos", "pdf-extract", "lopdf", "vs p-e", "vs lopdf"
    );
    for (name, bytes, runs) in cases {
        std::fs::write(ws.path().join("f.pdf"), &bytes).expect("write");
        let ours = time(runs, || {
            let ctx = CallCtx::for_test(ws.path(), "bench");
            let out = rt
                .block_on(provider.call(
                    "pdf__read",
                    json!({"path": "f.pdf", "max_chars": 10_000_000}),
                    ctx,
                ))
                .expect("read");
            assert!(out.as_str().is_some_and(|s| s.contains("--- page 1 ---")));
        });
        let extract = time(runs, || {
            let pages = pdf_extract::extract_text_from_mem_by_pages(&bytes).expect("pdf-extract");
            assert!(!pages.is_empty());
        });
        let lo = time(runs, || {
            let doc = lopdf::Document::load_mem(&bytes).expect("lopdf");
            let n = doc.get_pages().len() as u32;
            for p in 1..=n {
                let _ = doc.extract_text(&[p]);
            }
        });
        println!(
            "{:<24} {:>10.1}ms {:>10.1}ms {:>10.1}ms {:>9.2}x {:>9.2}x",
            name,
            ours.as_secs_f64() * 1e3,
            extract.as_secs_f64() * 1e3,
            lo.as_secs_f64() * 1e3,
            ours.as_secs_f64() / extract.as_secs_f64(),
            ours.as_secs_f64() / lo.as_secs_f64()
        );
    }
}
