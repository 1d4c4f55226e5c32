//! Paging through runs: the run index's keyset cursor (both batteries)
//! and `GET /v1/runs?cursor=` over it. Every run on file when paging began
//! is listed exactly once, newest first, while new runs keep ending and
//! live runs end between pages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::sync::Arc;

use agentvisor::ports::audit::{
    AuditRecord, AuditStore, RunCursor, RunFilter, RunIndex, RunSummary,
};
use agentvisor::server::ServerConfig;
use agentvisor::stores::{MemoryAuditStore, SqliteStore};
use agentvisor::{Invocation, RunId, RunStatus};
use serde_json::{json, Value};
use support::loopback::{QUICK, SLOW};

/// One real run's records, to copy.
async fn template() -> Vec<AuditRecord> {
    let mem = Arc::new(MemoryAuditStore::new());
    let host = support::builder()
        .audit_store(mem.clone())
        .build()
        .await
        .unwrap();
    let r = host
        .execute(support::spec(QUICK), Invocation::prompt("add"))
        .await
        .unwrap();
    host.shutdown().await;
    mem.run_records(r.run_id).await.unwrap()
}

/// `records` as a new run that ended at `finished_at` (`status` ok or killed).
fn copy(records: &[AuditRecord], finished_at: u64, killed: bool) -> (RunId, Vec<AuditRecord>) {
    support::rekey(records, |res| {
        res.finished_at = finished_at;
        if killed {
            res.status = RunStatus::Killed;
        }
    })
}

/// Pages through `store` with `filter`, `page` runs at a time, adding
/// `adding` newer runs before each page: the ids listed, in order.
async fn page_through<S: AuditStore + RunIndex>(
    store: &S,
    template: &[AuditRecord],
    filter: RunFilter,
    page: u32,
    newer_from: u64,
) -> Vec<RunSummary> {
    let mut out = Vec::new();
    let mut after = None;
    let mut newer = newer_from;
    loop {
        if after.is_some() {
            // Runs keep ending while the reader pages (each one newer).
            for _ in 0..3 {
                newer += 1;
                store
                    .append(&copy(template, newer, newer.is_multiple_of(2)).1)
                    .await
                    .unwrap();
            }
        }
        let got = store
            .list_runs(&RunFilter {
                limit: Some(page),
                after,
                ..filter.clone()
            })
            .await
            .unwrap();
        let Some(last) = got.last() else { break };
        after = Some(RunCursor::after(last));
        out.extend(got);
    }
    out
}

async fn keyset_pages_list_every_run_once<S: AuditStore + RunIndex>(store: &S) {
    let template = template().await;
    // 240 runs, three ending in each millisecond (ties broken by id);
    // every third killed.
    let mut on_file = Vec::new();
    for i in 0..240u64 {
        let (id, records) = copy(&template, 10_000 + i / 3, i.is_multiple_of(3));
        store.append(&records).await.unwrap();
        on_file.push((10_000 + i / 3, id, i.is_multiple_of(3)));
    }
    on_file.sort_by_key(|(at, id, _)| std::cmp::Reverse((*at, *id)));

    let listed = page_through(store, &template, RunFilter::default(), 25, 1_000_000).await;
    let ids: Vec<RunId> = listed.iter().map(|r| r.run_id).collect();
    // The newer runs added while paging sort before the first page's: none
    // is listed; every run on file is, once, in order.
    let want: Vec<RunId> = on_file.iter().map(|(_, id, _)| *id).collect();
    assert!(
        ids == want,
        "listed {} runs, {} on file",
        ids.len(),
        want.len()
    );

    // A filter pages the same way (over what is on file now: the runs
    // added meanwhile too).
    let killed_only = RunFilter {
        status: Some(RunStatus::Killed),
        ..Default::default()
    };
    let want: Vec<RunId> = store
        .list_runs(&killed_only)
        .await
        .unwrap()
        .iter()
        .map(|r| r.run_id)
        .collect();
    assert!(want.len() > 80);
    let killed = page_through(store, &template, killed_only, 7, 2_000_000).await;
    let ids: Vec<RunId> = killed.iter().map(|r| r.run_id).collect();
    assert!(
        ids == want,
        "listed {} runs, {} on file",
        ids.len(),
        want.len()
    );
}

#[tokio::test]
async fn keyset_pages_of_the_memory_index_list_every_run_once() {
    keyset_pages_list_every_run_once(&MemoryAuditStore::new()).await;
}

#[tokio::test]
async fn keyset_pages_of_the_sqlite_index_list_every_run_once() {
    let store = SqliteStore::open_memory().await.unwrap();
    keyset_pages_list_every_run_once(&store).await;
}

