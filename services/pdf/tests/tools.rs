//! The pdf tools on generated and real PDFs, called the way the tool-runner
//! calls an in-process provider: `validate_input`, then `call`.

mod common;

use common::{Builder, Page};
use omicos_pdf::{Config, PdfProvider};
use omicos_toolkit::{CallCtx, Provider, ToolError};
use serde_json::{Value, json};
use std::path::Path;

struct Ws {
    dir: tempfile::TempDir,
}

impl Ws {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn put(&self, name: &str, bytes: &[u8]) -> &Self {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
        self
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

async fn run(p: &PdfProvider, ws: &Ws, tool: &str, args: Value) -> Result<Value, ToolError> {
    let ctx = CallCtx::for_test(ws.path(), "s1");
    p.validate_input(tool, &args, &ctx)?;
    p.call(tool, args, ctx).await
}

fn text(v: Result<Value, ToolError>) -> String {
    match v {
        Ok(Value::String(s)) => s,
        other => panic!("expected text, got {other:?}"),
    }
}

fn failure(v: Result<Value, ToolError>) -> String {
    match v {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v}"),
    }
}

#[tokio::test]
async fn info_reports_pages_metadata_and_text_layer() {
    let ws = Ws::new();
    ws.put("docs/paper.pdf", &common::paper());
    let p = PdfProvider::default();
    let v = run(&p, &ws, "pdf__info", json!({"path": "docs/paper.pdf"}))
        .await
        .unwrap();
    assert_eq!(v["pages"], 3);
    assert_eq!(v["title"], "A Test Paper (draft)");
    assert_eq!(v["author"], "Ada Lovelace");
    assert_eq!(v["text_layer"], "yes");
    assert_eq!(v["pages_with_text"], 3);
    assert_eq!(v["encrypted"], false);
    assert_eq!(v["path"], "docs/paper.pdf");
}

#[tokio::test]
async fn read_marks_pages_in_order_and_honours_the_selection() {
    let ws = Ws::new();
    ws.put("paper.pdf", &common::paper());
    let p = PdfProvider::default();
    let all = text(run(&p, &ws, "pdf__read", json!({"path": "paper.pdf"})).await);
    assert!(all.starts_with("paper.pdf: pages 1-3 of 3\n"), "{all}");
    let (i1, i2, i3) = (
        all.find("--- page 1 ---").unwrap(),
        all.find("--- page 2 ---").unwrap(),
        all.find("--- page 3 ---").unwrap(),
    );
    assert!(i1 < i2 && i2 < i3);
    let methods = &all[i2..i3];
    assert!(
        methods.contains("Cells were clustered with the Leiden algorithm."),
        "{methods}"
    );
    // Lines stay lines, in the order they are on the page.
    let a = methods.find("Methods").unwrap();
    let b = methods.find("Leiden resolution was 0.8.").unwrap();
    assert!(a < b);

    let some = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "paper.pdf", "pages": "3,1"}),
        )
        .await,
    );
    assert!(some.starts_with("paper.pdf: pages 1, 3 of 3"), "{some}");
    assert!(
        some.contains("--- page 1 ---")
            && some.contains("--- page 3 ---")
            && !some.contains("--- page 2 ---")
    );
    assert!(some.contains("CD14 and LYZ"));

    let past = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "paper.pdf", "pages": "2-9"}),
        )
        .await,
    );
    assert!(
        past.contains("pages 2-3 of 3 (the file has no page 9)"),
        "{past}"
    );
    let none = failure(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "paper.pdf", "pages": "7"}),
        )
        .await,
    );
    assert!(
        none.contains("has 3 pages; page 7 does not exist"),
        "{none}"
    );
    let bad = failure(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "paper.pdf", "pages": "two"}),
        )
        .await,
    );
    assert!(bad.contains("expected page numbers"), "{bad}");
}

#[tokio::test]
async fn read_stops_at_max_chars_and_says_where_to_continue() {
    let ws = Ws::new();
    ws.put("long.pdf", &common::long(20));
    let p = PdfProvider::default();
    let out = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "long.pdf", "max_chars": 200}),
        )
        .await,
    );
    let body_len = out
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("[truncated"))
        .map(|l| l.chars().count() + 1)
        .sum::<usize>();
    assert!(body_len <= 202, "{body_len}: {out}");
    let note = out.lines().last().unwrap();
    assert!(
        note.starts_with("[truncated at max_chars=200 inside page"),
        "{out}"
    );
    assert!(
        note.contains("continue with pages=\"") && note.contains("-20\""),
        "{note}"
    );
    // The configured ceiling wins over what the call asks.
    let capped = PdfProvider::new(Config {
        max_chars_limit: 100,
        ..Config::default()
    });
    let out = text(
        run(
            &capped,
            &ws,
            "pdf__read",
            json!({"path": "long.pdf", "max_chars": 1_000_000}),
        )
        .await,
    );
    assert!(out.contains("[truncated at max_chars=100"), "{out}");
}

