//! The committed event log: what is durable, and all that a restore needs.
//!
//! The engine changes its protocol state only by applying committed events (see
//! [`crate::Invocation::restore`]), so the live path and a resume after a crash share
//! one piece of code and cannot drift apart.

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::decision::{ProposedDecision, Usage};
use crate::outcome::CallResult;
use crate::terminal::TerminalReason;

/// One committed event. `seq` starts at 1 and has no gaps within an invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the invocation's log.
    pub seq: u64,
    /// What happened.
    pub body: EventBody,
}

/// The kinds of committed event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventBody {
    /// A turn: the model's decision and everything it caused.
    Turn(TurnRecord),
    /// A batch with writes is about to run: its turn's decision (with `plan` set and no
    /// results), committed before the first write is sent. A worker that takes over
    /// after a crash finishes this batch, settling each write from the effect ledger and
    /// the executor's records, instead of asking the model again. The turn's `Turn`
    /// event follows with the results.
    BatchStarted(TurnRecord),
    /// The invocation ended. Always the last event.
    Ended(EndRecord),
}

/// One turn, committed whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Turn number, from 1.
    pub turn: u32,
    /// What the model proposed, as proposed (even when rejected).
    pub decision: ProposedDecision,
    /// Tokens the decision cost.
    pub usage: Usage,
    /// Fingerprint of the executed batch (present exactly when calls were executed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Fingerprint>,
    /// One result per call of the executed batch, in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<CallResult>,
    /// Why the decision was not carried out, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Rejection>,
}

/// Why a turn's decision was not carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The kind, which decides which repair budget it used.
    pub kind: RejectionKind,
    /// The message fed back to the model on a repair turn.
    pub message: String,
}

/// Kinds of rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// The decision broke the protocol or was denied by policy.
    InvalidDecision,
    /// The final answer failed verification.
    VerificationFailed,
    /// The invocation stopped instead (budget, progress, approval gate, cancel, deadline);
    /// the `Ended` event in the same commit says why.
    Stopped,
}

/// The end of an invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRecord {
    /// Why it ended.
    pub reason: TerminalReason,
    /// Human-readable detail.
    pub detail: String,
    /// The accepted answer, for `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The proposal an approval would cover, for `approval_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<Fingerprint>,
}
