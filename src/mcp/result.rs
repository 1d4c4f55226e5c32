//! What the model reads of an MCP tool result: text content joined by
//! newlines; an image, audio clip or resource as a short marker with its
//! MIME type and size (never its bytes); `isError: true` as an error result
//! the model reads (the run goes on). The registry then caps the text at
//! the run's `max_tool_result_bytes`, head and tail kept.
//!
//! The result is read as JSON (its wire form), so content kinds a later
//! protocol adds still give a marker instead of an error.

use serde_json::Value;

use crate::ports::tool::ToolError;

/// The model's view of a `tools/call` result (its JSON form).
pub(crate) fn to_model_text(result: &Value) -> Result<String, ToolError> {
    let mut parts: Vec<String> = Vec::new();
    if let Some(content) = result.get("content").and_then(Value::as_array) {
        for block in content {
            parts.push(block_text(block));
        }
    }
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
            parts.push(structured.to_string());
        }
    }
    let text = parts.join("\n");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = if text.is_empty() {
            "the tool reported an error".to_string()
        } else {
            text
        };
        return Err(ToolError::Failed(text));
    }
    Ok(text)
}

fn block_text(block: &Value) -> String {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let str_of = |key: &str| block.get(key).and_then(Value::as_str);
    match kind {
        "text" => str_of("text").unwrap_or("").to_string(),
        "image" | "audio" => marker(
            kind,
            str_of("mimeType"),
            str_of("data").map(base64_len),
            None,
        ),
        "resource" => {
            let res = block.get("resource").unwrap_or(&Value::Null);
            let get = |key: &str| res.get(key).and_then(Value::as_str);
            let size = match (get("text"), get("blob")) {
                (Some(t), _) => Some(t.len()),
                (None, Some(b)) => Some(base64_len(b)),
                (None, None) => None,
            };
            marker("resource", get("mimeType"), size, get("uri"))
        }
        "resource_link" => marker("resource link", str_of("mimeType"), None, str_of("uri")),
        other => marker(
            if other.is_empty() { "content" } else { other },
            None,
            None,
            None,
        ),
    }
}

fn marker(kind: &str, mime: Option<&str>, bytes: Option<usize>, uri: Option<&str>) -> String {
    let mut m = format!("[{kind}");
    if let Some(uri) = uri {
        m.push(' ');
        m.push_str(&crate::ports::run::cap_text(uri, 256));
    }
    if let Some(mime) = mime {
        m.push_str(", ");
        m.push_str(&crate::ports::run::cap_text(mime, 64));
    }
    if let Some(bytes) = bytes {
        m.push_str(&format!(", {bytes} bytes"));
    }
    m.push(']');
    m
}

/// The decoded size of base64 text (padding and whitespace left out).
fn base64_len(data: &str) -> usize {
    let n = data
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count();
    n * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_joined_and_media_become_markers() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "text", "text": "two"},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "abc"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"},
        ]});
        assert_eq!(
            to_model_text(&r),
            Ok(
                "one\n[image, image/png, 5 bytes]\ntwo\n[audio, audio/wav, 3 bytes]\n\
                [resource file:///a.txt, text/plain, 3 bytes]\n[resource link file:///b]"
                    .into()
            )
        );
    }

    #[test]
    fn is_error_is_an_error_result_with_the_text() {
        let r = json!({"content": [{"type": "text", "text": "no such city"}], "isError": true});
        assert_eq!(
            to_model_text(&r),
            Err(ToolError::Failed("no such city".into()))
        );
        let r = json!({"content": [], "isError": true});
        assert!(to_model_text(&r).is_err());
    }

    #[test]
    fn structured_content_stands_in_for_missing_content() {
        let r = json!({"content": [], "structuredContent": {"t": 1}});
        assert_eq!(to_model_text(&r), Ok(r#"{"t":1}"#.into()));
        assert_eq!(to_model_text(&json!({})), Ok(String::new()));
    }
}
