#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Model tiers on the command line: a tier that only the built-in default
//! maps (to the public OpenAI API) is refused when nothing configures
//! OpenAI, instead of calling it silently; a wrong `AGENTVISOR_TIERS`
//! mapping is reported as itself, not as an unknown model; and
//! `run --explain` says where a manifest's model resolves.

use std::process::Output;

fn agentvisor(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_agentvisor"));
    c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for k in [
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "AGENTVISOR_DB",
        "AGENTVISOR_TIERS",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// A manifest on model `model`, in a directory of its own.
struct Manifest(std::path::PathBuf);

impl Manifest {
    fn new(tag: &str, model: &str) -> Manifest {
        let dir =
            std::env::temp_dir().join(format!("agentvisor-tiers-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("agent.yaml");
        std::fs::write(&file, format!("name: tiered\nmodel: {model}\nprompt: hi\n")).unwrap();
        Manifest(file)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Manifest {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_tier_nothing_configures_is_refused_not_sent_to_openai() {
    let m = Manifest::new("unset", "fast");
    let out = agentvisor(&["run", m.path(), "--db", ":memory:"], &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("model tier `fast`"), "{err}");
    assert!(
        err.contains("`openai:gpt-4o-mini` at the public OpenAI API"),
        "{err}"
    );
    assert!(err.contains("AGENTVISOR_TIERS"), "{err}");
}

#[test]
fn a_bad_tier_mapping_is_reported_as_itself() {
    let m = Manifest::new("bad", "fast");
    let out = agentvisor(
        &["run", m.path(), "--db", ":memory:"],
        &[("AGENTVISOR_TIERS", "fast=llama3.2")],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("model tier `fast` maps to `llama3.2`, which is not a model"),
        "{err}"
    );
    assert!(!err.contains("unknown model"), "{err}");
    // --explain says the same.
    let out = agentvisor(
        &["run", m.path(), "--explain"],
        &[("AGENTVISOR_TIERS", "fast=llama3.2")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("maps to `llama3.2`"));
}

#[test]
fn explain_says_where_a_tier_resolves() {
    let m = Manifest::new("explain", "fast");
    let out = agentvisor(
        &["run", m.path(), "--explain"],
        &[("AGENTVISOR_TIERS", "fast=ollama:llama3.2")],
    );
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        said.contains("tier:     `fast` -> `ollama:llama3.2` (configured)"),
        "{said}"
    );
    assert!(said.contains("resolves: ollama:llama3.2"), "{said}");
    assert!(
        said.contains("base URL: http://127.0.0.1:11434/v1 (from the default)"),
        "{said}"
    );
    // Nothing configured: the built-in default, and that a run is refused.
    let out = agentvisor(&["run", m.path(), "--explain"], &[]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        said.contains("`fast` -> `openai:gpt-4o-mini` (the built-in default"),
        "{said}"
    );
    assert!(said.contains("https://api.openai.com/v1"), "{said}");
    assert!(
        said.contains("key:      OPENAI_API_KEY (not set)"),
        "{said}"
    );
    assert!(said.contains("refused:"), "{said}");
    // --model is explained the same way.
    let out = agentvisor(&["run", m.path(), "--explain", "--model", "scripted"], &[]);
    assert_eq!(
        text(&out.stdout).trim(),
        "model:    scripted\nresolves: scripted"
    );
}
