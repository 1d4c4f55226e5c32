//! The soak's verdict, in three parts, each a pure function of what the
//! soak measured (so each is tested on made-up series):
//!
//! - **RSS**: the robust slope of RSS over the samples after warm-up (the
//!   first 20 % of the duration or 30 s, whichever is smaller) up to the
//!   end of the duration (the drain is not judged), in % of their mean RSS
//!   per minute, against a limit of 1 %/min. The slope is Theil–Sen's (the
//!   median of the slopes between every two samples), which a few outlying
//!   samples (a GC-like step, a page-cache blip) cannot drag, with Sen's 95 %
//!   interval around it. The outcome:
//!   - `too_short` when fewer than 60 s or 10 samples are left after
//!     warm-up: nothing is judged, and that is no failure;
//!   - `pass` when the slope is under the limit;
//!   - `fail` when the whole interval is at or over the limit (the growth is
//!     clear, not noise);
//!   - `inconclusive` when the slope is over the limit but the interval
//!     reaches below it: a longer soak is needed to tell; no failure.
//!
//!   Samples a second apart are not independent (RSS moves in steps), so
//!   the interval is narrower than a true one: it tells noise from growth
//!   for the large, not the fine.
//! - **Disk** (database + WAL + spool; not judged with `--db :memory:`):
//!   under a retention that bounds anything, the same slope, limit and
//!   outcomes as RSS, over the samples after warm-up *and* after the
//!   bound was first reached (the file at 90 % of `max_bytes`, `max_runs`
//!   runs finished, `max_age` passed): a file filling up to its bound is
//!   not growth. A soak that never reached its bound is `too_short`.
//!   Without retention the database keeps every run and grows by design:
//!   the slope is stated as `unbounded`, not judged, and no failure.
//! - **Statuses**: every status must be explained by the chaos injected:
//!   `ok` always; `killed/stalled` by hangs (a hung call ends its run that
//!   way: at most one per hang); `error/rate_limited` by 429s (at most one
//!   per 429; fewer when a retry layer absorbs them); `error/tool_errors` by
//!   malformed tool calls (`max_tool_errors` in a row each);
//!   `error/max_iterations` by malformed tool calls (each adds a model
//!   call); `killed/runaway` by malformed tool calls too (the same tool
//!   error again and again is the `same_error` loop: one per threshold's
//!   worth of them). Without chaos, only `ok`. Anything else, or more of a status
//!   than its cause allows, is unexplained.
//! - **Terminal records**: after the host's shutdown has drained the audit
//!   actor, the store's count of terminal records equals the runs
//!   submitted, and every submitted run's handle gave a result.
//!
//! The whole verdict's [`outcome`](Verdict::outcome) is `fail` when a part
//! failed (or a submit did), else `inconclusive` when a part could not be
//! judged (the RSS or disk slope `too_short` or `inconclusive`: the soak
//! did not show the process keeps its memory, or its disk), else `pass`. An inconclusive
//! verdict is no failure (`pass` stays true, and `agentvisor soak` exits 0
//! with a warning) unless the caller requires a conclusive one
//! ([`Verdict::require_conclusive`], `soak --require`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::providers::chaos::ChaosCounts;

mod slope;

pub use slope::*;

/// The statuses part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusVerdict {
    /// Each non-`ok` status seen: what explains it and how many it allows.
    pub explained: Vec<Explained>,
    /// Runs per status that nothing explains (an unknown status, or more
    /// than its cause allows).
    pub unexplained: BTreeMap<String, u64>,
    /// Nothing is unexplained.
    pub pass: bool,
}

/// One status the chaos may explain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explained {
    /// The status key (`killed/stalled`).
    pub status: String,
    /// Runs that ended so.
    pub runs: u64,
    /// The fault that explains it.
    pub cause: &'static str,
    /// How many runs that fault explains at most.
    pub allowed: u64,
}

/// The default threshold of the `same_error` loop detector (a manifest
/// may set its own; the soak's workload keeps the default).
const SAME_ERROR_DEFAULT: u16 = crate::ports::critic::LOOPS_DEFAULT.same_error;

