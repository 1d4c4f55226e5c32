//! Skills repositories read and checked (`agentvisor::skills`): every
//! refusal names its file, key and line; includes stay inside the
//! repository; defaults, max turns and env build the run a schedule
//! fires; the example repository reads as the docs say.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentvisor::ports::model::Role;
use agentvisor::skills::{SkillError, SkillsRepo, Timestamp};
use support::scratch::Scratch;

const SKILL: &str = "---\nname: digest\ndescription: d\n---\nSay hello.\n";

/// A repository with `manifest` and one skill `digest` (`skill_md`).
fn repo(manifest: &str, skill_md: &str) -> Scratch {
    let dir = Scratch::new("skills");
    std::fs::create_dir_all(dir.path("skills/digest")).unwrap();
    dir.file("agentvisor.yaml", manifest);
    dir.file("skills/digest/SKILL.md", skill_md);
    dir
}

fn refused(dir: &Scratch) -> String {
    match SkillsRepo::open(&dir.0) {
        Ok(_) => panic!("accepted"),
        Err(e @ SkillError::Invalid { .. }) => e.to_string(),
        Err(e) => panic!("not a refusal: {e}"),
    }
}

const BASE: &str = "skills:\n  digest: skills/digest\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"0 7 * * *\"\n    model: scripted\n    script: [{ text: hi }]\n";

#[test]
fn a_good_repository_reads() {
    let dir = repo(BASE, SKILL);
    let r = SkillsRepo::open(&dir.0).unwrap();
    assert_eq!(r.schedules.len(), 1);
    let s = r.schedule("daily").unwrap();
    assert_eq!(s.timezone, "UTC");
    assert_eq!(s.spec.model, "scripted");
    assert!(!s.spec.durable, "not durable unless asked");
    assert_eq!(
        s.spec.limits.max_iterations,
        Some(20),
        "the default max turns"
    );
    let after: Timestamp = "2026-05-01T08:00:00Z".parse().unwrap();
    assert_eq!(
        s.next_fire(after).unwrap().to_string(),
        "2026-05-02T07:00:00Z"
    );
}

#[test]
fn refusals_name_the_key_and_the_line() {
    let cases: Vec<(String, &str, &[&str])> = vec![
        (
            BASE.replace("    model: scripted\n", "    model: scripted\n    cronn: x\n"),
            SKILL,
            &["unknown field `cronn`", "line 8"],
        ),
        (
            BASE.replace("\"0 7 * * *\"", "\"0 25 * * *\""),
            SKILL,
            &["`cron`", "hour", "line 6"],
        ),
        (
            BASE.replace("    model: scripted\n", "    timezone: Mars/Base\n    model: scripted\n"),
            SKILL,
            &["`timezone`", "Mars/Base", "line 7"],
        ),
        (
            BASE.replace("    skill: digest\n", "    skill: nope\n"),
            SKILL,
            &["`skill` names `nope`", "known: digest", "line 5"],
        ),
        (
            format!("{BASE}defaults:\n  cron: \"@daily\"\n"),
            SKILL,
            &["`defaults.cron`", "line 10"],
        ),
        (
            BASE.replace("    script: [{ text: hi }]\n", ""),
            SKILL,
            &["`model: scripted` needs a `script`", "schedule `daily`"],
        ),
        (
            format!("{BASE}    max_turns: 0\n"),
            SKILL,
            &["`max_turns` must be at least 1", "line 9"],
        ),
        (
            format!("{BASE}  - name: daily\n    skill: digest\n    cron: \"@hourly\"\n    script: [{{ text: x }}]\n"),
            SKILL,
            &["two schedules are named `daily`", "line 9"],
        ),
        (
            format!("{BASE}    writeback: {{ path: ../outside.md }}\n"),
            SKILL,
            &["`writeback.path`", "climbs out", "line 9"],
        ),
        (
            format!("{BASE}    destinations:\n      - type: webhook\n        output: summary\n"),
            SKILL,
            &["a `webhook` destination needs `url`", "line 10"],
        ),
        (
            format!("{BASE}    destinations:\n      - type: file\n        path: out.md\n        url: http://x\n"),
            SKILL,
            &["a `file` destination has no `url`", "line 12"],
        ),
        (
            format!("{BASE}    env: {{ API: {{ secret: bad-name }} }}\n"),
            SKILL,
            &["secret name `bad-name`", "line 9"],
        ),
        (
            BASE.to_string(),
            "---\nname: digest\nmodel: x\n---\nHi\n",
            &["SKILL.md", "unknown field `model`", "line 3"],
        ),
        (
            BASE.to_string(),
            "---\nname: other\n---\nHi\n",
            &["SKILL.md", "`name` is `other`", "line 2"],
        ),
        (BASE.to_string(), "Hi, no front matter\n", &["SKILL.md", "`---`"]),
    ];
    for (manifest, skill, wants) in cases {
        let dir = repo(&manifest, skill);
        let e = refused(&dir);
        for want in wants {
            assert!(
                e.contains(want),
                "{want:?} not in: {e}\n--- manifest:\n{manifest}"
            );
        }
    }
}

