//! The stored form against serde's: the fast paths write what serde_json
//! would, and everything written reads back whole.

use super::decode::{full_result, restore};
use super::encode::{write_common_event, write_event, write_event_serde, write_info, write_result};
use super::json::{needs_no_escape, push_str, strip_zero_defaults};
use super::KIND_START;
use crate::ports::audit::{RunInfo, RunSummary};
use crate::ports::event::RunEvent;
use crate::ports::limits::LimitsSpec;
use crate::ports::run::{KillReason, RunId, RunResult, RunStatus, StepRecord};

#[test]
fn event_kind_is_the_wire_name() {
    let ev = RunEvent::TranscriptCompacted {
        iteration: 3,
        messages_before: 8,
        messages_after: 5,
        tokens_before: 900,
        tokens_after: 300,
        usage: Default::default(),
        summary: "s".into(),
    };
    for ev in events_of_every_family().into_iter().chain([ev]) {
        let wire = serde_json::to_value(&ev).unwrap_or_default()["type"].clone();
        assert_eq!(serde_json::Value::from(ev.kind()), wire, "{ev:?}");
    }
}

#[test]
fn common_events_are_written_as_serde_writes_them() {
    use crate::ports::model::ToolCallRequest;
    use crate::ports::run::Usage;
    let tricky = "quote \" backslash \\ tab \t nl \n bell \u{7} é ✓ \u{7f}";
    let call = |arguments: &str| ToolCallRequest {
        id: "call_0".into(),
        name: "add".into(),
        arguments: arguments.into(),
    };
    let events = [
        RunEvent::StepStart { iteration: 1 },
        RunEvent::StepFinish {
            iteration: 2,
            text: String::new(),
            tool_calls: 2,
            usage: Usage {
                input_tokens: 17,
                output_tokens: 3,
                ..Default::default()
            },
            calls: vec![call(r#"{"a":2,"b":3}"#), call(tricky)],
            finish_reason: Some("tool_calls".into()),
        },
        RunEvent::StepFinish {
            iteration: u32::MAX,
            text: tricky.into(),
            tool_calls: 0,
            usage: Usage {
                input_tokens: u64::MAX,
                output_tokens: 0,
                cache_read_tokens: 5,
                cache_write_tokens: 0,
                reasoning_tokens: 9,
                estimated: false,
            },
            calls: Vec::new(),
            finish_reason: Some(tricky.into()),
        },
        RunEvent::ToolCall {
            iteration: 3,
            call_id: "c\"1".into(),
            tool: "upper".into(),
            args: tricky.into(),
        },
        RunEvent::ToolResult {
            iteration: 3,
            call_id: "c1".into(),
            tool: "upper".into(),
            ok: true,
            result: "DONE".into(),
            duration_ms: 12,
        },
        RunEvent::ToolResult {
            iteration: 4,
            call_id: "c2".into(),
            tool: "t".into(),
            ok: false,
            result: tricky.into(),
            duration_ms: 0,
        },
        RunEvent::MessageCreate {
            role: "assistant".into(),
            text: tricky.into(),
        },
    ];
    for ev in &events {
        let mut fast = Vec::new();
        let mut slow = Vec::new();
        let kind = write_common_event(&mut fast, ev);
        let want = write_event_serde(&mut slow, ev).ok();
        assert!(kind.is_some(), "{ev:?} has no fast path");
        assert_eq!(kind, want);
        assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&slow)
        );
    }
    // Results, as serde writes them less the zero usage counters.
    let step = |ok: bool, error: Option<&str>| StepRecord {
        iteration: 1,
        tool: "add".into(),
        args: tricky.into(),
        ok,
        error: error.map(str::to_string),
        result: "5".into(),
        duration_ms: 3,
    };
    let results = [
        RunResult {
            run_id: RunId(7),
            agent: "hello".into(),
            caller_id: Some("swarm".into()),
            parent_run_id: None,
            root_run_id: None,
            status: RunStatus::Ok,
            kill_reason: None,
            loop_kind: None,
            error_kind: None,
            error: None,
            output: Some(tricky.into()),
            steps: vec![step(true, None), step(false, Some(tricky))],
            iterations: 3,
            usage: Usage {
                input_tokens: 157,
                output_tokens: 14,
                ..Default::default()
            }
            .into(),
            cost_micros: 0,
            critic: Vec::new(),
            started_at: 1,
            finished_at: 2,
            forked_from: None,
        },
        RunResult {
            run_id: RunId(u128::MAX),
            agent: tricky.into(),
            caller_id: None,
            parent_run_id: Some(RunId(1 << 100)),
            root_run_id: Some(RunId(1 << 101)),
            status: RunStatus::Killed,
            kill_reason: Some(KillReason::Runaway),
            loop_kind: Some(crate::ports::run::LoopKind::SameObservation),
            error_kind: Some("runaway".into()),
            error: Some(tricky.into()),
            output: None,
            steps: Vec::new(),
            iterations: 0,
            usage: crate::ports::run::RunUsage {
                own: Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                    cache_read_tokens: 3,
                    cache_write_tokens: 0,
                    reasoning_tokens: 5,
                    estimated: true,
                },
                // The judges' usage, nested last in the stored form.
                critic: Some(crate::ports::run::CriticUsage {
                    input_tokens: 7,
                    output_tokens: 0,
                    cost_micros: u64::MAX,
                    calls: 2,
                }),
            },
            cost_micros: u64::MAX,
            critic: vec![crate::ports::run::CriticDecision {
                action: crate::ports::run::CriticAction::Kill,
                reason: tricky.into(),
                at_ms: 9,
                detail: Some("d".into()),
                loop_kind: Some(crate::ports::run::LoopKind::SameObservation),
            }],
            started_at: u64::MAX,
            finished_at: 0,
            forked_from: Some(crate::ports::run::ForkOrigin {
                run_id: RunId(42),
                step: 3,
            }),
        },
    ];
    for res in &results {
        let mut fast = Vec::new();
        assert!(write_result(&mut fast, res, false).is_ok());
        // As serde writes it, less the keys the row holds and the
        // defaults; read back whole with the row's columns.
        let mut slow = serde_json::to_vec(res).unwrap_or_default();
        strip_zero_defaults(&mut slow, 0);
        let mut slow: serde_json::Value = serde_json::from_slice(&slow).unwrap_or_default();
        if let Some(map) = slow.as_object_mut() {
            map.retain(|k, v| {
                let column = [
                    "run_id",
                    "agent",
                    "caller_id",
                    "parent_run_id",
                    "root_run_id",
                    "status",
                    "kill_reason",
                    "error_kind",
                    "started_at",
                    "finished_at",
                    "forked_from",
                ]
                .contains(&k.as_str());
                let default = v.is_null()
                    || *v == serde_json::json!([])
                    || (k == "cost_micros" && *v == serde_json::json!(0));
                !column && !default
            });
        }
        let stored: serde_json::Value = serde_json::from_slice(&fast).unwrap_or_default();
        assert_eq!(stored, slow);
        assert!(stored.get("run_id").is_none());
        let text = String::from_utf8_lossy(&fast);
        let back = full_result(&text, &RunSummary::of(res), None).ok();
        assert_eq!(back.as_ref(), Some(res));
        // A result written before version 4 is whole, and read as it is.
        let whole = serde_json::to_string(res).unwrap_or_default();
        let other_row = RunSummary {
            agent: "another".into(),
            ..RunSummary::of(res)
        };
        assert_eq!(
            full_result(&whole, &other_row, None).ok().as_ref(),
            Some(res)
        );
    }
    // run.start: absent fields left out, limits reduced; read back whole.
    let full = crate::ports::limits::LimitsSpec {
        max_runtime: Some(std::time::Duration::from_secs(30)),
        ..Default::default()
    }
    .resolve(&LimitsSpec::default());
    for (caller, parent, session) in [
        (None, None, None),
        (Some(tricky), Some(RunId(3)), Some("s")),
    ] {
        let info = RunInfo {
            agent: tricky.into(),
            model: "scripted".into(),
            caller_id: caller.map(Into::into),
            channel_id: caller.map(str::to_string),
            parent_run_id: parent,
            session_id: session.map(str::to_string),
            prompt: tricky.into(),
            tools: vec!["add".to_string(), tricky.to_string()].into(),
            limits: Some(full),
            host: caller.map(Into::into),
            manifest: None,
        };
        let mut out = Vec::new();
        let mut last = None;
        assert!(write_info(&mut out, &info, &mut last).is_ok());
        let stored: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(stored["limits"], serde_json::json!({"max_runtime": "30s"}));
        let back: Option<RunInfo> = serde_json::from_value(restore(KIND_START, stored)).ok();
        assert_eq!(back, Some(info));
    }
    // Other kinds go through serde.
    let ev = RunEvent::TextDelta {
        iteration: 1,
        text: "x".into(),
    };
    assert_eq!(write_common_event(&mut Vec::new(), &ev), None);
}

