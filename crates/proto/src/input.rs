//! The content of an `InputAnswer`: what a tool's requested schema says of the
//! properties an answer leaves out.

use serde_json::{Map, Value};

/// Longest question a tool may ask (`ToolResult.InputRequired.message`), in bytes.
pub const MAX_QUESTION_BYTES: usize = 4 * 1024;
/// Largest schema a tool's question may request (`requested_schema_json`), in bytes.
pub const MAX_QUESTION_SCHEMA_BYTES: usize = 64 * 1024;

/// Whether a tool's question is within [`MAX_QUESTION_BYTES`] and
/// [`MAX_QUESTION_SCHEMA_BYTES`]: what the tool gateway takes from an executor.
pub fn within_bounds(asked: &crate::v1::tool_result::InputRequired) -> bool {
    asked.message.len() <= MAX_QUESTION_BYTES
        && asked.requested_schema_json.len() <= MAX_QUESTION_SCHEMA_BYTES
}

/// Sets each top-level property of `schema` that has a default and is missing from
/// `content` to that default, as MCP's elicitation asks of clients (SEP-1034).
/// Requested schemas are flat objects of primitives, so deeper defaults do not occur.
/// Both the orchestrator (before it checks an answer) and an MCP gateway told to answer
/// with defaults fill an answer this way.
pub fn with_defaults(schema: &Value, content: &mut Map<String, Value>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        if let Some(default) = property.get("default")
            && !content.contains_key(name)
        {
            content.insert(name.clone(), default.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_missing_properties_with_a_default_are_filled() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tier": {"type": "string", "default": "free"},
                "seats": {"type": "integer", "default": 1}
            }
        });
        let mut content = serde_json::json!({"seats": 3})
            .as_object()
            .cloned()
            .unwrap_or_default();
        with_defaults(&schema, &mut content);
        assert_eq!(
            Value::Object(content),
            serde_json::json!({"tier": "free", "seats": 3})
        );
        let mut untouched = Map::new();
        with_defaults(&serde_json::json!({"type": "object"}), &mut untouched);
        assert!(untouched.is_empty());
    }
}