#[test]
fn includes_are_inserted_one_level_deep() {
    let dir = repo(
        BASE,
        "---\nname: digest\n---\nA\n{{ include \"part.md\" }}\nB {{ include \"../../shared/x.md\" }}\n",
    );
    dir.file("skills/digest/part.md", "PART {{ include \"deeper.md\" }}");
    std::fs::create_dir_all(dir.path("shared")).unwrap();
    dir.file("shared/x.md", "SHARED");
    let r = SkillsRepo::open(&dir.0).unwrap();
    assert_eq!(
        r.skills["digest"].prompt,
        "A\nPART {{ include \"deeper.md\" }}\nB SHARED"
    );
}

#[test]
fn includes_that_escape_are_refused() {
    let outside = Scratch::new("outside");
    outside.file("secret.txt", "do not read");
    let escape = format!(
        "../../../{}/secret.txt",
        outside.0.file_name().unwrap().to_str().unwrap()
    );
    let absolute = outside.arg("secret.txt");
    let cases = [
        (escape.as_str(), "climbs out of the repository"),
        (absolute.as_str(), "absolute path"),
        ("missing.md", "cannot read it"),
    ];
    for (target, says) in cases {
        let dir = repo(
            BASE,
            &format!("---\nname: digest\n---\nHello\n\n{{{{ include \"{target}\" }}}}\n"),
        );
        let e = refused(&dir);
        assert!(e.contains(says) && e.contains("line 6"), "{target}: {e}");
        assert!(!e.contains("do not read"), "{e}");
    }
    #[cfg(unix)]
    {
        let dir = repo(BASE, "---\nname: digest\n---\n{{ include \"link.md\" }}\n");
        std::os::unix::fs::symlink(
            outside.path("secret.txt"),
            dir.path("skills/digest/link.md"),
        )
        .unwrap();
        let e = refused(&dir);
        assert!(
            e.contains("link to a file outside") && e.contains("line 4"),
            "{e}"
        );
        // A skill folder that is a link out of the repository.
        let dir = repo(&BASE.replace("skills/digest", "escape"), SKILL);
        std::fs::create_dir_all(outside.path("skill")).unwrap();
        outside.file("skill/SKILL.md", SKILL);
        std::os::unix::fs::symlink(outside.path("skill"), dir.path("escape")).unwrap();
        let e = refused(&dir);
        assert!(
            e.contains("outside the repository") && e.contains("line 2"),
            "{e}"
        );
    }
}

#[test]
fn defaults_max_turns_and_env_build_the_run() {
    let manifest = "skills:\n  digest: skills/digest\ndefaults:\n  timezone: Europe/Oslo\n  max_turns: 7\n  durable: true\n  env: { A: base, B: base }\n  budget: { per_run: { tokens: 500 } }\nschedules:\n  - name: one\n    skill: digest\n    cron: \"@daily\"\n    env: { B: mine, KEY: { secret: api_key } }\n    script: [{ text: hi }]\n  - name: two\n    skill: digest\n    cron: \"@daily\"\n    timezone: UTC\n    max_turns: 3\n    durable: false\n    script: [{ text: hi }]\n";
    let dir = repo(
        manifest,
        "---\nname: digest\nmax_turns: 5\nmax_tokens: 99\n---\nThe prompt.\n",
    );
    let r = SkillsRepo::open(&dir.0).unwrap();
    let one = r.schedule("one").unwrap();
    let two = r.schedule("two").unwrap();
    // `durable`: the defaults' unless the schedule says; a repository
    // that says nothing runs them not durable.
    assert!(one.spec.durable);
    assert!(!two.spec.durable);
    assert_eq!(one.timezone, "Europe/Oslo");
    assert_eq!(two.timezone, "UTC");
    // Schedule → front matter → 20; the defaults' count as the schedule's.
    assert_eq!(one.spec.limits.max_iterations, Some(7));
    assert_eq!(two.spec.limits.max_iterations, Some(3));
    assert_eq!(one.spec.max_tokens, Some(99));
    assert_eq!(one.spec.budget.and_then(|b| b.tokens), Some(500));
    let plan = r
        .plan("one", |v| {
            (v == "AGENTVISOR_SECRET_API_KEY").then(|| "sk-live-0123456789".to_string())
        })
        .unwrap();
    assert_eq!(plan.invocation.prompt, "The prompt.");
    assert_eq!(plan.invocation.caller_id.as_deref(), Some("schedule:one"));
    let system = &plan.invocation.history[0];
    assert_eq!(system.role, Role::System);
    assert_eq!(
        system.content,
        "<env>\nA=base\nB=mine\nKEY=[secret]\n</env>"
    );
    assert!(!format!("{plan:?}").contains("sk-live-0123456789"));
    // A missing secret names its variable.
    let e = r.plan("one", |_| None).unwrap_err();
    assert_eq!(e.kind(), "missing_secret");
    assert!(e.to_string().contains("AGENTVISOR_SECRET_API_KEY"), "{e}");
    // Without skill or schedule max turns: 20.
    let dir = repo(BASE, "---\nname: digest\nmax_turns: 5\n---\nHi\n");
    let r = SkillsRepo::open(&dir.0).unwrap();
    assert_eq!(
        r.schedule("daily").unwrap().spec.limits.max_iterations,
        Some(5)
    );
}

