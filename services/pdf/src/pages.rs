//! Page selections as the model writes them: `"1-3,7"`, `"5-"`, `"all"`.
//!
//! A selection is kept as ranges until the page count is known, so that
//! `"1-4000000000"` costs nothing: it is clamped, never expanded blindly.

use std::fmt;

/// One inclusive range of 1-based pages; `end` None means "to the last page".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u32,
    end: Option<u32>,
}

/// A parsed page selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSelection {
    ranges: Vec<Range>,
}

/// A selection that cannot be parsed; the message says what form is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSpecError(String);

impl fmt::Display for PageSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (expected page numbers and ranges like \"1-3,7\", \"5-\" or \"all\")",
            self.0
        )
    }
}

impl std::error::Error for PageSpecError {}

/// Longest selection text accepted: a model that writes more is confused.
const MAX_SPEC_LEN: usize = 1000;

impl PageSelection {
    /// Every page.
    pub fn all() -> Self {
        Self {
            ranges: vec![Range {
                start: 1,
                end: None,
            }],
        }
    }

    /// Parses `"1-3,7"`, `"5-"`, `"all"`, `"3"` (spaces allowed around parts).
    pub fn parse(spec: &str) -> Result<Self, PageSpecError> {
        let spec = spec.trim();
        if spec.len() > MAX_SPEC_LEN {
            return Err(PageSpecError(format!(
                "the page selection is {} characters long",
                spec.len()
            )));
        }
        if spec.is_empty() || spec.eq_ignore_ascii_case("all") {
            return Ok(Self::all());
        }
        let mut ranges = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(PageSpecError(format!(
                    "empty part in page selection \"{spec}\""
                )));
            }
            let num = |s: &str| -> Result<u32, PageSpecError> {
                let s = s.trim();
                let n: u32 = s.parse().map_err(|_| {
                    PageSpecError(format!("\"{s}\" is not a page number in \"{spec}\""))
                })?;
                if n == 0 {
                    return Err(PageSpecError(format!(
                        "pages are numbered from 1, got 0 in \"{spec}\""
                    )));
                }
                Ok(n)
            };
            let range = match part.split_once('-') {
                None => {
                    let n = num(part)?;
                    Range {
                        start: n,
                        end: Some(n),
                    }
                }
                Some((a, b)) => {
                    let start = if a.trim().is_empty() { 1 } else { num(a)? };
                    let end = if b.trim().is_empty() {
                        None
                    } else {
                        Some(num(b)?)
                    };
                    if let Some(e) = end
                        && e < start
                    {
                        return Err(PageSpecError(format!(
                            "range \"{part}\" ends before it starts"
                        )));
                    }
                    Range { start, end }
                }
            };
            ranges.push(range);
        }
        Ok(Self { ranges })
    }

    /// The selected pages that exist in a document of `count` pages, in
    /// ascending order without repeats, and the numbers asked for beyond the end.
    pub fn resolve(&self, count: u32) -> (Vec<u32>, Vec<u32>) {
        let mut pages = Vec::new();
        let mut missing = Vec::new();
        for r in &self.ranges {
            let end = r.end.unwrap_or(count);
            if r.start > count {
                missing.push(r.start);
                continue;
            }
            if end > count {
                missing.push(end);
            }
            pages.extend(r.start..=end.min(count));
        }
        pages.sort_unstable();
        pages.dedup();
        (pages, missing)
    }
}

/// Writes sorted page numbers compactly: `[1,2,3,7]` → `"1-3, 7"`.
pub fn describe(pages: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < pages.len() {
        let start = pages[i];
        let mut end = start;
        while i + 1 < pages.len() && pages[i + 1] == end + 1 {
            i += 1;
            end = pages[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_resolves() {
        let s = PageSelection::parse("1-3, 7,2").unwrap();
        assert_eq!(s.resolve(10), (vec![1, 2, 3, 7], vec![]));
        assert_eq!(
            PageSelection::parse("8-").unwrap().resolve(10).0,
            vec![8, 9, 10]
        );
        assert_eq!(
            PageSelection::parse("-2").unwrap().resolve(10).0,
            vec![1, 2]
        );
        assert_eq!(
            PageSelection::parse("all").unwrap().resolve(3).0,
            vec![1, 2, 3]
        );
        assert_eq!(PageSelection::parse("").unwrap().resolve(2).0, vec![1, 2]);
    }

    #[test]
    fn huge_ranges_are_clamped_not_expanded() {
        let s = PageSelection::parse("1-4000000000").unwrap();
        let (pages, missing) = s.resolve(5);
        assert_eq!(pages, vec![1, 2, 3, 4, 5]);
        assert_eq!(missing, vec![4000000000]);
        assert_eq!(
            PageSelection::parse("9").unwrap().resolve(5),
            (vec![], vec![9])
        );
    }

    #[test]
    fn bad_specs_say_what_is_expected() {
        for bad in ["0", "a-b", "3-1", "1,,2", "1-2-3", "x"] {
            let e = PageSelection::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected page numbers"), "{bad}: {e}");
        }
        assert!(PageSelection::parse(&"1,".repeat(600)).is_err());
    }

    #[test]
    fn describes_compactly() {
        assert_eq!(describe(&[1, 2, 3, 7, 9, 10]), "1-3, 7, 9-10");
        assert_eq!(describe(&[]), "");
    }
}
