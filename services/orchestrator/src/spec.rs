//! What an invocation was started with, as stored with it (JSON, opaque to the store).
//! A resume reads it back, so an invocation keeps its limits and tools across restarts
//! even when the configuration changes.

use std::sync::Arc;

use agentloop_engine::{Limits, SideEffect, ToolCatalog, ToolSpec};
use serde::{Deserialize, Serialize};

use crate::intern::Interner;

/// The stored description of one invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InvocationSpec {
    pub(crate) goal: String,
    pub(crate) profile: String,
    pub(crate) actor: String,
    pub(crate) tenant: String,
    pub(crate) limits: Limits,
    /// The tools it may call, as they were when it started; shared with the invocations
    /// of the same tools (see [`InvocationSpec::share_tools`]).
    pub(crate) tools: Arc<Vec<ToolEntry>>,
    /// The scripted model, for offline runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) script: Option<String>,
}

/// One tool of an invocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct ToolEntry {
    pub(crate) name: String,
    pub(crate) side_effect: SideEffect,
    pub(crate) commutative: bool,
    pub(crate) timeout_ms: u64,
}

impl InvocationSpec {
    /// Swaps its tools for the copy `entries` holds of the same tools, if any.
    pub(crate) fn share_tools(mut self, entries: &Interner<Vec<ToolEntry>>) -> InvocationSpec {
        self.tools = entries.intern(Arc::unwrap_or_clone(self.tools));
        self
    }

    /// The engine's catalog of these tools, shared with every invocation of the same
    /// tools that `catalogs` holds.
    pub(crate) fn catalog(&self, catalogs: &Interner<ToolCatalog>) -> Arc<ToolCatalog> {
        catalogs.intern(
            self.tools
                .iter()
                .map(|tool| {
                    let spec = ToolSpec {
                        side_effect: tool.side_effect,
                        commutative: tool.commutative,
                    };
                    (tool.name.clone(), spec)
                })
                .collect(),
        )
    }

    pub(crate) fn tool(&self, name: &str) -> Option<&ToolEntry> {
        self.tools.iter().find(|tool| tool.name == name)
    }
}
