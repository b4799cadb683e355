//! Why an invocation stopped: the stable vocabulary callers and operators script against.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The typed reason every invocation ends with.
///
/// The names are a stable external format (event log, gRPC, CLI exit codes): add a variant
/// only together with every place that maps it, which the exhaustive matches enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalReason {
    /// A final answer was committed after the configured validators accepted it.
    Completed,
    /// A valid action needs a human decision; the exact proposal is committed, and the
    /// invocation waits for the approval (or its denial).
    ApprovalRequired,
    /// The model needs an answer from the user before it can go on; the invocation waits
    /// for it.
    ClarificationRequired,
    /// The caller (or a revoked lease) cancelled the invocation.
    Cancelled,
    /// The invocation's wall-clock deadline passed, or it waited for a human past its
    /// wait bound.
    DeadlineExceeded,
    /// The turn budget ran out.
    MaxSteps,
    /// The next batch would exceed the tool-call budget.
    ToolBudgetExhausted,
    /// The token budget or the cost budget ran out; the detail says which. The cost
    /// budget shares this reason because it bounds the same thing, what the model calls
    /// consume, in another unit, and the vocabulary stays closed.
    TokenBudgetExhausted,
    /// The same plan was proposed again more often than allowed.
    NoProgress,
    /// The model's output broke the protocol (and any repair turn was used up).
    InvalidDecision,
    /// The model could not be reached or answered with an error.
    ModelError,
    /// A turn could not be committed durably.
    CheckpointFailed,
    /// The model said it cannot continue, with a reason.
    CannotContinue,
    /// The final answer was rejected by the validators (and any repair turn was used up).
    VerificationFailed,
    /// An effect's outcome is unknown and its executor cannot reconcile it.
    ReconciliationRequired,
}

impl TerminalReason {
    /// Every reason, in the order of the documented vocabulary.
    pub const ALL: [TerminalReason; 15] = [
        TerminalReason::Completed,
        TerminalReason::ApprovalRequired,
        TerminalReason::ClarificationRequired,
        TerminalReason::Cancelled,
        TerminalReason::DeadlineExceeded,
        TerminalReason::MaxSteps,
        TerminalReason::ToolBudgetExhausted,
        TerminalReason::TokenBudgetExhausted,
        TerminalReason::NoProgress,
        TerminalReason::InvalidDecision,
        TerminalReason::ModelError,
        TerminalReason::CheckpointFailed,
        TerminalReason::CannotContinue,
        TerminalReason::VerificationFailed,
        TerminalReason::ReconciliationRequired,
    ];

    /// The stable snake_case name, as written in logs, JSON and the event log.
    pub const fn as_str(self) -> &'static str {
        match self {
            TerminalReason::Completed => "completed",
            TerminalReason::ApprovalRequired => "approval_required",
            TerminalReason::ClarificationRequired => "clarification_required",
            TerminalReason::Cancelled => "cancelled",
            TerminalReason::DeadlineExceeded => "deadline_exceeded",
            TerminalReason::MaxSteps => "max_steps",
            TerminalReason::ToolBudgetExhausted => "tool_budget_exhausted",
            TerminalReason::TokenBudgetExhausted => "token_budget_exhausted",
            TerminalReason::NoProgress => "no_progress",
            TerminalReason::InvalidDecision => "invalid_decision",
            TerminalReason::ModelError => "model_error",
            TerminalReason::CheckpointFailed => "checkpoint_failed",
            TerminalReason::CannotContinue => "cannot_continue",
            TerminalReason::VerificationFailed => "verification_failed",
            TerminalReason::ReconciliationRequired => "reconciliation_required",
        }
    }
}

impl fmt::Display for TerminalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not in the terminal-reason vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown terminal reason {0:?}")]
pub struct UnknownTerminalReason(pub String);

impl FromStr for TerminalReason {
    type Err = UnknownTerminalReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TerminalReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == s)
            .ok_or_else(|| UnknownTerminalReason(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in TerminalReason::ALL {
            assert!(seen.insert(reason.as_str()), "duplicate name {reason}");
            assert_eq!(reason.as_str().parse::<TerminalReason>(), Ok(reason));
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
        }
        assert_eq!(
            "finished".parse::<TerminalReason>(),
            Err(UnknownTerminalReason("finished".into()))
        );
    }
}
