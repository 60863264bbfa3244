//! `omicos chat`: the REPL on a terminal, one turn from piped stdin otherwise.

use crate::input::{Input, Line};
use crate::render::{Renderer, View};
use crate::turn::{
    Approver, Interrupts, Steering, TurnError, connect, connect_web, follow_started, run_turn,
};
use omicos_proto::ChatRequest;
use std::io::{IsTerminal, Read};
use std::process::ExitCode;

/// What `omicos chat` was asked.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// Orchestrator URL.
    pub server: String,
    /// Continue this session.
    pub session: Option<String>,
    /// The active agent.
    pub agent: Option<String>,
    /// The team.
    pub team: Vec<String>,
    /// Permission mode.
    pub mode: Option<String>,
    /// Print events as JSON lines.
    pub json: bool,
    /// Files to attach to the first message.
    pub attach: Vec<std::path::PathBuf>,
}

impl ChatOptions {
    fn request(&self, session: &str, message: String) -> ChatRequest {
        ChatRequest {
            session_id: session.to_owned(),
            message,
            agent: self.agent.clone().unwrap_or_default(),
            team_members: self.team.clone(),
            permission_mode: self.mode.clone().unwrap_or_default(),
            ..Default::default()
        }
    }
}

use crate::error::{CliError, EXIT_FAILURE, EXIT_INTERRUPTED};

/// Runs `omicos chat`.
pub async fn run(opts: ChatOptions) -> ExitCode {
    if std::io::stdin().is_terminal() {
        repl(opts).await
    } else {
        piped(opts).await
    }
}

async fn piped(opts: ChatOptions) -> ExitCode {
    let mut message = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut message) {
        return CliError::Usage(format!("cannot read stdin: {e}")).report("chat");
    }
    if message.trim().is_empty() {
        return CliError::Usage("no message on stdin (try: echo \"hello\" | omicos chat)".into())
            .report("chat");
    }
    let mut client = match connect(&opts.server).await {
        Ok(c) => c,
        Err(e) => return e.report("chat"),
    };
    let view = if opts.json { View::Json } else { View::Answer };
    let mut r = Renderer::new(view);
    let mut ints = Interrupts::install();
    let session = opts.session.as_deref().unwrap_or_default();
    let mut req = opts.request(session, message.trim_end().to_owned());
    if !opts.attach.is_empty() {
        match crate::attach::upload(&mut client, session, &opts.attach).await {
            Ok((attachments, lines)) => {
                for l in lines {
                    eprintln!("{l}");
                }
                req.attachments = attachments;
            }
            Err(e) => return e.report("chat"),
        }
    }
    match run_turn(&mut client, req, &mut r, &Approver::Deny, &mut ints, None).await {
        Ok(t) if t.reason == omicos_proto::TurnDoneReason::Completed => {
            // The renderer ended the answer's last line at turn_done.
            eprintln!("session {}", t.session_id);
            ExitCode::SUCCESS
        }
        Ok(t) => {
            // Error events were already printed on stderr as they came; say how it ended.
            eprintln!(
                "omicos chat: the turn ended with `{}` (session {})",
                t.reason.as_str(),
                t.session_id
            );
            ExitCode::from(EXIT_FAILURE)
        }
        Err(TurnError::Exit) => ExitCode::from(EXIT_INTERRUPTED),
        Err(TurnError::Failed(e)) => e.report("chat"),
    }
}

async fn repl(opts: ChatOptions) -> ExitCode {
    let mut client = match connect(&opts.server).await {
        Ok(c) => c,
        Err(e) => return e.report("chat"),
    };
    let input = match Input::start() {
        Ok(i) => i,
        Err(e) => return e.report("chat"),
    };
    // Steering goes through StartTurn; without it the REPL still chats.
    let web = connect_web(&opts.server).await.ok();
    let mut r = Renderer::new(if opts.json { View::Json } else { View::Human });
    let st = r.style();
    let mut ints = Interrupts::install();
    let mut session = opts.session.clone().unwrap_or_default();
    // Files attached and not sent yet: they go with the next message.
    let mut pending = vec![];
    if !opts.attach.is_empty() {
        match crate::attach::upload(&mut client, &session, &opts.attach).await {
            Ok((a, lines)) => {
                pending = a;
                for l in lines {
                    r.notice(&l);
                }
            }
            Err(e) => return e.report("chat"),
        }
    }
    println!(
        "{}",
        st.dim(&format!(
            "omicos chat · {} · Enter sends (while a turn runs: steers it) · Ctrl-C cancels a turn (twice exits) · Ctrl-D or /exit leaves",
            opts.server
        ))
    );
    let prompt = st.bold("you> ");
    loop {
        let line = tokio::select! {
            l = input.read(&prompt, true) => l,
            _ = ints.pressed() => Line::Interrupted,
        };
        let line = match line {
            Line::Text(t) => t,
            Line::Interrupted => return ExitCode::from(EXIT_INTERRUPTED),
            Line::Eof => return ExitCode::SUCCESS,
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/exit" || line == "/quit" {
            return ExitCode::SUCCESS;
        }
        if let Some(path) = line.strip_prefix("/attach") {
            let path = path.trim();
            if path.is_empty() {
                r.notice("usage: /attach PATH (the file goes with your next message)");
                continue;
            }
            match crate::attach::upload(&mut client, &session, &[path]).await {
                Ok((a, lines)) => {
                    pending.extend(a);
                    for l in lines {
                        r.notice(&format!("{l}; it goes with your next message"));
                    }
                }
                Err(e) => r.notice(&format!("error: {e}")),
            }
            continue;
        }
        let mut req = opts.request(&session, line.to_owned());
        req.attachments = std::mem::take(&mut pending);
        let steering = web.clone().map(|web| Steering {
            input: &input,
            web,
            request: ChatRequest {
                message: String::new(),
                attachments: vec![],
                ..req.clone()
            },
        });
        let mut done = run_turn(
            &mut client,
            req,
            &mut r,
            &Approver::Prompt(&input),
            &mut ints,
            steering.as_ref(),
        )
        .await;
        // A line steered in as the turn ended started the next one: follow it too.
        while let Ok(t) = &done
            && let Some(seq) = t.next_turn
        {
            let id = t.session_id.clone();
            done = follow_started(
                &mut client,
                &id,
                seq.saturating_sub(1),
                &mut r,
                &Approver::Prompt(&input),
                &mut ints,
                steering.as_ref(),
            )
            .await;
        }
        match done {
            Ok(t) => {
                // An unknown --session gives an error event and no session: start fresh next time.
                let unknown = t.errors.iter().any(|(k, _)| k == "session_not_found");
                session = if unknown { String::new() } else { t.session_id };
            }
            Err(TurnError::Exit) => return ExitCode::from(EXIT_INTERRUPTED),
            Err(TurnError::Failed(e)) => r.notice(&format!("error: {e}")),
        }
    }
}
