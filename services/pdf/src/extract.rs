//! Opening a PDF and taking the text out of its pages, with every bound the
//! tool-runner needs to host this in process: a size cap before reading, a
//! cap on decompressed page content, refusal of self-drawing forms (which
//! would recurse until the stack overflows, a crash no `catch_unwind` stops),
//! a deadline checked between pages, and a panic of the parser caught per page.
//!
//! Everything here is synchronous: it runs on the worker thread that
//! [`crate::worker`] gives it.

use lopdf::{
    Dictionary, Document, Object, ObjectId,
    content::{Content, Operation},
};
use omicos_toolkit::ToolError;
use std::{
    collections::{BTreeMap, HashSet},
    io::Read,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

/// The bounds of one call.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Largest file read, in bytes.
    pub max_file_bytes: u64,
    /// Largest decompressed content of one page (its streams and forms), in bytes.
    pub max_page_content_bytes: usize,
    /// When the call must stop taking pages.
    pub deadline: Instant,
    /// Set when the caller gave up (cancel or timeout): stop at the next page.
    pub stop: Arc<AtomicBool>,
}

impl Budget {
    /// Whether the call should stop before the next page.
    pub fn exhausted(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// An opened document.
pub struct Opened {
    /// The parsed document (decrypted when its user password is empty).
    pub doc: Document,
    /// Page number (1-based) → page object.
    pub pages: BTreeMap<u32, ObjectId>,
    /// The file was encrypted with an empty user password, which is opened as is.
    pub was_encrypted: bool,
    /// Font streams already checked for size (fonts are shared between pages).
    pub checked: HashSet<ObjectId>,
    /// Object streams left out because they would decompress past the cap.
    pub skipped_object_streams: u32,
}

thread_local! {
    /// The cap [`objstm_guard`] applies. lopdf takes a plain `fn` as its load
    /// filter, so the cap travels by thread-local: loading runs on the
    /// calling (worker) thread, as lopdf is built without rayon here.
    static OBJSTM_LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    /// How many object streams the guard left out during the current load.
    static OBJSTM_REFUSED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// lopdf load filter: leaves out an object stream (`/Type /ObjStm`) that would
/// decompress past the cap, since lopdf expands them whole while loading.
/// lopdf keeps the object it passed in for top-level objects and the returned
/// one for objects from inside object streams, so the object is cloned, not taken.
fn objstm_guard(id: ObjectId, obj: &mut Object) -> Option<(ObjectId, Object)> {
    if let Object::Stream(s) = obj
        && s.dict.has_type(b"ObjStm")
    {
        let limit = OBJSTM_LIMIT.with(|c| c.get());
        if bounded_content(s, limit, "an object stream").is_err() {
            OBJSTM_REFUSED.with(|c| c.set(c.get() + 1));
            return None;
        }
    }
    Some((id, obj.clone()))
}

/// What one page gave.
#[derive(Debug, Clone, PartialEq)]
pub enum PageText {
    /// Text in reading order (content-stream order, lines by position).
    Text(String),
    /// No text at all; `images` is how many images the page draws.
    NoText {
        /// Image XObjects on the page.
        images: usize,
    },
    /// The page could not be read; the reason is for the model.
    Unreadable(String),
}

impl PageText {
    /// Whether the page has text.
    pub fn has_text(&self) -> bool {
        matches!(self, PageText::Text(_))
    }
}

/// Reads and parses `file` (opened where its path was checked), or says
/// plainly why it cannot be used.
pub fn open(file: std::fs::File, shown: &str, budget: &Budget) -> Result<Opened, ToolError> {
    let meta = file
        .metadata()
        .map_err(|e| ToolError::failed(format!("{shown}: cannot be read: {e}")))?;
    if meta.is_dir() {
        return Err(ToolError::failed(format!(
            "{shown} is a directory, not a PDF file"
        )));
    }
    if meta.len() > budget.max_file_bytes {
        return Err(ToolError::failed(format!(
            "{shown} is {} MiB; the pdf tools read files up to {} MiB",
            meta.len().div_ceil(1 << 20),
            budget.max_file_bytes >> 20
        )));
    }
    // Read at most the cap even if the file grew since the metadata call.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(budget.max_file_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::failed(format!("{shown}: cannot be read: {e}")))?;
    if bytes.len() as u64 > budget.max_file_bytes {
        return Err(ToolError::failed(format!(
            "{shown} grew past the size limit while being read"
        )));
    }
    // The header may follow some junk, but within the first KiB (as readers allow).
    let head = &bytes[..bytes.len().min(1024)];
    if !head.windows(5).any(|w| w == b"%PDF-") {
        return Err(ToolError::failed(format!(
            "{shown} is not a PDF: it does not start with the `%PDF-` header{}",
            sniff(head)
                .map(|k| format!(" (it looks like {k})"))
                .unwrap_or_default()
        )));
    }
    OBJSTM_LIMIT.with(|c| c.set(budget.max_page_content_bytes));
    OBJSTM_REFUSED.with(|c| c.set(0));
    let options = lopdf::LoadOptions {
        filter: Some(objstm_guard),
        ..Default::default()
    };
    let loaded = Document::load_mem_with_options(&bytes, options);
    let skipped_object_streams = OBJSTM_REFUSED.with(|c| c.replace(0));
    let doc = loaded.map_err(|e| {
        ToolError::failed(format!(
            "{shown} is damaged or truncated and cannot be parsed as a PDF ({e}); if it was downloaded, fetch it again"
        ))
    })?;
    if doc.is_encrypted() {
        return Err(ToolError::failed(format!(
            "{shown} is encrypted with a password, so its text cannot be read; ask the user for an unprotected copy"
        )));
    }
    let pages = doc.get_pages();
    if pages.is_empty() && skipped_object_streams > 0 {
        return Err(ToolError::failed(format!(
            "{shown} keeps its objects in compressed object streams larger than {} MiB once decompressed, \
             which are not read; no page could be found without them",
            budget.max_page_content_bytes >> 20
        )));
    }
    if pages.is_empty() {
        return Err(ToolError::failed(format!(
            "{shown} has no pages that can be found (its page tree is missing or damaged, possibly truncated)"
        )));
    }
    let was_encrypted = doc.was_encrypted();
    Ok(Opened {
        doc,
        pages,
        was_encrypted,
        checked: HashSet::new(),
        skipped_object_streams,
    })
}

/// A guess at what a non-PDF file is, for the error message.
fn sniff(head: &[u8]) -> Option<&'static str> {
    let t = String::from_utf8_lossy(&head[..head.len().min(256)]).to_ascii_lowercase();
    let t = t.trim_start();
    Some(match head {
        [0x89, b'P', b'N', b'G', ..] => "a PNG image",
        [0xff, 0xd8, 0xff, ..] => "a JPEG image",
        [b'P', b'K', 3, 4, ..] => "a ZIP archive (a .docx, .xlsx or .epub is one)",
        [0x1f, 0x8b, ..] => "a gzip file",
        _ if t.starts_with("<!doctype html") || t.starts_with("<html") => {
            "an HTML page (a download that returned a web page?)"
        }
        _ if t.starts_with('{') || t.starts_with('[') => "JSON",
        _ if std::str::from_utf8(head).is_ok() && !head.is_empty() => "plain text",
        _ => return None,
    })
}

/// The text of page `num`. Never panics: a parser panic becomes
/// [`PageText::Unreadable`]. The document is changed in one way: the page's
/// content (and that of its forms) is replaced by the checked, decoded and
/// normalised bytes the extractor is then given.
pub fn page_text(
    doc: &mut Document,
    checked: &mut HashSet<ObjectId>,
    num: u32,
    id: ObjectId,
    budget: &Budget,
) -> PageText {
    let prepared = match check_page(doc, id, budget, checked) {
        Ok(p) => p,
        Err(why) => return PageText::Unreadable(why),
    };
    prepared.apply(doc, id);
    let doc = &*doc;
    let run = catch_unwind(AssertUnwindSafe(|| {
        let mut out = crate::layout::LineText::new();
        pdf_extract::output_doc_page(doc, &mut out, num).map(|_| out.into_text())
    }));
    match run {
        Ok(Ok(text)) if text.trim().is_empty() => PageText::NoText {
            images: count_images(doc, id),
        },
        Ok(Ok(text)) => PageText::Text(tidy(&crate::layout::expand_ligatures(&text))),
        Ok(Err(e)) => PageText::Unreadable(format!("the PDF parser could not read this page: {e}")),
        Err(_) => {
            PageText::Unreadable("the PDF parser failed on this page (malformed content)".into())
        }
    }
}

/// A page's content after the checks, ready to hand to the extractor.
struct Prepared {
    content: Vec<u8>,
    /// Forms whose content had to be rewritten.
    forms: Vec<(ObjectId, Vec<u8>)>,
}

impl Prepared {
    fn apply(self, doc: &mut Document, id: ObjectId) {
        let sid = doc.add_object(lopdf::Stream::new(Dictionary::new(), self.content));
        if let Ok(page) = doc.get_object_mut(id).and_then(Object::as_dict_mut) {
            page.set("Contents", sid);
        }
        for (fid, content) in self.forms {
            if let Ok(form) = doc.get_object_mut(fid).and_then(Object::as_stream_mut) {
                form.set_plain_content(content);
            }
        }
    }
}

/// Rewrites the `'` and `"` operators (next line, then show text), which
/// pdf-extract ignores, into the `T*`/`Tw`/`Tc`/`Tj` they stand for. Ghostscript
/// writes `'` for many lines, whose text would otherwise be lost. None when
/// nothing needs rewriting.
fn rewrite_quotes(content: &[u8]) -> Option<Vec<u8>> {
    if !content.iter().any(|&b| b == b'\'' || b == b'"') {
        return None;
    }
    let ops = Content::decode(content).ok()?.operations;
    if !ops.iter().any(|o| o.operator == "'" || o.operator == "\"") {
        return None;
    }
    let mut out = Vec::with_capacity(ops.len() + 16);
    for op in ops {
        match (op.operator.as_str(), op.operands.len()) {
            ("'", 1) => {
                out.push(Operation::new("T*", vec![]));
                out.push(Operation::new("Tj", op.operands));
            }
            ("\"", 3) => {
                let mut it = op.operands.into_iter();
                let (aw, ac, s) = (it.next()?, it.next()?, it.next()?);
                out.push(Operation::new("Tw", vec![aw]));
                out.push(Operation::new("Tc", vec![ac]));
                out.push(Operation::new("T*", vec![]));
                out.push(Operation::new("Tj", vec![s]));
            }
            _ => out.push(op),
        }
    }
    Content { operations: out }.encode().ok()
}

/// Drops trailing spaces and runs of more than two blank lines, which PDF
/// layout produces and which only cost the model tokens.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.trim_matches('\n').lines() {
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
    out.truncate(out.trim_end().len());
    out
}

fn count_images(doc: &Document, id: ObjectId) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        doc.get_page_images(id).map(|v| v.len()).unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// Deepest page-tree ancestry and form nesting accepted. Real files use a
/// handful of levels; the limits exist so that cycles end.
const MAX_TREE_DEPTH: usize = 64;
const MAX_FORM_DEPTH: usize = 32;
/// Most form invocations one page may make when checked (fan-out bound).
const MAX_FORM_VISITS: usize = 5_000;

/// Refuses pages the text extractor would loop on, recurse on without end, or
/// inflate without bound. The reason is for the model.
fn check_page(
    doc: &Document,
    id: ObjectId,
    budget: &Budget,
    checked: &mut HashSet<ObjectId>,
) -> Result<Prepared, String> {
    let page = doc
        .get_dictionary(id)
        .map_err(|_| "the page object is missing or not a dictionary".to_string())?;
    // The extractor looks up Resources and MediaBox through /Parent without a limit.
    let mut node = page;
    let mut resources = None;
    let mut media_box = false;
    for depth in 0.. {
        if depth > MAX_TREE_DEPTH {
            return Err("the page tree loops or is nested too deep".into());
        }
        if resources.is_none() {
            resources = node.get(b"Resources").ok().and_then(|r| deref_dict(doc, r));
        }
        media_box |= node.has(b"MediaBox");
        match node
            .get(b"Parent")
            .and_then(Object::as_reference)
            .and_then(|p| doc.get_dictionary(p))
        {
            Ok(parent) => node = parent,
            Err(_) => break,
        }
    }
    if !media_box {
        return Err("the page has no MediaBox (its size), so its layout cannot be read".into());
    }
    let mut used = 0usize;
    let mut content = Vec::new();
    for sid in doc.get_page_contents(id) {
        let Ok(stream) = doc.get_object(sid).and_then(Object::as_stream) else {
            continue;
        };
        let room = budget.max_page_content_bytes.saturating_sub(used);
        let plain = bounded_content(stream, room, "the page's content")?;
        used += plain.len();
        content.extend_from_slice(&plain);
        content.push(b'\n');
    }
    let empty = Dictionary::new();
    let mut walk = FormWalk {
        doc,
        budget,
        used,
        visits: 0,
        stack: Vec::new(),
        rewritten: Vec::new(),
        resources: Vec::new(),
    };
    let page_resources = resources.unwrap_or(&empty);
    walk.check(&content, page_resources)?;
    for res in std::iter::once(page_resources).chain(walk.resources.iter().copied()) {
        check_fonts(doc, res, budget, checked)?;
    }
    let content = rewrite_quotes(&content).unwrap_or(content);
    Ok(Prepared {
        content,
        forms: walk.rewritten,
    })
}

fn deref_dict<'a>(doc: &'a Document, o: &'a Object) -> Option<&'a Dictionary> {
    match o {
        Object::Dictionary(d) => Some(d),
        Object::Reference(r) => doc.get_dictionary(*r).ok(),
        _ => None,
    }
}

struct FormWalk<'a> {
    doc: &'a Document,
    budget: &'a Budget,
    used: usize,
    visits: usize,
    stack: Vec<ObjectId>,
    rewritten: Vec<(ObjectId, Vec<u8>)>,
    /// Resource dictionaries of the forms drawn, whose fonts are checked too.
    resources: Vec<&'a Dictionary>,
}

