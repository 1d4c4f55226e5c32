//! Run with: cargo run --example delegate
//!
//! A chat session whose agent delegates: the first prompt makes the
//! planner call two sub-agents in parallel (`agent__forecast` and
//! `agent__listings`, each a run of its own under the same critic) and
//! answer from their results; the second prompt, in the same session, can
//! only be answered from the first answer.
//!
//! The sub-agents are scripted (`examples/agents/delegate-*.yaml`). The
//! planner is a small stand-in model that reads nothing but the transcript
//! it is sent: its first answer is made of the sub-agents' tool results,
//! its second of the session's history, so what it says shows what reached
//! it. Nothing goes over the network.
//!
//! The planner's event stream carries the sub-agents' events too, tagged
//! with their own `run_id` and their `parent_run_id`; the two run at once,
//! so the step takes about as long as the slower of them.

use std::sync::Arc;
use std::time::Instant;

use agentvisor::ports::audit::{RunFilter, RunIndex};
use agentvisor::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, Role, ToolCallRequest,
};
use agentvisor::stores::MemoryAuditStore;
use agentvisor::{AgentSpec, Host, RunEvent, SessionOptions};
use async_trait::async_trait;

/// Plans an evening from what its sub-agents say, and answers follow-ups
/// from its earlier answers (see the module doc).
struct Planner;

impl Planner {
    /// The sub-agents' answers: the tool results after the last assistant
    /// message that called tools, by tool name.
    fn results<'a>(messages: &'a [Message], tool: &str) -> &'a str {
        let Some(ask) = messages
            .iter()
            .rposition(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
        else {
            return "(nobody was asked)";
        };
        messages[ask]
            .tool_calls
            .iter()
            .find(|c| &*c.name == tool)
            .and_then(|c| {
                messages[ask + 1..]
                    .iter()
                    .find(|m| m.tool_call_id.as_deref() == Some(&*c.id))
            })
            .map_or("(no answer)", |m| m.content.as_str())
    }
}

#[async_trait]
impl ChatModel for Planner {
    fn name(&self) -> &str {
        "planner"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let messages = request.messages.as_slice();
        let last = messages.last().map(|m| (m.role, m.content.as_str()));
        let call = |id: &str, tool: &str, prompt: &str| ToolCallRequest {
            id: Arc::from(id),
            name: Arc::from(tool),
            arguments: Arc::from(serde_json::json!({ "prompt": prompt }).to_string()),
        };
        let mut response = ChatResponse::default();
        match last {
            // The sub-agents have answered: the plan is made of what they said.
            Some((Role::Tool, _)) => {
                response.text = format!(
                    "Saturday in Oslo: {}. For the evening: {}.",
                    Self::results(messages, "agent__forecast"),
                    Self::results(messages, "agent__listings")
                );
            }
            // A new plan: ask both sub-agents at once.
            Some((Role::User, text)) if text.contains("Saturday") => {
                response.tool_calls = vec![
                    call(
                        "c1",
                        "agent__forecast",
                        "The weather in Oslo on Saturday evening?",
                    ),
                    call(
                        "c2",
                        "agent__listings",
                        "What is on in Oslo on Saturday evening?",
                    ),
                ];
            }
            // A follow-up: only the earlier answer, in the history, can tell.
            _ => {
                let earlier = messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::Assistant && m.content.starts_with("Saturday"));
                response.text = match earlier {
                    Some(m) if m.content.contains("rain") => format!(
                        "Yes: the plan I gave you says \"{}\"",
                        m.content.split(". ").next().unwrap_or_default()
                    ),
                    Some(_) => "No, the plan I gave you has no rain in it.".into(),
                    None => "I have no plan to go on.".into(),
                };
            }
        }
        if let Some(sink) = &request.on_delta {
            for word in response.text.split_inclusive(' ') {
                sink(word);
            }
        }
        Ok(response)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryAuditStore::new());
    let host = Host::builder()
        .model("planner", Arc::new(Planner))
        .audit_store(store.clone())
        .build()
        .await?;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents");
    let spec = AgentSpec::from_yaml(&format!(
        "name: planner\nmodel: planner\nsystem: You plan evenings out. Ask your sub-agents, then answer from what they say.\nagents:\n  forecast: {dir}/delegate-forecast.yaml\n  listings: {dir}/delegate-listings.yaml\n"
    ))?;
    let chat = host.open_session(spec, SessionOptions::default()).await?;

    // The first prompt, streamed: the planner's events and its sub-agents'.
    let prompt = "What can I do in Oslo on Saturday evening?";
    println!("> {prompt}");
    let started = Instant::now();
    let mut turn = chat.prompt_streaming(prompt).await?;
    let lead = turn.run_id();
    while let Some(e) = turn.events().next().await {
        let from_child = e.parent_run_id == Some(lead);
        match &e.event {
            RunEvent::ToolCall { tool, args, .. } if e.run_id == lead => {
                println!("  planner calls {tool} {args}");
            }
            RunEvent::StepStart { iteration: 1 } if from_child => {
                let agent = host.run(&e.run_id).map(|r| r.agent().to_string());
                println!(
                    "  sub-agent {} started: run {} (parent {lead})",
                    agent.unwrap_or_default(),
                    e.run_id
                );
            }
            RunEvent::RunEnd {
                status,
                output,
                duration_ms,
                ..
            } if from_child => {
                println!(
                    "  sub-agent run {} ended {status} after {duration_ms} ms: {}",
                    e.run_id,
                    output.as_deref().unwrap_or_default()
                );
            }
            RunEvent::TextDelta { text, .. } if e.run_id == lead => print!("{text}"),
            _ => {}
        }
    }
    println!();
    let first = turn.result().await?;
    println!(
        "({} · run {} · {} ms: the sub-agents' 300 ms and 200 ms ran at once)",
        first.status,
        first.run_id,
        started.elapsed().as_millis()
    );

    // The second prompt: its run starts from the session's history.
    let prompt = "Should I take an umbrella?";
    println!("> {prompt}");
    let second = chat.prompt(prompt).await?;
    println!("{}", second.output.unwrap_or_default());
    println!("({} · run {})", second.status, second.run_id);

    chat.close().await?;
    host.shutdown().await;

    // On record: the planner's first run and the two runs under it.
    let mut tree = store
        .list_runs(&RunFilter {
            root: Some(first.run_id),
            ..RunFilter::default()
        })
        .await?;
    tree.sort_by_key(|r| (r.parent_run_id.is_some(), r.started_at, r.run_id));
    println!("run tree of {}:", first.run_id);
    for r in &tree {
        let under = r
            .parent_run_id
            .map(|p| format!(" (parent {p})"))
            .unwrap_or_default();
        println!("  {} {} {}{under}", r.run_id, r.agent, r.status);
    }
    Ok(())
}