#[tokio::test]
async fn a_page_without_text_layer_says_so() {
    let ws = Ws::new();
    let scan = Builder::new()
        .page(Page::Image)
        .page(Page::Image)
        .build("Scanned letter", "Scanner");
    let mixed = Builder::new()
        .text_pages(&[&["Typed cover page."]])
        .page(Page::Image)
        .build("Mixed", "Someone");
    ws.put("scan.pdf", &scan).put("mixed.pdf", &mixed);
    let p = PdfProvider::default();

    let info = run(&p, &ws, "pdf__info", json!({"path": "scan.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["text_layer"], "no");
    assert_eq!(info["pages_without_text"], "1-2");
    assert!(
        info["note"].as_str().unwrap().contains("without OCR"),
        "{info}"
    );

    let out = text(run(&p, &ws, "pdf__read", json!({"path": "scan.pdf"})).await);
    assert!(
        out.contains("This PDF has no text layer on these pages"),
        "{out}"
    );
    assert!(
        out.contains("--- page 1 ---\n[no text layer on this page: it is 1 image only"),
        "{out}"
    );

    let info = run(&p, &ws, "pdf__info", json!({"path": "mixed.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["text_layer"], "partial");
    assert_eq!(info["pages_without_text"], "2");
    let out = text(run(&p, &ws, "pdf__read", json!({"path": "mixed.pdf"})).await);
    assert!(
        out.contains("Typed cover page.") && out.contains("[no text layer on this page"),
        "{out}"
    );
    assert!(!out.contains("This PDF has no text layer on these pages"));

    let found = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "scan.pdf", "query": "anything"}),
    )
    .await
    .unwrap();
    assert_eq!(found["total_matches"], 0);
    assert!(
        found["note"]
            .as_str()
            .unwrap()
            .contains("2 pages without a text layer"),
        "{found}"
    );
}

#[tokio::test]
async fn search_gives_pages_and_snippets() {
    let ws = Ws::new();
    ws.put("paper.pdf", &common::paper());
    let p = PdfProvider::default();
    let v = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "paper.pdf", "query": "leiden"}),
    )
    .await
    .unwrap();
    assert_eq!(v["total_matches"], 2);
    assert_eq!(v["pages_with_matches"], "2");
    let m = v["matches"].as_array().unwrap();
    assert_eq!(m[0]["page"], 2);
    assert!(
        m[0]["snippet"]
            .as_str()
            .unwrap()
            .contains("the Leiden algorithm"),
        "{v}"
    );
    // A phrase matches across the line break between two lines of the page.
    let v = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "paper.pdf", "query": "algorithm.  LEIDEN resolution"}),
    )
    .await
    .unwrap();
    assert_eq!(v["total_matches"], 1, "{v}");
    let v = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "paper.pdf", "query": "leiden", "max_results": 1}),
    )
    .await
    .unwrap();
    assert_eq!(v["matches"].as_array().unwrap().len(), 1);
    assert!(
        v["note"]
            .as_str()
            .unwrap()
            .contains("2 matches; the first 1"),
        "{v}"
    );
    let v = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "paper.pdf", "query": "zebrafish"}),
    )
    .await
    .unwrap();
    assert_eq!(v["total_matches"], 0);
    assert_eq!(v["pages_searched"], 3);
    let e = failure(
        run(
            &p,
            &ws,
            "pdf__search",
            json!({"path": "paper.pdf", "query": "   "}),
        )
        .await,
    );
    assert!(e.contains("`query` must contain some text"), "{e}");
}

