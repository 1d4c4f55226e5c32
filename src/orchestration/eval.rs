//! Eval (P3): fork every recorded run of a cohort with the same overrides,
//! R times each, under one budget, and report what changed.
//!
//! The cohort is read from a [`RunIndex`]: the runs of one agent, newest
//! first, optionally of one status, started within a window, at most N.
//! Each (run, repeat) is a [`fork`](super::fork::fork) at the same step
//! under the same manifest, at most C in flight. The budget is the host's:
//! build it with an allowance (`HostBuilder::allowance_tokens`, the CLI's
//! `--budget-tokens`) and every fork spends against it through the usual
//! admission and metering, as any run of the host does. A fork that ends
//! `budget_exceeded` stops the sweep: the forks not started yet are not
//! run (reported `not_run`), those in flight end as their budget says.
//!
//! Each row compares the recorded run with its fork ([`diff`](super::diff)):
//! status, kill reason, error kind, `output_schema` validity, tokens and
//! cost before and after, and the first divergence. The totals count the
//! status changes (`ok→killed`, …), validity before and after, tokens and
//! cost, the first-divergence histogram and the runs whose ending changed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Serialize;

use super::diff::{diff, RunSide};
use super::fork::{fork, ForkOptions, Recording};
use crate::ports::audit::{AuditStoreError, RunFilter, RunIndex, RunSummary};
use crate::ports::run::{unix_ms, RunId, RunStatus};
use crate::ports::tool::ToolEffect;
use crate::spec::AgentSpec;
use crate::Host;

/// Which runs, and how to fork them.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// The cohort's agent.
    pub agent: String,
    /// Only runs that ended so.
    pub status: Option<RunStatus>,
    /// Only runs started at most this long ago.
    pub since: Option<Duration>,
    /// At most this many runs (newest first).
    pub limit: Option<u32>,
    /// Each fork takes steps 1 to `at_step` from its recording (capped at
    /// the run's last step).
    pub at_step: u32,
    /// Forks of each run.
    pub repeats: u32,
    /// Forks in flight at most.
    pub concurrency: usize,
    /// Effect classes run live besides `read`.
    pub live: Vec<ToolEffect>,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            agent: String::new(),
            status: None,
            since: None,
            limit: None,
            at_step: 0,
            repeats: 1,
            concurrency: 4,
            live: Vec::new(),
        }
    }
}

/// One run's ending and spend, before (the recording) or after (the fork).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    /// The run.
    pub run_id: RunId,
    /// How it ended.
    pub status: Option<RunStatus>,
    /// Its kill reason or error kind.
    pub why: Option<String>,
    /// Whether its answer met its `output_schema` (see
    /// [`RunSide::output_valid`]).
    pub output_valid: Option<bool>,
    /// Its tokens.
    pub tokens: u64,
    /// Its cost in micro-dollars.
    pub cost_micros: u64,
}

impl From<&RunSide> for Side {
    fn from(s: &RunSide) -> Self {
        Side {
            run_id: s.run_id,
            status: s.status,
            why: s
                .kill_reason
                .map(|k| k.to_string())
                .or_else(|| s.error_kind.clone()),
            output_valid: s.output_valid,
            tokens: s.tokens.input + s.tokens.output,
            cost_micros: s.cost_micros,
        }
    }
}

/// One fork of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalRow {
    /// The recorded run.
    pub run_id: RunId,
    /// Which of its forks (0-based).
    pub repeat: u32,
    /// The recording's side.
    pub before: Option<Side>,
    /// The fork's side (`null`: not run).
    pub after: Option<Side>,
    /// The first step where the fork differs from the recording.
    pub first_divergence: Option<u32>,
    /// Whether the ending changed (status, kill reason or error kind).
    pub ending_changed: bool,
    /// Why it was not run or not compared (`not_run: budget spent`, …).
    pub note: Option<String>,
}

/// The totals of a sweep.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EvalTotals {
    /// Runs in the cohort.
    pub runs: usize,
    /// Forks planned (runs × repeats).
    pub planned: usize,
    /// Forks that ran.
    pub forked: usize,
    /// Forks not run (the budget was spent, or the run could not be forked).
    pub not_run: usize,
    /// Whether the budget stopped the sweep.
    pub stopped_by_budget: bool,
    /// Status changes, `before→after` (`ok→killed`), counted; unchanged
    /// statuses are counted as `ok→ok`.
    pub status_changes: BTreeMap<String, usize>,
    /// Answers that met the schema before and after (of the forks run).
    pub valid_before: usize,
    /// See `valid_before`.
    pub valid_after: usize,
    /// Tokens of the recordings (once per fork run) and of the forks.
    pub tokens_before: u64,
    /// See `tokens_before`.
    pub tokens_after: u64,
    /// Cost of the recordings and of the forks, in micro-dollars.
    pub cost_before: u64,
    /// See `cost_before`.
    pub cost_after: u64,
    /// First-divergence step → forks (`none`: no divergence).
    pub divergence_histogram: BTreeMap<String, usize>,
    /// The recorded runs one of whose forks ended otherwise.
    pub changed: Vec<RunId>,
}

