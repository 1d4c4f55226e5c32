//! The documentation's manifests run as written: every `yaml` block of
//! README.md and docs/*.md is a whole manifest that parses, and each one
//! on the scripted model runs (an in-process host) to the status the line
//! `# ends: STATUS` in its block claims (and with the output an
//! `# output: TEXT` line claims). A scripted block without such a
//! line, or a claim on a block that cannot run here, fails the test. The
//! manifests the docs name by path (`examples/agents/NAME.yaml`) exist, and
//! the schema version docs/durability.md states is the store's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentvisor::{AgentSpec, Invocation};

/// One fenced `yaml` block: where it is and what it says.
struct Block {
    at: String,
    text: String,
}

impl Block {
    /// The status its `# ends: STATUS` line claims.
    fn claim(&self) -> Option<String> {
        self.says("# ends:")
    }

    /// What the line that starts with `prefix` says after it.
    fn says(&self, prefix: &str) -> Option<String> {
        self.text
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|s| s.trim().to_string()))
    }
}

/// README.md and every page of docs/ (sorted).
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    out.sort();
    out.insert(0, root.join("README.md"));
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The `yaml` blocks of one page.
fn blocks_of(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```yaml") => open = Some((i + 1, String::new())),
            Some((start, body)) if fence.starts_with("```") => {
                out.push(Block {
                    at: format!("{}:{start}", relative(path)),
                    text: std::mem::take(body),
                });
                open = None;
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    assert!(
        open.is_none(),
        "{}: a yaml block is not closed",
        relative(path)
    );
    out
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks_of(p)).collect()
}

#[test]
fn every_manifest_in_the_docs_parses() {
    let blocks = all_blocks();
    assert!(blocks.len() >= 7, "only {} yaml blocks found", blocks.len());
    for b in &blocks {
        // Sub-agent paths are relative to the repository's root, where
        // the tests run.
        if let Err(e) = AgentSpec::from_yaml(&b.text) {
            panic!("{}: the manifest does not parse: {e}\n{}", b.at, b.text);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scripted_manifest_in_the_docs_ends_as_claimed() {
    let (host, _store) = support::host().await;
    let mut ran = 0;
    for b in all_blocks() {
        let spec = AgentSpec::from_yaml(&b.text).unwrap();
        let scripted = spec.model == "scripted" && spec.phases.is_empty();
        let servers = spec.mcp.as_ref().is_some_and(|m| !m.servers.is_empty());
        let claim = b.claim();
        match (scripted && !servers, claim) {
            (true, None) => panic!(
                "{}: a scripted manifest without an `# ends: STATUS` line",
                b.at
            ),
            (false, Some(_)) => panic!(
                "{}: claims an ending, but only a scripted manifest without MCP servers or phases runs here",
                b.at
            ),
            (false, None) => continue,
            (true, Some(claim)) => {
                let result = tokio::time::timeout(
                    Duration::from_secs(60),
                    host.execute(spec, Invocation::default()),
                )
                .await
                .unwrap_or_else(|_| panic!("{}: still running after 60 s", b.at))
                .unwrap_or_else(|e| panic!("{}: refused: {e}", b.at));
                assert_eq!(
                    result.status.to_string(),
                    claim,
                    "{}: the docs claim `{claim}`; the run ended {} ({:?} {:?}): {:?}",
                    b.at,
                    result.status,
                    result.kill_reason,
                    result.error_kind,
                    result.error
                );
                if let Some(output) = b.says("# output:") {
                    assert_eq!(
                        result.output.as_deref(),
                        Some(output.as_str()),
                        "{}: the docs claim the output `{output}`",
                        b.at
                    );
                }
                ran += 1;
            }
        }
    }
    assert!(ran >= 3, "only {ran} scripted manifests ran");
    host.shutdown().await;
}

#[test]
fn the_annotated_manifest_needs_nothing_outside_it() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/manifest.md");
    let first = blocks_of(&manifest)
        .into_iter()
        .next()
        .expect("a yaml block");
    let spec = AgentSpec::from_yaml(&first.text).unwrap();
    assert_eq!(spec.model, "scripted");
    assert!(
        spec.mcp.is_none(),
        "the annotated manifest names MCP servers"
    );
    assert!(
        spec.output_schema.is_some(),
        "the annotated manifest shows its repair turn"
    );
    // Its script calls only tools it lists.
    let script = first.text.split("\nscript:").nth(1).expect("a script");
    let called = script
        .split("tool: ")
        .skip(1)
        .map(|s| {
            s.split([',', ' ', '}'])
                .next()
                .unwrap()
                .trim_matches('"')
                .to_string()
        })
        .collect::<Vec<_>>();
    assert!(called.len() >= 3, "{called:?}");
    for tool in &called {
        assert!(
            spec.tools.contains(tool),
            "the annotated manifest's script calls `{tool}`, which is not in its `tools`"
        );
    }
    assert_eq!(first.claim().as_deref(), Some("ok"));
}

#[test]
fn the_example_manifests_the_docs_name_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut named = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (i, _) in text.match_indices("examples/agents/") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/-_.".contains(*c))
                .collect();
            let name = name.trim_end_matches('.');
            if !name.ends_with(".yaml") {
                continue;
            }
            named += 1;
            assert!(
                root.join(name).is_file(),
                "{} names {name}, which does not exist",
                relative(&page)
            );
        }
    }
    assert!(named > 10, "only {named} example manifests named");
}

#[cfg(feature = "sqlite")]
#[test]
fn the_schema_version_the_docs_state_is_the_stores() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/durability.md");
    let text = std::fs::read_to_string(page).unwrap();
    let at = text
        .find("schema version ")
        .expect("docs/durability.md states the schema version");
    let stated: i64 = text[at + "schema version ".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap();
    assert_eq!(stated, agentvisor::stores::sqlite::SCHEMA_VERSION);
}
