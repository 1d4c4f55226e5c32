//! Tool guards (`guard:`) and the output guard (`output_guard:`): rules the
//! critic applies to a call before it runs and to a final answer before
//! it is given, as the manifest writes them and compiled once per agent
//! ([`Guards`]).
//!
//! ```yaml
//! guard:                                   # first match wins
//!   - { tool: "fs__delete*", action: deny, reason: "no deletes" }
//!   - { tool: shell__run, action: ask }    # waits for an operator, as `approval:` does
//!   - { tool: web__fetch, max_calls: 5 }   # per run: the 6th call is denied
//!   - { tool: "*", args: { pointer: /path, matches: "^/etc" }, action: deny }
//! output_guard: { deny_patterns: ["(?i)api[_-]?key"] }
//! ```
//!
//! A rule matches a call when its `tool` (a name, `*` matching any run of
//! characters) matches the tool's name and, if it has `args`, the value
//! at the JSON pointer in the call's arguments matches the regular
//! expression (a string as it is, any other value as its JSON text; a
//! pointer that finds nothing does not match). The first rule that
//! matches decides: `max_calls` denies the call once that many calls it
//! matched have gone through in the run, then `action` says `deny` (an
//! error result the model reads: `guard_denied: REASON`), `ask` (the call
//! waits for an operator, see `approval`) or `allow` (the default: the
//! call goes on, and no later rule is consulted).
//!
//! Loading is strict, as for the rest of the manifest: an unknown key, a
//! pattern that does not compile, a rule with neither `action` nor
//! `max_calls`, `max_calls` with `action: deny`, an empty `tool` or one
//! that names a tool the agent cannot call (a name without `*`) is refused
//! with the key and the line. A [`Guards`] made from a spec built in code
//! that was never checked fails closed: a pattern that does not compile
//! matches everything.
//!
//! Matching allocates nothing: a run whose manifest has no guard never
//! reaches this code, and one that has pays for a glob and a regex match
//! per rule tried.

use std::sync::atomic::{AtomicU32, Ordering};

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AgentSpec;

/// The largest compiled size of one pattern: a manifest's regular
/// expression cannot make the host compile an automaton of gigabytes.
const MAX_PATTERN_BYTES: usize = 1 << 20;

/// One rule of `guard:`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardRule {
    /// The tools it applies to: a name, where `*` matches any characters
    /// (`fs__delete*`, `*`).
    pub tool: String,
    /// Only calls whose arguments match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<ArgsPattern>,
    /// What a matching call gets (default `allow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<GuardAction>,
    /// Matching calls that may go through in one run; past it they are
    /// denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u32>,
    /// What a denied call's error says to the model (and the decision's
    /// detail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A rule's condition on the call's arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgsPattern {
    /// A JSON pointer into the arguments (`/path`, `/options/0`; `""`:
    /// the whole object).
    pub pointer: String,
    /// A regular expression the value there must match.
    pub matches: String,
}

/// What a guard rule does with a call it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardAction {
    /// The call is refused: an error result the model reads.
    Deny,
    /// The call waits for an operator's decision (as `approval:`).
    Ask,
    /// The call goes on (no later rule is consulted).
    Allow,
}

/// `output_guard:`: patterns a final answer must not match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputGuard {
    /// Regular expressions; a final answer that matches one gets one
    /// repair turn, then the run ends `error`/`guardrail`.
    pub deny_patterns: Vec<String>,
}

/// The error kind of a call a guard denied (`guard_denied: REASON`).
pub use crate::ports::tool::GUARD_DENIED;

/// The error kind of a run whose final answer matched the output guard
/// after its repair turn.
pub const GUARDRAIL: &str = "guardrail";

/// Compiles a pattern with the size bound.
fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .size_limit(MAX_PATTERN_BYTES)
        .build()
        .map_err(|e| e.to_string())
}

/// Whether `name` matches `glob` (`*` matches any run of characters,
/// nothing else is special).
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let (g, n) = (glob.as_bytes(), name.as_bytes());
    let (mut gi, mut ni) = (0, 0);
    // Where the last `*` was, and the name position it matched up to.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, ni));
            gi += 1;
        } else if gi < g.len() && g[gi] == n[ni] {
            gi += 1;
            ni += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&b| b == b'*')
}