impl<'a> FormWalk<'a> {
    /// Follows every `Do` of a content stream into form XObjects, the way the
    /// extractor will, refusing cycles, deep nesting and oversized content.
    fn check(&mut self, content: &[u8], resources: &'a Dictionary) -> Result<(), String> {
        if !content.windows(2).any(|w| w == b"Do") {
            return Ok(());
        }
        let ops = Content::decode(content)
            .map(|c| c.operations)
            .unwrap_or_default();
        let xobjects = resources
            .get(b"XObject")
            .ok()
            .and_then(|x| deref_dict(self.doc, x));
        for op in ops.iter().filter(|o| o.operator == "Do") {
            let (Some(xobjects), Some(Ok(name))) =
                (xobjects, op.operands.first().map(Object::as_name))
            else {
                continue;
            };
            let Ok(fid) = xobjects.get(name).and_then(Object::as_reference) else {
                continue;
            };
            let Ok(form) = self.doc.get_object(fid).and_then(Object::as_stream) else {
                continue;
            };
            if form.dict.get(b"Subtype").and_then(Object::as_name).ok() != Some(b"Form".as_slice())
            {
                continue;
            }
            if self.stack.contains(&fid) {
                return Err(
                    "a form on this page draws itself (a cycle), so the page cannot be read".into(),
                );
            }
            self.visits += 1;
            if self.stack.len() >= MAX_FORM_DEPTH || self.visits > MAX_FORM_VISITS {
                return Err(
                    "the page nests or repeats drawn forms too much to be read safely".into(),
                );
            }
            let room = self.budget.max_page_content_bytes.saturating_sub(self.used);
            let inner = bounded_content(form, room, "a form drawn on the page")?;
            self.used += inner.len();
            let res = form
                .dict
                .get(b"Resources")
                .ok()
                .and_then(|r| deref_dict(self.doc, r))
                .unwrap_or(resources);
            if !std::ptr::eq(res, resources)
                && !self.resources.iter().any(|r| std::ptr::eq(*r, res))
            {
                self.resources.push(res);
            }
            self.stack.push(fid);
            self.check(&inner, res)?;
            self.stack.pop();
            if !self.rewritten.iter().any(|(id, _)| *id == fid) {
                self.rewritten
                    .push((fid, rewrite_quotes(&inner).unwrap_or(inner)));
            }
        }
        Ok(())
    }
}

