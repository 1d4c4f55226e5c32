#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What a durable run's checkpoints cost the SQLite file, by the run's
//! length: a checkpoint writes what is new since the run's last save, so
//! the bytes a run writes grow with its steps, not with their square.
//!
//! Bytes are counted by triggers added to the file: every row inserted
//! into, or updated in, a checkpoint table adds the length of all its
//! columns (SQLite rewrites a whole row when one column changes). The
//! figures are printed (`cargo test --test store_checkpoint_bytes --
//! --nocapture`).

mod support;

use std::path::Path;
use std::sync::Arc;

use agentvisor::stores::SqliteStore;
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunStatus};
use support::scratch::Scratch;

/// `steps` tool steps (the same call: the loop detector is off), then an
/// answer.
fn manifest(steps: u32) -> String {
    format!(
        "name: long\nmodel: scripted\ndurable: true\nprompt: add two and three, again and again\n\
         tools: [add]\nlimits: {{ max_iterations: 1000, max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }}\n\
         critic: {{ loops: off }}\nscript:\n  - {{ tool: add, args: {{ a: 2, b: 3 }}, repeat: {steps} }}\n  - {{ text: done }}\n"
    )
}

/// Adds the byte-counting triggers to every checkpoint table of the file.
fn count_checkpoint_bytes(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn.execute_batch(
        "CREATE TABLE measured_bytes (n BIGINT NOT NULL); INSERT INTO measured_bytes VALUES (0);",
    )
    .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'checkpoint%'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!tables.is_empty());
    for table in tables {
        let columns: Vec<String> = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let length = columns
            .iter()
            .map(|c| format!("COALESCE(LENGTH(NEW.{c}), 0)"))
            .collect::<Vec<_>>()
            .join(" + ");
        for event in ["INSERT", "UPDATE"] {
            conn.execute_batch(&format!(
                "CREATE TRIGGER measure_{table}_{event} AFTER {event} ON {table} BEGIN \
                 UPDATE measured_bytes SET n = n + {length}; END;"
            ))
            .unwrap();
        }
    }
}

/// The checkpoint bytes one durable run of `steps` steps writes.
async fn bytes_written(dir: &Scratch, steps: u32) -> i64 {
    let path = dir.path(&format!("run-{steps}.db"));
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    count_checkpoint_bytes(&path);
    let host = Host::builder()
        .config(HostConfig::default())
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .build()
        .await
        .unwrap();
    let spec = AgentSpec::from_yaml(&manifest(steps)).unwrap();
    let result = host
        .submit(&spec, Invocation::default())
        .await
        .unwrap()
        .await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    assert_eq!(result.steps.len(), steps as usize);
    host.shutdown().await;
    store.close().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.query_row("SELECT n FROM measured_bytes", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_runs_checkpoint_bytes_grow_with_its_steps_not_their_square() {
    let dir = Scratch::new("checkpoint-bytes");
    let mut figures = Vec::new();
    for steps in [10, 50, 200] {
        let bytes = bytes_written(&dir, steps).await;
        println!("checkpoint bytes written by a {steps}-step durable run: {bytes}");
        figures.push(bytes);
    }
    // Whole-transcript saves would make this about 400 (20² steps).
    let ratio = figures[2] as f64 / figures[0] as f64;
    println!("200 steps / 10 steps: {ratio:.1}x");
    assert!(
        ratio < 30.0,
        "a 200-step run wrote {ratio:.1}x the bytes of a 10-step one: {figures:?}"
    );
}
