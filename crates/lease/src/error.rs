//! The one error type of the crate and its one mapping to `tonic::Status`.

use std::time::Duration;

/// Why a lease operation failed. "Someone else holds it" and "you lost it" are not errors
/// (they are `Ok(None)` / `Ok(false)`): these are the cases where the answer is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The request itself is wrong (empty key, zero TTL, ...); retrying will not help.
    #[error("invalid lease request: {0}")]
    InvalidArgument(String),
    /// The backend cannot be reached (Redis down, connection refused or dropped). The
    /// lease may or may not still be held: a holder keeps working until its TTL passes.
    #[error("lease backend unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer within the bound; same uncertainty as `Unavailable`.
    #[error("lease backend did not answer within {0:?}")]
    Timeout(Duration),
    /// The backend answered with something this crate does not understand (a script
    /// error, a malformed value): a bug or a foreign writer, not a transient fault.
    #[error("lease backend error: {0}")]
    Backend(String),
}

impl LeaseError {
    /// Whether the same call may succeed later unchanged.
    pub fn is_retryable(&self) -> bool {
        match self {
            LeaseError::Unavailable(_) | LeaseError::Timeout(_) => true,
            LeaseError::InvalidArgument(_) | LeaseError::Backend(_) => false,
        }
    }
}

impl From<LeaseError> for tonic::Status {
    fn from(error: LeaseError) -> Self {
        let message = error.to_string();
        match error {
            LeaseError::InvalidArgument(_) => tonic::Status::invalid_argument(message),
            LeaseError::Unavailable(_) | LeaseError::Timeout(_) => {
                tonic::Status::unavailable(message)
            }
            LeaseError::Backend(_) => tonic::Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_to_status_codes() {
        let cases = [
            (
                LeaseError::InvalidArgument("ttl".into()),
                tonic::Code::InvalidArgument,
                false,
            ),
            (
                LeaseError::Unavailable("refused".into()),
                tonic::Code::Unavailable,
                true,
            ),
            (
                LeaseError::Timeout(Duration::from_millis(5)),
                tonic::Code::Unavailable,
                true,
            ),
            (
                LeaseError::Backend("bad".into()),
                tonic::Code::Internal,
                false,
            ),
        ];
        for (error, code, retryable) in cases {
            assert_eq!(error.is_retryable(), retryable, "{error}");
            let message = error.to_string();
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
        }
    }
}
