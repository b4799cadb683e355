//! The API's errors and their one mapping to gRPC status codes.

use agentloop_runtime::RuntimeError;
use agentloop_store::StoreError;
use tonic::{Code, Status};

/// Why an API call failed: a runtime error, answered as the gRPC status it maps to here.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct OrchestratorError(#[from] pub RuntimeError);

impl From<StoreError> for OrchestratorError {
    fn from(error: StoreError) -> Self {
        OrchestratorError(RuntimeError::Store(error))
    }
}

impl From<OrchestratorError> for Status {
    fn from(error: OrchestratorError) -> Status {
        let code = match &error.0 {
            RuntimeError::InvalidArgument(_) => Code::InvalidArgument,
            RuntimeError::NotFound(_) => Code::NotFound,
            RuntimeError::AlreadyExists(_) => Code::AlreadyExists,
            RuntimeError::PermissionDenied(_) => Code::PermissionDenied,
            RuntimeError::ResourceExhausted(_) => Code::ResourceExhausted,
            RuntimeError::Unavailable(_) => Code::Unavailable,
            RuntimeError::FailedPrecondition(_) => Code::FailedPrecondition,
            RuntimeError::OutOfRange(_) => Code::OutOfRange,
            RuntimeError::Store(store) => match store {
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
            RuntimeError::Lease(lease) => {
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
    use agentloop_lease::LeaseError;
    use uuid::Uuid;

    use super::*;

    #[test]
    fn each_error_maps_to_its_code_and_keeps_the_message() {
        let id = Uuid::nil();
        let cases = [
            (
                RuntimeError::InvalidArgument("goal is empty".into()),
                Code::InvalidArgument,
            ),
            (
                RuntimeError::NotFound("no invocation x".into()),
                Code::NotFound,
            ),
            (
                RuntimeError::AlreadyExists("key".into()),
                Code::AlreadyExists,
            ),
            (
                RuntimeError::PermissionDenied("not yours".into()),
                Code::PermissionDenied,
            ),
            (
                RuntimeError::ResourceExhausted("full".into()),
                Code::ResourceExhausted,
            ),
            (RuntimeError::Unavailable("down".into()), Code::Unavailable),
            (
                RuntimeError::FailedPrecondition("not waiting".into()),
                Code::FailedPrecondition,
            ),
            (RuntimeError::OutOfRange("too far".into()), Code::OutOfRange),
            (
                RuntimeError::Store(StoreError::NotFound(id)),
                Code::NotFound,
            ),
            (
                RuntimeError::Store(StoreError::IdempotencyConflict {
                    key: "k".into(),
                    existing: id,
                }),
                Code::AlreadyExists,
            ),
            (
                RuntimeError::Store(StoreError::StaleEpoch {
                    invocation_id: id,
                    presented: 1,
                    current: 2,
                }),
                Code::Aborted,
            ),
            (
                RuntimeError::Store(StoreError::Corrupt("row".into())),
                Code::Internal,
            ),
            (
                RuntimeError::Lease(LeaseError::Unavailable("redis down".into())),
                Code::Unavailable,
            ),
            (
                RuntimeError::Lease(LeaseError::Backend("bad script".into())),
                Code::Internal,
            ),
        ];
        agentloop_proto::testing::assert_codes(
            cases.map(|(error, code)| (OrchestratorError(error), code)),
        );
    }
}
