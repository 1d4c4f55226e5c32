//! Model prices and context windows (M8, M6): the table shipped in
//! `data/prices.json`, compiled into the crate, and the integer arithmetic
//! that turns a run's [`Usage`] into micro-dollars.
//!
//! # Guarantees
//!
//! - **No floats.** Prices are written as decimal strings of US dollars per
//!   million tokens and parsed exactly into micro-dollars per million
//!   tokens; a cost is `Σ tokens × price / 1_000_000`, rounded half up once,
//!   on the run's whole usage (so rounding never accumulates over calls).
//! - **Usage convention.** `input_tokens` counts every prompt token, cache
//!   reads and writes included (the providers normalize to this); the
//!   uncached rest is billed at the input price.
//! - **Lookup.** By exact id, then by the longest table id the model's id
//!   starts with at a word boundary (`gpt-4o-mini-2024-07-18` is
//!   `gpt-4o-mini`), case-insensitively, after any `org/` prefix. A model
//!   the table does not know has no price: its runs cost 0 and say so in a
//!   warning event (the run actor's job, not this module's).
//!
//! This module owns the table and the arithmetic; it knows nothing about
//! runs or providers.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::ports::run::Usage;

/// The table, as shipped.
const PRICES_JSON: &str = include_str!("../../data/prices.json");

/// One model's prices (micro-dollars per million tokens) and context window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Uncached prompt tokens.
    pub input: u64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: u64,
    /// Completion tokens (reasoning included).
    pub output: u64,
    /// The context window in tokens (0: unknown).
    pub context: u64,
}

impl Price {
    /// The cost of `usage` in micro-dollars, rounded half up.
    pub fn cost_micros(&self, usage: &Usage) -> u64 {
        let cached = usage
            .cache_read_tokens
            .saturating_add(usage.cache_write_tokens);
        let uncached = usage.input_tokens.saturating_sub(cached);
        let pico_mtok: u128 = u128::from(uncached) * u128::from(self.input)
            + u128::from(usage.cache_read_tokens) * u128::from(self.cache_read)
            + u128::from(usage.cache_write_tokens) * u128::from(self.cache_write)
            + u128::from(usage.output_tokens) * u128::from(self.output);
        let micros = (pico_mtok + 500_000) / 1_000_000;
        u64::try_from(micros).unwrap_or(u64::MAX)
    }
}

#[derive(Deserialize)]
struct RawTable {
    models: HashMap<String, RawPrice>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input: String,
    output: String,
    #[serde(default)]
    cache_read: Option<String>,
    #[serde(default)]
    cache_write: Option<String>,
    #[serde(default)]
    context: u64,
}

/// The shipped table, parsed once. An entry that does not parse is left
/// out (and a unit test makes sure none does).
fn table() -> &'static HashMap<String, Price> {
    static TABLE: OnceLock<HashMap<String, Price>> = OnceLock::new();
    TABLE.get_or_init(|| parse_table(PRICES_JSON).unwrap_or_default())
}

fn parse_table(text: &str) -> Result<HashMap<String, Price>, String> {
    let raw: RawTable = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = HashMap::with_capacity(raw.models.len());
    for (id, p) in raw.models {
        let input = parse_dollars(&p.input).ok_or_else(|| format!("{id}: bad input price"))?;
        let output = parse_dollars(&p.output).ok_or_else(|| format!("{id}: bad output price"))?;
        let cache = |v: &Option<String>| match v {
            None => Some(input),
            Some(s) => parse_dollars(s),
        };
        let cache_read = cache(&p.cache_read).ok_or_else(|| format!("{id}: bad cache_read"))?;
        let cache_write = cache(&p.cache_write).ok_or_else(|| format!("{id}: bad cache_write"))?;
        out.insert(
            id.to_ascii_lowercase(),
            Price {
                input,
                cache_read,
                cache_write,
                output,
                context: p.context,
            },
        );
    }
    Ok(out)
}

