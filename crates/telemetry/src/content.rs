//! Whether content (goals, tool arguments and outputs, answers) goes on spans, and in
//! what form: off unless the operator opts in; then JSON values under secret-looking
//! keys are replaced and every value is cut to a bound.

use serde_json::Value;

/// [`ContentPolicy`]'s bound when the configuration names none.
pub const DEFAULT_CONTENT_BYTES: usize = 4096;

/// Keys redacted whether or not the configuration names them (compared without case,
/// as substrings: `db_password`, `X-Api-Key` and `refresh_token` all match).
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "api-key",
    "authorization",
    "credential",
    "private_key",
    "cookie",
];

/// The replacement of a redacted value.
pub const REDACTED: &str = "REDACTED";

/// How content is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContentPolicy {
    record: bool,
    /// Lower-cased keys that are redacted, the built-in ones first.
    redact: Vec<String>,
    max_bytes: usize,
}

impl ContentPolicy {
    /// Records when `record`, redacting `redact_keys` besides the built-in secret keys,
    /// each value cut to `max_bytes`.
    pub fn new(record: bool, redact_keys: &[String], max_bytes: usize) -> ContentPolicy {
        let redact = SECRET_KEYS
            .iter()
            .map(|k| (*k).to_owned())
            .chain(redact_keys.iter().map(|k| k.to_ascii_lowercase()))
            .collect();
        ContentPolicy {
            record,
            redact,
            max_bytes,
        }
    }

    /// Whether content is recorded at all.
    pub fn records(&self) -> bool {
        self.record
    }

    /// `text` as it may be recorded: `None` when content is not; otherwise, if it is
    /// JSON, with redacted keys replaced, and cut to the bound (at a character
    /// boundary, with `…` marking the cut).
    pub fn text(&self, text: &str) -> Option<String> {
        if !self.record {
            return None;
        }
        let redacted = match serde_json::from_str::<Value>(text) {
            Ok(mut value @ (Value::Object(_) | Value::Array(_))) => {
                self.redact_value(&mut value, 0);
                value.to_string()
            }
            _ => text.to_owned(),
        };
        Some(self.bounded(redacted))
    }

    /// `value` as it may be recorded, as [`ContentPolicy::text`] for its JSON.
    pub fn json(&self, value: &Value) -> Option<String> {
        if !self.record {
            return None;
        }
        let mut value = value.clone();
        self.redact_value(&mut value, 0);
        Some(self.bounded(value.to_string()))
    }

    fn redacts(&self, key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        self.redact
            .iter()
            .any(|secret| key.contains(secret.as_str()))
    }

    /// Replaces the values of redacted keys, to a depth bound (deeper values are
    /// replaced whole: a bound on the work, and nothing unchecked gets through).
    fn redact_value(&self, value: &mut Value, depth: usize) {
        const MAX_DEPTH: usize = 32;
        if depth >= MAX_DEPTH {
            *value = Value::String(REDACTED.into());
            return;
        }
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if self.redacts(key) {
                        *inner = Value::String(REDACTED.into());
                    } else {
                        self.redact_value(inner, depth + 1);
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.redact_value(item, depth + 1);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }

    fn bounded(&self, mut text: String) -> String {
        if text.len() > self.max_bytes {
            let mut end = self.max_bytes;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push('…');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_recorded_unless_asked() {
        let off = ContentPolicy::new(false, &[], 100);
        assert_eq!(off.text("hello"), None);
        assert_eq!(off.json(&serde_json::json!({"a": 1})), None);
    }

    #[test]
    fn secret_and_configured_keys_are_redacted_at_any_depth() {
        let policy = ContentPolicy::new(true, &["IBAN".to_owned()], 4096);
        let recorded = policy
            .text(r#"{"to":"bob","iban":"DE00","auth":{"Api-Key":"k","x":[{"db_password":"p"}]}}"#)
            .unwrap();
        let value: Value = serde_json::from_str(&recorded).unwrap();
        assert_eq!(value["to"], "bob");
        assert_eq!(value["iban"], REDACTED);
        assert_eq!(value["auth"]["Api-Key"], REDACTED);
        assert_eq!(value["auth"]["x"][0]["db_password"], REDACTED);
        assert!(!recorded.contains("DE00") && !recorded.contains("\"p\""));
    }

    #[test]
    fn values_are_cut_at_a_character_boundary() {
        let policy = ContentPolicy::new(true, &[], 5);
        assert_eq!(policy.text("ééé").unwrap(), "éé…");
        assert_eq!(policy.text("abc").unwrap(), "abc");
    }
}
