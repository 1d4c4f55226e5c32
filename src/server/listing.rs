//! `GET /v1/runs`: a caller's runs, newest first, a page at a time.
//!
//! A listing is the live runs, then the ended runs of the index; its cursor
//! makes every run on record when the listing began appear exactly once,
//! however many start or end while a client pages (see [`Cursor`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::api::{ListQuery, RunItem, RunList};
use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::runs::parse_id;
use super::AppState;
use crate::host::LiveStatus;
use crate::ports::audit::{RunCursor, RunFilter, RunSummary};
use crate::{RunId, RunStatus};

/// Default and largest page.
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// A cursor: where a page ended, and what the pages before it listed.
///
/// A listing is live runs (newest first, by id), then ended runs (the most
/// recently ended first, a keyset page of the run index at a time). Every
/// page of the live section notes when it read the live runs (`at`) and
/// the oldest run it covered (`last`): the runs it covered are those from
/// `last` up to the previous page's `last`. An ended run of that range that
/// ended by `at` was not listed live and is listed as ended; one that ended
/// later was listed live (or started after the listing began) and is
/// skipped. Runs older than every live page's range are listed as ended.
/// So every run on record when the listing began is listed once, however
/// many start or end while a client pages; runs started meanwhile are not
/// listed. As text: hex (`l…`, `e…`), opaque.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Cursor {
    /// The live section's pages so far, newest first (`last` decreasing).
    pages: Vec<LivePage>,
    /// In the ended section: after this run.
    ended: Option<RunCursor>,
}

/// One page of a listing's live section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LivePage {
    /// Unix ms by which the runs it covered had either been listed live or
    /// ended.
    at: u64,
    /// The oldest run it covered.
    last: RunId,
}

/// Live pages a cursor remembers; past it the two oldest merge into one
/// (with the older `at`: a run of the newer one's range that ended
/// between the two may then be left out).
const MAX_LIVE_PAGES: usize = 64;

impl Cursor {
    fn encode(&self) -> String {
        let mut s = String::with_capacity(3 + 48 * (self.pages.len() + 1));
        s.push(if self.ended.is_some() { 'e' } else { 'l' });
        s.push_str(&format!("{:02x}", self.pages.len()));
        for p in &self.pages {
            s.push_str(&format!("{:016x}{}", p.at, p.last));
        }
        if let Some(e) = self.ended {
            s.push_str(&e.encode());
        }
        s
    }

    fn parse(s: &str) -> Option<Cursor> {
        if !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let n = usize::from_str_radix(s.get(1..3)?, 16).ok()?;
        if n > MAX_LIVE_PAGES {
            return None;
        }
        let mut rest = s.get(3..)?;
        let mut pages = Vec::with_capacity(n);
        for _ in 0..n {
            let page = rest.get(..48)?;
            rest = rest.get(48..)?;
            pages.push(LivePage {
                at: u64::from_str_radix(page.get(..16)?, 16).ok()?,
                last: parse_id(page.get(16..)?).ok()?,
            });
        }
        if pages.windows(2).any(|w| w[1].last >= w[0].last) {
            return None;
        }
        let ended = match (s.get(..1)?, rest.is_empty()) {
            ("l", true) => None,
            ("e", false) => Some(RunCursor::decode(rest)?),
            _ => return None,
        };
        Some(Cursor { pages, ended })
    }

    /// Where the live section goes on: below the last page's oldest run.
    fn below(&self) -> Option<RunId> {
        self.pages.last().map(|p| p.last)
    }

    /// Whether an ended run is listed in the ended section (see the type).
    fn keeps_ended(&self, r: &RunSummary) -> bool {
        match self.pages.iter().find(|p| r.run_id >= p.last) {
            Some(p) => r.finished_at <= p.at,
            None => true,
        }
    }

    fn push(&mut self, page: LivePage) {
        if self.pages.len() == MAX_LIVE_PAGES {
            let second = self.pages.remove(1);
            self.pages[0].last = second.last;
        }
        self.pages.push(page);
    }
}

