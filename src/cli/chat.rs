//! `agentvisor chat FILE [--session ID]`: a chat with an agent in the
//! terminal. Every line is a prompt of one session (see
//! `agentvisor::session`): its answer streams as it arrives (`text.delta`),
//! the conversation is kept in the database, and `--session ID` goes on
//! with an earlier one (or starts one with that id).
//!
//! - At a terminal, lines are edited with `rustyline` (arrows, Ctrl-A/E,
//!   history within the chat). Ctrl-C while an answer streams stops that
//!   answer (its run is cancelled, the answer is not kept) and the chat
//!   goes on; Ctrl-C at the prompt clears the line; Ctrl-D or `/exit`
//!   leaves.
//! - With stdin not a terminal (a pipe, a file), lines are read plainly and
//!   nothing but the answers is printed on stdout, one per prompt; a failed
//!   prompt prints `[status (reason): error]` on stderr. Ctrl-C there stops
//!   the answer in flight the same way, and ends the chat while it waits
//!   for a line.
//!
//! The session's id is printed on stderr at the start. Exit codes: 0 when
//! the chat ends; 2 when the manifest, the database or the session cannot
//! be used (a malformed id, another agent's session, a closed session).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tokio::io::AsyncBufReadExt;

use agentvisor::{RunEvent, RunResult, RunStatus, Session, SessionOptions, SessionState};

/// Flags of `agentvisor chat`.
#[derive(Args, Debug)]
pub(crate) struct ChatArgs {
    /// The agent manifest (YAML).
    file: PathBuf,
    /// Go on with this session (created with this id when new).
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// The caller id the prompts are charged to.
    #[arg(long, default_value = "cli")]
    caller: String,
    /// A token budget for this chat's prompts together (at least 1): on
    /// top of the manifest's `budget` (each prompt's) and the caller's
    /// stored limits; the tightest wins.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = super::flags::whole(1, u64::MAX))]
    budget_tokens: Option<u64>,
    /// Chat with this model instead of the manifest's (`openai:MODEL`,
    /// `anthropic:MODEL`, `ollama:MODEL`, `scripted`, or a tier).
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
}

