//! The `Checkpointer` port on every battery: leases won once while live,
//! host leases taken over only once expired, fencing (a save by an owner
//! whose lease was taken, or of a run cleared, writes nothing), renewals
//! that count the leases still held, and saves by delta that rebuild the
//! very checkpoint a whole save keeps.
//!
//! An expired lease is one taken with a zero TTL: it expires as it is
//! taken, so no test waits for a clock.

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::checkpoint::{
    CallDecision, Checkpoint, Checkpointer, Claim, EncodedJson, HostClaim, Lease, ParkedCalls,
    Renewal, Unchanged, WaitingCall,
};
use agentvisor::ports::model::{Message, Role};
use agentvisor::ports::run::{CriticAction, CriticDecision, StepRecord, Usage};
use agentvisor::stores::{MemoryCheckpointer, SqliteStore};
use agentvisor::{AgentSpec, Invocation, RunId};

use crate::support::scratch::Scratch;

async fn memory() -> Arc<dyn Checkpointer> {
    Arc::new(MemoryCheckpointer::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn Checkpointer> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn Checkpointer> {
    Arc::new(crate::support::postgres::fresh_store().await)
}

fn lease(owner: &str) -> Lease {
    Lease {
        owner: owner.into(),
        ttl: Duration::from_secs(60),
    }
}

/// A lease that expires as it is taken (a host paused past its lease).
fn expiring(owner: &str) -> Lease {
    Lease {
        owner: owner.into(),
        ttl: Duration::ZERO,
    }
}

/// A checkpoint of `run` at `iteration`: `transcript`, `steps` step
/// records and `critic` decisions, keeping `unchanged` of its last save.
fn at(run: RunId, iteration: u32, transcript: &[Message], unchanged: Unchanged) -> Checkpoint {
    let spec: AgentSpec = crate::support::hello_spec();
    Checkpoint {
        run_id: run,
        agent: "hello".into(),
        spec: EncodedJson::encode(&spec).unwrap(),
        invocation: EncodedJson::encode(&Invocation {
            prompt: "add".into(),
            ..Invocation::default()
        })
        .unwrap(),
        transcript: Arc::new(transcript.to_vec()),
        iteration,
        steps: Vec::new(),
        usage: Usage::default(),
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

fn keep(messages: usize) -> Unchanged {
    Unchanged {
        messages,
        ..Unchanged::default()
    }
}

fn step(iteration: u32) -> StepRecord {
    StepRecord {
        iteration,
        tool: "add".into(),
        args: format!("{{\"a\":{iteration},\"b\":1}}"),
        ok: !iteration.is_multiple_of(3),
        error: iteration
            .is_multiple_of(3)
            .then(|| "tool_error: odd".to_string()),
        result: (iteration + 1).to_string(),
        duration_ms: u64::from(iteration),
    }
}

fn decision(at_ms: u64) -> CriticDecision {
    CriticDecision {
        action: CriticAction::Steer,
        reason: "soft_timeout".into(),
        at_ms,
        detail: Some(format!("hurry ({at_ms})")),
        loop_kind: None,
    }
}

/// What a store gives back of `c`: all of it, nothing said unchanged.
fn as_loaded(c: &Checkpoint) -> Checkpoint {
    Checkpoint {
        unchanged: Unchanged::default(),
        ..c.clone()
    }
}

/// The one checkpoint of `run` the store holds.
async fn loaded(s: &dyn Checkpointer, run: RunId) -> Checkpoint {
    let all = s.load_all().await.unwrap();
    let mut of = all.into_iter().filter(|c| c.run_id == run);
    let c = of.next().expect("the run's checkpoint loads");
    assert!(of.next().is_none());
    c
}

async fn a_claim_is_won_once_while_the_lease_is_live(s: Arc<dyn Checkpointer>) {
    let run = RunId::new();
    let (one, two) = (lease("one"), lease("two"));
    assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Missing);
    // Only a run's first checkpoint creates its row.
    let mut c = at(run, 1, &said(2, "one"), Unchanged::default());
    assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
    assert!(s.load_all().await.unwrap().is_empty());
    c.iteration = 0;
    assert!(s
        .save(std::slice::from_ref(&c), &one)
        .await
        .unwrap()
        .is_empty());
    c.iteration = 1;
    assert!(s
        .save(std::slice::from_ref(&c), &one)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        s.claim(run, &two).await.unwrap(),
        Claim::HeldBy { owner, .. } if owner == "one"
    ));
    // A save by another owner while the lease is live is not written: the
    // saver lost the run.
    c.iteration = 9;
    assert_eq!(s.save(std::slice::from_ref(&c), &two).await.unwrap(), [run]);
    assert_eq!(s.load_all().await.unwrap()[0].iteration, 1);
    assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Claimed);
    s.release("one").await.unwrap();
    assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Claimed);
    // An expired lease is free.
    s.release("two").await.unwrap();
    assert_eq!(
        s.claim(run, &expiring("gone")).await.unwrap(),
        Claim::Claimed
    );
    assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Claimed);
    s.renew(&one).await.unwrap();
    assert!(matches!(
        s.claim(run, &two).await.unwrap(),
        Claim::HeldBy { .. }
    ));
    // Fencing: once another owner claimed the run, its first owner's saves
    // are not written, even after its lease expired; nor once the run
    // finished there and its row was cleared.
    assert_eq!(s.held_by("one").await.unwrap(), [run]);
    s.release("one").await.unwrap();
    assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Claimed);
    assert!(s.held_by("one").await.unwrap().is_empty());
    assert_eq!(s.renew(&one).await.unwrap().runs, 0);
    assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
    s.clear(&[run]).await.unwrap();
    assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
    assert!(s.load_all().await.unwrap().is_empty());
    assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Missing);
}

