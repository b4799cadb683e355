//! The one error type of the policy service and its one mapping to `tonic::Status`.

/// Why policy could not judge, or could not be set up.
///
/// A refused call or answer is *not* an error: it is a normal response (DENY,
/// REQUIRE_APPROVAL, `accepted = false`). Errors are for requests that are malformed
/// and for setup failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `service_token_file` or `client_tls` cannot be read or used (setup).
    #[error("{0}")]
    ServiceToken(String),
    /// The request is malformed (missing invocation ID, too many calls, oversized
    /// arguments): INVALID_ARGUMENT.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A tool's input schema is not JSON or not a valid JSON Schema (setup).
    #[error("tool {tool:?} has an invalid input schema: {detail}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// What is wrong.
        detail: String,
    },
    /// Two descriptors share a name (setup).
    #[error("tool {tool:?} is described more than once")]
    DuplicateTool {
        /// The tool.
        tool: String,
    },
    /// The tool gateway could not be asked for the tool descriptors (setup).
    #[error("cannot list tools at {endpoint} after {attempts} attempts: {detail}")]
    ToolsUnavailable {
        /// The gateway endpoint.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        detail: String,
    },
    /// Neither `tools_endpoint` nor `tools_file` is configured (setup).
    #[error(
        "no tool source configured: set `tools_endpoint` (the tool gateway) or `tools_file` (its registry file)"
    )]
    NoToolSource,
    /// Both `tools_endpoint` and `tools_file` are configured; which one is the truth
    /// would be a guess (setup).
    #[error("both `tools_endpoint` and `tools_file` are configured; set exactly one")]
    ConflictingToolSources,
    /// A profile's policies do not load: a file that cannot be read, a policy that does
    /// not parse or validate (setup, or a reload that is refused).
    #[error("the policies of profile {profile:?} do not load:\n{detail}")]
    Policies {
        /// The profile.
        profile: String,
        /// Every problem, one per line, with file, position and policy ID.
        detail: String,
    },
    /// A profile's acceptance rules are invalid (setup).
    #[error("the acceptance rules of profile {profile:?} are invalid: {detail}")]
    Acceptance {
        /// The profile.
        profile: String,
        /// What is wrong.
        detail: String,
    },
    /// `tools_file` could not be loaded (setup).
    #[error("cannot load tools_file {path}: {detail}")]
    ToolsFile {
        /// The configured path.
        path: String,
        /// What went wrong.
        detail: String,
    },
}

impl From<PolicyError> for tonic::Status {
    fn from(error: PolicyError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            PolicyError::InvalidRequest(_) => tonic::Status::invalid_argument(message),
            PolicyError::InvalidSchema { .. }
            | PolicyError::DuplicateTool { .. }
            | PolicyError::NoToolSource
            | PolicyError::ConflictingToolSources
            | PolicyError::ToolsFile { .. }
            | PolicyError::Policies { .. }
            | PolicyError::Acceptance { .. }
            | PolicyError::ServiceToken(_) => tonic::Status::failed_precondition(message),
            PolicyError::ToolsUnavailable { .. } => tonic::Status::unavailable(message),
        }
    }
}