/// One compiled rule.
#[derive(Debug)]
struct Rule {
    tool: Box<str>,
    args: Option<(Box<str>, Result<Regex, String>)>,
    action: GuardAction,
    /// The limit and the rule's counter.
    max_calls: Option<(u32, usize)>,
    reason: Option<Box<str>>,
}

impl Rule {
    fn matches(&self, tool: &str, args: &Value) -> bool {
        if !glob_matches(&self.tool, tool) {
            return false;
        }
        let Some((pointer, pattern)) = &self.args else {
            return true;
        };
        let Some(value) = args.pointer(pointer) else {
            return false;
        };
        let Ok(re) = pattern else {
            // Fails closed (see the module doc).
            return true;
        };
        match value {
            Value::String(s) => re.is_match(s),
            other => re.is_match(&other.to_string()),
        }
    }
}

/// What the guards say of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardVerdict {
    /// No rule stops it.
    Pass,
    /// It waits for an operator; `detail` is the decision's.
    Ask {
        /// `TOOL` or `TOOL: REASON`.
        detail: String,
    },
    /// It is refused.
    Deny {
        /// What the model reads (after `guard_denied: `).
        message: String,
        /// The decision's detail: `TOOL: WHY`.
        detail: String,
    },
}

/// A manifest's guards, compiled once per agent (see the module doc).
#[derive(Debug)]
pub struct Guards {
    rules: Box<[Rule]>,
    counted: usize,
    output: Box<[Result<Regex, String>]>,
}

impl Guards {
    /// The guards of `spec`, or `None` when it has none (its runs skip
    /// every guard check).
    pub fn of(spec: &AgentSpec) -> Option<Guards> {
        let output = spec
            .output_guard
            .as_ref()
            .map_or(&[][..], |o| &o.deny_patterns);
        if spec.guard.is_empty() && output.is_empty() {
            return None;
        }
        let mut counted = 0;
        let rules = spec
            .guard
            .iter()
            .map(|r| Rule {
                tool: r.tool.as_str().into(),
                args: r
                    .args
                    .as_ref()
                    .map(|a| (a.pointer.as_str().into(), compile(&a.matches))),
                action: r.action.unwrap_or(GuardAction::Allow),
                max_calls: r.max_calls.map(|n| {
                    counted += 1;
                    (n, counted - 1)
                }),
                reason: r.reason.as_deref().map(Into::into),
            })
            .collect();
        Some(Guards {
            rules,
            counted,
            output: output.iter().map(|p| compile(p)).collect(),
        })
    }

