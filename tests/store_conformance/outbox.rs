//! The `OutboxStore` port on every battery, through the audit store that
//! holds it: a run's publish intents are written with the batch that
//! holds its terminal record (the run's log and index unchanged by them)
//! and listed as owed, a skipped one never; a replayed batch changes
//! nothing; a claim is held by one owner until it runs out, and of
//! publishers claiming at once exactly one wins; an outcome is recorded
//! once, after which the intent is neither owed nor claimable.

use std::sync::Arc;

use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore, RunIndex};
use agentvisor::ports::outbox::{DeliveryReport, DeliveryState, OutboxStore, PublishIntent};
use agentvisor::stores::{MemoryAuditStore, SqliteStore};
use agentvisor::RunId;

use crate::support::scratch::Scratch;

/// A store whose outbox is tested, and its run index.
trait Store: AuditStore + RunIndex {}
impl<T: AuditStore + RunIndex> Store for T {}

async fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryAuditStore::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn Store> {
    Arc::new(crate::support::postgres::fresh_store().await)
}

fn outbox(store: &Arc<dyn Store>) -> Arc<dyn OutboxStore> {
    let audit: Arc<dyn AuditStore> = store.clone();
    audit.outbox().expect("the battery keeps an outbox")
}

fn intent(run_id: RunId, index: u32, name: &str, at_ms: u64, skipped: bool) -> PublishIntent {
    PublishIntent {
        key: PublishIntent::key_of(run_id, index, name),
        run_id,
        index,
        name: name.into(),
        kind: "file".into(),
        target: serde_json::json!({ "path": format!("/out/{name}.md") }),
        shown: format!("/out/{name}.md"),
        body: format!("body of {name}"),
        skipped: skipped.then(|| "when: on_failure does not hold".to_string()),
        schedule: "daily".into(),
        skill: "digest".into(),
        timeout_ms: 30_000,
        at_ms,
    }
}

/// A real run's records with `intents` just ahead of its terminal record,
/// with that record's `seq` (as a host sends them).
async fn run_owing(
    at_ms: u64,
    names: &[(&str, bool)],
) -> (RunId, Vec<AuditRecord>, Vec<PublishIntent>) {
    let (id, mut run) = crate::support::rekey(&super::real_run().await, |_| {});
    let end = run.pop().unwrap();
    assert!(end.is_terminal());
    let intents: Vec<PublishIntent> = names
        .iter()
        .enumerate()
        .map(|(i, (name, skipped))| intent(id, i as u32, name, at_ms, *skipped))
        .collect();
    run.push(AuditRecord {
        run_id: id,
        seq: end.seq,
        at_ms: end.at_ms,
        entry: AuditEntry::Publish(intents.clone().into()),
    });
    run.push(end);
    (id, run, intents)
}

fn delivered(i: &PublishIntent, detail: &str) -> DeliveryReport {
    DeliveryReport {
        state: DeliveryState::Delivered,
        attempts: 1,
        detail: Some(detail.into()),
        at_ms: i.at_ms + 5,
        ..DeliveryReport::of(i)
    }
}

async fn intents_are_written_with_their_batch_and_listed_as_owed(store: Arc<dyn Store>) {
    let out = outbox(&store);
    let (id, run, intents) = run_owing(1_000, &[("hook", false), ("gated", true)]).await;
    let (older, older_run, older_intents) = run_owing(500, &[("file", false)]).await;
    // Before its batch, nothing is owed.
    assert!(out.owed(0, 10).await.unwrap().is_empty());
    assert!(out.run_intents(id).await.unwrap().is_empty());
    store.append(&run).await.unwrap();
    store.append(&older_run).await.unwrap();
    // The run's log and result are as without the intents: the publish
    // record is not a record of its log.
    let logged = store.run_records(id).await.unwrap();
    assert_eq!(logged.len(), run.len() - 1);
    assert!(logged
        .iter()
        .all(|r| !matches!(r.entry, AuditEntry::Publish(_))));
    assert!(logged.last().unwrap().is_terminal());
    assert_eq!(store.run_result(id).await.unwrap().unwrap().run_id, id);
    // Owed: oldest first; the skipped one never.
    let owed = out.owed(0, 10).await.unwrap();
    assert_eq!(owed, [older_intents[0].clone(), intents[0].clone()]);
    assert_eq!(out.owed(0, 1).await.unwrap(), [older_intents[0].clone()]);
    // A run's intents in destination order, with where each stands.
    let mine = out.run_intents(id).await.unwrap();
    assert_eq!(mine.len(), 2);
    assert_eq!(
        mine[0],
        (intents[0].clone(), DeliveryReport::of(&intents[0]))
    );
    assert_eq!(mine[1].0, intents[1]);
    assert_eq!(mine[1].1.state, DeliveryState::Skipped);
    assert_eq!(
        mine[1].1.detail.as_deref(),
        Some("when: on_failure does not hold")
    );
    assert_eq!(out.run_intents(older).await.unwrap().len(), 1);
    assert!(out.run_intents(RunId::new()).await.unwrap().is_empty());
}

