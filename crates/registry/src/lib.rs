//! The tool registry as configuration: a TOML file of `[[tools]]` and `[[verifiers]]`
//! written by hand, `[[executors]]` that describe themselves (their `Describe` output,
//! read by the gateway), `[[mcp_servers]]` and `[[a2a_agents]]`. A crate of its own
//! because the tool gateway, the policy service and the CLI load the same file, and no
//! service depends on another. It is only the format: the live registry, which follows
//! executors as they come and go, is the gateway's.
//!
//! Verifiers are registered beside tools because they are served by the same executors
//! (over the same channel, under the same concurrency slots) and owned by the same
//! people; their names are a namespace of their own, so a verifier may share its name
//! with a tool.

#![warn(missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentloop_a2a::RemoteAgentConfig;
use agentloop_engine::{SideEffect, canonical_json};
use agentloop_mcp::McpServerConfig;
use agentloop_proto::v1::{self, DescribeResponse, ToolDescriptor, VerifierDescriptor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most tools one registry holds.
pub const MAX_TOOLS: usize = 1024;
/// Longest tool name, in bytes (names match `[a-zA-Z0-9_.-]{1,64}`).
pub const MAX_TOOL_NAME_BYTES: usize = 64;
/// Longest tool description, in bytes (it goes into every prompt).
pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// Largest input schema, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Longest endpoint URL, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 2048;
/// Largest registry file, in bytes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Longest per-call timeout a tool may declare, in milliseconds (ten minutes).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Most verifiers one registry holds.
pub const MAX_VERIFIERS: usize = 256;
/// How long a verifier that declares no `timeout_ms` may take, in milliseconds. A
/// verifier reads its own records, so seconds are plenty; a final answer waits for it.
pub const DEFAULT_VERIFIER_TIMEOUT_MS: u64 = 10_000;
/// Most executors one registry names or registers.
pub const MAX_EXECUTORS: usize = 256;

/// Why a tool registry could not be loaded. Every variant names the tool or file, so
/// an operator can fix it without reading code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read tool registry {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_FILE_BYTES`].
    #[error("tool registry {} is larger than {MAX_CONFIG_FILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The text is not valid TOML or has the wrong shape (unknown key, wrong type).
    #[error("invalid tool registry: {0}")]
    Parse(#[from] toml::de::Error),
    /// More than [`MAX_TOOLS`] tools.
    #[error("too many tools: {count} (at most {MAX_TOOLS})")]
    TooManyTools {
        /// How many there were.
        count: usize,
    },
    /// Two tools share a name.
    #[error("tool {0:?} is registered twice")]
    DuplicateName(String),
    /// A name is empty, too long or has characters outside `[a-zA-Z0-9_.-]`.
    #[error("invalid tool name {0:?}: expected 1 to 64 characters of [a-zA-Z0-9_.-]")]
    InvalidName(String),
    /// Some other field of a tool is invalid.
    #[error("tool {tool:?}: {reason}")]
    InvalidTool {
        /// The tool's name.
        tool: String,
        /// What is wrong.
        reason: String,
    },
    /// More than [`MAX_VERIFIERS`] verifiers.
    #[error("too many verifiers: {count} (at most {MAX_VERIFIERS})")]
    TooManyVerifiers {
        /// How many there were.
        count: usize,
    },
    /// Two verifiers share a name.
    #[error("verifier {0:?} is registered twice")]
    DuplicateVerifier(String),
    /// A verifier's name is empty, too long or has characters outside `[a-zA-Z0-9_.-]`.
    #[error("invalid verifier name {0:?}: expected 1 to 64 characters of [a-zA-Z0-9_.-]")]
    InvalidVerifierName(String),
    /// Some other field of a verifier is invalid.
    #[error("verifier {verifier:?}: {reason}")]
    InvalidVerifier {
        /// The verifier's name.
        verifier: String,
        /// What is wrong.
        reason: String,
    },
    /// More than [`MAX_EXECUTORS`] executors.
    #[error("too many executors: {count} (at most {MAX_EXECUTORS})")]
    TooManyExecutors {
        /// How many there were.
        count: usize,
    },
    /// An `[[mcp_servers]]` entry is invalid or its name is given twice.
    #[error("{0}")]
    InvalidMcpServer(String),
    /// An `[[a2a_agents]]` entry is invalid or its name is given twice.
    #[error("{0}")]
    InvalidA2aAgent(String),
    /// An `[[executors]]` entry is invalid or given twice.
    #[error("executor {endpoint:?}: {reason}")]
    InvalidExecutor {
        /// Its endpoint.
        endpoint: String,
        /// What is wrong.
        reason: String,
    },
}

/// One registered tool, as written in the registry file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolEntry {
    /// Unique name, as the model calls it.
    pub name: String,
    /// `http://host:port` or `https://...` of the executor that serves it.
    pub endpoint: String,
    /// What the tool does, written for the model.
    pub description: String,
    /// How it touches the world (`read_only`, `idempotent_write`, `write`).
    pub side_effect: SideEffect,
    /// Whether its writes may run in any order relative to each other.
    #[serde(default)]
    pub commutative: bool,
    /// Whether its calls need a human approval before they run (policy's gate).
    #[serde(default)]
    pub requires_approval: bool,
    /// Longest one call may take, in milliseconds (1..=600000).
    pub timeout_ms: u64,
    /// JSON Schema of the arguments, as JSON text.
    pub input_schema: String,
}

