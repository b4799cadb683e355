//! The turn in flight: its phase and the decision not yet committed.

use crate::catalog::ToolDigests;

use crate::decision::{CallId, ProposedDecision, Usage, ValidBatch};
use crate::event::{EndRecord, EventBody, Permit, Refusal, Rejection, RejectionKind, TurnRecord};
use crate::outcome::{CallOutcome, InputAnswer, Outcome};

use super::{Protocol, StepError};

/// A decision taken but not yet committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Draft {
    pub(super) turn: u32,
    pub(super) decision: ProposedDecision,
    pub(super) usage: Usage,
    /// A human approved this decision's calls (the turn is reopened).
    pub(super) approved: bool,
    /// Its batch started before (`BatchStarted` is committed): restored to run again.
    pub(super) started: bool,
    /// What policy said, once it judged the calls. Boxed: only invocations under
    /// policies have it, and every running one keeps a draft.
    pub(super) checked: Option<Box<Checked>>,
    /// Set when a person answered a tool's question of this (reopened) turn. Boxed, as
    /// `checked`.
    pub(super) earlier: Option<Box<Earlier>>,
}

/// A reopened turn whose tool asked a person: what its calls gave before, and the
/// answer the asking call is sent again with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Earlier {
    /// Each call's committed result, in call order; only the asking call's is empty.
    pub(super) results: Vec<Option<CallOutcome>>,
    /// The answer.
    pub(super) answer: InputAnswer,
}

/// What policy said about a draft's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Checked {
    /// The version of the policy set that judged them.
    pub(super) policy: Option<String>,
    /// Calls refused at dispatch.
    pub(super) refused: Vec<Refusal>,
    /// The policies that permitted each allowed call.
    pub(super) permits: Vec<Permit>,
}

impl Draft {
    pub(super) fn new(turn: u32, decision: ProposedDecision, usage: Usage) -> Draft {
        Draft {
            turn,
            decision,
            usage,
            approved: false,
            started: false,
            checked: None,
            earlier: None,
        }
    }

    /// Whether its calls are about to be sent without the model deciding again (a
    /// human approved them or answered one's question, or their batch is resumed):
    /// policy checks them again, and a call it refuses is not sent.
    pub(super) fn at_dispatch(&self) -> bool {
        self.approved || self.started || self.earlier.is_some()
    }

    pub(super) fn record(self, rejection: Option<Rejection>) -> TurnRecord {
        let mut record = TurnRecord {
            turn: self.turn,
            decision: self.decision,
            usage: self.usage,
            plan: None,
            results: Vec::new(),
            rejection,
            checks: Vec::new(),
            tools: ToolDigests::default(),
            permits: Vec::new(),
            policy: None,
        };
        if let Some(checked) = self.checked {
            record.policy = checked.policy;
            record.permits = checked.permits;
        }
        record
    }

    pub(super) fn stopped(self, why: &str) -> EventBody {
        EventBody::Turn(self.record(Some(Rejection {
            kind: RejectionKind::Stopped,
            message: why.to_owned(),
            refusals: Vec::new(),
        })))
    }
}

/// Where in the turn the invocation is. Business payloads in flight (the decision, the
/// results so far) live here until they are committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Deciding {
        turn: u32,
    },
    Authorizing {
        draft: Draft,
        batch: ValidBatch,
    },
    /// A batch with writes, authorized; its `BatchStarted` commit is in flight.
    Starting {
        draft: Draft,
        batch: ValidBatch,
        /// Protocol state once the commit is durable. Boxed here and in `Committing`, as
        /// the reconciling state is: every running invocation keeps a phase, mostly a
        /// small one, and the largest variant sets its size.
        after: Box<Protocol>,
    },
    /// Restored with a batch started and not committed: `Start` runs it again (each
    /// write settled from its ledger entry), without asking the model.
    Resuming {
        draft: Draft,
        batch: ValidBatch,
    },
    /// Restored after a human approved the last turn's calls: `Start` has policy check
    /// them again, then runs them, without asking the model.
    Approved {
        draft: Draft,
        batch: ValidBatch,
    },
    Executing {
        draft: Draft,
        batch: ValidBatch,
        results: Vec<Option<CallOutcome>>,
    },
    Reconciling(Box<Reconciling>),
    Verifying {
        draft: Draft,
        answer: String,
    },
    Committing {
        /// Protocol state once the commit is durable.
        after: Box<Protocol>,
        /// The end the commit carries, if it ends the invocation.
        end: Option<EndRecord>,
    },
    Ended(Outcome),
}

/// A batch whose writes left outcomes unknown, waiting for the executors' records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reconciling {
    pub(super) draft: Draft,
    pub(super) batch: ValidBatch,
    pub(super) results: Vec<CallOutcome>,
    /// Positions of the calls still waiting for an answer.
    pub(super) pending: Vec<usize>,
    /// The first call the executor could not reconcile, with what is known.
    pub(super) unresolved: Option<(CallId, String)>,
}

impl Phase {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Deciding { .. } => "deciding",
            Phase::Authorizing { .. } => "authorizing",
            Phase::Starting { .. } => "starting",
            Phase::Resuming { .. } => "resuming",
            Phase::Approved { .. } => "approved",
            Phase::Executing { .. } => "executing",
            Phase::Reconciling(_) => "reconciling",
            Phase::Verifying { .. } => "verifying",
            Phase::Committing { .. } => "committing",
            Phase::Ended(_) => "ended",
        }
    }
}

pub(super) type Refused = Box<(Phase, StepError)>;
