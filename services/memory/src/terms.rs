//! Turning a user's search text into a full-text query that is never parsed
//! as query syntax.
//!
//! The text is cut into words (runs of Unicode letters and digits, the same
//! rule as FTS5's `unicode61` tokenizer and close to PostgreSQL's `simple`
//! parser); every word is then quoted for the backend and the words are OR-ed,
//! so ranking decides. `"`, `AND`, `OR`, `NEAR`, `*`, `:` and `-` are never
//! operators: punctuation is dropped and keywords become quoted words.

/// At most this many distinct words are searched: a 10 KB paste must not
/// become a 2,000-way OR (each word is a posting-list scan).
pub const MAX_TERMS: usize = 32;
/// Longer words are cut: no real word is longer, and the index never holds one.
pub const MAX_TERM_CHARS: usize = 64;

/// The distinct searchable words of `text`, lower-cased, in order of first
/// appearance, bounded by [`MAX_TERMS`] and [`MAX_TERM_CHARS`].
pub fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in text.split(|c: char| !c.is_alphanumeric()) {
        if raw.is_empty() {
            continue;
        }
        let w: String = raw
            .chars()
            .take(MAX_TERM_CHARS)
            .collect::<String>()
            .to_lowercase();
        if !out.contains(&w) {
            out.push(w);
            if out.len() == MAX_TERMS {
                break;
            }
        }
    }
    out
}

/// Words so common in English notes that searching for them costs a scan of
/// most entries and adds almost nothing to the ranking.
pub const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he",
    "her", "his", "i", "in", "is", "it", "its", "of", "on", "or", "our", "she", "so", "that",
    "the", "their", "them", "they", "this", "to", "was", "we", "were", "what", "when", "which",
    "who", "will", "with", "you", "your",
];

/// The words to search for: [`words`] without [`STOPWORDS`], unless the text
/// has nothing else (then "AND OR" or "the who" still find what they say).
pub fn search_words(text: &str) -> Vec<String> {
    let all = words(text);
    let content: Vec<String> = all
        .iter()
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .cloned()
        .collect();
    if content.is_empty() { all } else { content }
}

/// An FTS5 MATCH expression: each word as a quoted string (`"` doubled), OR-ed.
pub fn fts5_match(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// A PostgreSQL `to_tsquery` text: each word as a quoted lexeme (`'` doubled,
/// `\` escaped), OR-ed with `|`.
pub fn tsquery(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{}'", w.replace('\\', "\\\\").replace('\'', "''")))
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn punctuation_and_keywords_are_not_syntax() {
        assert!(words("\"").is_empty());
        assert_eq!(words("AND OR"), vec!["and", "or"]);
        assert_eq!(fts5_match(&words("AND OR")), "\"and\" OR \"or\"");
        assert_eq!(
            words("foo* -bar NEAR(baz) col:qux"),
            vec!["foo", "bar", "near", "baz", "col", "qux"]
        );
        assert_eq!(tsquery(&words("it's")), "'it' | 's'");
    }

    #[test]
    fn stopwords_drop_only_when_other_words_remain() {
        assert_eq!(
            search_words("what is the deploy plan"),
            vec!["deploy", "plan"]
        );
        assert_eq!(search_words("AND OR"), vec!["and", "or"]);
        assert!(search_words("\"").is_empty());
    }

    #[test]
    fn unicode_words_survive() {
        assert_eq!(
            words("Café naïve 東京 – привет!"),
            vec!["café", "naïve", "東京", "привет"]
        );
    }

    #[test]
    fn bounded() {
        let long = "x".repeat(10_000);
        assert_eq!(words(&long)[0].chars().count(), MAX_TERM_CHARS);
        let many: String = (0..5000).map(|i| format!("w{i} ")).collect();
        assert_eq!(words(&many).len(), MAX_TERMS);
        // Quotes inside a word cannot happen, but quoting still escapes them.
        assert_eq!(fts5_match(&["a\"b".to_string()]), "\"a\"\"b\"");
        assert_eq!(tsquery(&["a'b\\".to_string()]), "'a''b\\\\'");
    }
}