impl ToolEntry {
    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The descriptor the gateway lists and policy validates against, with its digest.
    pub fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema_json: self.input_schema.clone(),
            side_effect: side_effect_to_proto(self.side_effect) as i32,
            commutative: self.commutative,
            requires_approval: self.requires_approval,
            timeout: Some(duration_to_proto(self.timeout())),
            digest: self.digest(),
            unavailable: false,
        }
    }

    /// The version of the tool's contract (`ToolDescriptor.digest`): what a call is
    /// planned, authorized and approved under. The description is left out: rewording
    /// it changes nothing a call relies on. The schema is hashed in canonical form, so
    /// reformatting it does not change the digest either.
    pub fn digest(&self) -> String {
        let schema = serde_json::from_str(&self.input_schema).map_or_else(
            |_| self.input_schema.clone(),
            |value| canonical_json(&value),
        );
        let mut hasher = Sha256::new();
        let side_effect = side_effect_to_proto(self.side_effect) as i32;
        for part in [
            self.name.as_bytes(),
            schema.as_bytes(),
            &side_effect.to_be_bytes(),
            &[u8::from(self.commutative), u8::from(self.requires_approval)],
            &self.timeout_ms.to_be_bytes(),
        ] {
            // Length prefixes keep the parts apart.
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        // 128 bits: a version tag, not a security boundary.
        hex::encode(&hasher.finalize()[..16])
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !valid_name(&self.name) {
            return Err(ConfigError::InvalidName(self.name.clone()));
        }
        let invalid = |reason: String| ConfigError::InvalidTool {
            tool: self.name.clone(),
            reason,
        };
        validate_endpoint(&self.endpoint).map_err(invalid)?;
        if self.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(invalid(format!(
                "description longer than {MAX_DESCRIPTION_BYTES} bytes"
            )));
        }
        validate_timeout_ms(self.timeout_ms).map_err(invalid)?;
        if self.input_schema.len() > MAX_SCHEMA_BYTES {
            return Err(invalid(format!(
                "input_schema larger than {MAX_SCHEMA_BYTES} bytes"
            )));
        }
        let schema: serde_json::Value = serde_json::from_str(&self.input_schema)
            .map_err(|e| invalid(format!("input_schema is not valid JSON: {e}")))?;
        // A JSON Schema is an object or a boolean; anything else cannot be one.
        if !(schema.is_object() || schema.is_boolean()) {
            return Err(invalid(
                "input_schema must be a JSON object (or boolean) schema".to_owned(),
            ));
        }
        // Compiled as policy compiles it, so a schema policy would refuse is refused here,
        // naming the tool, instead of failing every policy reload later.
        jsonschema::validator_for(&schema)
            .map_err(|e| invalid(format!("input_schema is not a valid JSON Schema: {e}")))?;
        Ok(())
    }
}

