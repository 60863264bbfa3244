//! What a cell produced: streams (capped), display data, the last
//! expression's value, the error; in result form and in nbformat form. And the
//! splitter that turns tqdm bars in a stream into progress events.

use jupyter_protocol::Media;
use omicos_toolkit::ToolProgress;
use regex::Regex;
use serde_json::{Map, Value, json};
use std::sync::LazyLock;

static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
        .expect("static regex")
});

/// Removes ANSI escape sequences (colours, cursor moves).
pub fn strip_ansi(s: &str) -> String {
    ANSI.replace_all(s, "").into_owned()
}

/// Applies carriage returns the way a terminal shows them: per line, only
/// what follows the last `\r` stays (a progress bar's final state).
pub fn collapse_cr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, line) in s.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let trimmed = line.trim_end_matches('\r');
        out.push_str(trimmed.rsplit('\r').next().unwrap_or(""));
    }
    out
}

/// Text kept up to a cap: the head and the tail, with a marker of what was left out.
#[derive(Debug, Default, Clone)]
pub struct CappedText {
    head: String,
    tail: String,
    dropped: usize,
    cap: usize,
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl CappedText {
    /// Empty text kept up to `cap` bytes (0: unbounded).
    pub fn with_cap(cap: usize) -> Self {
        Self {
            cap,
            ..Default::default()
        }
    }

    /// Appends text, dropping from the middle past the cap.
    pub fn push(&mut self, s: &str) {
        let half = (self.cap / 2).max(1);
        if self.cap == 0
            || (self.tail.is_empty() && self.dropped == 0 && self.head.len() + s.len() <= self.cap)
        {
            self.head.push_str(s);
            return;
        }
        if self.head.len() < half {
            let take = floor_boundary(s, (half - self.head.len()).min(s.len()));
            self.head.push_str(&s[..take]);
            self.tail.push_str(&s[take..]);
        } else {
            self.tail.push_str(s);
        }
        if self.tail.len() > half {
            let cut = self.tail.len() - half;
            let cut = (cut..=self.tail.len())
                .find(|i| self.tail.is_char_boundary(*i))
                .unwrap_or(self.tail.len());
            self.dropped += cut;
            self.tail.drain(..cut);
        }
    }

    /// The kept text, with a marker where bytes were left out.
    pub fn text(&self) -> String {
        if self.dropped == 0 {
            format!("{}{}", self.head, self.tail)
        } else {
            format!(
                "{}\n[... {} bytes of output left out ...]\n{}",
                self.head, self.dropped, self.tail
            )
        }
    }
}

/// A Python exception raised by a cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CellError {
    /// Exception class name.
    pub ename: String,
    /// Exception message.
    pub evalue: String,
    /// Traceback lines, without ANSI codes.
    pub traceback: Vec<String>,
}

/// Everything one cell produced.
#[derive(Debug, Default)]
pub struct CellOutput {
    /// nbformat 4 outputs, in order.
    pub outputs: Vec<Value>,
    /// All of stdout (capped).
    pub stdout: CappedText,
    /// All of stderr (capped).
    pub stderr: CappedText,
    /// Display data (full mime bundles).
    pub displays: Vec<Value>,
    /// The last expression's value (mime bundle).
    pub result: Option<Value>,
    /// The exception, if any.
    pub error: Option<CellError>,
    /// The kernel's execution count.
    pub execution_count: Option<i64>,
    cap: usize,
    nb_stream_bytes: usize,
}

fn media_value(m: &Media) -> Value {
    serde_json::to_value(m).unwrap_or_else(|_| json!({}))
}

impl CellOutput {
    /// Sets the cap on kept stream bytes (each stream).
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
        self.stdout.cap = cap;
        self.stderr.cap = cap;
    }

    /// Adds stream text.
    pub fn stream(&mut self, name: &str, text: &str) {
        if name == "stderr" {
            &mut self.stderr
        } else {
            &mut self.stdout
        }
        .push(text);
        // The notebook copy stops growing at the cap; the result copy keeps the tail.
        if self.cap != 0 && self.nb_stream_bytes >= self.cap {
            return;
        }
        self.nb_stream_bytes += text.len();
        if let Some(last) = self.outputs.last_mut()
            && last["output_type"] == "stream"
            && last["name"] == name
        {
            let joined = format!("{}{}", last["text"].as_str().unwrap_or(""), text);
            last["text"] = Value::String(joined);
            return;
        }
        self.outputs
            .push(json!({"output_type": "stream", "name": name, "text": text}));
    }

    /// Adds display data.
    pub fn display(&mut self, data: &Media, metadata: &Map<String, Value>) {
        let data = media_value(data);
        self.outputs
            .push(json!({"output_type": "display_data", "data": data, "metadata": metadata}));
        self.displays.push(data);
    }

    /// Records the last expression's value.
    pub fn execute_result(&mut self, data: &Media, metadata: &Map<String, Value>) {
        let data = media_value(data);
        self.outputs.push(json!({"output_type": "execute_result", "data": data, "metadata": metadata, "execution_count": Value::Null}));
        self.result = Some(data);
    }

    /// Records the exception (once; the reply repeats what iopub said).
    pub fn set_error(&mut self, ename: &str, evalue: &str, traceback: &[String]) {
        if self.error.is_some() {
            return;
        }
        let traceback: Vec<String> = traceback.iter().map(|l| strip_ansi(l)).collect();
        self.outputs.push(json!({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback}));
        self.error = Some(CellError {
            ename: ename.into(),
            evalue: strip_ansi(evalue),
            traceback,
        });
    }

    /// `clear_output`: what was shown so far goes.
    pub fn clear(&mut self) {
        self.outputs.clear();
        self.displays.clear();
        self.nb_stream_bytes = 0;
    }

    /// The outputs in nbformat 4 form, with the execution count filled in.
    pub fn notebook_outputs(&self) -> Vec<Value> {
        self.outputs
            .iter()
            .cloned()
            .map(|mut o| {
                if o["output_type"] == "execute_result" {
                    o["execution_count"] =
                        self.execution_count.map(Value::from).unwrap_or(Value::Null);
                }
                if o["output_type"] == "stream" {
                    o["text"] =
                        Value::String(strip_ansi(&collapse_cr(o["text"].as_str().unwrap_or(""))));
                }
                o
            })
            .collect()
    }
}

