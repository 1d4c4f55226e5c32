//! Tool-argument validation as pure functions, one per step, in the order
//! [`validate_arguments`] applies them:
//!
//! 1. [`check_size`]: the raw text is at most [`MAX_ARGUMENT_BYTES`];
//! 2. [`parse_arguments`]: strict JSON (an empty or whitespace-only text
//!    means `{}`, since models send that for a tool without parameters);
//! 3. [`require_object`]: the value is a JSON object;
//! 4. [`check_schema`]: the object satisfies the tool's compiled schema.
//!
//! Every failure is a [`ToolError::InvalidArguments`] whose message tells the
//! model what to fix, capped to [`MAX_ERROR_BYTES`]. Nothing here guesses or
//! repairs: arguments that fail are never replaced by defaults.
//!
//! [`canonical_json`] and [`canonical_hash`] give the form of arguments that
//! repeat detection compares: object keys sorted, no whitespace, so two
//! calls that differ only in spacing or key order count as the same call.

use std::borrow::Cow;
use std::hash::{BuildHasher, Hash, Hasher};

use jsonschema::Validator;
use serde_json::Value;

use crate::ports::run::cap_text;
use crate::ports::tool::ToolError;

/// The largest argument text accepted, in bytes (64 KiB). Checked before
/// parsing, so an oversized text costs nothing but its length.
pub const MAX_ARGUMENT_BYTES: usize = 64 * 1024;

/// The longest error message handed back to the model, in bytes.
pub const MAX_ERROR_BYTES: usize = 4 * 1024;

/// How many schema violations one error lists before it says "and N more".
const MAX_LISTED_VIOLATIONS: usize = 5;

/// The longest single violation message (they quote the offending value).
const MAX_VIOLATION_BYTES: usize = 512;

/// Refuses an argument text longer than [`MAX_ARGUMENT_BYTES`].
pub fn check_size(text: &str) -> Result<(), ToolError> {
    if text.len() > MAX_ARGUMENT_BYTES {
        return Err(ToolError::InvalidArguments(format!(
            "arguments are {} bytes; the limit is {MAX_ARGUMENT_BYTES} bytes",
            text.len()
        )));
    }
    Ok(())
}

/// Parses argument text as strict JSON. An empty or whitespace-only text is
/// `{}`; anything else that is not one valid JSON value is refused with
/// serde's message (which gives the line and column).
pub fn parse_arguments(text: &str) -> Result<Value, ToolError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(text).map_err(|e| {
        ToolError::InvalidArguments(cap_text(
            &format!("arguments are not valid JSON: {e}"),
            MAX_ERROR_BYTES,
        ))
    })
}

/// Passes a JSON object through; refuses any other kind of value.
pub fn require_object(value: Value) -> Result<Value, ToolError> {
    let got = match &value {
        Value::Object(_) => return Ok(value),
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    };
    Err(ToolError::InvalidArguments(format!(
        "arguments must be a JSON object, got {got}"
    )))
}

/// Compiles a tool's argument schema once, at registration. Remote `$ref`s
/// are not resolved (the crate is built without resolvers), so a schema that
/// needs one fails here rather than at call time. The error is the
/// compiler's message.
pub fn compile_schema(schema: &Value) -> Result<Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| cap_text(&e.to_string(), MAX_ERROR_BYTES))
}

/// Checks arguments against a compiled schema. The error lists the first
/// few violations, each with the instance path that failed (`the root` for
/// the object itself: a missing or extra property) and what was expected.
pub fn check_schema(validator: &Validator, args: &Value) -> Result<(), ToolError> {
    let mut listed = Vec::new();
    let mut more = 0usize;
    for error in validator.iter_errors(args) {
        if listed.len() == MAX_LISTED_VIOLATIONS {
            more += 1;
            continue;
        }
        let path = error.instance_path().as_str();
        let at = if path.is_empty() {
            "at the root".to_string()
        } else {
            format!("at `{path}`")
        };
        listed.push(format!(
            "{at}: {}",
            cap_text(&error.to_string(), MAX_VIOLATION_BYTES)
        ));
    }
    if listed.is_empty() {
        return Ok(());
    }
    let mut message = format!("schema violation: {}", listed.join("; "));
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    Err(ToolError::InvalidArguments(cap_text(
        &message,
        MAX_ERROR_BYTES,
    )))
}

/// Runs every step in order and returns the validated arguments object.
pub fn validate_arguments(validator: &Validator, text: &str) -> Result<Value, ToolError> {
    check_size(text)?;
    let args = require_object(parse_arguments(text)?)?;
    check_schema(validator, &args)?;
    Ok(args)
}