async fn an_outcome_is_recorded_once_and_a_replay_changes_nothing(store: Arc<dyn Store>) {
    let out = outbox(&store);
    let (id, run, intents) = run_owing(1_000, &[("hook", false), ("file", false)]).await;
    store.append(&run).await.unwrap();
    let hook = &intents[0];
    assert!(out.claim(&hook.key, "host-a", 2_000, 1_000).await.unwrap());
    let report = delivered(hook, "200 OK");
    out.record_outcome(&report).await.unwrap();
    // Delivered: no longer owed, and no publisher can claim it again.
    assert_eq!(out.owed(0, 10).await.unwrap(), [intents[1].clone()]);
    assert!(!out.claim(&hook.key, "host-a", 9_000, 3_000).await.unwrap());
    assert!(!out.claim(&hook.key, "host-b", 9_000, 3_000).await.unwrap());
    // The batch again (a spool replayed after an outage): the outcome
    // stands, nothing is owed twice.
    store.append(&run).await.unwrap();
    let mine = out.run_intents(id).await.unwrap();
    assert_eq!(mine.len(), 2);
    assert_eq!(mine[0].1, report);
    assert_eq!(mine[1].1, DeliveryReport::of(&intents[1]));
    assert_eq!(out.owed(0, 10).await.unwrap(), [intents[1].clone()]);
    // A failure is recorded with its error; an unknown key changes nothing.
    let failed = DeliveryReport {
        state: DeliveryState::Failed,
        attempts: 3,
        error: Some("disk full".into()),
        at_ms: 1_100,
        ..DeliveryReport::of(&intents[1])
    };
    out.record_outcome(&failed).await.unwrap();
    out.record_outcome(&delivered(&intent(RunId::new(), 0, "x", 1, false), "?"))
        .await
        .unwrap();
    assert!(out.owed(0, 10).await.unwrap().is_empty());
    assert_eq!(out.run_intents(id).await.unwrap()[1].1, failed);
}

async fn a_claim_is_held_by_one_owner_until_it_runs_out(store: Arc<dyn Store>) {
    let out = outbox(&store);
    let (_, run, intents) = run_owing(1_000, &[("hook", false)]).await;
    store.append(&run).await.unwrap();
    let key = &intents[0].key;
    assert!(out.claim(key, "host-a", 5_000, 1_000).await.unwrap());
    // Held: another owner is refused and does not see it owed; its owner
    // may extend it.
    assert!(!out.claim(key, "host-b", 9_000, 4_999).await.unwrap());
    assert!(out.owed(4_999, 10).await.unwrap().is_empty());
    assert!(out.claim(key, "host-a", 6_000, 4_000).await.unwrap());
    assert!(!out.claim(key, "host-b", 9_000, 5_999).await.unwrap());
    // Run out: owed again, and another owner takes it.
    assert_eq!(out.owed(6_000, 10).await.unwrap(), [intents[0].clone()]);
    assert!(out.claim(key, "host-b", 9_000, 6_000).await.unwrap());
    assert!(!out.claim(key, "host-a", 9_500, 7_000).await.unwrap());
    // An unknown key is never claimed.
    assert!(!out.claim("nope", "host-a", 9_000, 1).await.unwrap());
}

async fn of_publishers_claiming_at_once_exactly_one_wins(store: Arc<dyn Store>) {
    let out = outbox(&store);
    let (_, run, intents) = run_owing(1_000, &[("hook", false)]).await;
    store.append(&run).await.unwrap();
    let claims: Vec<_> = (0..8)
        .map(|n| {
            let out = out.clone();
            let key = intents[0].key.clone();
            tokio::spawn(async move { out.claim(&key, &format!("host-{n}"), 9_000, 2_000).await })
        })
        .collect();
    let mut won = 0;
    for c in claims {
        if c.await.unwrap().unwrap() {
            won += 1;
        }
    }
    assert_eq!(won, 1);
}

conformance!(intents_are_written_with_their_batch_and_listed_as_owed);
conformance!(an_outcome_is_recorded_once_and_a_replay_changes_nothing);
conformance!(a_claim_is_held_by_one_owner_until_it_runs_out);
conformance!(of_publishers_claiming_at_once_exactly_one_wins);