pub(crate) async fn chat(a: ChatArgs, db: &super::Db) -> ExitCode {
    let (host, agent) = match super::prepare(&a.file, a.budget_tokens, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let options = SessionOptions {
        id: a.session,
        caller_id: Some(a.caller),
        ..Default::default()
    };
    let session = match host.open_session(agent, options).await {
        Ok(s) if s.state() == SessionState::Closed => {
            host.shutdown().await;
            return super::refuse(format!("session `{}` is closed", s.id()));
        }
        Ok(s) => s,
        Err(e) => {
            host.shutdown().await;
            return super::refuse(e);
        }
    };
    let terminal = std::io::stdin().is_terminal();
    errln!(
        "session {} with {}{}",
        session.id(),
        session.agent(),
        if terminal {
            " (Ctrl-C stops an answer; Ctrl-D or /exit leaves)"
        } else {
            ""
        }
    );
    let mut input = if terminal {
        match Lines::terminal() {
            Ok(l) => l,
            Err(e) => {
                host.shutdown().await;
                return super::refuse(format!("cannot read the terminal: {e}"));
            }
        }
    } else {
        Lines::plain()
    };
    // Ctrl-C on plain input leaves a read of stdin pending on tokio's
    // blocking pool, which the runtime would wait for as it shuts down
    // (until the next line): the process then exits here, its records written.
    let mut read_pending = false;
    loop {
        let line = match input.next().await {
            Line::Text(t) => t,
            Line::Interrupted => continue,
            Line::End => break,
            Line::Stopped => {
                read_pending = true;
                break;
            }
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if matches!(text, "/exit" | "/quit") {
            break;
        }
        input.remember(text);
        answer(&session, text).await;
    }
    let stats = host.shutdown().await;
    let code: u8 = if super::report_unwritten(&host, &stats) {
        1
    } else {
        0
    };
    if read_pending {
        super::exit_now(code);
    }
    ExitCode::from(code)
}

/// Runs one prompt, printing its text as it arrives.
async fn answer(session: &Session, text: &str) {
    // Listening before the prompt starts, and once for the whole answer: a
    // Ctrl-C that comes while a delta is printed is not missed.
    let mut sigint = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
    {
        Ok(s) => Some(s),
        Err(e) => {
            errln!("[cannot listen for Ctrl-C: {e}]");
            None
        }
    };
    let mut turn = match session.prompt_streaming(text).await {
        Ok(t) => t,
        Err(e) => {
            errln!("[{}: {e}]", e.kind());
            return;
        }
    };
    let mut out = std::io::stdout();
    let mut printed = false;
    // The model call whose text is being printed: the text of a later call
    // (after tool calls) starts on a line of its own.
    let mut printing = 0;
    let mut interrupted = false;
    loop {
        tokio::select! {
            ev = turn.events().next() => match ev {
                Some(ev) => {
                    if let RunEvent::TextDelta { text, iteration } = ev.event {
                        if printed && iteration != printing {
                            let _ = out.write_all(b"\n");
                        }
                        printing = iteration;
                        printed |= !text.is_empty();
                        let _ = out.write_all(text.as_bytes());
                        let _ = out.flush();
                    }
                }
                None => break,
            },
            _ = async { sigint.as_mut()?.recv().await }, if !interrupted && sigint.is_some() => {
                interrupted = true;
                turn.cancel();
            }
        }
    }
    let result = turn.result().await;
    match result {
        Ok(r) => finish_line(&r, printed),
        Err(e) => {
            if printed {
                outln!();
            }
            errln!("[{}: {e}]", e.kind());
        }
    }
}

/// Ends the answer's line: the whole output when nothing streamed (a model
/// that does not stream), and a note on stderr for a failed prompt.
fn finish_line(r: &RunResult, printed: bool) {
    let mut out = std::io::stdout();
    if !printed && r.status == RunStatus::Ok {
        let _ = write!(out, "{}", r.output.as_deref().unwrap_or_default());
        printed_newline(&mut out);
    } else if printed {
        printed_newline(&mut out);
    }
    if r.status != RunStatus::Ok {
        let reason = r
            .kill_reason
            .map(|k| format!(" ({k})"))
            .or_else(|| r.error_kind.as_ref().map(|k| format!(" ({k})")))
            .unwrap_or_default();
        let error = r
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        errln!("[{}{reason}{error}]", r.status);
    }
}

fn printed_newline(out: &mut std::io::Stdout) {
    let _ = writeln!(out);
    let _ = out.flush();
}

/// A line of input, or why there is none.
enum Line {
    Text(String),
    /// Ctrl-C at the prompt (the line is dropped).
    Interrupted,
    /// End of input (Ctrl-D, a closed pipe).
    End,
    /// Ctrl-C on plain input: the chat ends, a read still pending.
    Stopped,
}

/// Where lines come from: the line editor at a terminal, else stdin read
/// plainly.
enum Lines {
    /// The editor lives on a blocking thread while it reads, and comes back.
    Terminal(Option<rustyline::DefaultEditor>),
    Plain(tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>),
}

impl Lines {
    fn terminal() -> Result<Lines, rustyline::error::ReadlineError> {
        Ok(Lines::Terminal(Some(rustyline::DefaultEditor::new()?)))
    }

    fn plain() -> Lines {
        Lines::Plain(tokio::io::BufReader::new(tokio::io::stdin()).lines())
    }

    async fn next(&mut self) -> Line {
        match self {
            Lines::Terminal(slot) => {
                let Some(mut editor) = slot.take() else {
                    return Line::End;
                };
                let read = tokio::task::spawn_blocking(move || {
                    let line = editor.readline("> ");
                    (editor, line)
                })
                .await;
                let Ok((editor, line)) = read else {
                    return Line::End;
                };
                *slot = Some(editor);
                match line {
                    Ok(t) => Line::Text(t),
                    Err(rustyline::error::ReadlineError::Interrupted) => Line::Interrupted,
                    Err(rustyline::error::ReadlineError::Eof) => Line::End,
                    Err(e) => {
                        errln!("error: cannot read the terminal: {e}");
                        Line::End
                    }
                }
            }
            Lines::Plain(lines) => tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(t)) => Line::Text(t),
                    Ok(None) => Line::End,
                    Err(e) => {
                        errln!("error: cannot read stdin: {e}");
                        Line::End
                    }
                },
                _ = tokio::signal::ctrl_c() => Line::Stopped,
            },
        }
    }

    /// Adds a prompt to the editor's history (arrow up brings it back).
    fn remember(&mut self, text: &str) {
        if let Lines::Terminal(Some(editor)) = self {
            let _ = editor.add_history_entry(text);
        }
    }
}
