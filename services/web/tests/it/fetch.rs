//! web_fetch against real pages: extraction, encodings, redirects, limits.

use crate::support::{call, call_err, loopback_cfg, provider, serve};
use axum::{
    Router,
    body::Body,
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};
use omicos_web::WebConfig;
use serde_json::json;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

const ARTICLE: &str = r#"<!doctype html><html><head><title>Tidal energy in 2026</title></head><body>
<nav class="menu"><ul><li><a href="/">Home</a></li><li><a href="/news">News</a></li><li><a href="/about">About us</a></li></ul></nav>
<main><article>
<h1>Tidal energy in 2026</h1>
<p>Tidal turbines in the Pentland Firth delivered more power this year than in any year before, and the operators say the
machines have become reliable enough to plan maintenance a season ahead instead of a week ahead.</p>
<p>The second array, finished in spring, uses <a href="https://example.org/blades">composite blades</a> that survive the
strong currents, and engineers expect the cost per megawatt hour to keep falling as more units are installed.</p>
<h2>What comes next</h2>
<ul><li>A third array in the north channel</li><li>A grid link to the mainland</li></ul>
<p>Local councils welcomed the news, noting that the harbour has found new work servicing the turbines and their cables.</p>
</article></main>
<footer class="site-footer"><p>Copyright 2026 Example News. All rights reserved. Cookie settings.</p></footer>
</body></html>"#;

fn html(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// A ~2 MB article: many long paragraphs under headings.
pub fn big_page() -> String {
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

async fn pages() -> std::net::SocketAddr {
    let app = Router::new()
        .route("/article", get(|| async { html(ARTICLE.into()) }))
        .route("/big", get(|| async { html(big_page()) }))
        .route(
            "/deep",
            get(|| async { html(format!("<html><head><title>Deep</title></head><body>{}bottom of the well{}</body></html>", "<div>".repeat(20_000), "</div>".repeat(20_000))) }),
        )
        .route("/deeper", get(|| async { html(format!("<html><body>{}at 400000{}</body></html>", "<div>".repeat(400_000), "</div>".repeat(400_000))) }))
        .route(
            "/gbk",
            get(|| async {
                let page = "<html><head><title>新闻</title></head><body><article><h1>新闻</h1><p>今天的天气很好，我们去公园散步，看到了很多人在放风筝。这是一个关于城市生活的长段落，讲述了人们在周末的活动和他们的快乐。</p></article></body></html>";
                let (bytes, _, _) = encoding_rs::GBK.encode(page);
                ([(header::CONTENT_TYPE, "text/html; charset=GBK")], bytes.into_owned()).into_response()
            }),
        )
        .route(
            "/sjis",
            get(|| async {
                // No charset in the header: only the meta tag says Shift_JIS.
                let page = "<html><head><meta http-equiv=\"Content-Type\" content=\"text/html; charset=Shift_JIS\"><title>日本の記事</title></head><body><article><h1>日本の記事</h1><p>東京の桜は今年も美しく咲きました。多くの人々が公園に集まり、花見を楽しみました。これは春の訪れを告げる長い段落です。</p></article></body></html>";
                let (bytes, _, _) = encoding_rs::SHIFT_JIS.encode(page);
                ([(header::CONTENT_TYPE, "text/html")], bytes.into_owned()).into_response()
            }),
        )
        .route(
            "/r/{n}",
            get(|Path(n): Path<u32>| async move {
                if n == 0 { Redirect::temporary("/article").into_response() } else { Redirect::temporary(&format!("/r/{}", n - 1)).into_response() }
            }),
        )
        .route(
            "/data.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], r#"{"answer": 42, "items": ["a", "b"]}"#) }),
        )
        .route("/notes.md", get(|| async { ([(header::CONTENT_TYPE, "text/markdown")], "# Notes\n\n- one\n- two\n") }))
        .route("/image.png", get(|| async { ([(header::CONTENT_TYPE, "image/png")], vec![0x89u8, b'P', b'N', b'G', 0, 0, 0, 13]) }))
        .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such page") }))
        .route(
            "/drip",
            get(|| async {
                // One byte every 100 ms, for at most 10 s: each read is quick, the whole is slow.
                let stream = futures::stream::unfold(0u32, |i| async move {
                    if i >= 100 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x")), i + 1))
                });
                ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream))
            }),
        )
        .route("/large", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "y".repeat(50_000)) }))
        .route(
            "/large-chunked",
            get(|| async {
                // No Content-Length: the cap must stop the read itself.
                let stream = futures::stream::iter((0..50).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'z'; 1000]))));
                ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream))
            }),
        )
        .route("/robots.txt", get(|| async { "User-agent: *\nDisallow: /private\n" }))
        .route("/private/page", get(|| async { html(ARTICLE.into()) }));
    serve(app).await
}