async fn a_host_is_taken_over_only_once_its_lease_expired_and_learns_of_it(
    s: Arc<dyn Checkpointer>,
) {
    let live = lease("live");
    assert_eq!(s.renew(&live).await.unwrap(), Renewal::default());
    assert!(matches!(
        s.take_over_host("live", false).await.unwrap(),
        HostClaim::Live { .. }
    ));
    // Known to be gone (a dead process of this machine): taken over
    // whatever its lease says; it learns so at its next renewal, and holds
    // its lease again.
    assert_eq!(
        s.take_over_host("live", true).await.unwrap(),
        HostClaim::TakenOver
    );
    assert!(s.renew(&live).await.unwrap().taken_over);
    assert!(!s.renew(&live).await.unwrap().taken_over);
    // An expired lease, or none at all, is taken over.
    let paused = expiring("paused");
    s.renew(&paused).await.unwrap();
    assert_eq!(
        s.take_over_host("paused", false).await.unwrap(),
        HostClaim::TakenOver
    );
    assert!(s.renew(&paused).await.unwrap().taken_over);
    assert_eq!(
        s.take_over_host("never-seen", false).await.unwrap(),
        HostClaim::TakenOver
    );
    // A clean shutdown gives the host lease up.
    s.release("live").await.unwrap();
    assert_eq!(
        s.take_over_host("live", false).await.unwrap(),
        HostClaim::TakenOver
    );
}

