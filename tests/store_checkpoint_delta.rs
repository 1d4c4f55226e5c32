#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Checkpoints by delta on SQLite: a save after a step writes what is new
//! since the run's last save, and yet a run stopped mid-way is resumed
//! from the very transcript a whole save keeps (the in-memory store keeps
//! each checkpoint whole: the two are compared), a compacted one too;
//! a stale owner's delta writes no entry row; a checkpoint written before
//! schema version 12 loads, and is written whole at its next save. (The
//! port's side of deltas and fencing — a stale delta refused, a rewritten
//! end replaced — runs on every battery in `store_conformance`.)
//!
//! Waits for a state of the file are bounded polls (10 ms apart, 60 s at
//! most), never a wait for a deadline.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::compaction::SUMMARY_HEADER;
use agentvisor::ports::checkpoint::{
    Checkpoint, Checkpointer, Claim, EncodedJson, Lease, Unchanged,
};
use agentvisor::ports::model::{Message, Role};
use agentvisor::stores::{MemoryAuditStore, MemoryCheckpointer, SqliteStore};
use agentvisor::{AgentSpec, Invocation, RunId, RunStatus};
use support::scratch::Scratch;
use support::{builder, spec, RecordingModel};

/// Polls (bounded) until `done` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let bound = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < bound, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `steps` tool steps, then `last` (`hang: true` to stop there).
fn many_steps(steps: u32, last: &str) -> String {
    format!(
        "name: many\nmodel: recorded\ndurable: true\nprompt: add, and add again\ntools: [add]\n\
         limits: {{ max_iterations: 1000, max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }}\n\
         critic: {{ loops: off }}\nscript:\n  - {{ tool: add, args: {{ a: 2, b: 3 }}, repeat: {steps} }}\n  - {last}\n"
    )
}

/// An `upper` call whose text is `word` padded to 500 characters.
fn shout(word: &str, usage_input: u64) -> String {
    format!(
        "  - {{ tool: upper, args: {{ text: \"{word}{}\" }}, usage: {{ input: {usage_input}, output: 110 }} }}\n",
        "x".repeat(500)
    )
}

/// Three big turns, a summary (window 1000: compaction before step 4),
/// a step, then `fifth` and `last`. (A resumed run counts no summary
/// call of the process before: its call 6 plays entry 5.)
fn compacting(fifth: &str, last: &str) -> String {
    format!(
        "name: compacting\nmodel: recorded\ndurable: true\nsystem: You shout.\nprompt: go\ntools: [upper, add]\n\
         limits: {{ context_window: 1000, max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }}\n\
         script:\n{}{}{}  - {{ text: \"SUMMARY: shouted one and two\", usage: {{ input: 250, output: 12 }} }}\n\
         \x20 - {{ tool: add, args: {{ a: 1, b: 2 }}, usage: {{ input: 300, output: 5 }} }}\n\
         \x20 - {fifth}\n  - {last}\n",
        shout("one", 100),
        shout("two", 300),
        shout("three", 600),
    )
}

/// Where a run of `yaml` stops (its last script entry, model call
/// `calls`, hangs): the checkpoint kept by a host on `checkpointer` shut
/// down there, and the transcript the run held (what its hanging model
/// call was sent).
async fn stopped_at(
    yaml: &str,
    iteration: u32,
    calls: usize,
    checkpointer: Arc<dyn Checkpointer>,
    audit: Arc<dyn agentvisor::ports::audit::AuditStore>,
) -> (Checkpoint, Vec<Message>) {
    let model = RecordingModel::new(&spec(yaml));
    let host = builder()
        .model("recorded", model.clone())
        .audit_store(audit)
        .checkpointer(checkpointer.clone())
        .build()
        .await
        .unwrap();
    let handle = host
        .submit(spec(yaml), Invocation::default())
        .await
        .unwrap();
    until("the run is checkpointed at its last step", || async {
        checkpointer
            .load_all()
            .await
            .unwrap()
            .iter()
            .any(|c| c.iteration == iteration)
    })
    .await;
    until("the hanging call is made", || async {
        model.calls() == calls
    })
    .await;
    let held = model.request(calls - 1);
    host.shutdown().await;
    assert_eq!(handle.await.status, RunStatus::Cancelled);
    let saved = checkpointer.load_all().await.unwrap();
    assert_eq!(saved.len(), 1);
    (saved.into_iter().next().unwrap(), held)
}