/// Arguments in canonical form: compact JSON with every object's keys
/// sorted. An empty text is `{}` (as [`parse_arguments`] reads it); a text
/// that is not JSON is returned trimmed, as is.
pub fn canonical_json(text: &str) -> Cow<'_, str> {
    if text.trim().is_empty() {
        return Cow::Borrowed("{}");
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => {
            let mut out = String::with_capacity(text.len());
            write_canonical(&v, &mut out);
            Cow::Owned(out)
        }
        Err(_) => Cow::Borrowed(text.trim()),
    }
}

/// Hashes a tool call's name and arguments in canonical form (see
/// [`canonical_json`]) into `h`, without building the canonical text.
pub fn hash_call<H: Hasher>(name: &str, text: &str, h: &mut H) {
    name.hash(h);
    if text.trim().is_empty() {
        return hash_value(&Value::Object(serde_json::Map::new()), h);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => hash_value(&v, h),
        Err(_) => {
            0xffu8.hash(h);
            text.trim().hash(h);
        }
    }
}

/// The seed of [`canonical_hash`]: fixed, so a call hashes the same in
/// every process.
const CANONICAL_SEED: u64 = 0x6167_656e_7476_6973;

/// A hash of a tool call in canonical form (see [`hash_call`]).
pub fn canonical_hash(name: &str, text: &str) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(CANONICAL_SEED).build_hasher();
    hash_call(name, text, &mut h);
    h.finish()
}

/// [`canonical_hash`] of a call whose arguments are parsed already (as
/// validation leaves them): the same hash, without parsing them again.
pub fn canonical_hash_of(name: &str, args: &Value) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(CANONICAL_SEED).build_hasher();
    name.hash(&mut h);
    hash_value(args, &mut h);
    h.finish()
}

/// Feeds a value to a hasher: each kind tagged, object entries in key order.
fn hash_value<H: Hasher>(v: &Value, h: &mut H) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => {
            1u8.hash(h);
            b.hash(h);
        }
        Value::Number(n) => {
            2u8.hash(h);
            // Number's text is canonical for the value serde parsed.
            let mut buf = itoa::Buffer::new();
            match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => buf.format(u).hash(h),
                (_, Some(i)) => buf.format(i).hash(h),
                _ => n.to_string().hash(h),
            }
        }
        Value::String(s) => {
            3u8.hash(h);
            s.hash(h);
        }
        Value::Array(a) => {
            4u8.hash(h);
            a.len().hash(h);
            for x in a {
                hash_value(x, h);
            }
        }
        Value::Object(m) => {
            5u8.hash(h);
            m.len().hash(h);
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_unstable();
            for k in keys {
                k.hash(h);
                if let Some(x) = m.get(k) {
                    hash_value(x, h);
                }
            }
        }
    }
}

