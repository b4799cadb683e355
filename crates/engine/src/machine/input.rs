//! What the shell tells the engine, with the verdicts it relays from policy and the
//! validators.

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::check::Check;
use crate::decision::{CallId, ProposedDecision, Usage};
use crate::event::{Permit, Refusal};
use crate::outcome::CallOutcome;

/// What the shell tells the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// Begin driving a new or restored invocation.
    Start,
    /// The model proposed a decision.
    Decided {
        /// The proposal, unvalidated.
        decision: ProposedDecision,
        /// What it cost.
        usage: Usage,
    },
    /// The model could not be asked or failed (after the adapter's own retries).
    DecisionFailed {
        /// What went wrong.
        message: String,
    },
    /// Policy's verdict on the batch of the last `Authorize`.
    Authorized(Authorization),
    /// One call of the executing batch finished, in whatever order calls finish.
    CallFinished {
        /// The call.
        call_id: CallId,
        /// Its result.
        outcome: CallOutcome,
    },
    /// The executor answered `Reconcile` for a call whose outcome was unknown.
    Reconciled {
        /// The call.
        call_id: CallId,
        /// What the executor's records say happened.
        outcome: CallOutcome,
    },
    /// The executor cannot tell whether a call's effect happened.
    ReconciliationFailed {
        /// The call.
        call_id: CallId,
        /// What is known.
        detail: String,
    },
    /// The validators' verdict on the answer of the last `Verify`.
    Verified(Verification),
    /// The events of the last `Commit` are durable.
    Committed,
    /// The events of the last `Commit` could not be made durable.
    CommitFailed {
        /// What went wrong.
        message: String,
    },
    /// The caller (or a revoked lease) asks the invocation to stop.
    Cancel {
        /// Why, as the caller said; the terminal detail (empty: a default one).
        reason: String,
    },
    /// Time passed; lets the engine enforce the deadline while it waits.
    Tick,
}

/// Policy's answer on a batch: its verdict, and which policy set gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authorization {
    /// The verdict.
    pub verdict: Verdict,
    /// The version of the policy set that judged the calls (none: no policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policies that permitted each allowed call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permits: Vec<Permit>,
}

impl From<Verdict> for Authorization {
    fn from(verdict: Verdict) -> Authorization {
        Authorization {
            verdict,
            policy: None,
            permits: Vec::new(),
        }
    }
}

/// Policy's whole judgement of a batch, as policy gives it to whoever asked: every
/// violation it found and the digest an approval must be bound to. The engine reads
/// less of it (an [`Authorization`]); the rest is for the callers of policy's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// Allow, deny or ask a human.
    pub ruling: Ruling,
    /// Why it is not a plain allow, call by call; a violation of the batch as a whole
    /// names no call.
    pub violations: Vec<Refusal>,
    /// The digest of the calls an approval is bound to, when one is needed.
    pub proposal: Option<Fingerprint>,
    /// The version of the policy set that judged (none: no policies).
    pub policy: Option<String>,
    /// The policies that permitted each allowed call (none: no policies).
    pub permits: Vec<Permit>,
}

/// What policy ruled of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling {
    /// Every call may run.
    Allow,
    /// The batch is refused.
    Deny,
    /// The batch may run only after a human approves it.
    RequireApproval,
}

impl Judgement {
    /// What the engine is told: the violations become one reason for the model, and a
    /// refused batch keeps the refusals of its calls.
    pub fn authorization(self) -> Authorization {
        let reason = || {
            let listed: Vec<String> = self
                .violations
                .iter()
                .map(|v| format!("call {}: {}", v.call_id.as_str(), v.message))
                .collect();
            if listed.is_empty() {
                "no reason given".to_owned()
            } else {
                listed.join("; ")
            }
        };
        let verdict = match self.ruling {
            Ruling::Allow => Verdict::Allow,
            Ruling::RequireApproval => Verdict::RequireApproval { reason: reason() },
            Ruling::Deny => {
                let reason = reason();
                let refusals = self
                    .violations
                    .into_iter()
                    .filter(|v| !v.call_id.as_str().is_empty())
                    .collect();
                Verdict::Deny { reason, refusals }
            }
        };
        Authorization {
            verdict,
            policy: self.policy,
            permits: self.permits,
        }
    }
}

/// Policy's verdict on a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every call may run.
    Allow,
    /// The batch is refused (schema violation, unauthorized).
    Deny {
        /// Why, fed back to the model on a repair turn.
        reason: String,
        /// The refused calls, each with why (calls a batch-wide reason refuses are not
        /// listed).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        refusals: Vec<Refusal>,
    },
    /// The batch may run only after a human approves it.
    RequireApproval {
        /// Why approval is needed.
        reason: String,
    },
}

/// The verdict on a final answer: its acceptance rules' and verifiers'.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verification {
    /// Every check accepted the answer.
    Accepted {
        /// The checks that accepted it, with their evidence (committed with the end).
        checks: Vec<Check>,
    },
    /// The answer is not accepted.
    Rejected {
        /// Why, fed back to the model on a repair turn.
        reason: String,
        /// The checks that ran, accepted or not (none when nothing could be asked).
        checks: Vec<Check>,
    },
}
