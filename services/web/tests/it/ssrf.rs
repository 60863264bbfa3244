//! SSRF protection: literals in every spelling, names that resolve inward,
//! DNS rebinding, redirects inward, and the allowlist.
//!
//! Refused addresses are refused before any connection is attempted, so
//! these tests send no traffic anywhere but loopback.

use crate::support::{
    call, call_err, loopback_cfg, provider, provider_with_lookup, serve, serve_on,
};
use axum::{Router, response::Redirect, routing::get};
use omicos_web::{
    WebConfig,
    ssrf::{Lookup, LookupFuture},
};
use serde_json::json;
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

/// Answers fixed addresses per name, counting lookups.
struct FixedLookup {
    answers: HashMap<String, Vec<IpAddr>>,
    lookups: AtomicUsize,
}

impl FixedLookup {
    fn new(pairs: &[(&str, &[&str])]) -> Arc<Self> {
        Arc::new(Self {
            answers: pairs
                .iter()
                .map(|(n, ips)| {
                    (
                        n.to_string(),
                        ips.iter().map(|i| i.parse().unwrap()).collect(),
                    )
                })
                .collect(),
            lookups: AtomicUsize::new(0),
        })
    }
}

impl Lookup for FixedLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let r = self.answers.get(host).cloned().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {host}"))
        });
        Box::pin(async move { r })
    }
}

#[tokio::test]
async fn every_literal_form_is_refused_naming_the_rule() {
    let p = provider(&WebConfig::default());
    let cases = [
        ("http://127.0.0.1/", "loopback address 127.0.0.1"),
        ("http://2130706433/", "loopback address 127.0.0.1"),
        ("http://0x7f.1/", "loopback address 127.0.0.1"),
        ("http://0x7f000001/", "loopback address 127.0.0.1"),
        ("http://0177.0.0.1/", "loopback address 127.0.0.1"),
        ("http://127.1/", "loopback address 127.0.0.1"),
        ("http://[::1]/", "loopback address ::1"),
        (
            "http://[::ffff:127.0.0.1]/",
            "loopback address 127.0.0.1 embedded in IPv4-mapped IPv6",
        ),
        (
            "http://[::ffff:a9fe:a9fe]/",
            "link-local address 169.254.169.254 embedded in IPv4-mapped IPv6",
        ),
        (
            "http://[::ffff:0:7f00:1]/",
            "loopback address 127.0.0.1 embedded in IPv4-translated IPv6",
        ),
        (
            "http://[64:ff9b::7f00:1]/",
            "loopback address 127.0.0.1 embedded in NAT64",
        ),
        (
            "http://[64:ff9b::a00:1]/",
            "private (RFC 1918) address 10.0.0.1 embedded in NAT64",
        ),
        (
            "http://[2002:7f00:1::]/",
            "loopback address 127.0.0.1 embedded in 6to4",
        ),
        (
            "http://[2002:c0a8:101::1]/",
            "private (RFC 1918) address 192.168.1.1 embedded in 6to4",
        ),
        (
            "http://169.254.169.254/latest/meta-data/",
            "link-local address 169.254.169.254",
        ),
        ("http://2852039166/", "link-local address 169.254.169.254"),
        ("http://10.0.0.1/", "private (RFC 1918) address 10.0.0.1"),
        (
            "http://172.16.5.4/",
            "private (RFC 1918) address 172.16.5.4",
        ),
        (
            "http://192.168.0.1/",
            "private (RFC 1918) address 192.168.0.1",
        ),
        (
            "http://0xc0.0xa8.0.1/",
            "private (RFC 1918) address 192.168.0.1",
        ),
        (
            "http://100.64.0.1/",
            "carrier-grade NAT (RFC 6598) address 100.64.0.1",
        ),
        ("http://224.0.0.1/", "multicast address 224.0.0.1"),
        ("http://240.0.0.1/", "reserved address 240.0.0.1"),
        (
            "http://0.0.0.0/",
            "unspecified (\"this network\") address 0.0.0.0",
        ),
        (
            "http://[fc00::1]/",
            "unique local (fc00::/7) address fc00::1",
        ),
        (
            "http://[fd00:ec2::254]/",
            "unique local (fc00::/7) address fd00:ec2::254",
        ),
        (
            "http://[fe80::1]/",
            "link-local (fe80::/10) address fe80::1",
        ),
        ("http://[ff02::1]/", "multicast address ff02::1"),
    ];
    for (url, rule) in cases {
        let err = call_err(&p, "web_fetch", json!({"url": url})).await;
        assert!(
            err.starts_with(&format!("blocked: {rule}")) && err.ends_with(" (SSRF protection)"),
            "{url}: {err}"
        );
    }
    let err = call_err(&p, "web_fetch", json!({"url": "gopher://example.com/"})).await;
    assert!(err.contains("only http and https"), "{err}");
}

