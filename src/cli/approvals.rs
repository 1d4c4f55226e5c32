//! Tool calls a manifest gates (`approval:`), decided for `agentvisor run`.
//!
//! A local run has no server an operator could reach, so the command
//! decides, as `--approve` says:
//! - `ask` (the default): at a terminal, each call is shown on stderr and
//!   the answer read from stdin (`y` approves; anything else denies); with
//!   stdin not a terminal nobody can answer, so each call is denied at once
//!   (the run does not wait out `approval_timeout`), and stderr says why.
//! - `all`: every call is approved (stderr names each).
//! - `none`: every call is denied.
//!
//! Calls are asked one at a time, in the order they were requested; a
//! decision reaches the run that asked (a pipeline's phase, a sub-agent).

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Arc;

use agentvisor::{Event, Host, RunEvent, RunId};

/// `--approve`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ApproveMode {
    /// Ask at the terminal; deny when stdin is not one.
    #[default]
    Ask,
    /// Approve every gated call.
    All,
    /// Deny every gated call.
    None,
}

/// A call waiting for its question to be asked.
struct Pending {
    run_id: RunId,
    call_id: Arc<str>,
    tool: Arc<str>,
    arguments: String,
}

/// The gated calls of one command, and the question being asked.
pub(crate) struct Approvals {
    mode: ApproveMode,
    terminal: bool,
    queue: VecDeque<Pending>,
    /// The call being asked about, and the read of its answer.
    asking: Option<(Pending, tokio::task::JoinHandle<String>)>,
}

impl Approvals {
    pub(crate) fn new(mode: ApproveMode) -> Self {
        Approvals {
            mode,
            terminal: std::io::stdin().is_terminal(),
            queue: VecDeque::new(),
            asking: None,
        }
    }

    /// Takes `ev` if it asks for an approval: decides it now (`all`,
    /// `none`, or no terminal) or queues its question.
    pub(crate) fn requested(&mut self, host: &Host, ev: &Event) {
        let RunEvent::ApprovalRequested {
            call_id,
            tool,
            arguments,
            ..
        } = &ev.event
        else {
            return;
        };
        let call = Pending {
            run_id: ev.run_id,
            call_id: call_id.clone(),
            tool: tool.clone(),
            arguments: arguments.clone(),
        };
        match (self.mode, self.terminal) {
            (ApproveMode::All, _) => {
                errln!("approved {} ({}): --approve all", call.tool, call.call_id);
                decide(host, &call, true, String::new());
            }
            (ApproveMode::None, _) => {
                errln!("denied {} ({}): --approve none", call.tool, call.call_id);
                decide(host, &call, false, "denied by --approve none".into());
            }
            (ApproveMode::Ask, false) => {
                errln!(
                    "denied {} ({}): it needs approval and stdin is not a terminal to ask at (see --approve)",
                    call.tool,
                    call.call_id
                );
                decide(
                    host,
                    &call,
                    false,
                    "no operator to approve it (the run was not at a terminal)".into(),
                );
            }
            (ApproveMode::Ask, true) => {
                self.queue.push_back(call);
                self.ask_next();
            }
        }
    }

    /// Whether a question waits for its answer.
    pub(crate) fn is_asking(&self) -> bool {
        self.asking.is_some()
    }

    /// The answer to the question being asked (pending forever when none
    /// is: select on it only while [`is_asking`](Self::is_asking)).
    pub(crate) async fn answer(&mut self) -> String {
        match &mut self.asking {
            Some((_, read)) => read.await.unwrap_or_default(),
            None => std::future::pending().await,
        }
    }

    /// Decides the call asked about by `answer`, then asks the next one.
    pub(crate) fn answered(&mut self, host: &Host, answer: &str) {
        let Some((call, _)) = self.asking.take() else {
            return;
        };
        let yes = matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes");
        let reason = if yes {
            String::new()
        } else {
            "denied at the terminal".into()
        };
        decide(host, &call, yes, reason);
        self.ask_next();
    }

    /// Asks about the next queued call, unless a question is open.
    fn ask_next(&mut self) {
        if self.asking.is_some() {
            return;
        }
        let Some(call) = self.queue.pop_front() else {
            return;
        };
        errln!(
            "run {} asks to call {} with {}: approve? [y/N]",
            call.run_id,
            call.tool,
            call.arguments
        );
        // The read blocks a thread of the blocking pool until a line (or
        // the end of stdin) comes; a run that ends meanwhile leaves it
        // unanswered (see `is_asking`: the command then exits without
        // waiting for it).
        let read = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            line
        });
        self.asking = Some((call, read));
    }
}

/// Hands the decision on `call` to its run, if it still waits.
fn decide(host: &Host, call: &Pending, approve: bool, reason: String) {
    let Some(run) = host.run(&call.run_id) else {
        return;
    };
    let decided = if approve {
        run.approve(Some(&call.call_id))
    } else {
        run.deny(Some(&call.call_id), reason)
    };
    if let Err(e) = decided {
        errln!("{} ({}): {e}", call.tool, call.call_id);
    }
}