/// An executor registered by its endpoint alone (`[[executors]]`): the gateway takes its
/// tools and verifiers from its `Describe`, and keeps them current.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorEntry {
    /// `http://host:port` or `https://...` of its `ToolExecutorService`.
    pub endpoint: String,
}

impl ExecutorEntry {
    /// An executor at `endpoint`.
    pub fn new(endpoint: &str) -> ExecutorEntry {
        ExecutorEntry {
            endpoint: endpoint.to_owned(),
        }
    }

    /// Checks the endpoint.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidExecutor`] for an endpoint that is not an http(s) URL.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_endpoint(&self.endpoint).map_err(|reason| ConfigError::InvalidExecutor {
            endpoint: self.endpoint.clone(),
            reason,
        })
    }
}

/// A duration as the wire type.
fn duration_to_proto(duration: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// A wire duration in milliseconds, for a descriptor's timeout; `what` names it in the
/// error.
fn timeout_ms_from_proto(
    timeout: Option<prost_types::Duration>,
    what: &str,
) -> Result<Option<u64>, String> {
    let Some(timeout) = timeout else {
        return Ok(None);
    };
    let timeout =
        Duration::try_from(timeout).map_err(|_| format!("the {what} timeout is negative"))?;
    Ok(Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)))
}

/// One registered verifier: an executor's check of a final answer against its own
/// records, as written in the registry file (`[[verifiers]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifierEntry {
    /// Unique name among the verifiers, as profiles name it.
    pub name: String,
    /// `http://host:port` or `https://...` of the executor that serves it; an endpoint
    /// that also serves tools is reached over the same channel.
    pub endpoint: String,
    /// What it confirms, for operators and for the checks a final answer lists.
    pub description: String,
    /// Longest one verification may take, in milliseconds (1..=600000); unset is
    /// [`DEFAULT_VERIFIER_TIMEOUT_MS`].
    #[serde(default = "default_verifier_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_verifier_timeout_ms() -> u64 {
    DEFAULT_VERIFIER_TIMEOUT_MS
}

impl VerifierEntry {
    /// A verifier served at `endpoint`, with the default timeout: what a stack that
    /// registers an executor's verifiers in code (not from a file) starts from.
    pub fn new(name: &str, endpoint: &str, description: &str) -> VerifierEntry {
        VerifierEntry {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            description: description.to_owned(),
            timeout_ms: DEFAULT_VERIFIER_TIMEOUT_MS,
        }
    }

    /// The longest one verification may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The verifier an executor describes, served at `endpoint`; no timeout is the
    /// default one.
    ///
    /// # Errors
    ///
    /// The verifier's validation errors, and [`ConfigError::InvalidVerifier`] for a
    /// negative timeout.
    pub fn from_descriptor(
        endpoint: &str,
        descriptor: VerifierDescriptor,
    ) -> Result<VerifierEntry, ConfigError> {
        let timeout_ms = timeout_ms_from_proto(descriptor.timeout, "verifier's")
            .map_err(|reason| ConfigError::InvalidVerifier {
                verifier: descriptor.name.clone(),
                reason,
            })?
            .unwrap_or(DEFAULT_VERIFIER_TIMEOUT_MS);
        let entry = VerifierEntry {
            name: descriptor.name,
            endpoint: endpoint.to_owned(),
            description: descriptor.description,
            timeout_ms,
        };
        entry.validate()?;
        Ok(entry)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !valid_name(&self.name) {
            return Err(ConfigError::InvalidVerifierName(self.name.clone()));
        }
        let invalid = |reason: String| ConfigError::InvalidVerifier {
            verifier: self.name.clone(),
            reason,
        };
        validate_endpoint(&self.endpoint).map_err(invalid)?;
        if self.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(invalid(format!(
                "description longer than {MAX_DESCRIPTION_BYTES} bytes"
            )));
        }
        validate_timeout_ms(self.timeout_ms).map_err(invalid)
    }
}

