//! A run's `tracing` spans, named and attributed after the OpenTelemetry
//! GenAI semantic conventions (`invoke_agent {agent}`, `chat {model}`,
//! `execute_tool {tool}`; see `crate::otel` for the table), and the span
//! events for critic decisions.
//!
//! With the `otel` feature the spans carry the `gen_ai.*` attributes and
//! model and tool calls get spans of their own, which the calls a run moves
//! into tasks carry along (`instrument`). Without it a run has the one span
//! it always had (`run_id`, `agent`, for logs), and every other hook here
//! compiles to nothing: W1's hot path is what it was. With the feature and
//! no subscriber that wants the spans, each is disabled at its call site (a
//! load and a branch) and its fields are never evaluated.

#![cfg_attr(not(feature = "otel"), allow(unused_variables))]

use std::future::Future;

use tracing::Span;

use crate::ports::model::{ChatResponse, ModelError};
use crate::ports::run::{CriticDecision, RunId, Usage};
use crate::ports::tool::ToolError;
use crate::record::Ending;

/// A span that exists with the `otel` feature only (nothing without it):
/// a model or tool call's, and the span a run's span is made a child of.
#[cfg(feature = "otel")]
pub(crate) type Traced = Span;
/// A span that exists with the `otel` feature only (nothing without it).
#[cfg(not(feature = "otel"))]
#[derive(Clone, Copy, Default)]
pub(crate) struct Traced;

/// The span current here, as the parent of a run about to be submitted
/// (a sub-agent's run: its parent's `execute_tool` span). The run holds it
/// until its own span is made, so its id is not reused meanwhile.
#[inline]
pub(crate) fn submitter() -> Traced {
    #[cfg(feature = "otel")]
    {
        Span::current()
    }
    #[cfg(not(feature = "otel"))]
    {
        Traced
    }
}

/// A second handle on a call's span (for the task that ends the call).
#[inline]
pub(crate) fn fork(span: &Traced) -> Traced {
    #[cfg(feature = "otel")]
    {
        span.clone()
    }
    #[cfg(not(feature = "otel"))]
    {
        Traced
    }
}

/// An OpenTelemetry integer attribute (`tracing-opentelemetry` records a
/// `u64` as text; OTLP integers are `i64`).
#[cfg(feature = "otel")]
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A model spec `provider:model` split in two; a spec without a provider
/// (`scripted`) names both.
#[cfg(feature = "otel")]
fn provider_and_model(spec: &str) -> (&str, &str) {
    spec.split_once(':').unwrap_or((spec, spec))
}

/// The span of a run (`invoke_agent {agent}`), a child of `parent`.
pub(crate) fn run(parent: Traced, run_id: RunId, agent: &str, model: &str) -> Span {
    #[cfg(feature = "otel")]
    {
        let (provider, model) = provider_and_model(model);
        tracing::info_span!(
            parent: &parent,
            "invoke_agent",
            otel.name = %format_args!("invoke_agent {agent}"),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = agent,
            gen_ai.provider.name = provider,
            gen_ai.request.model = model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
            agentvisor.run_id = %run_id,
            agentvisor.run.status = tracing::field::Empty,
        )
    }
    #[cfg(not(feature = "otel"))]
    {
        tracing::info_span!("invoke_agent", run_id = %run_id, agent = %agent)
    }
}

/// A run ended: its status, what ended it and its total usage on its span.
#[inline]
pub(crate) fn run_ended(span: &Span, ending: &Ending, usage: impl FnOnce() -> Usage) {
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        let usage = usage();
        span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
        span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
        span.record("agentvisor.run.status", ending.status.as_str());
        if ending.status != crate::ports::run::RunStatus::Ok {
            let kind = match (&ending.kill_reason, &ending.error_kind) {
                (Some(k), _) => k.as_str(),
                (None, Some(kind)) => kind.as_str(),
                (None, None) => ending.status.as_str(),
            };
            span.record("error.type", kind);
            span.record("otel.status_code", "error");
        }
    }
}

/// The span of a model call (`chat {model}`), a child of the run's.
#[inline]
pub(crate) fn chat(run: &Span, model: &str) -> Traced {
    #[cfg(feature = "otel")]
    {
        let (provider, model) = provider_and_model(model);
        tracing::info_span!(
            parent: run,
            "chat",
            otel.name = %format_args!("chat {model}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = provider,
            gen_ai.request.model = model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
        )
    }
    #[cfg(not(feature = "otel"))]
    {
        Traced
    }
}

/// A model call ended: its usage, or its error's kind.
#[inline]
pub(crate) fn chat_done(span: &Traced, result: &Result<ChatResponse, ModelError>) {
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        match result {
            Ok(r) => {
                span.record("gen_ai.usage.input_tokens", int(r.usage.input_tokens));
                span.record("gen_ai.usage.output_tokens", int(r.usage.output_tokens));
                if let Some(reason) = &r.finish_reason {
                    // A string array in the conventions: set on the
                    // OpenTelemetry span itself (a `tracing` field is a
                    // scalar). One choice, one reason.
                    use tracing_opentelemetry::OpenTelemetrySpanExt;
                    span.set_attribute(
                        "gen_ai.response.finish_reasons",
                        opentelemetry::Value::Array(opentelemetry::Array::String(vec![reason
                            .clone()
                            .into()])),
                    );
                }
            }
            Err(e) => {
                span.record("error.type", e.kind());
                span.record("otel.status_code", "error");
            }
        }
    }
}

/// The span of a tool call (`execute_tool {tool}`), a child of the run's.
#[inline]
pub(crate) fn tool(run: &Span, name: &str, call_id: &str) -> Traced {
    #[cfg(feature = "otel")]
    {
        tracing::info_span!(
            parent: run,
            "execute_tool",
            otel.name = %format_args!("execute_tool {name}"),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = name,
            gen_ai.tool.call.id = call_id,
            gen_ai.tool.type = "function",
            error.type = tracing::field::Empty,
        )
    }
    #[cfg(not(feature = "otel"))]
    {
        Traced
    }
}

/// A tool call ended: its error's kind, if it failed.
#[inline]
pub(crate) fn tool_done(span: &Traced, result: &Result<String, ToolError>) {
    #[cfg(feature = "otel")]
    if let (Err(e), false) = (result, span.is_disabled()) {
        span.record("error.type", e.kind());
        span.record("otel.status_code", "error");
    }
}

/// A call's future, carrying its span into whatever task polls it (the
/// future itself without the `otel` feature).
#[inline]
pub(crate) fn instrument<F: Future>(fut: F, span: Traced) -> impl Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    {
        tracing::Instrument::instrument(fut, span)
    }
    #[cfg(not(feature = "otel"))]
    {
        fut
    }
}

/// A critic's (or an operator's) decision: an event on the run's span,
/// named like the run's event (`critic.steer`, `critic.kill`, …).
#[inline]
pub(crate) fn decided(run: &Span, d: &CriticDecision) {
    #[cfg(feature = "otel")]
    {
        let name = match d.action {
            crate::ports::run::CriticAction::Steer => "critic.steer",
            crate::ports::run::CriticAction::Extend => "critic.extend",
            crate::ports::run::CriticAction::RaiseIterations => "critic.raise_iterations",
            crate::ports::run::CriticAction::Kill => "critic.kill",
            crate::ports::run::CriticAction::Deny => "critic.deny",
            crate::ports::run::CriticAction::Ask => "critic.ask",
        };
        tracing::info!(
            parent: run,
            reason = %d.reason,
            detail = d.detail.as_deref(),
            at_ms = int(d.at_ms),
            "{name}"
        );
    }
}
