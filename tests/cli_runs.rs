#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The CLI on the SQLite store (X1, P1): `run --db FILE` leaves the run on
//! record, `runs list` and `runs show` read it back, budgets hold across
//! invocations, and a database that cannot be used is refused with exit 2
//! and its path, untouched.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use support::cli::agentvisor;
use support::scratch::Scratch;

fn db_arg(p: &Path) -> String {
    p.display().to_string()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_run_is_on_record_and_runs_list_and_show_read_it_back() {
    let dir = Scratch::new("history");
    let db = db_arg(&dir.path("a.db"));
    let run = agentvisor(&["run", "examples/agents/hello.yaml", "--db", &db, "--json"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let result = json(&run);
    let run_id = result["run_id"].as_str().unwrap().to_string();

    let list = agentvisor(&["runs", "list", "--db", &db, "--json"]);
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let runs = json(&list);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["run_id"], run_id.as_str());
    assert_eq!(runs[0]["status"], "ok");
    assert_eq!(runs[0]["agent"], "hello");
    assert_eq!(runs[0]["caller_id"], "cli");

    let show = agentvisor(&["runs", "show", &run_id, "--db", &db, "--json"]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let shown = json(&show);
    assert_eq!(
        shown["result"], result,
        "the recorded result is the printed one"
    );
    let records = shown["records"].as_array().unwrap();
    assert_eq!(records.first().unwrap()["entry"]["record"], "run_started");
    assert_eq!(records.last().unwrap()["entry"]["record"], "terminal");
    assert_eq!(records.last().unwrap()["entry"]["status"], "ok");
    let types: Vec<&str> = records
        .iter()
        .filter_map(|r| r["entry"]["type"].as_str())
        .collect();
    assert!(
        types.contains(&"tool.call") && types.contains(&"step.finish"),
        "{types:?}"
    );
    let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");

    // The human forms.
    let show = agentvisor(&["runs", "show", &run_id, "--db", &db]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains(&format!("run {run_id}: ok")), "{text}");
    assert!(
        text.contains("records:") && text.contains("tool.call") && text.contains("run.end ok"),
        "{text}"
    );
    let list = agentvisor(&["runs", "list", "--db", &db]);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&run_id));
}

#[test]
fn runs_list_filters_by_status_and_caller() {
    let dir = Scratch::new("filters");
    let db = db_arg(&dir.path("a.db"));
    let ok = agentvisor(&[
        "run",
        "examples/agents/hello.yaml",
        "--db",
        &db,
        "--caller",
        "alice",
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let spent = agentvisor(&[
        "run",
        "examples/agents/budget.yaml",
        "--db",
        &db,
        "--caller",
        "bob",
    ]);
    assert_eq!(spent.status.code(), Some(1), "{}", stderr(&spent));

    let by_status = json(&agentvisor(&[
        "runs",
        "list",
        "--db",
        &db,
        "--json",
        "--status",
        "budget_exceeded",
    ]));
    assert_eq!(by_status.as_array().unwrap().len(), 1);
    assert_eq!(by_status[0]["caller_id"], "bob");
    let by_caller = json(&agentvisor(&[
        "runs", "list", "--db", &db, "--json", "--caller", "alice",
    ]));
    assert_eq!(by_caller.as_array().unwrap().len(), 1);
    assert_eq!(by_caller[0]["status"], "ok");
    let limited = json(&agentvisor(&[
        "runs", "list", "--db", &db, "--json", "--limit", "1",
    ]));
    assert_eq!(limited.as_array().unwrap().len(), 1);
    let bad = agentvisor(&["runs", "list", "--db", &db, "--status", "sideways"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_manifest_budget_is_each_invocations_own_allowance() {
    let dir = Scratch::new("budget");
    let db = db_arg(&dir.path("a.db"));
    let first = agentvisor(&["run", "examples/agents/budget.yaml", "--db", &db, "--json"]);
    let first = json(&first);
    assert_eq!(first["status"], "budget_exceeded");
    assert_eq!(
        first["kill_reason"], "budget",
        "crossed mid-flight: {first}"
    );
    assert!(first["iterations"].as_u64().unwrap() >= 1);

    // A new process on the same database behaves the same way: the
    // manifest's budget is counted from zero for each invocation (limits
    // kept in the database's ledger hold across processes: see
    // tests/store_sqlite.rs).
    let second = json(&agentvisor(&[
        "run",
        "examples/agents/budget.yaml",
        "--db",
        &db,
        "--json",
    ]));
    assert_eq!(second["status"], "budget_exceeded");
    assert_eq!(second["kill_reason"], "budget");
    assert_eq!(second["iterations"], first["iterations"], "{second}");

    // Both runs are on record.
    let listed = json(&agentvisor(&[
        "runs",
        "list",
        "--db",
        &db,
        "--json",
        "--status",
        "budget_exceeded",
    ]));
    assert_eq!(listed.as_array().unwrap().len(), 2);
}

#[test]
fn the_database_comes_from_agentvisor_db_when_no_flag_names_one() {
    let dir = Scratch::new("env");
    let db = dir.path("from-env/a.db");
    let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(["run", "examples/agents/hello.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("AGENTVISOR_DB", &db)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(db.exists(), "the database was created at AGENTVISOR_DB");
    let list = json(&agentvisor(&[
        "runs",
        "list",
        "--db",
        &db_arg(&db),
        "--json",
    ]));
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[test]
fn runs_show_of_an_unknown_run_says_so_and_exits_1() {
    let dir = Scratch::new("unknown");
    let db = db_arg(&dir.path("a.db"));
    assert_eq!(
        agentvisor(&["run", "examples/agents/hello.yaml", "--db", &db])
            .status
            .code(),
        Some(0)
    );
    let id = "0123456789abcdef0123456789abcdef";
    let out = agentvisor(&["runs", "show", id, "--db", &db]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("no run {id}")),
        "{}",
        stderr(&out)
    );
    let out = agentvisor(&["runs", "show", "not-an-id", "--db", &db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn a_database_that_cannot_be_used_is_refused_with_exit_2_and_its_path() {
    let dir = Scratch::new("refused");
    // Corrupt: refused, named, untouched.
    let corrupt = dir.path("corrupt.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&corrupt, &garbage).unwrap();
    for args in [
        vec!["run", "examples/agents/hello.yaml", "--db"],
        vec!["swarm", "examples/agents/hello.yaml", "--runs", "3", "--db"],
        vec!["runs", "list", "--db"],
    ] {
        let mut args = args;
        let path = db_arg(&corrupt);
        args.push(&path);
        let out = agentvisor(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&path), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read(&corrupt).unwrap(), garbage);

    // Unwritable: a file where the directory should be.
    let file = dir.path("plain");
    std::fs::write(&file, b"x").unwrap();
    let under = db_arg(&file.join("a.db"));
    let out = agentvisor(&["run", "examples/agents/hello.yaml", "--db", &under]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&under), "{}", stderr(&out));

    // History commands neither create a database nor read one from memory.
    let missing = dir.path("missing.db");
    let out = agentvisor(&["runs", "list", "--db", &db_arg(&missing)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!missing.exists());
    let out = agentvisor(&["runs", "list", "--db", ":memory:"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_swarm_leaves_one_terminal_record_per_run() {
    let dir = Scratch::new("swarm");
    let db = db_arg(&dir.path("a.db"));
    let out = agentvisor(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "300",
        "--concurrency",
        "50",
        "--json",
        "--db",
        &db,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = json(&out);
    assert_eq!(summary["runs"], 300);
    assert_eq!(summary["audit_terminal_records"], 300);
    let list = json(&agentvisor(&[
        "runs", "list", "--db", &db, "--json", "--limit", "1000",
    ]));
    assert_eq!(list.as_array().unwrap().len(), 300);
}

/// A lead that delegates to `mid` (which delegates to `leaf`) and to
/// `bad` (which fails), all in `dir`; returns the lead's manifest path.
fn delegating_manifests(dir: &Scratch) -> String {
    let write = |file: &str, yaml: String| {
        std::fs::write(dir.path(file), yaml).unwrap();
        db_arg(&dir.path(file))
    };
    let leaf = write(
        "leaf.yaml",
        "name: leaf\nscript:\n  - { text: leaf done, usage: { input: 5, output: 5 } }\n".into(),
    );
    let mid = write(
        "mid.yaml",
        format!("name: mid\nagents: {{ leaf: {leaf} }}\nscript:\n  - {{ tool: agent__leaf, args: {{ prompt: go }}, usage: {{ input: 10, output: 10 }} }}\n  - {{ text: mid done, usage: {{ input: 10, output: 10 }} }}\n"),
    );
    let bad = write(
        "bad.yaml",
        "name: bad\ntools: [add]\nlimits: { max_iterations: 1 }\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, usage: { input: 3, output: 3 } }\n  - { text: never }\n".into(),
    );
    write(
        "lead.yaml",
        format!("name: lead\ntools: [add]\nagents: {{ mid: {mid}, bad: {bad} }}\nscript:\n  - tools:\n      - {{ tool: agent__mid, args: {{ prompt: one }} }}\n      - {{ tool: agent__bad, args: {{ prompt: two }} }}\n    usage: {{ input: 20, output: 20 }}\n  - {{ text: lead done, usage: {{ input: 20, output: 20 }} }}\n"),
    )
}

#[test]
fn runs_show_tree_and_runs_list_root_read_a_delegation_tree_back() {
    let dir = Scratch::new("tree");
    let db = db_arg(&dir.path("a.db"));
    let lead = delegating_manifests(&dir);
    // Another run, in no tree.
    assert_eq!(
        agentvisor(&["run", "examples/agents/hello.yaml", "--db", &db])
            .status
            .code(),
        Some(0)
    );
    let run = agentvisor(&["run", &lead, "--db", &db, "--json"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let lead_id = json(&run)["run_id"].as_str().unwrap().to_string();

    // The tree, nested.
    let out = agentvisor(&["runs", "show", &lead_id, "--tree", "--json", "--db", &db]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let tree = json(&out);
    assert_eq!(tree["root_run_id"], lead_id.as_str());
    let top = &tree["runs"].as_array().unwrap()[..];
    assert_eq!(top.len(), 1);
    assert_eq!(top[0]["agent"], "lead");
    assert_eq!(top[0]["status"], "ok");
    assert_eq!(top[0]["tokens"], 80);
    let kids = top[0]["children"].as_array().unwrap();
    let by = |agent: &str| {
        kids.iter()
            .find(|k| k["agent"] == agent)
            .unwrap_or_else(|| panic!("no {agent} in {kids:?}"))
    };
    assert_eq!(by("mid")["status"], "ok");
    assert_eq!(by("mid")["tokens"], 40);
    assert_eq!(by("mid")["parent_run_id"], lead_id.as_str());
    assert_eq!(by("mid")["children"][0]["agent"], "leaf");
    assert_eq!(by("mid")["children"][0]["tokens"], 10);
    assert_eq!(by("bad")["status"], "error");
    assert_eq!(by("bad")["error_kind"], "max_iterations");
    let mid_id = by("mid")["run_id"].as_str().unwrap().to_string();

    // The human form: one line a run, indented under its parent.
    let out = agentvisor(&["runs", "show", &lead_id, "--tree", "--db", &db]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].contains("4 runs, 136 tokens"), "{text}");
    assert!(
        lines[1].starts_with(&lead_id) && lines[1].contains(" ok "),
        "{text}"
    );
    assert!(
        text.contains("error (max_iterations)")
            && text.contains("└─ ")
            && text.contains(" tokens "),
        "{text}"
    );
    let leaf_line = lines.iter().find(|l| l.contains(" leaf ")).unwrap();
    assert!(leaf_line.contains("└─ "), "the leaf is under mid:\n{text}");

    // A run inside the tree: its own part.
    let out = agentvisor(&["runs", "show", &mid_id, "--tree", "--json", "--db", &db]);
    let sub = json(&out);
    assert_eq!(sub["runs"][0]["agent"], "mid");
    assert_eq!(sub["runs"][0]["children"].as_array().unwrap().len(), 1);

    // The tree's runs as a list: the hello run is not among them.
    let out = agentvisor(&["runs", "list", "--root", &lead_id, "--json", "--db", &db]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = json(&out);
    let mut agents: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["agent"].as_str().unwrap())
        .collect();
    agents.sort_unstable();
    assert_eq!(agents, ["bad", "lead", "leaf", "mid"]);
    for r in listed.as_array().unwrap() {
        if r["agent"] != "lead" {
            assert_eq!(r["root_run_id"], lead_id.as_str(), "{r}");
        }
    }
    let out = agentvisor(&["runs", "list", "--root", &lead_id, "--db", &db]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5);

    // Bad input and unknown runs.
    let out = agentvisor(&["runs", "list", "--root", "nope", "--db", &db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let unknown = "0123456789abcdef0123456789abcdef";
    let out = agentvisor(&["runs", "show", unknown, "--tree", "--db", &db]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn run_of_a_pipeline_runs_its_phases_and_runs_show_tree_lists_them() {
    let dir = Scratch::new("pipeline");
    let db = db_arg(&dir.path("a.db"));
    std::fs::write(
        dir.path("leaf.yaml"),
        "name: leaf\nscript:\n  - { text: facts, usage: { input: 5, output: 5 } }\n",
    )
    .unwrap();
    std::fs::write(
        dir.path("essay.yaml"),
        "name: essay\nagents: { leaf: leaf.yaml }\nphases:\n  - name: gather\n    prompt: \"Gather facts on {{prompt}}\"\n    script:\n      - { tool: agent__leaf, args: { prompt: look }, usage: { input: 10, output: 10 } }\n      - { text: gathered, usage: { input: 10, output: 10 } }\n  - name: write\n    prompt: \"Write from {{phases.gather.output}}\"\n    script:\n      - { text: written, usage: { input: 1, output: 1 } }\n",
    )
    .unwrap();
    let essay = db_arg(&dir.path("essay.yaml"));
    let out = agentvisor(&["run", &essay, "--input", "tides", "--db", &db, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result = json(&out);
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["output"], "written");
    let phases = result["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    let pipeline_id = result["pipeline_id"].as_str().unwrap().to_string();

    let out = agentvisor(&[
        "runs",
        "show",
        &pipeline_id,
        "--tree",
        "--json",
        "--db",
        &db,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let tree = json(&out);
    let top = tree["runs"].as_array().unwrap();
    let agents: Vec<&str> = top.iter().map(|r| r["agent"].as_str().unwrap()).collect();
    assert_eq!(agents, ["essay.gather", "essay.write"]);
    assert_eq!(top[0]["children"][0]["agent"], "leaf");
    assert_eq!(top[0]["run_id"], phases[0]["run_id"]);

    // The human forms: the events of both phases, the phases' lines.
    let out = agentvisor(&["run", &essay, "--input", "tides", "--db", &db, "--events"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let ends = text
        .lines()
        .filter(|l| l.contains("\"type\":\"run.end\""))
        .count();
    assert_eq!(ends, 3, "two phases and the leaf:\n{text}");
    assert!(
        text.contains("phase gather: ok") && text.contains("phase write: ok"),
        "{text}"
    );
    assert!(
        text.contains("pipeline ") && text.contains("(essay): ok"),
        "{text}"
    );
}
