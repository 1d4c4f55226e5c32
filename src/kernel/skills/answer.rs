//! What a skill's answer holds: its memory (`<memory>…</memory>`), its
//! named outputs (`<output name="x">…</output>`) and the text that
//! remains.
//!
//! The last memory block's trimmed text is the memory; every memory block
//! is stripped from the output, so a memory never leaks into a published
//! message. Named output blocks are taken out as well (a destination picks
//! one by name); what remains, trimmed, is the output. A tag left open is
//! text like any other. Reading never fails: an answer is untrusted text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An answer, read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillAnswer {
    /// The answer without its memory and named output blocks, trimmed.
    pub output: String,
    /// The last memory block's trimmed text, if there was one.
    pub memory: Option<String>,
    /// The named outputs (a name given twice: the last block).
    pub outputs: BTreeMap<String, String>,
}

const MEMORY_OPEN: &str = "<memory>";
const MEMORY_CLOSE: &str = "</memory>";
const OUTPUT_OPEN: &str = "<output name=";
const OUTPUT_CLOSE: &str = "</output>";

/// Reads an answer (see the module doc).
pub fn parse_answer(text: &str) -> SkillAnswer {
    let mut answer = SkillAnswer::default();
    let mut rest = String::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let tail = &text[at..];
        let next_memory = tail.find(MEMORY_OPEN);
        let next_output = tail.find(OUTPUT_OPEN);
        let (start, is_memory) = match (next_memory, next_output) {
            (Some(m), Some(o)) if o < m => (o, false),
            (Some(m), _) => (m, true),
            (None, Some(o)) => (o, false),
            (None, None) => break,
        };
        let block = &tail[start..];
        let taken = if is_memory {
            block[MEMORY_OPEN.len()..].find(MEMORY_CLOSE).map(|end| {
                let body = &block[MEMORY_OPEN.len()..MEMORY_OPEN.len() + end];
                answer.memory = Some(body.trim().to_string());
                MEMORY_OPEN.len() + end + MEMORY_CLOSE.len()
            })
        } else {
            output_block(block).map(|(name, body, len)| {
                answer.outputs.insert(name, body.trim().to_string());
                len
            })
        };
        match taken {
            Some(len) => {
                rest.push_str(&tail[..start]);
                at += start + len;
            }
            None => {
                // An open tag without its end (or a malformed one): text.
                let skip = start + 1;
                rest.push_str(&tail[..skip]);
                at += skip;
            }
        }
    }
    rest.push_str(&text[at.min(text.len())..]);
    answer.output = rest.trim().to_string();
    answer
}

/// A block that starts `<output name="NAME">` (or `'NAME'`) and ends
/// `</output>`: its name, body and length in bytes.
fn output_block(block: &str) -> Option<(String, &str, usize)> {
    let after = &block[OUTPUT_OPEN.len()..];
    let quote = after.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let name_end = after[1..].find(quote)? + 1;
    let name = &after[1..name_end];
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid {
        return None;
    }
    let tag_rest = &after[name_end + 1..];
    let close = tag_rest.find('>')?;
    if !tag_rest[..close].trim().is_empty() {
        return None;
    }
    let body_start = OUTPUT_OPEN.len() + name_end + 1 + close + 1;
    let end = block[body_start..].find(OUTPUT_CLOSE)?;
    Some((
        name.to_string(),
        &block[body_start..body_start + end],
        body_start + end + OUTPUT_CLOSE.len(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_memory_wins_and_every_memory_is_stripped() {
        let a = parse_answer(
            "Report.\n<memory>old</memory>\nMore.\n<memory>\n  seen: 3 items\n</memory>\n",
        );
        assert_eq!(a.memory.as_deref(), Some("seen: 3 items"));
        assert_eq!(a.output, "Report.\n\nMore.");
        assert!(!a.output.contains("memory"));
    }

    #[test]
    fn named_outputs_are_taken_out() {
        let a = parse_answer(
            "Intro <output name=\"slack\">short</output> <output name='email'>\nlong\n</output> end",
        );
        assert_eq!(a.outputs.get("slack").map(String::as_str), Some("short"));
        assert_eq!(a.outputs.get("email").map(String::as_str), Some("long"));
        assert_eq!(a.output, "Intro   end");
        assert_eq!(a.memory, None);
    }

    #[test]
    fn open_or_malformed_tags_are_text() {
        let a = parse_answer("a <memory> b");
        assert_eq!(a.output, "a <memory> b");
        assert_eq!(a.memory, None);
        let b = parse_answer("<output name=>x</output> <output name=\"a b\">y</output>");
        assert!(b.outputs.is_empty());
        assert_eq!(
            b.output,
            "<output name=>x</output> <output name=\"a b\">y</output>"
        );
        assert_eq!(parse_answer("").output, "");
        // Multi-byte text around the tags.
        let c = parse_answer("é<memory>ü</memory>ß");
        assert_eq!((c.output.as_str(), c.memory.as_deref()), ("éß", Some("ü")));
    }
}
