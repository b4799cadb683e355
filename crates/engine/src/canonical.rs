//! Canonical JSON and plan fingerprints.
//!
//! Two argument texts that mean the same JSON (key order, white space) must compare equal,
//! or `no_progress` could be dodged by reordering keys. The canonical form is computed
//! here, by hand, rather than relying on `serde_json::Value`'s map order, which a feature
//! flag anywhere in the dependency graph (`preserve_order`) would silently change.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Writes `value` as canonical JSON: object keys sorted by their UTF-8 bytes, no white space.
///
/// Numbers keep serde_json's rendering; integers outside 64 bits are compared by their
/// floating-point value (serde_json is built without `arbitrary_precision`).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            out.push_str(&value.to_string());
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

/// A SHA-256 digest of a set of tool calls (tool name + canonical arguments), independent
/// of call IDs and of the order of the calls within the batch.
///
/// It identifies "the same plan" for `no_progress`, and the exact proposal an approval is
/// bound to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(#[serde(with = "hex32")] pub [u8; 32]);

impl Fingerprint {
    /// The digest of `calls`, given as `(tool name, canonical arguments)` pairs.
    pub fn of_calls<'a>(calls: impl IntoIterator<Item = (&'a str, &'a str)>) -> Fingerprint {
        let mut sorted: Vec<(&str, &str)> = calls.into_iter().collect();
        sorted.sort_unstable();
        let mut hasher = Sha256::new();
        for (tool, arguments) in sorted {
            // Length prefixes keep ("ab","c") and ("a","bc") apart.
            hasher.update((tool.len() as u64).to_be_bytes());
            hasher.update(tool.as_bytes());
            hasher.update((arguments.len() as u64).to_be_bytes());
            hasher.update(arguments.as_bytes());
        }
        Fingerprint(hasher.finalize().into())
    }
}

impl fmt::Display for Fingerprint {
    /// Lowercase hex, in one write. Every committed turn's record carries its plan's
    /// fingerprint, and writing it as 32 `{:02x}` fragments, each through the formatting
    /// machinery and serde_json's escaping, took a tenth of an embedded turn's
    /// instructions (callgrind: 199 against 180 million for the bench's 1,000 turns).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 64];
        hex::encode_to_slice(self.0, &mut text).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

/// Text that is not a fingerprint (64 hex digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a fingerprint is 64 hex digits")]
pub struct BadFingerprint;

impl std::str::FromStr for Fingerprint {
    type Err = BadFingerprint;

    fn from_str(text: &str) -> Result<Fingerprint, BadFingerprint> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).map_err(|_| BadFingerprint)?;
        Ok(Fingerprint(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::Fingerprint(*bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        let fingerprint: super::Fingerprint = text.parse().map_err(D::Error::custom)?;
        Ok(fingerprint.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        canonical_json(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn key_order_and_white_space_do_not_matter() {
        assert_eq!(
            canon(r#"{"b": 1, "a": {"y": [1, 2], "x": null}}"#),
            r#"{"a":{"x":null,"y":[1,2]},"b":1}"#
        );
        assert_eq!(canon(r#"{"a":1,"b":2}"#), canon(r#"{ "b":2, "a":1 }"#));
        assert_ne!(canon("[1,2]"), canon("[2,1]"), "array order is meaning");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(
            canon(r#"{"k\"ey":"line\nbreak"}"#),
            r#"{"k\"ey":"line\nbreak"}"#
        );
    }

    #[test]
    fn fingerprint_ignores_call_order_but_not_content() {
        let a = Fingerprint::of_calls([("lookup", r#"{"key":"a"}"#), ("lookup", r#"{"key":"b"}"#)]);
        let b = Fingerprint::of_calls([("lookup", r#"{"key":"b"}"#), ("lookup", r#"{"key":"a"}"#)]);
        let c = Fingerprint::of_calls([("lookup", r#"{"key":"a"}"#)]);
        let d = Fingerprint::of_calls([("lookupx", r#"{"key":"a"}"#)]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(c, d);
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text.len(), 66);
        assert_eq!(serde_json::from_str::<Fingerprint>(&text).unwrap(), a);
        assert!(serde_json::from_str::<Fingerprint>("\"zz\"").is_err());
    }

    #[test]
    fn fingerprints_are_written_as_lowercase_hex() {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&[0x00, 0x0f, 0xa5, 0xff]);
        bytes[31] = 0x10;
        let expected = format!("000fa5ff{}10", "00".repeat(27));
        assert_eq!(Fingerprint(bytes).to_string(), expected);
        // SHA-256 of nothing, the digest of an empty set of calls.
        assert_eq!(
            Fingerprint::of_calls([]).to_string(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
