//! schemathesis (PyPI, pinned in `.ci/run`) against `/openapi.json` of a
//! running server: generated requests to every operation, no 5xx answer,
//! every answer matching the document's schema.
//!
//! Runs with `cargo test --features peers`. The program is found through
//! `SCHEMATHESIS`, else `target/peers-venv/bin/schemathesis` (where
//! `.ci/run` installs it), else `PATH`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentvisor::server::auth::{Caller, Role, TokenTable};
use agentvisor::server::catalog::Catalog;
use agentvisor::server::{Server, ServerConfig};

const QUICK: &str = r#"
name: quick
model: scripted
prompt: add
tools: [add]
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "five" }
"#;

const TOKEN: &str = "av_schemathesis";

fn schemathesis() -> String {
    if let Ok(p) = std::env::var("SCHEMATHESIS") {
        return p;
    }
    let venv =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/peers-venv/bin/schemathesis");
    if venv.is_file() {
        return venv.display().to_string();
    }
    "schemathesis".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_get_no_5xx_and_match_the_schema() {
    let (host, store) = support::host().await;
    let config = ServerConfig {
        rate_per_sec: 0.0,
        ..ServerConfig::default()
    };
    let server = Server::new(host.clone(), store, config);
    server.set_catalog(Catalog::from_agents([host
        .agent(support::spec(QUICK))
        .unwrap()]));
    server.set_tokens(Some(TokenTable::from_tokens([(
        TOKEN,
        Caller {
            id: "st".into(),
            role: Role::Admin,
        },
    )])));
    // A skills repository, so `/v1/schedules` lists a schedule and its
    // commands find one.
    let skills = support::scratch::Scratch::new("schemathesis-skills");
    std::fs::create_dir_all(skills.path("skills/s")).unwrap();
    skills.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    skills.file(
        "agentvisor.yaml",
        "skills: { s: skills/s }\nschedules:\n  - { name: digest, skill: s, cron: \"@daily\", model: scripted, script: [{ text: hi }] }\n",
    );
    let scheduler = agentvisor::schedules::Scheduler::start(
        agentvisor::skills::SkillsRepo::open(&skills.0).unwrap(),
        agentvisor::schedules::SchedulerConfig {
            store: std::sync::Arc::new(agentvisor::stores::MemoryScheduleStore::new()),
            runner: std::sync::Arc::new(agentvisor::schedules::HostRunner::new(host.clone())),
            ledger: None,
            clock: agentvisor::schedules::SchedulerClock::System,
        },
    )
    .await
    .unwrap();
    server.set_scheduler(Some(scheduler));
    let (base, _stop) = support::loopback::serve(&server).await;
    // A few runs on record, so reads find something.
    for _ in 0..3 {
        host.execute(
            host.agent(support::spec(QUICK)).unwrap(),
            Default::default(),
        )
        .await
        .unwrap();
    }

    let program = schemathesis();
    let out = tokio::process::Command::new(&program)
        .args([
            "run",
            &format!("{base}/openapi.json"),
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "25",
            "--workers",
            "1",
            "--request-timeout",
            "10",
            // The host-wide feed never ends by design.
            "--exclude-path",
            "/v1/events",
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
        ])
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {program} (.ci/run installs it): {e}"));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    server.close_streams();
}
