//! A call's JSON arguments as a Cedar record, typed from the tools' JSON Schemas.
//!
//! Cedar validates policies against a schema, so `context.arguments.amount` must have a
//! declared type. The tools already declare their arguments as JSON Schemas: each one's
//! `properties` map to Cedar types (string → `String`, integer → `Long`, boolean →
//! `Bool`, array → `Set`, object → record), every attribute optional (a policy guards
//! with `has`). One record serves every tool, since the action is the same for all:
//! an argument name two tools type differently, or a type Cedar cannot hold (numbers
//! with fractions, `oneOf`, `$ref`), is left out, so a policy that reads it does not
//! validate instead of reading something it did not expect.

use std::collections::BTreeMap;
use std::fmt::Write;

use cedar_policy::RestrictedExpression;
use serde_json::Value;

/// Deepest nesting of records and sets, in schemas and in values. Deeper arguments
/// cannot be expressed and their call is refused.
pub const MAX_DEPTH: usize = 8;

/// A Cedar type an argument can have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ArgType {
    String,
    Long,
    Bool,
    Set(Box<ArgType>),
    /// Attributes by name, every one optional.
    Record(BTreeMap<String, ArgType>),
}

/// An argument name of two tools, with the type each gives it: both are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) name: String,
}

impl ArgType {
    /// The Cedar type of a JSON Schema, if it has one.
    pub(crate) fn of_schema(schema: &Value, depth: usize) -> Option<ArgType> {
        if depth > MAX_DEPTH {
            return None;
        }
        match schema.get("type")?.as_str()? {
            "string" => Some(ArgType::String),
            "integer" => Some(ArgType::Long),
            "boolean" => Some(ArgType::Bool),
            "array" => {
                let items = ArgType::of_schema(schema.get("items")?, depth + 1)?;
                Some(ArgType::Set(Box::new(items)))
            }
            "object" => Some(ArgType::Record(properties(schema, depth + 1))),
            _ => None,
        }
    }

    /// One record for many tools' arguments: the union of their attributes, less those
    /// whose types disagree (returned, to be logged).
    pub(crate) fn union<'a>(
        schemas: impl IntoIterator<Item = &'a Value>,
    ) -> (ArgType, Vec<Conflict>) {
        let mut merged: BTreeMap<String, Option<ArgType>> = BTreeMap::new();
        for schema in schemas {
            for (name, ty) in properties(schema, 1) {
                match merged.get_mut(&name) {
                    None => {
                        merged.insert(name, Some(ty));
                    }
                    Some(slot) => {
                        let agreed = slot.take().and_then(|known| known.merge(ty));
                        *slot = agreed;
                    }
                }
            }
        }
        let conflicts = merged
            .iter()
            .filter(|(_, ty)| ty.is_none())
            .map(|(name, _)| Conflict { name: name.clone() })
            .collect();
        let record = merged
            .into_iter()
            .filter_map(|(name, ty)| Some((name, ty?)))
            .collect();
        (ArgType::Record(record), conflicts)
    }

    /// Two declarations of one name: records merge attribute by attribute, other types
    /// must be equal.
    fn merge(self, other: ArgType) -> Option<ArgType> {
        match (self, other) {
            (ArgType::Record(mut mine), ArgType::Record(theirs)) => {
                for (name, ty) in theirs {
                    match mine.remove(&name) {
                        None => {
                            mine.insert(name, ty);
                        }
                        Some(known) => {
                            if let Some(agreed) = known.merge(ty) {
                                mine.insert(name, agreed);
                            }
                        }
                    }
                }
                Some(ArgType::Record(mine))
            }
            (ArgType::Set(mine), ArgType::Set(theirs)) => {
                mine.merge(*theirs).map(|ty| ArgType::Set(Box::new(ty)))
            }
            (mine, theirs) if mine == theirs => Some(mine),
            _ => None,
        }
    }

    /// The type in Cedar schema syntax.
    pub(crate) fn render(&self, out: &mut String) {
        match self {
            ArgType::String => out.push_str("String"),
            ArgType::Long => out.push_str("Long"),
            ArgType::Bool => out.push_str("Bool"),
            ArgType::Set(items) => {
                out.push_str("Set<");
                items.render(out);
                out.push('>');
            }
            ArgType::Record(attributes) => {
                out.push('{');
                for (i, (name, ty)) in attributes.iter().enumerate() {
                    let _ = write!(out, "{}\"{name}\"?: ", if i == 0 { " " } else { ", " });
                    ty.render(out);
                }
                out.push_str(if attributes.is_empty() { "}" } else { " }" });
            }
        }
    }

    /// `value` as a Cedar value of this type: attributes the type does not declare are
    /// left out; a value of another type than declared, or an integer beyond Cedar's
    /// 64-bit range, is an error naming where (a JSON pointer).
    pub(crate) fn express(
        &self,
        value: &Value,
        at: &mut String,
    ) -> Result<RestrictedExpression, String> {
        if at.matches('/').count() > MAX_DEPTH {
            return Err(format!("at {at}: nested deeper than {MAX_DEPTH} levels"));
        }
        let mismatch = |expected: &str, at: &str| {
            let at = if at.is_empty() { "/" } else { at };
            format!("at {at}: expected {expected}")
        };
        match (self, value) {
            (ArgType::String, Value::String(text)) => {
                Ok(RestrictedExpression::new_string(text.clone()))
            }
            (ArgType::Bool, Value::Bool(flag)) => Ok(RestrictedExpression::new_bool(*flag)),
            (ArgType::Long, Value::Number(number)) => match number.as_i64() {
                Some(long) => Ok(RestrictedExpression::new_long(long)),
                None if number.is_u64() => Err(format!(
                    "at {}: {number} is beyond Cedar's 64-bit integer range",
                    if at.is_empty() { "/" } else { at.as_str() }
                )),
                None => Err(mismatch("an integer", at)),
            },
            (ArgType::Set(items), Value::Array(values)) => {
                let mut expressed = Vec::with_capacity(values.len());
                for (index, value) in values.iter().enumerate() {
                    let len = at.len();
                    let _ = write!(at, "/{index}");
                    expressed.push(items.express(value, at)?);
                    at.truncate(len);
                }
                Ok(RestrictedExpression::new_set(expressed))
            }
            (ArgType::Record(attributes), Value::Object(fields)) => {
                let mut expressed = Vec::with_capacity(attributes.len().min(fields.len()));
                for (name, ty) in attributes {
                    if let Some(value) = fields.get(name) {
                        let len = at.len();
                        at.push('/');
                        at.push_str(name);
                        expressed.push((name.clone(), ty.express(value, at)?));
                        at.truncate(len);
                    }
                }
                RestrictedExpression::new_record(expressed).map_err(|e| format!("at {at}: {e}"))
            }
            (ArgType::String, _) => Err(mismatch("a string", at)),
            (ArgType::Long, _) => Err(mismatch("an integer", at)),
            (ArgType::Bool, _) => Err(mismatch("a boolean", at)),
            (ArgType::Set(_), _) => Err(mismatch("an array", at)),
            (ArgType::Record(_), _) => Err(mismatch("an object", at)),
        }
    }
}

