//! `agentvisor chat` with stdin piped (lines read plainly) and
//! `agentvisor sessions list|show`: answers in order, the conversation kept
//! in the database and continued with `--session`, Ctrl-C stopping one
//! answer and not the chat.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;

use serde_json::Value;
use support::scratch::Scratch;

fn agentvisor(db: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentvisor"));
    c.arg("--db").arg(db);
    c
}

fn chat_with(db: &Path, args: &[&str], input: &str) -> Output {
    let mut child = agentvisor(db)
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

const CHAT: &str = r#"
name: chat
system: You are terse.
script:
  - { text: "Hello Ada." }
  - { text: "Your name is Ada." }
  - { text: "Bye, Ada." }
"#;

#[test]
fn a_piped_chat_answers_every_line_and_goes_on_later() {
    let dir = Scratch::new("chat");
    let manifest = dir.file("chat.yaml", CHAT);
    let db = dir.0.join("a.db");
    let m = manifest.to_str().unwrap();
    let out = chat_with(
        &db,
        &[m, "--session", "ada"],
        "My name is Ada.\n\nWhat is my name?\n",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Hello Ada.\nYour name is Ada.\n"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("session ada"));

    // Later, the same conversation: the third prompt's run starts from the
    // first two turns, and the script plays on.
    let out = chat_with(&db, &[m, "--session", "ada"], "Bye.\n/exit\nnot sent\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Bye, Ada.\n");

    let shown = json(
        &agentvisor(&db)
            .args(["sessions", "show", "ada", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(shown["session"]["id"], "ada");
    assert_eq!(shown["session"]["agent"], "chat");
    assert_eq!(shown["session"]["state"], "idle");
    assert_eq!(shown["session"]["prompts"], 3);
    assert!(shown["session"].get("manifest").is_none());
    let messages = shown["messages"].as_array().unwrap();
    let turns: Vec<(String, String)> = messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            ("user", "My name is Ada."),
            ("assistant", "Hello Ada."),
            ("user", "What is my name?"),
            ("assistant", "Your name is Ada."),
            ("user", "Bye."),
            ("assistant", "Bye, Ada."),
        ]
        .map(|(r, c)| (r.to_string(), c.to_string()))
    );
    // The third run is on record with its session.
    let run_id = messages[5]["run_id"].as_str().unwrap();
    let run = json(
        &agentvisor(&db)
            .args(["runs", "show", run_id, "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(run["records"][0]["entry"]["session_id"], "ada", "{run}");

    let listed = json(
        &agentvisor(&db)
            .args(["sessions", "list", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], "ada");

    // Without --session, a new session with a minted id.
    let out = chat_with(&db, &[m], "hi\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello Ada.\n");
    let listed = json(
        &agentvisor(&db)
            .args(["sessions", "list", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(listed.as_array().unwrap().len(), 2);
}

#[test]
fn bad_sessions_are_refused() {
    let dir = Scratch::new("chat-bad");
    let manifest = dir.file("chat.yaml", CHAT);
    let other = dir.file("other.yaml", &CHAT.replace("name: chat", "name: other"));
    let db = dir.0.join("a.db");
    let out = chat_with(&db, &[manifest.to_str().unwrap(), "--session", "a b"], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid session id"));
    let ok = chat_with(&db, &[manifest.to_str().unwrap(), "--session", "s"], "hi\n");
    assert!(ok.status.success());
    let out = chat_with(&db, &[other.to_str().unwrap(), "--session", "s"], "hi\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("belongs to agent `chat`"),
        "{out:?}"
    );
    let missing = agentvisor(&db)
        .args(["sessions", "show", "nope"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let memory = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(["--db", ":memory:", "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(memory.status.code(), Some(2));
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_answer_not_the_chat() {
    let dir = Scratch::new("chat-int");
    // The second prompt's answer starts, then waits on a long tool call.
    let manifest = dir.file(
        "chat.yaml",
        r#"
name: chat
tools: [sleep]
script:
  - { text: "Hello." }
  - { text: "Working", tool: sleep, args: { ms: 600000 } }
  - { text: "Still here." }
"#,
    );
    let db = dir.0.join("a.db");
    let mut child = agentvisor(&db)
        .args(["chat", manifest.to_str().unwrap(), "--session", "c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut seen = String::new();
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = tx.send(seen.clone());
        }
        seen
    });
    let wait_for = |text: &str| loop {
        let seen = rx.recv().expect("the chat printed what was expected");
        if seen.contains(text) {
            break;
        }
    };
    stdin.write_all(b"hi\n").unwrap();
    wait_for("Hello.\n");
    stdin.write_all(b"do the long thing\n").unwrap();
    wait_for("Working");
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    stdin.write_all(b"still there?\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?} {stderr}");
    assert_eq!(out, "Hello.\nWorking\nStill here.\n", "{stderr}");
    assert!(stderr.contains("[cancelled"), "{stderr}");
    let shown = json(
        &agentvisor(&db)
            .args(["sessions", "show", "c", "--json"])
            .output()
            .unwrap(),
    );
    // The stopped answer is not kept.
    let contents: Vec<&str> = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["hi", "Hello.", "still there?", "Still here."]);
}
