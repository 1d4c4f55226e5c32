//! Manifest bounds: every integer or duration beyond its documented range is
//! a `SpecError` naming the key (and its line), never a panic; a manifest
//! over 1 MiB or nested past 64 levels is refused before parsing; whatever
//! a manifest that parses says, its run ends without a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use agentvisor::spec::{AgentSpec, MAX_MANIFEST_BYTES};
use agentvisor::{Host, Invocation};
use proptest::prelude::*;

const DURATION_KEYS: [&str; 7] = [
    "max_runtime",
    "soft_timeout",
    "hard_timeout",
    "stall_timeout",
    "extension",
    "tool_timeout",
    "kill_grace",
];
const COUNT_KEYS: [&str; 6] = [
    "max_iterations",
    "max_extensions",
    "repeat_limit",
    "max_tool_errors",
    "max_tool_result_bytes",
    "context_window",
];

fn manifest(key: &str, value: &str) -> String {
    format!("name: bounds\ntools: [echo]\nlimits:\n  {key}: {value}\nscript:\n  - {{ tool: echo, args: {{ text: hi }} }}\n  - {{ text: done }}\n")
}

fn refusal(yaml: &str) -> String {
    match AgentSpec::from_yaml(yaml) {
        Ok(s) => panic!("accepted: {:?}\n{yaml}", s.limits),
        Err(e) => e.to_string(),
    }
}

#[test]
fn out_of_range_values_are_refused_naming_the_key_and_line() {
    let cases: &[(&str, &str)] = &[
        ("max_runtime", "18446744073709551615"),
        ("hard_timeout", "1e30"),
        ("hard_timeout", "-5"),
        ("stall_timeout", ".nan"),
        ("soft_timeout", ".inf"),
        ("extension", "25h"),
        ("kill_grace", "\"86401\""),
        ("tool_timeout", "0"),
        ("max_runtime", "0s"),
        ("max_iterations", "0"),
        ("max_iterations", "4294967296"),
        ("max_iterations", "100001"),
        ("max_extensions", "1001"),
        ("repeat_limit", "0"),
        ("max_tool_errors", "-1"),
        ("max_tool_result_bytes", "10"),
        ("max_tool_result_bytes", "2.5"),
        ("context_window", "18446744073709551615"),
    ];
    for (key, value) in cases {
        let err = refusal(&manifest(key, value));
        assert!(err.contains(key), "{key}: {value}: {err}");
        assert!(err.contains("line 4"), "{key}: {value}: {err}");
    }
}

#[test]
fn values_at_the_edges_of_their_ranges_are_accepted() {
    for (key, value) in [
        ("max_runtime", "24h"),
        ("hard_timeout", "86400"),
        ("soft_timeout", "0"),
        ("kill_grace", "0.5"),
        ("max_iterations", "100000"),
        ("max_extensions", "1000"),
        ("max_tool_result_bytes", "256"),
        ("context_window", "0"),
    ] {
        let spec = AgentSpec::from_yaml(&manifest(key, value));
        assert!(spec.is_ok(), "{key}: {value}: {:?}", spec.err());
    }
}

#[test]
fn a_manifest_over_one_mib_is_refused_before_parsing() {
    let mut yaml = String::from("name: big\nscript: [{text: hi}]\nsystem: \"");
    yaml.push_str(&"x".repeat(MAX_MANIFEST_BYTES));
    yaml.push_str("\"\n");
    let err = refusal(&yaml);
    assert!(err.contains("1 MiB"), "{err}");

    let dir = std::env::temp_dir().join(format!("agentvisor-bounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let err = AgentSpec::from_file(&file).err().unwrap().to_string();
    assert!(err.contains("1 MiB"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    // Flow style: 100 000 levels in 200 KB.
    let flow = format!(
        "name: deep\nscript: [{{text: hi}}]\ndescription: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    // Block style: a mapping 100 levels deep.
    let mut block = String::from("name: deep\nscript: [{text: hi}]\noutput_schema:\n");
    for i in 0..100 {
        block.push_str(&" ".repeat(2 * (i + 1)));
        block.push_str("k:\n");
    }
    // Dashes: a sequence 100 levels deep on one line.
    let dashes = format!(
        "name: deep\nscript: [{{text: hi}}]\ntools:\n  {}x\n",
        "- ".repeat(100)
    );
    for yaml in [flow, block, dashes] {
        let started = Instant::now();
        let err = refusal(&yaml);
        assert!(err.contains("64 levels"), "{err}");
        // Generous: the check is one pass (milliseconds); the unbounded
        // parse it prevents took seconds.
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

#[test]
fn ordinary_nesting_block_scalars_and_the_example_manifests_pass_the_shape_check() {
    let yaml = r#"
name: shaped
system: |
  A prompt with [unbalanced brackets and {braces
        and deep
                indentation
prompt: "quoted [ and { and # inside"
tools: [echo]
output_schema:
  type: object
  properties:
    a: { type: array, items: { type: object, properties: { b: { type: string } } } }
script:
  - { text: "{\"a\": []}" }
"#;
    assert!(
        AgentSpec::from_yaml(yaml).is_ok(),
        "{:?}",
        AgentSpec::from_yaml(yaml).err()
    );
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let parsed = AgentSpec::from_file(&path);
        assert!(parsed.is_ok(), "{}: {:?}", path.display(), parsed.err());
    }
}

/// A value a manifest might write for a limit key.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (0u64..200).prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| format!("{x:?}")),
        Just(".nan".to_string()),
        Just("-.inf".to_string()),
        (
            0u64..100_000,
            prop_oneof![Just("ms"), Just("s"), Just("m"), Just("h")]
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (0.0f64..1e12, prop_oneof![Just("ms"), Just("s"), Just("h")])
            .prop_map(|(x, u)| format!("{x}{u}")),
        "[a-z0-9.]{0,12}".prop_map(|t| format!("\"{t}\"")),
    ]
}

fn any_key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(
        DURATION_KEYS
            .iter()
            .chain(COUNT_KEYS.iter())
            .copied()
            .collect::<Vec<_>>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Either a clean error naming the key, or a spec whose run ends (on
    /// paused time) without a panic, on the caller or on a shard.
    #[test]
    fn any_value_at_any_limit_key_is_refused_by_name_or_runs(
        key in any_key(),
        value in any_value(),
        second in proptest::option::of((any_key(), any_value())),
    ) {
        let mut yaml = manifest(key, &value);
        if let Some((k2, v2)) = &second {
            if *k2 != key {
                yaml = yaml.replace("limits:\n", &format!("limits:\n  {k2}: {v2}\n"));
            }
        }
        match AgentSpec::from_yaml(&yaml) {
            Err(e) => {
                let text = e.to_string();
                let named = text.contains(key)
                    || second.as_ref().is_some_and(|(k2, _)| text.contains(k2));
                prop_assert!(named, "{text}\n{yaml}");
            }
            Ok(spec) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .start_paused(true)
                    .build()
                    .unwrap();
                let result = rt.block_on(async move {
                    let host = Host::builder().build().await.unwrap();
                    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
                    host.shutdown().await;
                    r
                });
                prop_assert!(result.status.to_string().len() > 1);
                prop_assert_ne!(result.error_kind.as_deref(), Some("panic"), "{:?}", result);
            }
        }
    }
}