/// The decoded bytes of a content stream, refusing anything that would
/// decode past `limit` bytes.
fn bounded_content(stream: &lopdf::Stream, limit: usize, what: &str) -> Result<Vec<u8>, String> {
    let too_big = || {
        format!(
            "{what} is larger than {} MiB once decompressed, so the page is skipped",
            limit >> 20
        )
    };
    let filters: Vec<Vec<u8>> = stream
        .filters()
        .map(|f| f.into_iter().map(<[u8]>::to_vec).collect())
        .unwrap_or_default();
    if filters.is_empty() {
        return if stream.content.len() > limit {
            Err(too_big())
        } else {
            Ok(stream.content.clone())
        };
    }
    if filters.iter().all(|f| f == b"FlateDecode" || f == b"Fl") && filters.len() == 1 {
        // Inflate at most limit+1 bytes: a zip bomb stops here. Predictors
        // only shrink the data, so the bound holds for the decoded result too.
        let mut probe = Vec::new();
        let mut dec = flate2::read::ZlibDecoder::new(stream.content.as_slice());
        let n = (&mut dec).take(limit as u64 + 1).read_to_end(&mut probe);
        if n.is_ok() && probe.len() > limit {
            return Err(too_big());
        }
        if stream.dict.get(b"DecodeParms").is_err() && n.is_ok() {
            return Ok(probe);
        }
    } else if stream.content.len().saturating_mul(256) > limit {
        // Other filters (LZW, RunLength, chains) are decoded by lopdf in one
        // go; only small streams are let through, with room for their ratio.
        return Err(format!(
            "{what} uses a {} compression too large to decode safely",
            filters
                .iter()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect::<Vec<_>>()
                .join("+")
        ));
    }
    stream
        .decompressed_content()
        .map_err(|e| format!("{what} cannot be decompressed: {e}"))
}

