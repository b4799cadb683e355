//! The one error type of the gateway and its one mapping to `tonic::Status`.

use crate::config::ConfigError;

/// Why the gateway could not start or could not accept a request.
///
/// A call that was accepted never fails with this: its failures become the call's
/// `ToolResult` (see [`crate::outcome`]), and a verification's become an UNDECIDED
/// check (see [`crate::verdict`]). These errors are returned before anything
/// is dispatched, so for them a gRPC error is safe even for writes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The tool registry is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A gateway limit is out of range.
    #[error("invalid gateway limits: {0}")]
    InvalidLimits(String),
    /// An executor endpoint could not be turned into a channel.
    #[error(transparent)]
    Connect(#[from] agentloop_proto::client::ConnectError),
    /// The request is malformed or over a bound; nothing was dispatched.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request names a tool that is not registered. NOT_FOUND rather than
    /// INVALID_ARGUMENT: policy already checked the name against the catalog, so an
    /// unknown name here means the registries disagree, which an operator must fix.
    #[error("tool {0:?} is not registered")]
    UnknownTool(String),
    /// The request names a verifier that is not registered. NOT_FOUND, not an UNDECIDED
    /// check: the profile and the registry disagree, which an operator must fix, and a
    /// check that can never pass would only burn the model's repair turn.
    #[error("verifier {0:?} is not registered")]
    UnknownVerifier(String),
    /// A write was sent as part of a stage. Writes go through `Execute` one by one, each
    /// prepared in the effect ledger before it is sent.
    #[error(
        "tool {0:?} writes: send its calls through Execute, one by one, under the effect ledger"
    )]
    WriteInStage(String),
    /// Reconcile was asked about a read-only tool, which has no effects.
    #[error("tool {0:?} is read-only and has no effects to reconcile")]
    NotReconcilable(String),
    /// An executor could not be described (unreachable, failed, too slow).
    #[error("executor {endpoint:?} could not be described: {detail}")]
    Describe {
        /// Its endpoint.
        endpoint: String,
        /// What went wrong.
        detail: String,
    },
    /// What an executor describes is invalid (a schema, a name, a timeout).
    #[error("executor {endpoint:?}: {source}")]
    InvalidDescription {
        /// Its endpoint.
        endpoint: String,
        /// The first rule its description breaks, naming the tool or verifier.
        #[source]
        source: ConfigError,
    },
    /// A tool or verifier name is claimed by a second source; the first keeps it.
    #[error("{kind} {name:?} of {claimant} is already registered by {holder}; refused")]
    NameTaken {
        /// `tool` or `verifier`.
        kind: &'static str,
        /// The name.
        name: String,
        /// Who holds it (an endpoint, or the registry file).
        holder: String,
        /// Who claimed it again.
        claimant: String,
    },
    /// Deregistration of an endpoint that is not registered.
    #[error("no executor is registered at {0:?}")]
    UnknownExecutor(String),
    /// Deregistration of an executor the registry file names.
    #[error("executor {0:?} is named by the registry file; remove it there")]
    ConfiguredExecutor(String),
    /// The caller may not call this method (a registrar calling a tool method, or
    /// another caller registering an executor).
    #[error("caller {0} may not call this method of the tool gateway")]
    NotAllowed(String),
    /// A Reconcile forward failed; the executor's (or transport's) status is passed on,
    /// so a transient failure stays retryable for the caller.
    #[error("executor failed: {}", .0.message())]
    Executor(tonic::Status),
}

impl From<GatewayError> for tonic::Status {
    fn from(error: GatewayError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            GatewayError::InvalidRequest(_)
            | GatewayError::NotReconcilable(_)
            | GatewayError::WriteInStage(_) => tonic::Status::invalid_argument(message),
            GatewayError::UnknownTool(_)
            | GatewayError::UnknownVerifier(_)
            | GatewayError::UnknownExecutor(_) => tonic::Status::not_found(message),
            GatewayError::InvalidDescription { .. } => tonic::Status::invalid_argument(message),
            GatewayError::Describe { .. } => tonic::Status::unavailable(message),
            GatewayError::NameTaken { .. } => tonic::Status::already_exists(message),
            GatewayError::ConfiguredExecutor(_) => tonic::Status::failed_precondition(message),
            GatewayError::NotAllowed(_) => tonic::Status::permission_denied(message),
            GatewayError::Executor(status) => tonic::Status::new(status.code(), message),
            GatewayError::Config(_) | GatewayError::InvalidLimits(_) | GatewayError::Connect(_) => {
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
                GatewayError::InvalidRequest("x".into()),
                Code::InvalidArgument,
            ),
            (
                GatewayError::NotReconcilable("lookup".into()),
                Code::InvalidArgument,
            ),
            (
                GatewayError::WriteInStage("transfer".into()),
                Code::InvalidArgument,
            ),
            (GatewayError::UnknownTool("nope".into()), Code::NotFound),
            (GatewayError::UnknownVerifier("nope".into()), Code::NotFound),
            (
                GatewayError::Executor(tonic::Status::unavailable("down")),
                Code::Unavailable,
            ),
            (GatewayError::InvalidLimits("x".into()), Code::Internal),
            (
                GatewayError::Config(ConfigError::DuplicateName("a".into())),
                Code::Internal,
            ),
        ];
        agentloop_proto::testing::assert_codes(cases);
    }

    #[test]
    fn a_long_name_is_quoted_only_in_part() {
        let status = tonic::Status::from(GatewayError::UnknownTool("t".repeat(100_000)));
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().len() <= agentloop_proto::MAX_STATUS_MESSAGE_BYTES);
    }
}
