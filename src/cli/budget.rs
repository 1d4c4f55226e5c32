//! `agentvisor budget`: the persistent per-caller limits in the database's
//! ledger, which every later `run` and `swarm` on that database holds to
//! (unless it brings its own allowance with `--budget-tokens`).
//!
//! - `budget set CALLER [--tokens N] [--cost-micros N] [--runtime SECS]
//!   [--concurrent N] [--window DURATION]` changes the limits it is given
//!   and keeps the others; `none` removes one.
//! - `budget show [CALLER] [--json]` prints the caller's limits and what it
//!   spent within its window (every caller with limits of its own when none
//!   is named).
//!
//! Exit codes: 0 done, 2 refused input (a bad value, `--db :memory:`, a
//! database that cannot be used).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;

use agentvisor::ports::budget::{BudgetLedger, BudgetLimits, Spend};
use agentvisor::spec::{format_duration, parse_duration};

use super::{Db, Named};

/// The database's ledger.
type Ledger = Named<dyn BudgetLedger>;

/// The window a caller without one of its own is counted over (the host's
/// default, `HostConfig::budget_window`).
const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The longest window a caller may have (31 days).
const MAX_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);

/// Flags of `agentvisor budget`.
#[derive(Args, Debug)]
pub(crate) struct BudgetArgs {
    #[command(subcommand)]
    command: BudgetCommand,
}

#[derive(Subcommand, Debug)]
enum BudgetCommand {
    /// Set a caller's limits (the flags given; `none` removes a limit).
    Set(SetArgs),
    /// Show a caller's limits and spend in its window (all callers with
    /// limits of their own when none is named).
    Show(ShowArgs),
}

/// A limit as written on the command line: a number, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    Set(u64),
    Unset,
}

fn limit(max: u64) -> impl Fn(&str) -> Result<Limit, String> + Clone {
    move |s: &str| {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Limit::Unset);
        }
        match s.parse::<u64>() {
            Ok(n) if n <= max => Ok(Limit::Set(n)),
            _ => Err(format!("use a whole number from 0 to {max}, or `none`")),
        }
    }
}

fn runtime(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unset);
    }
    match parse_duration(s) {
        Ok(d) if d <= MAX_WINDOW => Ok(Limit::Set(d.as_secs())),
        _ => Err("use a duration from 0 to 31 days (e.g. 90s, 10m), or `none`".into()),
    }
}

fn window(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unset);
    }
    match parse_duration(s) {
        Ok(d) if d >= Duration::from_secs(1) && d <= MAX_WINDOW => Ok(Limit::Set(d.as_secs())),
        _ => Err("use a duration from 1s to 31 days (e.g. 1h, 24h), or `none`".into()),
    }
}

#[derive(Args, Debug)]
struct SetArgs {
    /// The caller id (as `run --caller` names it; `swarm` runs as `swarm`).
    caller: String,
    /// Input + output tokens per window.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = limit(u64::MAX))]
    tokens: Option<Limit>,
    /// Cost per window, in micro-dollars.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = limit(u64::MAX))]
    cost_micros: Option<Limit>,
    /// Run time per window (seconds, or a duration: 90s, 10m).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, value_parser = runtime)]
    runtime: Option<Limit>,
    /// Runs in flight at once.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = limit(u64::from(u32::MAX)))]
    concurrent: Option<Limit>,
    /// The window spend is counted over (default 24h).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = window)]
    window: Option<Limit>,
}

#[derive(Args, Debug)]
struct ShowArgs {
    /// The caller (default: every caller with limits of its own).
    caller: Option<String>,
    /// Print JSON: one object for a caller, an array for all.
    #[arg(long)]
    json: bool,
}

/// One caller's limits and spend, as `budget show` prints them.
#[derive(Serialize)]
struct Shown {
    caller: String,
    limits: BudgetLimits,
    window_secs: u64,
    spent: Spend,
}

