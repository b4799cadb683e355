//! The orchestrator's errors and their one mapping to gRPC status codes.

use agentloop_lease::LeaseError;
use agentloop_store::StoreError;
use tonic::{Code, Status};

/// Why an orchestrator request failed.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// The request is malformed or out of bounds; nothing was stored.
    #[error("{0}")]
    InvalidArgument(String),
    /// The named invocation does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The caller may not do this (another tenant or actor named in a start, an approval
    /// without the approver role).
    #[error("{0}")]
    PermissionDenied(String),
    /// The idempotency key belongs to a different request.
    #[error("{0}")]
    AlreadyExists(String),
    /// The orchestrator runs as many invocations as it is allowed to.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A service the orchestrator needs is unreachable, or it is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// A position past what exists (a watch from beyond the next event).
    #[error("{0}")]
    OutOfRange(String),
    /// The invocation is not in the state the request needs (a reply to an invocation
    /// that does not wait for it, a digest other than the pending one); nothing changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The event store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lease backend failed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

impl From<OrchestratorError> for Status {
    fn from(error: OrchestratorError) -> Status {
        let code = match &error {
            OrchestratorError::InvalidArgument(_) => Code::InvalidArgument,
            OrchestratorError::NotFound(_) => Code::NotFound,
            OrchestratorError::AlreadyExists(_) => Code::AlreadyExists,
            OrchestratorError::PermissionDenied(_) => Code::PermissionDenied,
            OrchestratorError::ResourceExhausted(_) => Code::ResourceExhausted,
            OrchestratorError::Unavailable(_) => Code::Unavailable,
            OrchestratorError::FailedPrecondition(_) => Code::FailedPrecondition,
            OrchestratorError::OutOfRange(_) => Code::OutOfRange,
            OrchestratorError::Store(store) => match store {
                StoreError::NotFound(_) => Code::NotFound,
                StoreError::IdempotencyConflict { .. } => Code::AlreadyExists,
                StoreError::VersionConflict { .. }
                | StoreError::StaleEpoch { .. }
                | StoreError::Ended(_) => Code::Aborted,
                StoreError::MalformedAppend(_)
                | StoreError::Corrupt(_)
                | StoreError::Database(_)
                | StoreError::Migrate(_) => Code::Internal,
            },
            OrchestratorError::Lease(lease) => {
                if lease.is_retryable() {
                    Code::Unavailable
                } else {
                    Code::Internal
                }
            }
        };
        Status::new(code, agentloop_proto::bounded_message(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn each_error_maps_to_its_code_and_keeps_the_message() {
        let id = Uuid::nil();
        let cases = [
            (
                OrchestratorError::InvalidArgument("goal is empty".into()),
                Code::InvalidArgument,
            ),
            (
                OrchestratorError::NotFound("no invocation x".into()),
                Code::NotFound,
            ),
            (
                OrchestratorError::AlreadyExists("key".into()),
                Code::AlreadyExists,
            ),
            (
                OrchestratorError::PermissionDenied("not yours".into()),
                Code::PermissionDenied,
            ),
            (
                OrchestratorError::ResourceExhausted("full".into()),
                Code::ResourceExhausted,
            ),
            (
                OrchestratorError::Unavailable("down".into()),
                Code::Unavailable,
            ),
            (
                OrchestratorError::FailedPrecondition("not waiting".into()),
                Code::FailedPrecondition,
            ),
            (
                OrchestratorError::OutOfRange("too far".into()),
                Code::OutOfRange,
            ),
            (
                OrchestratorError::Store(StoreError::NotFound(id)),
                Code::NotFound,
            ),
            (
                OrchestratorError::Store(StoreError::IdempotencyConflict {
                    key: "k".into(),
                    existing: id,
                }),
                Code::AlreadyExists,
            ),
            (
                OrchestratorError::Store(StoreError::StaleEpoch {
                    invocation_id: id,
                    presented: 1,
                    current: 2,
                }),
                Code::Aborted,
            ),
            (
                OrchestratorError::Store(StoreError::Corrupt("row".into())),
                Code::Internal,
            ),
            (
                OrchestratorError::Lease(LeaseError::Unavailable("redis down".into())),
                Code::Unavailable,
            ),
            (
                OrchestratorError::Lease(LeaseError::Backend("bad script".into())),
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let message = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message);
        }
    }
}
