//! What a final answer claims, as the runtime gathers it and policy's acceptance rules
//! and the verifiers judge it: the answer, the committed results it cites, and every
//! write of the invocation as the effect ledger holds it. The rules that judge a claim
//! are policy's; these are the values both sides read.

use std::time::SystemTime;

use agentloop_engine::{CallOutcome, Check};

use crate::EffectState;

/// A proposed final answer, with what it is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The invocation that proposed it.
    pub invocation_id: String,
    /// Who the invocation acts for.
    pub actor: String,
    /// The actor's tenant; a verifier looks only at this tenant's data.
    pub tenant: String,
    /// The task, in the caller's words.
    pub goal: String,
    /// The answer.
    pub answer: String,
    /// The call IDs it cites, as the model gave them.
    pub evidence: Vec<String>,
    /// The committed results of the cited calls the log holds.
    pub cited: Vec<Cited>,
    /// Every effect-ledger entry of the invocation.
    pub effects: Vec<Effect>,
}

/// The committed result of a cited call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cited {
    /// The call's ID.
    pub call_id: String,
    /// The turn that ran it.
    pub turn: u32,
    /// Its tool; empty when the turn's decision does not name the call.
    pub tool: String,
    /// Its arguments, as JSON text; empty likewise.
    pub arguments_json: String,
    /// Its result.
    pub outcome: CallOutcome,
}

/// What policy's acceptance rules said of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acceptance {
    /// Whether the rules accept it.
    pub accepted: bool,
    /// Why not, when they do not.
    pub reasons: Vec<String>,
    /// Each rule's check.
    pub checks: Vec<Check>,
    /// The profile's verifiers, to ask next.
    pub verifiers: Vec<String>,
}

/// An effect-ledger entry: one write, and what is known of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The invocation that made the write.
    pub invocation_id: String,
    /// The call that made it.
    pub call_id: String,
    /// Its effect key.
    pub effect_key: String,
    /// Dispatches so far.
    pub attempt: u32,
    /// The tool.
    pub tool: String,
    /// Where it is; `None` for a state this runtime does not know (a newer ledger's),
    /// which is never taken for one it may send from.
    pub state: Option<EffectState>,
    /// The executor's identifier of the applied change.
    pub receipt: String,
    /// Why it is where it is, for an operator.
    pub detail: String,
    /// When it was prepared.
    pub created_at: SystemTime,
    /// When it last moved.
    pub updated_at: SystemTime,
}

impl Effect {
    /// Whether it is the send of a call whose tool asked a person for input: it applied
    /// nothing, and an invocation goes on only by sending the call again with the answer
    /// (a write of its own), so no rule on writes counts it.
    pub fn superseded(&self) -> bool {
        self.state == Some(EffectState::Rejected) && self.detail == crate::settle::ASKED_FOR_INPUT
    }
}
