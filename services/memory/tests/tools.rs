//! The memory tools on every backend: each tool, the supersede chain, scope
//! isolation, hostile queries, 10,000 entries and concurrent writers.

mod common;

use omicos_memory::{MemoryProvider, MemoryStore, NewMemory, SearchQuery};
use omicos_toolkit::{CallCtx, Provider, ToolError};
use serde_json::{Value, json};

async fn provider(url: &str) -> MemoryProvider {
    MemoryProvider::new(MemoryStore::open(url).await.expect("open store"))
}

async fn call(
    p: &MemoryProvider,
    scope: &str,
    tool: &str,
    args: Value,
) -> Result<Value, ToolError> {
    let mut ctx = CallCtx::for_test(std::env::temp_dir(), "s1");
    ctx.scope = scope.into();
    p.call(tool, args, ctx).await
}

fn ids(v: &Value, field: &str) -> Vec<i64> {
    v[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn each_tool_on_every_backend() {
    for b in common::all("each_tool").await {
        let p = provider(&b.url).await;
        let saved = call(&p, "ws", "memory__save", json!({"content": "The user prefers tabs over spaces", "category": "user", "tags": ["style", "editor"]}))
            .await
            .unwrap();
        let id = saved["saved"]["id"].as_i64().unwrap();
        assert_eq!(
            saved["saved"]["tags"],
            json!(["style", "editor"]),
            "{}",
            b.name
        );
        assert!(saved["saved"].get("expired_ms").is_none());

        let other = call(&p, "ws", "memory__save", json!({"content": "Deploys go through the staging cluster first", "category": "project"}))
            .await
            .unwrap()["saved"]["id"]
            .as_i64()
            .unwrap();

        // search: words, category and tag filters
        let r = call(&p, "ws", "memory__search", json!({"query": "tabs spaces"}))
            .await
            .unwrap();
        assert_eq!(ids(&r, "results"), vec![id], "{}", b.name);
        assert!(r["results"][0]["score"].as_f64().unwrap() > 0.0);
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "tabs", "category": "project"}),
        )
        .await
        .unwrap();
        assert!(ids(&r, "results").is_empty(), "{}", b.name);
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "tabs", "tags": ["editor"]}),
        )
        .await
        .unwrap();
        assert_eq!(ids(&r, "results"), vec![id]);
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "tabs", "tags": ["editor", "nope"]}),
        )
        .await
        .unwrap();
        assert!(ids(&r, "results").is_empty());
        // A search marks its hits as used.
        let used = r["results"].as_array().unwrap().len();
        assert_eq!(used, 0);
        let before = p
            .store()
            .get("ws", other)
            .await
            .unwrap()
            .unwrap()
            .last_used_ms;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        call(&p, "ws", "memory__search", json!({"query": "staging"}))
            .await
            .unwrap();
        let after = p
            .store()
            .get("ws", other)
            .await
            .unwrap()
            .unwrap()
            .last_used_ms;
        assert!(
            after > before,
            "{}: search must update last_used ({before} -> {after})",
            b.name
        );

        // list with pagination
        for i in 0..5 {
            call(
                &p,
                "ws",
                "memory__save",
                json!({"content": format!("note number {i}"), "category": "reference"}),
            )
            .await
            .unwrap();
        }
        let page1 = call(&p, "ws", "memory__list", json!({"limit": 3}))
            .await
            .unwrap();
        assert_eq!(page1["entries"].as_array().unwrap().len(), 3);
        let cursor = page1["next_cursor"].as_str().unwrap().to_owned();
        let page2 = call(
            &p,
            "ws",
            "memory__list",
            json!({"limit": 3, "cursor": cursor}),
        )
        .await
        .unwrap();
        let page3 = call(
            &p,
            "ws",
            "memory__list",
            json!({"limit": 3, "cursor": page2["next_cursor"].as_str().unwrap()}),
        )
        .await
        .unwrap();
        assert!(page3["next_cursor"].is_null());
        let mut all: Vec<i64> = [
            ids(&page1, "entries"),
            ids(&page2, "entries"),
            ids(&page3, "entries"),
        ]
        .concat();
        assert_eq!(all.len(), 7, "{}", b.name);
        assert!(all.windows(2).all(|w| w[0] > w[1]), "newest first: {all:?}");
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 7);
        let refs = call(
            &p,
            "ws",
            "memory__list",
            json!({"category": "reference", "limit": 100}),
        )
        .await
        .unwrap();
        assert_eq!(refs["entries"].as_array().unwrap().len(), 5);
        let bad = call(
            &p,
            "ws",
            "memory__list",
            json!({"cursor": "'; DROP TABLE memories"}),
        )
        .await
        .unwrap_err();
        assert!(matches!(bad, ToolError::InvalidInput(_)), "{bad}");

        // update
        let up = call(
            &p,
            "ws",
            "memory__update",
            json!({"id": id, "content": "The user prefers spaces, 4 wide"}),
        )
        .await
        .unwrap();
        let new_id = up["updated"]["id"].as_i64().unwrap();
        assert_eq!(up["updated"]["supersedes"], json!(id));
        assert_eq!(
            up["updated"]["tags"],
            json!(["style", "editor"]),
            "update keeps the tags"
        );
        assert_eq!(up["updated"]["category"], "user");
        let old = p.store().get("ws", id).await.unwrap().unwrap();
        assert_eq!(old.expired_reason.as_deref(), Some("superseded"));
        assert_eq!(old.superseded_by, Some(new_id));
        let r = call(&p, "ws", "memory__search", json!({"query": "tabs spaces"}))
            .await
            .unwrap();
        assert_eq!(
            ids(&r, "results"),
            vec![new_id],
            "{}: only the valid entry",
            b.name
        );
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "tabs spaces", "include_expired": true}),
        )
        .await
        .unwrap();
        let mut got = ids(&r, "results");
        got.sort();
        assert_eq!(got, vec![id, new_id]);
        // A tag filter still finds the new entry (tags are copied).
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "spaces", "tags": ["style"]}),
        )
        .await
        .unwrap();
        assert_eq!(ids(&r, "results"), vec![new_id]);

        // forget
        let f = call(&p, "ws", "memory__forget", json!({"id": other}))
            .await
            .unwrap();
        assert_eq!(f["forgotten"]["expired_reason"], "forgotten");
        let r = call(&p, "ws", "memory__search", json!({"query": "staging"}))
            .await
            .unwrap();
        assert!(
            ids(&r, "results").is_empty(),
            "{}: forgotten entries are not recalled",
            b.name
        );
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "staging", "include_expired": true}),
        )
        .await
        .unwrap();
        assert_eq!(ids(&r, "results"), vec![other], "forgotten, never deleted");
        let listed = call(&p, "ws", "memory__list", json!({"limit": 100}))
            .await
            .unwrap();
        assert!(!ids(&listed, "entries").contains(&other));
        let listed = call(
            &p,
            "ws",
            "memory__list",
            json!({"limit": 100, "include_expired": true}),
        )
        .await
        .unwrap();
        assert!(ids(&listed, "entries").contains(&other));
        // Forgetting twice is harmless; updating a forgotten entry is refused clearly.
        call(&p, "ws", "memory__forget", json!({"id": other}))
            .await
            .unwrap();
        let e = call(
            &p,
            "ws",
            "memory__update",
            json!({"id": other, "content": "x"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("forgotten"), "{e}");

        // bad input: clear errors, never a panic
        let e = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "x", "category": "gossip"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("category"), "{e}");
        let e = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "   ", "category": "user"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "x", "category": "user", "scope": "other"}),
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string().contains("scope"),
            "the model cannot name a scope: {e}"
        );
        let e = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "x", "limit": 0}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        let e = call(&p, "ws", "memory__forget", json!({"id": 999_999}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
        let e = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "x".repeat(70_000), "category": "user"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        assert_eq!(p.store().integrity_check().await.unwrap(), "ok");
    }
}

