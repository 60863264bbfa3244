//! The `pdf` provider: `pdf__info`, `pdf__read` and `pdf__search` for PDF
//! files in the workspace.
//!
//! It runs in process inside the tool-runner, so it must never take the
//! runner down: parsing happens on a bounded pool of threads
//! ([`worker::Workers`]) with a time budget and `catch_unwind`, files are
//! size-capped before they are read, decompressed page content is capped, and
//! the model's output is capped in characters. Parsing is done by
//! `pdf-extract` on top of `lopdf`; see [`extract`] for the guards placed in
//! front of them.

pub mod config;
pub mod extract;
pub mod layout;
pub mod pages;
pub mod worker;

pub use config::Config;

use async_trait::async_trait;
use extract::{Budget, Opened, PageText};
use omicos_toolkit::{
    CallCtx, Provider, Risk, ToolError, ToolSpec, confine::relative_to, confine_tool_path, tool,
};
use pages::PageSelection;
use serde_json::{Value, json};
use std::{
    path::PathBuf,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

/// Most matches `pdf__search` lists whatever the call asks.
const MAX_RESULTS_LIMIT: usize = 200;
/// Characters of context on each side of a search match.
const SNIPPET_CONTEXT: usize = 70;

/// The `pdf` provider (toolset `pdf`, risk Read).
#[derive(Clone, Debug)]
pub struct PdfProvider {
    config: Config,
    workers: worker::Workers,
}

impl PdfProvider {
    /// A provider with `config`.
    pub fn new(config: Config) -> Self {
        let workers = worker::Workers::new(config.max_parallel);
        Self { config, workers }
    }

    /// Same as [`PdfProvider::new`]; the name the other providers use.
    pub fn from_config(config: Config) -> Self {
        Self::new(config)
    }

    fn budget(&self) -> Budget {
        Budget {
            max_file_bytes: self.config.max_file_mb.saturating_mul(1 << 20),
            max_page_content_bytes: self
                .config
                .max_page_content_mb
                .saturating_mul(1 << 20)
                .max(1),
            deadline: Instant::now() + self.config.time_budget.min(Duration::from_secs(3600)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Default for PdfProvider {
    fn default() -> Self {
        Self::new(Config::default())
    }
}

fn path_schema() -> Value {
    json!({"type": "string", "description": "Path of the PDF, relative to the workspace."})
}

/// The path argument, confined to the workspace, and its shown form.
fn resolve(args: &Value, ctx: &CallCtx) -> Result<(PathBuf, String), ToolError> {
    let p = args
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid("`path` is required"))?;
    let resolved =
        confine_tool_path(&ctx.workspace, p).map_err(|e| ToolError::invalid(e.to_string()))?;
    let shown = relative_to(&ctx.workspace, &resolved);
    Ok((resolved, shown))
}

fn opt_usize(args: &Value, key: &str) -> Result<Option<usize>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            _ => Err(ToolError::invalid(format!(
                "`{key}` must be a whole number of at least 1, got {v}"
            ))),
        },
    }
}

fn selection(args: &Value) -> Result<PageSelection, ToolError> {
    match args.get("pages") {
        None | Some(Value::Null) => Ok(PageSelection::all()),
        Some(Value::String(s)) => {
            PageSelection::parse(s).map_err(|e| ToolError::invalid(e.to_string()))
        }
        Some(Value::Number(n)) => {
            PageSelection::parse(&n.to_string()).map_err(|e| ToolError::invalid(e.to_string()))
        }
        Some(v) => Err(ToolError::invalid(format!(
            "`pages` must be a string like \"1-3,7\", got {v}"
        ))),
    }
}

#[async_trait]
impl Provider for PdfProvider {
    fn name(&self) -> &str {
        "pdf"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "pdf__info",
                "Page count, title, author and other metadata of a PDF in the workspace, and whether its pages \
                 have a text layer (scanned PDFs do not, and their text cannot be read).",
                json!({
                    "type": "object",
                    "properties": {"path": path_schema()},
                    "required": ["path"],
                    "additionalProperties": false
                }),
            )
            .toolset("pdf")
            .provider("pdf")
            .risk(Risk::Read)
            .build(),
            tool(
                "pdf__read",
                "The text of chosen pages of a PDF in the workspace, in reading order, each page marked \
                 `--- page N ---`. Long output stops at max_chars and says where to continue.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": path_schema(),
                        "pages": {"type": "string", "description": "Pages to read, e.g. \"1-3,7\" or \"5-\"; all pages when omitted."},
                        "max_chars": {"type": "integer", "minimum": 1, "description": format!(
                            "Most characters to return (default {}, at most {}).",
                            self.config.default_max_chars, self.config.max_chars_limit)}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            )
            .toolset("pdf")
            .provider("pdf")
            .risk(Risk::Read)
            .build(),
            tool(
                "pdf__search",
                "Find where a word or phrase occurs in a PDF in the workspace (case-insensitive): the pages and a \
                 short snippet around each match.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": path_schema(),
                        "query": {"type": "string", "minLength": 1, "description": "Text to find; spaces match any run of whitespace."},
                        "max_results": {"type": "integer", "minimum": 1, "description": format!(
                            "Most matches to list (default {}, at most {MAX_RESULTS_LIMIT}).", self.config.default_max_results)}
                    },
                    "required": ["path", "query"],
                    "additionalProperties": false
                }),
            )
            .toolset("pdf")
            .provider("pdf")
            .risk(Risk::Read)
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        resolve(args, ctx)?;
        match tool {
            "pdf__read" => {
                selection(args)?;
                opt_usize(args, "max_chars")?;
            }
            "pdf__search" => {
                let q = args
                    .get("query")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if q.trim().is_empty() {
                    return Err(ToolError::invalid("`query` must contain some text"));
                }
                if q.chars().count() > 1000 {
                    return Err(ToolError::invalid(
                        "`query` is longer than 1000 characters; search for a shorter phrase",
                    ));
                }
                opt_usize(args, "max_results")?;
            }
            "pdf__info" => {}
            other => return Err(ToolError::UnknownTool(other.into())),
        }
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        self.validate_input(tool, &args, &ctx)?;
        let (path, shown) = resolve(&args, &ctx)?;
        // Opened where it was checked: a directory swapped for a link since
        // (by a job of the session's box) fails the open, never redirects it.
        let path =
            omicos_toolkit::open_confined(&ctx.workspace, &path, omicos_toolkit::OpenFor::Read)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        ToolError::failed(format!("{shown}: no such file in the workspace"))
                    }
                    _ => ToolError::failed(format!("{shown}: cannot be read: {e}")),
                })?;
        let budget = self.budget();
        match tool {
            "pdf__info" => {
                self.workers
                    .run(&ctx, budget, move |b| info(path, &shown, b))
                    .await
            }
            "pdf__read" => {
                let sel = selection(&args)?;
                let max_chars = opt_usize(&args, "max_chars")?
                    .unwrap_or(self.config.default_max_chars)
                    .min(self.config.max_chars_limit)
                    .max(1);
                self.workers
                    .run(&ctx, budget, move |b| {
                        read(path, &shown, &sel, max_chars, b).map(Value::String)
                    })
                    .await
            }
            "pdf__search" => {
                let query = args
                    .get("query")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let max_results = opt_usize(&args, "max_results")?
                    .unwrap_or(self.config.default_max_results)
                    .min(MAX_RESULTS_LIMIT);
                self.workers
                    .run(&ctx, budget, move |b| {
                        search(path, &shown, &query, max_results, b)
                    })
                    .await
            }
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }
}

