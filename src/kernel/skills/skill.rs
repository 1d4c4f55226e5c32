//! A skill's file, `SKILL.md`: YAML front matter between two `---` lines,
//! then the prompt, with `{{ include "FILE" }}` directives.
//!
//! # Includes
//!
//! `{{ include "FILE" }}` is replaced by the file's text, `FILE` relative
//! to the skill's folder. One level only: an included file's own
//! directives stay as text. The file must lie inside the repository once
//! every `..` and symbolic link is followed: an absolute path, a `..` that
//! climbs out, or a link that points out is refused, naming the line.
//! (`../shared/style.md` within the repository is allowed.)

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{read_capped, shift_yaml_error, SkillError};

/// A skill, read and its includes inserted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skill {
    /// Its name (the key in `agentvisor.yaml`'s `skills:`).
    pub name: String,
    /// Its folder, as found (inside the repository).
    pub dir: PathBuf,
    /// Its front matter.
    pub front: FrontMatter,
    /// The prompt: the body, includes inserted, trimmed.
    pub prompt: String,
}

/// The keys of a skill's front matter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontMatter {
    /// Its name: when given, the same as its key in `skills:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The model it runs on when its schedule and the defaults name none
    /// (a model spec or a tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_hint: Option<String>,
    /// The cap on each reply's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Model turns a run may take, when its schedule sets none (else 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// The MCP servers it needs, by name: each must be one of its
    /// schedule's `mcp_servers`, and its runs get only these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<String>,
    /// How its memory is written back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback: Option<SkillWriteback>,
}

/// A skill's `writeback:`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillWriteback {
    /// How a memory block is framed in the file it is written to: checked
    /// and kept; the writeback writes the memory's text as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_format: Option<String>,
}

/// The opening of a directive.
const OPEN: &str = "{{";

impl Skill {
    /// Reads skill `name` from `dir` (its `SKILL.md`), confined to `root`
    /// (both canonical).
    pub(super) fn read(name: &str, dir: &Path, root: &Path) -> Result<Skill, SkillError> {
        let file = dir.join("SKILL.md");
        let shown = file.display().to_string();
        let text = read_capped(&file)?;
        let invalid = |message: String| SkillError::Invalid {
            path: shown.clone(),
            message,
        };
        let (front_text, body, body_line) = split_front_matter(&text).map_err(invalid)?;
        let front: FrontMatter = if front_text.trim().is_empty() {
            FrontMatter::default()
        } else {
            serde_norway::from_str(front_text).map_err(|e| invalid(shift_yaml_error(&e, 1)))?
        };
        if let Some(n) = &front.name {
            if n != name {
                return Err(invalid(format!(
                    "`name` is `{n}`, but `agentvisor.yaml` lists this skill as `{name}`{}",
                    super::line_in(&text, 0, "name:")
                )));
            }
        }
        if front.max_turns == Some(0) {
            return Err(invalid(format!(
                "`max_turns` must be at least 1{}",
                super::line_in(&text, 0, "max_turns")
            )));
        }
        if front.max_tokens == Some(0) {
            return Err(invalid(format!(
                "`max_tokens` must be at least 1{}",
                super::line_in(&text, 0, "max_tokens")
            )));
        }
        let prompt = expand_includes(body, body_line, dir, root).map_err(invalid)?;
        Ok(Skill {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            front,
            prompt: prompt.trim().to_string(),
        })
    }
}

/// The front matter's text, the body, and the body's first line (1-based).
fn split_front_matter(text: &str) -> Result<(&str, &str, usize), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(
            "the file must open with front matter: a `---` line, YAML keys, a `---` line (line 1)"
                .into(),
        );
    }
    let start = first.len();
    let mut at = start;
    for (i, line) in lines.enumerate() {
        if line.trim_end() == "---" {
            return Ok((&text[start..at], &text[at + line.len()..], i + 3));
        }
        at += line.len();
    }
    Err("the front matter opened at line 1 is never closed by a `---` line".into())
}

/// The body with its includes inserted (see the module doc).
fn expand_includes(
    body: &str,
    first_line: usize,
    dir: &Path,
    root: &Path,
) -> Result<String, String> {
    if !body.contains(OPEN) {
        return Ok(body.to_string());
    }
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    let mut consumed = 0usize;
    while let Some(at) = rest.find(OPEN) {
        let line = first_line + body[..consumed + at].matches('\n').count();
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        match include_target(after) {
            Some((target, len)) => {
                let text = read_include(target, dir, root)
                    .map_err(|why| format!("include \"{target}\" at line {line}: {why}"))?;
                out.push_str(&text);
                consumed += at + OPEN.len() + len;
                rest = &after[len..];
            }
            None => {
                if after.trim_start().starts_with("include") {
                    return Err(format!(
                        "a malformed include at line {line}: write {{{{ include \"FILE\" }}}}"
                    ));
                }
                out.push_str(OPEN);
                consumed += at + OPEN.len();
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// `include "FILE" }}` at the start of `after`: the file and the length
/// of the directive's rest.
fn include_target(after: &str) -> Option<(&str, usize)> {
    let trimmed = after.trim_start();
    let lead = after.len() - trimmed.len();
    let args = trimmed.strip_prefix("include")?;
    let args_trimmed = args.trim_start();
    if args_trimmed.len() == args.len() {
        return None;
    }
    let quoted = args_trimmed.strip_prefix('"')?;
    let end = quoted.find('"')?;
    let target = &quoted[..end];
    let tail = &quoted[end + 1..];
    let close = tail.trim_start();
    close.strip_prefix("}}")?;
    let len = lead
        + "include".len()
        + (args.len() - args_trimmed.len())
        + 1
        + end
        + 1
        + (tail.len() - close.len())
        + 2;
    (!target.is_empty() && !target.contains('\n')).then_some((target, len))
}

/// Reads an included file, confined to the repository.
fn read_include(target: &str, dir: &Path, root: &Path) -> Result<String, String> {
    let path = Path::new(target);
    if path.is_absolute() || path.components().any(|c| matches!(c, Component::Prefix(_))) {
        return Err(
            "an absolute path is refused: name a file relative to the skill's folder".into(),
        );
    }
    let joined = dir.join(path);
    let real = std::fs::canonicalize(&joined).map_err(|e| format!("cannot read it: {e}"))?;
    if !real.starts_with(root) {
        let how = if path.components().any(|c| c == Component::ParentDir) {
            "`..` climbs out of the repository"
        } else {
            "it is a link to a file outside the repository"
        };
        return Err(format!("refused: {how}"));
    }
    if !real.is_file() {
        return Err("not a file".into());
    }
    read_capped(&real).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_is_split_with_its_lines() {
        let (f, b, line) = split_front_matter("---\nname: a\n---\nHello\n").unwrap();
        assert_eq!((f, b, line), ("name: a\n", "Hello\n", 4));
        assert!(split_front_matter("name: a\n").is_err());
        assert!(split_front_matter("---\nname: a\n").is_err());
    }

    #[test]
    fn include_directives_are_read() {
        assert_eq!(include_target(" include \"a.md\" }} x"), Some(("a.md", 18)));
        assert_eq!(include_target("include \"a.md\"}}"), Some(("a.md", 16)));
        assert_eq!(include_target(" inputs.x }}"), None);
        assert_eq!(include_target(" include a.md }}"), None);
        assert_eq!(include_target(" includes \"a\" }}"), None);
    }
}
