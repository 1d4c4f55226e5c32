//! Context compaction as a run does it: the summary call before the step
//! that needs it, and what its answer (or its failure) makes of the
//! transcript (see `crate::compaction`).

use std::sync::Arc;

use super::{RunMsg, RunState};
use crate::actors::watch::Beat;
use crate::compaction::{self, Due};
use crate::ports::event::RunEvent;
use crate::ports::model::{ChatRequest, ChatResponse, ModelError, ToolSpec};

impl RunState {
    /// Makes the summary call of a due compaction (before the step that
    /// needs it). It offers no tools and streams nothing; retries are
    /// reported like a step's.
    pub(super) fn summarize(&mut self, due: Due) {
        let messages = compaction::summary_request(&self.transcript, due.cut);
        let tools: Arc<[ToolSpec]> = Arc::from(Vec::new());
        let call_index = self.compaction.call_index(self.iteration);
        let mut request = ChatRequest::new(Arc::new(messages), tools, call_index);
        request.deadline = Some(self.started + self.limits.hard_timeout);
        request.on_retry = self.retry_sink();
        self.compaction.started(self.iteration, due);
        // A fresh stall window for the summary call.
        self.beat(Beat::Alive);
        let done = |epoch, result| RunMsg::SummaryDone { epoch, result };
        if let Some(result) = self.start_call(request, done) {
            self.summary_done(result);
        }
    }

    /// A summary call ended: its usage is charged; on success the middle of
    /// the transcript becomes the summary (`transcript.compacted`), on any
    /// failure the transcript stays whole (a `compaction_failed` warning).
    /// Either way the step goes on.
    pub(super) fn summary_done(&mut self, result: Result<ChatResponse, ModelError>) {
        let Some(due) = self.compaction.take_pending() else {
            return self.next_step();
        };
        let summary = match super::checked_usage(result) {
            Err(e) => Err(format!("{}: {e}", e.kind())),
            Ok(resp) => {
                self.charge(&resp.usage, None);
                if resp.text.trim().is_empty() {
                    Err("the model answered no summary".to_string())
                } else {
                    Ok(resp)
                }
            }
        };
        let before = self.transcript.len();
        let text = summary
            .as_ref()
            .map(|r| r.text.as_str())
            .map_err(String::clone);
        match self.compaction.settle(&self.transcript, due, text) {
            compaction::Settled::Summarized {
                transcript,
                tokens_after,
            } => {
                self.replace_transcript(transcript);
                let resp = summary.unwrap_or_default();
                self.event(RunEvent::TranscriptCompacted {
                    iteration: self.iteration + 1,
                    messages_before: before as u32,
                    messages_after: self.transcript.len() as u32,
                    tokens_before: due.tokens,
                    tokens_after,
                    usage: resp.usage,
                    summary: resp.text,
                });
            }
            compaction::Settled::Trimmed {
                transcript,
                dropped,
                tokens_after,
                why,
            } => {
                self.replace_transcript(transcript);
                self.event(RunEvent::Warning {
                    kind: "transcript_trimmed".into(),
                    message: format!(
                        "{why}: the {dropped} oldest messages after the first prompt were dropped instead ({} → {tokens_after} tokens)",
                        due.tokens
                    ),
                });
            }
            compaction::Settled::Kept { why } => {
                self.compaction.failed(self.iteration);
                self.event(RunEvent::Warning {
                    kind: "compaction_failed".into(),
                    message: format!("the transcript is kept whole: {why}"),
                });
            }
        }
        self.next_step();
    }
}