impl EvalTotals {
    /// `N runs, P forks planned: F run, X not run`, and whether the budget
    /// stopped the sweep.
    pub fn sweep_line(&self) -> String {
        format!(
            "{} runs, {} forks planned: {} run, {} not run{}",
            self.runs,
            self.planned,
            self.forked,
            self.not_run,
            if self.stopped_by_budget {
                " (the budget stopped the sweep)"
            } else {
                ""
            }
        )
    }

    /// Tokens, cost and valid answers, before → after.
    pub fn usage_line(&self) -> String {
        format!(
            "tokens {} → {}, cost {} → {} µ$, valid answers {} → {}",
            self.tokens_before,
            self.tokens_after,
            self.cost_before,
            self.cost_after,
            self.valid_before,
            self.valid_after
        )
    }
}

/// A sweep's report (`eval.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EvalReport {
    /// Every fork planned, in cohort order.
    pub rows: Vec<EvalRow>,
    /// The totals.
    pub totals: EvalTotals,
}

/// The cohort: the agent's top-level runs, newest first, as the options
/// select; forks (of an earlier sweep) are left out.
pub async fn cohort(
    index: &dyn RunIndex,
    options: &EvalOptions,
) -> Result<Vec<RunSummary>, AuditStoreError> {
    let since = options
        .since
        .map(|d| unix_ms().saturating_sub(d.as_millis() as u64));
    let want = options.limit.map_or(usize::MAX, |l| l as usize);
    let mut out = Vec::new();
    let mut filter = RunFilter {
        status: options.status,
        limit: Some(500),
        ..Default::default()
    };
    loop {
        let page = index.list_runs(&filter).await?;
        let Some(last) = page.last() else { break };
        filter.after = Some(crate::ports::audit::RunCursor {
            finished_at: last.finished_at,
            run_id: last.run_id,
        });
        let done = page.len() < 500;
        for s in page {
            let candidate = s.agent == options.agent
                && s.parent_run_id.is_none()
                && since.is_none_or(|t| s.started_at >= t)
                && out.len() < want;
            if !candidate {
                continue;
            }
            // The index does not say which runs are forks: their results do.
            let fork = index
                .run_result(s.run_id)
                .await?
                .is_some_and(|r| r.forked_from.is_some());
            if !fork {
                out.push(s);
            }
        }
        if done || out.len() >= want {
            break;
        }
    }
    Ok(out)
}

/// Forks every run of `runs` (a [`cohort`]) `options.repeats` times under
/// manifest `spec` on `host` (see the module doc).
pub async fn eval(
    host: &Host,
    runs: &[RunSummary],
    spec: AgentSpec,
    options: &EvalOptions,
) -> EvalReport {
    let spec = Arc::new(spec);
    let stop = Arc::new(AtomicBool::new(false));
    let jobs: Vec<(RunId, u32)> = runs
        .iter()
        .flat_map(|r| (0..options.repeats).map(move |i| (r.run_id, i)))
        .collect();
    let planned = jobs.len();
    let rows: Vec<EvalRow> = futures_util::stream::iter(jobs)
        .map(|(run_id, repeat)| {
            let (spec, stop) = (spec.clone(), stop.clone());
            async move { one(host, spec, options, run_id, repeat, &stop).await }
        })
        .buffered(options.concurrency.max(1))
        .collect()
        .await;
    let mut totals = EvalTotals {
        runs: runs.len(),
        planned,
        stopped_by_budget: stop.load(Ordering::Relaxed),
        ..Default::default()
    };
    for r in &rows {
        let (Some(b), Some(a)) = (&r.before, &r.after) else {
            totals.not_run += 1;
            continue;
        };
        totals.forked += 1;
        let name = |s: Option<RunStatus>| s.map_or("none", RunStatus::as_str);
        *totals
            .status_changes
            .entry(format!("{}→{}", name(b.status), name(a.status)))
            .or_default() += 1;
        totals.valid_before += usize::from(b.output_valid == Some(true));
        totals.valid_after += usize::from(a.output_valid == Some(true));
        totals.tokens_before += b.tokens;
        totals.tokens_after += a.tokens;
        totals.cost_before += b.cost_micros;
        totals.cost_after += a.cost_micros;
        let step = r
            .first_divergence
            .map_or_else(|| "none".to_string(), |s| s.to_string());
        *totals.divergence_histogram.entry(step).or_default() += 1;
        if r.ending_changed && !totals.changed.contains(&r.run_id) {
            totals.changed.push(r.run_id);
        }
    }
    EvalReport { rows, totals }
}

