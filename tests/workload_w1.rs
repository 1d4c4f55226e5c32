//! The W1 workload the benches and `examples/w1.rs` measure with
//! (`benches/support/workload.rs`): its manifest, both engines finishing
//! every run, engine names.

use std::time::Duration;

use workload::{run_engine, w1_spec, Engine, Settings};

#[path = "../benches/support/workload.rs"]
#[allow(dead_code)]
mod workload;

#[test]
fn w1_spec_sets_latency_on_every_call() {
    let spec = w1_spec(Duration::from_millis(5)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.script.len(), 3);
    assert!(spec
        .script
        .iter()
        .all(|e| e.latency == Some(Duration::from_millis(5))));
    let spec = w1_spec(Duration::ZERO).unwrap_or_else(|e| panic!("{e}"));
    assert!(spec.script.iter().all(|e| e.latency.is_none()));
}

#[tokio::test]
async fn floor_and_agentvisor_finish_every_w1_run() {
    let settings = Settings {
        runs: 50,
        concurrency: 8,
        latency: Duration::ZERO,
    };
    for engine in [Engine::Floor, Engine::Agentvisor] {
        let f = run_engine(engine, settings, agentvisor::Host::builder())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.engine, f.runs, f.ok), (engine, 50, 50));
    }
}

#[test]
fn engine_names_round_trip() {
    for e in [Engine::Floor, Engine::Agentvisor] {
        assert_eq!(e.as_str().parse::<Engine>(), Ok(e));
    }
    assert!("tokio".parse::<Engine>().is_err());
}