/// Most font dictionaries followed from one resource dictionary (descendant
/// fonts included): enough for any real page, and an end to reference loops.
const MAX_FONTS: usize = 2_000;

/// Checks the streams of the fonts a resource dictionary names (embedded
/// font programs, ToUnicode and encoding CMaps), which the extractor
/// decompresses whole: a bomb there would be an unbounded allocation.
/// Streams already checked (fonts are shared between pages) are skipped.
fn check_fonts(
    doc: &Document,
    resources: &Dictionary,
    budget: &Budget,
    checked: &mut HashSet<ObjectId>,
) -> Result<(), String> {
    let Some(fonts) = resources.get(b"Font").ok().and_then(|f| deref_dict(doc, f)) else {
        return Ok(());
    };
    let mut todo: Vec<&Dictionary> = fonts
        .iter()
        .filter_map(|(_, f)| deref_dict(doc, f))
        .collect();
    let mut followed = 0usize;
    let mut check = |o: Result<&Object, lopdf::Error>| -> Result<(), String> {
        let Ok(Object::Reference(sid)) = o else {
            return Ok(());
        };
        if !checked.insert(*sid) {
            return Ok(());
        }
        match doc.get_object(*sid).and_then(Object::as_stream) {
            Ok(stream) => {
                bounded_content(stream, budget.max_page_content_bytes, "a font of this page")
                    .map(|_| ())
            }
            Err(_) => Ok(()),
        }
    };
    while let Some(font) = todo.pop() {
        followed += 1;
        if followed > MAX_FONTS {
            return Err("the page's fonts refer to each other in a loop or are too many".into());
        }
        check(font.get(b"ToUnicode"))?;
        check(font.get(b"Encoding"))?;
        if let Some(desc) = font
            .get(b"FontDescriptor")
            .ok()
            .and_then(|d| deref_dict(doc, d))
        {
            for key in [b"FontFile".as_slice(), b"FontFile2", b"FontFile3"] {
                check(desc.get(key))?;
            }
        }
        let descendants = match font.get(b"DescendantFonts") {
            Ok(Object::Array(a)) => Some(a),
            Ok(Object::Reference(r)) => doc.get_object(*r).and_then(Object::as_array).ok(),
            _ => None,
        };
        for d in descendants.into_iter().flatten() {
            if let Some(d) = deref_dict(doc, d) {
                todo.push(d);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn deflated_spaces(n: usize) -> Vec<u8> {
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&vec![b' '; n]).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn object_stream_bombs_are_left_out_of_the_load() {
        OBJSTM_LIMIT.with(|c| c.set(1 << 20));
        OBJSTM_REFUSED.with(|c| c.set(0));
        let dict = |ty: &str| {
            let mut d = Dictionary::new();
            d.set("Type", Object::Name(ty.as_bytes().to_vec()));
            d.set("Filter", Object::Name(b"FlateDecode".to_vec()));
            d
        };
        let mut bomb = Object::Stream(lopdf::Stream::new(dict("ObjStm"), deflated_spaces(3 << 20)));
        assert!(objstm_guard((6, 0), &mut bomb).is_none());
        assert_eq!(OBJSTM_REFUSED.with(|c| c.get()), 1);
        // Small object streams and other big streams (images) load as usual.
        let mut small = Object::Stream(lopdf::Stream::new(dict("ObjStm"), deflated_spaces(1000)));
        assert!(objstm_guard((7, 0), &mut small).is_some());
        let mut image = Object::Stream(lopdf::Stream::new(
            dict("XObject"),
            deflated_spaces(3 << 20),
        ));
        let kept = objstm_guard((8, 0), &mut image).expect("kept");
        assert_eq!(kept.0, (8, 0));
        assert_eq!(OBJSTM_REFUSED.with(|c| c.get()), 1);
    }
}
