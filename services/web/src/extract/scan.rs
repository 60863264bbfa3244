//! A linear scan of raw HTML that never builds a tree: how deep the page
//! nests (estimated, stopping as soon as it passes a limit), its title, and
//! its text. Used to keep pathological pages away from the parser and the
//! recursive stages.

/// Elements that never have children.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];
/// Elements whose end tag may be left out (the parser closes them on its
/// own), and the document skeleton: neither adds nesting the parser keeps.
const NOT_NESTING: &[&str] = &[
    "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "thead", "tbody", "tfoot",
    "colgroup", "caption", "rb", "rt", "rp", "rtc", "html", "head", "body",
];
/// Elements whose content is raw text, not markup.
const RAW_TEXT: &[&str] = &[
    "script",
    "style",
    "textarea",
    "title",
    "xmp",
    "noembed",
    "noframes",
    "iframe",
    "plaintext",
];

enum Token<'a> {
    Open(String),
    Close(String),
    Text(&'a str),
    Raw(String, &'a str),
}

/// Tokens of `html`: tags by name (lower case), text runs, raw-text element contents.
struct Tokens<'a> {
    html: &'a str,
    pos: usize,
    pending: Option<Token<'a>>,
}

impl<'a> Tokens<'a> {
    fn new(html: &'a str) -> Self {
        Self {
            html,
            pos: 0,
            pending: None,
        }
    }
}

fn tag_name(s: &str) -> (String, usize) {
    let end = s
        .find(|c: char| c.is_ascii_whitespace() || c == '/' || c == '>')
        .unwrap_or(s.len());
    (s[..end].to_ascii_lowercase(), end)
}