#[tokio::test]
async fn names_are_checked_after_resolution() {
    let addr = serve(Router::new().route("/", get(|| async { "inside" }))).await;
    let p = provider(&WebConfig::default());
    // localhost resolves (through the system resolver) to a loopback address.
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://localhost:{}/", addr.port())}),
    )
    .await;
    assert!(
        err.starts_with("blocked: loopback address")
            && err.contains("(host localhost)")
            && err.ends_with("(SSRF protection)"),
        "{err}"
    );
    // A name whose answers mix a public and an internal address is refused as a whole.
    let lookup = FixedLookup::new(&[
        ("mixed.test", &["93.184.216.34", "127.0.0.1"]),
        ("meta.test", &["169.254.169.254"]),
    ]);
    let p = provider_with_lookup(&WebConfig::default(), lookup.clone());
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://mixed.test:{}/", addr.port())}),
    )
    .await;
    assert_eq!(
        err,
        "blocked: loopback address 127.0.0.1 (host mixed.test) (SSRF protection)"
    );
    let err = call_err(&p, "web_fetch", json!({"url": "http://meta.test/latest/"})).await;
    assert_eq!(
        err,
        "blocked: link-local address 169.254.169.254 (host meta.test) (SSRF protection)"
    );
}

#[tokio::test]
async fn the_connection_uses_exactly_the_checked_addresses() {
    // `app.test` is allowlisted by name and resolves (through our lookup) to the
    // test server: the page arrives, so reqwest connected to what the resolver checked.
    let addr =
        serve(Router::new().route("/", get(|| async { "served from the checked address" }))).await;
    let lookup = FixedLookup::new(&[("app.test", &["127.0.0.1"])]);
    let cfg = WebConfig {
        allow: vec!["app.test".into()],
        ..WebConfig::default()
    };
    let p = provider_with_lookup(&cfg, lookup.clone());
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://app.test:{}/", addr.port())}),
    )
    .await
    .unwrap();
    assert_eq!(v["content"], "served from the checked address");
    assert!(lookup.lookups.load(Ordering::SeqCst) >= 1);
    // Not allowlisted, the same answer is refused.
    let p = provider_with_lookup(
        &WebConfig::default(),
        FixedLookup::new(&[("app.test", &["127.0.0.1"])]),
    );
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://app.test:{}/", addr.port())}),
    )
    .await;
    assert_eq!(
        err,
        "blocked: loopback address 127.0.0.1 (host app.test) (SSRF protection)"
    );
}

#[tokio::test]
async fn redirect_to_loopback_is_refused_when_not_allowlisted() {
    // The entry server is on 127.0.0.2 (allowlisted); it redirects to 127.0.0.1, which is not.
    // The target counts its hits: a refusal is proven by zero, not by the message.
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let target = serve(Router::new().route(
        "/secret",
        get(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async { "internal secret" }
        }),
    ))
    .await;
    let to = format!("http://127.0.0.1:{}/secret", target.port());
    let entry = serve_on(
        "127.0.0.2:0",
        Router::new()
            .route("/go", get(move || async move { Redirect::temporary(&to) }))
            .route(
                "/num",
                get(move || async move {
                    Redirect::temporary(&format!("http://2130706433:{}/secret", target.port()))
                }),
            ),
    )
    .await;
    let p = provider(&WebConfig {
        allow: vec!["127.0.0.2".into()],
        ..loopback_cfg()
    });
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{entry}/go")}),
    )
    .await;
    assert_eq!(err, "blocked: loopback address 127.0.0.1 (SSRF protection)");
    let err = call_err(
        &p,
        "web_fetch",
        json!({"url": format!("http://{entry}/num")}),
    )
    .await;
    assert_eq!(err, "blocked: loopback address 127.0.0.1 (SSRF protection)");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a refused redirect reached its target"
    );
    // With 127.0.0.1 allowlisted too, the same redirect is followed.
    let p = provider(&WebConfig {
        allow: vec!["127.0.0.2".into(), "127.0.0.1/32".into()],
        ..loopback_cfg()
    });
    let v = call(
        &p,
        "web_fetch",
        json!({"url": format!("http://{entry}/go")}),
    )
    .await
    .unwrap();
    assert_eq!(v["content"], "internal secret");
    // The counter does count: the followed redirect is one hit.
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        v["final_url"],
        format!("http://127.0.0.1:{}/secret", target.port())
    );
}

#[tokio::test]
async fn turning_protection_off_reaches_loopback() {
    let addr = serve(Router::new().route("/", get(|| async { "open" }))).await;
    let p = provider(&WebConfig {
        ssrf_protection: false,
        ..WebConfig::default()
    });
    let v = call(&p, "web_fetch", json!({"url": format!("http://{addr}/")}))
        .await
        .unwrap();
    assert_eq!(v["content"], "open");
    let err = WebConfig {
        allow: vec!["10.0.0.0/40".into()],
        ..WebConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("web.allow") && err.contains("10.0.0.0/40"),
        "{err}"
    );
}
