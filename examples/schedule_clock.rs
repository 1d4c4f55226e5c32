//! Run with: cargo run --release --example schedule_clock
//!
//! The schedules of examples/skills across a daylight-saving change, then
//! what working out a next fire costs: 1 000 schedules (five crons, in
//! Europe/Oslo, with jitter) asked for their next fire on the night clocks
//! spring forward, against the floor of the same loop that only converts
//! the instant to wall-clock time. A scheduler that wakes once a minute
//! for 1 000 schedules pays this cost once a minute.

use std::time::{Duration, Instant};

use agentvisor::skills::{jitter_offset, time_zone, Cron, ScheduleClock, SkillsRepo, Timestamp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repo = SkillsRepo::open("examples/skills")?;
    let spring: Timestamp = "2026-03-28T12:00:00Z".parse()?;
    for s in &repo.schedules {
        let mut at = spring;
        let mut fires = Vec::new();
        for _ in 0..3 {
            match s.next_fire(at) {
                Some(next) => {
                    fires.push(
                        next.to_zoned_datetime(s.clock.time_zone().clone())
                            .to_string(),
                    );
                    at = next;
                }
                None => break,
            }
        }
        println!(
            "{:<15} {:<22} {}",
            s.name,
            s.clock.cron().as_str(),
            fires.join("  ")
        );
    }

    let tz = time_zone("Europe/Oslo")?;
    let crons = [
        "* * * * *",
        "0 * * * *",
        "30 7 * * mon-fri",
        "*/15 9-17 * * 1-5",
        "0 0 29 2 *",
    ];
    let clocks = (0..1000)
        .map(|i| {
            let cron = Cron::parse(crons[i % crons.len()])?;
            let offset = jitter_offset(&format!("schedule-{i}"), Duration::from_secs(300));
            Ok(ScheduleClock::new(cron, tz.clone(), offset))
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    let night: Timestamp = "2026-03-29T00:30:00Z".parse()?;
    let rounds = 100;
    let start = Instant::now();
    let mut found = 0u64;
    for _ in 0..rounds {
        for c in &clocks {
            found += u64::from(std::hint::black_box(c.next_fire(night)).is_some());
        }
    }
    let clock = start.elapsed();
    let start = Instant::now();
    for _ in 0..rounds {
        for c in &clocks {
            std::hint::black_box(c.time_zone().to_datetime(night));
        }
    }
    let floor = start.elapsed();
    let per = clock.as_secs_f64() / (rounds * clocks.len()) as f64;
    println!(
        "next_fire: {found} calls, {:.2} µs each; {:.1}× the floor (wall-clock conversion, {:.3} µs); 1 000 schedules once a minute: {:.4} % of a core",
        per * 1e6,
        clock.as_secs_f64() / floor.as_secs_f64().max(1e-12),
        floor.as_secs_f64() / (rounds * clocks.len()) as f64 * 1e6,
        per * 1000.0 / 60.0 * 100.0
    );
    Ok(())
}
