//! A person's answer to a tool's question (an MCP server's elicitation), checked
//! before it is committed: content that does not satisfy the schema the tool asked with
//! never reaches the tool.

use serde_json::Value;

/// The content to commit for an accepted answer: `content` (a JSON object, as text),
/// with each property the schema gives a default for and the answer leaves out set to
/// that default (as MCP's elicitation asks of clients, SEP-1034), satisfying `schema`.
///
/// # Errors
///
/// Why the content cannot be accepted, in words for the person who gave it.
pub(crate) fn accepted(schema_json: &str, content: &str) -> Result<String, String> {
    let schema: Value = serde_json::from_str(schema_json)
        .map_err(|_| "the tool's requested schema is not JSON".to_owned())?;
    let Ok(Value::Object(mut given)) = serde_json::from_str::<Value>(content) else {
        return Err("the answer must be a JSON object".to_owned());
    };
    agentloop_proto::input::with_defaults(&schema, &mut given);
    let content = Value::Object(given);
    let validator = jsonschema::validator_for(&schema)
        .map_err(|_| "the tool's requested schema is not a valid JSON Schema".to_owned())?;
    // The first few errors say enough; a schema can yield many.
    let errors: Vec<String> = validator
        .iter_errors(&content)
        .take(3)
        .map(|error| {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() {
                "the answer".to_owned()
            } else {
                at
            };
            format!("{at}: {error}")
        })
        .collect();
    if !errors.is_empty() {
        return Err(format!(
            "the answer does not satisfy the requested schema: {}",
            errors.join("; ")
        ));
    }
    Ok(content.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "tier": {"type": "string", "enum": ["free", "pro"], "default": "free"},
            "seats": {"type": "integer", "minimum": 1, "default": 1}
        },
        "required": ["name", "tier"]
    }"#;

    #[test]
    fn defaults_fill_what_the_answer_leaves_out_and_nothing_else() {
        let content = accepted(SCHEMA, r#"{"name":"ana","seats":3}"#).unwrap();
        let content: Value = serde_json::from_str(&content).unwrap();
        assert_eq!(
            content,
            serde_json::json!({"name": "ana", "tier": "free", "seats": 3})
        );
    }

    #[test]
    fn content_outside_the_schema_is_refused_saying_where() {
        let wrong = accepted(SCHEMA, r#"{"name":"ana","tier":"gold"}"#).unwrap_err();
        assert!(wrong.contains("/tier"), "{wrong}");
        let missing = accepted(SCHEMA, r#"{"seats":2}"#).unwrap_err();
        assert!(missing.contains("name"), "{missing}");
        for not_an_object in ["[]", "\"ana\"", "{", ""] {
            let refused = accepted(SCHEMA, not_an_object).unwrap_err();
            assert_eq!(refused, "the answer must be a JSON object");
        }
    }

    #[test]
    fn a_broken_schema_refuses_every_answer() {
        assert!(accepted("{", "{}").is_err());
        assert!(accepted(r#"{"type": 12}"#, "{}").is_err());
    }
}
