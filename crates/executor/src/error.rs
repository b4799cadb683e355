//! The executor's errors: [`BuildError`] when it is built, [`RequestError`] when a
//! request fails as a gRPC status, with its one mapping to `tonic::Status`.

use std::time::Duration;

use crate::RecordError;

/// Why an executor could not be built. Every variant names the tool or verifier, so the
/// owner can fix it without reading code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two tools have one name.
    #[error("tool {tool:?} is registered twice")]
    DuplicateTool {
        /// The name.
        tool: String,
    },
    /// A tool's name is empty, too long or has characters outside `[a-zA-Z0-9_.-]`.
    #[error("invalid tool name {tool:?}: expected 1 to 64 characters of [a-zA-Z0-9_.-]")]
    InvalidToolName {
        /// The name.
        tool: String,
    },
    /// A tool's timeout is outside 1 ms..=600000 ms.
    #[error("tool {tool:?}: timeout {timeout:?} is outside 1 ms..=600000 ms")]
    InvalidToolTimeout {
        /// The tool.
        tool: String,
        /// Its timeout.
        timeout: Duration,
    },
    /// A tool declares `SIDE_EFFECT_UNSPECIFIED`.
    #[error("tool {tool:?} declares no side effect; declare read_only, idempotent_write or write")]
    UnspecifiedSideEffect {
        /// The tool.
        tool: String,
    },
    /// A tool's description or schema is too large for the gateway's registry.
    #[error("tool {tool:?}: {reason}")]
    OversizedTool {
        /// The tool.
        tool: String,
        /// Which part, and the limit.
        reason: String,
    },
    /// A tool writes, and the executor has no record to dedupe its effect keys in.
    #[error(
        "tool {tool:?} writes, and an executor with writes needs a record (ExecutorBuilder::record)"
    )]
    NoRecord {
        /// The tool.
        tool: String,
    },
    /// Two verifiers have one name.
    #[error("verifier {verifier:?} is registered twice")]
    DuplicateVerifier {
        /// The name.
        verifier: String,
    },
    /// A verifier's name is empty, too long or has characters outside `[a-zA-Z0-9_.-]`.
    #[error("invalid verifier name {verifier:?}: expected 1 to 64 characters of [a-zA-Z0-9_.-]")]
    InvalidVerifierName {
        /// The name.
        verifier: String,
    },
    /// A verifier's timeout is outside 1 ms..=600000 ms, or its description is too long.
    #[error("verifier {verifier:?}: {reason}")]
    InvalidVerifier {
        /// The verifier.
        verifier: String,
        /// What is wrong.
        reason: String,
    },
}

/// Why a request failed as a gRPC status rather than as a tool result.
///
/// Tool failures the model should see (bad arguments, a refusal) are *not* errors here:
/// they are `ToolResult`s with a structured `ToolError`, as the contract asks. These are
/// failures of the request or of the executor; for a dispatched write they leave the
/// outcome unknown, and the caller reconciles.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request is malformed (no call, an oversized field, a write without an effect
    /// key). Nothing was applied.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request names a tool this executor does not serve.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// Verify was asked for a verifier this executor does not serve. NOT_FOUND, like an
    /// unknown tool: the gateway's registry names the wrong executor.
    #[error("unknown verifier {0:?}")]
    UnknownVerifier(String),
    /// Reconcile was asked about a read-only tool, which has no effects to reconcile.
    #[error("tool {0:?} is read-only and has no effects to reconcile")]
    NotReconcilable(String),
    /// The record cannot take the write, or is in doubt. The tool's output, if it ran,
    /// was not recorded and not acknowledged.
    #[error("effect record unavailable: {0}")]
    Record(#[from] RecordError),
    /// A write's output cannot be recorded (it does not serialize, or is too large).
    #[error("the output of {tool:?} cannot be recorded: {reason}")]
    Output {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The executor stopped (its drain bound passed) before the call finished; nothing
    /// was recorded for it.
    #[error("the executor is stopping; the call was abandoned before it finished")]
    Stopped,
}

impl From<RequestError> for tonic::Status {
    fn from(error: RequestError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            RequestError::InvalidRequest(_) | RequestError::NotReconcilable(_) => {
                tonic::Status::invalid_argument(message)
            }
            RequestError::UnknownTool(_) | RequestError::UnknownVerifier(_) => {
                tonic::Status::not_found(message)
            }
            // What a lost connection looks like: the caller reconciles or retries.
            RequestError::Stopped => tonic::Status::unavailable(message),
            RequestError::Record(_) | RequestError::Output { .. } => {
                tonic::Status::internal(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn every_error_maps_to_its_status_code() {
        let cases = [
            (
                RequestError::InvalidRequest("x".into()),
                Code::InvalidArgument,
            ),
            (
                RequestError::NotReconcilable("lookup".into()),
                Code::InvalidArgument,
            ),
            (RequestError::UnknownTool("nope".into()), Code::NotFound),
            (RequestError::UnknownVerifier("nope".into()), Code::NotFound),
            (RequestError::Stopped, Code::Unavailable),
            (RequestError::Record(RecordError::Full), Code::Internal),
            (
                RequestError::Output {
                    tool: "t".into(),
                    reason: "r".into(),
                },
                Code::Internal,
            ),
        ];
        agentloop_proto::testing::assert_codes(cases);
        let long = tonic::Status::from(RequestError::UnknownTool("x".repeat(10_000)));
        assert!(long.message().len() <= agentloop_proto::MAX_STATUS_MESSAGE_BYTES);
    }
}