#[tokio::test]
async fn article_keeps_the_main_content_with_title_and_final_url() {
    let addr = pages().await;
    let p = provider(&loopback_cfg());
    let url = format!("http://{addr}/article");
    let v = call(&p, "web_fetch", json!({"url": url})).await.unwrap();
    assert_eq!(v["title"], "Tidal energy in 2026");
    assert_eq!(v["final_url"], url);
    assert_eq!(v["status"], 200);
    let c = v["content"].as_str().unwrap();
    assert!(
        c.contains("Pentland Firth")
            && c.contains("[composite blades](https://example.org/blades)"),
        "{c}"
    );
    assert!(
        c.contains("What comes next") && c.contains("third array"),
        "{c}"
    );
    assert!(
        !c.contains("Copyright 2026") && !c.contains("About us"),
        "nav and footer must go: {c}"
    );
    let t = call(&p, "web_fetch", json!({"url": url, "format": "text"}))
        .await
        .unwrap();
    let tc = t["content"].as_str().unwrap();
    assert!(
        tc.contains("composite blades") && !tc.contains("](https://"),
        "{tc}"
    );
    let raw = call(&p, "web_fetch", json!({"url": url, "raw": true}))
        .await
        .unwrap();
    assert!(
        raw["content"]
            .as_str()
            .unwrap()
            .contains("<footer class=\"site-footer\">")
    );
}

#[tokio::test]
async fn two_megabyte_page_is_extracted_and_paged() {
    let addr = pages().await;
    let p = provider(&loopback_cfg());
    let url = format!("http://{addr}/big");
    let first = call(&p, "web_fetch", json!({"url": url, "max_length": 5000}))
        .await
        .unwrap();
    let total = first["total_length"].as_u64().unwrap();
    assert!(total > 1_000_000, "total {total}");
    assert_eq!(first["content"].as_str().unwrap().chars().count(), 5000);
    assert_eq!(first["truncated"], true);
    let next = first["next_start_index"].as_u64().unwrap();
    assert_eq!(next, 5000);
    let second = call(
        &p,
        "web_fetch",
        json!({"url": url, "max_length": 5000, "start_index": next}),
    )
    .await
    .unwrap();
    assert_eq!(second["start_index"], 5000);
    let joined = format!(
        "{}{}",
        first["content"].as_str().unwrap(),
        second["content"].as_str().unwrap()
    );
    let whole = call(&p, "web_fetch", json!({"url": url, "max_length": 10000}))
        .await
        .unwrap();
    assert_eq!(
        joined,
        whole["content"].as_str().unwrap(),
        "pages join into the same text"
    );
    let last = call(
        &p,
        "web_fetch",
        json!({"url": url, "start_index": total - 10}),
    )
    .await
    .unwrap();
    assert_eq!(last["truncated"], false);
    assert!(last.get("next_start_index").is_none());
}

#[tokio::test]
async fn page_nested_20000_deep_does_not_crash() {
    let addr = pages().await;
    let url = format!("http://{addr}/deep");
    // Default bounds: the depth cap turns the page into plain text.
    let p = provider(&loopback_cfg());
    let v = call(&p, "web_fetch", json!({"url": url})).await.unwrap();
    assert!(
        v["content"]
            .as_str()
            .unwrap()
            .contains("bottom of the well"),
        "{v}"
    );
    assert!(
        v["note"]
            .as_str()
            .unwrap()
            .contains("nested more than 1000 elements deep"),
        "{v}"
    );
    assert_eq!(v["title"], "Deep");
    // 4 MB of nothing but nesting: the scan refuses it before any tree is built.
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/deeper")}),
    )
    .await
    .unwrap();
    assert_eq!(v["content"], "at 400000");
    // The service still answers afterwards.
    let ok = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/article")}),
    )
    .await
    .unwrap();
    assert_eq!(ok["title"], "Tidal energy in 2026");
}

#[tokio::test]
async fn gbk_and_shift_jis_pages_are_decoded() {
    let addr = pages().await;
    let p = provider(&loopback_cfg());
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/gbk")}),
    )
    .await
    .unwrap();
    assert_eq!(v["charset"], "GBK");
    assert_eq!(v["title"], "新闻");
    assert!(
        v["content"].as_str().unwrap().contains("我们去公园散步"),
        "{v}"
    );
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/sjis")}),
    )
    .await
    .unwrap();
    assert_eq!(v["charset"], "Shift_JIS");
    assert_eq!(v["title"], "日本の記事");
    assert!(
        v["content"]
            .as_str()
            .unwrap()
            .contains("東京の桜は今年も美しく咲きました"),
        "{v}"
    );
}