/// Writes a value as compact JSON with sorted keys.
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_unstable();
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parsed_call_hashes_as_its_text_does() {
        for text in [
            "",
            "  ",
            "{}",
            r#"{"b": [1, 2.5, "x"], "a": {"z": null, "y": true}}"#,
        ] {
            let parsed = parse_arguments(text).unwrap_or_default();
            assert_eq!(
                canonical_hash_of("t", &parsed),
                canonical_hash("t", text),
                "{text}"
            );
        }
        assert_ne!(canonical_hash("t", "{}"), canonical_hash("u", "{}"));
        assert_ne!(
            canonical_hash("t", r#"{"a": 1}"#),
            canonical_hash("t", r#"{"a": 2}"#)
        );
        // Key order and spacing do not matter.
        assert_eq!(
            canonical_hash("t", r#"{"a":1,"b":2}"#),
            canonical_hash("t", r#"{ "b": 2, "a": 1 }"#)
        );
    }
    use serde_json::json;

    fn add_schema() -> Validator {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
            "additionalProperties": false
        });
        match compile_schema(&schema) {
            Ok(v) => v,
            Err(e) => panic!("schema should compile: {e}"),
        }
    }

    fn invalid_message(result: Result<impl std::fmt::Debug, ToolError>) -> String {
        match result {
            Err(ToolError::InvalidArguments(m)) => m,
            other => panic!("expected InvalidArguments, got {other:?}"),
        }
    }

    #[test]
    fn empty_and_whitespace_text_is_an_empty_object() {
        assert_eq!(parse_arguments("").ok(), Some(json!({})));
        assert_eq!(parse_arguments(" \n\t ").ok(), Some(json!({})));
    }

    #[test]
    fn non_json_is_refused_with_serde_message() {
        let m = invalid_message(parse_arguments("{a: 1}"));
        assert!(m.contains("not valid JSON") && m.contains("line 1"), "{m}");
        let m = invalid_message(parse_arguments(r#"{"a": 1} trailing"#));
        assert!(m.contains("trailing"), "{m}");
        invalid_message(parse_arguments(r#"{"a": 1,}"#));
    }

    #[test]
    fn non_objects_are_refused() {
        for (text, kind) in [
            ("[1, 2]", "an array"),
            ("\"s\"", "a string"),
            ("3", "a number"),
            ("null", "null"),
            ("true", "a boolean"),
        ] {
            let m = invalid_message(parse_arguments(text).and_then(require_object));
            assert!(m.contains(kind), "{text}: {m}");
        }
    }

    #[test]
    fn oversize_text_is_refused_before_parsing() {
        let text = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_ARGUMENT_BYTES));
        let m = invalid_message(validate_arguments(&add_schema(), &text));
        assert!(m.contains("limit"), "{m}");
        assert!(check_size(&"x".repeat(MAX_ARGUMENT_BYTES)).is_ok());
    }

    #[test]
    fn wrong_type_names_the_path_and_the_expected_type() {
        let m = invalid_message(validate_arguments(&add_schema(), r#"{"a": "x", "b": 1}"#));
        assert!(m.contains("`/a`") && m.contains("number"), "{m}");
    }

    #[test]
    fn missing_required_property_is_named() {
        let m = invalid_message(validate_arguments(&add_schema(), r#"{"a": 1}"#));
        assert!(m.contains("at the root") && m.contains("\"b\""), "{m}");
    }

    #[test]
    fn extra_property_is_named() {
        let m = invalid_message(validate_arguments(
            &add_schema(),
            r#"{"a": 1, "b": 2, "c": 3}"#,
        ));
        assert!(m.contains("'c'"), "{m}");
    }

    #[test]
    fn many_violations_are_summarised_and_capped() {
        let props: serde_json::Map<String, Value> = (0..20)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        let schema = json!({"type": "object", "properties": props});
        let validator = compile_schema(&schema).map_err(|e| e.to_string());
        let Ok(validator) = validator else {
            panic!("schema should compile")
        };
        let args: serde_json::Map<String, Value> =
            (0..20).map(|i| (format!("p{i}"), json!(i))).collect();
        let m = invalid_message(check_schema(&validator, &Value::Object(args)));
        assert!(m.contains("and 15 more"), "{m}");
        assert!(m.len() <= MAX_ERROR_BYTES + 64);
    }

    #[test]
    fn valid_arguments_pass_through() {
        let args = validate_arguments(&add_schema(), r#"{"a": 2, "b": 3.5}"#).ok();
        assert_eq!(args, Some(json!({"a": 2, "b": 3.5})));
    }

    #[test]
    fn canonical_form_ignores_spacing_and_key_order() {
        let forms = [
            r#"{"a":1,"b":2}"#,
            r#"{ "b": 2, "a": 1 }"#,
            "{\n  \"a\" : 1 ,\n\t\"b\":2}",
        ];
        for f in forms {
            assert_eq!(canonical_json(f), r#"{"a":1,"b":2}"#, "{f}");
            assert_eq!(canonical_hash("add", f), canonical_hash("add", forms[0]));
        }
        assert_ne!(
            canonical_hash("add", r#"{"a":1,"b":3}"#),
            canonical_hash("add", forms[0])
        );
        assert_ne!(
            canonical_hash("sub", forms[0]),
            canonical_hash("add", forms[0])
        );
        assert_eq!(
            canonical_json(r#"{"z":{"y":[1, {"b":1,"a":2}]}}"#),
            r#"{"z":{"y":[1,{"a":2,"b":1}]}}"#
        );
        assert_eq!(canonical_json("  "), "{}");
        assert_eq!(canonical_hash("f", ""), canonical_hash("f", "{}"));
        assert_eq!(canonical_json(" not json "), "not json");
        assert_eq!(canonical_json(r#"{"k":"a\"b"}"#), r#"{"k":"a\"b"}"#);
    }

    #[test]
    fn bad_schemas_do_not_compile() {
        assert!(compile_schema(&json!({"type": "no-such-type"})).is_err());
        assert!(compile_schema(&json!({"$ref": "https://example.com/s.json"})).is_err());
    }
}
