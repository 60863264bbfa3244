//! The terminal's input: one thread owns the line editor, so the REPL prompt
//! and the approval prompt never compete for stdin. While the editor reads,
//! the terminal is in raw mode and Ctrl-C arrives as [`Line::Interrupted`];
//! between prompts it is a signal (see [`crate::turn::Interrupts`]).

use rustyline::error::ReadlineError;
use tokio::sync::oneshot;

/// What a prompt read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// A line of text (without the newline).
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of input.
    Eof,
}

struct Ask {
    prompt: String,
    history: bool,
    reply: oneshot::Sender<Line>,
}

/// A handle on the input thread.
pub struct Input {
    tx: std::sync::mpsc::Sender<Ask>,
}

impl Input {
    /// Starts the input thread with a rustyline editor.
    pub fn start() -> Result<Self, crate::error::CliError> {
        let mut editor =
            rustyline::DefaultEditor::new().map_err(|e| crate::error::CliError::Io {
                what: "cannot open the line editor".into(),
                source: std::io::Error::other(e),
            })?;
        let (tx, rx) = std::sync::mpsc::channel::<Ask>();
        std::thread::Builder::new()
            .name("omicos-input".into())
            .spawn(move || {
                while let Ok(ask) = rx.recv() {
                    let line = match editor.readline(&ask.prompt) {
                        Ok(l) => {
                            if ask.history && !l.trim().is_empty() {
                                let _ = editor.add_history_entry(l.as_str());
                            }
                            Line::Text(l)
                        }
                        Err(ReadlineError::Interrupted) => Line::Interrupted,
                        Err(_) => Line::Eof,
                    };
                    let _ = ask.reply.send(line);
                }
            })
            .map_err(|e| crate::error::CliError::Io {
                what: "cannot start the input thread".into(),
                source: e,
            })?;
        Ok(Self { tx })
    }

    /// Reads one line after `prompt`; `history` keeps it for the up arrow.
    pub async fn read(&self, prompt: &str, history: bool) -> Line {
        let (reply, rx) = oneshot::channel();
        if self
            .tx
            .send(Ask {
                prompt: prompt.to_owned(),
                history,
                reply,
            })
            .is_err()
        {
            return Line::Eof;
        }
        rx.await.unwrap_or(Line::Eof)
    }
}