#[tokio::test]
async fn supersede_chain() {
    for b in common::all("supersede_chain").await {
        let p = provider(&b.url).await;
        let v1 = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "release train is weekly", "category": "project"}),
        )
        .await
        .unwrap()["saved"]["id"]
            .as_i64()
            .unwrap();
        let v2 = call(
            &p,
            "ws",
            "memory__update",
            json!({"id": v1, "content": "release train is biweekly"}),
        )
        .await
        .unwrap()["updated"]["id"]
            .as_i64()
            .unwrap();
        let v3 = call(
            &p,
            "ws",
            "memory__update",
            json!({"id": v2, "content": "release train is monthly"}),
        )
        .await
        .unwrap()["updated"]["id"]
            .as_i64()
            .unwrap();
        let s = p.store();
        let (m1, m2, m3) = (
            s.get("ws", v1).await.unwrap().unwrap(),
            s.get("ws", v2).await.unwrap().unwrap(),
            s.get("ws", v3).await.unwrap().unwrap(),
        );
        assert_eq!(
            (m1.supersedes, m1.superseded_by),
            (None, Some(v2)),
            "{}",
            b.name
        );
        assert_eq!((m2.supersedes, m2.superseded_by), (Some(v1), Some(v3)));
        assert_eq!((m3.supersedes, m3.superseded_by), (Some(v2), None));
        assert!(m1.expired_ms.is_some() && m2.expired_ms.is_some() && m3.expired_ms.is_none());
        // Recall sees only the head of the chain; history on request.
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "release train"}),
        )
        .await
        .unwrap();
        assert_eq!(ids(&r, "results"), vec![v3]);
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "release train", "include_expired": true}),
        )
        .await
        .unwrap();
        assert_eq!(r["results"].as_array().unwrap().len(), 3);
        // Updating an old link names the entry to update instead.
        let e = call(
            &p,
            "ws",
            "memory__update",
            json!({"id": v1, "content": "x"}),
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("superseded by memory {v2}")),
            "{e}"
        );

        // A key makes save an upsert with the same history.
        let k1 = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "favourite colour: blue", "category": "user", "key": "colour"}),
        )
        .await
        .unwrap()["saved"]["id"]
            .as_i64()
            .unwrap();
        let k2 = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "favourite colour: green", "category": "user", "key": "colour"}),
        )
        .await
        .unwrap()["saved"]
            .clone();
        assert_eq!(k2["supersedes"], json!(k1));
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "favourite colour"}),
        )
        .await
        .unwrap();
        assert_eq!(
            ids(&r, "results"),
            vec![k2["id"].as_i64().unwrap()],
            "{}",
            b.name
        );
        // Same key, other scope: independent.
        let other = call(
            &p,
            "other",
            "memory__save",
            json!({"content": "favourite colour: red", "category": "user", "key": "colour"}),
        )
        .await
        .unwrap();
        assert!(other["saved"].get("supersedes").is_none());
    }
}

