//! The `email` destination against a real SMTP server (`cargo test
//! --features peers,publishers --test skill_email_peer`): PyPI's
//! `aiosmtpd` (pinned in `.ci/run`), run as `python3 -m aiosmtpd`, keeps
//! what it receives in a Maildir the test reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::outbox::DeliveryState;
use agentvisor::publishers::Destinations;
use agentvisor::skill_run::{self, Outcome, RunOptions};
use agentvisor::skills::SkillsRepo;
use support::scratch::Scratch;

/// A free loopback port (taken, then let go).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_run_mails_its_output_through_a_real_smtp_server() {
    let dir = Scratch::new("skill-email");
    let port = free_port();
    let maildir = dir.path("maildir");
    let python = std::env::var("AGENTVISOR_PEERS_PYTHON").unwrap_or_else(|_| "python3".into());
    let _server = tokio::process::Command::new(&python)
        .args(["-m", "aiosmtpd", "-n", "-l"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-c", "aiosmtpd.handlers.Mailbox"])
        .arg(&maildir)
        .kill_on_drop(true)
        .spawn()
        .expect("python3 with aiosmtpd (see .ci/run)");
    // Up once it takes connections (bounded: 20 s).
    let mut up = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "aiosmtpd did not listen on port {port}");

    std::fs::create_dir_all(dir.path("skills/digest")).unwrap();
    dir.file(
        "skills/digest/SKILL.md",
        "---\nname: digest\n---\nWrite the digest.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ digest: skills/digest }}\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"0 7 * * *\"\n    script:\n      - {{ text: \"Three changes. <memory>m</memory>\" }}\n    destinations:\n      - {{ type: email, host: 127.0.0.1, port: {port}, from: \"agentvisor <bot@example.com>\", to: [ops@example.com, lead@example.com], title: \"Digest of {{{{skill}}}}\" }}\n"
        ),
    );
    let destinations = Destinations::new(Arc::new(|_: &str| None), Arc::new(|_: &str| {}));
    let (host, _store) =
        support::host_from(support::builder().publisher(Arc::new(destinations))).await;
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let r = skill_run::run(&host, &repo, "daily", |_| None, &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(r.publish[0].state, DeliveryState::Delivered);
    assert_eq!(r.publish[0].target, "smtp 127.0.0.1 → 2 recipient(s)");
    host.shutdown().await;

    let new = std::fs::read_dir(maildir.join("new")).unwrap();
    let mails: Vec<String> = new
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(mails.len(), 1, "{mails:?}");
    let mail = &mails[0];
    assert!(mail.contains("Subject: Digest of digest"), "{mail}");
    assert!(
        mail.contains("To: ops@example.com, lead@example.com"),
        "{mail}"
    );
    assert!(mail.contains("Three changes."), "{mail}");
    assert!(!mail.contains("<memory>"), "{mail}");
    let key = format!("{}-0-email", r.run_id.unwrap());
    assert!(
        mail.contains(&format!("Message-ID: <{key}@agentvisor>")),
        "{mail}"
    );
}