#[test]
fn the_escape_check_matches_serde() {
    let mut cases: Vec<String> = vec![
        String::new(),
        "plain ascii text of some length, more than eight".into(),
        "é✓ unicode".into(),
        "\u{7f} del is not escaped".into(),
    ];
    for bad in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
        for at in [0, 3, 7, 8, 15, 16, 20] {
            let mut s: String = "abcdefghijklmnopqrstuvwxyz".chars().take(21).collect();
            s.insert(at, bad);
            cases.push(s);
        }
    }
    for s in &cases {
        let escaped = serde_json::to_string(s).unwrap_or_default();
        let plain = escaped.len() == s.len() + 2;
        assert_eq!(needs_no_escape(s.as_bytes()), plain, "{s:?}");
        let mut out = Vec::new();
        push_str(&mut out, s);
        assert_eq!(String::from_utf8_lossy(&out), escaped);
    }
}

#[test]
fn zero_usage_fields_are_left_out_and_nothing_else() {
    let usage = crate::ports::run::Usage {
        input_tokens: 7,
        output_tokens: 3,
        cache_write_tokens: 5,
        ..Default::default()
    };
    let ev = RunEvent::StepFinish {
        iteration: 1,
        text: r#"a,"cache_read_tokens":0,"reasoning_tokens":0}"#.into(),
        tool_calls: 0,
        usage,
        calls: Vec::new(),
        finish_reason: None,
    };
    let mut out = b"[1,2,".to_vec();
    assert_eq!(write_event(&mut out, &ev).ok(), Some("step.finish"));
    let stored = String::from_utf8(out[5..].to_vec()).unwrap_or_default();
    assert!(!stored.contains("\"type\""), "{stored}");
    assert!(stored.contains("cache_write_tokens\":5"), "{stored}");
    assert!(!stored.contains(",\"reasoning_tokens\":0,"), "{stored}");
    // The text keeps its look-alikes (its quotes are escaped).
    let v: serde_json::Value = serde_json::from_str(&stored).unwrap_or_default();
    let back: Option<RunEvent> = serde_json::from_value(restore("step.finish", v)).ok();
    assert_eq!(back, Some(ev));
    let ev = RunEvent::StepStart { iteration: 2 };
    let mut out = Vec::new();
    let _ = write_event(&mut out, &ev);
    assert_eq!(out, br#"{"iteration":2}"#);
}

/// Every listing of runs — any filter, first page or a page after a
/// cursor — seeks in an index on its sort key: no scan of the table, no
/// sort of all its rows (page N costs what page 1 does).
#[tokio::test]
async fn run_listings_seek_in_an_index() {
    use crate::ports::audit::{RunCursor, RunFilter};
    let Ok(store) = crate::stores::SqliteStore::open_memory().await else {
        panic!("an in-memory store opens");
    };
    let after = RunCursor {
        finished_at: 1_700_000_000_000,
        run_id: RunId::new(),
    };
    let filters = [
        RunFilter::default(),
        RunFilter {
            status: Some(RunStatus::Ok),
            ..Default::default()
        },
        RunFilter {
            status: Some(RunStatus::Killed),
            ..Default::default()
        },
        RunFilter {
            caller: Some("alice".into()),
            ..Default::default()
        },
        RunFilter {
            caller: Some("alice".into()),
            status: Some(RunStatus::Error),
            ..Default::default()
        },
    ];
    for f in filters {
        for after in [None, Some(after)] {
            let f = RunFilter {
                after,
                limit: Some(50),
                ..f.clone()
            };
            let (sql, args) = super::list_query(&f);
            let plan = store
                .read(move |c| {
                    let mut stmt = c
                        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                        .map_err(super::unavailable)?;
                    let rows = stmt
                        .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
                        .map_err(super::unavailable)?;
                    rows.collect::<Result<Vec<_>, _>>()
                        .map_err(super::unavailable)
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let plan = plan.join(" | ");
            assert!(plan.contains("USING INDEX"), "{f:?}: {plan}");
            assert!(
                !plan.contains("USE TEMP B-TREE FOR ORDER BY"),
                "{f:?}: {plan}"
            );
            if after.is_some() {
                assert!(plan.contains("SEARCH runs"), "{f:?}: {plan}");
            }
        }
    }
}

/// The events a run records that the encoder's own kind list once left out
/// (MCP servers and tools, approvals), with a few it always had.
fn events_of_every_family() -> Vec<RunEvent> {
    vec![
        RunEvent::StepStart { iteration: 1 },
        RunEvent::Warning {
            kind: "w".into(),
            message: "m".into(),
        },
        RunEvent::McpServerStartOk {
            server: "fs".into(),
            tool_count: 3,
            ms: 12,
        },
        RunEvent::McpServerExit {
            server: "fs".into(),
            code: Some(1),
            stderr_tail: "bye".into(),
        },
        RunEvent::McpServerRestart {
            server: "fs".into(),
            attempt: 2,
            delay_ms: 100,
        },
        RunEvent::McpToolCallOk {
            tool: "fs__read".into(),
            duration_ms: 4,
        },
        RunEvent::McpToolCallFail {
            tool: "fs__read".into(),
            duration_ms: 4,
            error_kind: "server".into(),
        },
        RunEvent::McpToolCallTimeout {
            tool: "fs__read".into(),
            duration_ms: 4,
        },
        RunEvent::ApprovalRequested {
            iteration: 1,
            call_id: "c1".into(),
            tool: "rm".into(),
            arguments: "{}".into(),
            timeout_ms: 1000,
            escalated: Some("the judge could not tell".into()),
        },
        RunEvent::ApprovalDecided {
            call_id: "c1".into(),
            tool: "rm".into(),
            approved: false,
            by: "operator".into(),
            reason: Some("no".into()),
            waited_ms: 20,
        },
    ]
}

#[test]
fn every_event_is_stored_under_its_wire_name() {
    for ev in events_of_every_family() {
        let wire = serde_json::to_value(&ev).unwrap_or_default()["type"].clone();
        let mut out = Vec::new();
        let kind = write_event(&mut out, &ev).unwrap_or("unwritable");
        assert_eq!(serde_json::Value::from(kind), wire, "{ev:?}");
        let stored: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert!(
            stored.get("type").is_none(),
            "{kind}: the tag stays: {stored}"
        );
        let back: Option<RunEvent> = serde_json::from_value(restore(kind, stored)).ok();
        assert_eq!(back.as_ref(), Some(&ev), "{kind}");
    }
}
