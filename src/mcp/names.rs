//! The names the model sees: `<server>__<tool>`, within the 64 characters
//! of `[A-Za-z0-9_-]` that providers allow, deterministic and unique.
//!
//! A character outside that set becomes `_`. A name that is still too long,
//! or that two tools would share, is cut and ends in `_` and eight hex
//! digits of a hash of the server's own tool name: the same server listing
//! the same tools always gets the same names.

/// The longest name providers accept.
pub(crate) const MAX_NAME: usize = 64;

/// The model-facing names of `tools` (the server's own names, in its
/// order) of server `server`, one per tool, unique.
pub(crate) fn model_names(server: &str, tools: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(tools.len());
    let mut taken = std::collections::HashSet::new();
    for tool in tools {
        let plain = format!("{server}__{}", sanitize(tool));
        let name = if plain.len() <= MAX_NAME && !taken.contains(&plain) {
            plain
        } else {
            let mut salt = 0u32;
            loop {
                let candidate = shortened(&plain, tool, salt);
                if !taken.contains(&candidate) {
                    break candidate;
                }
                salt += 1;
            }
        };
        taken.insert(name.clone());
        out.push(name);
    }
    out
}

/// Whether a server's own tool name can be called at all: not empty, at
/// most 128 bytes, no control characters.
pub(crate) fn is_callable(tool: &str) -> bool {
    !tool.is_empty() && tool.len() <= 128 && !tool.chars().any(char::is_control)
}

fn sanitize(tool: &str) -> String {
    tool.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `plain` cut to leave room for `_` and 8 hex digits of the hash of the
/// tool's own name (and `salt`, for the rare collision of hashes).
fn shortened(plain: &str, tool: &str, salt: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tool.bytes().chain(salt.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let keep = MAX_NAME - 9;
    // `plain` is ASCII (sanitized), so any byte index is a char boundary.
    let head = &plain[..plain.len().min(keep)];
    format!("{head}_{:08x}", (h >> 32) as u32 ^ h as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    #[test]
    fn short_names_are_prefixed_and_odd_characters_replaced() {
        assert_eq!(
            model_names("time", &["get_current_time", "convert.time"]),
            ["time__get_current_time", "time__convert_time"]
        );
    }

    #[test]
    fn long_and_clashing_names_are_cut_deterministically_and_stay_unique() {
        let long = "a".repeat(100);
        let long2 = format!("{}b", "a".repeat(99));
        let tools = [long.as_str(), long2.as_str(), "x.y", "x_y", "x/y"];
        let names = model_names("server", &tools);
        assert_eq!(names, model_names("server", &tools), "deterministic");
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for n in &names {
            assert!(valid(n), "{n}");
            assert!(n.starts_with("server__"), "{n}");
        }
        assert_eq!(names[2], "server__x_y");
        assert_ne!(names[3], "server__x_y");
    }

    #[test]
    fn uncallable_names_are_told_apart() {
        assert!(is_callable("get_time"));
        assert!(!is_callable(""));
        assert!(!is_callable("a\nb"));
        assert!(!is_callable(&"a".repeat(200)));
    }
}