#[tokio::test]
async fn redirect_chain_is_followed_up_to_five() {
    let addr = pages().await;
    let p = provider(&loopback_cfg());
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/r/4")}),
    )
    .await
    .unwrap();
    assert_eq!(v["final_url"], format!("http://{addr}/article"));
    assert_eq!(v["url"], format!("http://{addr}/r/4"));
    assert_eq!(v["title"], "Tidal energy in 2026");
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/r/5")}),
    )
    .await;
    assert!(
        err.contains("too many redirects") && err.contains("more than 5"),
        "{err}"
    );
}

#[tokio::test]
async fn text_json_and_markdown_pass_through_other_types_give_metadata() {
    let addr = pages().await;
    let p = provider(&loopback_cfg());
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/data.json")}),
    )
    .await
    .unwrap();
    assert_eq!(v["content"], r#"{"answer": 42, "items": ["a", "b"]}"#);
    assert_eq!(v["content_type"], "application/json");
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/notes.md")}),
    )
    .await
    .unwrap();
    assert_eq!(v["content"], "# Notes\n\n- one\n- two\n");
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/image.png")}),
    )
    .await
    .unwrap();
    assert_eq!(v["content_type"], "image/png");
    assert_eq!(v["bytes"], 8);
    assert!(
        v.get("content").is_none() && v["note"].as_str().unwrap().contains("metadata"),
        "{v}"
    );
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/missing")}),
    )
    .await;
    assert!(err.contains("HTTP 404"), "{err}");
}

#[tokio::test]
async fn slow_drip_hits_the_total_timeout() {
    let addr = pages().await;
    let p = provider(&WebConfig {
        total_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_millis(800),
        ..loopback_cfg()
    });
    let started = std::time::Instant::now();
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/drip")}),
    )
    .await;
    assert!(
        err.contains("timed out") && err.contains("web.total_timeout"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped at the deadline, not at the end of the drip"
    );
}

#[tokio::test]
async fn body_larger_than_the_cap_is_refused() {
    let addr = pages().await;
    let p = provider(&WebConfig {
        max_body_bytes: 10_000,
        ..loopback_cfg()
    });
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/large")}),
    )
    .await;
    assert!(
        err.contains("50000 bytes, over the cap of 10000 bytes"),
        "Content-Length is checked first: {err}"
    );
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{addr}/large-chunked")}),
    )
    .await;
    assert!(err.contains("larger than the cap of 10000 bytes"), "{err}");
}

#[tokio::test]
async fn robots_txt_is_respected_when_configured() {
    let addr = pages().await;
    let url = format!("http://{addr}/private/page");
    let p = provider(&WebConfig {
        robots_txt: true,
        ..loopback_cfg()
    });
    let err = call_err(&p, "web_fetch", json!({"url": url})).await;
    assert!(err.contains("robots.txt disallows /private/page"), "{err}");
    assert!(
        call(
            &p,
            "web_fetch",
            json!({"url": format!("http://{addr}/article")})
        )
        .await
        .is_ok()
    );
    // Off (the default): the page is fetched.
    assert!(
        call(&provider(&loopback_cfg()), "web_fetch", json!({"url": url}))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn concurrent_fetches_are_capped() {
    #[derive(Default)]
    struct Gauge {
        now: AtomicUsize,
        max: AtomicUsize,
    }
    let gauge = Arc::new(Gauge::default());
    let app = Router::new()
        .route(
            "/slow",
            get(|State(g): State<Arc<Gauge>>| async move {
                let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
                g.max.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                g.now.fetch_sub(1, Ordering::SeqCst);
                "done"
            }),
        )
        .with_state(gauge.clone());
    let addr = serve(app).await;
    let p = Arc::new(provider(&WebConfig {
        max_concurrent_fetches: 2,
        ..loopback_cfg()
    }));
    let calls = (0..6).map(|_| {
        let p = p.clone();
        let url = format!("http://{addr}/slow");
        async move { call(&p, "web_fetch", json!({"url": url})).await }
    });
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.unwrap()["content"], "done");
    }
    assert_eq!(
        gauge.max.load(Ordering::SeqCst),
        2,
        "at most two fetches at once"
    );
}

#[tokio::test]
async fn bad_arguments_get_clear_errors() {
    let p = provider(&loopback_cfg());
    let err = call_err(&p, "web_fetch", json!({"url": "not a url"})).await;
    assert!(err.contains("not a valid URL"), "{err}");
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": "http://127.0.0.1:1/", "format": "pdf"}),
    )
    .await;
    assert!(err.contains("use markdown or text"), "{err}");
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": "http://127.0.0.1:1/", "max_length": -3}),
    )
    .await;
    assert!(err.contains("max_length"), "{err}");
    let err = call_err(&p, "web_fetch", json!({"url": "ftp://example.com/x"})).await;
    assert!(err.contains("only http and https"), "{err}");
    let err = call_err(&p, "nope", json!({})).await;
    assert!(err.contains("unknown tool"), "{err}");
}
