//! Run with: cargo run --example session
//!
//! A chat session: two prompts, the second answerable only from the first.
//! The model here is a small stand-in that reads nothing but the transcript
//! it is sent, so the second answer shows that the session's history
//! reached the second run. The second prompt streams its answer, and the
//! session's lifecycle is watched from another task.
//!
//! `examples/delegate.rs` adds sub-agents to such a session.

use std::sync::Arc;

use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, Role};
use agentvisor::{AgentSpec, Host, RunEvent, SessionOptions};
use async_trait::async_trait;

/// Remembers nothing itself: "remember N" is noted, "what number…" is
/// answered from the earlier user turns in the transcript.
struct Notebook;

#[async_trait]
impl ChatModel for Notebook {
    fn name(&self) -> &str {
        "notebook"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let users: Vec<&str> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
            .collect();
        let last = users.last().copied().unwrap_or_default();
        let number_in = |text: &str| {
            text.split(|c: char| !c.is_ascii_digit())
                .find(|w| !w.is_empty())
                .map(str::to_string)
        };
        let text = if let Some(n) = number_in(last).filter(|_| last.contains("remember")) {
            format!("Noted: {n}.")
        } else {
            let earlier = users[..users.len().saturating_sub(1)]
                .iter()
                .rev()
                .find(|u| u.contains("remember"))
                .and_then(|u| number_in(u));
            match earlier {
                Some(n) => format!("You asked me to remember {n}."),
                None => "I have nothing to go on.".to_string(),
            }
        };
        if let Some(sink) = &request.on_delta {
            for word in text.split_inclusive(' ') {
                sink(word);
            }
        }
        Ok(ChatResponse {
            text,
            ..Default::default()
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host = Host::builder()
        .model("notebook", Arc::new(Notebook))
        .build()
        .await?;
    let spec = AgentSpec::from_yaml(
        "name: notebook\nmodel: notebook\nsystem: You keep numbers for the user.\n",
    )?;
    let chat = host.open_session(spec, SessionOptions::default()).await?;
    let mut lifecycle = chat.watch();
    let watcher = tokio::spawn(async move {
        let mut seen = vec![*lifecycle.borrow_and_update()];
        while lifecycle.changed().await.is_ok() {
            let state = *lifecycle.borrow_and_update();
            seen.push(state);
            if state == agentvisor::SessionState::Closed {
                break;
            }
        }
        seen
    });

    let first = chat.prompt("Please remember 42.").await?;
    println!(
        "> Please remember 42.\n{}",
        first.output.unwrap_or_default()
    );

    // The second prompt, streamed: its run starts from the first turn.
    println!("> Which number did I ask you to remember?");
    let mut turn = chat
        .prompt_streaming("Which number did I ask you to remember?")
        .await?;
    while let Some(e) = turn.events().next().await {
        if let RunEvent::TextDelta { text, .. } = e.event {
            print!("{text}");
        }
    }
    println!();
    let second = turn.result().await?;
    println!("({} · run {})", second.status, second.run_id);

    // The same conversation, reached by its id (as an HTTP handler would).
    let again = host.session(chat.id()).await?;
    for m in again.history().await? {
        println!("  {:>2} {:?}: {}", m.seq, m.message.role, m.message.content);
    }
    chat.close().await?;
    let seen: Vec<String> = watcher.await?.iter().map(|s| s.to_string()).collect();
    // A watch shows the latest state: a change it was too slow to see is
    // folded into the next.
    println!("lifecycle seen: {}", seen.join(" → "));
    host.shutdown().await;
    Ok(())
}
