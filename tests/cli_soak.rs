#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `agentvisor soak`, the command over the soak engine: a short soak with
//! chaos writes a report whose figures add up (every run has one terminal
//! record, every status is explained by an injected fault), says a soak
//! this short is too short for an RSS verdict, and draws an SVG plot; a
//! soak without chaos sees only `ok`, on the in-memory stores and on
//! SQLite; on SQLite each sample reads the database, WAL and spool, and
//! the report judges and plots them; a chaos rate outside 0..=1 is
//! refused with exit 2.
//!
//! These run the real binary on the wall clock, so they assert nothing
//! that depends on how many runs fit in the time: counts that must add up,
//! whatever they are. Exact counts and timings are asserted on paused time
//! in `soak_engine.rs`.

mod support;

use std::process::Output;

use serde_json::Value;
use support::cli::agentvisor;
use support::scratch::Scratch;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The exit code says what the verdict says.
fn exit_matches_verdict(out: &Output, report: &Value) {
    let pass = report["verdict"]["pass"].as_bool().unwrap();
    assert_eq!(
        out.status.code(),
        Some(if pass { 0 } else { 1 }),
        "{}",
        stderr(out)
    );
}

#[test]
fn a_chaos_soak_reports_consistent_figures_and_a_plot() {
    let dir = Scratch::new("chaos");
    let report_dir = dir.0.join("report");
    let out = agentvisor(&[
        "soak",
        "examples/agents/soak.yaml",
        "--duration",
        "1s",
        "--concurrency",
        "20",
        "--chaos",
        "0.2",
        "--report",
        report_dir.to_str().unwrap(),
        "--db",
        ":memory:",
    ]);
    let text = std::fs::read_to_string(report_dir.join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}): {}", stderr(&out)));
    let r: Value = serde_json::from_str(&text).unwrap();
    exit_matches_verdict(&out, &r);
    assert!(String::from_utf8_lossy(&out.stdout).contains("verdict:"));

    // Settings as asked.
    let s = &r["settings"];
    assert_eq!(s["duration_s"], 1.0);
    assert_eq!(s["concurrency"], 20);
    assert_eq!(s["chaos_rate"], 0.2);
    assert_eq!(s["db"], ":memory:");

    // Samples while runs start, then the drain: time moves forward and
    // no `run` sample follows a `drain` one.
    let series = r["series"].as_array().unwrap();
    assert!(!series.is_empty());
    let phases: Vec<&str> = series
        .iter()
        .map(|x| x["phase"].as_str().unwrap())
        .collect();
    let first_drain = phases
        .iter()
        .position(|p| *p == "drain")
        .unwrap_or(phases.len());
    assert!(
        phases[first_drain..].iter().all(|p| *p == "drain"),
        "{phases:?}"
    );
    let times: Vec<f64> = series.iter().map(|x| x["t_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    for (i, x) in series.iter().enumerate() {
        for key in ["runs_per_sec", "p50_ms", "p99_ms", "rss_bytes", "open_fds"] {
            assert!(x[key].is_number(), "sample {i} lacks {key}");
        }
        assert!(u(&x["rss_bytes"]) > 0 && u(&x["open_fds"]) > 0);
        assert!(u(&x["live_actors"]) > u(&x["live_runs"]));
        assert!(u(&x["live_runs"]) <= 20);
    }
    assert!(series.iter().any(|x| u(&x["live_runs"]) > 0));

    // The counts add up.
    let m = &r["summary"];
    let submitted = u(&m["runs_submitted"]);
    assert!(submitted >= 20, "{submitted} runs");
    assert_eq!(u(&m["runs_finished"]), submitted);
    let by_status = m["by_status"].as_object().unwrap();
    assert_eq!(by_status.values().map(u).sum::<u64>(), submitted);
    assert_eq!(
        series.iter().map(|x| u(&x["completed"])).sum::<u64>(),
        submitted
    );
    assert_eq!(&series.last().unwrap()["statuses"], &m["by_status"]);
    assert_eq!(u(&m["audit"]["terminal_records"]), submitted);

    // Chaos happened, and explains every status.
    let c = &m["chaos"];
    assert!(u(&c["calls"]) > submitted, "{c}");
    let faults = u(&c["slow"]) + u(&c["hang"]) + u(&c["rate_limited"]) + u(&c["malformed"]);
    assert!(faults > 0, "{c}");
    let n = |k: &str| by_status.get(k).map(u).unwrap_or(0);
    assert_eq!(n("killed/stalled"), u(&c["hang"]), "each hang is reaped");
    assert!(n("error/rate_limited") <= u(&c["rate_limited"]));

    // The verdict's parts.
    let v = &r["verdict"];
    assert_eq!(v["terminal"]["pass"], true, "{v}");
    assert_eq!(u(&v["terminal"]["terminal_records"]), submitted);
    assert_eq!(v["statuses"]["pass"], true, "{v}");
    assert!(v["statuses"]["unexplained"].as_object().unwrap().is_empty());
    for key in [
        "slope_pct_per_min",
        "warmup_s",
        "samples",
        "pass",
        "slope_low_pct_per_min",
        "slope_high_pct_per_min",
        "confidence",
        "reason",
    ] {
        assert!(!v["rss"][key].is_null(), "verdict.rss lacks {key}");
    }
    // A one-second soak is too short to judge RSS, and that is no failure.
    assert_eq!(v["rss"]["outcome"], "too_short", "{}", v["rss"]);
    assert_eq!(v["rss"]["pass"], true);
    assert!(String::from_utf8_lossy(&out.stdout).contains("too short to judge"));
    assert_eq!(
        v["pass"],
        v["rss"]["pass"].as_bool().unwrap()
            && v["statuses"]["pass"].as_bool().unwrap()
            && v["terminal"]["pass"].as_bool().unwrap()
    );

    // Nothing on disk in memory: no disk figures, no disk verdict.
    assert!(m["disk"].is_null(), "{}", m["disk"]);
    assert!(v["disk"].is_null(), "{}", v["disk"]);
    assert!(series.iter().all(|x| u(&x["disk_bytes"]) == 0));
    // Each sample carries the faults injected so far, up to the total.
    assert_eq!(&series.last().unwrap()["chaos"], c);

    let svg = std::fs::read_to_string(report_dir.join("soak.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("RSS (MiB)") && svg.contains("<polyline"));
    assert!(svg.contains("log scale") && svg.contains("hang injected"));
}

/// A soak without chaos: only `ok`, one terminal record per run.
fn assert_clean_soak(db: &str) {
    let out = agentvisor(&[
        "soak",
        "examples/agents/soak.yaml",
        "--duration",
        "1s",
        "--concurrency",
        "10",
        "--json",
        "--db",
        db,
    ]);
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stderr(&out)));
    exit_matches_verdict(&out, &r);
    assert!(r.get("series").is_none(), "--json leaves the series out");
    let m = &r["summary"];
    let submitted = u(&m["runs_submitted"]);
    assert!(submitted >= 10);
    let statuses: Vec<&String> = m["by_status"].as_object().unwrap().keys().collect();
    assert_eq!(statuses, ["ok"], "{m}");
    assert_eq!(u(&m["by_status"]["ok"]), submitted);
    assert!(m["chaos"].is_null());
    assert_eq!(r["verdict"]["statuses"]["pass"], true);
    assert_eq!(r["verdict"]["terminal"]["pass"], true);
    assert_eq!(u(&m["audit"]["terminal_records"]), submitted);
    // Without `--retain` a database keeps every run: its growth is stated,
    // not judged.
    if db == ":memory:" {
        assert!(r["verdict"]["disk"].is_null());
    } else {
        assert_eq!(
            r["verdict"]["disk"]["outcome"], "unbounded",
            "{}",
            r["verdict"]
        );
        assert!(r["verdict"]["disk"]["retention"].is_null());
    }
}