/// Judges the statuses against the faults injected (see the module doc).
pub fn explain_statuses(
    by_status: &BTreeMap<String, u64>,
    injected: Option<ChaosCounts>,
    max_tool_errors: u32,
) -> StatusVerdict {
    let c = injected.unwrap_or_default();
    let mut explained = Vec::new();
    let mut unexplained = BTreeMap::new();
    for (status, &runs) in by_status {
        let cause = match status.as_str() {
            "ok" => continue,
            "killed/stalled" => Some(("hang", c.hang)),
            "error/rate_limited" => Some(("rate_limited", c.rate_limited)),
            "error/tool_errors" => Some((
                "malformed (max_tool_errors in a row)",
                c.malformed / u64::from(max_tool_errors.max(1)),
            )),
            "error/max_iterations" => Some(("malformed", c.malformed)),
            // Malformed calls in a row end in the same tool error each
            // time: the critic's `same_error` loop detector takes that for
            // a runaway loop (rightly) once it repeats its threshold.
            "killed/runaway" => Some((
                "malformed (the same error repeated)",
                c.malformed / u64::from(SAME_ERROR_DEFAULT.max(1)),
            )),
            _ => None,
        };
        match cause {
            Some((cause, allowed)) => {
                if runs > allowed {
                    unexplained.insert(status.clone(), runs - allowed);
                }
                explained.push(Explained {
                    status: status.clone(),
                    runs,
                    cause,
                    allowed,
                });
            }
            None => {
                unexplained.insert(status.clone(), runs);
            }
        }
    }
    StatusVerdict {
        pass: unexplained.is_empty(),
        explained,
        unexplained,
    }
}

/// The terminal-records part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TerminalVerdict {
    /// Runs the host accepted.
    pub runs_submitted: u64,
    /// Results their handles gave.
    pub results: u64,
    /// Terminal records the store counted.
    pub terminal_records: u64,
    /// One result and one terminal record per run.
    pub pass: bool,
}

impl TerminalVerdict {
    /// Judges the counts.
    pub fn of(runs_submitted: u64, results: u64, terminal_records: u64) -> Self {
        TerminalVerdict {
            runs_submitted,
            results,
            terminal_records,
            pass: results == runs_submitted && terminal_records == runs_submitted,
        }
    }
}

/// What the whole verdict found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictOutcome {
    /// Every part was judged and passed.
    Pass,
    /// A part failed, or a submit did.
    Fail,
    /// Nothing failed, but a part could not be judged (see
    /// [`Verdict::unjudged`]).
    Inconclusive,
}

/// The whole verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// No part failed and no submit did (and, when a conclusive verdict is
    /// required, every part was judged).
    pub pass: bool,
    /// `pass`, `fail` or `inconclusive` (see the module doc).
    pub outcome: VerdictOutcome,
    /// The parts that could not be judged, each with why (`rss: too short
    /// to judge: …`); empty when every part was.
    pub unjudged: Vec<String>,
    /// A conclusive verdict was required: an inconclusive one fails.
    pub require_conclusive: bool,
    /// RSS over time.
    pub rss: RssVerdict,
    /// Disk use over time (`null` when nothing is on disk: `--db
    /// :memory:`).
    pub disk: Option<DiskVerdict>,
    /// Statuses against the faults injected.
    pub statuses: StatusVerdict,
    /// Terminal records against runs.
    pub terminal: TerminalVerdict,
}

impl Verdict {
    /// Puts the parts together; `submit_errors` is how many submits the
    /// host refused (any fails the verdict).
    pub fn of(
        rss: RssVerdict,
        disk: Option<DiskVerdict>,
        statuses: StatusVerdict,
        terminal: TerminalVerdict,
        submit_errors: u64,
    ) -> Self {
        let disk_pass = disk.as_ref().is_none_or(|d| d.pass);
        let failed =
            !(rss.pass && disk_pass && statuses.pass && terminal.pass && submit_errors == 0);
        let mut unjudged = Vec::new();
        if matches!(rss.outcome, RssOutcome::TooShort | RssOutcome::Inconclusive) {
            unjudged.push(format!("rss: {}", rss.reason));
        }
        if let Some(d) = &disk {
            if matches!(d.outcome, DiskOutcome::TooShort | DiskOutcome::Inconclusive) {
                unjudged.push(format!("disk: {}", d.reason));
            }
        }
        let outcome = if failed {
            VerdictOutcome::Fail
        } else if !unjudged.is_empty() {
            VerdictOutcome::Inconclusive
        } else {
            VerdictOutcome::Pass
        };
        Verdict {
            pass: !failed,
            outcome,
            unjudged,
            require_conclusive: false,
            rss,
            disk,
            statuses,
            terminal,
        }
    }

    /// Requires a conclusive verdict: an inconclusive one no longer passes.
    pub fn require_conclusive(&mut self) {
        self.require_conclusive = true;
        if self.outcome == VerdictOutcome::Inconclusive {
            self.pass = false;
        }
    }
}

#[cfg(test)]
mod tests;
