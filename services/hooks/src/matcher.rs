//! Matchers: which handler groups an event's target (a tool's name, a
//! session's source, an agent) selects.

use crate::config::{HookHandler, HookMatcher};
use regex::Regex;

/// Compiles a matcher as Claude Code reads it: an anchored regex; empty or
/// `*`: None, every target matches.
pub fn compile_matcher(m: &str) -> Result<Option<Regex>, regex::Error> {
    let m = m.trim();
    if m.is_empty() || m == "*" {
        return Ok(None);
    }
    Regex::new(&format!("^(?:{m})$")).map(Some)
}

/// Whether `matcher` matches `target`, compiled on the spot; a matcher that
/// is not a regex matches by equality only.
pub fn matches(matcher: &str, target: &str) -> bool {
    if matcher.trim() == target {
        return true;
    }
    match compile_matcher(matcher) {
        Ok(None) => true,
        Ok(Some(r)) => r.is_match(target),
        Err(_) => false,
    }
}

/// The groups of one event with their matchers compiled once.
#[derive(Clone, Debug, Default)]
pub struct Matchers {
    groups: Vec<(Option<Regex>, Vec<HookHandler>)>,
}

impl Matchers {
    /// Compiles every group's matcher; the error names the group's index.
    pub fn compile(groups: &[HookMatcher]) -> Result<Self, (usize, regex::Error)> {
        let groups = groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                Ok((
                    compile_matcher(&g.matcher).map_err(|e| (i, e))?,
                    g.hooks.clone(),
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { groups })
    }

    /// Whether no group is configured.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The handlers whose group matches `target`, in config order.
    pub fn matching(&self, target: &str) -> Vec<&HookHandler> {
        self.groups
            .iter()
            .filter(|(re, _)| re.as_ref().is_none_or(|r| r.is_match(target)))
            .flat_map(|(_, hooks)| hooks.iter())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_match_all_or_anchored_alternatives() {
        assert!(matches("", "startup"));
        assert!(matches("*", "resume"));
        assert!(matches("startup|resume", "resume"));
        assert!(!matches("startup", "compact"));
        assert!(!matches("shell", "shell_bg"), "anchored");
        assert!(matches("a(", "a("), "not a regex: equality");
    }

    #[test]
    fn compiled_groups_keep_config_order_and_name_a_bad_regex() {
        let g = |m: &str, c: &str| HookMatcher {
            matcher: m.into(),
            hooks: vec![HookHandler::command(c)],
        };
        let m = Matchers::compile(&[g("shell|file_.*", "one"), g("", "two"), g("web", "three")])
            .unwrap();
        let names: Vec<&str> = m.matching("file_read").iter().map(|h| h.label()).collect();
        assert_eq!(names, ["one", "two"]);
        assert_eq!(
            Matchers::compile(&[g("", "x"), g("a(", "y")])
                .unwrap_err()
                .0,
            1
        );
    }
}