#[tokio::test]
async fn scopes_are_isolated() {
    for b in common::all("scopes").await {
        let p = provider(&b.url).await;
        let a = call(
            &p,
            "workspace:/a",
            "memory__save",
            json!({"content": "secret alpha plan", "category": "project", "tags": ["t"]}),
        )
        .await
        .unwrap()["saved"]["id"]
            .as_i64()
            .unwrap();
        call(
            &p,
            "user:bob",
            "memory__save",
            json!({"content": "bob likes alpha", "category": "user"}),
        )
        .await
        .unwrap();
        let r = call(
            &p,
            "user:bob",
            "memory__search",
            json!({"query": "secret alpha plan", "include_expired": true}),
        )
        .await
        .unwrap();
        let got = ids(&r, "results");
        assert_eq!(got.len(), 1, "{}: bob sees only his own entry", b.name);
        assert_ne!(got[0], a);
        let l = call(
            &p,
            "user:bob",
            "memory__list",
            json!({"limit": 100, "include_expired": true}),
        )
        .await
        .unwrap();
        assert!(!ids(&l, "entries").contains(&a));
        let e = call(
            &p,
            "user:bob",
            "memory__update",
            json!({"id": a, "content": "pwned"}),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
        let e = call(&p, "user:bob", "memory__forget", json!({"id": a}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
        assert!(
            p.store()
                .get("workspace:/a", a)
                .await
                .unwrap()
                .unwrap()
                .expired_ms
                .is_none(),
            "untouched"
        );
        let r = call(
            &p,
            "nobody",
            "memory__search",
            json!({"query": "alpha", "tags": ["t"]}),
        )
        .await
        .unwrap();
        assert!(ids(&r, "results").is_empty());
        // An empty scope is a runner bug, not a shared bucket.
        let e = call(&p, "", "memory__list", json!({})).await.unwrap_err();
        assert!(e.to_string().contains("scope"), "{e}");
    }
}

#[tokio::test]
async fn hostile_queries() {
    for b in common::all("hostile").await {
        let p = provider(&b.url).await;
        let id = call(&p, "ws", "memory__save", json!({"content": "naïve café in 東京 says привет; AND OR NOT are words here", "category": "reference"}))
            .await
            .unwrap()["saved"]["id"]
            .as_i64()
            .unwrap();
        call(
            &p,
            "ws",
            "memory__save",
            json!({"content": "an unrelated entry", "category": "reference"}),
        )
        .await
        .unwrap();
        let hostile = [
            "\"",
            "\"\"\"",
            "'",
            "AND OR",
            "NOT",
            "NEAR(a b, 3)",
            "content:café",
            "*",
            "a* OR -b",
            "'; DROP TABLE memories; --",
            "\\",
            "!&|():*<->",
            "\u{0}",
            "🙂🙂",
        ];
        for q in hostile {
            let r = call(&p, "ws", "memory__search", json!({"query": q})).await;
            assert!(r.is_ok(), "{}: query {q:?}: {r:?}", b.name);
        }
        // Keywords are searched as words.
        let r = call(&p, "ws", "memory__search", json!({"query": "AND OR"}))
            .await
            .unwrap();
        assert_eq!(ids(&r, "results"), vec![id], "{}", b.name);
        // A lone quote has no words: empty, with a note.
        let r = call(&p, "ws", "memory__search", json!({"query": "\""}))
            .await
            .unwrap();
        assert!(ids(&r, "results").is_empty());
        assert!(r["note"].as_str().unwrap().contains("no words"));
        // Unicode words match.
        for q in ["привет", "東京", "naïve"] {
            let r = call(&p, "ws", "memory__search", json!({"query": q}))
                .await
                .unwrap();
            assert_eq!(ids(&r, "results"), vec![id], "{}: {q}", b.name);
        }
        // A 10 KB query (words and punctuation) answers, and still finds the entry.
        let big: String = "zebra \" OR (NEAR* ".repeat(600) + " привет";
        assert!(big.len() > 10_000);
        let r = call(&p, "ws", "memory__search", json!({"query": big}))
            .await
            .unwrap();
        assert!(r["results"].as_array().unwrap().len() <= 10);
        let big_words: String = (0..2000).map(|i| format!("w{i} ")).collect::<String>();
        assert!(
            call(&p, "ws", "memory__search", json!({"query": big_words}))
                .await
                .is_ok()
        );
        // Hostile content is stored verbatim and nothing was dropped.
        let weird = "'); DELETE FROM memories; -- \" AND OR *";
        let w = call(
            &p,
            "ws",
            "memory__save",
            json!({"content": weird, "category": "user", "tags": ["a'b", "\"q\""], "key": "k'\""}),
        )
        .await
        .unwrap();
        assert_eq!(w["saved"]["content"], weird);
        assert_eq!(p.store().count("ws").await.unwrap(), (3, 3), "{}", b.name);
        let r = call(
            &p,
            "ws",
            "memory__search",
            json!({"query": "delete", "tags": ["a'b"]}),
        )
        .await
        .unwrap();
        assert_eq!(r["results"].as_array().unwrap().len(), 1);
        assert_eq!(p.store().integrity_check().await.unwrap(), "ok");
    }
}

const WORDS: &[&str] = &[
    "kernel", "python", "notebook", "deploy", "cluster", "gradient", "matrix", "pipeline",
    "sample", "dataset", "vector", "protein", "sequence", "genome", "cell", "tissue", "marker",
    "cluster", "umap", "batch", "plot", "figure", "report",
];

fn entry(i: usize) -> NewMemory {
    let w = |k: usize| WORDS[(i * 7 + k * 13) % WORDS.len()];
    NewMemory {
        content: format!(
            "entry {i} about {} {} and {} with token t{i}",
            w(0),
            w(1),
            w(2)
        ),
        category: ["user", "feedback", "project", "reference"][i % 4].into(),
        tags: vec![format!("g{}", i % 10)],
        key: None,
    }
}

#[tokio::test]
async fn search_over_10000_entries() {
    for b in common::all("search_10k").await {
        let s = MemoryStore::open(&b.url).await.unwrap();
        for chunk in (0..10_000).collect::<Vec<_>>().chunks(1000) {
            s.save_many("ws", chunk.iter().map(|i| entry(*i)).collect())
                .await
                .unwrap();
        }
        assert_eq!(s.count("ws").await.unwrap(), (10_000, 10_000));
        // A unique token finds exactly its entry.
        let hits = s
            .search(
                "ws",
                &SearchQuery {
                    text: "t4242".into(),
                    limit: 10,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "{}", b.name);
        assert!(hits[0].memory.content.starts_with("entry 4242 "));
        // A common word fills the limit, best first.
        let hits = s
            .search(
                "ws",
                &SearchQuery {
                    text: "protein genome".into(),
                    limit: 50,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(hits.len(), 50, "{}", b.name);
        assert!(
            hits.windows(2).all(|w| w[0].score >= w[1].score),
            "{}: ranked",
            b.name
        );
        // Filters combine with the text.
        let hits = s
            .search(
                "ws",
                &SearchQuery {
                    text: "protein".into(),
                    category: Some("user".into()),
                    tags: vec!["g4".into()],
                    limit: 100,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(!hits.is_empty());
        assert!(
            hits.iter()
                .all(|h| h.memory.category == "user" && h.memory.tags == vec!["g4".to_string()])
        );
    }
}

#[tokio::test]
async fn recency_of_use_ranks_ahead() {
    for b in common::all("recency").await {
        let s = MemoryStore::open(&b.url).await.unwrap();
        let ids = s
            .save_many(
                "ws",
                vec![
                    NewMemory {
                        content: "quokka habitat notes".into(),
                        category: "reference".into(),
                        ..Default::default()
                    },
                    NewMemory {
                        content: "quokka habitat notes".into(),
                        category: "reference".into(),
                        ..Default::default()
                    },
                ],
            )
            .await
            .unwrap();
        // Make the first one look unused for a month, the second recently used.
        s.set_last_used(
            "ws",
            ids[0],
            omicos_memory::store::now_ms() - 30 * 86_400_000,
        )
        .await
        .unwrap();
        let hits = s
            .search(
                "ws",
                &SearchQuery {
                    text: "quokka".into(),
                    limit: 2,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
            vec![ids[1], ids[0]],
            "{}",
            b.name
        );
        assert!(hits[0].score > hits[1].score);
        // Now the first was just used by the search itself: a stale one loses.
        s.set_last_used(
            "ws",
            ids[1],
            omicos_memory::store::now_ms() - 30 * 86_400_000,
        )
        .await
        .unwrap();
        let hits = s
            .search(
                "ws",
                &SearchQuery {
                    text: "quokka".into(),
                    limit: 2,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(hits[0].memory.id, ids[0], "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers() {
    for b in common::all("concurrent").await {
        // Two stores (two pools, as two replicas would have) on one database.
        let s1 = MemoryStore::open(&b.url).await.unwrap();
        let s2 = MemoryStore::open(&b.url).await.unwrap();
        let mut tasks = Vec::new();
        for w in 0..8 {
            let s = if w % 2 == 0 { s1.clone() } else { s2.clone() };
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..40 {
                    let m = s
                        .save(
                            "ws",
                            NewMemory {
                                content: format!("writer {w} note {i}"),
                                category: "project".into(),
                                tags: vec![format!("w{w}")],
                                key: None,
                            },
                        )
                        .await
                        .unwrap();
                    ids.push(m.id);
                    if i % 10 == 0 {
                        s.search(
                            "ws",
                            &SearchQuery {
                                text: format!("writer {w}"),
                                limit: 5,
                                ..Default::default()
                            },
                        )
                        .await
                        .unwrap();
                    }
                }
                ids
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 320, "{}", b.name);
        assert_eq!(s1.count("ws").await.unwrap(), (320, 320));

        // Everyone updates the same entry at once: exactly one wins, the rest
        // are told who did.
        let target = all[0];
        let mut racers = Vec::new();
        for r in 0..6 {
            let s = if r % 2 == 0 { s1.clone() } else { s2.clone() };
            racers.push(tokio::spawn(async move {
                s.update("ws", target, &format!("racer {r} was here")).await
            }));
        }
        let mut wins = 0;
        for r in racers {
            match r.await.unwrap() {
                Ok(_) => wins += 1,
                Err(e) => assert!(e.to_string().contains("superseded by memory"), "{e}"),
            }
        }
        assert_eq!(wins, 1, "{}", b.name);

        // Concurrent saves under one key leave exactly one valid entry.
        let mut keyed = Vec::new();
        for r in 0..6 {
            let s = if r % 2 == 0 { s1.clone() } else { s2.clone() };
            keyed.push(tokio::spawn(async move {
                s.save(
                    "ws",
                    NewMemory {
                        content: format!("keyed value {r}"),
                        category: "user".into(),
                        tags: vec![],
                        key: Some("k".into()),
                    },
                )
                .await
            }));
        }
        for k in keyed {
            k.await.unwrap().unwrap();
        }
        let hits = s1
            .search(
                "ws",
                &SearchQuery {
                    text: "keyed value".into(),
                    limit: 100,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "{}: one valid entry per key", b.name);
        let all = s1
            .search(
                "ws",
                &SearchQuery {
                    text: "keyed value".into(),
                    limit: 100,
                    include_expired: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(s1.integrity_check().await.unwrap(), "ok");
    }
}
