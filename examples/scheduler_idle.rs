//! Run with: cargo run --example scheduler_idle [-- --idle-secs 40]
//! (a debug build: its figure bounds a release build's from above)
//!
//! What the scheduler costs between its ticks: 1 000 schedules that fire
//! every minute (`* * * * *`, no jitter), their state in a SQLite file
//! (as `agentvisor serve --skills` keeps it), on a multi-threaded tokio
//! runtime like the server's. Each fire goes to a runner that answers at
//! once (no model, no host: the figure is the scheduler's own). The
//! example waits for a tick to fire all 1 000 and for their states to be
//! written, then measures the process's CPU time (user + system, from
//! `/proc/self/stat`, Linux) over an idle stretch before the next tick
//! (default 40 s, shortened to end 2 s before the tick), and prints it as
//! a share of one core; then the CPU time of the next tick itself.
//!
//! The scheduler keeps one timer for all schedules: between ticks it does
//! nothing at all but look at the clock once a minute.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::schedules::{
    Fire, RunOutcome, RunReport, ScheduleRunner, Scheduler, SchedulerClock, SchedulerConfig,
};
use agentvisor::skills::{SkillsRepo, Timestamp};
use agentvisor::stores::SqliteStore;
use async_trait::async_trait;

const SCHEDULES: usize = 1_000;

/// Counts fires and answers at once.
#[derive(Default)]
struct Counting {
    fires: AtomicU64,
}

#[async_trait]
impl ScheduleRunner for Counting {
    async fn run(&self, _repo: Arc<SkillsRepo>, _fire: Fire) -> RunReport {
        self.fires.fetch_add(1, Ordering::Relaxed);
        RunReport {
            run_id: None,
            outcome: RunOutcome::Succeeded,
            tokens: 0,
            cost_micros: 0,
        }
    }

    async fn cancel(&self, _name: &str) {}
}

/// The process's user + system CPU time (Linux; clock ticks of 10 ms).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 here).
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Until the wall clock passes `at`.
async fn until(at: Timestamp) {
    let wait = at.duration_since(Timestamp::now());
    if let Ok(d) = Duration::try_from(wait) {
        tokio::time::sleep(d).await;
    }
}

/// The next whole minute after `t`.
fn next_minute(t: Timestamp) -> Timestamp {
    let s = t.as_second().div_euclid(60) * 60 + 60;
    Timestamp::from_second(s).unwrap_or(t)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idle_secs: u64 = std::env::args()
        .skip_while(|a| a != "--idle-secs")
        .nth(1)
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(40);
    if cpu_time().is_none() {
        return Err("this example reads /proc/self/stat (Linux)".into());
    }
    let dir =
        std::env::temp_dir().join(format!("agentvisor-scheduler-idle-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("skills/s"))?;
    std::fs::write(
        dir.join("skills/s/SKILL.md"),
        "---\nname: s\n---\nSay hi.\n",
    )?;
    let mut yaml = String::from(
        "skills: { s: skills/s }\ndefaults: { model: scripted, script: [{ text: hi }] }\nschedules:\n",
    );
    for i in 0..SCHEDULES {
        yaml.push_str(&format!(
            "  - {{ name: s{i:04}, skill: s, cron: \"* * * * *\" }}\n"
        ));
    }
    std::fs::write(dir.join("agentvisor.yaml"), yaml)?;
    let repo = SkillsRepo::open(&dir)?;
    let store = Arc::new(SqliteStore::open(&dir.join("state.db")).await?);
    let runner = Arc::new(Counting::default());
    let scheduler = Scheduler::start(
        repo,
        SchedulerConfig {
            store,
            runner: runner.clone(),
            ledger: None,
            clock: SchedulerClock::System,
        },
    )
    .await?;
    println!("{SCHEDULES} schedules at `* * * * *`; waiting for a tick…");

    // A tick fires all of them; wait for the runs and the state writes.
    let tick = next_minute(Timestamp::now());
    until(tick).await;
    while runner.fires.load(Ordering::Relaxed) < SCHEDULES as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scheduler.flush().await?;
    let settled = Timestamp::now();
    println!(
        "tick at {tick}: {} fires, settled {:.2} s after it",
        runner.fires.load(Ordering::Relaxed),
        settled.duration_since(tick).as_secs_f64()
    );

    // The idle stretch: up to 2 s before the next tick.
    let next = next_minute(settled);
    let room = next.duration_since(Timestamp::now()).as_secs_f64() - 2.0;
    let idle = Duration::from_secs_f64((idle_secs as f64).min(room).max(1.0));
    let (cpu0, wall0) = (cpu_time().unwrap_or_default(), Instant::now());
    let fires0 = runner.fires.load(Ordering::Relaxed);
    tokio::time::sleep(idle).await;
    let (cpu1, wall) = (cpu_time().unwrap_or_default(), wall0.elapsed());
    assert_eq!(
        runner.fires.load(Ordering::Relaxed),
        fires0,
        "no fire while idle"
    );
    let share = (cpu1 - cpu0).as_secs_f64() / wall.as_secs_f64() * 100.0;
    // One clock tick (10 ms) over the stretch: what reads as 0.
    let resolution = 0.01 / wall.as_secs_f64() * 100.0;
    println!(
        "idle: {:.3} s of CPU over {:.1} s = {share:.3} % of one core (resolution {resolution:.3} %; the bar: under 1 %)",
        (cpu1 - cpu0).as_secs_f64(),
        wall.as_secs_f64()
    );

    // The next tick itself: 1 000 fires, 1 000 reports, 2 000 state writes.
    until(next).await;
    let cpu2 = cpu_time().unwrap_or_default();
    while runner.fires.load(Ordering::Relaxed) < 2 * SCHEDULES as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scheduler.flush().await?;
    let cpu3 = cpu_time().unwrap_or_default();
    println!(
        "tick: {:.3} s of CPU for {SCHEDULES} fires and their state writes",
        (cpu3 - cpu2).as_secs_f64()
    );
    scheduler.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