/// Closes a page's live section: its `at` is now, and once the clock has
/// moved past that millisecond, a run listed live that has ended by then
/// (so its end time is at most `at`, and the ended section lists it) is
/// taken off the live list. A run that ends later has a later end time:
/// the ended section skips it.
async fn settle_live_page(st: &AppState, out: &mut Vec<RunItem>, seen: &mut HashSet<RunId>) -> u64 {
    let at = crate::ports::run::unix_ms();
    while crate::ports::run::unix_ms() <= at {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let mut gone = Vec::new();
    for item in out.iter().filter(|i| i.live.is_some()) {
        let Ok(run_id) = item.run_id.parse::<RunId>() else {
            continue;
        };
        let finished_at = match st.host.run(&run_id) {
            Some(run) if !run.is_finished() => continue,
            Some(run) => tokio::time::timeout(SETTLE, run.shared_result())
                .await
                .ok()
                .map(|r| r.finished_at),
            None => st
                .index
                .run_result(run_id)
                .await
                .ok()
                .flatten()
                .map(|r| r.finished_at),
        };
        if finished_at.is_some_and(|f| f <= at) {
            gone.push(run_id);
        }
    }
    for run_id in gone {
        seen.remove(&run_id);
        let id = run_id.to_string();
        out.retain(|i| i.run_id != id);
    }
    at
}

/// Ended runs fetched from the index at a time, at least.
const FETCH: u32 = 64;

/// How long a listing waits for a run's terminal record being written.
const SETTLE: Duration = Duration::from_secs(2);

/// Runs, newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs",
    params(ListQuery),
    responses((status = 200, body = RunList), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn list_runs(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let bad = |field: &str, why: &str| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
            format!("`{field}`: {why}"),
        )
    };
    let limit = q.limit.unwrap_or(PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad("limit", "must be 1 to 500"));
    }
    let (want_live, status) = match q.status.as_deref() {
        None | Some("") => (true, None),
        Some("running") => (true, Some(None)),
        Some(s) => (
            false,
            Some(Some(
                s.parse::<RunStatus>()
                    .map_err(|e| bad("status", &e.to_string()))?,
            )),
        ),
    };
    let want_ended = !matches!(status, Some(None));
    let status = status.flatten();
    let root = match q.root.as_deref() {
        None | Some("") => None,
        Some(r) => Some(parse_id(r).map_err(|_| bad("root", "not a run id"))?),
    };
    let given = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => {
            Some(Cursor::parse(c).ok_or_else(|| bad("cursor", "not a cursor this server gave"))?)
        }
    };
    let mine = |owner: Option<&str>| caller.may_see(owner);
    let agent_ok = |a: &str| q.agent.as_deref().is_none_or(|want| want == a);
    // A schedule's runs are those of its caller, `schedule:NAME`.
    let schedule_caller = q.schedule.as_deref().map(|s| format!("schedule:{s}"));
    let schedule_ok = |owner: Option<&str>| {
        schedule_caller
            .as_deref()
            .is_none_or(|want| owner == Some(want))
    };
    let limit = limit as usize;
    let mut out: Vec<RunItem> = Vec::new();
    let mut more = false;

    // Parents of every run we know of, for `root`.
    let mut parents: HashMap<RunId, Option<RunId>> = HashMap::new();
    let live = st.host.runs();
    for r in &live {
        parents.insert(r.run_id, r.parent_run_id);
    }
    // Runs that have ended but whose terminal record is still being
    // written: waited for (briefly), so the ended section lists them.
    let mut settled = HashSet::new();
    if want_ended {
        let finishing = live
            .iter()
            .filter(|r| r.status == LiveStatus::Finishing)
            .filter_map(|r| st.host.run(&r.run_id))
            .map(|run| async move {
                tokio::time::timeout(SETTLE, run.shared_result())
                    .await
                    .ok()
                    .map(|r| r.run_id)
            });
        settled.extend(
            futures_util::future::join_all(finishing)
                .await
                .into_iter()
                .flatten(),
        );
    }
    let mut cursor = given.unwrap_or_default();
    let ended_filter = RunFilter {
        status,
        caller: if caller.is_admin() {
            schedule_caller.clone()
        } else {
            Some(caller.id.to_string())
        },
        limit: None,
        root: None,
        after: None,
    };
    let all_ended = if root.is_some() && want_ended {
        let all = st
            .index
            .list_runs(&ended_filter)
            .await
            .map_err(ApiError::store)?;
        for r in &all {
            parents.insert(r.run_id, r.parent_run_id);
        }
        Some(all)
    } else {
        None
    };
    let in_tree = |id: RunId| -> bool {
        let Some(root) = root else { return true };
        let mut cur = Some(id);
        let mut seen = HashSet::new();
        while let Some(c) = cur {
            if c == root {
                return true;
            }
            if !seen.insert(c) {
                return false;
            }
            cur = parents.get(&c).copied().flatten();
        }
        false
    };

    let mut seen = HashSet::new();
    if want_live && cursor.ended.is_none() {
        let below = cursor.below();
        let mut last = None;
        for r in &live {
            // Later pages: below the last one's oldest run (so none started
            // since the listing began: ids grow with time).
            if below.is_some_and(|b| r.run_id >= b) {
                continue;
            }
            if settled.contains(&r.run_id) {
                // Ended and on record: listed as ended.
                continue;
            }
            if !mine(r.caller_id.as_deref())
                || !schedule_ok(r.caller_id.as_deref())
                || !agent_ok(&r.agent)
                || !in_tree(r.run_id)
            {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            seen.insert(r.run_id);
            last = Some(r.run_id);
            out.push(RunItem::live(r));
        }
        if let Some(last) = last {
            let at = settle_live_page(&st, &mut out, &mut seen).await;
            cursor.push(LivePage { at, last });
        }
    }
    if !more && want_ended {
        let c = cursor.clone();
        let keep = |r: &RunSummary| {
            mine(r.caller_id.as_deref())
                && schedule_ok(r.caller_id.as_deref())
                && agent_ok(&r.agent)
                && in_tree(r.run_id)
                && !seen.contains(&r.run_id)
                && c.keeps_ended(r)
        };
        let need = limit + 1 - out.len();
        let ended: Vec<RunSummary> = match &all_ended {
            Some(all) => all
                .iter()
                .filter(|r| c.ended.is_none_or(|e| e.precedes(r)) && keep(r))
                .take(need)
                .cloned()
                .collect(),
            None => {
                // Keyset pages of the index from the cursor on, until
                // this page is full or the index has no more; each
                // fetch starts where the last ended.
                let mut kept = Vec::with_capacity(need);
                let mut after = c.ended;
                loop {
                    let ask = (need as u32).max(FETCH);
                    let f = RunFilter {
                        limit: Some(ask),
                        after,
                        ..ended_filter.clone()
                    };
                    let got = st.index.list_runs(&f).await.map_err(ApiError::store)?;
                    let short = got.len() < ask as usize;
                    after = got.last().map(RunCursor::after).or(after);
                    kept.extend(got.into_iter().filter(|r| keep(r)));
                    if kept.len() >= need || short {
                        break;
                    }
                }
                kept.truncate(need);
                kept
            }
        };
        for r in ended {
            if out.len() == limit {
                more = true;
                break;
            }
            cursor.ended = Some(RunCursor::after(&r));
            out.push(RunItem::ended(&r));
        }
    }
    // A full page of live runs may be followed by ended ones.
    if !more && out.len() == limit && want_ended && cursor.ended.is_none() {
        more = true;
    }
    Ok(Json(RunList {
        runs: out,
        next_cursor: more.then(|| cursor.encode()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(run_id: RunId, finished_at: u64) -> RunSummary {
        RunSummary {
            run_id,
            agent: "a".into(),
            caller_id: None,
            parent_run_id: None,
            root_run_id: None,
            status: RunStatus::Ok,
            kill_reason: None,
            error_kind: None,
            started_at: 0,
            finished_at,
            forked_from: None,
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_other_text() {
        let (a, b) = (RunId(9 << 80), RunId(5 << 80));
        let mut c = Cursor::default();
        assert_eq!(Cursor::parse(&c.encode()), Some(c.clone()));
        c.push(LivePage { at: 100, last: a });
        c.push(LivePage { at: 200, last: b });
        assert_eq!(Cursor::parse(&c.encode()), Some(c.clone()));
        c.ended = Some(RunCursor {
            finished_at: 50,
            run_id: RunId(3),
        });
        let text = c.encode();
        assert!(text.starts_with("e02"));
        assert_eq!(Cursor::parse(&text), Some(c.clone()));
        // Out of order pages, bad digits, cut short, other kinds.
        let swapped = format!("l02{}{}", &text[51..99], &text[3..51]);
        for bad in [
            "",
            "l",
            "x00",
            "lff",
            &swapped,
            &text[..text.len() - 1],
            &text.replace('e', "l"),
            &format!("{text}/"),
        ] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_ended_run_is_kept_unless_a_live_page_covered_it_live() {
        let mut c = Cursor::default();
        c.push(LivePage {
            at: 100,
            last: RunId(9 << 80),
        });
        c.push(LivePage {
            at: 200,
            last: RunId(5 << 80),
        });
        // The first page's range: ended by its read, or after (listed live).
        assert!(c.keeps_ended(&summary(RunId(10 << 80), 100)));
        assert!(!c.keeps_ended(&summary(RunId(10 << 80), 101)));
        // The second page's range reads at its own time.
        assert!(c.keeps_ended(&summary(RunId(6 << 80), 150)));
        assert!(!c.keeps_ended(&summary(RunId(6 << 80), 201)));
        // Older than every live page: ended before any was read.
        assert!(c.keeps_ended(&summary(RunId(1 << 80), 10_000)));
        assert!(Cursor::default().keeps_ended(&summary(RunId(1), 10_000)));
    }
}