/// Tool and verifier names: `[a-zA-Z0-9_.-]{1,64}`, so they fit in logs, metrics and
/// prompts unquoted.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// 0 would fail every call at once and more than ten minutes holds a turn hostage.
fn validate_timeout_ms(timeout_ms: u64) -> Result<(), String> {
    if (1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        Ok(())
    } else {
        Err(format!(
            "timeout_ms must be 1..={MAX_TIMEOUT_MS}, got {timeout_ms}"
        ))
    }
}

/// `http(s)://authority[/...]`, without pulling in a URL crate: tonic's `Uri` parser is
/// the one that will have to accept it later anyway.
fn validate_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.len() > MAX_ENDPOINT_BYTES {
        return Err(format!("endpoint longer than {MAX_ENDPOINT_BYTES} bytes"));
    }
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("endpoint {endpoint:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(authority)) if !authority.host().is_empty() => Ok(()),
        _ => Err(format!(
            "endpoint {endpoint:?} must be an http:// or https:// URL with a host"
        )),
    }
}

/// The engine's side-effect class as the wire enum.
pub fn side_effect_to_proto(side_effect: SideEffect) -> v1::SideEffect {
    match side_effect {
        SideEffect::ReadOnly => v1::SideEffect::ReadOnly,
        SideEffect::IdempotentWrite => v1::SideEffect::IdempotentWrite,
        SideEffect::Write => v1::SideEffect::Write,
    }
}

/// The wire enum as the engine's class. Unspecified (and any value this build does
/// not know) is treated as the most dangerous kind, a write, as the contract says.
pub fn side_effect_from_proto(value: i32) -> SideEffect {
    match v1::SideEffect::try_from(value) {
        Ok(v1::SideEffect::ReadOnly) => SideEffect::ReadOnly,
        Ok(v1::SideEffect::IdempotentWrite) => SideEffect::IdempotentWrite,
        Ok(v1::SideEffect::Write | v1::SideEffect::Unspecified) | Err(_) => SideEffect::Write,
    }
}

/// The tool registry: every tool and verifier, its executor and its limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// The registered tools.
    #[serde(default)]
    pub tools: Vec<ToolEntry>,
    /// The registered verifiers (`[[verifiers]]`); profiles name them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verifiers: Vec<VerifierEntry>,
    /// Executors registered by endpoint alone (`[[executors]]`), whose tools and
    /// verifiers come from their `Describe`. Only the gateway reads them; the policy
    /// service and the orchestrator learn their tools from the gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executors: Vec<ExecutorEntry>,
    /// MCP servers (`[[mcp_servers]]`), whose tools the gateway offers as
    /// `<server>__<tool>`. Only the gateway reads them, as it does `executors`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServerConfig>,
    /// Remote A2A agents (`[[a2a_agents]]`), each offered as one tool named as its
    /// entry, a call being one task of the agent. Only the gateway reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub a2a_agents: Vec<RemoteAgentConfig>,
}

