//! What the engine asks the shell to do.

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::decision::{CallId, ToolCall};
use crate::event::{Event, Refusal};
use crate::outcome::{InputAnswer, Outcome, Totals};
use crate::plan::ExecutionPlan;

/// What the engine asks the shell to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Ask the model for the decision of `turn`; answer with `Decided` or `DecisionFailed`.
    Decide {
        /// The turn being decided.
        turn: u32,
    },
    /// Ask policy about these calls; answer with `Authorized`.
    Authorize {
        /// The turn.
        turn: u32,
        /// The validated calls.
        calls: Vec<ToolCall>,
        /// Set when a human approved exactly these calls: policy checks them again at
        /// dispatch, and its approval gate is satisfied by this digest.
        approved: Option<Fingerprint>,
    },
    /// Run these calls following `plan`; answer with one `CallFinished` per call.
    Execute {
        /// The turn.
        turn: u32,
        /// The calls, in the model's order.
        calls: Vec<ToolCall>,
        /// Which calls may run together.
        plan: ExecutionPlan,
        /// Calls policy refused when checked again at dispatch: none is sent. Each one's
        /// result is its refusal as a `permission_denied` error, unless it is a write
        /// sent before (a resumed batch), which is settled from its ledger entry as
        /// usual.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        refused: Vec<Refusal>,
        /// A person's answer to the question one of `calls` asked: that call is sent
        /// with it. Boxed: almost no batch has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<Box<InputAnswer>>,
    },
    /// Stop the calls of `turn`: drop running ones (report `Cancelled`, or their result if
    /// they already finished) and start no more (report `NotStarted`).
    CancelCalls {
        /// The turn.
        turn: u32,
    },
    /// Ask the executors what became of writes whose outcome is unknown, by their effect
    /// keys; answer with one `Reconciled` or `ReconciliationFailed` per call. The model is
    /// not asked again until every one is settled: it must never redo a write blindly.
    Reconcile {
        /// The turn.
        turn: u32,
        /// The write calls whose outcome is unknown.
        calls: Vec<ToolCall>,
    },
    /// Have the answer checked against the committed state (its citations, the
    /// profile's rules, the ledger, the verifiers); answer with `Verified`.
    Verify {
        /// The turn.
        turn: u32,
        /// The answer.
        answer: String,
        /// The call IDs it cites.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evidence: Vec<CallId>,
    },
    /// Append `events` atomically after `expected_version`; answer with `Committed` or
    /// `CommitFailed`.
    Commit {
        /// The seq of the last committed event the append extends (0 for none).
        expected_version: u64,
        /// The events, seq `expected_version + 1` onwards.
        events: Vec<Event>,
        /// The invocation's totals once these events are committed (for the store's index).
        totals: Totals,
    },
    /// The invocation has ended; nothing more will be asked.
    Finish(Outcome),
}