pub(crate) async fn budget(a: BudgetArgs, db: &Db) -> ExitCode {
    if *db == Db::Memory {
        return super::refuse(
            "--db :memory: keeps no budgets between processes; name a database file",
        );
    }
    let opened = match &a.command {
        BudgetCommand::Set(_) => super::open(db).await,
        BudgetCommand::Show(_) => super::open_existing(db).await,
    };
    let opened = match opened {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some(store) = opened.ledger() else {
        return ExitCode::from(2);
    };
    let code = match a.command {
        BudgetCommand::Set(s) => set(&store, s).await,
        BudgetCommand::Show(s) => show(&store, s).await,
    };
    opened.close().await;
    code
}

fn apply<T>(field: &mut Option<T>, given: Option<Limit>, make: impl Fn(u64) -> T) {
    match given {
        Some(Limit::Set(n)) => *field = Some(make(n)),
        Some(Limit::Unset) => *field = None,
        None => {}
    }
}

async fn set(store: &Ledger, a: SetArgs) -> ExitCode {
    if a.caller.trim().is_empty() {
        return super::refuse("the caller id must not be empty");
    }
    let mut limits = match own_limits(store, &a.caller).await {
        Ok(l) => l.unwrap_or_default(),
        Err(code) => return code,
    };
    apply(&mut limits.tokens, a.tokens, |n| n);
    apply(&mut limits.cost_micros, a.cost_micros, |n| n);
    apply(&mut limits.runtime_secs, a.runtime, |n| n);
    apply(&mut limits.concurrent_runs, a.concurrent, |n| {
        u32::try_from(n).unwrap_or(u32::MAX)
    });
    apply(&mut limits.window_secs, a.window, |n| n);
    if let Err(e) = store.set_limits(&a.caller, limits).await {
        return super::refuse(format!("{}: {e}", store.name));
    }
    match shown(store, &a.caller, limits).await {
        Ok(s) => print_human(&s),
        Err(code) => return code,
    }
    ExitCode::SUCCESS
}

/// The caller's own limits (`None`: it has none of its own).
async fn own_limits(store: &Ledger, caller: &str) -> Result<Option<BudgetLimits>, ExitCode> {
    let all = store
        .list_limits()
        .await
        .map_err(|e| super::refuse(format!("{}: {e}", store.name)))?;
    Ok(all.into_iter().find(|(c, _)| c == caller).map(|(_, l)| l))
}

async fn shown(store: &Ledger, caller: &str, limits: BudgetLimits) -> Result<Shown, ExitCode> {
    let window = limits
        .window_secs
        .map_or(DEFAULT_WINDOW, Duration::from_secs);
    let spent = store
        .spent(caller, window)
        .await
        .map_err(|e| super::refuse(format!("{}: {e}", store.name)))?;
    Ok(Shown {
        caller: caller.to_string(),
        limits,
        window_secs: window.as_secs(),
        spent,
    })
}

async fn show(store: &Ledger, a: ShowArgs) -> ExitCode {
    let callers: Vec<(String, BudgetLimits)> = match &a.caller {
        Some(c) => match own_limits(store, c).await {
            Ok(l) => vec![(c.clone(), l.unwrap_or_default())],
            Err(code) => return code,
        },
        None => match store.list_limits().await {
            Ok(all) => all,
            Err(e) => return super::refuse(format!("{}: {e}", store.name)),
        },
    };
    let mut out = Vec::with_capacity(callers.len());
    for (caller, limits) in callers {
        match shown(store, &caller, limits).await {
            Ok(s) => out.push(s),
            Err(code) => return code,
        }
    }
    if a.json {
        let text = match (&a.caller, out.first()) {
            (Some(_), Some(one)) => serde_json::to_string(one),
            _ => serde_json::to_string(&out),
        };
        outln!("{}", text.unwrap_or_default());
    } else if out.is_empty() {
        outln!("no caller has limits in {}", store.name);
    } else {
        for s in &out {
            print_human(s);
        }
    }
    ExitCode::SUCCESS
}

fn print_human(s: &Shown) {
    let l = &s.limits;
    let of = |v: Option<u64>| v.map_or("none".to_string(), |n| n.to_string());
    outln!(
        "{}: window {}, {} runs in it",
        s.caller,
        format_duration(Duration::from_secs(s.window_secs)),
        s.spent.runs
    );
    outln!("  tokens       {} of {}", s.spent.tokens, of(l.tokens));
    outln!(
        "  cost_micros  {} of {}",
        s.spent.cost_micros,
        of(l.cost_micros)
    );
    outln!(
        "  runtime      {} s of {}",
        s.spent.runtime_ms / 1000,
        l.runtime_secs
            .map_or("none".to_string(), |n| format!("{n} s"))
    );
    outln!(
        "  concurrent   {}",
        l.concurrent_runs
            .map_or("none".to_string(), |n| n.to_string())
    );
}
