//! The guard a manifest passes before it is parsed: its size and its
//! nesting depth, checked in one pass over the text, so that parse time
//! stays linear in the manifest's size.

/// The largest manifest accepted, in bytes (checked before parsing).
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;
/// The deepest nesting a manifest may have (checked before parsing, so
/// parse time stays linear in the manifest's size).
pub const MAX_MANIFEST_DEPTH: usize = 64;

pub(super) fn too_large() -> String {
    format!("the manifest is larger than {MAX_MANIFEST_BYTES} bytes (1 MiB), the limit")
}

/// Refuses a manifest that is too large or nested too deep, without
/// parsing it: one pass over the text. Block nesting is counted by
/// indentation (and `- - x` dashes), flow nesting by `[`/`{` outside
/// quotes; the contents of block scalars (`|`, `>`) are skipped.
pub fn check_manifest_shape(text: &str) -> Result<(), String> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(too_large());
    }
    let deep = |n: usize| {
        format!(
            "the manifest nests deeper than {MAX_MANIFEST_DEPTH} levels at line {}",
            n + 1
        )
    };
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - trimmed.len();
        if let Some(owner) = block_scalar {
            if trimmed.is_empty() || indent > owner {
                continue;
            }
            block_scalar = None;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if flow == 0 {
            while indents.last().is_some_and(|&i| i >= indent) {
                indents.pop();
            }
            indents.push(indent);
            let mut rest = trimmed;
            let mut dashes = 0;
            while let Some(r) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
                dashes += 1;
                rest = r.trim_start();
            }
            if indents.len() + dashes > MAX_MANIFEST_DEPTH {
                return Err(deep(n));
            }
        }
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        let mut escaped = false;
        for c in trimmed.chars() {
            match quote {
                Some(q) => {
                    if q == '"' && c == '\\' && !escaped {
                        escaped = true;
                        continue;
                    }
                    if c == q && !escaped {
                        quote = None;
                    }
                    escaped = false;
                }
                None => match c {
                    '"' | '\'' if matches!(prev, ' ' | '\t' | ':' | '[' | '{' | ',' | '-') => {
                        quote = Some(c)
                    }
                    '#' if matches!(prev, ' ' | '\t') => break,
                    '[' | '{' => {
                        flow += 1;
                        if indents.len() + flow > MAX_MANIFEST_DEPTH {
                            return Err(deep(n));
                        }
                    }
                    ']' | '}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            prev = c;
        }
        let head = trimmed.split(" #").next().unwrap_or("").trim_end();
        if flow == 0
            && quote.is_none()
            && head
                .rsplit([' ', ':', '-'])
                .next()
                .is_some_and(|t| t.starts_with(['|', '>']) && t.len() <= 3)
        {
            block_scalar = Some(indent);
        }
    }
    Ok(())
}
