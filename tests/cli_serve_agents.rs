//! `agentvisor serve --agents DIR` as a new user runs it: the examples
//! folder (one manifest of which names an MCP server) is served; a folder
//! with manifests that cannot be prepared serves the rest, and
//! `GET /v1/agents` says which were left out and why; a manifest with MCP
//! servers starts them on its first use, not when the server starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{json, Value};
use support::scratch::Scratch;
use support::serving::Serving;

fn names(agents: &Value) -> Vec<String> {
    agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_folder_is_served_with_its_mcp_manifest() {
    let dir = Scratch::new("serve-examples");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agents");
    let s = Serving::start(&dir.0.join("serve.db"), &examples, &[]);
    let (code, agents) = s.call("GET", "/v1/agents", None).await;
    assert_eq!(code, 200, "{agents}");
    let listed = names(&agents);
    for name in ["hello", "time"] {
        assert!(listed.iter().any(|n| n == name), "{name}: {agents}");
    }
    assert_eq!(agents["failed"], json!([]), "{agents}");
    let (code, v) = s
        .call("POST", "/v1/runs?wait=10", Some(json!({"agent": "hello"})))
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_that_cannot_be_prepared_are_skipped_and_listed() {
    let dir = Scratch::new("serve-skip");
    let agents = dir.0.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    let quick = "name: quick\nmodel: scripted\nprompt: hi\nscript:\n  - { text: hello }\n";
    std::fs::write(agents.join("a-quick.yaml"), quick).unwrap();
    std::fs::write(agents.join("b-same-name.yaml"), quick).unwrap();
    std::fs::write(
        agents.join("c-bad-model.yaml"),
        "name: badmodel\nmodel: nosuch:thing\nprompt: hi\n",
    )
    .unwrap();
    std::fs::write(agents.join("d-broken.yaml"), "name: [unclosed\n").unwrap();
    std::fs::write(
        agents.join("e-bad-tool.yaml"),
        "name: badtool\nmodel: scripted\ntools: [no_such_tool]\nscript:\n  - { text: x }\n",
    )
    .unwrap();
    // Its server's command does not exist: nothing tells at start (the
    // server is not started then); its first run ends with the start error.
    std::fs::write(
        agents.join("f-mcp.yaml"),
        "name: withmcp\nmodel: scripted\nprompt: hi\nmcp:\n  servers:\n    - { name: t, command: [agentvisor-no-such-mcp-server] }\nscript:\n  - { text: x }\n",
    )
    .unwrap();
    let s = Serving::start(&dir.0.join("serve.db"), &agents, &[]);
    let (code, v) = s.call("GET", "/v1/agents", None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(names(&v), ["quick", "withmcp"], "{v}");
    let failed = v["failed"].as_array().unwrap();
    let files: Vec<&str> = failed
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap();
            file.rsplit('/').next().unwrap()
        })
        .collect();
    assert_eq!(
        files,
        [
            "b-same-name.yaml",
            "c-bad-model.yaml",
            "d-broken.yaml",
            "e-bad-tool.yaml"
        ],
        "{v}"
    );
    let reason = |i: usize| failed[i]["reason"].as_str().unwrap().to_string();
    assert!(reason(0).contains("a-quick.yaml"), "{}", reason(0));
    assert!(reason(1).contains("nosuch:thing"), "{}", reason(1));
    assert!(reason(3).contains("no_such_tool"), "{}", reason(3));

    let (code, r) = s
        .call("POST", "/v1/runs?wait=10", Some(json!({"agent": "quick"})))
        .await;
    assert_eq!((code, r["status"].as_str()), (201, Some("ok")), "{r}");
    let (code, r) = s
        .call(
            "POST",
            "/v1/runs?wait=10",
            Some(json!({"agent": "withmcp"})),
        )
        .await;
    assert_eq!(code, 201, "{r}");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error_kind"], "mcp_server_start_failed", "{r}");
    let (code, r) = s
        .call("POST", "/v1/runs", Some(json!({"agent": "badmodel"})))
        .await;
    assert_eq!(code, 404, "{r}");
    s.stop().await;
}
