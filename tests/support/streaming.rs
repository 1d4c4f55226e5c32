//! A model that streams like an HTTP provider, on paused time: every piece
//! is a sign of life and text for the call's observer and listener.

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::Usage;
use async_trait::async_trait;

/// A model that streams like an HTTP provider: waits `first`, then sends
/// each piece (a sign of life and text for the observer and the listener)
/// `between` apart, then answers with the whole text, or hangs.
pub(crate) struct Streamer {
    first: Option<Duration>,
    pieces: Vec<&'static str>,
    between: Duration,
    hang_after: bool,
}

#[async_trait]
impl ChatModel for Streamer {
    fn name(&self) -> &str {
        "streamer"
    }

    fn streams(&self) -> bool {
        true
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        match self.first {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
        for (i, p) in self.pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(self.between).await;
            }
            request.alive();
            if let Some(sink) = &request.on_delta {
                sink(p);
            }
            if let Some(o) = &request.observer {
                o.text(p);
            }
        }
        if self.hang_after {
            std::future::pending::<()>().await;
        }
        Ok(ChatResponse {
            text: self.pieces.concat(),
            tool_calls: Vec::new(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            finish_reason: Some("stop".into()),
        })
    }
}

/// A [`Streamer`] of the first `pieces` words of a short answer: the first
/// after `first` ms (never, for `None`), the rest `between` ms apart; with
/// `hang_after`, it never answers once they are sent.
pub(crate) fn streamer(
    first: Option<u64>,
    pieces: usize,
    between: u64,
    hang_after: bool,
) -> Arc<Streamer> {
    const WORDS: [&str; 12] = [
        "The ", "answer ", "is ", "five, ", "and ", "that ", "is ", "all ", "there ", "is ", "to ",
        "it.",
    ];
    Arc::new(Streamer {
        first: first.map(Duration::from_millis),
        pieces: WORDS[..pieces].to_vec(),
        between: Duration::from_millis(between),
        hang_after,
    })
}
