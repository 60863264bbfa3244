//! HTML → the page's main content, as markdown or text.
//!
//! The parse is bounded: the body was already capped in bytes, the element
//! count is capped, and the nesting depth is measured without recursion
//! before anything recursive (readability scoring, htmd's tree walk) runs.
//! A page nested deeper than the cap is returned as plain text, gathered
//! iteratively. The whole extraction runs on a worker thread with a large
//! stack, so even a page just under the depth cap cannot overflow it.

use dom_query::{Document, NodeRef};

mod scan;

/// Stack size of the extraction thread. It is reserved, not committed:
/// only the pages a deep document really touches use memory.
pub const EXTRACT_STACK_BYTES: usize = 256 << 20;

/// Output format of extracted HTML.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Markdown (headings, links, lists kept).
    Markdown,
    /// Plain text.
    Text,
}

/// Bounds of one extraction.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Most elements a page may have.
    pub max_elements: usize,
    /// Deepest nesting handed to the recursive stages.
    pub max_depth: usize,
}

/// What came out of a page.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    /// The page title ("" when none).
    pub title: String,
    /// The main content.
    pub content: String,
    /// A note for the reader when the page was handled in a degraded way.
    pub note: Option<String>,
}

/// Why a page could not be extracted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExtractError {
    /// The page has more elements than allowed.
    #[error("the page has {0} elements, over the cap of {1} (web.max_elements)")]
    TooManyElements(usize, usize),
    /// The worker thread failed.
    #[error("extraction failed: {0}")]
    Worker(String),
}

/// Extracts `html` on a worker thread with a large stack.
pub async fn extract_on_worker(
    html: String,
    url: String,
    format: Format,
    bounds: Bounds,
) -> Result<Extracted, ExtractError> {
    run_on_worker(move || extract(&html, &url, format, bounds)).await?
}

/// Runs `f` on a fresh thread with an [`EXTRACT_STACK_BYTES`] stack; a panic
/// becomes an error instead of taking the service down.
pub async fn run_on_worker<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ExtractError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("web-extract".into())
        .stack_size(EXTRACT_STACK_BYTES)
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        })
        .map_err(|e| ExtractError::Worker(format!("cannot start the extraction thread: {e}")))?;
    match rx.await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(_)) => Err(ExtractError::Worker(
            "the HTML converter panicked on this page".into(),
        )),
        Err(_) => Err(ExtractError::Worker(
            "the extraction thread ended without an answer".into(),
        )),
    }
}

/// Extracts the main content of `html` (call it on a thread with a large stack).
pub fn extract(
    html: &str,
    url: &str,
    format: Format,
    bounds: Bounds,
) -> Result<Extracted, ExtractError> {
    // Gate 1, before the tree is built: html5ever's scope checks and the
    // readability scorer both cost time proportional to depth per element.
    if scan::depth_exceeds(html, bounds.max_depth) {
        return Ok(Extracted {
            title: scan::title(html),
            content: scan::text(html),
            note: Some(format!(
                "the page is nested more than {} elements deep (web.max_depth): returned as plain text",
                bounds.max_depth
            )),
        });
    }
    let doc = Document::from(html);
    // Gate 2, exact, on the tree (the scan estimates; the parser may nest differently).
    let shape = measure(&doc.root());
    if shape.elements > bounds.max_elements {
        return Err(ExtractError::TooManyElements(
            shape.elements,
            bounds.max_elements,
        ));
    }
    let title = first_title(&doc);
    if shape.depth > bounds.max_depth {
        return Ok(Extracted {
            title,
            content: flat_text(&doc.root()),
            note: Some(format!(
                "the page is nested {} elements deep, more than {} (web.max_depth): returned as plain text",
                shape.depth, bounds.max_depth
            )),
        });
    }
    let cfg = dom_smoothie::Config {
        max_elements_to_parse: bounds.max_elements,
        text_mode: dom_smoothie::TextMode::Formatted,
        ..Default::default()
    };
    let article = dom_smoothie::Readability::with_document(doc.clone(), Some(url), Some(cfg))
        .and_then(|mut r| r.parse());
    let (title, main_html, main_text) = match article {
        Ok(a) if !a.text_content.trim().is_empty() => {
            let t = if a.title.trim().is_empty() {
                title
            } else {
                a.title.trim().to_owned()
            };
            (t, a.content.to_string(), a.text_content.to_string())
        }
        // Not an article (a listing, a tiny page): convert the whole body.
        _ => {
            let body = doc.select("body");
            let html = if body.exists() {
                body.html().to_string()
            } else {
                doc.html().to_string()
            };
            (title, html, body_text(&doc))
        }
    };
    let content = match format {
        Format::Text => tidy(&main_text),
        Format::Markdown => {
            let converter = htmd::HtmlToMarkdown::builder()
                .skip_tags(vec!["script", "style", "noscript", "template"])
                .build();
            match converter.convert(&main_html) {
                Ok(md) => tidy(&md),
                Err(_) => tidy(&main_text),
            }
        }
    };
    Ok(Extracted {
        title,
        content,
        note: None,
    })
}