/// The mime types a tool result keeps.
pub const KEPT_MIME: &[&str] = &["text/plain", "text/html", "text/markdown", "image/png"];

/// A mime bundle reduced to [`KEPT_MIME`].
pub fn kept_mime(bundle: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(m) = bundle.as_object() {
        for k in KEPT_MIME {
            if let Some(v) = m.get(*k) {
                let v = match v {
                    Value::String(s) if *k == "image/png" => Value::String(s.trim().to_owned()),
                    other => other.clone(),
                };
                out.insert((*k).to_owned(), v);
            }
        }
    }
    out
}

static BAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:(?P<label>.*?):\s*)?(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>[\d.]+[kMGTPEZY]?)/(?P<total>[\d.]+[kMGTPEZY]?)\s*\[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+)(?:,\s*(?P<rate>[^\]]*))?\]\s*$")
        .expect("static regex")
});
static BAR_NO_TOTAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:(?P<label>.*?):\s*)?(?P<n>[\d.]+[kMGTPEZY]?)(?P<unit>[A-Za-z]*)\s*\[(?P<elapsed>[\d:]+)(?:,\s*(?P<rate>[^\]]*))?\]\s*$")
        .expect("static regex")
});

fn scaled(s: &str) -> f64 {
    let (num, mul) = match s.chars().last() {
        Some(c @ ('k' | 'M' | 'G' | 'T' | 'P' | 'E' | 'Z' | 'Y')) => {
            let p = "kMGTPEZY".find(c).unwrap_or(0) as i32 + 1;
            (&s[..s.len() - 1], 1000f64.powi(p))
        }
        _ => (s, 1.0),
    };
    num.parse::<f64>().unwrap_or(0.0) * mul
}

fn clock(s: &str) -> f64 {
    if s.contains('?') {
        return 0.0;
    }
    s.split(':')
        .fold(0.0, |acc, p| acc * 60.0 + p.parse::<f64>().unwrap_or(0.0))
}

fn unit_of(rate: &str) -> String {
    // "9.98it/s" → "it"; "2.5MB/s" → "B"; "1.20s/it" → "it"; "?it/s" → "it".
    let body = rate
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '?' || c == ' ');
    if let Some(u) = body.strip_suffix("/s") {
        let mut chars = u.chars();
        match chars.next() {
            Some('k' | 'M' | 'G' | 'T') if u.len() > 1 => chars.as_str().to_owned(),
            _ => u.to_owned(),
        }
    } else if let Some(u) = body.strip_prefix("s/") {
        u.to_owned()
    } else {
        String::new()
    }
}

/// Parses one rendered tqdm bar.
pub fn parse_bar(line: &str) -> Option<ToolProgress> {
    let line = strip_ansi(line);
    if let Some(c) = BAR.captures(&line) {
        let current = scaled(&c["n"]);
        let total = scaled(&c["total"]);
        let percent = if total > 0.0 {
            (current / total * 100.0).min(100.0)
        } else {
            c["pct"].parse().unwrap_or(0.0)
        };
        return Some(ToolProgress {
            label: c
                .name("label")
                .map(|m| m.as_str().trim().to_owned())
                .unwrap_or_default(),
            current,
            total,
            percent,
            elapsed_s: clock(&c["elapsed"]),
            eta_s: clock(&c["eta"]),
            unit: c
                .name("rate")
                .map(|m| unit_of(m.as_str()))
                .unwrap_or_default(),
            done: total > 0.0 && current >= total,
            ..Default::default()
        });
    }
    let c = BAR_NO_TOTAL.captures(&line)?;
    let unit = c
        .name("rate")
        .map(|m| unit_of(m.as_str()))
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| c["unit"].to_owned());
    Some(ToolProgress {
        label: c
            .name("label")
            .map(|m| m.as_str().trim().to_owned())
            .unwrap_or_default(),
        current: scaled(&c["n"]),
        elapsed_s: clock(&c["elapsed"]),
        unit,
        ..Default::default()
    })
}

