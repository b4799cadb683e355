//! What the runtime knows of the tools: their names, how they touch the world and how
//! long one call may take.
//!
//! Descriptions and input schemas belong to the tools and policy services; the engine
//! needs only enough to refuse unknown tools and to order calls safely. The shell that
//! runs the calls reads the same catalog for each call's deadline, so an invocation's
//! tools have one shape.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a tool call touches the world outside the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffect {
    /// Reads only: safe to run in parallel and to retry.
    ReadOnly,
    /// Writes, but applying it twice with the same effect key changes nothing more.
    IdempotentWrite,
    /// Writes; a repeat would be a second business change.
    Write,
}

impl SideEffect {
    /// Whether the call changes anything outside the runtime.
    pub const fn writes(self) -> bool {
        match self {
            SideEffect::ReadOnly => false,
            SideEffect::IdempotentWrite | SideEffect::Write => true,
        }
    }
}

/// The engine's view of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolSpec {
    /// How the tool touches the world.
    pub side_effect: SideEffect,
    /// Whether two writes of this tool may run in either order (and so in parallel).
    #[serde(default)]
    pub commutative: bool,
    /// How long one call may take, in milliseconds; `None`: the shell's default. The
    /// engine does not read it: the shell sets each call's deadline from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The version of the tool's contract the invocation plans its calls under (the
    /// gateway's descriptor digest); each turn that calls the tool records it, and the
    /// gateway refuses a call planned under another one. `None`: not versioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<ToolDigest>,
}

/// A tool contract's version: 128 bits, written as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ToolDigest(pub [u8; 16]);

impl std::fmt::Display for ToolDigest {
    /// Lowercase hex, in one write, as [`crate::Fingerprint`]'s: every committed turn
    /// names its tools' digests, and 16 `{:02x}` fragments were most of a turn's wire
    /// conversion.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = [0u8; 32];
        hex::encode_to_slice(self.0, &mut text).map_err(|_| std::fmt::Error)?;
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

impl std::fmt::Debug for ToolDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToolDigest({self})")
    }
}

impl std::str::FromStr for ToolDigest {
    type Err = String;

    fn from_str(text: &str) -> Result<ToolDigest, String> {
        let mut bytes = [0u8; 16];
        if text.len() != 32 || !text.is_ascii() {
            return Err(format!("a tool digest is 32 hex digits, not {text:?}"));
        }
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
            *byte = u8::from_str_radix(pair, 16)
                .map_err(|_| format!("a tool digest is 32 hex digits, not {text:?}"))?;
        }
        Ok(ToolDigest(bytes))
    }
}

impl TryFrom<String> for ToolDigest {
    type Error = String;

    fn try_from(text: String) -> Result<ToolDigest, String> {
        text.parse()
    }
}

impl From<ToolDigest> for String {
    fn from(digest: ToolDigest) -> String {
        digest.to_string()
    }
}

/// The contract versions a turn's calls ran under, by tool name: one entry per tool,
/// sorted by name, and written as a JSON object, as a map would be.
///
/// A sorted `Vec` rather than a `BTreeMap`: a turn names one tool or a few, and the map's
/// first node has room for eleven (about 450 B). Every committed turn the model's window
/// keeps holds one, which made these nodes the largest block of `agentloop bench`'s peak
/// heap at N = 1,000.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolDigests(Vec<(String, ToolDigest)>);

/// The most entries [`ToolDigests`] makes room for before it sees them.
const PRESIZED: usize = 64;

impl ToolDigests {
    /// Whether no tool is named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, ToolDigest)> {
        self.0.iter().map(|(tool, digest)| (tool.as_str(), *digest))
    }

    /// Sorts by name and keeps one entry per name, the last given (as a map's insert
    /// would).
    fn from_vec(mut entries: Vec<(String, ToolDigest)>) -> ToolDigests {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = later.1;
            }
            same
        });
        ToolDigests(entries)
    }
}

