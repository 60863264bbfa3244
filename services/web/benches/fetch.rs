//! Fetch + extract a 2 MB page from a loopback server: time per page.
//!
//! `cargo bench -p omicos-web` (release). The baseline, measured in the same
//! run against the same server, is a plain reqwest GET that only downloads
//! the body; the ratio says what the guarded fetch and the extraction add.

use axum::{Router, http::header, response::IntoResponse, routing::get};
use omicos_toolkit::{CallCtx, Provider};
use omicos_web::{WebConfig, WebProvider, extract};
use serde_json::json;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

const ROUNDS: usize = 20;

/// A ~2 MB article: many long paragraphs with links, under headings, with nav and footer.
fn big_page() -> String {
    let mut s = String::from(
        "<!doctype html><html><head><title>The long report</title></head><body><nav><a href='/'>Home</a></nav><article><h1>The long report</h1>",
    );
    let mut i = 0;
    while s.len() < 2 << 20 {
        if i % 20 == 0 {
            s.push_str(&format!("<h2>Section {}</h2>", i / 20));
        }
        s.push_str(&format!(
            "<p>Paragraph {i}: the committee reviewed the measurements taken at station {i} and found that the readings \
             agree with the model within the stated tolerance, so the <a href=\"/s/{i}\">station record</a> stands as filed.</p>"
        ));
        i += 1;
    }
    s.push_str("</article><footer>footer</footer></body></html>");
    s
}

struct Stats {
    median: Duration,
    mean: Duration,
    min: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    Stats {
        median: v[v.len() / 2],
        mean,
        min: v[0],
    }
}

fn show(name: &str, s: &Stats) {
    println!(
        "{name:<44} median {:>8.2} ms   mean {:>8.2} ms   min {:>8.2} ms",
        s.median.as_secs_f64() * 1e3,
        s.mean.as_secs_f64() * 1e3,
        s.min.as_secs_f64() * 1e3
    );
}

async fn time<F, Fut>(rounds: usize, mut f: F) -> Stats
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // Two warm-up rounds: connection pool, allocator, page cache.
    for _ in 0..2 {
        f().await;
    }
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    stats(v)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let page = Arc::new(big_page());
        let served = page.clone();
        let app = Router::new().route(
            "/big",
            get(move || {
                let p = served.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                        p.as_str().to_owned(),
                    )
                        .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/big");
        println!("page: {} bytes, {ROUNDS} rounds each", page.len());

        let plain = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let page_len = page.len();
        let baseline = time(ROUNDS, || {
            let plain = plain.clone();
            let url = url.clone();
            async move {
                let body = plain
                    .get(&url)
                    .send()
                    .await
                    .expect("get")
                    .bytes()
                    .await
                    .expect("body");
                assert_eq!(body.len(), page_len);
            }
        })
        .await;
        show("baseline: plain GET, body only", &baseline);

        let cfg = WebConfig {
            allow: vec!["127.0.0.1/32".into()],
            ..WebConfig::default()
        };
        let provider = Arc::new(
            WebProvider::with_parts(&cfg, &[], Arc::new(omicos_web::ssrf::SystemLookup))
                .expect("provider"),
        );
        let mut results = Vec::new();
        for (name, args) in [
            (
                "web_fetch raw (guarded GET + decode)",
                json!({"url": url, "raw": true}),
            ),
            ("web_fetch markdown (fetch + extract)", json!({"url": url})),
            (
                "web_fetch text (fetch + extract)",
                json!({"url": url, "format": "text"}),
            ),
        ] {
            let s = time(ROUNDS, || {
                let p = provider.clone();
                let args = args.clone();
                async move {
                    let v = p
                        .call(
                            "web_fetch",
                            args,
                            CallCtx::for_test(std::env::temp_dir(), "bench"),
                        )
                        .await
                        .expect("fetch");
                    assert!(v["total_length"].as_u64().unwrap_or(0) > 1_000_000, "{v}");
                }
            })
            .await;
            show(name, &s);
            results.push((name, s));
        }

        let html = page.as_str().to_owned();
        let bounds = extract::Bounds {
            max_elements: cfg.max_elements,
            max_depth: cfg.max_depth,
        };
        let only = time(ROUNDS, || {
            let html = html.clone();
            async move {
                let e = extract::extract_on_worker(
                    html,
                    "http://bench/big".into(),
                    extract::Format::Markdown,
                    bounds,
                )
                .await
                .expect("extract");
                assert!(e.content.len() > 1_000_000);
            }
        })
        .await;
        show("extraction only (markdown, worker thread)", &only);

        println!();
        for (name, s) in &results {
            println!(
                "{name:<44} {:>6.1}x the baseline (median)",
                s.median.as_secs_f64() / baseline.median.as_secs_f64()
            );
        }
    });
}