impl ToolsConfig {
    /// Loads and validates a registry file.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] / [`ConfigError::TooLarge`] for the file, otherwise as
    /// [`ToolsConfig::parse`].
    pub fn load(path: &Path) -> Result<ToolsConfig, ConfigError> {
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read)?.len();
        if size > MAX_CONFIG_FILE_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        ToolsConfig::parse(&text)
    }

    /// Parses and validates registry TOML text.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for bad TOML or shape, and the validation errors of
    /// [`ToolsConfig::validate`].
    pub fn parse(text: &str) -> Result<ToolsConfig, ConfigError> {
        let config: ToolsConfig = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Registers what an executor describes (its `Describe` output), all served at
    /// `endpoint`. An unspecified side effect becomes `write`; a missing timeout is an
    /// error (the contract requires one), and so is anything [`ToolsConfig::validate`]
    /// refuses. The digests and availability the executor may have sent are ignored:
    /// the gateway sets them.
    ///
    /// # Errors
    ///
    /// The validation errors of [`ToolsConfig::validate`], each naming the tool or
    /// verifier, and [`ConfigError::InvalidTool`] for a missing or negative timeout.
    pub fn from_describe(
        endpoint: &str,
        described: DescribeResponse,
    ) -> Result<ToolsConfig, ConfigError> {
        if described.tools.len() > MAX_TOOLS {
            return Err(ConfigError::TooManyTools {
                count: described.tools.len(),
            });
        }
        if described.verifiers.len() > MAX_VERIFIERS {
            return Err(ConfigError::TooManyVerifiers {
                count: described.verifiers.len(),
            });
        }
        let tools = described
            .tools
            .into_iter()
            .map(|d| {
                let invalid = |reason: String| ConfigError::InvalidTool {
                    tool: d.name.clone(),
                    reason,
                };
                let timeout_ms = timeout_ms_from_proto(d.timeout, "descriptor's")
                    .map_err(invalid)?
                    .ok_or_else(|| invalid("the descriptor has no timeout".to_owned()))?;
                Ok(ToolEntry {
                    endpoint: endpoint.to_owned(),
                    side_effect: side_effect_from_proto(d.side_effect),
                    commutative: d.commutative,
                    requires_approval: d.requires_approval,
                    timeout_ms,
                    input_schema: d.input_schema_json,
                    description: d.description,
                    name: d.name,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let verifiers = described
            .verifiers
            .into_iter()
            .map(|v| VerifierEntry::from_descriptor(endpoint, v))
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let config = ToolsConfig {
            tools,
            verifiers,
            ..ToolsConfig::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// [`ToolsConfig::from_describe`] of an executor that describes tools alone.
    ///
    /// # Errors
    ///
    /// As [`ToolsConfig::from_describe`].
    pub fn from_descriptors(
        endpoint: &str,
        descriptors: Vec<ToolDescriptor>,
    ) -> Result<ToolsConfig, ConfigError> {
        ToolsConfig::from_describe(
            endpoint,
            DescribeResponse {
                tools: descriptors,
                verifiers: Vec::new(),
            },
        )
    }

    /// Adds the tools and verifiers of `other` (e.g. a second executor's `Describe`).
    ///
    /// # Errors
    ///
    /// The validation errors of [`ToolsConfig::validate`], notably a duplicate name.
    pub fn merge(mut self, other: ToolsConfig) -> Result<ToolsConfig, ConfigError> {
        self.tools.extend(other.tools);
        self.verifiers.extend(other.verifiers);
        self.executors.extend(other.executors);
        self.mcp_servers.extend(other.mcp_servers);
        self.a2a_agents.extend(other.a2a_agents);
        self.validate()?;
        Ok(self)
    }

    /// Checks every rule: at most [`MAX_TOOLS`] tools, [`MAX_VERIFIERS`] verifiers and
    /// [`MAX_EXECUTORS`] executors, names of `[a-zA-Z0-9_.-]{1,64}` unique among the
    /// tools and among the verifiers, http(s) endpoints (each executor's named once),
    /// schemas that compile as JSON Schema, timeouts in 1..=600000 ms.
    ///
    /// # Errors
    ///
    /// The first rule broken.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tools.len() > MAX_TOOLS {
            return Err(ConfigError::TooManyTools {
                count: self.tools.len(),
            });
        }
        let mut names = BTreeSet::new();
        for tool in &self.tools {
            tool.validate()?;
            if !names.insert(tool.name.as_str()) {
                return Err(ConfigError::DuplicateName(tool.name.clone()));
            }
        }
        if self.verifiers.len() > MAX_VERIFIERS {
            return Err(ConfigError::TooManyVerifiers {
                count: self.verifiers.len(),
            });
        }
        let mut verifiers = BTreeSet::new();
        for verifier in &self.verifiers {
            verifier.validate()?;
            if !verifiers.insert(verifier.name.as_str()) {
                return Err(ConfigError::DuplicateVerifier(verifier.name.clone()));
            }
        }
        let executors = self.executors.len() + self.mcp_servers.len() + self.a2a_agents.len();
        if executors > MAX_EXECUTORS {
            return Err(ConfigError::TooManyExecutors { count: executors });
        }
        let mut agents = BTreeSet::new();
        for agent in &self.a2a_agents {
            agent
                .validate()
                .map_err(|error| ConfigError::InvalidA2aAgent(error.to_string()))?;
            if !agents.insert(agent.name.as_str()) {
                return Err(ConfigError::InvalidA2aAgent(format!(
                    "A2A agent {:?} is named twice",
                    agent.name
                )));
            }
        }
        let mut servers = BTreeSet::new();
        for server in &self.mcp_servers {
            server
                .validate()
                .map_err(|error| ConfigError::InvalidMcpServer(error.to_string()))?;
            if !servers.insert(server.name.as_str()) {
                return Err(ConfigError::InvalidMcpServer(format!(
                    "MCP server {:?} is named twice",
                    server.name
                )));
            }
        }
        let mut endpoints = BTreeSet::new();
        for executor in &self.executors {
            executor.validate()?;
            if !endpoints.insert(executor.endpoint.as_str()) {
                return Err(ConfigError::InvalidExecutor {
                    endpoint: executor.endpoint.clone(),
                    reason: "named twice".to_owned(),
                });
            }
        }
        Ok(())
    }

    /// The descriptors of every tool, sorted by name.
    pub fn descriptors(&self) -> Vec<ToolDescriptor> {
        let mut descriptors: Vec<_> = self.tools.iter().map(ToolEntry::descriptor).collect();
        descriptors.sort_by(|a, b| a.name.cmp(&b.name));
        descriptors
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const GOOD: &str = r#"
[[tools]]
name = "lookup"
endpoint = "http://127.0.0.1:50061"
description = "Looks things up."
side_effect = "read_only"
timeout_ms = 5000
input_schema = '''{ "type": "object" }'''

[[tools]]
name = "transfer"
endpoint = "https://payments.example:443"
description = "Moves money."
side_effect = "write"
commutative = true
timeout_ms = 10000
input_schema = '''{ "type": "object", "additionalProperties": false }'''
"#;

    fn with(field: &str, value: &str) -> String {
        let mut text = String::from("[[tools]]\n");
        let fields = [
            ("name", "\"lookup\""),
            ("endpoint", "\"http://127.0.0.1:1\""),
            ("description", "\"d\""),
            ("side_effect", "\"read_only\""),
            ("timeout_ms", "5000"),
            ("input_schema", "'{}'"),
        ];
        for (key, default) in fields {
            let v = if key == field { value } else { default };
            text.push_str(&format!("{key} = {v}\n"));
        }
        text
    }

    #[test]
    fn a_good_registry_loads() {
        let config = ToolsConfig::parse(GOOD).unwrap();
        assert_eq!(config.tools.len(), 2);
        let transfer = &config.tools[1];
        assert_eq!(transfer.side_effect, SideEffect::Write);
        assert!(transfer.commutative);
        let descriptors = config.descriptors();
        assert_eq!(descriptors[1].side_effect, v1::SideEffect::Write as i32);
        assert_eq!(
            descriptors[1].timeout,
            Some(prost_types::Duration {
                seconds: 10,
                nanos: 0
            })
        );
        assert!(!descriptors[0].commutative);
    }

    #[test]
    fn load_reads_a_file_and_reports_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tools.toml");
        std::fs::write(&path, GOOD).unwrap();
        assert_eq!(ToolsConfig::load(&path).unwrap().tools.len(), 2);
        assert!(matches!(
            ToolsConfig::load(&dir.path().join("missing.toml")),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn every_rule_is_enforced() {
        let invalid_tool = |text: &str| {
            matches!(
                ToolsConfig::parse(text),
                Err(ConfigError::InvalidTool { .. })
            )
        };
        let invalid_name =
            |text: &str| matches!(ToolsConfig::parse(text), Err(ConfigError::InvalidName(_)));
        let parse_error =
            |text: &str| matches!(ToolsConfig::parse(text), Err(ConfigError::Parse(_)));

        assert!(ToolsConfig::parse(&with("", "")).is_ok());
        assert!(invalid_name(&with("name", "\"\"")));
        assert!(invalid_name(&with("name", "\"has space\"")));
        assert!(invalid_name(&with(
            "name",
            &format!("\"{}\"", "a".repeat(65))
        )));
        assert!(ToolsConfig::parse(&with("name", &format!("\"{}\"", "a".repeat(64)))).is_ok());
        assert!(ToolsConfig::parse(&with("name", "\"ns.tool_v-2\"")).is_ok());
        assert!(invalid_tool(&with("endpoint", "\"ftp://host\"")));
        assert!(invalid_tool(&with("endpoint", "\"127.0.0.1:50061\"")));
        assert!(invalid_tool(&with("endpoint", "\"not a url\"")));
        assert!(invalid_tool(&with("input_schema", "'{not json'")));
        assert!(invalid_tool(&with("input_schema", "'[1, 2]'")));
        assert!(invalid_tool(&with("timeout_ms", "0")));
        assert!(invalid_tool(&with("timeout_ms", "600001")));
        assert!(ToolsConfig::parse(&with("timeout_ms", "600000")).is_ok());
        assert!(parse_error(&with("side_effect", "\"sometimes\"")));
        assert!(parse_error(&format!("{}color = \"red\"\n", with("", ""))));

        let twice = format!("{}{}", with("", ""), with("", ""));
        assert!(
            matches!(ToolsConfig::parse(&twice), Err(ConfigError::DuplicateName(n)) if n == "lookup")
        );
    }

    #[test]
    fn descriptors_round_trip_and_unspecified_means_write() {
        let config = ToolsConfig::parse(GOOD).unwrap();
        let mut descriptors = config.descriptors();
        let back =
            ToolsConfig::from_descriptors("http://127.0.0.1:50061", descriptors.clone()).unwrap();
        assert_eq!(back.tools[1].side_effect, SideEffect::Write);
        assert_eq!(back.tools[1].timeout_ms, 10_000);
        assert!(
            back.tools
                .iter()
                .all(|t| t.endpoint == "http://127.0.0.1:50061")
        );

        descriptors[0].side_effect = v1::SideEffect::Unspecified as i32;
        let unspecified = ToolsConfig::from_descriptors("http://h:1", descriptors.clone()).unwrap();
        assert_eq!(unspecified.tools[0].side_effect, SideEffect::Write);

        descriptors[0].timeout = None;
        assert!(matches!(
            ToolsConfig::from_descriptors("http://h:1", descriptors),
            Err(ConfigError::InvalidTool { .. })
        ));
        let merged = back.clone().merge(ToolsConfig::default()).unwrap();
        assert_eq!(merged, back);
        assert!(matches!(
            back.clone().merge(back),
            Err(ConfigError::DuplicateName(_))
        ));
    }

    fn verifier(fields: &[(&str, &str)]) -> String {
        let mut text = with("", "");
        text.push_str("[[verifiers]]\n");
        for (key, value) in fields {
            text.push_str(&format!("{key} = {value}\n"));
        }
        text
    }

    const VERIFIER: [(&str, &str); 3] = [
        ("name", "\"transfer_recorded\""),
        ("endpoint", "\"http://127.0.0.1:1\""),
        ("description", "\"Confirms transfers.\""),
    ];

    fn verifier_with(field: &str, value: &str) -> String {
        let mut fields: Vec<(&str, &str)> = VERIFIER
            .iter()
            .map(|&(key, default)| (key, if key == field { value } else { default }))
            .collect();
        if !VERIFIER.iter().any(|(key, _)| *key == field) {
            fields.push((field, value));
        }
        verifier(&fields)
    }

    #[test]
    fn verifiers_load_beside_tools_with_a_default_timeout() {
        let config = ToolsConfig::parse(&verifier(&VERIFIER)).unwrap();
        assert_eq!(config.tools.len(), 1);
        assert_eq!(
            config.verifiers,
            [VerifierEntry::new(
                "transfer_recorded",
                "http://127.0.0.1:1",
                "Confirms transfers."
            )]
        );
        assert_eq!(
            config.verifiers[0].timeout(),
            Duration::from_millis(DEFAULT_VERIFIER_TIMEOUT_MS)
        );
        let timed = ToolsConfig::parse(&verifier_with("timeout_ms", "250")).unwrap();
        assert_eq!(timed.verifiers[0].timeout_ms, 250);
        // A verifier may share a tool's name: they are looked up apart.
        assert!(ToolsConfig::parse(&verifier_with("name", "\"lookup\"")).is_ok());
        // A registry without verifiers serializes as before.
        let plain = ToolsConfig::parse(GOOD).unwrap();
        assert!(!toml::to_string(&plain).unwrap().contains("verifiers"));
    }

    #[test]
    fn every_verifier_rule_is_enforced() {
        let invalid = |text: &str| match ToolsConfig::parse(text) {
            Err(ConfigError::InvalidVerifier { verifier, reason }) => {
                assert_eq!(verifier, "transfer_recorded");
                reason
            }
            other => panic!("{other:?}"),
        };
        assert!(invalid(&verifier_with("timeout_ms", "0")).contains("timeout_ms"));
        assert!(invalid(&verifier_with("timeout_ms", "600001")).contains("timeout_ms"));
        assert!(ToolsConfig::parse(&verifier_with("timeout_ms", "600000")).is_ok());
        assert!(invalid(&verifier_with("endpoint", "\"ftp://host\"")).contains("endpoint"));
        assert!(invalid(&verifier_with("endpoint", "\"not a url\"")).contains("endpoint"));
        let long = format!("\"{}\"", "d".repeat(MAX_DESCRIPTION_BYTES + 1));
        assert!(invalid(&verifier_with("description", &long)).contains("description"));
        for name in ["\"\"", "\"has space\"", &format!("\"{}\"", "v".repeat(65))] {
            assert!(
                matches!(
                    ToolsConfig::parse(&verifier_with("name", name)),
                    Err(ConfigError::InvalidVerifierName(_))
                ),
                "{name}"
            );
        }
        assert!(matches!(
            ToolsConfig::parse(&verifier_with("color", "\"red\"")),
            Err(ConfigError::Parse(_))
        ));
        assert!(matches!(
            ToolsConfig::parse(&verifier(&VERIFIER[..2])),
            Err(ConfigError::Parse(_))
        ));

        let twice = format!(
            "{}[[verifiers]]\nname = \"transfer_recorded\"\nendpoint = \"http://127.0.0.1:2\"\ndescription = \"again\"\n",
            verifier(&VERIFIER)
        );
        let error = ToolsConfig::parse(&twice).unwrap_err();
        assert!(
            matches!(&error, ConfigError::DuplicateVerifier(n) if n == "transfer_recorded"),
            "{error:?}"
        );
        assert!(error.to_string().contains("transfer_recorded"), "{error}");

        let many = ToolsConfig {
            verifiers: (0..=MAX_VERIFIERS)
                .map(|i| VerifierEntry::new(&format!("v{i}"), "http://h:1", ""))
                .collect(),
            ..ToolsConfig::default()
        };
        assert!(matches!(
            many.validate(),
            Err(ConfigError::TooManyVerifiers { .. })
        ));
        let one = ToolsConfig::parse(&verifier(&VERIFIER)).unwrap();
        let only_verifiers = ToolsConfig {
            verifiers: one.verifiers.clone(),
            ..ToolsConfig::default()
        };
        assert!(matches!(
            one.merge(only_verifiers),
            Err(ConfigError::DuplicateVerifier(_))
        ));
    }

    #[test]
    fn the_example_registry_registers_the_demo_verifier() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/tools.example.toml");
        let config = ToolsConfig::load(&path).unwrap();
        let verifier = &config.verifiers[..];
        assert_eq!(verifier.len(), 1);
        assert_eq!(verifier[0].name, "transfer_recorded");
        // The same endpoint as its tools: one channel for both.
        assert!(
            config
                .tools
                .iter()
                .all(|t| t.endpoint == verifier[0].endpoint)
        );
    }
}