/// `"2.50"` (dollars) → 2_500_000 (micro-dollars), exactly; at most six
/// decimals.
fn parse_dollars(s: &str) -> Option<u64> {
    let s = s.trim();
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty() || frac.len() > 6 {
        return None;
    }
    let digits = |t: &str| t.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut frac_micros: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..6 {
        frac_micros *= 10;
    }
    whole.checked_mul(1_000_000)?.checked_add(frac_micros)
}

/// The price of a model id, if the table knows it (see the module doc).
pub fn lookup(model_id: &str) -> Option<Price> {
    let id = model_id.rsplit('/').next().unwrap_or(model_id);
    let id = id.to_ascii_lowercase();
    let t = table();
    if let Some(p) = t.get(&id) {
        return Some(*p);
    }
    t.iter()
        .filter(|(k, _)| {
            id.len() > k.len()
                && id.starts_with(k.as_str())
                && matches!(id.as_bytes()[k.len()], b'-' | b':' | b'@' | b'.' | b'_')
        })
        .max_by_key(|(k, _)| k.len())
        .map(|(_, p)| *p)
}

/// The context window of a model id in tokens, if the table knows it.
pub fn context_window(model_id: &str) -> Option<u64> {
    lookup(model_id).map(|p| p.context).filter(|&c| c > 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_shipped_table_parses_whole() {
        let t = parse_table(PRICES_JSON).unwrap();
        assert_eq!(t.len(), table().len());
        assert!(t.len() > 30);
    }

    #[test]
    fn dollars_parse_exactly() {
        assert_eq!(parse_dollars("2.50"), Some(2_500_000));
        assert_eq!(parse_dollars("0.075"), Some(75_000));
        assert_eq!(parse_dollars("15"), Some(15_000_000));
        assert_eq!(parse_dollars("0"), Some(0));
        assert_eq!(parse_dollars(".5"), Some(500_000));
        for bad in ["", ".", "1.2345678", "-1", "1e3", "a"] {
            assert_eq!(parse_dollars(bad), None, "{bad}");
        }
    }

    #[test]
    fn dated_and_prefixed_ids_find_their_family() {
        let mini = lookup("gpt-4o-mini").unwrap();
        assert_eq!(lookup("gpt-4o-mini-2024-07-18"), Some(mini));
        assert_eq!(lookup("GPT-4o-2024-08-06").unwrap().input, 2_500_000);
        assert_eq!(
            lookup("claude-sonnet-4-20250514").unwrap().output,
            15_000_000
        );
        assert_eq!(
            lookup("claude-sonnet-4-5-20250929").unwrap().input,
            3_000_000
        );
        assert_eq!(lookup("llama3.2:3b").unwrap().context, 131072);
        assert_eq!(
            lookup("meta-llama/llama-3.3-70b-instruct").unwrap().input,
            590_000
        );
        assert_eq!(lookup("gpt-4ox"), None);
        assert_eq!(lookup("no-such-model"), None);
        assert_eq!(context_window("gpt-4o"), Some(128_000));
    }

    #[test]
    fn cost_is_integer_and_splits_cache_tokens() {
        let p = lookup("claude-sonnet-4").unwrap();
        // 1000 uncached + 2000 cache reads + 500 cache writes, 100 out, in
        // dollars per Mtok: 1000×3 + 2000×0.30 + 500×3.75 + 100×15
        // = 3000 + 600 + 1875 + 1500 = 6975 µ$.
        let u = Usage {
            input_tokens: 3500,
            output_tokens: 100,
            cache_read_tokens: 2000,
            cache_write_tokens: 500,
            reasoning_tokens: 0,
            estimated: false,
        };
        assert_eq!(p.cost_micros(&u), 6975);
        let mini = lookup("gpt-4o-mini").unwrap();
        let small = Usage {
            input_tokens: 120,
            output_tokens: 8,
            ..Usage::default()
        };
        // 120 × 0.15 + 8 × 0.60 = 18 + 4.8 = 22.8 → 23
        assert_eq!(mini.cost_micros(&small), 23);
        assert_eq!(mini.cost_micros(&Usage::default()), 0);
    }
}
