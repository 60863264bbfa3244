//! Markdown files with a YAML frontmatter: the one place that parses YAML, so
//! that serde_yaml (archived upstream) can be swapped for a fork in one spot.

use serde::de::DeserializeOwned;

/// A frontmatter that cannot be used. `line` is 1-based in the whole file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct FrontmatterError {
    /// The line of the file the problem is on (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// A parsed document: the typed frontmatter, the keys it had that `T` does
/// not know, and the Markdown body after it.
#[derive(Debug, Clone)]
pub struct Document<T> {
    /// The frontmatter.
    pub meta: T,
    /// Top-level keys that are not in `known`, each with its 1-based line.
    pub unknown_keys: Vec<(String, usize)>,
    /// Everything after the closing `---` line, with the leading blank lines removed.
    pub body: String,
}

/// Splits `text` into (yaml, body, line number of the first yaml line).
fn split(text: &str) -> Result<(&str, &str, usize), FrontmatterError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(FrontmatterError {
            line: 1,
            message: "no YAML frontmatter: the file must start with a `---` line".into(),
        });
    }
    let yaml_start = first.len();
    let mut offset = yaml_start;
    for line in lines {
        if line.trim_end() == "---" {
            let yaml = &text[yaml_start..offset];
            let body = &text[offset + line.len()..];
            return Ok((yaml, body, 2));
        }
        offset += line.len();
    }
    Err(FrontmatterError {
        line: 1,
        message: "the frontmatter opened on line 1 is never closed by a `---` line".into(),
    })
}

/// Parses a frontmatter document into `T`. `known` lists the keys `T` reads;
/// other top-level keys are returned so the caller can warn about typos.
pub fn parse<T: DeserializeOwned>(
    text: &str,
    known: &[&str],
) -> Result<Document<T>, FrontmatterError> {
    let (yaml, body, first_line) = split(text)?;
    // serde_yaml's own location is relative to the YAML block: report the
    // file's line instead, and keep the column.
    let err = |e: serde_yaml::Error| {
        let text = e.to_string();
        let message = match (text.find(" at line "), e.location()) {
            (Some(cut), Some(loc)) => format!("{} (column {})", &text[..cut], loc.column()),
            _ => text,
        };
        FrontmatterError {
            line: e
                .location()
                .map(|l| l.line() + first_line - 1)
                .unwrap_or(first_line),
            message,
        }
    };
    // Parse to a generic value first: syntax errors carry a location here.
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).map_err(&err)?;
    let value = if value.is_null() {
        serde_yaml::Value::Mapping(Default::default())
    } else {
        value
    };
    let serde_yaml::Value::Mapping(map) = &value else {
        return Err(FrontmatterError {
            line: first_line,
            message: "the frontmatter is not a mapping of keys to values".into(),
        });
    };
    let mut unknown_keys = Vec::new();
    for key in map.keys() {
        let name = match key {
            serde_yaml::Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        if !known.contains(&name.as_str()) {
            unknown_keys.push((
                name.clone(),
                key_line(yaml, &name)
                    .map(|l| l + first_line - 1)
                    .unwrap_or(first_line),
            ));
        }
    }
    // Typed errors ("invalid type" and the like) carry a location only when
    // parsing from text, so parse the text again into T.
    let meta: T = serde_yaml::from_str(yaml).map_err(&err)?;
    Ok(Document {
        meta,
        unknown_keys,
        body: body.trim_start_matches(['\n', '\r']).to_string(),
    })
}

/// The 1-based line (within the yaml) of a top-level key, for messages.
fn key_line(yaml: &str, key: &str) -> Option<usize> {
    yaml.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The line a top-level key is on in the whole file (1-based), for messages
/// about a value that parsed but is not acceptable.
pub fn line_of_key(text: &str, key: &str) -> usize {
    match split(text) {
        Ok((yaml, _, first)) => key_line(yaml, key).map(|l| l + first - 1).unwrap_or(1),
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct M {
        id: Option<String>,
        #[serde(default)]
        n: u32,
    }

    #[test]
    fn splits_and_parses() {
        let d: Document<M> =
            parse("---\nid: a\nn: 3\nextra: 1\n---\n\nHello\n", &["id", "n"]).unwrap();
        assert_eq!(d.meta.id.as_deref(), Some("a"));
        assert_eq!(d.meta.n, 3);
        assert_eq!(d.body, "Hello\n");
        assert_eq!(d.unknown_keys, vec![("extra".to_string(), 4)]);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse::<M>("---\nid: a\nn: [1,\n---\nbody", &["id", "n"]).unwrap_err();
        assert!(e.line >= 3, "{e}");
        let e = parse::<M>("---\nid: a\nn: not-a-number\n---\n", &["id", "n"]).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(!e.message.contains("at line"), "{e}");
        let e = parse::<M>("no frontmatter", &[]).unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse::<M>("---\nid: a\n", &[]).unwrap_err();
        assert!(e.message.contains("never closed"));
        let e = parse::<M>("---\n- a\n---\n", &[]).unwrap_err();
        assert!(e.message.contains("mapping"));
        assert_eq!(line_of_key("---\nid: a\ntier: x\n---\n", "tier"), 3);
    }
}
