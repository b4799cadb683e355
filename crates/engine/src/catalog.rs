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