/// A document-information string (title, author...), decoded from
/// PDFDocEncoding or UTF-16, or None when absent or blank.
fn info_string(o: &Opened, key: &[u8]) -> Option<String> {
    let info = o.doc.trailer.get(b"Info").ok()?;
    let dict = match info {
        lopdf::Object::Reference(r) => o.doc.get_dictionary(*r).ok()?,
        lopdf::Object::Dictionary(d) => d,
        _ => return None,
    };
    let v = dict.get(key).ok()?;
    let v = match v {
        lopdf::Object::Reference(r) => o.doc.get_object(*r).ok()?,
        v => v,
    };
    let s = lopdf::decode_text_string(v).ok()?;
    let s: String = s.chars().filter(|c| !c.is_control()).take(500).collect();
    let s = s.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn info(path: std::fs::File, shown: &str, b: &Budget) -> Result<Value, ToolError> {
    let mut o = extract::open(path, shown, b)?;
    let count = o.pages.len() as u32;
    let mut with_text = Vec::new();
    let mut without_text = Vec::new();
    let mut unreadable = Vec::new();
    let mut checked = 0u32;
    for (&num, &id) in o.pages.iter() {
        if b.exhausted() {
            break;
        }
        match extract::page_text(&mut o.doc, &mut o.checked, num, id, b) {
            PageText::Text(_) => with_text.push(num),
            PageText::NoText { .. } => without_text.push(num),
            PageText::Unreadable(_) => unreadable.push(num),
        }
        checked += 1;
    }
    let layer = match (
        with_text.is_empty(),
        without_text.is_empty() && unreadable.is_empty(),
    ) {
        (false, true) => "yes",
        (true, _) => "no",
        (false, false) => "partial",
    };
    let mut v = json!({"path": shown, "pages": count});
    let m = v.as_object_mut().expect("object literal");
    for (key, name) in [
        (b"Title".as_slice(), "title"),
        (b"Author", "author"),
        (b"Subject", "subject"),
        (b"Keywords", "keywords"),
        (b"Creator", "creator"),
        (b"Producer", "producer"),
        (b"CreationDate", "created"),
    ] {
        if let Some(s) = info_string(&o, key) {
            m.insert(name.into(), Value::String(s));
        }
    }
    m.insert("pdf_version".into(), Value::String(o.doc.version.clone()));
    m.insert("encrypted".into(), Value::Bool(o.was_encrypted));
    m.insert("text_layer".into(), Value::String(layer.into()));
    m.insert("pages_with_text".into(), json!(with_text.len()));
    if !without_text.is_empty() {
        m.insert(
            "pages_without_text".into(),
            Value::String(pages::describe(&without_text)),
        );
    }
    if !unreadable.is_empty() {
        m.insert(
            "unreadable_pages".into(),
            Value::String(pages::describe(&unreadable)),
        );
    }
    let mut notes = Vec::new();
    if checked < count {
        notes.push(format!(
            "only the first {checked} of {count} pages were checked for text within the time budget"
        ));
    }
    if layer == "no" {
        notes.push("no page has a text layer: the PDF is probably scanned images; its text cannot be read without OCR, which these tools do not do".into());
    }
    if o.skipped_object_streams > 0 {
        notes.push(format!(
            "{} compressed object stream(s) too large to decompress safely were left out; some pages or metadata may be missing",
            o.skipped_object_streams
        ));
    }
    if o.was_encrypted {
        notes.push("the file is encrypted without a user password, so it can be read".into());
    }
    if !notes.is_empty() {
        m.insert("note".into(), Value::String(notes.join("; ")));
    }
    Ok(v)
}

fn read(
    path: std::fs::File,
    shown: &str,
    sel: &PageSelection,
    max_chars: usize,
    b: &Budget,
) -> Result<String, ToolError> {
    let mut o = extract::open(path, shown, b)?;
    let count = o.pages.len() as u32;
    let (wanted, missing) = sel.resolve(count);
    if wanted.is_empty() {
        return Err(ToolError::invalid(format!(
            "{shown} has {count} page{}; page {} does not exist",
            if count == 1 { "" } else { "s" },
            missing.first().copied().unwrap_or(0)
        )));
    }
    let mut body = String::new();
    let mut chars = 0usize;
    let mut done = Vec::new();
    let mut no_text = Vec::new();
    let mut stop_note = None;
    for (i, &num) in wanted.iter().enumerate() {
        if b.exhausted() {
            stop_note = Some(format!(
                "[stopped: the time budget ran out before page {num}; continue with pages=\"{}\"]",
                pages::describe(&wanted[i..])
            ));
            break;
        }
        let Some(&id) = o.pages.get(&num) else {
            continue;
        };
        let text = match extract::page_text(&mut o.doc, &mut o.checked, num, id, b) {
            PageText::Text(t) => t,
            PageText::NoText { images } => {
                no_text.push(num);
                if images > 0 {
                    format!(
                        "[no text layer on this page: it is {images} image{} only (a scan?); its text cannot be read without OCR]",
                        if images == 1 { "" } else { "s" }
                    )
                } else {
                    "[no text on this page]".into()
                }
            }
            PageText::Unreadable(why) => format!("[this page cannot be read: {why}]"),
        };
        let block = format!("--- page {num} ---\n{text}\n");
        let len = block.chars().count();
        if chars + len > max_chars {
            let room = max_chars.saturating_sub(chars);
            body.extend(block.chars().take(room));
            done.push(num);
            let rest = &wanted[i..];
            stop_note = Some(format!(
                "\n[truncated at max_chars={max_chars} inside page {num}; continue with pages=\"{}\" (or a larger max_chars)]",
                pages::describe(rest)
            ));
            break;
        }
        chars += len;
        body.push_str(&block);
        done.push(num);
    }
    let mut head = format!(
        "{shown}: page{} {} of {count}",
        if done.len() == 1 { "" } else { "s" },
        pages::describe(&done)
    );
    if !missing.is_empty() {
        head.push_str(&format!(
            " (the file has no page {})",
            missing
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !done.is_empty() && no_text.len() == done.len() {
        head.push_str(
            "\nThis PDF has no text layer on these pages: they are images (probably scanned), and their text cannot be read \
             without OCR, which these tools do not do.",
        );
    }
    let mut out = head;
    out.push('\n');
    out.push_str(body.trim_end());
    if let Some(n) = stop_note {
        out.push('\n');
        out.push_str(n.trim_start());
    }
    Ok(out)
}

/// Lowercases char by char, keeping one char per char so that positions in
/// the folded text are positions in the original.
fn fold(c: char) -> char {
    let mut l = c.to_lowercase();
    match (l.next(), l.next()) {
        (Some(one), None) => one,
        _ => c,
    }
}

/// Whitespace runs collapsed to one space.
fn squash(text: &str) -> Vec<char> {
    let mut out = Vec::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = true;
        } else {
            if space && !out.is_empty() {
                out.push(' ');
            }
            space = false;
            out.push(c);
        }
    }
    out
}

fn search(
    path: std::fs::File,
    shown: &str,
    query: &str,
    max_results: usize,
    b: &Budget,
) -> Result<Value, ToolError> {
    let mut o = extract::open(path, shown, b)?;
    let needle: Vec<char> = squash(query).into_iter().map(fold).collect();
    let mut matches = Vec::new();
    let mut total = 0usize;
    let mut pages_with_hits = Vec::new();
    let mut no_text = 0usize;
    let mut searched = 0u32;
    for (&num, &id) in o.pages.iter() {
        if b.exhausted() {
            break;
        }
        searched += 1;
        let text = match extract::page_text(&mut o.doc, &mut o.checked, num, id, b) {
            PageText::Text(t) => t,
            _ => {
                no_text += 1;
                continue;
            }
        };
        let hay = squash(&text);
        let folded: Vec<char> = hay.iter().copied().map(fold).collect();
        let mut at = 0;
        let mut hit_here = false;
        while at + needle.len() <= folded.len() {
            if folded[at..at + needle.len()] == needle[..] {
                total += 1;
                hit_here = true;
                if matches.len() < max_results {
                    matches.push(json!({"page": num, "snippet": snippet(&hay, at, needle.len())}));
                }
                at += needle.len();
            } else {
                at += 1;
            }
        }
        if hit_here {
            pages_with_hits.push(num);
        }
    }
    let count = o.pages.len() as u32;
    let mut v = json!({
        "path": shown,
        "query": query,
        "pages": count,
        "pages_searched": searched,
        "total_matches": total,
        "pages_with_matches": pages::describe(&pages_with_hits),
        "matches": matches,
    });
    let m = v.as_object_mut().expect("object literal");
    let mut notes = Vec::new();
    if total > max_results {
        notes.push(format!("{total} matches; the first {max_results} are listed (raise max_results or read the pages)"));
    }
    if searched < count {
        notes.push(format!(
            "the time budget ran out: only pages 1-{searched} of {count} were searched"
        ));
    }
    if no_text > 0 {
        notes.push(format!(
            "{no_text} page{} without a text layer (images) could not be searched",
            if no_text == 1 { "" } else { "s" }
        ));
    }
    if !notes.is_empty() {
        m.insert("note".into(), Value::String(notes.join("; ")));
    }
    Ok(v)
}

/// The match at `at..at+len` with some context, cut at word boundaries.
fn snippet(hay: &[char], at: usize, len: usize) -> String {
    let mut start = at.saturating_sub(SNIPPET_CONTEXT);
    let mut end = (at + len + SNIPPET_CONTEXT).min(hay.len());
    if start > 0 {
        while start < at && hay[start - 1] != ' ' {
            start += 1;
        }
    }
    if end < hay.len() {
        while end > at + len && hay[end] != ' ' {
            end -= 1;
        }
    }
    let mut s = String::new();
    if start > 0 {
        s.push('…');
    }
    s.extend(&hay[start..end]);
    if end < hay.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_cut_at_words_and_mark_cuts() {
        let text: Vec<char> = squash(&format!(
            "{} needle here {}",
            "alpha ".repeat(30),
            "omega ".repeat(30)
        ));
        let folded: Vec<char> = text.iter().copied().map(fold).collect();
        let needle: Vec<char> = "needle".chars().collect();
        let at = folded
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .unwrap();
        let s = snippet(&text, at, needle.len());
        assert!(s.starts_with("…alpha") && s.ends_with("omega…"), "{s}");
        assert!(s.contains("needle here"));
        assert!(s.chars().count() <= 2 * SNIPPET_CONTEXT + needle.len() + 2);
    }

    #[test]
    fn folding_keeps_positions() {
        assert_eq!(fold('Ä'), 'ä');
        // İ lowercases to two chars: kept as is so positions stay aligned.
        assert_eq!(fold('İ'), 'İ');
        assert_eq!(squash("  a \n\t b  "), vec!['a', ' ', 'b']);
    }

    #[test]
    fn config_defaults_round_trip() {
        let c: Config = serde_json::from_value(json!({"max_file_mb": 5})).unwrap();
        assert_eq!(c.max_file_mb, 5);
        assert_eq!(c.default_max_chars, Config::default().default_max_chars);
        assert!(serde_json::from_value::<Config>(json!({"max_file": 5})).is_err());
    }
}
