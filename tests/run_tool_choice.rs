//! `tool_choice` names any tool the model sees — its `tools`, a
//! sub-agent's `agent__NAME`, an MCP server's `SERVER__TOOL` — and
//! `required` counts them all: checked when the manifest loads (the names
//! it can know) and again when its agent is prepared (every tool known),
//! and sent to the model as written. (The MCP half runs against the test
//! server in `tests/mcp_stdio.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};

use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ToolChoice};
use agentvisor::providers::ScriptedModel;
use agentvisor::{AgentSpec, Invocation, RunStatus, SubmitError};
use async_trait::async_trait;
use support::scratch::Scratch;

/// The scripted model (the manifest's `script`), recording the
/// `tool_choice` and the tool names of every request.
struct ChoiceModel {
    inner: ScriptedModel,
    seen: Mutex<Vec<(ToolChoice, Vec<String>)>>,
}

#[async_trait]
impl ChatModel for ChoiceModel {
    fn name(&self) -> &str {
        "chooser"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let names = request.tools.iter().map(|t| t.name.clone()).collect();
        self.seen
            .lock()
            .unwrap()
            .push((request.tool_choice().clone(), names));
        self.inner.complete(request).await
    }
}

const CHILD: &str = "name: helper\nmodel: scripted\nscript:\n  - { text: \"5\" }\n";

/// A parent whose only tool is its sub-agent `helper`, with `choice` as
/// its `tool_choice`.
fn parent(d: &Scratch, choice: &str) -> String {
    let child = d.file("helper.yaml", CHILD);
    format!(
        "name: parent\nmodel: chooser\ntool_choice: {choice}\nagents:\n  helper: {}\nscript:\n  - {{ tool: agent__helper, args: {{ prompt: \"add 2 and 3\" }} }}\n  - {{ text: \"the helper said 5\" }}\n",
        child.display()
    )
}

/// Runs `yaml` (a parent on the recording model) and returns its status
/// and what its model was asked.
async fn run(d: &Scratch, yaml: &str) -> (RunStatus, Vec<(ToolChoice, Vec<String>)>) {
    let p = d.file("parent.yaml", yaml);
    let spec = AgentSpec::from_file(&p).unwrap();
    let model = Arc::new(ChoiceModel {
        inner: ScriptedModel::new(spec.script.clone()),
        seen: Mutex::new(Vec::new()),
    });
    let (host, _store) =
        support::host_from(support::builder().model("chooser", model.clone())).await;
    let result = host.execute(spec, Invocation::default()).await.unwrap();
    host.shutdown().await;
    let seen = model.seen.lock().unwrap().clone();
    (result.status, seen)
}

#[tokio::test]
async fn a_sub_agent_can_be_named() {
    let d = Scratch::new("choice-named");
    let (status, seen) = run(&d, &parent(&d, "agent__helper")).await;
    assert_eq!(status, RunStatus::Ok);
    assert_eq!(seen[0].0, ToolChoice::Tool("agent__helper".into()));
    assert_eq!(seen[0].1, vec!["agent__helper".to_string()]);
}

#[tokio::test]
async fn required_counts_sub_agents() {
    let d = Scratch::new("choice-required");
    let (status, seen) = run(&d, &parent(&d, "required")).await;
    assert_eq!(status, RunStatus::Ok);
    assert_eq!(seen[0].0, ToolChoice::Required);
    assert_eq!(seen[0].1, vec!["agent__helper".to_string()]);
}

#[test]
fn what_the_model_cannot_see_is_refused_when_the_manifest_loads() {
    let d = Scratch::new("choice-refused");
    // A name no tool, sub-agent or MCP server gives.
    let p = d.file("parent.yaml", &parent(&d, "agent__nobody"));
    let e = AgentSpec::from_file(&p).unwrap_err().to_string();
    assert!(e.contains("`tool_choice` names `agent__nobody`"), "{e}");
    assert!(e.contains("line 3"), "{e}");
    // `required` with nothing to call.
    let e = AgentSpec::from_yaml(
        "name: bare\nmodel: scripted\ntool_choice: required\nscript:\n  - { text: hi }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("has no tools"), "{e}");
    // An MCP server's tool parses without being in `tools` (the server's
    // tools are known once it starts), and so does `required` with only
    // a server.
    for choice in ["time__get_current_time", "required"] {
        AgentSpec::from_yaml(&format!(
            "name: clock\nmodel: scripted\ntool_choice: {choice}\nmcp:\n  servers:\n    - {{ name: time, command: [mcp-server-time] }}\nscript:\n  - {{ text: hi }}\n"
        ))
        .unwrap_or_else(|e| panic!("{choice}: {e}"));
    }
    // A tool of another server is refused.
    let e = AgentSpec::from_yaml(
        "name: clock\nmodel: scripted\ntool_choice: web__fetch\nmcp:\n  servers:\n    - { name: time, command: [mcp-server-time] }\nscript:\n  - { text: hi }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`web__fetch`"), "{e}");
}

#[tokio::test]
async fn a_sub_agent_cannot_be_forced_to_call_what_its_parent_withholds() {
    // The child names `upper`, which its parent does not have: the child
    // sees no `upper` (a child gets only its parent's tools), so the
    // parent's agent is refused when it is prepared, naming the child.
    let d = Scratch::new("choice-withheld");
    let child = d.file(
        "helper.yaml",
        "name: helper\nmodel: scripted\ntools: [upper, add]\ntool_choice: upper\nscript:\n  - { text: \"5\" }\n",
    );
    let p = d.file(
        "parent.yaml",
        &format!(
            "name: parent\nmodel: scripted\ntools: [add]\nagents:\n  helper: {}\nscript:\n  - {{ text: hi }}\n",
            child.display()
        ),
    );
    let spec = AgentSpec::from_file(&p).unwrap();
    let (host, _store) = support::host().await;
    match host.agent(spec) {
        Err(e @ SubmitError::ToolChoice { .. }) => {
            let e = e.to_string();
            assert!(e.contains("agent `helper`"), "{e}");
            assert!(e.contains("`upper`"), "{e}");
            assert!(e.contains("its tools: add"), "{e}");
        }
        other => panic!("{:?}", other.map(|_| "prepared")),
    }
    host.shutdown().await;
}
