//! Verdicts on a final answer: what each acceptance rule and verifier said, as committed.
//!
//! The engine does not run checks (the shell asks policy and the verifiers); it records
//! their verdicts with the answer's turn, and with the end of a completed invocation, so
//! the log says why an answer was or was not trusted.

use serde::{Deserialize, Serialize};

/// Most effect-ledger entries an answer is checked against: an invocation with more
/// writes than this cannot complete (its answer fails closed), and policy refuses a
/// larger claim.
pub const MAX_CLAIM_EFFECTS: usize = 1024;

/// Most verifiers one final answer is put to (a profile names at most this many).
pub const MAX_PROFILE_VERIFIERS: usize = 8;

/// Who judged an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// One of the profile's acceptance rules.
    Rule,
    /// A verifier: an executor that looked at the data it owns.
    Verifier,
}

/// What a check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckVerdict {
    /// The answer is backed by what the check looked at.
    Accepted,
    /// The answer is not backed.
    Rejected,
    /// The check could not decide; counts as not accepted (fail closed).
    Undecided,
}

/// One check's verdict on a final answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// The rule's or the verifier's name.
    pub name: String,
    /// Rule or verifier.
    pub kind: CheckKind,
    /// What it decided.
    pub verdict: CheckVerdict,
    /// Why, when not accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// What the verdict rests on: call IDs, effect keys, a verifier's own references.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

impl Check {
    /// Whether this check accepted the answer.
    pub fn accepted(&self) -> bool {
        self.verdict == CheckVerdict::Accepted
    }
}
