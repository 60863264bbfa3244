//! Terminal colours: on only when the stream is a terminal and `NO_COLOR` is
//! unset or empty (<https://no-color.org>).

use std::io::IsTerminal;

/// Whether to colour, decided once per stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    /// Emit ANSI colour codes.
    pub color: bool,
}

impl Style {
    /// Colours for stdout: a terminal and no `NO_COLOR`.
    pub fn for_stdout() -> Self {
        Self::decide(
            std::io::stdout().is_terminal(),
            std::env::var_os("NO_COLOR"),
        )
    }

    /// Colours for stderr: a terminal and no `NO_COLOR`.
    pub fn for_stderr() -> Self {
        Self::decide(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        )
    }

    /// The rule itself, separated so it can be tested without a terminal.
    pub fn decide(is_tty: bool, no_color: Option<std::ffi::OsString>) -> Self {
        Self {
            color: is_tty && no_color.is_none_or(|v| v.is_empty()),
        }
    }

    /// No colours at all.
    pub fn plain() -> Self {
        Self { color: false }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }

    /// Dim (secondary information: arguments, results, notices).
    pub fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    /// Bold (agent names, headings).
    pub fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    /// Red (errors, denials).
    pub fn red(&self, s: &str) -> String {
        self.paint("31", s)
    }
    /// Green (success).
    pub fn green(&self, s: &str) -> String {
        self.paint("32", s)
    }
    /// Yellow (approvals, cancels).
    pub fn yellow(&self, s: &str) -> String {
        self.paint("33", s)
    }
    /// Cyan (tool names).
    pub fn cyan(&self, s: &str) -> String {
        self.paint("36", s)
    }
    /// Magenta (agent switches).
    pub fn magenta(&self, s: &str) -> String {
        self.paint("35", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_tty_without_no_color() {
        assert!(Style::decide(true, None).color);
        assert!(
            Style::decide(true, Some("".into())).color,
            "an empty NO_COLOR does not count"
        );
        assert!(!Style::decide(true, Some("1".into())).color);
        assert!(!Style::decide(false, None).color);
        assert_eq!(Style::plain().red("x"), "x");
        assert_eq!(Style { color: true }.red("x"), "\x1b[31mx\x1b[0m");
    }
}
