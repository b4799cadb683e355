//! The executor's failures that are not a tool result, and their one mapping to
//! `tonic::Status`.
//!
//! The codes are chosen for the gateway's classification (`agentloop_tools::outcome`):
//! after a call may have reached the server, the status is `UNAVAILABLE`,
//! `DEADLINE_EXCEEDED` or `INTERNAL`, which the gateway turns into `unknown` for a write
//! and into a structured error for a read. `INVALID_ARGUMENT` is only used for requests
//! refused before anything was sent, which the gateway treats as definite.

use std::time::Duration;

use tonic::Status;

use crate::describe::ListError;

/// Why the executor could not answer with a result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExecutorError {
    /// The request itself is malformed (no call, a tool of another server); nothing sent.
    #[error("{0}")]
    InvalidRequest(String),
    /// `Describe` while the server is not connected.
    #[error("MCP server {server:?} is not connected: {reason}")]
    NotConnected { server: String, reason: String },
    /// `tools/list` did not answer within the server's timeout.
    #[error("MCP server {server:?} did not list its tools within {timeout:?}")]
    ListTimeout { server: String, timeout: Duration },
    /// `tools/list` failed or broke a bound.
    #[error("MCP server {server:?}: {error}")]
    List {
        server: String,
        // Boxed: it is large, and every call's result carries the error type.
        error: Box<ListError>,
    },
    /// The call was sent and its deadline passed; it was cancelled at the server.
    #[error(
        "MCP server {server:?} did not answer within {timeout:?}; the call was cancelled, \
         but it may have taken effect"
    )]
    Deadline { server: String, timeout: Duration },
    /// The connection ended after the call was sent.
    #[error("the connection to MCP server {server:?} was lost after the call was sent: {reason}")]
    Lost { server: String, reason: String },
    /// The server broke the protocol or a bound while the call was out, and was cut off.
    #[error("MCP server {server:?} was cut off after the call was sent: {reason}")]
    CutOff { server: String, reason: String },
    /// The server answered with something that is not a tool result.
    #[error("MCP server {server:?} answered the call with {detail}")]
    Malformed { server: String, detail: String },
    /// MCP has no verifiers.
    #[error("MCP servers serve no verifiers")]
    NoVerifiers,
}

impl From<ExecutorError> for Status {
    fn from(error: ExecutorError) -> Status {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            ExecutorError::InvalidRequest(_) => Status::invalid_argument(message),
            ExecutorError::NotConnected { .. } | ExecutorError::Lost { .. } => {
                Status::unavailable(message)
            }
            ExecutorError::ListTimeout { .. } | ExecutorError::Deadline { .. } => {
                Status::deadline_exceeded(message)
            }
            ExecutorError::List { error, .. } => {
                if error.is_violation() {
                    Status::failed_precondition(message)
                } else {
                    Status::unavailable(message)
                }
            }
            ExecutorError::CutOff { .. } | ExecutorError::Malformed { .. } => {
                Status::internal(message)
            }
            ExecutorError::NoVerifiers => Status::unimplemented(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn server() -> String {
        "s".to_owned()
    }

    #[test]
    fn each_failure_maps_to_the_code_the_gateway_expects() {
        let cases = [
            (
                ExecutorError::InvalidRequest("x".into()),
                Code::InvalidArgument,
            ),
            (
                ExecutorError::NotConnected {
                    server: server(),
                    reason: "r".into(),
                },
                Code::Unavailable,
            ),
            (
                ExecutorError::Deadline {
                    server: server(),
                    timeout: Duration::from_secs(1),
                },
                Code::DeadlineExceeded,
            ),
            (
                ExecutorError::Lost {
                    server: server(),
                    reason: "exited".into(),
                },
                Code::Unavailable,
            ),
            (
                ExecutorError::CutOff {
                    server: server(),
                    reason: "garbage".into(),
                },
                Code::Internal,
            ),
            (
                ExecutorError::List {
                    server: server(),
                    error: Box::new(ListError::TooManyTools),
                },
                Code::FailedPrecondition,
            ),
            (ExecutorError::NoVerifiers, Code::Unimplemented),
        ];
        agentloop_proto::testing::assert_codes(cases);
    }

    #[test]
    fn messages_are_bounded() {
        let status = Status::from(ExecutorError::Lost {
            server: server(),
            reason: "x".repeat(10 * agentloop_proto::MAX_STATUS_MESSAGE_BYTES),
        });
        assert!(status.message().len() <= agentloop_proto::MAX_STATUS_MESSAGE_BYTES);
    }
}