/// One fork of the sweep, compared with its recording.
async fn one(
    host: &Host,
    spec: Arc<AgentSpec>,
    options: &EvalOptions,
    run_id: RunId,
    repeat: u32,
    stop: &AtomicBool,
) -> EvalRow {
    let row = |note: String| EvalRow {
        run_id,
        repeat,
        before: None,
        after: None,
        first_divergence: None,
        ending_changed: false,
        note: Some(note),
    };
    if stop.load(Ordering::Relaxed) {
        return row("not_run: the budget is spent".into());
    }
    let store = host.audit_store();
    let records = match store.run_records(run_id).await {
        Ok(r) => r,
        Err(e) => return row(format!("not_run: {e}")),
    };
    let recording = match Recording::from_records(run_id, &records) {
        Ok(r) => r,
        Err(e) => return row(format!("not_run: {e}")),
    };
    let fork_options = ForkOptions {
        at_step: options.at_step.min(recording.last_step()),
        live: options.live.clone(),
        ..Default::default()
    };
    let outcome = match fork(host, spec, &recording, fork_options).await {
        Ok(run) => run.finish().await,
        Err(e) => return row(format!("not_run: {e}")),
    };
    if outcome.result.status == RunStatus::BudgetExceeded {
        stop.store(true, Ordering::Relaxed);
    }
    let fork_records = match store.run_records(outcome.result.run_id).await {
        Ok(r) => r,
        Err(e) => return row(format!("not compared: {e}")),
    };
    match diff(run_id, &records, outcome.result.run_id, &fork_records) {
        Ok(d) => EvalRow {
            run_id,
            repeat,
            ending_changed: d.a.status != d.b.status
                || d.a.kill_reason != d.b.kill_reason
                || d.a.error_kind != d.b.error_kind,
            before: Some(Side::from(&d.a)),
            after: Some(Side::from(&d.b)),
            first_divergence: d.first_divergence.map(|f| f.step),
            note: None,
        },
        Err(e) => row(format!("not compared: {e}")),
    }
}

/// The report as a self-contained HTML page: the totals, a bar chart of
/// the first-divergence histogram (inline SVG) and the table of forks.
pub fn html(report: &EvalReport) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let t = &report.totals;
    let mut out = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>agentvisor eval</title>\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}.changed{background:#fee}</style>\
         </head><body>\n<h1>eval</h1>\n",
    );
    out.push_str(&format!(
        "<p>{}; {}</p>\n",
        esc(&t.sweep_line()),
        esc(&t.usage_line())
    ));
    out.push_str("<h2>status changes</h2>\n<ul>\n");
    for (k, n) in &t.status_changes {
        out.push_str(&format!("<li>{} × {n}</li>\n", esc(k)));
    }
    out.push_str("</ul>\n<h2>first divergence</h2>\n");
    let max = t
        .divergence_histogram
        .values()
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let (bar, gap, height) = (40usize, 10usize, 160usize);
    let width = (bar + gap) * t.divergence_histogram.len().max(1) + gap;
    out.push_str(&format!(
        "<svg id=\"histogram\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{}\">\n",
        height + 30
    ));
    for (i, (step, n)) in t.divergence_histogram.iter().enumerate() {
        let h = n * height / max;
        let x = gap + i * (bar + gap);
        out.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"{bar}\" height=\"{h}\" fill=\"#47c\"><title>{n}</title></rect>\
             <text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
            height - h,
            x + bar / 2,
            height + 15,
            esc(step)
        ));
    }
    out.push_str(
        "</svg>\n<h2>forks</h2>\n<table id=\"forks\"><tr><th>run</th><th>repeat</th>\
        <th>before</th><th>after</th><th>tokens</th><th>first divergence</th><th>note</th></tr>\n",
    );
    let side = |s: &Option<Side>| {
        s.as_ref().map_or(String::new(), |s| {
            let status = s.status.map_or("none", RunStatus::as_str);
            match &s.why {
                Some(w) if s.status != Some(RunStatus::Ok) => format!("{status} ({})", esc(w)),
                _ => status.to_string(),
            }
        })
    };
    for r in &report.rows {
        out.push_str(&format!(
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            if r.ending_changed { " class=\"changed\"" } else { "" },
            r.run_id,
            r.repeat,
            side(&r.before),
            side(&r.after),
            match (&r.before, &r.after) {
                (Some(b), Some(a)) => format!("{} → {}", b.tokens, a.tokens),
                _ => String::new(),
            },
            r.first_divergence.map_or(String::new(), |s| s.to_string()),
            esc(r.note.as_deref().unwrap_or(""))
        ));
    }
    out.push_str("</table>\n</body></html>\n");
    out
}