#[tokio::test]
async fn encrypted_files_are_refused_plainly_unless_openable() {
    let ws = Ws::new();
    let locked = Builder::new()
        .text_pages(&[&["Top secret text."]])
        .build_encrypted("Locked", "user-pass");
    let open = Builder::new()
        .text_pages(&[&["Readable although encrypted."]])
        .build_encrypted("Open", "");
    ws.put("locked.pdf", &locked).put("open.pdf", &open);
    let p = PdfProvider::default();
    for tool in ["pdf__info", "pdf__read"] {
        let e = failure(run(&p, &ws, tool, json!({"path": "locked.pdf"})).await);
        assert!(
            e.contains("locked.pdf is encrypted with a password"),
            "{tool}: {e}"
        );
    }
    let e = failure(
        run(
            &p,
            &ws,
            "pdf__search",
            json!({"path": "locked.pdf", "query": "secret"}),
        )
        .await,
    );
    assert!(e.contains("encrypted"), "{e}");
    // An empty user password is how "protected against editing" files come: they read fine.
    let info = run(&p, &ws, "pdf__info", json!({"path": "open.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["encrypted"], true);
    assert_eq!(info["title"], "Open");
    let out = text(run(&p, &ws, "pdf__read", json!({"path": "open.pdf"})).await);
    assert!(out.contains("Readable although encrypted."), "{out}");
}

#[tokio::test]
async fn truncated_and_fake_pdfs_give_clear_errors() {
    let ws = Ws::new();
    let whole = common::paper();
    ws.put("half.pdf", &whole[..whole.len() / 2])
        .put("head.pdf", &whole[..40])
        .put(
            "page.pdf",
            b"<!DOCTYPE html><html><body>Access denied</body></html>",
        )
        .put(
            "picture.pdf",
            &[0x89, b'P', b'N', b'G', 13, 10, 26, 10, 0, 0],
        )
        .put("empty.pdf", b"")
        .put(
            "junk.pdf",
            &(0..4096u32)
                .map(|i| (i * 7919 % 251) as u8)
                .collect::<Vec<_>>(),
        );
    std::fs::create_dir(ws.path().join("folder.pdf")).unwrap();
    let p = PdfProvider::default();
    for (name, want) in [
        (
            "page.pdf",
            "is not a PDF: it does not start with the `%PDF-` header (it looks like an HTML page",
        ),
        ("picture.pdf", "(it looks like a PNG image)"),
        ("empty.pdf", "is not a PDF"),
        ("junk.pdf", "is not a PDF"),
        ("folder.pdf", "is a directory"),
        ("missing.pdf", "no such file in the workspace"),
    ] {
        for tool in ["pdf__info", "pdf__read"] {
            let e = failure(run(&p, &ws, tool, json!({"path": name})).await);
            assert!(e.contains(want), "{name} {tool}: {e}");
        }
    }
    for name in ["half.pdf", "head.pdf"] {
        // Either a clear refusal, or (lopdf is lenient) whatever pages survive: never a panic.
        match run(&p, &ws, "pdf__read", json!({"path": name})).await {
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("damaged or truncated") || e.contains("no pages"),
                    "{name}: {e}"
                );
            }
            Ok(v) => assert!(
                v.as_str().unwrap().contains("--- page 1 ---"),
                "{name}: {v}"
            ),
        }
        let _ = run(&p, &ws, "pdf__info", json!({"path": name})).await;
    }
}

#[tokio::test]
async fn paths_are_confined_to_the_workspace() {
    let ws = Ws::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x.pdf"), common::paper()).unwrap();
    std::os::unix::fs::symlink(outside.path().join("x.pdf"), ws.path().join("link.pdf")).unwrap();
    let p = PdfProvider::default();
    for path in [
        "../x.pdf",
        "/etc/passwd",
        "link.pdf",
        outside.path().join("x.pdf").to_str().unwrap(),
    ] {
        let e = failure(run(&p, &ws, "pdf__info", json!({"path": path})).await);
        assert!(e.contains("outside the workspace"), "{path}: {e}");
        // `call` checks again, for callers that skip validate_input.
        let e = p
            .call(
                "pdf__read",
                json!({"path": path}),
                CallCtx::for_test(ws.path(), "s"),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::InvalidInput(_)), "{path}: {e}");
    }
}

#[tokio::test]
async fn a_500_page_file_is_read_within_bounds() {
    let ws = Ws::new();
    ws.put("long.pdf", &common::long(500));
    let p = PdfProvider::default();
    let info = run(&p, &ws, "pdf__info", json!({"path": "long.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["pages"], 500);
    assert_eq!(info["pages_with_text"], 500);
    assert_eq!(info["text_layer"], "yes");
    let out = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "long.pdf", "pages": "499-"}),
        )
        .await,
    );
    assert!(
        out.contains("This is page 500 of the long report.") && out.contains("--- page 499 ---"),
        "{out}"
    );
    // Reading everything stops at the default cap instead of returning 500 pages.
    let all = text(run(&p, &ws, "pdf__read", json!({"path": "long.pdf"})).await);
    assert!(
        all.chars().count() < Config::default().default_max_chars + 500,
        "{}",
        all.len()
    );
    assert!(all.contains("[truncated at max_chars=20000"));
    let hit = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "long.pdf", "query": "gzmk"}),
    )
    .await
    .unwrap();
    assert_eq!(hit["pages_with_matches"], "250");
    assert_eq!(hit["pages_searched"], 500);
    let many = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "long.pdf", "query": "long report"}),
    )
    .await
    .unwrap();
    assert_eq!(many["total_matches"], 500);
    assert_eq!(many["matches"].as_array().unwrap().len(), 20);
}