#[derive(Debug)]
struct Bar {
    id: String,
    label: String,
    last: ToolProgress,
}

/// Splits stream text into plain output and tqdm progress events.
#[derive(Debug, Default)]
pub struct StreamSplitter {
    open: Vec<Bar>,
    // Bars that reached their total: tqdm redraws the final state on close.
    finished: Vec<Bar>,
    next_id: usize,
    last_was_bar: bool,
}

impl StreamSplitter {
    /// Feeds a chunk of `stream`; returns the text that is not a bar, and the bar updates.
    pub fn feed(&mut self, _stream: &str, text: &str) -> (String, Vec<ToolProgress>) {
        let mut plain = String::new();
        let mut events = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let end = rest.find(['\r', '\n']);
            let (seg, term, next) = match end {
                Some(i) => (&rest[..i], &rest[i..i + 1], &rest[i + 1..]),
                None => (rest, "", ""),
            };
            rest = next;
            if let Some(p) = parse_bar(seg) {
                let done = term == "\n";
                events.extend(self.update(p, done));
                self.last_was_bar = !done;
                continue;
            }
            if seg.is_empty() {
                if term == "\n" && self.last_was_bar {
                    // tqdm's close: the newline after the final bar.
                    if let Some(b) = self.open.pop() {
                        let mut p = b.last;
                        p.done = true;
                        events.push(p);
                    }
                    self.last_was_bar = false;
                    continue;
                }
                if term == "\r" {
                    continue;
                }
            }
            self.last_was_bar = false;
            plain.push_str(seg);
            plain.push_str(term);
        }
        (plain, events)
    }

    fn update(&mut self, mut p: ToolProgress, close: bool) -> Option<ToolProgress> {
        if self
            .finished
            .iter()
            .any(|b| b.label == p.label && b.last.current == p.current && b.last.total == p.total)
        {
            return None;
        }
        let pos = self
            .open
            .iter()
            .position(|b| b.label == p.label && p.current >= b.last.current);
        let idx = match pos {
            Some(i) => i,
            None => {
                self.next_id += 1;
                self.open.push(Bar {
                    id: format!("tqdm-{}", self.next_id),
                    label: p.label.clone(),
                    last: p.clone(),
                });
                self.open.len() - 1
            }
        };
        p.bar_id = self.open[idx].id.clone();
        p.done = p.done || close;
        self.open[idx].last = p.clone();
        if p.done {
            let bar = self.open.remove(idx);
            self.finished.push(bar);
            if self.finished.len() > 16 {
                self.finished.remove(0);
            }
        }
        Some(p)
    }

    /// Bars still open when the cell ended: reported done.
    pub fn finish(&mut self) -> Vec<ToolProgress> {
        self.open
            .drain(..)
            .map(|b| {
                let mut p = b.last;
                p.done = true;
                p
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tqdm_bars_become_progress() {
        let mut s = StreamSplitter::default();
        let (plain, ev) = s.feed("stderr", "hello\n\rwork:   0%|          | 0/4 [00:00<?, ?it/s]\rwork:  50%|#####     | 2/4 [00:01<00:01,  1.99it/s]");
        assert_eq!(plain, "hello\n");
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].bar_id, ev[1].bar_id);
        assert_eq!(ev[1].label, "work");
        assert_eq!(
            (ev[1].current, ev[1].total, ev[1].percent),
            (2.0, 4.0, 50.0)
        );
        assert_eq!((ev[1].elapsed_s, ev[1].eta_s), (1.0, 1.0));
        assert_eq!(ev[1].unit, "it");
        assert!(!ev[1].done);
        let (plain, ev) = s.feed(
            "stderr",
            "\rwork: 100%|##########| 4/4 [00:02<00:00,  2.00it/s]",
        );
        assert!(plain.is_empty());
        assert!(ev[0].done);
        let (plain, ev) = s.feed("stderr", "\nafter\n");
        assert_eq!(plain, "after\n");
        assert!(ev.is_empty());
        let (_, ev) = s.feed("stderr", "\r3.00MB [00:01, 2.5MB/s]");
        assert_eq!(ev[0].current, 3.0e6);
        assert_eq!(ev[0].unit, "B");
        assert_ne!(ev[0].bar_id, "tqdm-1");
        assert_eq!(s.finish().len(), 1);
    }

    #[test]
    fn text_helpers() {
        assert_eq!(collapse_cr("a\rb\nc\r\n"), "b\nc\n");
        assert_eq!(
            strip_ansi("\x1b[0;31mValueError\x1b[0m: x"),
            "ValueError: x"
        );
        let mut t = CappedText {
            cap: 10,
            ..Default::default()
        };
        t.push("0123456789abcdef");
        let s = t.text();
        assert!(
            s.starts_with("01234") && s.ends_with("bcdef") && s.contains("6 bytes"),
            "{s}"
        );
    }
}
