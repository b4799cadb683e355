//! What an invocation was started with, as stored with it (JSON, opaque to the store).
//! A resume reads it back, so an invocation keeps its limits and tools across restarts
//! even when the configuration changes.

use std::sync::Arc;

use agentloop_engine::{Limits, ToolCatalog};
use agentloop_store::{InvocationRecord, StoreError};
use serde::{Deserialize, Serialize};

use crate::intern::Interner;

/// The stored description of one invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvocationSpec {
    /// The task, as the caller gave it.
    pub goal: String,
    /// The profile it runs under.
    pub profile: String,
    /// Who it acts for.
    pub actor: String,
    /// The actor's tenant.
    pub tenant: String,
    /// The actor's roles as the invocation started (its token's), which policies test.
    /// Behind one pointer, as the runner keeps them ([`RunnerSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[expect(
        clippy::box_collection,
        reason = "moved as it is into every running invocation's `RunnerSpec`"
    )]
    pub(crate) roles: Option<Box<Vec<String>>>,
    /// Its budgets.
    pub limits: Limits,
    /// The tools it may call, as they were when it started, each with its timeout: the
    /// engine's catalog, which the runner reads too, shared with the engine and with the
    /// invocations of the same tools (see [`InvocationSpec::share_tools`]).
    #[serde(with = "stored_tools")]
    pub tools: Arc<ToolCatalog>,
    /// The scripted model, for offline runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) script: Option<String>,
    /// The W3C `traceparent` of its first run's `invoke_agent` span (only while traces
    /// are on): a resumed run continues that trace. The runner does not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trace: Option<String>,
}

impl InvocationSpec {
    /// The spec `record` was stored with.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when it does not read.
    pub fn of(record: &InvocationRecord) -> Result<InvocationSpec, StoreError> {
        serde_json::from_str(&record.spec).map_err(|e| {
            StoreError::Corrupt(format!("invocation {}: spec: {e}", record.invocation_id))
        })
    }

    /// The actor's roles as the invocation started.
    pub fn roles(&self) -> &[String] {
        roles(self.roles.as_deref())
    }

    /// Swaps its tools for the copy `catalogs` holds of the same tools, if any.
    pub(crate) fn share_tools(mut self, catalogs: &Interner<ToolCatalog>) -> InvocationSpec {
        self.tools = catalogs.intern(Arc::unwrap_or_clone(self.tools));
        self
    }
}

/// What a runner keeps of its invocation's spec: for whom it acts and what it may call.
/// The rest is elsewhere or spent: the goal and the script move to the model's context,
/// the engine holds the limits, and the trace is read as the runner starts. Every parked
/// invocation holds one of these, so it keeps none of that twice (`bench --park`).
#[derive(Debug)]
pub(crate) struct RunnerSpec {
    pub(crate) profile: String,
    pub(crate) actor: String,
    pub(crate) tenant: String,
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer in every running invocation, and most have no roles"
    )]
    roles: Option<Box<Vec<String>>>,
    pub(crate) tools: Arc<ToolCatalog>,
}

impl RunnerSpec {
    /// The actor's roles as the invocation started.
    pub(crate) fn roles(&self) -> &[String] {
        roles(self.roles.as_deref())
    }
}

/// Roles kept behind an optional thin pointer, as a slice.
fn roles(roles: Option<&Vec<String>>) -> &[String] {
    roles.map_or(&[], Vec::as_slice)
}

impl From<InvocationSpec> for RunnerSpec {
    fn from(spec: InvocationSpec) -> RunnerSpec {
        RunnerSpec {
            profile: spec.profile,
            actor: spec.actor,
            tenant: spec.tenant,
            roles: spec.roles,
            tools: spec.tools,
        }
    }
}

/// The tools as stored with an invocation: a list of `{name, side_effect, commutative,
/// timeout_ms, digest}`, the format of every invocation already in a store (`digest`
/// is absent from those stored before tools were versioned).
mod stored_tools {
    use std::sync::Arc;

    use agentloop_engine::{SideEffect, ToolCatalog, ToolDigest, ToolSpec};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        name: String,
        side_effect: SideEffect,
        commutative: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digest: Option<ToolDigest>,
    }

    pub(super) fn serialize<S: Serializer>(
        tools: &Arc<ToolCatalog>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(tools.iter().map(|(name, spec)| Entry {
            name: name.to_owned(),
            side_effect: spec.side_effect,
            commutative: spec.commutative,
            timeout_ms: spec.timeout_ms,
            digest: spec.digest,
        }))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<ToolCatalog>, D::Error> {
        let entries = Vec::<Entry>::deserialize(deserializer)?;
        Ok(Arc::new(
            entries
                .into_iter()
                .map(|entry| {
                    let spec = ToolSpec {
                        side_effect: entry.side_effect,
                        commutative: entry.commutative,
                        timeout_ms: entry.timeout_ms,
                        digest: entry.digest,
                    };
                    (entry.name, spec)
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use agentloop_engine::{SideEffect, ToolSpec};

    use super::*;

    #[test]
    fn tools_are_stored_in_the_format_of_earlier_invocations() {
        // As an earlier build wrote it: a list of entries in the gateway's order.
        let stored = r#"{"goal":"g","profile":"default","actor":"","tenant":"","limits":LIMITS,
            "tools":[{"name":"transfer","side_effect":"write","commutative":false,"timeout_ms":400},
                     {"name":"lookup","side_effect":"read_only","commutative":false,"timeout_ms":30000}]}"#
            .replace("LIMITS", &serde_json::to_string(&Limits::default()).unwrap());
        let spec: InvocationSpec = serde_json::from_str(&stored).unwrap();
        let transfer = spec.tools.get("transfer").unwrap();
        assert_eq!(transfer.side_effect, SideEffect::Write);
        assert_eq!(transfer.timeout_ms, Some(400));
        assert_eq!(
            spec.tools.get("lookup").copied(),
            Some(ToolSpec {
                timeout_ms: Some(30_000),
                ..ToolSpec::read_only()
            })
        );
        // Written back, it reads the same.
        let again: InvocationSpec =
            serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again, spec);
        let json: serde_json::Value = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["tools"][0]["name"], "lookup");
        assert_eq!(json["tools"][1]["timeout_ms"], 400);
        assert!(json.get("roles").is_none(), "no roles, nothing stored");

        // Roles are stored, so a resumed invocation is judged with them.
        let with_roles = InvocationSpec {
            roles: Some(Box::new(vec!["clerk".to_owned()])),
            ..spec
        };
        let again: InvocationSpec =
            serde_json::from_str(&serde_json::to_string(&with_roles).unwrap()).unwrap();
        assert_eq!(
            again.roles.as_deref().map(Vec::as_slice),
            Some(&["clerk".to_owned()][..])
        );
    }
}
