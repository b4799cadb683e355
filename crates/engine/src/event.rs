//! The committed event log: what is durable, and all that a restore needs.
//!
//! The engine changes its protocol state only by applying committed events (see
//! [`crate::Invocation::restore`]), so the live path and a resume after a crash share
//! one piece of code and cannot drift apart.

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::catalog::{ToolCatalog, ToolDigests};
use crate::check::Check;
use crate::decision::{
    CallId, Decision, DecisionBounds, ProposedDecision, Usage, ValidBatch, validate,
};
use crate::outcome::{CallOutcome, CallResult, ErrorType, InputAction, NextAction, ToolError};
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

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
    /// The run ended. Always the last event, unless the end waits for a human
    /// ([`EndRecord::wait`]): then a resolution, or the final end of the wait (cancelled,
    /// its wait bound passed), follows.
    Ended(EndRecord),
    /// A human approved or denied the proposal the invocation waited for (it follows the
    /// waiting `Ended` event). An approval reopens the waiting turn: its approved calls
    /// run as proposed, without asking the model again, and the turn is committed again
    /// with their results. A denial runs nothing; the model hears of it in the next turn.
    ApprovalResolved(Resolution),
    /// A human answered the question the invocation waited for. The model's question:
    /// the next turn's model call sees it. A tool's question ([`EndRecord::input`]): the
    /// waiting turn is reopened, the call that asked is sent again with the answer, and
    /// the turn is committed again with its new result.
    ClarificationAnswered(Answer),
}

/// A human's verdict on a waiting proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The proposal resolved: the waiting end's, always.
    pub proposal: Fingerprint,
    /// Approved (run the calls) or denied (run nothing).
    pub approved: bool,
    /// Who resolved it.
    pub actor: String,
    /// The approver's words, for the model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub comment: String,
    /// How long the invocation waited, in milliseconds.
    pub waited_ms: u64,
}

/// A human's answer to a waiting question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The answer: words for the model, or, for a tool's question, the accepted content
    /// (a JSON object, as text; empty when declined or cancelled).
    pub answer: String,
    /// Who answered.
    pub actor: String,
    /// How long the invocation waited, in milliseconds.
    pub waited_ms: u64,
    /// Set exactly when a tool asked: what the person did with its question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<InputAction>,
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
    /// The version of the policy set that judged the turn's calls, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// For a refused final answer: what each acceptance rule and verifier said about it
    /// (an accepted answer's checks are its end's [`EndRecord::accepted_by`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// The contract version (descriptor digest) of each versioned tool the executed
    /// batch called, by name: what the calls ran under, kept so a resume and an audit
    /// know it without the gateway.
    #[serde(default, skip_serializing_if = "ToolDigests::is_empty")]
    pub tools: ToolDigests,
    /// The policies that permitted each call the policy set allowed, in call order:
    /// what an audit reads beside the refusals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permits: Vec<Permit>,
}

impl TurnRecord {
    /// The calls this turn's decision proposes (to run, or to put to a human), validated
    /// again against `catalog`: exactly the calls that run, with canonical arguments.
    /// `Err` says why the decision is not a valid batch.
    pub fn batch(
        &self,
        catalog: &ToolCatalog,
        bounds: &DecisionBounds,
    ) -> Result<ValidBatch, String> {
        match validate(&self.decision, catalog, bounds) {
            Ok(Decision::ToolCalls(batch) | Decision::RequestApproval { batch, .. }) => Ok(batch),
            Ok(_) => Err("it is not a batch of tool calls".into()),
            Err(error) => Err(error.to_string()),
        }
    }
}

/// Why a turn's decision was not carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The kind, which decides which repair budget it used.
    pub kind: RejectionKind,
    /// The message fed back to the model on a repair turn.
    pub message: String,
    /// The calls policy refused, each with why, when it refused calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
}

/// The policies that permitted one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permit {
    /// The call.
    pub call_id: CallId,
    /// The IDs of the satisfied permits (never their text).
    pub policies: Vec<String>,
}

/// One call trusted code refused to run: in a rejected turn (nothing ran), or at
/// dispatch (the call is not sent; its result is this refusal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The call.
    pub call_id: CallId,
    /// Why, by kind: `permission_denied` when the policies refuse it.
    pub error_type: ErrorType,
    /// What the model is told.
    pub message: String,
    /// The IDs of the deciding policies (never their text).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
}

impl Refusal {
    /// The result of a call refused at dispatch: the refusal, as an error that cannot
    /// be retried unchanged.
    pub fn outcome(&self) -> CallOutcome {
        CallOutcome::Error(ToolError {
            error_type: self.error_type,
            message: self.message.clone(),
            retryable: false,
            next_allowed_action: NextAction::None,
        })
    }
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
    /// Set when the run stopped to wait for a human (`approval_required`,
    /// `clarification_required`): the invocation is not over, a reply resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// For `completed`: the checks that accepted the answer, with their evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_by: Vec<Check>,
    /// For `clarification_required` when a tool asked (the question is the detail):
    /// which call, and the schema its answer must satisfy. Boxed: few ends have it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Box<PendingInput>>,
}

/// The call of the waiting turn that asked a person for input, and what it asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingInput {
    /// The call that asked.
    pub call_id: CallId,
    /// Its tool.
    pub tool: String,
    /// The JSON Schema (as JSON text) an accepted answer must satisfy.
    pub schema_json: String,
}

impl EndRecord {
    /// Whether this end waits for a human rather than ending the invocation.
    pub fn waits(&self) -> bool {
        self.wait.is_some()
    }
}

/// When a wait for a human began, and when it ends the invocation if nobody replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// When the run stopped to wait.
    pub since: UnixMillis,
    /// When the wait bound passes: then the invocation ends `deadline_exceeded`.
    pub until: UnixMillis,
}
