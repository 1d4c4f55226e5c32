//! The registry and tool sets: registration, preparation, execution.
use super::*;
use crate::ports::run::RunId;
use crate::tools::builtin::builtins;
use async_trait::async_trait;
use serde_json::json;

fn registry() -> ToolRegistry {
    ToolRegistry::with_builtins().with_test_tools()
}

/// A tool that prints a secret in its result, or in its error.
struct Leaky(ToolSpec, bool);

#[async_trait]
impl Tool for Leaky {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _: Value, _: ToolContext) -> Result<String, ToolError> {
        let text = "env: API_KEY=SK-REGISTRY-LEAK-0042".to_string();
        if self.1 {
            Err(ToolError::Failed(text))
        } else {
            Ok(text)
        }
    }
}

#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn known_secrets_never_leave_a_tool() {
    crate::secrets::register("sk-registry-leak-0042");
    for fails in [false, true] {
        let leaky = Arc::new(Leaky(
            ToolSpec {
                name: "leaky".into(),
                description: "prints its environment".into(),
                parameters: json!({"type": "object"}),
            },
            fails,
        ));
        let mut r = ToolRegistry::new();
        r.register(leaky).unwrap();
        let set = r.select(&["leaky".to_string()]).unwrap();
        let call = crate::ports::model::ToolCallRequest {
            id: "c".into(),
            name: "leaky".into(),
            arguments: "{}".into(),
        };
        let ctx = ToolContext::new(RunId(1), "c".into());
        let out = set
            .prepare(&call)
            .unwrap()
            .execute(ctx, Duration::from_secs(1), 1000)
            .await;
        let text = match out {
            Ok(t) => t,
            Err(e) => e.to_string(),
        };
        assert_eq!(text, "env: API_KEY=[REDACTED]", "fails: {fails}");
    }
}

fn all(registry: &ToolRegistry) -> ToolSet {
    match registry.select(&registry.names()) {
        Ok(set) => set,
        Err(e) => panic!("select failed: {e}"),
    }
}