#[test]
fn cursors_round_trip_and_refuse_other_text() {
    let c = RunCursor {
        finished_at: 1_700_000_000_123,
        run_id: RunId::new(),
    };
    let t = c.encode();
    assert_eq!(t.len(), 48);
    assert_eq!(RunCursor::decode(&t), Some(c));
    for bad in ["", "xyz", &t[1..], &format!("{t}0"), &t.replace('0', "g")] {
        assert_eq!(RunCursor::decode(bad), None, "{bad}");
    }
}

/// Through the API: live runs first, then ended ones, a page at a time;
/// runs keep being submitted and live runs end between pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_pages_through_every_run_once_while_runs_come_and_go() {
    let (host, store) = support::host().await;
    let config = ServerConfig {
        rate_per_sec: 0.0,
        ..ServerConfig::default()
    };
    let s = support::loopback::start_with(host, store, &[QUICK, SLOW], false, config).await;
    let submit = |agent: &'static str, wait: bool| {
        let req = s.request(
            "POST",
            if wait { "/v1/runs?wait=10" } else { "/v1/runs" },
            None,
            Some(json!({ "agent": agent })),
        );
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 201);
            let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
            v["run_id"].as_str().unwrap().to_string()
        }
    };
    let mut ended = Vec::new();
    for _ in 0..40 {
        ended.push(submit("quick", true).await);
    }
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(submit("slow", false).await);
    }
    let on_file: HashSet<String> = ended.iter().chain(&slow).cloned().collect();

    let kill_and_wait = |id: String| {
        let kill = s.request("POST", &format!("/v1/runs/{id}/kill"), None, None);
        let wait = s.request("GET", &format!("/v1/runs/{id}?wait=10"), None, None);
        async move {
            assert_eq!(kill.send().await.unwrap().status(), 202);
            let v: Value =
                serde_json::from_str(&wait.send().await.unwrap().text().await.unwrap()).unwrap();
            assert_eq!(v["status"], "killed");
        }
    };

    let stop = tokio_util::sync::CancellationToken::new();
    let mut submitters = Vec::new();
    // Runs added so far, so every page is read after another run ended.
    let (added_tx, mut added_rx) = tokio::sync::watch::channel(0usize);
    let mut listed: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        if pages > 0 {
            added_rx.wait_for(|a| *a >= pages).await.unwrap();
        }
        let path = match &cursor {
            None => "/v1/runs?limit=2".to_string(),
            Some(c) if pages == 1 => format!("/v1/runs?limit=2&cursor={c}"),
            Some(c) => format!("/v1/runs?limit=7&cursor={c}"),
        };
        let (code, v, _) = s.req("GET", &path, None, None).await;
        assert_eq!(code, 200, "{v}");
        listed.extend(v["runs"].as_array().unwrap().iter().cloned());
        pages += 1;
        if pages == 2 {
            // The second page holds the live run left (slow[1] ended
            // before it) and the ended runs begin: slow[2], listed live on
            // the first page, ends now and must not come back as ended.
            assert_eq!(listed[2]["run_id"], slow[0].as_str(), "{listed:?}");
            kill_and_wait(slow[2].clone()).await;
        }
        if pages == 1 {
            // The first page holds the two newest live runs: the newest
            // ends now (it must not come back as an ended run), and so
            // does one not listed yet, between the two pages' runs (it
            // must come as an ended one).
            assert_eq!(listed.len(), 2);
            assert!(
                listed.iter().all(|r| r["status"] == "running"),
                "{listed:?}"
            );
            kill_and_wait(slow[3].clone()).await;
            kill_and_wait(slow[1].clone()).await;
            // From now on, submitters keep adding runs while the reader pages.
            for _ in 0..2 {
                let stop = stop.clone();
                let http = s.http.clone();
                let base = s.base.clone();
                let added = added_tx.clone();
                submitters.push(tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.is_cancelled() {
                        let resp = http
                            .post(format!("{base}/v1/runs?wait=10"))
                            .header("content-type", "application/json")
                            .body(r#"{"agent":"quick"}"#)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(resp.status(), 201);
                        n += 1;
                        added.send_modify(|a| *a += 1);
                    }
                    n
                }));
            }
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    stop.cancel();
    let mut added = 0;
    for t in submitters {
        added += t.await.unwrap();
    }
    assert!(added > 0, "no run was added while paging");

    let ids: Vec<String> = listed
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    let unique: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(unique.len(), ids.len(), "a run was listed twice: {ids:?}");
    assert_eq!(unique, on_file, "listed runs differ from those on file");
    // Live first (newest first), then ended (the most recently ended first).
    assert_eq!(
        &ids[..3],
        &[slow[3].clone(), slow[2].clone(), slow[0].clone()]
    );
    assert_eq!(
        ids[3], slow[1],
        "the run that ended meanwhile leads the ended ones"
    );
    let ends: Vec<u64> = listed[3..]
        .iter()
        .map(|r| r["finished_at"].as_u64().unwrap())
        .collect();
    assert!(ends.windows(2).all(|w| w[0] >= w[1]), "{ends:?}");
    kill_and_wait(slow[0].clone()).await;
}
