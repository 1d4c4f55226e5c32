//! Signals for `run` and `swarm`: SIGTERM, SIGHUP and SIGINT (Ctrl-C) are
//! caught from the start of a command, so none of them ends the process
//! with records unwritten.
//!
//! The first signal drains: the command stops admitting runs, gives those
//! in flight `--drain` (default 10 s) to finish, then cancels what still
//! runs (`Host::shutdown`: durable runs keep their checkpoints), writes
//! every record, prints its result or summary and exits 143 (SIGTERM), 129
//! (SIGHUP) or 130 (SIGINT). A second signal during the drain ends it at
//! once, still cancelling, flushing and printing.

use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The default drain.
pub(crate) const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

/// Which signal arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caught {
    Term,
    Hup,
    Int,
}

impl Caught {
    /// The exit code: 128 + the signal's number.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Caught::Term => 143,
            Caught::Hup => 129,
            Caught::Int => 130,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Caught::Term => "SIGTERM",
            Caught::Hup => "SIGHUP",
            Caught::Int => "SIGINT",
        }
    }
}

/// The three signals, listened to from creation on.
pub(crate) struct Signals {
    term: Signal,
    hup: Signal,
    int: Signal,
}

impl Signals {
    /// Starts listening (replacing the default action: the process is no
    /// longer ended by these signals).
    pub(crate) fn listen() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal.
    pub(crate) async fn next(&mut self) -> Caught {
        tokio::select! {
            _ = self.term.recv() => Caught::Term,
            _ = self.hup.recv() => Caught::Hup,
            _ = self.int.recv() => Caught::Int,
        }
    }
}

/// Parses `--drain`: a duration from 0 to 24h.
pub(crate) fn drain_flag(s: &str) -> Result<Duration, String> {
    super::flags::duration(Duration::ZERO, agentvisor::spec::MAX_DURATION)(s)
}