impl FromIterator<(String, ToolDigest)> for ToolDigests {
    fn from_iter<I: IntoIterator<Item = (String, ToolDigest)>>(entries: I) -> ToolDigests {
        let entries = entries.into_iter();
        // Sized by the upper bound (a turn's calls, of which only the versioned ones are
        // kept), so the buffer is not grown and left with room the usual way; bounded,
        // since an iterator's hint is only a claim.
        let (lower, upper) = entries.size_hint();
        let mut vec = Vec::with_capacity(upper.unwrap_or(lower).min(PRESIZED));
        vec.extend(entries);
        ToolDigests::from_vec(vec)
    }
}

impl Serialize for ToolDigests {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(tool, digest)| (tool, digest)))
    }
}

impl<'de> Deserialize<'de> for ToolDigests {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;

        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = ToolDigests;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of tool names to tool digests")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ToolDigests, A::Error> {
                // The hint is the input's claim: bounded, so a hostile one allocates
                // little.
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(PRESIZED));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(ToolDigests::from_vec(entries))
            }
        }

        deserializer.deserialize_map(Entries)
    }
}

impl ToolSpec {
    /// A read-only tool.
    pub const fn read_only() -> ToolSpec {
        ToolSpec::new(SideEffect::ReadOnly)
    }

    /// A tool with the given side effect, not commutative.
    pub const fn new(side_effect: SideEffect) -> ToolSpec {
        ToolSpec {
            side_effect,
            commutative: false,
            timeout_ms: None,
            digest: None,
        }
    }
}

/// The tools an invocation may call, by name. `Hash`, so invocations with the same tools
/// can share one catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolCatalog {
    tools: BTreeMap<String, ToolSpec>,
}

impl ToolCatalog {
    /// An empty catalog: every tool call is refused.
    pub fn new() -> ToolCatalog {
        ToolCatalog::default()
    }

    /// Adds or replaces a tool.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, spec: ToolSpec) -> ToolCatalog {
        self.tools.insert(name.into(), spec);
        self
    }

    /// The spec of `name`, if the tool is known.
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is known.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tools, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ToolSpec)> {
        self.tools.iter().map(|(name, spec)| (name.as_str(), spec))
    }
}

impl<N: Into<String>> FromIterator<(N, ToolSpec)> for ToolCatalog {
    fn from_iter<I: IntoIterator<Item = (N, ToolSpec)>>(iter: I) -> Self {
        ToolCatalog {
            tools: iter
                .into_iter()
                .map(|(name, spec)| (name.into(), spec))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The stored JSON of a turn's digests is what the map it replaced wrote, whatever
    /// order the calls named the tools in and however often.
    #[test]
    fn tool_digests_are_written_and_read_as_the_map_was() {
        let (a, b, c) = (
            ToolDigest([1; 16]),
            ToolDigest([2; 16]),
            ToolDigest([3; 16]),
        );
        let given = [
            ("transfer".to_owned(), a),
            ("lookup".to_owned(), b),
            ("transfer".to_owned(), c),
        ];
        let digests: ToolDigests = given.iter().cloned().collect();
        let map: BTreeMap<String, ToolDigest> = given.iter().cloned().collect();
        let json = serde_json::to_string(&digests).unwrap();
        assert_eq!(json, serde_json::to_string(&map).unwrap());
        assert_eq!(
            digests.iter().collect::<Vec<_>>(),
            [("lookup", b), ("transfer", c)]
        );

        // Read back from text in any order, the last of a repeated name winning.
        let unsorted = format!(r#"{{"transfer":"{a}","lookup":"{b}","transfer":"{c}"}}"#);
        let read: ToolDigests = serde_json::from_str(&unsorted).unwrap();
        assert_eq!(read, digests);
        assert_eq!(serde_json::from_str::<ToolDigests>(&json).unwrap(), digests);
        assert!(serde_json::from_str::<ToolDigests>(r#"{"lookup":"abc"}"#).is_err());
        assert!(serde_json::from_str::<ToolDigests>(r#"["lookup"]"#).is_err());
        assert!(ToolDigests::default().is_empty());
    }
}