/// The typed `properties` of an object schema; names Cedar's schema syntax cannot quote
/// plainly (quotes, backslashes, control characters) are left out.
fn properties(schema: &Value, depth: usize) -> BTreeMap<String, ArgType> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return BTreeMap::new();
    };
    properties
        .iter()
        .filter(|(name, _)| plain(name))
        .filter_map(|(name, schema)| Some((name.clone(), ArgType::of_schema(schema, depth)?)))
        .collect()
}

fn plain(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c == '"' || c == '\\' || c.is_control())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rendered(ty: &ArgType) -> String {
        let mut out = String::new();
        ty.render(&mut out);
        out
    }

    #[test]
    fn schemas_map_to_cedar_types_and_disagreements_are_left_out() {
        let transfer = json!({"type": "object", "properties": {
            "amount": {"type": "integer"}, "to": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "memo": {"type": "object", "properties": {"urgent": {"type": "boolean"}}},
            "rate": {"type": "number"}, "odd\"name": {"type": "string"}
        }});
        let lookup = json!({"type": "object", "properties": {
            "to": {"type": "string"}, "amount": {"type": "string"},
            "memo": {"type": "object", "properties": {"lang": {"type": "string"}}}
        }});
        let (ty, conflicts) = ArgType::union([&transfer, &lookup]);
        assert_eq!(
            rendered(&ty),
            r#"{ "memo"?: { "lang"?: String, "urgent"?: Bool }, "tags"?: Set<String>, "to"?: String }"#
        );
        assert_eq!(
            conflicts,
            vec![Conflict {
                name: "amount".into()
            }]
        );
    }

    #[test]
    fn values_outside_cedar_are_refused_with_where() {
        let ty = ArgType::union([&json!({"type": "object", "properties": {
            "amount": {"type": "integer"},
            "items": {"type": "array", "items": {"type": "integer"}}
        }})])
        .0;
        let mut at = String::new();
        let error = ty
            .express(&json!({"amount": u64::MAX}), &mut at)
            .unwrap_err();
        assert_eq!(
            error,
            format!(
                "at /amount: {} is beyond Cedar's 64-bit integer range",
                u64::MAX
            )
        );
        let error = ty
            .express(&json!({"items": [1, "x"]}), &mut String::new())
            .unwrap_err();
        assert_eq!(error, "at /items/1: expected an integer");
        assert!(
            ty.express(&json!({"amount": 5, "other": 1.5}), &mut String::new())
                .is_ok()
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let mut schema = json!({"type": "string"});
        let mut value = json!("leaf");
        for _ in 0..=MAX_DEPTH {
            schema = json!({"type": "object", "properties": {"a": schema}});
            value = json!({"a": value});
        }
        // Too deep to type: the innermost attributes are not declared.
        let ty = ArgType::of_schema(&schema, 0).unwrap();
        assert!(!rendered(&ty).contains("String"));
        let deep = ArgType::Record(BTreeMap::from([("a".to_owned(), ty)]));
        let mut nested = deep.clone();
        for _ in 0..=MAX_DEPTH {
            nested = ArgType::Record(BTreeMap::from([("a".to_owned(), nested)]));
        }
        let error = nested
            .express(&json!({"a": value}), &mut String::new())
            .unwrap_err();
        assert!(error.contains("nested deeper than"), "{error}");
    }
}
