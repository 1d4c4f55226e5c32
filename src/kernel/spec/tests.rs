//! Manifest parsing and limit resolution.

use super::*;

#[test]
fn minimal_spec_resolves_back() {
    let none = LimitsSpec::default();
    let defaults = Limits::default();
    assert_eq!(defaults.to_minimal_spec(), none);
    let layers = [
        LimitsSpec {
            max_runtime: Some(Duration::from_secs(30)),
            ..none
        },
        LimitsSpec {
            max_runtime: Some(Duration::from_secs(30)),
            soft_timeout: Some(Duration::from_secs(60)),
            max_iterations: Some(4),
            context_window: Some(0),
            ..none
        },
        LimitsSpec {
            hard_timeout: Some(Duration::from_secs(7)),
            repeat_limit: Some(1),
            ..none
        },
    ];
    for layer in layers {
        let limits = layer.resolve(&none);
        let minimal = limits.to_minimal_spec();
        assert_eq!(minimal.resolve(&none), limits, "{layer:?}");
        assert!(minimal.kill_grace.is_none() && minimal.tool_timeout.is_none());
    }
    // A derived default is kept when its base changed but it did not.
    let limits = layers[1].resolve(&none);
    assert_eq!(
        limits.to_minimal_spec().soft_timeout,
        Some(Duration::from_secs(60))
    );
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    for bad in ["", "5 parsecs", "ms", "10x", "-1s", "1e99h"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn limits_resolve_with_derived_defaults() {
    let l = Limits::default();
    assert_eq!(l.max_iterations, 12);
    assert_eq!(l.max_runtime, Duration::from_secs(60));
    assert_eq!(l.soft_timeout, Duration::from_secs(60));
    assert_eq!(l.hard_timeout, Duration::from_secs(120));
    assert_eq!(l.extension, Duration::from_secs(60));
    let manifest = LimitsSpec {
        max_runtime: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let run = LimitsSpec {
        max_iterations: Some(3),
        ..Default::default()
    };
    let l = run.resolve(&manifest);
    assert_eq!(l.max_iterations, 3);
    assert_eq!(l.hard_timeout, Duration::from_secs(20));
    assert_eq!(l.soft_timeout, Duration::from_secs(10));
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let err = AgentSpec::from_yaml("name: a\nscript:\n  - {text: hi}\nlimmits: {}\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("limmits") && err.contains("line 4"), "{err}");
}

#[test]
fn context_window_is_a_limit_and_typos_are_refused() {
    let yaml = "name: a\nlimits: {context_window: 8000}\nscript: [{text: hi}]\n";
    let limits = AgentSpec::from_yaml(yaml).map(|s| s.limits.resolve(&LimitsSpec::default()));
    assert_eq!(limits.ok().and_then(|l| l.context_window), Some(8000));
    assert_eq!(Limits::default().context_window, None);
    let err = AgentSpec::from_yaml(&yaml.replace("context_window", "context_windows"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("context_windows"), "{err}");
}

#[test]
fn bad_duration_is_named() {
    let err =
        AgentSpec::from_yaml("name: a\nlimits: {max_runtime: 5 parsecs}\nscript: [{text: hi}]\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
    assert!(err.contains("5 parsecs") && err.contains("line 2"), "{err}");
}

#[test]
fn inputs_fill_the_template() {
    let mut inputs = BTreeMap::new();
    inputs.insert("city".to_string(), Value::String("Oslo".into()));
    inputs.insert("days".to_string(), serde_json::json!(3));
    inputs.insert(
        "opts".to_string(),
        serde_json::json!({"b": [1, 2], "a": null}),
    );
    let filled = fill_inputs(
        "prompt",
        "{{inputs.city}} for {{ inputs.days }} days {{inputs.opts}}; {{other}} {{ and {{inputs.city}}",
        &inputs,
    );
    assert_eq!(
        filled.as_deref().ok(),
        Some(r#"Oslo for 3 days {"a":null,"b":[1,2]}; {{other}} {{ and Oslo"#)
    );
    let missing = fill_inputs("system", "x {{inputs.nope}}", &inputs);
    assert_eq!(
        missing.err().map(|e| e.to_string()).unwrap_or_default(),
        "the manifest's `system` uses `{{inputs.nope}}`, but the invocation has no input `nope`"
    );
    assert!(matches!(
        fill_inputs("prompt", "plain", &inputs),
        Ok(std::borrow::Cow::Borrowed("plain"))
    ));
}

#[test]
fn empty_script_entry_is_refused() {
    let err = AgentSpec::from_yaml("name: a\nscript: [{latency: 5ms}]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("entry 1"), "{err}");
}

#[test]
fn tools_effects_override_callable_tools_only_and_name_known_classes() {
    use crate::ports::tool::ToolEffect;
    let spec = AgentSpec::from_yaml(
        "name: a\nmodel: scripted\nscript: [{ text: hi }]\ntools: [add, echo]\ntools_effects: { echo: egress, add: read }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.tools_effects.get("echo"), Some(&ToolEffect::Egress));
    assert_eq!(spec.tools_effects.get("add"), Some(&ToolEffect::Read));
    let e = AgentSpec::from_yaml(
        "name: a\nmodel: scripted\nscript: [{ text: hi }]\ntools: [add]\ntools_effects: { send_mail: read }\n",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("`tools_effects` names `send_mail`") && e.contains("line 5"),
        "{e}"
    );
    let e = AgentSpec::from_yaml(
        "name: a\nmodel: scripted\nscript: [{ text: hi }]\ntools: [add]\ntools_effects: { add: reads }\n",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("unknown variant `reads`"), "{e}");
    assert_eq!("egress".parse::<ToolEffect>(), Ok(ToolEffect::Egress));
    assert!("x".parse::<ToolEffect>().is_err());
    assert_eq!(ToolEffect::default(), ToolEffect::Unknown);
}
