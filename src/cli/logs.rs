//! How the commands' log lines look on stderr: coloured only on a terminal
//! and only when `NO_COLOR` is unset (or empty), and, in `swarm` and
//! `soak`, a warning that every run gives (a `usage_estimated` estimate,
//! an `unknown_price` model) said once, with a count of the runs that gave
//! it again at the end (see [`once_per_warning`]).
//!
//! A warning is a run's when it carries a `run_id` field; two are the same
//! warning when they carry the same `kind` field, or else come from the
//! same line of code. Other warnings, and every other level, are never
//! held back. Only what is printed is coalesced: trace exporters get every
//! event.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter};

/// Whether log lines get colour codes: only on a terminal, and not when
/// `NO_COLOR` is set to anything (<https://no-color.org>).
pub(crate) fn colour() -> bool {
    colour_for(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colour_for(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Runs' warnings are coalesced from now on.
static COALESCING: AtomicBool = AtomicBool::new(false);

/// Each warning given by runs: what it said first, and how many more runs
/// gave it.
static REPEATS: Mutex<BTreeMap<String, Repeat>> = Mutex::new(BTreeMap::new());

struct Repeat {
    said: String,
    more: u64,
}

/// Runs `command` (`swarm`, `soak`) with each warning of its runs printed
/// for the first run only, and a count of the others after it.
pub(crate) async fn once_per_warning<F: std::future::Future>(command: F) -> F::Output {
    coalesce_run_warnings();
    let out = command.await;
    report_repeats();
    out
}

/// From now on, a warning a run gives is printed for the first run only;
/// [`report_repeats`] counts the rest.
fn coalesce_run_warnings() {
    COALESCING.store(true, Ordering::Relaxed);
}

/// Prints, for each warning held back, one line saying how many more runs
/// gave it.
fn report_repeats() {
    let repeats = std::mem::take(&mut *REPEATS.lock().unwrap_or_else(|p| p.into_inner()));
    for (_, r) in repeats {
        if r.more > 0 {
            errln!(
                "warning: {} more run(s) gave the warning shown once above: {}",
                r.more,
                r.said
            );
        }
    }
}

/// The filter of the printed log lines that holds back repeated warnings
/// of runs (see the module docs).
pub(crate) struct RunWarnings;

impl<S: Subscriber> Filter<S> for RunWarnings {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        if !COALESCING.load(Ordering::Relaxed) || *event.metadata().level() != Level::WARN {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if !fields.run_id {
            return true;
        }
        let meta = event.metadata();
        let key = match &fields.kind {
            Some(kind) => kind.clone(),
            None => format!(
                "{}:{}",
                meta.file().unwrap_or("?"),
                meta.line().unwrap_or(0)
            ),
        };
        let mut repeats = REPEATS.lock().unwrap_or_else(|p| p.into_inner());
        match repeats.get_mut(&key) {
            Some(r) => {
                r.more += 1;
                false
            }
            None => {
                let said = match &fields.kind {
                    Some(kind) => format!("[{kind}] {}", fields.message),
                    None => fields.message.clone(),
                };
                repeats.insert(
                    key,
                    Repeat {
                        said: shorten(&said, 160),
                        more: 0,
                    },
                );
                true
            }
        }
    }
}

/// `text` cut to about `max` bytes (at a character boundary), with `…`.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The fields of an event the filter reads.
#[derive(Default)]
struct Fields {
    run_id: bool,
    kind: Option<String>,
    message: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "kind" => self.kind = Some(value.to_string()),
            "message" => self.message = value.to_string(),
            "run_id" => self.run_id = true,
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "kind" => self.kind = Some(format!("{value:?}").trim_matches('"').to_string()),
            "message" => self.message = format!("{value:?}"),
            "run_id" => self.run_id = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let set = std::ffi::OsStr::new("1");
        let empty = std::ffi::OsStr::new("");
        assert!(colour_for(true, None));
        assert!(colour_for(true, Some(empty)), "an empty NO_COLOR is unset");
        assert!(!colour_for(true, Some(set)));
        assert!(!colour_for(false, None));
        assert!(!colour_for(false, Some(set)));
    }

    #[test]
    fn shorten_cuts_at_a_character() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("aé", 2), "a…");
    }
}
