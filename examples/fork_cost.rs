//! Run with: cargo run --release --example fork_cost
//!
//! What a fork costs before its live part: a read of K recorded steps, not
//! K model calls. Settings: in-memory stores, the scripted model with a
//! `latency` of 20 ms per call (a stand-in for a model's answer time), a
//! recorded run of K = 20 tool steps and an answer. Measured in the same
//! process:
//!
//! - `recorded`: the recorded run itself (21 model calls of 20 ms);
//! - `fork@K`: a fork at K = 20 whose live part is one 20 ms answer;
//! - `prefix`: a fork at K = 20 whose live answer costs nothing (the
//!   cost of reading the recording and replaying its 20 steps through the
//!   agent loop), as a total and per step;
//! - `bare`: the same 21-step run with no latency (the agent loop's own
//!   cost, the baseline the prefix is compared with).
//!
//! Each figure is the median of 15 rounds.

use std::time::{Duration, Instant};

use agentvisor::fork::{fork, ForkOptions, Recording};
use agentvisor::ports::audit::AuditStore;
use agentvisor::stores::MemoryAuditStore;
use agentvisor::{AgentSpec, Host, Invocation};

const K: u32 = 20;
const ROUNDS: usize = 15;

fn script(latency: &str) -> String {
    let mut s = String::from("name: costed\nmodel: scripted\ntools: [add]\nlimits: { max_iterations: 50 }\ncritic: { loops: off }\nscript:\n");
    for i in 0..K {
        s.push_str(&format!(
            "  - {{ tool: add, args: {{ a: {i}, b: 1 }}, latency: {latency} }}\n"
        ));
    }
    s.push_str(&format!("  - {{ text: done, latency: {latency} }}\n"));
    s
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = std::sync::Arc::new(MemoryAuditStore::new());
    let host = Host::builder().audit_store(store.clone()).build().await?;
    let slow = AgentSpec::from_yaml(&script("20ms"))?;
    let bare_spec = AgentSpec::from_yaml(&script("0ms"))?;
    let (mut recorded, mut forked, mut prefix, mut bare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let r = host
            .submit(slow.clone(), Invocation::prompt("go"))
            .await?
            .await;
        recorded.push(t.elapsed());
        assert_eq!(r.status.as_str(), "ok");

        let t = Instant::now();
        let b = host
            .submit(bare_spec.clone(), Invocation::prompt("go"))
            .await?
            .await;
        bare.push(t.elapsed());
        assert_eq!(b.status.as_str(), "ok");

        let records = store.run_records(r.run_id).await?;
        for (spec, out) in [(&slow, &mut forked), (&bare_spec, &mut prefix)] {
            let t = Instant::now();
            let recording = Recording::from_records(r.run_id, &records)?;
            let options = ForkOptions {
                at_step: K,
                ..Default::default()
            };
            let run = fork(&host, spec.clone(), &recording, options).await?;
            let outcome = run.finish().await;
            out.push(t.elapsed());
            assert_eq!(outcome.result.status.as_str(), "ok");
            assert!(outcome.divergence.is_none());
        }
    }
    let (recorded, forked, prefix, bare) = (
        median(recorded),
        median(forked),
        median(prefix),
        median(bare),
    );
    println!("K = {K} steps, 20 ms a model call, median of {ROUNDS} rounds");
    println!("recorded run (21 calls) : {recorded:>10.2?}");
    println!(
        "fork at K (1 live call) : {forked:>10.2?}  ({:.3}× the recorded run)",
        forked.as_secs_f64() / recorded.as_secs_f64()
    );
    println!(
        "prefix (0 ms live call) : {prefix:>10.2?}  ({:.1?} a step; {:.2}× the bare 21-step run)",
        prefix / (K + 1),
        prefix.as_secs_f64() / bare.as_secs_f64()
    );
    println!("bare run (0 ms a call)  : {bare:>10.2?}");
    host.shutdown().await;
    Ok(())
}
