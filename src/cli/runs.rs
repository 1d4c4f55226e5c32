//! `agentvisor runs list|show`: the run history in the database.
//!
//! - `runs list [--status S] [--caller C] [--root ID] [--limit N] [--json]`:
//!   finished runs, the most recently finished first; `--root ID` only the
//!   runs of one tree (the run `ID`, its sub-agent runs at any depth; the
//!   phases of pipeline `ID` and theirs); `--json` prints one array of
//!   summaries (`run_id`, `agent`, `caller_id`, `parent_run_id`,
//!   `root_run_id`, `status`, `kill_reason`, `error_kind`, `started_at`,
//!   `finished_at`).
//! - `runs show RUN_ID [--json]`: the run's result, then every audit record
//!   in order (start, steps, tool calls, critic decisions, the terminal
//!   roll-up); `--json` prints `{"result": …, "records": […]}`.
//! - `runs show ID --tree [--json]`: the run and its sub-agent runs under
//!   it (or a pipeline's phases under its id), one line each: id, agent,
//!   status with its kill reason or error kind, tokens, wall time (see
//!   `tree`); `--json` prints `{"root_run_id": …, "runs": [{…,
//!   "children": […]}]}`. Finished runs only (the database has no other).
//! - `runs kill|steer|extend|cancel|approve|deny RUN_ID`: commands to a
//!   run in flight; they need `--server` (sent by `super::client`).
//! - `runs approve|deny RUN_ID [--call ID] [--reason R]` without
//!   `--server`: a durable run parked for approval that no host runs (its
//!   process ended, `recover` left it parked) gets the decision recorded
//!   in the database; the next host to resume it (`recover`, or `serve`
//!   at its start) applies it. Exit 1 when the run is not parked on
//!   record, has no such waiting call, or a live host holds it (decide
//!   through that server then).
//!
//! Exit codes: 0 on success; 1 when `show` finds no such run; 2 when the
//! database is missing or cannot be opened, `--db :memory:` (which keeps no
//! history), or a malformed run id. These commands never create a database.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;

use agentvisor::ports::audit::{
    AuditEntry, AuditRecord, AuditStore, RunFilter, RunIndex, RunSummary,
};
use agentvisor::ports::retention::{PruneReport, Retention};
use agentvisor::stores::SqliteStore;
use agentvisor::{RunId, RunResult, RunStatus};

use super::tree::{Node, Tree};
use super::Db;

/// Flags of `agentvisor runs`.
#[derive(Args, Debug)]
pub(crate) struct RunsArgs {
    /// Talk to this server instead of reading the database (`runs list`,
    /// `runs show`; the commands to a run in flight need it); the token
    /// comes from `AGENTVISOR_TOKEN`.
    #[arg(long, global = true, env = "AGENTVISOR_URL", value_name = "URL")]
    pub(super) server: Option<String>,
    #[command(subcommand)]
    pub(super) command: RunsCommand,
}

#[derive(Subcommand, Debug)]
pub(super) enum RunsCommand {
    /// List finished runs, the most recent first.
    List(ListArgs),
    /// Show one run: its result, then every audit record in order.
    Show(ShowArgs),
    /// Prune the oldest finished runs a retention policy does not keep
    /// (`--retain max_age=7d,max_runs=N,max_bytes=SIZE`); `--dry-run`
    /// says what would go. Runs in flight, checkpointed or waiting for
    /// approval stay.
    Prune(PruneArgs),
    /// Commands to a run in flight on a server (`--server`): kill, steer,
    /// extend, cancel, approve, deny.
    #[command(flatten)]
    Control(ControlCommand),
}