struct Shape {
    elements: usize,
    depth: usize,
}

/// Element count and deepest nesting, without recursion.
fn measure(root: &NodeRef<'_>) -> Shape {
    let mut elements = 0;
    let mut depth = 0;
    let mut stack = vec![(*root, 0usize)];
    while let Some((node, d)) = stack.pop() {
        if node.is_element() {
            elements += 1;
        }
        depth = depth.max(d);
        let mut child = node.first_child();
        while let Some(c) = child {
            child = c.next_sibling();
            let deeper = d + usize::from(c.is_element());
            stack.push((c, deeper));
        }
    }
    Shape { elements, depth }
}

fn first_title(doc: &Document) -> String {
    doc.root()
        .descendants_it()
        .find(|n| n.is_element() && n.node_name().is_some_and(|t| &*t == "title"))
        .map(|n| collapse_ws(&n.text()))
        .unwrap_or_default()
}

/// The text of every text node outside scripts and styles, in order, without recursion.
fn flat_text(root: &NodeRef<'_>) -> String {
    let mut out = String::new();
    for n in root.descendants_it() {
        if !n.is_text() {
            continue;
        }
        let hidden = n
            .parent()
            .and_then(|p| p.node_name())
            .is_some_and(|t| matches!(&*t, "script" | "style" | "noscript" | "template" | "title"));
        if hidden {
            continue;
        }
        let t = collapse_ws(&n.text());
        if !t.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&t);
        }
    }
    out
}

fn body_text(doc: &Document) -> String {
    let body = doc.select("body");
    match body.nodes().first() {
        Some(b) => b.formatted_text().to_string(),
        None => flat_text(&doc.root()),
    }
}

fn collapse_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Trims trailing spaces and runs of blank lines.
fn tidy(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut blank = 0;
    for line in s.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        max_elements: 100_000,
        max_depth: 1_000,
    };

    #[test]
    fn article_keeps_main_content() {
        let html = r#"<html><head><title>Rust 2026</title></head><body>
            <nav><a href="/">Home</a> <a href="/x">Menu item nav</a></nav>
            <article><h1>Rust 2026</h1>
              <p>The Rust project shipped a new edition with many improvements to async code, and this paragraph is long enough to count as content for the readability scorer, which wants real sentences.</p>
              <p>A second paragraph, also long, talks about <a href="https://example.com/tokio">tokio</a> and how the runtime scheduled tasks across cores with work stealing.</p>
            </article>
            <footer>Copyright footer text</footer></body></html>"#;
        let e = extract(html, "https://example.com/a", Format::Markdown, BOUNDS).unwrap();
        assert_eq!(e.title, "Rust 2026");
        assert!(
            e.content.contains("[tokio](https://example.com/tokio)"),
            "{}",
            e.content
        );
        assert!(!e.content.contains("Copyright footer"), "{}", e.content);
        let t = extract(html, "https://example.com/a", Format::Text, BOUNDS).unwrap();
        assert!(
            t.content.contains("work stealing") && !t.content.contains("](https"),
            "{}",
            t.content
        );
    }

    #[test]
    fn deep_and_wide_pages_are_bounded() {
        let deep = format!(
            "<html><body>{}deep text{}</body></html>",
            "<div>".repeat(5_000),
            "</div>".repeat(5_000)
        );
        let e = extract(&deep, "https://example.com/", Format::Markdown, BOUNDS).unwrap();
        assert!(
            e.content.contains("deep text") && e.note.as_deref().unwrap().contains("web.max_depth"),
            "{e:?}"
        );
        let wide = format!("<html><body>{}</body></html>", "<p>x</p>".repeat(200));
        let err = extract(
            &wide,
            "https://example.com/",
            Format::Markdown,
            Bounds {
                max_elements: 100,
                max_depth: 100,
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, ExtractError::TooManyElements(_, 100)),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_worker_stack_carries_htmd_through_20000_levels() {
        // htmd recurses once per level: this is what the large stack is for.
        let deep = format!(
            "<html><body>{}bottom{}</body></html>",
            "<div>".repeat(20_000),
            "</div>".repeat(20_000)
        );
        let md = run_on_worker(move || htmd::convert(&deep))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(md.trim(), "bottom");
    }
}