    /// Whether any rule applies to tool calls.
    pub fn guards_calls(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether the output guard has patterns.
    pub fn guards_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// How many counters a run needs (one per rule with `max_calls`).
    pub fn counters(&self) -> usize {
        self.counted
    }

    /// Checks a call of `tool` with `args` (the first matching rule
    /// decides). `counts` are the run's counters ([`counters`](Self::counters)
    /// of them); with `count`, a call a `max_calls` rule lets through is
    /// counted, without it the check only looks (a call checked again
    /// later, when it really runs).
    pub fn check(
        &self,
        tool: &str,
        args: &Value,
        counts: &[AtomicU32],
        count: bool,
    ) -> GuardVerdict {
        let Some(rule) = self.rules.iter().find(|r| r.matches(tool, args)) else {
            return GuardVerdict::Pass;
        };
        let why = |default: String| match &rule.reason {
            Some(r) if !r.trim().is_empty() => r.to_string(),
            _ => default,
        };
        if let Some((limit, slot)) = rule.max_calls {
            let counter = counts.get(slot);
            let made = counter.map_or(0, |c| c.load(Ordering::Relaxed));
            if made >= limit {
                let message = why(format!(
                    "`{tool}` may be called at most {limit} times in a run (guard `{}`)",
                    rule.tool
                ));
                return GuardVerdict::Deny {
                    detail: format!("{tool}: max_calls {limit} reached"),
                    message,
                };
            }
            if count {
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match rule.action {
            GuardAction::Allow => GuardVerdict::Pass,
            GuardAction::Ask => GuardVerdict::Ask {
                detail: match rule.reason.as_deref() {
                    Some(r) if !r.trim().is_empty() => format!("{tool}: {r}"),
                    _ => tool.to_string(),
                },
            },
            GuardAction::Deny => {
                let message = why(format!("denied by guard `{}`", rule.tool));
                GuardVerdict::Deny {
                    detail: format!("{tool}: {message}"),
                    message,
                }
            }
        }
    }

    /// Output-guard pattern `i` as written (`None` for one that does not
    /// compile, or no such pattern).
    pub fn output_pattern(&self, i: usize) -> Option<&str> {
        self.output.get(i)?.as_ref().ok().map(Regex::as_str)
    }

    /// The first output-guard pattern `answer` matches (0-based), if any.
    pub fn output_violation(&self, answer: &str) -> Option<usize> {
        self.output.iter().position(|p| match p {
            Ok(re) => re.is_match(answer),
            // Fails closed (see the module doc).
            Err(_) => true,
        })
    }
}

impl AgentSpec {
    /// Whether the agent's runs can call `name`: one of `tools`, a tool
    /// of its palette (a sub-agent's `agent__NAME`, an offered skill's
    /// `skill__NAME`), or a tool of one of its MCP servers
    /// (`SERVER__TOOL`; the server's tools are known only once it starts).
    pub(super) fn can_call(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t == name)
            || self.palette_offers(name)
            || name.split_once("__").is_some_and(|(server, tool)| {
                !tool.is_empty()
                    && self
                        .mcp
                        .as_ref()
                        .is_some_and(|m| m.servers.iter().any(|s| s.name == server))
            })
    }

    /// Checks `guard:` and `output_guard:` (part of [`check`](Self::check)).
    pub(super) fn check_guards(&self, source: &str) -> Result<(), String> {
        let at = |key: &str, needle: &str| line_after(source, key, needle);
        for (i, rule) in self.guard.iter().enumerate() {
            let n = i + 1;
            let tool = &rule.tool;
            let line = at("guard", tool);
            if tool.trim().is_empty() {
                return Err(format!(
                    "`guard` entry {n}: `tool` is empty{}",
                    at("guard", "tool")
                ));
            }
            if !tool.contains('*') && !self.can_call(tool) {
                return Err(format!(
                    "`guard` entry {n} names `{tool}`, which this agent cannot call{line}: list one of its `tools`, an `agent__NAME` of its `agents`, a `skill__NAME` of its `skills`, an MCP server's `SERVER__TOOL`, or use `*` (`fs__delete*`, `*`)"
                ));
            }
            match (rule.action, rule.max_calls) {
                (None, None) => {
                    return Err(format!(
                        "`guard` entry {n} (`{tool}`) needs `action` (deny, ask, allow) or `max_calls`{line}"
                    ));
                }
                (Some(GuardAction::Deny), Some(_)) => {
                    return Err(format!(
                        "`guard` entry {n} (`{tool}`) has `max_calls` with `action: deny`, which denies every call anyway{line}"
                    ));
                }
                (_, Some(0)) => {
                    return Err(format!(
                        "`guard` entry {n} (`{tool}`): `max_calls` must be at least 1 (use `action: deny`){}",
                        at("guard", "max_calls")
                    ));
                }
                _ => {}
            }
            if let Some(args) = &rule.args {
                if !(args.pointer.is_empty() || args.pointer.starts_with('/')) {
                    return Err(format!(
                        "`guard` entry {n} (`{tool}`): `args.pointer` must be a JSON pointer (`/path`, or \"\" for the whole arguments), not `{}`{}",
                        args.pointer,
                        at("guard", "pointer")
                    ));
                }
                compile(&args.matches).map_err(|e| {
                    format!(
                        "`guard` entry {n} (`{tool}`): `args.matches` is not a usable regular expression{}: {e}",
                        at("guard", &args.matches)
                    )
                })?;
            }
        }
        if let Some(out) = &self.output_guard {
            if out.deny_patterns.is_empty() {
                return Err(format!(
                    "`output_guard.deny_patterns` is empty{}",
                    at("output_guard", "deny_patterns")
                ));
            }
            for (i, p) in out.deny_patterns.iter().enumerate() {
                compile(p).map_err(|e| {
                    format!(
                        "`output_guard.deny_patterns` entry {} is not a usable regular expression{}: {e}",
                        i + 1,
                        at("output_guard", p)
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// " at line N" for the first line at or after the line of `key:` that
/// mentions `needle`, or "".
fn line_after(source: &str, key: &str, needle: &str) -> String {
    let code = |l: &str| l.split('#').next().unwrap_or("").to_string();
    let from = source
        .lines()
        .position(|l| code(l).trim_start().starts_with(&format!("{key}:")))
        .unwrap_or(0);
    source
        .lines()
        .enumerate()
        .skip(from)
        .find(|(_, l)| code(l).contains(needle))
        .map(|(i, _)| format!(" at line {}", i + 1))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const BASE: &str = "name: g\ntools: [add, upper, wait]\nscript:\n  - { text: hi }\n";

    fn parse(extra: &str) -> Result<AgentSpec, String> {
        AgentSpec::from_yaml(&format!("{BASE}{extra}")).map_err(|e| e.to_string())
    }

    fn counters(g: &Guards) -> Vec<AtomicU32> {
        (0..g.counters()).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn globs_match_like_shell_stars() {
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("fs__delete*", "fs__delete_file"));
        assert!(glob_matches("fs__delete*", "fs__delete"));
        assert!(!glob_matches("fs__delete*", "fs__read"));
        assert!(glob_matches("*__run", "shell__run"));
        assert!(glob_matches("a*b*c", "aXXbYYc"));
        assert!(glob_matches("a*b*c", "abbbc"));
        assert!(!glob_matches("a*b*c", "aXXbYY"));
        assert!(glob_matches("add", "add"));
        assert!(!glob_matches("add", "adder"));
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let spec = parse(
            r#"guard:
  - { tool: upper, args: { pointer: /text, matches: "^ok" }, action: allow }
  - { tool: "*", args: { pointer: /text, matches: "secret" }, action: deny, reason: no secrets }
  - { tool: upper, action: ask }
  - { tool: add, max_calls: 2 }
"#,
        )
        .unwrap();
        let g = Guards::of(&spec).unwrap();
        let c = counters(&g);
        assert_eq!(c.len(), 1);
        let check = |tool: &str, args: Value| g.check(tool, &args, &c, true);
        assert_eq!(
            check("upper", json!({"text": "ok secret"})),
            GuardVerdict::Pass
        );
        assert_eq!(
            check("upper", json!({"text": "a secret"})),
            GuardVerdict::Deny {
                message: "no secrets".into(),
                detail: "upper: no secrets".into()
            }
        );
        assert_eq!(
            check("upper", json!({"text": "plain"})),
            GuardVerdict::Ask {
                detail: "upper".into()
            }
        );
        // A pointer that finds nothing does not match: the next rule decides.
        assert_eq!(check("add", json!({"a": 1, "b": 2})), GuardVerdict::Pass);
        // Looking does not count.
        assert_eq!(g.check("add", &json!({}), &c, false), GuardVerdict::Pass);
        assert_eq!(check("add", json!({"a": 1, "b": 2})), GuardVerdict::Pass);
        let third = check("add", json!({"a": 1, "b": 2}));
        assert!(
            matches!(&third, GuardVerdict::Deny { detail, message } if detail == "add: max_calls 2 reached" && message.contains("at most 2")),
            "{third:?}"
        );
        // Numbers are matched as their JSON text.
        let spec = parse(
            "guard:\n  - { tool: add, args: { pointer: /a, matches: \"^4\\\\d$\" }, action: deny }\n",
        )
        .unwrap();
        let g = Guards::of(&spec).unwrap();
        assert!(matches!(
            g.check("add", &json!({"a": 42, "b": 0}), &[], true),
            GuardVerdict::Deny { .. }
        ));
        assert_eq!(
            g.check("add", &json!({"a": 4, "b": 0}), &[], true),
            GuardVerdict::Pass
        );
    }

    #[test]
    fn no_guards_compile_to_nothing() {
        assert!(Guards::of(&parse("").unwrap()).is_none());
    }

    #[test]
    fn output_patterns_name_the_first_match() {
        let spec = parse("output_guard: { deny_patterns: [\"password\", \"(?i)api[_-]?key\"] }\n")
            .unwrap();
        let g = Guards::of(&spec).unwrap();
        assert!(!g.guards_calls() && g.guards_output());
        assert_eq!(g.output_violation("here is the API_KEY: x"), Some(1));
        assert_eq!(g.output_violation("all fine"), None);
    }

    #[test]
    fn a_spec_built_in_code_with_a_bad_pattern_fails_closed() {
        let mut spec = AgentSpec::new("g", "scripted");
        spec.guard.push(GuardRule {
            tool: "*".into(),
            args: Some(ArgsPattern {
                pointer: "/path".into(),
                matches: "(".into(),
            }),
            action: Some(GuardAction::Deny),
            max_calls: None,
            reason: None,
        });
        spec.output_guard = Some(OutputGuard {
            deny_patterns: vec!["[".into()],
        });
        let g = Guards::of(&spec).unwrap();
        assert!(matches!(
            g.check("read", &json!({"path": "/tmp"}), &[], true),
            GuardVerdict::Deny { .. }
        ));
        assert_eq!(g.output_violation("anything"), Some(0));
    }

    #[test]
    fn bad_entries_are_refused_with_their_key_and_line() {
        let cases = [
            (
                "guard:\n  - { tool: add, acton: deny }\n",
                "unknown field `acton`",
                "line 6",
            ),
            (
                "guard:\n  - { tool: add, action: maybe }\n",
                "unknown variant `maybe`",
                "line 6",
            ),
            (
                "guard:\n  - { tool: add }\n",
                "needs `action` (deny, ask, allow) or `max_calls`",
                "at line 6",
            ),
            (
                "guard:\n  - { tool: upper, action: ask }\n  - { tool: add, action: deny, max_calls: 3 }\n",
                "`max_calls` with `action: deny`",
                "at line 7",
            ),
            (
                "guard:\n  - { tool: add, max_calls: 0 }\n",
                "`max_calls` must be at least 1",
                "at line 6",
            ),
            (
                "guard:\n  - { tool: add, args: { pointer: /a, matches: \"(\" }, action: deny }\n",
                "`args.matches` is not a usable regular expression",
                "at line 6",
            ),
            (
                "guard:\n  - { tool: add, args: { pointer: a, matches: x }, action: deny }\n",
                "`args.pointer` must be a JSON pointer",
                "at line 6",
            ),
            (
                "guard:\n  - { tool: add, args: { pointer: /a, match: x }, action: deny }\n",
                "unknown field `match`",
                "line 6",
            ),
            (
                "guard:\n  - { tool: delete_file, action: deny }\n",
                "names `delete_file`, which this agent cannot call",
                "at line 6",
            ),
            (
                "guard:\n  - { tool: \"\", action: deny }\n",
                "`tool` is empty",
                "at line 6",
            ),
            (
                "output_guard: { deny_patterns: [\"ok\", \"[\"] }\n",
                "`output_guard.deny_patterns` entry 2 is not a usable regular expression",
                "at line 5",
            ),
            (
                "output_guard: { deny_patterns: [] }\n",
                "`output_guard.deny_patterns` is empty",
                "at line 5",
            ),
            (
                "output_guard: { deny: [x] }\n",
                "unknown field `deny`",
                "line 5",
            ),
        ];
        for (yaml, says, line) in cases {
            let e = parse(yaml)
                .err()
                .unwrap_or_else(|| panic!("accepted: {yaml}"));
            assert!(e.contains(says), "{yaml}\n{e}");
            assert!(e.contains(line), "{yaml}\n{e}");
        }
        // Globs need not name a listed tool; an MCP server's tool is
        // known once it starts.
        assert!(parse("guard:\n  - { tool: \"fs__delete*\", action: deny }\n").is_ok());
    }
}
