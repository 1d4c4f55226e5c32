#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The soak engine as library code, on paused time: a soak of the soak
//! manifest (three model calls of 10 ms each, so 30 ms a run) starts
//! exactly as many runs as fit in its duration, records one terminal record
//! per run and judges a one-second soak too short for an RSS verdict (no
//! failure); with chaos, every status is explained by a fault injected and
//! every hang is reaped; a stopped soak starts nothing more.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::providers::chaos::{ChaosConfig, ChaosModel};
use agentvisor::providers::ScriptedModel;
use agentvisor::soak::{Report, RssOutcome, Settings, Soak, SoakPlan};
use agentvisor::{Agent, AgentSpec, Host};

fn soak_spec() -> AgentSpec {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/soak.yaml");
    AgentSpec::from_file(path).unwrap()
}

fn settings(host: &Host, agent: &Agent, duration: Duration, concurrency: u64) -> Settings {
    Settings {
        file: "examples/agents/soak.yaml".into(),
        agent: agent.name().to_string(),
        model: agent.model().name().to_string(),
        duration_s: duration.as_secs_f64(),
        concurrency,
        chaos_rate: None,
        seed: 1,
        slow_ms: None,
        stall_timeout_ms: agent.limits().stall_timeout.as_millis() as u64,
        db: ":memory:".into(),
        critic_shards: host.config().critic_shards,
        retain: None,
    }
}

/// Runs a soak to its end and judges it.
async fn soak(
    host: &Host,
    agent: &Agent,
    duration: Duration,
    concurrency: u64,
    chaos: Option<&ChaosModel>,
) -> Report {
    let plan = SoakPlan::new(agent, duration, concurrency);
    let mut seen = Vec::new();
    let soaked = Soak::start(host, agent, plan)
        .finish(host, |s| seen.push(s.clone()))
        .await;
    assert_eq!(seen, soaked.series, "on_sample sees every sample");
    let max_tool_errors = agent.limits().max_tool_errors;
    Report::new(
        settings(host, agent, duration, concurrency),
        soaked,
        chaos.map(|c| c.counts()),
        max_tool_errors,
    )
}

#[tokio::test(start_paused = true)]
async fn a_soak_starts_every_run_that_fits_and_records_each_once() {
    let (host, _) = support::host().await;
    let agent = host.agent(soak_spec()).unwrap();
    let r = soak(&host, &agent, Duration::from_secs(1), 5, None).await;

    // Each worker starts a run at 0, 30, …, 990 ms: 34 runs, the last
    // ending at 1020 ms.
    let m = &r.summary;
    assert_eq!(m.runs_submitted, 34 * 5);
    assert_eq!(m.runs_finished, m.runs_submitted);
    assert_eq!(m.submit_errors, 0);
    assert_eq!(m.by_status.get("ok"), Some(&170));
    assert_eq!(m.by_status.len(), 1, "{:?}", m.by_status);
    assert_eq!(m.audit.terminal_records, 170);
    assert!(!m.drain_timed_out);
    assert_eq!(m.elapsed_s, 1.0);
    assert_eq!(m.drain_s, 0.02);
    // Every run took 30 ms: the histogram's bucket is within 1.6 % of it.
    assert_eq!(m.max_ms, 30.0);
    assert!((m.p50_ms / 30.0 - 1.0).abs() < 0.016, "{}", m.p50_ms);
    assert_eq!(m.p99_ms, m.p50_ms);

    // A sample at 1 s, and one when the last worker ended.
    let series = r.series.as_ref().unwrap();
    let at: Vec<(f64, &str, u64)> = series
        .iter()
        .map(|s| (s.t_s, s.phase, s.completed))
        .collect();
    assert_eq!(at, [(1.0, "run", 165), (1.02, "run", 5)]);
    assert_eq!(series[0].live_runs, 5);
    assert_eq!(series[0].live_actors, 5 + 3 + 2);
    assert!(series.iter().all(|s| s.rss_bytes > 0 && s.open_fds > 0));
    assert_eq!(series[1].statuses, m.by_status);

    let v = &r.verdict;
    assert!(v.pass, "{v:?}");
    assert_eq!(v.rss.outcome, RssOutcome::TooShort);
    assert!(v.rss.pass, "too short to judge is no failure");
    assert!(v.statuses.pass && v.terminal.pass);
    assert_eq!(v.terminal.terminal_records, 170);
}

#[tokio::test(start_paused = true)]
async fn chaos_explains_every_status_and_every_hang_is_reaped() {
    let spec = soak_spec();
    let limits = spec.limits.resolve(&Default::default());
    let chaos = Arc::new(
        ChaosModel::new(
            Arc::new(ScriptedModel::new(spec.script.clone())),
            ChaosConfig {
                rate: 0.2,
                seed: 7,
                slow: limits.stall_timeout / 5,
            },
        )
        .unwrap(),
    );
    let (host, _) = support::host_from(support::builder().model("scripted", chaos.clone())).await;
    let agent = host.agent(spec).unwrap();
    let r = soak(&host, &agent, Duration::from_secs(2), 20, Some(&chaos)).await;

    let m = &r.summary;
    let c = m.chaos.unwrap();
    assert!(
        c.hang > 0 && c.rate_limited + c.malformed + c.slow > 0,
        "{c:?}"
    );
    assert_eq!(m.runs_finished, m.runs_submitted);
    assert_eq!(m.by_status.values().sum::<u64>(), m.runs_submitted);
    let series = r.series.as_ref().unwrap();
    assert_eq!(
        series.iter().map(|s| s.completed).sum::<u64>(),
        m.runs_submitted
    );
    // A hung call is reaped `stalled` after the 2 s stall timeout: every one.
    assert_eq!(m.by_status.get("killed/stalled").copied(), Some(c.hang));
    assert!(series.iter().any(|s| s.phase == "drain"));
    let v = &r.verdict;
    assert!(v.statuses.pass, "{:?}", v.statuses);
    assert!(v.statuses.unexplained.is_empty());
    assert!(v.terminal.pass, "{:?}", v.terminal);
    assert_eq!(m.audit.terminal_records, m.runs_submitted);
    assert!(v.pass, "{v:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stopped_soak_starts_nothing_more() {
    let (host, _) = support::host().await;
    let agent = host.agent(soak_spec()).unwrap();
    let soak = Soak::start(
        &host,
        &agent,
        SoakPlan::new(&agent, Duration::from_secs(3600), 4),
    );
    soak.stopper().stop();
    let soaked = soak.finish(&host, |_| {}).await;
    assert_eq!((soaked.runs_submitted, soaked.runs_finished), (0, 0));
    assert_eq!(soaked.end_of_starts_s, 0.0);
    assert_eq!(soaked.series.len(), 1);
}
