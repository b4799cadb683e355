//! Why a runtime operation failed. The orchestrator's API maps each to a gRPC status,
//! in one place.

use agentloop_lease::LeaseError;
use agentloop_store::StoreError;

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
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