async fn a_lease_taken_over_after_expiry_fences_its_first_owner(s: Arc<dyn Checkpointer>) {
    // `a` (paused past its leases: they expire as taken) runs two runs.
    let (a, b) = (expiring("a"), lease("b"));
    let (kept, lost) = (RunId::new(), RunId::new());
    let t = said(6, "a");
    let first = [
        at(kept, 0, &t[..1], Unchanged::default()),
        at(lost, 0, &t[..1], Unchanged::default()),
    ];
    assert!(s.save(&first, &a).await.unwrap().is_empty());
    let renewed = s.renew(&a).await.unwrap();
    assert_eq!((renewed.runs, renewed.taken_over), (2, false));
    // `b` finds one expired and takes it; a live lease is not taken.
    assert_eq!(s.claim(lost, &b).await.unwrap(), Claim::Claimed);
    assert!(matches!(
        s.claim(lost, &a).await.unwrap(),
        Claim::HeldBy { owner, .. } if owner == "b"
    ));
    // `a` comes back: its save of the run taken is refused and writes
    // nothing; its other run's is written.
    let next = [at(kept, 1, &t[..3], keep(1)), at(lost, 1, &t[..3], keep(1))];
    assert_eq!(s.save(&next, &a).await.unwrap(), [lost]);
    assert_eq!(loaded(&*s, kept).await, as_loaded(&next[0]));
    assert_eq!(loaded(&*s, lost).await, as_loaded(&first[1]));
    // Its renewal counts one run: it lost the other.
    assert_eq!(s.renew(&a).await.unwrap().runs, 1);
    assert_eq!(s.held_by("a").await.unwrap(), [kept]);
    assert_eq!(s.held_by("b").await.unwrap(), [lost]);
    // Nor may it start the run again while `b` holds it: a first save is
    // refused too.
    assert_eq!(s.save(&first[1..], &a).await.unwrap(), [lost]);
    // `b` goes on from what it read.
    let mut resumed = at(lost, 1, &t[..2], Unchanged::default());
    resumed.resumes = 1;
    assert!(s
        .save(std::slice::from_ref(&resumed), &b)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(loaded(&*s, lost).await, as_loaded(&resumed));
    // Its run ends there and is cleared: `a`'s saves stay refused.
    s.clear(&[lost]).await.unwrap();
    assert_eq!(s.save(&next[1..], &a).await.unwrap(), [lost]);
    assert_eq!(s.renew(&b).await.unwrap().runs, 0);
    assert_eq!(s.load_all().await.unwrap().len(), 1);
}

async fn a_stale_owners_delta_is_refused_and_the_new_owner_writes_its_own(
    s: Arc<dyn Checkpointer>,
) {
    let run = RunId::new();
    let (a, b) = (expiring("a"), lease("b"));
    let t = said(8, "a");
    // The first save creates the row; the next ones append.
    for (i, n) in [(0, 2), (1, 4), (2, 6)] {
        let kept = if i == 0 { 0 } else { n - 2 };
        let lost = s
            .save(&[at(run, i, &t[..n], keep(kept))], &a)
            .await
            .unwrap();
        assert!(lost.is_empty());
    }
    assert_eq!(*loaded(&*s, run).await.transcript, t[..6]);

    // `a` is paused past its lease; `b` claims the run.
    assert_eq!(s.claim(run, &b).await.unwrap(), Claim::Claimed);
    // `a` comes back: its delta is refused, and nothing of it is written
    // (entries past the row's counts would leave it unreadable).
    let lost = s.save(&[at(run, 3, &t[..8], keep(6))], &a).await.unwrap();
    assert_eq!(lost, vec![run]);
    let after = loaded(&*s, run).await;
    assert_eq!(*after.transcript, t[..6], "nothing of the stale save");
    assert_eq!(after.iteration, 2);

    // `b` resumes from an older read (iteration 1, saved whole), then goes
    // its own way: what `a` wrote past that is gone.
    let mut resumed = at(run, 1, &t[..4], Unchanged::default());
    resumed.resumes = 1;
    assert!(s.save(&[resumed], &b).await.unwrap().is_empty());
    assert_eq!(*loaded(&*s, run).await.transcript, t[..4]);
    let mut own = t[..4].to_vec();
    own.extend(said(2, "b"));
    let mut next = at(run, 2, &own, keep(4));
    next.resumes = 1;
    assert!(s.save(&[next.clone()], &b).await.unwrap().is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&next));

    // A rewritten end (compaction keeps the head): replaced, not appended.
    let mut compacted = own[..2].to_vec();
    compacted.extend(said(1, "summary"));
    let mut rewritten = at(run, 3, &compacted, keep(2));
    rewritten.resumes = 1;
    assert!(s.save(&[rewritten.clone()], &b).await.unwrap().is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&rewritten));

    s.clear(&[run]).await.unwrap();
    assert!(s.load_all().await.unwrap().is_empty());
}

