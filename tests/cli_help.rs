//! The command synopsis (docs/cli.md) and `--help` agree: every flag the
//! synopsis writes exists on its command, every flag a command has is in
//! the synopsis (the global ones in its comment), a flag with a default is
//! written `[--flag DEFAULT]`, and every command is there. A flag is given
//! only to the commands that use it: `--server` is refused by the others.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

/// One option of a command's `--help`: its default, if it has one.
type Options = BTreeMap<String, Option<String>>;

/// The options `agentvisor ARGS --help` lists (without `--help` and
/// `--version`), each with its `[default: …]`.
fn options(args: &[&str]) -> Options {
    let mut all = args.to_vec();
    all.push("--help");
    let out = support::cli::agentvisor(&all);
    assert!(out.status.success(), "{all:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut found = Options::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("-h, ")
            .or_else(|| trimmed.strip_prefix("-V, "))
            .unwrap_or(trimmed);
        if line.starts_with("  ") && flag.starts_with("--") {
            let name: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            current = Some(name.clone());
            found.insert(name, None);
        }
        if let (Some(name), Some(at)) = (&current, line.find("[default: ")) {
            let rest = &line[at + "[default: ".len()..];
            let value = rest.split(']').next().unwrap().to_string();
            found.insert(name.clone(), Some(value));
        }
    }
    found.remove("--help");
    found.remove("--version");
    found
}

/// The subcommands `agentvisor ARGS --help` lists (without `help`).
fn subcommands(args: &[&str]) -> Vec<String> {
    let mut all = args.to_vec();
    all.push("--help");
    let text = String::from_utf8(support::cli::agentvisor(&all).stdout).unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("Commands:") {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap().to_string();
            if name != "help" {
                out.push(name);
            }
        }
    }
    out
}

/// The synopsis (docs/cli.md): the lines of its plain fenced blocks (no
/// language) that start with `agentvisor ` (with their indented
/// continuation lines), and those blocks' `#` comments.
fn synopsis() -> (Vec<String>, String) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let (mut lines, mut comments) = (Vec::new(), String::new());
    let mut plain = false;
    let mut fenced = false;
    for line in readme.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            fenced = !fenced;
            plain = fenced && lang.trim().is_empty();
            continue;
        }
        if plain {
            let continued = line.starts_with(' ') && !line.trim().is_empty();
            if line.starts_with("agentvisor ") {
                lines.push(line.to_string());
            } else if let (true, Some(last)) = (continued, lines.last_mut()) {
                // A synopsis line wrapped onto the next (indented) one.
                last.push(' ');
                last.push_str(line.trim());
            } else if line.starts_with('#') {
                comments.push_str(line);
                comments.push('\n');
            }
        }
    }
    (lines, comments)
}

/// The commands a synopsis line is about (`runs approve|deny …` is two),
/// each as its words (`["runs", "approve"]`).
fn commands_of(line: &str, groups: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut words = line.split_whitespace().skip(1);
    let first = words.next().unwrap();
    let mut out = Vec::new();
    for cmd in first.split('|') {
        if groups.contains(cmd) {
            let sub = line.split_whitespace().nth(2).unwrap();
            for s in sub.split('|') {
                out.push(vec![cmd.to_string(), s.to_string()]);
            }
        } else {
            out.push(vec![cmd.to_string()]);
        }
    }
    out
}

