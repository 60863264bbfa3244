//! robots.txt: the groups that apply to our user agent, and whether a path
//! may be fetched (longest match wins, Allow wins a tie, `*` and `$` as in
//! RFC 9309).

/// The rules of one robots.txt that apply to one user agent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    /// (allow, pattern) pairs.
    rules: Vec<(bool, String)>,
}

impl Rules {
    /// Everything allowed (no robots.txt, or it could not be read).
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// Parses `text` for `user_agent` (its product token, e.g. `omicos-web`).
    /// The most specific group that names the agent applies, else `*`.
    pub fn parse(text: &str, user_agent: &str) -> Self {
        let agent = user_agent
            .split('/')
            .next()
            .unwrap_or(user_agent)
            .trim()
            .to_ascii_lowercase();
        let mut specific: Vec<(bool, String)> = Vec::new();
        let mut star: Vec<(bool, String)> = Vec::new();
        let mut found_specific = false;
        // The agents of the group being read, and whether its rules started.
        let mut group_agents: Vec<String> = Vec::new();
        let mut in_rules = false;
        for raw in text.lines() {
            let line = raw.split('#').next().unwrap_or("").trim();
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let value = value.trim();
            match key.as_str() {
                "user-agent" => {
                    if in_rules {
                        group_agents.clear();
                        in_rules = false;
                    }
                    group_agents.push(value.to_ascii_lowercase());
                }
                "allow" | "disallow" => {
                    in_rules = true;
                    let allow = key == "allow";
                    // An empty Disallow allows everything: no rule.
                    if value.is_empty() {
                        continue;
                    }
                    let names_us = group_agents
                        .iter()
                        .any(|a| a != "*" && !agent.is_empty() && agent.starts_with(a.as_str()));
                    if names_us {
                        found_specific = true;
                        specific.push((allow, value.to_owned()));
                    } else if group_agents.iter().any(|a| a == "*") {
                        star.push((allow, value.to_owned()));
                    }
                }
                _ => {}
            }
        }
        // A group that names us with only empty rules still replaces `*`.
        let names_us_anywhere = text.lines().any(|l| {
            let l = l
                .split('#')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            l.strip_prefix("user-agent:").is_some_and(|a| {
                let a = a.trim();
                a != "*" && !agent.is_empty() && agent.starts_with(a)
            })
        });
        Self {
            rules: if found_specific || names_us_anywhere {
                specific
            } else {
                star
            },
        }
    }

    /// Whether `path` (with its query) may be fetched.
    pub fn allowed(&self, path: &str) -> bool {
        let mut best: Option<(usize, bool)> = None;
        for (allow, pattern) in &self.rules {
            if matches(pattern, path) {
                let len = pattern.len();
                best = match best {
                    Some((l, a)) if l > len || (l == len && a) => Some((l, a)),
                    _ => Some((len, *allow)),
                };
            }
        }
        best.is_none_or(|(_, allow)| allow)
    }
}

/// Matches a robots pattern (`*` any run, `$` end) against the start of `path`.
fn matches(pattern: &str, path: &str) -> bool {
    let (pattern, anchored) = match pattern.strip_suffix('$') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let pieces: Vec<&str> = pattern.split('*').collect();
    // Iterative glob match: the first piece is a prefix, the rest are found in order.
    let Some(rest) = path.strip_prefix(pieces[0]) else {
        return false;
    };
    if pieces.len() == 1 {
        return !anchored || rest.is_empty();
    }
    let mut pos = 0;
    let last = pieces.len() - 1;
    for (i, piece) in pieces.iter().enumerate().skip(1) {
        if i == last && anchored {
            return rest.len() >= pos + piece.len() && rest.ends_with(piece);
        }
        match rest[pos..].find(piece) {
            Some(at) => pos += at + piece.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_precedence() {
        let txt = "User-agent: *\nDisallow: /private\nAllow: /private/open\n\nUser-agent: otherbot\nDisallow: /\n";
        let r = Rules::parse(txt, "omicos-web/0.1");
        assert!(!r.allowed("/private/x"));
        assert!(r.allowed("/private/open/page"));
        assert!(r.allowed("/public"));
        let r = Rules::parse(txt, "otherbot/2");
        assert!(!r.allowed("/anything"));
        let txt = "User-agent: omicos-web\nDisallow: /no\n\nUser-agent: *\nDisallow: /\n";
        let r = Rules::parse(txt, "omicos-web/0.1");
        assert!(r.allowed("/yes") && !r.allowed("/no/x"));
    }

    #[test]
    fn wildcards() {
        let r = Rules::parse(
            "User-agent: *\nDisallow: /*.pdf$\nDisallow: /tmp*/x\nDisallow:\n",
            "a",
        );
        assert!(!r.allowed("/docs/a.pdf"));
        assert!(r.allowed("/docs/a.pdf?x=1"));
        assert!(!r.allowed("/tmp123/x/y"));
        assert!(r.allowed("/tmp/y"));
        assert!(Rules::parse("", "a").allowed("/"));
    }
}