async fn saves_by_delta_rebuild_the_checkpoint_a_whole_save_keeps(s: Arc<dyn Checkpointer>) {
    let owner = lease("host");
    let (run, other) = (RunId::new(), RunId::new());
    let mut transcript = vec![
        Message::text(Role::System, "You add numbers."),
        Message::text(Role::User, "add, and add again"),
    ];
    let mut c = at(run, 0, &transcript, Unchanged::default());
    let mut o = at(other, 0, &said(1, "other"), Unchanged::default());
    assert!(s
        .save(&[c.clone(), o.clone()], &owner)
        .await
        .unwrap()
        .is_empty());
    // Step by step, two runs a batch: each save keeps all of the last.
    for i in 1..=12u32 {
        let before = Unchanged::all_of(&c);
        transcript.push(Message::text(Role::Assistant, format!("call {i}")));
        transcript.push(Message::text(Role::Tool, format!("{}", i + 1)));
        c = Checkpoint {
            transcript: Arc::new(transcript.clone()),
            iteration: i,
            steps: (1..=i).map(step).collect(),
            critic: (0..u64::from(i / 4)).map(decision).collect(),
            usage: Usage {
                input_tokens: 100 * u64::from(i),
                output_tokens: 7 * u64::from(i),
                ..Usage::default()
            },
            cost_micros: Some(u64::from(i) * 3),
            saved_at: 10 + u64::from(i),
            unchanged: before,
            ..c
        };
        let o_before = Unchanged::all_of(&o);
        let mut ot = (*o.transcript).clone();
        ot.push(Message::text(Role::Assistant, format!("other {i}")));
        o = Checkpoint {
            transcript: Arc::new(ot),
            iteration: i,
            unchanged: o_before,
            ..o
        };
        assert!(s
            .save(&[o.clone(), c.clone()], &owner)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(loaded(&*s, run).await, as_loaded(&c), "after step {i}");
    }
    assert_eq!(loaded(&*s, other).await, as_loaded(&o));

    // Compaction keeps the head and rewrites the rest; the save after it
    // was coalesced with it (never written on its own): it keeps the least
    // each kept.
    let before = Unchanged::all_of(&c);
    let mut compacted = transcript[..2].to_vec();
    compacted.push(Message::text(Role::User, "SUMMARY: added twelve times"));
    let between = Unchanged {
        messages: 2,
        ..before
    };
    compacted.push(Message::text(Role::Assistant, "call 13"));
    let mut steps = c.steps.clone();
    steps.push(step(13));
    c = Checkpoint {
        transcript: Arc::new(compacted.clone()),
        iteration: 13,
        steps,
        unchanged: between.then(Unchanged {
            messages: 3,
            ..Unchanged::all_of(&c)
        }),
        ..c
    };
    assert!(s
        .save(std::slice::from_ref(&c), &owner)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&c));

    // Parked for approval at this save; decided later.
    let parked = ParkedCalls {
        waiting: vec![WaitingCall {
            call_id: "call_14".into(),
            tool: "add".into(),
            arguments: "{\"a\":1}".into(),
            since_ms: 99,
        }],
        decisions: vec![CallDecision {
            call_id: "call_13".into(),
            approve: false,
            reason: Some("no".into()),
            by: "operator".into(),
            at_ms: 98,
        }],
    };
    let mut ask = compacted.clone();
    ask.push(Message::text(Role::Assistant, "call 14"));
    c = Checkpoint {
        transcript: Arc::new(ask),
        iteration: 14,
        parked: Some(parked),
        unchanged: Unchanged::all_of(&c),
        ..c
    };
    assert!(s
        .save(std::slice::from_ref(&c), &owner)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&c));

    // A save that says it keeps more than the store holds (its previous
    // save never reached it): the store still holds exactly this save.
    let mut longer = (*c.transcript).clone();
    longer.extend(said(5, "later"));
    c = Checkpoint {
        transcript: Arc::new(longer),
        iteration: 15,
        parked: None,
        unchanged: Unchanged {
            messages: c.transcript.len() + 3,
            steps: c.steps.len(),
            critic: c.critic.len(),
        },
        ..c
    };
    assert!(s
        .save(std::slice::from_ref(&c), &owner)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&c));

    // Two saves of one run in one batch: the later one is what is held.
    let first = Checkpoint {
        iteration: 16,
        unchanged: Unchanged::all_of(&c),
        ..c.clone()
    };
    let mut grown = (*c.transcript).clone();
    grown.push(Message::text(Role::Assistant, "call 17"));
    let second = Checkpoint {
        transcript: Arc::new(grown),
        iteration: 17,
        unchanged: Unchanged::all_of(&first),
        ..first.clone()
    };
    assert!(s
        .save(&[first, second.clone()], &owner)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(loaded(&*s, run).await, as_loaded(&second));

    s.clear(&[run, other]).await.unwrap();
    assert!(s.load_all().await.unwrap().is_empty());
}

conformance!(a_claim_is_won_once_while_the_lease_is_live);
conformance!(a_host_is_taken_over_only_once_its_lease_expired_and_learns_of_it);
conformance!(a_lease_taken_over_after_expiry_fences_its_first_owner);
conformance!(a_stale_owners_delta_is_refused_and_the_new_owner_writes_its_own);
conformance!(saves_by_delta_rebuild_the_checkpoint_a_whole_save_keeps);

/// On PostgreSQL, what fencing leaves in the tables: a refused delta adds
/// no entry row, and a cleared run leaves none.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_a_refused_delta_writes_no_entry_and_a_cleared_run_leaves_none() {
    let url = crate::support::postgres::fresh_database().await;
    let s = agentvisor::stores::PostgresStore::connect(&url)
        .await
        .unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let entries = || async {
        client
            .query_one("SELECT count(*) FROM checkpoint_entries", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let run = RunId::new();
    let t = said(8, "a");
    let a = expiring("a");
    s.save(&[at(run, 0, &t[..2], Unchanged::default())], &a)
        .await
        .unwrap();
    s.save(&[at(run, 1, &t[..6], keep(2))], &a).await.unwrap();
    // The manifest, the invocation and six messages.
    assert_eq!(entries().await, 2 + 6);
    assert_eq!(s.claim(run, &lease("b")).await.unwrap(), Claim::Claimed);
    let lost = s.save(&[at(run, 2, &t, keep(6))], &a).await.unwrap();
    assert_eq!(lost, [run]);
    assert_eq!(entries().await, 2 + 6);
    s.clear(&[run]).await.unwrap();
    assert_eq!(entries().await, 0);
    let rows: i64 = client
        .query_one("SELECT count(*) FROM checkpoints", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
}