#[test]
fn the_example_repository_reads() {
    let r = SkillsRepo::open(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/skills")).unwrap();
    assert_eq!(r.skills.len(), 2);
    let names: Vec<&str> = r.schedules.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["weekday-digest", "weekly-digest", "triage"]);
    let digest = &r.skills["digest"].prompt;
    assert!(digest.contains("Style: plain sentences"), "{digest}");
    assert!(r.skills["triage"].prompt.contains("Labels: bug"));
    let weekday = r.schedule("weekday-digest").unwrap();
    assert_eq!(
        weekday.settings.destinations.as_ref().map(Vec::len),
        Some(2)
    );
    assert!(weekday.settings.writeback.is_some());
}

/// The `text` blocks of docs/skills.md that start with `start`.
fn doc_blocks(start: &str) -> Vec<String> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/skills.md")).unwrap();
    let mut out = Vec::new();
    let mut open: Option<String> = None;
    for line in page.lines() {
        match &mut open {
            None if line.starts_with("```text") => open = Some(String::new()),
            Some(body) if line.starts_with("```") => {
                if body.starts_with(start) {
                    out.push(std::mem::take(body));
                }
                open = None;
            }
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn the_docs_examples_read() {
    // The annotated agentvisor.yaml, with stub skills.
    let manifest = doc_blocks("skills:");
    assert_eq!(manifest.len(), 1, "the annotated agentvisor.yaml");
    let dir = repo(&manifest[0], SKILL);
    std::fs::create_dir_all(dir.path("skills/triage")).unwrap();
    dir.file("skills/triage/SKILL.md", "---\n---\nTriage.\n");
    let r = SkillsRepo::open(&dir.0).unwrap_or_else(|e| panic!("{e}"));
    let s = r.schedule("weekday-digest").unwrap();
    assert_eq!(s.spec.limits.max_iterations, Some(8));
    assert!(s.clock.offset() < std::time::Duration::from_secs(600));
    // The annotated SKILL.md, on a schedule that starts its server.
    let skill = doc_blocks("---");
    assert_eq!(skill.len(), 1, "the annotated SKILL.md");
    let dir = repo(
        &BASE.replace(
            "    model: scripted\n",
            "    model: scripted\n    mcp_servers: [{ name: github, command: [github-mcp] }, { name: other, command: [x] }]\n",
        ),
        &skill[0],
    );
    dir.file("skills/digest/style.md", "Be brief.");
    let r = SkillsRepo::open(&dir.0).unwrap_or_else(|e| panic!("{e}"));
    let spec = &r.schedule("daily").unwrap().spec;
    let servers: Vec<&str> = spec
        .mcp
        .as_ref()
        .unwrap()
        .servers
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        servers,
        ["github"],
        "a skill that names its servers gets only those"
    );
    assert!(r.skills["digest"].prompt.ends_with("Be brief."));
    // Without the server it needs, the schedule is refused.
    let dir = repo(BASE, &skill[0]);
    dir.file("skills/digest/style.md", "Be brief.");
    assert!(refused(&dir).contains("needs the MCP server `github`"));
}