#[tokio::test]
async fn the_time_budget_stops_long_work_with_a_clear_note() {
    let ws = Ws::new();
    ws.put("long.pdf", &common::long(500));
    // A budget so short that the 500 pages cannot all be taken.
    let p = PdfProvider::new(Config {
        time_budget: std::time::Duration::from_millis(1),
        ..Config::default()
    });
    let r = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "long.pdf", "query": "page"}),
    )
    .await;
    match r {
        Ok(v) => {
            assert!(v["pages_searched"].as_u64().unwrap() < 500, "{v}");
            assert!(
                v["note"].as_str().unwrap().contains("time budget ran out"),
                "{v}"
            );
        }
        Err(e) => assert!(e.to_string().contains("longer than"), "{e}"),
    }
}

#[tokio::test]
async fn hostile_pages_are_skipped_not_crashed_on() {
    let ws = Ws::new();
    // A form XObject that draws itself: pdf-extract would recurse until the stack overflows.
    let mut b = Builder::new().text_pages(&[&["Before the loop."]]);
    b.form("Loop", b"/Loop Do\n", true);
    let looped = b
        .page(Page::Raw(b"/Loop Do\n".to_vec()))
        .text_pages(&[&["After the loop."]])
        .build("Loop", "x");
    // `5 Do` makes pdf-extract unwrap a number as a name: a panic, caught per page.
    let panicky = Builder::new()
        .text_pages(&[&["Fine page."]])
        .page(Page::Raw(b"5 Do\n".to_vec()))
        .build("Panic", "x");
    let no_box = Builder::new()
        .without_media_box()
        .text_pages(&[&["No size."]])
        .build("NoBox", "x");
    ws.put("loop.pdf", &looped)
        .put("panic.pdf", &panicky)
        .put("nobox.pdf", &no_box)
        .put("bomb.pdf", &common::bomb(3 << 20));
    let p = PdfProvider::new(Config {
        max_page_content_mb: 1,
        ..Config::default()
    });

    let out = text(run(&p, &ws, "pdf__read", json!({"path": "loop.pdf"})).await);
    assert!(
        out.contains("Before the loop.") && out.contains("After the loop."),
        "{out}"
    );
    assert!(
        out.contains("--- page 2 ---\n[this page cannot be read: a form on this page draws itself"),
        "{out}"
    );

    let out = text(run(&p, &ws, "pdf__read", json!({"path": "panic.pdf"})).await);
    assert!(
        out.contains("Fine page.") && out.contains("--- page 2 ---\n[this page cannot be read:"),
        "{out}"
    );

    let out = text(run(&p, &ws, "pdf__read", json!({"path": "nobox.pdf"})).await);
    assert!(out.contains("no MediaBox"), "{out}");

    let out = text(run(&p, &ws, "pdf__read", json!({"path": "bomb.pdf"})).await);
    assert!(out.contains("A normal first page."), "{out}");
    assert!(out.contains("larger than 1 MiB once decompressed"), "{out}");
    let info = run(&p, &ws, "pdf__info", json!({"path": "bomb.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["unreadable_pages"], "2");

    // The bomb may hide in a font program, which the extractor inflates whole.
    ws.put("fontbomb.pdf", &common::font_bomb(3 << 20));
    let out = text(run(&p, &ws, "pdf__read", json!({"path": "fontbomb.pdf"})).await);
    assert!(
        out.contains("a font of this page is larger than 1 MiB once decompressed"),
        "{out}"
    );
}

#[tokio::test]
async fn files_over_the_size_cap_are_refused_before_reading() {
    let ws = Ws::new();
    let mut big = common::paper();
    big.extend(std::iter::repeat_n(b'%', 2 << 20));
    ws.put("big.pdf", &big);
    let p = PdfProvider::new(Config {
        max_file_mb: 1,
        ..Config::default()
    });
    let e = failure(run(&p, &ws, "pdf__info", json!({"path": "big.pdf"})).await);
    assert!(
        e.contains("big.pdf is 3 MiB; the pdf tools read files up to 1 MiB"),
        "{e}"
    );
}

#[tokio::test]
async fn a_real_world_pdf_made_by_groff_and_ghostscript() {
    let ws = Ws::new();
    let data = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replicate-design-note.pdf"),
    )
    .unwrap();
    ws.put("papers/note.pdf", &data);
    let p = PdfProvider::default();
    let info = run(&p, &ws, "pdf__info", json!({"path": "papers/note.pdf"}))
        .await
        .unwrap();
    assert_eq!(info["pages"], 3);
    assert_eq!(
        info["title"],
        "Counting Cells Twice: A Field Note on Replicate Design"
    );
    assert_eq!(info["author"], "Omicos Test Data Authors");
    assert_eq!(info["producer"], "GPL Ghostscript 10.00.0");
    assert_eq!(info["text_layer"], "yes");
    let out = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "papers/note.pdf", "pages": "1"}),
        )
        .await,
    );
    assert!(out.contains("Counting Cells Twice"), "{out}");
    assert!(out.contains("biological replicates"), "{out}");
    // Ghostscript writes word gaps as character spacing and many lines with
    // the `'` operator: both must come out as words and lines.
    assert!(out.contains("explains why biological replicates"), "{out}");
    assert!(out.contains("the same material\nagain and mostly"), "{out}");
    let page2 = text(
        run(
            &p,
            &ws,
            "pdf__read",
            json!({"path": "papers/note.pdf", "pages": "2"}),
        )
        .await,
    );
    assert!(page2.contains("4. Single-cell data"), "{page2}");
    // Ligatures are spelled out.
    assert!(
        page2.contains("flow cells") && page2.contains("pseudobulk profiles"),
        "{page2}"
    );
    let words = out.split_whitespace().count();
    assert!(
        words > 150,
        "page 1 should carry its running text, got {words} words"
    );
    let hit = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "papers/note.pdf", "query": "heteroscedasticity"}),
    )
    .await
    .unwrap();
    assert_eq!(hit["total_matches"], 1, "{hit}");
    assert_eq!(hit["pages_with_matches"], "3");
    let hit = run(
        &p,
        &ws,
        "pdf__search",
        json!({"path": "papers/note.pdf", "query": "pseudobulk profiles"}),
    )
    .await
    .unwrap();
    assert_eq!(hit["pages_with_matches"], "2", "{hit}");
}