/// On SQLite, each sample reads the database, its WAL and the spool; the
/// report sums them up, judges them against `--retain` (a one-second soak
/// never reaches its bound: too short to judge, no failure) and plots
/// them.
#[test]
fn a_soak_on_sqlite_samples_and_plots_its_disk_use() {
    let dir = Scratch::new("disk");
    let db = dir.0.join("soak.db");
    let report_dir = dir.0.join("report");
    let out = agentvisor(&[
        "soak",
        "examples/agents/soak.yaml",
        "--duration",
        "1s",
        "--concurrency",
        "10",
        "--retain",
        "max_bytes=1GiB",
        "--report",
        report_dir.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(report_dir.join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}): {}", stderr(&out)));
    let r: Value = serde_json::from_str(&text).unwrap();
    exit_matches_verdict(&out, &r);
    let series = r["series"].as_array().unwrap();
    for x in series {
        assert_eq!(
            u(&x["disk_bytes"]),
            u(&x["db_bytes"]) + u(&x["wal_bytes"]) + u(&x["spool_bytes"])
        );
    }
    assert!(series.iter().any(|x| u(&x["db_bytes"]) > 0), "{series:?}");
    let d = &r["summary"]["disk"];
    assert_eq!(d["db"], db.to_str().unwrap());
    assert!(
        d["spool"].as_str().unwrap().ends_with("soak.db.spool"),
        "{d}"
    );
    // After the shutdown the file holds every record: what the file
    // system says, byte for byte.
    let on_disk = std::fs::metadata(&db).unwrap().len();
    assert_eq!(u(&d["end"]["db_bytes"]), on_disk);
    assert!(u(&d["peak_bytes"]) >= u(&d["peak_db_wal_bytes"]));
    assert!(u(&d["peak_db_wal_bytes"]) > 0);
    let v = &r["verdict"]["disk"];
    assert_eq!(v["outcome"], "too_short", "{v}");
    assert_eq!(v["pass"], true);
    assert_eq!(u(&v["retention"]["max_bytes"]), 1 << 30);
    assert!(
        v["reason"].as_str().unwrap().contains("was not reached"),
        "{v}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("disk:"));

    let svg = std::fs::read_to_string(report_dir.join("soak.svg")).unwrap();
    assert!(svg.contains("disk (MiB): peak") && svg.contains("max_bytes 1024.0 MiB"));
}

#[test]
fn a_soak_without_chaos_sees_only_ok_in_memory() {
    assert_clean_soak(":memory:");
}

#[test]
fn a_soak_without_chaos_sees_only_ok_on_sqlite() {
    let dir = Scratch::new("sqlite");
    assert_clean_soak(dir.0.join("soak.db").to_str().unwrap());
}

#[test]
fn a_chaos_rate_outside_zero_to_one_is_refused() {
    for rate in ["2", "-0.5", "lots"] {
        let out = agentvisor(&[
            "soak",
            "examples/agents/soak.yaml",
            "--duration",
            "1s",
            &format!("--chaos={rate}"),
            "--db",
            ":memory:",
        ]);
        assert_eq!(out.status.code(), Some(2), "{rate}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("chaos rate must be a number from 0 to 1"),
            "{}",
            stderr(&out)
        );
    }
}

/// A soak too short for the RSS slope: the verdict says it could not
/// judge (`inconclusive`, with the reason), exits 0 with a warning, and
/// with `--require` fails.
#[test]
fn a_verdict_that_could_not_judge_memory_is_inconclusive_and_require_fails_it() {
    let soak = |extra: &[&str]| {
        let mut args = vec![
            "soak",
            "examples/agents/soak.yaml",
            "--duration",
            "1s",
            "--concurrency",
            "4",
            "--db",
            ":memory:",
        ];
        args.extend_from_slice(extra);
        agentvisor(&args)
    };
    let out = soak(&["--json"]);
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stderr(&out)));
    let v = &r["verdict"];
    assert_eq!(v["rss"]["outcome"], "too_short", "{v}");
    assert_eq!(v["outcome"], "inconclusive", "{v}");
    assert_eq!(v["pass"], true, "{v}");
    assert!(
        v["unjudged"][0]
            .as_str()
            .unwrap()
            .starts_with("rss: too short"),
        "{v}"
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: the verdict is inconclusive"),
        "{}",
        stderr(&out)
    );
    // The text report says it too.
    let out = soak(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verdict:       INCONCLUSIVE"), "{text}");
    assert_eq!(out.status.code(), Some(0));
    // --require: an inconclusive verdict fails.
    let out = soak(&["--json", "--require"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["verdict"]["outcome"], "inconclusive");
    assert_eq!(r["verdict"]["pass"], false);
    assert_eq!(r["verdict"]["require_conclusive"], true);
    exit_matches_verdict(&out, &r);
    assert!(stderr(&out).contains("--require"), "{}", stderr(&out));
}
