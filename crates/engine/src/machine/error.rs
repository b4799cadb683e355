//! The inputs and histories the engine refuses.

use crate::decision::CallId;

/// An input the engine refused. The state is exactly as it was before the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The input does not fit the current phase (a late answer, or a shell bug).
    #[error("input {input} is not expected while {phase}")]
    Unexpected {
        /// The input's kind.
        input: &'static str,
        /// The phase the engine is in.
        phase: &'static str,
    },
    /// A result for a call that is not in the executing batch.
    #[error("no call {0} in the executing batch")]
    UnknownCall(CallId),
    /// A second result for the same call.
    #[error("call {0} already has a result")]
    DuplicateResult(CallId),
    /// A reconciliation answer for a call that is not waiting for one.
    #[error("call {0} is not waiting to be reconciled")]
    NotReconciling(CallId),
}

/// A committed history the engine cannot rebuild state from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// A seq out of order or missing.
    #[error("event seq {found} where {expected} was expected")]
    SeqGap {
        /// The seq that should come next.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// A turn number out of order.
    #[error("turn {found} where {expected} was expected")]
    TurnGap {
        /// The turn that should come next.
        expected: u32,
        /// The turn found.
        found: u32,
    },
    /// Something follows the `Ended` event.
    #[error("event {0} follows the end of the invocation")]
    AfterEnd(u64),
    /// An executed turn without its plan fingerprint.
    #[error("turn {0} has results but no plan fingerprint")]
    MissingPlan(u32),
    /// A reply (or a second end) where nothing waits for one, or one that does not fit
    /// the wait.
    #[error("event {0} replies to a wait it does not fit: {1}")]
    BadReply(u64, String),
    /// A started batch that is not a valid batch of tool calls for this catalog.
    #[error("the batch started in turn {0} is not a valid batch: {1}")]
    InvalidStartedBatch(u32, String),
}