/// The flags a synopsis line writes, each with what follows it up to the
/// closing `]` when it is written in brackets (`None`: written bare).
fn flags_of(line: &str) -> Vec<(String, Option<String>)> {
    let line = line.split("  #").next().unwrap();
    let mut out = Vec::new();
    for (i, _) in line.match_indices("--") {
        let rest = &line[i..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let bracketed = line[..i].ends_with('[');
        let value = if bracketed {
            let inner = rest.split(']').next().unwrap();
            Some(inner[name.len()..].trim().to_string())
        } else {
            None
        };
        out.push((name, value));
    }
    out
}

#[test]
fn the_synopsis_and_help_agree() {
    let (lines, comments) = synopsis();
    assert!(lines.len() > 15, "no synopsis found: {lines:?}");
    let global = options(&[]);
    for flag in global.keys() {
        assert!(
            comments.contains(flag.as_str()),
            "the global {flag} is not in the synopsis' comments"
        );
    }
    let top = subcommands(&[]);
    let groups: BTreeSet<String> = top
        .iter()
        .filter(|c| !subcommands(&[c.as_str()]).is_empty())
        .cloned()
        .collect();
    // Every command and subcommand is in the synopsis, and the flags of
    // each are those it writes.
    let mut written: BTreeMap<Vec<String>, Vec<(String, Option<String>)>> = BTreeMap::new();
    for line in &lines {
        for cmd in commands_of(line, &groups) {
            written.entry(cmd).or_default().extend(flags_of(line));
        }
    }
    let mut every = Vec::new();
    for c in &top {
        if groups.contains(c) {
            for s in subcommands(&[c.as_str()]) {
                every.push(vec![c.clone(), s]);
            }
        } else {
            every.push(vec![c.clone()]);
        }
    }
    for cmd in &every {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let flags = written.get(cmd).unwrap_or_else(|| {
            panic!(
                "`agentvisor {}` is not in the synopsis (docs/cli.md)",
                args.join(" ")
            )
        });
        let have = options(&args);
        for (flag, shown) in flags {
            assert!(
                have.contains_key(flag),
                "docs/cli.md writes `agentvisor {} {flag}`, which `--help` does not list",
                args.join(" ")
            );
            if let (Some(Some(default)), false) = (have.get(flag), global.contains_key(flag)) {
                let shown = shown.as_deref().unwrap_or_else(|| {
                    panic!(
                        "`agentvisor {} {flag}` has a default ({default}): write it `[{flag} {default}]`",
                        args.join(" ")
                    )
                });
                assert!(
                    shown.split('|').any(|v| v == default),
                    "docs/cli.md shows `agentvisor {} [{flag} {shown}]`; its default is {default}",
                    args.join(" ")
                );
            }
        }
        for flag in have.keys() {
            if global.contains_key(flag) {
                continue;
            }
            assert!(
                flags.iter().any(|(f, _)| f == flag),
                "`agentvisor {} {flag}` is missing from the synopsis (docs/cli.md)",
                args.join(" ")
            );
        }
    }
}

#[test]
fn server_is_a_flag_of_the_commands_that_use_it_only() {
    let url = "http://127.0.0.1:9";
    for args in [
        vec!["run", "examples/agents/hello.yaml", "--server", url],
        vec!["swarm", "examples/agents/hello.yaml", "--server", url],
        vec!["soak", "examples/agents/hello.yaml", "--server", url],
        vec!["serve", "--server", url],
        vec!["chat", "examples/agents/hello.yaml", "--server", url],
        vec!["token", "new", "--caller", "a", "--server", url],
        vec![
            "mcp",
            "tools",
            "examples/agents/hello.yaml",
            "--server",
            url,
        ],
        vec!["recover", "--server", url],
        vec!["budget", "show", "--server", url],
        vec!["sessions", "list", "--server", url],
        vec!["--server", url, "runs", "list"],
    ] {
        let out = support::cli::command(&args)
            .args(["--db", ":memory:"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--server'"),
            "{args:?}: {stderr}"
        );
    }
    // `runs` and `replay` take it, before or after their subcommand; the
    // server's absence is then what they report.
    for args in [
        vec!["runs", "list", "--server", url],
        vec!["runs", "--server", url, "list"],
        vec![
            "replay",
            "0123456789abcdef0123456789abcdef",
            "--server",
            url,
        ],
    ] {
        let out = support::cli::agentvisor(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot reach"), "{args:?}: {stderr}");
    }
}
