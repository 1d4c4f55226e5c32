#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Secrets redacted everywhere: a server that echoes the API key the
//! provider read from its environment variable — in the answer text, in a
//! streamed delta (whole, and split across two), in tool-call arguments and
//! upper-cased in an error body — leaves no trace of it in the result, the
//! events or the SQLite file's records (`runs show --json`).

mod provider_wire;

use provider_wire::{data_events, serve, Reply};
use serde_json::{json, Value};

const CANARY: &str = "sk-canary-Q7f3a9e1c5b2d4680";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_key_echoed_everywhere_is_stored_and_printed_nowhere() {
    let (head, tail) = CANARY.split_at(12);
    let wire = serve(vec![
        Reply::Sse(data_events(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": format!("Your key is {CANARY}. ")}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": format!("Again: {head}")}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": format!("{tail} ok.")}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "upper", "arguments": format!("{{\"text\": \"{CANARY}\"}}")}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ])),
        Reply::status(
            400,
            json!({"error": {"message": format!("INVALID KEY {}", CANARY.to_uppercase())}}),
        ),
    ])
    .await;
    let dir = std::env::temp_dir().join(format!("agentvisor-canary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("echo.yaml");
    std::fs::write(
        &manifest,
        "name: echo\nmodel: openai:echo\nprompt: What is my key?\ntools: [upper]\n",
    )
    .unwrap();
    let db = dir.join("runs.db");
    let run = |args: Vec<String>| {
        let base = wire.base_url.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_agentvisor"))
                .args(&args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("OPENAI_API_KEY", CANARY)
                .env("OPENAI_BASE_URL", base)
                .env_remove("AGENTVISOR_DB")
                .env_remove("AGENTVISOR_TIERS")
                .env("AGENTVISOR_LOG", "debug")
                .output()
                .unwrap()
        })
    };
    let out = run(vec![
        "run".into(),
        manifest.display().to_string(),
        "--events".into(),
        "--json".into(),
        "--db".into(),
        db.display().to_string(),
    ])
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(result["status"], "error", "{stdout}\n{stderr}");
    assert_eq!(result["error_kind"], "bad_request");
    // The echoes did come back, redacted: the answer, the deltas, the
    // tool call and its result, the error.
    assert!(
        stdout.contains("Your key is [REDACTED]. Again: [REDACTED] ok."),
        "{stdout}"
    );
    assert!(stdout.contains("\"text.delta\""), "{stdout}");
    assert!(stdout.contains("INVALID KEY [REDACTED]"), "{stdout}");
    let steps = result["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    assert!(steps[0]["args"].as_str().unwrap().contains("[REDACTED]"));
    // The key went out, in its header only.
    assert_eq!(
        wire.seen()[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );

    let run_id = result["run_id"].as_str().unwrap().to_string();
    let shown = run(vec![
        "runs".into(),
        "show".into(),
        run_id,
        "--json".into(),
        "--db".into(),
        db.display().to_string(),
    ])
    .await
    .unwrap();
    let shown_text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert_eq!(shown.status.code(), Some(0), "{shown_text}");
    assert!(shown_text.contains("[REDACTED]"), "{shown_text}");

    let mut everything = format!("{stdout}\n{stderr}\n{shown_text}");
    for file in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        everything.push_str(&String::from_utf8_lossy(&bytes));
    }
    let lower = everything.to_ascii_lowercase();
    assert!(
        !lower.contains(&CANARY.to_ascii_lowercase()),
        "the canary leaked"
    );
    assert!(!lower.contains("canary-q7f3"), "part of the canary leaked");
    let _ = std::fs::remove_dir_all(&dir);
}