/// Commands to a run on a server.
#[derive(Subcommand, Debug)]
pub(crate) enum ControlCommand {
    /// Kill a run (status `killed`, reason `operator`).
    Kill {
        /// The run id.
        run_id: String,
    },
    /// Cancel a run (status `cancelled`).
    Cancel {
        /// The run id.
        run_id: String,
    },
    /// Inject a message before the run's next model call.
    Steer {
        /// The run id.
        run_id: String,
        /// The message.
        text: String,
    },
    /// Push the run's hard deadline back (`30s`, `5m`, or seconds).
    Extend {
        /// The run id.
        run_id: String,
        /// By how long (`30s`, `5m`, or seconds; at most 24h).
        #[arg(allow_hyphen_values = true, value_parser = super::flags::extend_by)]
        by: f64,
    },
    /// Approve the tool calls a run waits to have approved (they run).
    Approve {
        /// The run id.
        run_id: String,
        /// Only this call (its id, as `runs show` or the run's
        /// `approval.requested` event gives it); default: every waiting call.
        #[arg(long, value_name = "CALL_ID")]
        call: Option<String>,
    },
    /// Deny the tool calls a run waits to have approved (the model reads
    /// the reason as their result).
    Deny {
        /// The run id.
        run_id: String,
        /// Only this call; default: every waiting call.
        #[arg(long, value_name = "CALL_ID")]
        call: Option<String>,
        /// Why (the model reads it).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Args, Debug)]
pub(super) struct ListArgs {
    /// Only runs with this status (ok, error, timeout, killed, budget_exceeded, cancelled, rejected, dry_run).
    #[arg(long, value_name = "S", value_parser = parse_status)]
    pub(super) status: Option<RunStatus>,
    /// Only runs of this caller.
    #[arg(long, value_name = "C")]
    pub(super) caller: Option<String>,
    /// Only the runs of this tree: the run, its sub-agent runs at any
    /// depth (or a pipeline's phases and theirs).
    #[arg(long, value_name = "ID")]
    pub(super) root: Option<String>,
    /// At most this many runs.
    #[arg(long, value_name = "N", default_value_t = 20, allow_hyphen_values = true, value_parser = super::flags::whole_u32(1, super::flags::MAX_LIST as u32))]
    pub(super) limit: u32,
    /// Print one JSON array.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ShowArgs {
    /// The run id (32 hex digits, as `runs list` prints it).
    pub(super) run_id: String,
    /// Print `{"result": …, "records": […]}` (with `--tree`, the tree).
    #[arg(long)]
    pub(super) json: bool,
    /// Print the run's tree instead: the run and its sub-agent runs, each
    /// with its status, reason, tokens and time.
    #[arg(long)]
    pub(super) tree: bool,
}

#[derive(Args, Debug)]
pub(super) struct PruneArgs {
    /// The policy: any of `max_age=DURATION` (`7d`, `12h`), `max_runs=N`,
    /// `max_bytes=SIZE` (`500MB`, `2GiB`), comma-separated. Without it,
    /// nothing is pruned (`--vacuum` alone rewrites the file).
    #[arg(long, value_name = "POLICY", value_parser = retain_flag)]
    pub(super) retain: Option<Retention>,
    /// Say what would be pruned; remove nothing.
    #[arg(long)]
    pub(super) dry_run: bool,
    /// Then rewrite the whole file (`VACUUM`) so it shrinks, and so a file
    /// created before pruning existed shrinks as runs are pruned from then
    /// on. Takes the database's write lock while it runs.
    #[arg(long)]
    pub(super) vacuum: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

fn retain_flag(s: &str) -> Result<Retention, String> {
    s.parse::<Retention>().map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct Shown<'a> {
    result: Option<&'a RunResult>,
    records: &'a [AuditRecord],
    /// A scheduled skill's publishes and their outcomes (the outbox).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    publish: &'a [agentvisor::ports::outbox::DeliveryReport],
}

fn parse_status(s: &str) -> Result<RunStatus, String> {
    s.parse()
        .map_err(|e: agentvisor::ports::run::UnknownStatus| e.to_string())
}

pub(crate) async fn runs(a: RunsArgs, db: &Db) -> ExitCode {
    if let RunsCommand::Control(c) = a.command {
        return match c {
            ControlCommand::Approve { .. } | ControlCommand::Deny { .. } => {
                decide_on_record(c, db).await
            }
            _ => super::refuse(
                "a run in flight lives in its server's process: give --server URL (or AGENTVISOR_URL)",
            ),
        };
    }
    if *db == Db::Memory {
        return super::refuse("--db :memory: keeps no run history; name a database file");
    }
    if let (RunsCommand::Prune(_), Db::Postgres(_)) = (&a.command, db) {
        return super::not_on_postgres("runs prune");
    }
    let opened = match super::open_existing(db).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some((audit, index)) = opened.history() else {
        return ExitCode::from(2);
    };
    let history = History {
        audit,
        index,
        name: opened.name(),
    };
    let code = match (a.command, &opened) {
        (RunsCommand::List(l), _) => list(&history, l).await,
        (RunsCommand::Show(s), _) => show(&history, s).await,
        (RunsCommand::Prune(p), super::Opened::Sqlite(store)) => prune(store, p).await,
        (RunsCommand::Prune(_), _) => super::not_on_postgres("runs prune"),
        (RunsCommand::Control(_), _) => ExitCode::from(2),
    };
    drop(history);
    opened.close().await;
    code
}

/// The run history `runs list|show` read: the database's audit log and run
/// index, and its name for messages.
struct History {
    audit: std::sync::Arc<dyn AuditStore>,
    index: std::sync::Arc<dyn RunIndex>,
    name: String,
}

/// `runs approve|deny ID` against the database: the decision is recorded
/// on the parked run's checkpoint (see the module doc).
async fn decide_on_record(c: ControlCommand, db: &Db) -> ExitCode {
    let (run_id, call, approve, reason) = match c {
        ControlCommand::Approve { run_id, call } => (run_id, call, true, None),
        ControlCommand::Deny {
            run_id,
            call,
            reason,
        } => (run_id, call, false, reason),
        _ => return ExitCode::from(2),
    };
    if *db == Db::Memory {
        return super::refuse(
            "--db :memory: keeps no parked run: name a database file, or give --server URL",
        );
    }
    let id = match parse_run_id(&run_id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let opened = match super::open_existing(db).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some(checkpointer) = opened.checkpointer() else {
        return ExitCode::from(2);
    };
    let decided =
        agentvisor::decide_on_record(&*checkpointer, id, call.as_deref(), approve, reason).await;
    drop(checkpointer);
    opened.close().await;
    let action = if approve { "approve" } else { "deny" };
    match decided {
        Ok(calls) => {
            outln!("{action}: recorded for run {id}; it applies when the run is resumed (agentvisor recover, or serve)");
            for c in calls {
                outln!("  {} {}({})", c.call_id, c.tool, c.arguments);
            }
            ExitCode::SUCCESS
        }
        Err(e @ agentvisor::RecordDecisionError::HeldBy { .. }) => {
            errln!("error: {e} (give --server URL)");
            ExitCode::from(1)
        }
        Err(e) => {
            errln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// A run id as the user gave it (32 hex digits), or the refusal.
pub(super) fn parse_run_id(text: &str) -> Result<RunId, ExitCode> {
    match text.parse() {
        Ok(id) if text.len() == 32 => Ok(id),
        _ => Err(super::refuse(format!(
            "`{text}` is not a run id (32 hex digits, as `agentvisor runs list` prints them)"
        ))),
    }
}

async fn list(store: &History, a: ListArgs) -> ExitCode {
    let root = match a.root.as_deref().map(parse_run_id).transpose() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let filter = RunFilter {
        status: a.status,
        caller: a.caller,
        limit: Some(a.limit),
        root,
        after: None,
    };
    let runs = match store.index.list_runs(&filter).await {
        Ok(r) => r,
        Err(e) => return super::refuse(format!("{}: {e}", store.name)),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&runs).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if runs.is_empty() {
        outln!("no runs in {}", store.name);
        return ExitCode::SUCCESS;
    }
    outln!(
        "{:<32}  {:<20}  {:<16}  {:<12}  {:<20}  {:>8}",
        "RUN_ID",
        "STATUS",
        "AGENT",
        "CALLER",
        "FINISHED (UTC)",
        "MS"
    );
    for r in &runs {
        outln!(
            "{:<32}  {:<20}  {:<16}  {:<12}  {:<20}  {:>8}",
            r.run_id,
            status_text(r),
            r.agent,
            r.caller_id.as_deref().unwrap_or("-"),
            utc(r.finished_at),
            r.duration_ms()
        );
    }
    ExitCode::SUCCESS
}

/// `runs prune`: batches until the policy is met (a dry run: one look at
/// what the first batches would take), then the report.
async fn prune(store: &SqliteStore, a: PruneArgs) -> ExitCode {
    let fail = |e: agentvisor::ports::audit::AuditStoreError| {
        super::refuse(format!("{}: {e}", store.path().display()))
    };
    let mut total = PruneReport {
        dry_run: a.dry_run,
        ..PruneReport::default()
    };
    if let Some(retention) = a.retain {
        let now = agentvisor::ports::run::unix_ms();
        let batch = if a.dry_run { 1_000_000 } else { 1000 };
        loop {
            let report = match store.prune(&retention, now, batch, a.dry_run).await {
                Ok(r) => r,
                Err(e) => return fail(e),
            };
            if total.bytes_before == 0 {
                total.bytes_before = report.bytes_before;
            }
            total.bytes_after = report.bytes_after;
            total.merge(&report);
            total.more = report.more;
            if a.dry_run || !report.more || report.runs == 0 {
                break;
            }
        }
    }
    if a.vacuum && !a.dry_run {
        if let Err(e) = store.vacuum().await {
            return fail(e);
        }
        if let Ok(fp) = store.footprint().await {
            total.bytes_after = fp.used_bytes();
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string(&total).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    outln!(
        "{} {} run(s) ({} record(s)){}",
        if a.dry_run { "would prune" } else { "pruned" },
        total.runs,
        total.records,
        if total.more && a.dry_run {
            ", and more after them"
        } else {
            ""
        }
    );
    for c in &total.by {
        outln!("  {:<16}  {:<16}  {:>8}", c.agent, c.status, c.runs);
    }
    outln!(
        "database: {} bytes in use before, {} after",
        total.bytes_before,
        total.bytes_after
    );
    if let Ok(fp) = store.footprint().await {
        if !fp.shrinks() {
            outln!("note: this file was created without incremental auto-vacuum: pruned pages are reused but the file does not shrink; `runs prune --vacuum` rewrites it once so it does");
        }
    }
    ExitCode::SUCCESS
}

async fn show(store: &History, a: ShowArgs) -> ExitCode {
    let run_id = match parse_run_id(&a.run_id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let fail = |e: agentvisor::ports::audit::AuditStoreError| {
        super::refuse(format!("{}: {e}", store.name))
    };
    if a.tree {
        return match tree_of(store, run_id).await {
            Ok(tree) if tree.is_empty() => {
                errln!("error: no run {run_id} in {}", store.name);
                ExitCode::from(1)
            }
            Ok(tree) => {
                print_tree(&tree, a.json);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        };
    }
    let result = match store.index.run_result(run_id).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let records = match store.audit.run_records(run_id).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if result.is_none() && records.is_empty() {
        errln!("error: no run {run_id} in {}", store.name);
        return ExitCode::from(1);
    }
    // A scheduled skill's publishes, where the store keeps an outbox.
    let publish: Vec<agentvisor::ports::outbox::DeliveryReport> = match store.audit.clone().outbox()
    {
        Some(outbox) => match outbox.run_intents(run_id).await {
            Ok(all) => all.into_iter().map(|(_, r)| r).collect(),
            Err(e) => return super::refuse(format!("{}: {e}", store.name)),
        },
        None => Vec::new(),
    };
    if a.json {
        let shown = Shown {
            result: result.as_ref(),
            records: &records,
            publish: &publish,
        };
        outln!("{}", serde_json::to_string(&shown).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    match &result {
        Some(r) => super::run::print_human(r),
        None => outln!("run {run_id}: no terminal record yet (still running, or interrupted)"),
    }
    outln!("records:");
    for r in &records {
        let seq = if r.seq == u32::MAX {
            "end".to_string()
        } else {
            r.seq.to_string()
        };
        let at = utc(r.at_ms);
        let time = at.split_once(' ').map(|(_, t)| t).unwrap_or(&at);
        outln!(
            "  {seq:>4}  {time}.{:03}  {}",
            r.at_ms % 1000,
            describe(&r.entry)
        );
    }
    if !publish.is_empty() {
        outln!("publishes:");
        for p in &publish {
            let more = p
                .error
                .as_deref()
                .or(p.detail.as_deref())
                .map(|t| format!(": {t}"))
                .unwrap_or_default();
            outln!(
                "  {} ({} {}): {} after {} tr{}{more}",
                p.name,
                p.kind,
                p.target,
                p.state.as_str(),
                p.attempts,
                if p.attempts == 1 { "y" } else { "ies" }
            );
        }
    }
    ExitCode::SUCCESS
}

/// The tree `run_id` is the top of (or, for a pipeline's id, its phases'),
/// from the run index: the tree's runs, then each one's result for its
/// tokens.
async fn tree_of(
    store: &History,
    run_id: RunId,
) -> Result<Tree, agentvisor::ports::audit::AuditStoreError> {
    // The whole tree it is in, then its own part of it.
    let root = store
        .index
        .run_result(run_id)
        .await?
        .and_then(|r| r.root_run_id)
        .unwrap_or(run_id);
    let filter = RunFilter {
        root: Some(root),
        ..RunFilter::default()
    };
    let mut nodes = Vec::new();
    for s in store.index.list_runs(&filter).await? {
        let (tokens, cost_micros) = match store.index.run_result(s.run_id).await? {
            Some(r) => (r.usage.total(), r.cost_micros),
            None => (0, 0),
        };
        nodes.push(Node {
            run_id: s.run_id,
            parent_run_id: s.parent_run_id,
            agent: s.agent.clone(),
            status: s.status.to_string(),
            kill_reason: s.kill_reason.map(|k| k.to_string()),
            error_kind: s.error_kind.clone(),
            tokens,
            cost_micros,
            started_at: s.started_at,
            duration_ms: s.duration_ms(),
        });
    }
    Ok(Tree::new(run_id, nodes))
}

/// Prints a tree (see `tree`).
pub(super) fn print_tree(tree: &Tree, json: bool) {
    if json {
        outln!("{}", tree.json());
        return;
    }
    for line in tree.lines() {
        outln!("{line}");
    }
}

fn status_text(r: &RunSummary) -> String {
    match r.kill_reason {
        Some(k) => format!("{} ({k})", r.status),
        None => r.status.to_string(),
    }
}

/// One line per record: its kind, then its JSON (capped).
pub(super) fn describe(entry: &AuditEntry) -> String {
    let (kind, body) = match entry {
        AuditEntry::RunStarted(info) => (
            "run.start".to_string(),
            serde_json::to_string(info).unwrap_or_default(),
        ),
        AuditEntry::Event(ev) => {
            let json = serde_json::to_string(ev).unwrap_or_default();
            // `{"type":"tool.call","iteration":1,…}` → `tool.call {"iteration":1,…}`
            match json
                .strip_prefix("{\"type\":\"")
                .and_then(|rest| rest.split_once('"'))
            {
                Some((kind, rest)) => (
                    kind.to_string(),
                    format!("{{{}", rest.strip_prefix(',').unwrap_or(rest)),
                ),
                None => ("event".to_string(), json),
            }
        }
        AuditEntry::Publish(intents) => {
            // Destinations as shown (redacted), never their targets.
            let shown: Vec<String> = intents
                .iter()
                .map(|i| format!("{} ({} {})", i.name, i.kind, i.shown))
                .collect();
            ("publish".to_string(), shown.join(", "))
        }
        AuditEntry::Terminal(res) => {
            let reason = res
                .kill_reason
                .map(|k| format!(" ({k})"))
                .unwrap_or_default();
            return format!(
                "run.end {}{reason}, {} iterations",
                res.status, res.iterations
            );
        }
    };
    format!("{kind} {}", agentvisor::ports::run::cap_text(&body, 160))
}

/// Unix ms as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(super) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_unix_ms() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20");
    }

    #[test]
    fn statuses_parse_by_their_names() {
        assert_eq!(
            parse_status("budget_exceeded"),
            Ok(RunStatus::BudgetExceeded)
        );
        assert!(parse_status("nope").is_err());
    }
}
