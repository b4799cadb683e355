//! Every way an A2A call fails, and its JSON-RPC error: the codes of the A2A v1.0
//! JSON-RPC binding, and how a status of the orchestrator's gRPC API maps onto them.

use serde_json::{Value, json};
use tonic::Code;

/// Why an A2A call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum A2aError {
    /// The body is not JSON.
    #[error("{0}")]
    Parse(String),
    /// The body is JSON but not a JSON-RPC 2.0 request.
    #[error("{0}")]
    InvalidRequest(String),
    /// No such method.
    #[error("no method {0:?}")]
    MethodNotFound(String),
    /// The parameters are wrong.
    #[error("{0}")]
    InvalidParams(String),
    /// The task does not exist, or belongs to another tenant (the same answer).
    #[error("{0}")]
    TaskNotFound(String),
    /// The task has ended.
    #[error("{0}")]
    TaskNotCancelable(String),
    /// Push notifications are not offered.
    #[error("push notifications are not supported")]
    PushNotificationNotSupported,
    /// The call is valid A2A that this agent does not do (a reply to a task that does
    /// not wait, a subscription to one that has ended).
    #[error("{0}")]
    UnsupportedOperation(String),
    /// A part this agent cannot read (a file).
    #[error("{0}")]
    ContentTypeNotSupported(String),
    /// There is no extended card.
    #[error("there is no extended agent card")]
    ExtendedAgentCardNotConfigured,
    /// The client speaks a version this agent does not.
    #[error("A2A version {0:?} is not supported; this agent speaks 1.0")]
    VersionNotSupported(String),
    /// The caller's credentials are missing or wrong (HTTP 401).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller may not do this (HTTP 403).
    #[error("{0}")]
    PermissionDenied(String),
    /// The orchestrator failed, or is overloaded or stopping.
    #[error("{0}")]
    Internal(String),
}

impl A2aError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            A2aError::Parse(_) => -32700,
            A2aError::InvalidRequest(_) => -32600,
            A2aError::MethodNotFound(_) => -32601,
            A2aError::InvalidParams(_) => -32602,
            A2aError::Internal(_)
            | A2aError::Unauthenticated(_)
            | A2aError::PermissionDenied(_) => -32603,
            A2aError::TaskNotFound(_) => -32001,
            A2aError::TaskNotCancelable(_) => -32002,
            A2aError::PushNotificationNotSupported => -32003,
            A2aError::UnsupportedOperation(_) => -32004,
            A2aError::ContentTypeNotSupported(_) => -32005,
            A2aError::ExtendedAgentCardNotConfigured => -32007,
            A2aError::VersionNotSupported(_) => -32009,
        }
    }

    /// The HTTP status of the answer that carries the error: 200, as JSON-RPC has it,
    /// except for the caller's credentials, which HTTP itself answers.
    pub fn http_status(&self) -> http::StatusCode {
        match self {
            A2aError::Unauthenticated(_) => http::StatusCode::UNAUTHORIZED,
            A2aError::PermissionDenied(_) => http::StatusCode::FORBIDDEN,
            A2aError::Parse(_)
            | A2aError::InvalidRequest(_)
            | A2aError::MethodNotFound(_)
            | A2aError::InvalidParams(_)
            | A2aError::TaskNotFound(_)
            | A2aError::TaskNotCancelable(_)
            | A2aError::PushNotificationNotSupported
            | A2aError::UnsupportedOperation(_)
            | A2aError::ContentTypeNotSupported(_)
            | A2aError::ExtendedAgentCardNotConfigured
            | A2aError::VersionNotSupported(_)
            | A2aError::Internal(_) => http::StatusCode::OK,
        }
    }

    /// The JSON-RPC error object.
    pub fn object(&self) -> Value {
        json!({"code": self.code(), "message": self.to_string()})
    }

    /// What a status of the orchestrator's API means to an A2A client.
    pub fn from_status(status: &tonic::Status) -> A2aError {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound => A2aError::TaskNotFound(message),
            Code::InvalidArgument | Code::OutOfRange => A2aError::InvalidParams(message),
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => {
                A2aError::UnsupportedOperation(message)
            }
            Code::Unauthenticated => A2aError::Unauthenticated(message),
            Code::PermissionDenied => A2aError::PermissionDenied(message),
            Code::Ok
            | Code::Cancelled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss => A2aError::Internal(message),
        }
    }
}

impl From<tonic::Status> for A2aError {
    fn from(status: tonic::Status) -> A2aError {
        A2aError::from_status(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_tenants_task_is_not_found_and_bad_credentials_are_http_errors() {
        let hidden = A2aError::from(tonic::Status::not_found("no invocation x"));
        assert_eq!(hidden.code(), -32001);
        assert_eq!(hidden.http_status(), http::StatusCode::OK);
        let anonymous = A2aError::from(tonic::Status::unauthenticated("no token"));
        assert_eq!(anonymous.http_status(), http::StatusCode::UNAUTHORIZED);
        let denied = A2aError::from(tonic::Status::permission_denied("tenant b"));
        assert_eq!(denied.http_status(), http::StatusCode::FORBIDDEN);
        assert_eq!(
            A2aError::from(tonic::Status::invalid_argument("goal")).code(),
            -32602
        );
    }
}
