//! The publisher actor's tries, on paused time: at most 3, with backoff,
//! all within the schedule's `publish_timeout`; a destination that never
//! answers is cut at the timeout; a failure for good is not tried again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentvisor::ports::outbox::{Delivered, DeliveryState, PublishError, PublishIntent, Publisher};
use agentvisor::skill_run::{self, Outcome, RunOptions};
use agentvisor::skills::SkillsRepo;
use async_trait::async_trait;
use support::scratch::Scratch;
use tokio::time::Instant;

/// A destination that answers as told, and notes when each try came.
struct Scripted {
    answer: fn(u32) -> Option<Result<(), PublishError>>,
    tries: Mutex<Vec<Duration>>,
    start: Instant,
}

#[async_trait]
impl Publisher for Scripted {
    async fn deliver(&self, _: &PublishIntent) -> Result<Delivered, PublishError> {
        let n = {
            let mut t = self.tries.lock().unwrap();
            t.push(self.start.elapsed());
            t.len() as u32
        };
        match (self.answer)(n) {
            Some(r) => r.map(|()| Delivered::default()),
            // Never answers.
            None => std::future::pending().await,
        }
    }
}

fn repo(timeout: &str) -> Scratch {
    let dir = Scratch::new("publisher-retries");
    std::fs::create_dir_all(dir.path("skills/a")).unwrap();
    dir.file("skills/a/SKILL.md", "---\nname: a\n---\nHi\n");
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ a: skills/a }}\nschedules:\n  - name: s\n    skill: a\n    cron: \"0 * * * *\"\n    publish_timeout: {timeout}\n    script: [{{ text: hello }}]\n    destinations:\n      - {{ type: webhook, url: \"http://example.invalid/in\" }}\n"
        ),
    );
    dir
}

async fn run_with(
    timeout: &str,
    answer: fn(u32) -> Option<Result<(), PublishError>>,
) -> (skill_run::SkillRunResult, Vec<Duration>) {
    let dir = repo(timeout);
    let publisher = Arc::new(Scripted {
        answer,
        tries: Mutex::new(Vec::new()),
        start: Instant::now(),
    });
    let (host, _store) = support::host_from(support::builder().publisher(publisher.clone())).await;
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let r = skill_run::run(&host, &repo, "s", |_| None, &RunOptions::default())
        .await
        .unwrap();
    host.shutdown().await;
    let tries = publisher.tries.lock().unwrap().clone();
    (r, tries)
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_tried_three_times_with_backoff() {
    let (r, tries) = run_with("30s", |n| {
        Some(if n < 3 {
            Err(PublishError::Transient("503".into()))
        } else {
            Ok(())
        })
    })
    .await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(r.publish[0].state, DeliveryState::Delivered);
    assert_eq!(r.publish[0].attempts, 3);
    // 0.5 s, then 1 s between the tries.
    assert_eq!(tries.len(), 3);
    assert_eq!(tries[1] - tries[0], Duration::from_millis(500));
    assert_eq!(tries[2] - tries[1], Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn every_try_fits_in_the_publish_timeout() {
    // Always failing, 1.2 s in all: tries at 0 and 0.5 s; the third would
    // start at 1.5 s, past the timeout.
    let (r, tries) = run_with("1200ms", |_| {
        Some(Err(PublishError::Transient("503".into())))
    })
    .await;
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    assert_eq!(r.publish[0].state, DeliveryState::Failed);
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert!(tries.iter().all(|t| *t <= Duration::from_millis(1200)));
}

#[tokio::test(start_paused = true)]
async fn a_destination_that_never_answers_is_cut_at_the_timeout() {
    let (r, tries) = run_with("5s", |_| None).await;
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    let p = &r.publish[0];
    assert_eq!((p.state, p.attempts), (DeliveryState::Failed, 1));
    assert!(p
        .error
        .as_deref()
        .unwrap()
        .contains("no answer within 5000 ms"));
    assert_eq!(tries.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_for_good_is_not_tried_again() {
    let (r, tries) = run_with("30s", |_| Some(Err(PublishError::Permanent("404".into())))).await;
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    assert_eq!(r.publish[0].attempts, 1);
    assert_eq!(r.publish[0].error.as_deref(), Some("404"));
    assert_eq!(tries.len(), 1);
}