#[tokio::test]
async fn the_specs_are_what_the_runner_expects() {
    let p = PdfProvider::default();
    let tools = p.tools();
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["pdf__info", "pdf__read", "pdf__search"]);
    for t in &tools {
        assert_eq!(t.toolset, "pdf");
        assert_eq!(t.risk, omicos_toolkit::Risk::Read as i32);
        let schema: Value = serde_json::from_str(&t.input_schema_json).unwrap();
        assert_eq!(schema["required"][0], "path");
    }
    assert!(omicos_toolkit::toolsets::in_toolsets(
        &["pdf".to_string()],
        "pdf__search"
    ));
    let ws = Ws::new();
    let e = failure(run(&p, &ws, "pdf__write", json!({"path": "a.pdf"})).await);
    assert!(e.contains("unknown tool"), "{e}");
}

#[tokio::test]
async fn parallel_calls_share_the_bounded_slots_and_cancel_stops_a_call() {
    let ws = Ws::new();
    ws.put("paper.pdf", &common::paper())
        .put("long.pdf", &common::long(100));
    let p = PdfProvider::new(Config {
        max_parallel: 2,
        ..Config::default()
    });
    let calls = (0..6).map(|i| {
        let p = p.clone();
        let ctx = CallCtx::for_test(ws.path(), "s");
        let path = if i % 2 == 0 { "paper.pdf" } else { "long.pdf" };
        async move {
            p.call("pdf__read", json!({"path": path, "pages": "1-2"}), ctx)
                .await
        }
    });
    for r in futures_join(calls).await {
        assert!(text(r).contains("--- page 2 ---"));
    }
    let ctx = CallCtx::for_test(ws.path(), "s");
    ctx.cancel.cancel();
    let e = p
        .call("pdf__read", json!({"path": "long.pdf"}), ctx)
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Cancelled), "{e:?}");
}

/// Runs futures concurrently on the test's runtime and collects their outputs in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    fs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