/// Stops a run of `stopping` on SQLite and on the in-memory store (which
/// keeps checkpoints whole), compares what each kept with what the run
/// held, then resumes it from the file with `finishing` (the same
/// script, ending in an answer) and checks it goes on from that very
/// transcript.
async fn resumes_whole(
    stopping: &str,
    finishing: &str,
    iteration: u32,
    calls: usize,
) -> Checkpoint {
    let dir = Scratch::new("delta-resume");
    let path = dir.path("a.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let (delta, held) = stopped_at(stopping, iteration, calls, store.clone(), store.clone()).await;
    let (whole, _) = stopped_at(
        stopping,
        iteration,
        calls,
        Arc::new(MemoryCheckpointer::new()),
        Arc::new(MemoryAuditStore::new()),
    )
    .await;
    assert_eq!(*delta.transcript, held, "the file has what the run held");
    assert_eq!(delta.transcript, whole.transcript, "as a whole save has it");
    assert_eq!(delta.iteration, whole.iteration);
    assert_eq!(delta.usage, whole.usage);
    assert_eq!(delta.steps.len(), whole.steps.len());
    assert_eq!(delta.critic, whole.critic);
    assert_eq!(delta.unchanged, Unchanged::default());

    // Resumed from the file: its next call is sent that transcript.
    let model = RecordingModel::new(&spec(finishing));
    let host = builder()
        .model("recorded", model.clone())
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .build()
        .await
        .unwrap();
    let recovery = host.recover().await.unwrap();
    assert_eq!(recovery.resumed.len(), 1, "{recovery:?}");
    let result = recovery.resumed.into_iter().next().unwrap().await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    assert_eq!(result.output.as_deref(), Some("done"));
    assert_eq!(model.request(0), held, "resumed with the transcript it had");
    host.shutdown().await;
    assert!(store.load_all().await.unwrap().is_empty(), "cleared");
    delta
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_is_resumed_with_the_transcript_a_whole_save_keeps() {
    let saved = resumes_whole(
        &many_steps(40, "{ hang: true }"),
        &many_steps(40, "{ text: done }"),
        40,
        41,
    )
    .await;
    assert_eq!(
        saved.transcript.len(),
        1 + 2 * 40,
        "the prompt, forty turns"
    );
    assert_eq!(saved.steps.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_run_is_resumed_with_the_transcript_a_whole_save_keeps() {
    // Steps 1 to 3, the summary, steps 4 and 5: it stops at step 6.
    let step = "{ tool: add, args: { a: 3, b: 4 }, usage: { input: 320, output: 5 } }";
    let saved = resumes_whole(
        &compacting(step, "{ hang: true }"),
        &compacting("{ text: done }", "{ text: done }"),
        5,
        7,
    )
    .await;
    let t = &saved.transcript;
    assert_eq!(t[0].content, "You shout.");
    assert_eq!(t[1].content, "go");
    assert!(t[2].content.starts_with(SUMMARY_HEADER), "{t:#?}");
    assert_eq!(t.len(), 2 + 1 + 2 * 3, "the head, the summary, three turns");
    assert_eq!(saved.steps.len(), 5);
}

/// A checkpoint of `run` at `iteration` with `transcript`, keeping
/// `unchanged` of its last save.
fn at(run: RunId, iteration: u32, transcript: &[Message], unchanged: Unchanged) -> Checkpoint {
    let spec = AgentSpec::from_yaml(&many_steps(1, "{ text: done }")).unwrap();
    Checkpoint {
        run_id: run,
        agent: "many".into(),
        spec: EncodedJson::encode(&spec).unwrap(),
        invocation: EncodedJson::encode(&Invocation::default()).unwrap(),
        transcript: Arc::new(transcript.to_vec()),
        iteration,
        steps: Vec::new(),
        usage: Default::default(),
        cost_micros: Some(0),
        critic: Vec::new(),
        resumes: 0,
        started_at: 1,
        saved_at: 2 + u64::from(iteration),
        parked: None,
        unchanged,
    }
}

fn said(n: usize, by: &str) -> Vec<Message> {
    (0..n)
        .map(|i| Message::text(Role::User, format!("{by} {i}")))
        .collect()
}

fn lease(owner: &str) -> Lease {
    Lease {
        owner: owner.into(),
        ttl: Duration::from_secs(60),
    }
}

fn keep(messages: usize) -> Unchanged {
    Unchanged {
        messages,
        ..Unchanged::default()
    }
}

/// What fencing leaves in the file (the port's side of it, the stale
/// delta refused, runs on every battery in `store_conformance`): a
/// refused delta adds no entry row, and a cleared run leaves none.
#[tokio::test]
async fn a_refused_delta_writes_no_entry_and_a_cleared_run_leaves_none() {
    let dir = Scratch::new("delta-fencing");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let entries = |list: i64| -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM checkpoint_entries WHERE list >= ?1",
            [list],
            |r| r.get(0),
        )
        .unwrap()
    };
    let run = RunId::new();
    let (a, b) = (lease("a"), lease("b"));
    let t = said(8, "a");
    assert!(store
        .save(&[at(run, 0, &t[..2], Unchanged::default())], &a)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .save(&[at(run, 1, &t[..6], keep(2))], &a)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(entries(1), 6);
    // `a` is paused past its lease; `b` claims the run; `a`'s delta is
    // refused.
    conn.execute("UPDATE checkpoints SET lease_until = 0", [])
        .unwrap();
    assert_eq!(store.claim(run, &b).await.unwrap(), Claim::Claimed);
    let lost = store
        .save(&[at(run, 2, &t[..8], keep(6))], &a)
        .await
        .unwrap();
    assert_eq!(lost, vec![run]);
    assert_eq!(entries(1), 6);
    // Cleared: both tables.
    store.clear(&[run]).await.unwrap();
    assert_eq!(entries(0), 0);
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM checkpoints", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn a_checkpoint_written_before_version_12_loads_and_is_written_whole_at_its_next_save() {
    let dir = Scratch::new("delta-legacy");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let run = RunId::new();
    let t = said(5, "old");
    // As builds before version 12 wrote it: the whole checkpoint in
    // `state`, no entries, a lease of an earlier process.
    let old = at(run, 2, &t[..4], Unchanged::default());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at, owner, \
         lease_until) VALUES (?1, 'many', 2, 0, ?2, 4, 'earlier', 0)",
        rusqlite::params![run.to_string(), serde_json::to_string(&old).unwrap()],
    )
    .unwrap();
    assert_eq!(store.load_all().await.unwrap(), vec![old]);

    // A save that keeps what the row does not have as entries is written
    // whole.
    let now = lease("now");
    assert_eq!(store.claim(run, &now).await.unwrap(), Claim::Claimed);
    let mut next = at(run, 3, &t, keep(4));
    assert!(store.save(&[next.clone()], &now).await.unwrap().is_empty());
    next.unchanged = Unchanged::default();
    assert_eq!(store.load_all().await.unwrap(), vec![next]);
    let layout: i64 = conn
        .query_row("SELECT layout FROM checkpoints", [], |r| r.get(0))
        .unwrap();
    assert_eq!(layout, 1);
}