/// The end of a start tag starting at `from` (the index just past `>`), with quoted attribute values skipped.
fn tag_end(bytes: &[u8], from: usize) -> usize {
    let mut i = from;
    let mut quote = 0u8;
    while i < bytes.len() {
        let b = bytes[i];
        if quote != 0 {
            if b == quote {
                quote = 0;
            }
        } else if b == b'"' || b == b'\'' {
            quote = b;
        } else if b == b'>' {
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

fn find_ci(hay: &str, from: usize, needle: &str) -> Option<usize> {
    let n = needle.as_bytes();
    hay.as_bytes()[from..]
        .windows(n.len())
        .position(|w| w.eq_ignore_ascii_case(n))
        .map(|p| from + p)
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        if let Some(t) = self.pending.take() {
            return Some(t);
        }
        let html = self.html;
        let bytes = html.as_bytes();
        while self.pos < bytes.len() {
            let start = self.pos;
            let Some(lt) = html[start..].find('<').map(|i| start + i) else {
                self.pos = bytes.len();
                return Some(Token::Text(&html[start..]));
            };
            let rest = &html[lt + 1..];
            let next_byte = rest.as_bytes().first().copied().unwrap_or(0);
            let text_before = (lt > start).then(|| Token::Text(&html[start..lt]));
            let tag = if rest.starts_with("!--") {
                self.pos = html[lt + 4..]
                    .find("-->")
                    .map(|i| lt + 4 + i + 3)
                    .unwrap_or(bytes.len());
                None
            } else if next_byte == b'!' || next_byte == b'?' {
                self.pos = html[lt..]
                    .find('>')
                    .map(|i| lt + i + 1)
                    .unwrap_or(bytes.len());
                None
            } else if next_byte == b'/'
                && rest.as_bytes().get(1).is_some_and(u8::is_ascii_alphabetic)
            {
                let (name, _) = tag_name(&rest[1..]);
                self.pos = html[lt..]
                    .find('>')
                    .map(|i| lt + i + 1)
                    .unwrap_or(bytes.len());
                Some(Token::Close(name))
            } else if next_byte.is_ascii_alphabetic() {
                let (name, _) = tag_name(rest);
                let end = tag_end(bytes, lt + 1);
                self.pos = end;
                let self_closing = end >= 2 && bytes[end - 2] == b'/';
                if RAW_TEXT.contains(&name.as_str()) && !self_closing {
                    let close = find_ci(html, end, &format!("</{name}")).unwrap_or(bytes.len());
                    self.pos = html[close..]
                        .find('>')
                        .map(|i| close + i + 1)
                        .unwrap_or(bytes.len());
                    Some(Token::Raw(name, &html[end..close]))
                } else if self_closing {
                    None
                } else {
                    Some(Token::Open(name))
                }
            } else {
                // A lone `<` is text.
                self.pos = lt + 1;
                return Some(Token::Text(&html[start..lt + 1]));
            };
            match (text_before, tag) {
                (Some(t), Some(tag)) => {
                    self.pending = Some(tag);
                    return Some(t);
                }
                (Some(t), None) => return Some(t),
                (None, Some(tag)) => return Some(tag),
                (None, None) => continue,
            }
        }
        None
    }
}

/// Whether `html` nests more than `limit` elements deep. The scan keeps a
/// stack of open elements (an end tag closes up to its match, as the parser
/// does; a stray one is ignored) and stops as soon as the stack passes `limit`.
pub fn depth_exceeds(html: &str, limit: usize) -> bool {
    let mut open: Vec<String> = Vec::new();
    for t in Tokens::new(html) {
        match t {
            Token::Open(name) => {
                if VOID.contains(&name.as_str()) || NOT_NESTING.contains(&name.as_str()) {
                    continue;
                }
                open.push(name);
                if open.len() > limit {
                    return true;
                }
            }
            Token::Close(name) => {
                if let Some(at) = open.iter().rposition(|n| *n == name) {
                    open.truncate(at);
                }
            }
            Token::Text(_) | Token::Raw(..) => {}
        }
    }
    false
}

/// The text of the first `<title>`.
pub fn title(html: &str) -> String {
    Tokens::new(html)
        .find_map(|t| match t {
            Token::Raw(name, text) if name == "title" => Some(collapse(&decode_entities(text))),
            _ => None,
        })
        .unwrap_or_default()
}

/// The page's text outside scripts, styles and the title, whitespace collapsed.
pub fn text(html: &str) -> String {
    let mut out = String::new();
    for t in Tokens::new(html) {
        if let Token::Text(s) = t {
            let piece = collapse(&decode_entities(s));
            if !piece.is_empty() {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&piece);
            }
        }
    }
    out
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decodes the common named entities and every numeric one.
fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let semi = after.find(';').filter(|&i| i <= 10);
        let decoded = semi.and_then(|i| {
            let name = &after[..i];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some('\u{a0}'),
                _ => name
                    .strip_prefix("#x")
                    .or_else(|| name.strip_prefix("#X"))
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .or_else(|| name.strip_prefix('#').and_then(|d| d.parse().ok()))
                    .and_then(char::from_u32),
            }?;
            Some((c, i + 1))
        });
        match decoded {
            Some((c, used)) => {
                out.push(c);
                rest = &after[used..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_estimated_like_the_parser() {
        let deep = format!(
            "<html><body>{}x{}</body></html>",
            "<div>".repeat(50),
            "</div>".repeat(50)
        );
        assert!(depth_exceeds(&deep, 49) && !depth_exceeds(&deep, 50));
        // Implied end tags and void elements do not nest.
        let flat = format!("<ul>{}</ul>", "<li><p>item<br><img src=x>".repeat(5_000));
        assert!(!depth_exceeds(&flat, 3));
        // Stray end tags do not hide real nesting.
        let sneaky = format!("{}x", "<div></span></b>".repeat(100));
        assert!(depth_exceeds(&sneaky, 99));
        // Markup inside scripts, comments and attributes is not markup.
        let hidden = format!(
            "<script>{}</script><!-- {} --><a title=\"<div><div>\">x</a>",
            "<div>".repeat(100),
            "<div>".repeat(100)
        );
        assert!(!depth_exceeds(&hidden, 2));
    }

    #[test]
    fn title_and_text() {
        let html = "<html><head><title> A &amp; B </title><style>p{}</style></head><body><p>one&nbsp;two &#x263A; &#65;</p><script>var x = '<p>';</script><p>three &bogus; 5 < 6</p></body></html>";
        assert_eq!(title(html), "A & B");
        // U+00A0 is whitespace too, so it collapses to a space.
        assert_eq!(text(html), "one two ☺ A three &bogus; 5 < 6");
    }
}