fn call(name: &str, arguments: &str) -> ToolCallRequest {
    ToolCallRequest {
        id: "c1".into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn ctx() -> ToolContext {
    ToolContext::new(RunId::new(), "c1".into())
}

async fn run(set: &ToolSet, name: &str, arguments: &str) -> Result<String, ToolError> {
    run_with(set, name, arguments, Duration::from_secs(5), 1 << 20).await
}

async fn run_with(
    set: &ToolSet,
    name: &str,
    arguments: &str,
    timeout: Duration,
    max: usize,
) -> Result<String, ToolError> {
    set.prepare(&call(name, arguments))?
        .execute(ctx(), timeout, max)
        .await
}

fn invalid(result: Result<PreparedCall, ToolError>) -> String {
    match result {
        Err(ToolError::InvalidArguments(m)) => m,
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
}

#[test]
fn builtins_all_register() {
    assert_eq!(
        ToolRegistry::with_builtins().names(),
        ["add", "echo", "sleep", "upper", "wait"]
    );
    assert_eq!(
        registry().names(),
        ["add", "echo", "fail", "panic", "sleep", "upper", "wait"]
    );
}

#[test]
fn a_hosts_own_tool_replaces_a_builtin_only() {
    let mut r = registry();
    let own = |name: &str| {
        Arc::new(Fixed(ToolSpec {
            name: name.into(),
            description: "mine".into(),
            parameters: json!({"type": "object"}),
        }))
    };
    assert!(r.register_own(own("wait")).is_ok());
    let set = r.select(&["wait".to_string()]).unwrap_or_default();
    assert_eq!(set.specs()[0].description, "mine");
    // Twice is a duplicate: the first is no longer a built-in.
    assert!(matches!(
        r.register_own(own("wait")),
        Err(RegistryError::DuplicateTool(_))
    ));
    assert!(matches!(
        r.register(own("add")),
        Err(RegistryError::DuplicateTool(_))
    ));
}

#[test]
fn duplicate_names_and_bad_schemas_are_refused() {
    let mut r = registry();
    let again = builtins().into_iter().next();
    let Some(again) = again else {
        panic!("no builtins")
    };
    assert!(matches!(
        r.register(again),
        Err(RegistryError::DuplicateTool(_))
    ));
    let bad = Arc::new(Fixed(ToolSpec {
        name: "bad".into(),
        description: String::new(),
        parameters: json!({"type": 12}),
    }));
    assert!(matches!(
        r.register(bad),
        Err(RegistryError::InvalidSchema { .. })
    ));
    let badly_named = Arc::new(Fixed(ToolSpec {
        name: "has space".into(),
        description: String::new(),
        parameters: json!({}),
    }));
    assert!(matches!(
        r.register(badly_named),
        Err(RegistryError::InvalidName(_))
    ));
}

#[test]
fn select_names_an_unknown_tool_and_lists_the_available() {
    let err = registry()
        .select(&["add".into(), "nope".into()])
        .map(|_| ());
    let Err(err) = err else {
        panic!("expected an error")
    };
    let text = err.to_string();
    assert!(
        text.contains("`nope`") && text.contains("add, echo"),
        "{text}"
    );
}

#[test]
fn a_set_keeps_selection_order_and_shares_its_specs() {
    let r = registry();
    let Ok(set) = r.select(&["upper".into(), "add".into(), "upper".into()]) else {
        panic!("select failed")
    };
    let names: Vec<String> = set.specs().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["upper", "add"]);
    assert!(Arc::ptr_eq(&set.specs(), &set.clone().specs()));
    assert!(!set.is_empty() && set.contains("add") && !set.contains("echo"));
    assert!(ToolSet::default().is_empty());
}

#[test]
fn select_with_adds_compiled_tools_after_the_selected_ones() {
    let r = registry();
    let tool = |name: &str| {
        let t: Arc<dyn Tool> = Arc::new(Fixed(ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        }));
        match CompiledTool::new(t) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    };
    let extra = [tool("srv__a"), tool("srv__b")];
    let Ok(set) = r.select_with(&["upper".into(), "srv__b".into()], &extra) else {
        panic!("select_with failed")
    };
    let names: Vec<String> = set.specs().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["upper", "srv__a", "srv__b"]);
    assert!(invalid(set.prepare(&call("srv__a", r#"{"x": "no"}"#))).contains("`/x`"));
    let bad: Arc<dyn Tool> = Arc::new(Fixed(ToolSpec {
        name: "a.b".into(),
        description: String::new(),
        parameters: json!({}),
    }));
    assert!(matches!(
        CompiledTool::new(bad),
        Err(RegistryError::InvalidName(_))
    ));
}

#[test]
fn unknown_tool_is_refused() {
    let r = registry();
    let Ok(set) = r.select(&["add".into()]) else {
        panic!("select failed")
    };
    let err = set.prepare(&call("upper", "{}")).map(|_| ());
    assert_eq!(err, Err(ToolError::UnknownTool("upper".into())));
}

#[test]
fn bad_arguments_are_refused_before_any_tool_runs() {
    let set = all(&registry());
    assert!(invalid(set.prepare(&call("add", "{a: 1"))).contains("not valid JSON"));
    assert!(invalid(set.prepare(&call("add", "[1, 2]"))).contains("JSON object"));
    assert!(invalid(set.prepare(&call("add", r#"{"a": "1", "b": 2}"#))).contains("`/a`"));
    assert!(invalid(set.prepare(&call("add", r#"{"a": 1}"#))).contains("\"b\""));
    assert!(invalid(set.prepare(&call("add", r#"{"a": 1, "b": 2, "c": 3}"#))).contains("'c'"));
    assert!(invalid(set.prepare(&call("add", ""))).contains("required"));
    let huge = format!(r#"{{"text": "{}"}}"#, "x".repeat(70 * 1024));
    assert!(invalid(set.prepare(&call("echo", &huge))).contains("limit"));
    assert!(invalid(set.prepare(&call("sleep", r#"{"ms": -1}"#))).contains("`/ms`"));
}

#[test]
fn empty_arguments_are_accepted_when_nothing_is_required() {
    let set = all(&registry());
    for text in ["", "  ", "{}"] {
        let prepared = set.prepare(&call("fail", text));
        assert_eq!(prepared.map(|p| p.args).ok(), Some(json!({})), "{text:?}");
    }
}

#[tokio::test]
async fn add_and_upper_return_their_results() {
    let set = all(&registry());
    assert_eq!(
        run(&set, "add", r#"{"a": 2, "b": 3}"#).await,
        Ok("5".into())
    );
    assert_eq!(
        run(&set, "add", r#"{"a": 0.5, "b": 1}"#).await,
        Ok("1.5".into())
    );
    assert_eq!(
        run(&set, "upper", r#"{"text": "héllo"}"#).await,
        Ok("HÉLLO".into())
    );
    assert_eq!(
        run(&set, "echo", r#"{"text": "hi"}"#).await,
        Ok("hi".into())
    );
}

#[tokio::test]
async fn a_failing_tool_is_an_error_result() {
    let set = all(&registry());
    assert_eq!(
        run(&set, "fail", r#"{"reason": "nope"}"#).await,
        Err(ToolError::Failed("nope".into()))
    );
}

#[tokio::test]
async fn a_panicking_tool_becomes_panicked() {
    let set = all(&registry());
    assert_eq!(
        run(&set, "panic", r#"{"message": "boom"}"#).await,
        Err(ToolError::Panicked("boom".into()))
    );
    let formatted = Arc::new(PanicsFormatted);
    let mut r = ToolRegistry::new();
    assert!(r.register(formatted).is_ok());
    let set = all(&r);
    assert_eq!(
        run(&set, "formatted", "").await,
        Err(ToolError::Panicked("code 7".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_tool_times_out() {
    let set = all(&registry());
    let result = run_with(
        &set,
        "sleep",
        r#"{"ms": 60000}"#,
        Duration::from_millis(50),
        1024,
    )
    .await;
    assert_eq!(result, Err(ToolError::Timeout(50)));
    let quick = run_with(
        &set,
        "sleep",
        r#"{"ms": 10}"#,
        Duration::from_millis(50),
        1024,
    );
    assert_eq!(quick.await, Ok("slept 10 ms".into()));
}

#[tokio::test]
async fn results_and_errors_are_capped() {
    let set = all(&registry());
    let long = "a".repeat(5000) + &"z".repeat(5000);
    let args = json!({ "text": long }).to_string();
    let Ok(text) = run_with(&set, "echo", &args, Duration::from_secs(5), 200).await else {
        panic!("echo failed")
    };
    assert!(text.len() <= 260, "{}", text.len());
    assert!(text.starts_with("aaa") && text.ends_with("zzz") && text.contains("cut"));

    let args = json!({ "reason": long }).to_string();
    match run(&set, "fail", &args).await {
        Err(ToolError::Failed(m)) => assert!(m.len() <= MAX_ERROR_BYTES + 64, "{}", m.len()),
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[test]
fn panic_payloads_of_either_string_type_are_read() {
    assert_eq!(panic_text(&"static"), "static");
    assert_eq!(panic_text(&String::from("owned")), "owned");
    assert_eq!(panic_text(&42_u8), "non-string panic payload");
}

#[test]
fn sets_and_executions_can_cross_threads() {
    fn is_send_sync<T: Send + Sync>(_: &T) {}
    fn is_send<T: Send>(_: &T) {}
    let set = all(&registry());
    is_send_sync(&set);
    if let Ok(prepared) = set.prepare(&call("echo", r#"{"text": "x"}"#)) {
        is_send(&prepared.execute(ctx(), Duration::from_secs(1), 10));
    }
}

/// A tool that is never called: for registration tests.
struct Fixed(ToolSpec);

#[async_trait]
impl Tool for Fixed {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        Ok(String::new())
    }
}

/// A tool whose panic payload is a formatted `String`.
struct PanicsFormatted;

#[async_trait]
impl Tool for PanicsFormatted {
    fn spec(&self) -> &ToolSpec {
        static SPEC: std::sync::OnceLock<ToolSpec> = std::sync::OnceLock::new();
        SPEC.get_or_init(|| ToolSpec {
            name: "formatted".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        })
    }
    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let code = 7;
        panic!("code {code}");
    }
}
