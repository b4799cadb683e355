//! The turn state machine: `step(state, input) -> actions`.
//!
//! The I/O shell performs the [`Action`]s (call the model, ask policy, run tools, write
//! the log) and feeds what happened back as [`Input`]s. Nothing here blocks, sleeps,
//! reads a clock or touches the network; the current time is an argument.
//!
//! Ordering rules the machine enforces (ARCHITECTURE.md, "One turn, in order"):
//! - nothing executes before the decision is validated, budgeted, progress-checked and
//!   authorized;
//! - every call of an executed batch gets exactly one result, committed in call order;
//! - a turn is committed before the next `Decide` is emitted — no commit, no next turn;
//! - the end is committed too, and `Finish` is emitted exactly once per run (a run that
//!   stops for a human ends; the reply, committed by the shell, starts the next one from
//!   the log: [`Invocation::restore`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::catalog::ToolCatalog;
use crate::check::Check;
use crate::decision::{
    CallId, Decision, FinalAnswer, ProposedDecision, ToolCall, Usage, ValidBatch, validate,
};
use crate::event::{
    EndRecord, Event, EventBody, Refusal, Rejection, RejectionKind, TurnRecord, Wait,
};
use crate::limits::Limits;
use crate::outcome::{CallOutcome, CallResult, ErrorType, Outcome, Totals};
use crate::plan::ExecutionPlan;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

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
}

impl From<Verdict> for Authorization {
    fn from(verdict: Verdict) -> Authorization {
        Authorization {
            verdict,
            policy: None,
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

/// Protocol state: where the invocation is, and what it has used. Derived entirely from
/// the committed events, so a restored invocation has exactly the state of the live one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protocol {
    /// Seq of the last committed event (0 before the first).
    pub version: u64,
    /// What has been used.
    pub totals: Totals,
    /// Repair turns used after invalid decisions.
    pub decision_repairs_used: u32,
    /// Repair turns used after rejected answers.
    pub verification_repairs_used: u32,
    /// The last executed plan and how many times in a row it executed.
    pub last_plan: Option<(Fingerprint, u32)>,
    /// The turn whose write batch has started (`BatchStarted`) and whose `Turn` event is
    /// not committed yet.
    pub started: Option<u32>,
    /// A batch with writes has started in this invocation (it committed a
    /// `BatchStarted`): only then can the effect ledger have entries for it.
    pub wrote: bool,
    /// What humans did, once one replied. Boxed: most invocations never wait, and every
    /// running one keeps a protocol state (two while a batch starts).
    pub humans: Option<Box<Humans>>,
}

/// What humans did in an invocation, as its replies committed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Humans {
    /// A human approved the last turn's proposal: that turn is committed again, with the
    /// approved calls' results.
    pub reopened: bool,
    /// Time spent waiting for humans, in milliseconds.
    pub waited_ms: u64,
    /// Digests of proposals a human denied: none is put to a human again.
    pub denied: Vec<Fingerprint>,
}

impl Protocol {
    /// Whether a human denied `proposal` in this invocation.
    pub fn was_denied(&self, proposal: &Fingerprint) -> bool {
        self.humans
            .as_ref()
            .is_some_and(|humans| humans.denied.contains(proposal))
    }

    /// Time spent waiting for humans, in milliseconds.
    pub fn waited_ms(&self) -> u64 {
        self.humans.as_ref().map_or(0, |humans| humans.waited_ms)
    }

    fn reopened(&self) -> bool {
        self.humans.as_ref().is_some_and(|humans| humans.reopened)
    }

    /// The turn number a `Turn` or `BatchStarted` event must have next.
    fn next_turn(&self) -> u32 {
        if self.reopened() {
            self.totals.steps
        } else {
            self.totals.steps + 1
        }
    }
}

impl Protocol {
    /// Folds one committed event in.
    fn apply(&mut self, event: &Event) -> Result<(), RestoreError> {
        let expected = self.version + 1;
        if event.seq != expected {
            return Err(RestoreError::SeqGap {
                expected,
                found: event.seq,
            });
        }
        match &event.body {
            EventBody::BatchStarted(record) => {
                let expected = self.next_turn();
                if record.turn != expected || self.started.is_some() {
                    return Err(RestoreError::TurnGap {
                        expected,
                        found: record.turn,
                    });
                }
                if record.plan.is_none() {
                    return Err(RestoreError::MissingPlan(record.turn));
                }
                self.started = Some(record.turn);
                self.wrote = true;
            }
            EventBody::Turn(record) => {
                let expected = self.next_turn();
                if record.turn != expected {
                    return Err(RestoreError::TurnGap {
                        expected,
                        found: record.turn,
                    });
                }
                self.started = None;
                if let Some(humans) = &mut self.humans {
                    humans.reopened = false;
                }
                let totals = &mut self.totals;
                totals.steps = record.turn;
                totals.turn_events += 1;
                totals.input_tokens = totals
                    .input_tokens
                    .saturating_add(record.usage.input_tokens);
                totals.output_tokens = totals
                    .output_tokens
                    .saturating_add(record.usage.output_tokens);
                if let Some(cost) = record.usage.cost {
                    totals.cost = totals.cost.saturating_add(cost);
                }
                if !record.results.is_empty() {
                    let plan = record.plan.ok_or(RestoreError::MissingPlan(record.turn))?;
                    let executed = u32::try_from(record.results.len()).unwrap_or(u32::MAX);
                    totals.tool_calls = totals.tool_calls.saturating_add(executed);
                    self.last_plan = Some(match self.last_plan {
                        Some((last, streak)) if last == plan => (plan, streak + 1),
                        Some(_) | None => (plan, 1),
                    });
                }
                match record.rejection.as_ref().map(|r| r.kind) {
                    Some(RejectionKind::InvalidDecision) => self.decision_repairs_used += 1,
                    Some(RejectionKind::VerificationFailed) => self.verification_repairs_used += 1,
                    Some(RejectionKind::Stopped) | None => {}
                }
            }
            EventBody::Ended(_) => self.started = None,
            EventBody::ApprovalResolved(resolution) => {
                let humans = self.humans.get_or_insert_default();
                humans.waited_ms = humans.waited_ms.saturating_add(resolution.waited_ms);
                if resolution.approved {
                    humans.reopened = true;
                } else {
                    humans.denied.push(resolution.proposal);
                }
            }
            EventBody::ClarificationAnswered(answer) => {
                let humans = self.humans.get_or_insert_default();
                humans.waited_ms = humans.waited_ms.saturating_add(answer.waited_ms);
            }
        }
        self.version = event.seq;
        Ok(())
    }
}

/// A decision taken but not yet committed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Draft {
    turn: u32,
    decision: ProposedDecision,
    usage: Usage,
    /// A human approved this decision's calls (the turn is reopened).
    approved: bool,
    /// Its batch started before (`BatchStarted` is committed): restored to run again.
    started: bool,
    /// What policy said, once it judged the calls. Boxed: only invocations under
    /// policies have it, and every running one keeps a draft.
    checked: Option<Box<Checked>>,
}

/// What policy said about a draft's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Checked {
    /// The version of the policy set that judged them.
    policy: Option<String>,
    /// Calls refused at dispatch.
    refused: Vec<Refusal>,
}

impl Draft {
    fn new(turn: u32, decision: ProposedDecision, usage: Usage) -> Draft {
        Draft {
            turn,
            decision,
            usage,
            approved: false,
            started: false,
            checked: None,
        }
    }

    /// Whether its calls are about to be sent without the model deciding again (a
    /// human approved them, or their batch is resumed): policy checks them again, and a
    /// call it refuses is not sent.
    fn at_dispatch(&self) -> bool {
        self.approved || self.started
    }

    fn record(self, rejection: Option<Rejection>) -> TurnRecord {
        TurnRecord {
            turn: self.turn,
            decision: self.decision,
            usage: self.usage,
            plan: None,
            results: Vec::new(),
            rejection,
            policy: self.checked.and_then(|checked| checked.policy),
            checks: Vec::new(),
            tools: BTreeMap::new(),
        }
    }

    fn stopped(self, why: &str) -> EventBody {
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
enum Phase {
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
        /// Protocol state once the commit is durable.
        after: Protocol,
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
    Reconciling(Reconciling),
    Verifying {
        draft: Draft,
        answer: String,
    },
    Committing {
        /// Protocol state once the commit is durable.
        after: Protocol,
        /// The end the commit carries, if it ends the invocation.
        end: Option<EndRecord>,
    },
    Ended(Outcome),
}

/// A batch whose writes left outcomes unknown, waiting for the executors' records.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reconciling {
    draft: Draft,
    batch: ValidBatch,
    results: Vec<CallOutcome>,
    /// Positions of the calls still waiting for an answer.
    pending: Vec<usize>,
    /// The first call the executor could not reconcile, with what is known.
    unresolved: Option<(CallId, String)>,
}

impl Phase {
    fn name(&self) -> &'static str {
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

/// The terminal detail of a cancel that gave no reason.
pub(crate) const CANCELLED: &str = "cancelled by request";

/// Why a stop was requested.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stop {
    /// With the caller's reason (empty: none given).
    Cancelled(Box<str>),
    Deadline,
}

impl Stop {
    fn reason(&self) -> TerminalReason {
        match self {
            Stop::Cancelled(_) => TerminalReason::Cancelled,
            Stop::Deadline => TerminalReason::DeadlineExceeded,
        }
    }

    fn detail(&self) -> &str {
        match self {
            Stop::Cancelled(reason) if reason.is_empty() => CANCELLED,
            Stop::Cancelled(reason) => reason,
            Stop::Deadline => "the deadline passed",
        }
    }
}

type Refused = Box<(Phase, StepError)>;

/// One invocation's engine state: protocol state, plus the phase of the turn in flight.
#[derive(Debug, Clone)]
pub struct Invocation {
    limits: Limits,
    catalog: Arc<ToolCatalog>,
    protocol: Protocol,
    phase: Phase,
    /// A stop that arrived while calls or a commit were in flight; honoured as soon as
    /// they settle. Not durable: after a crash the shell asks again (the lease is revoked).
    /// Boxed: it is rare, and its reason would make every running invocation larger.
    stop: Option<Box<Stop>>,
}

impl Invocation {
    /// A new invocation with nothing committed. Feed it [`Input::Start`].
    pub fn new(limits: Limits, catalog: Arc<ToolCatalog>) -> Invocation {
        Invocation {
            limits,
            catalog,
            protocol: Protocol::default(),
            phase: Phase::Idle,
            stop: None,
        }
    }

    /// Rebuilds an invocation from its committed events, by the same fold the live path
    /// uses. An ended history gives an ended invocation, and so does one that waits for
    /// a human (the outcome of its run); otherwise, after a reply too, feed it
    /// [`Input::Start`] and it continues where the log stops: the first turn not
    /// committed, a started batch, or the calls a human approved.
    pub fn restore<'a>(
        limits: Limits,
        catalog: Arc<ToolCatalog>,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Invocation, RestoreError> {
        let mut invocation = Invocation::new(limits, catalog);
        // The end the invocation waits after, and the last turn (the one a reply resumes).
        let mut waiting: Option<&EndRecord> = None;
        let mut last_turn: Option<&TurnRecord> = None;
        for event in events {
            let bad = |why: &str| RestoreError::BadReply(event.seq, why.to_owned());
            match (&event.body, waiting) {
                (EventBody::ApprovalResolved(resolution), Some(end)) => {
                    if end.reason != TerminalReason::ApprovalRequired
                        || end.proposal != Some(resolution.proposal)
                    {
                        return Err(bad("not the pending proposal"));
                    }
                }
                (EventBody::ClarificationAnswered(_), Some(end)) => {
                    if end.reason != TerminalReason::ClarificationRequired {
                        return Err(bad("no question is pending"));
                    }
                }
                (EventBody::Ended(end), Some(_)) if !end.waits() => {}
                (_, Some(_)) => return Err(bad("the invocation waits for a human")),
                (EventBody::ApprovalResolved(_) | EventBody::ClarificationAnswered(_), None) => {
                    return Err(bad("nothing waits for a reply"));
                }
                (_, None) if matches!(invocation.phase, Phase::Ended(_)) => {
                    return Err(RestoreError::AfterEnd(event.seq));
                }
                (_, None) => {}
            }
            invocation.protocol.apply(event)?;
            waiting = None;
            invocation.phase = match &event.body {
                EventBody::Ended(end) => {
                    waiting = end.waits().then_some(end);
                    Phase::Ended(invocation.outcome_of(end))
                }
                EventBody::BatchStarted(record) => invocation.resuming(record)?,
                EventBody::Turn(record) => {
                    last_turn = Some(record);
                    Phase::Idle
                }
                EventBody::ApprovalResolved(resolution) if resolution.approved => {
                    let record = last_turn.ok_or_else(|| bad("no turn was approved"))?;
                    invocation.approved(record)?
                }
                EventBody::ApprovalResolved(_) | EventBody::ClarificationAnswered(_) => Phase::Idle,
            };
        }
        Ok(invocation)
    }

    /// The phase of a batch restored from its `BatchStarted` event.
    fn resuming(&self, record: &TurnRecord) -> Result<Phase, RestoreError> {
        let (mut draft, batch) = self.restored_batch(record)?;
        draft.started = true;
        // The batch of a reopened turn runs under its approval.
        draft.approved = self.protocol.reopened();
        Ok(Phase::Resuming { draft, batch })
    }

    /// The phase after a human approved the calls `record` proposed.
    fn approved(&self, record: &TurnRecord) -> Result<Phase, RestoreError> {
        let (mut draft, batch) = self.restored_batch(record)?;
        draft.approved = true;
        // Its tokens were counted when the turn was first committed.
        draft.usage = Usage::default();
        Ok(Phase::Approved { draft, batch })
    }

    /// The committed batch of `record`, validated again for this catalog.
    fn restored_batch(&self, record: &TurnRecord) -> Result<(Draft, ValidBatch), RestoreError> {
        let batch = record
            .batch(&self.catalog, &self.limits.bounds)
            .map_err(|why| RestoreError::InvalidStartedBatch(record.turn, why))?;
        let draft = Draft::new(record.turn, record.decision.clone(), record.usage);
        Ok((draft, batch))
    }

    /// When the invocation must stop, if ever: its deadline, moved on by the time it
    /// waited for humans unless its limits count that time too.
    pub fn deadline(&self) -> Option<UnixMillis> {
        let waited = if self.limits.wait_counts_toward_deadline {
            0
        } else {
            self.protocol.waited_ms()
        };
        self.limits
            .deadline
            .map(|deadline| deadline.saturating_add(waited))
    }

    /// Protocol state (version, totals, repairs, repeat tracking).
    pub fn protocol(&self) -> &Protocol {
        &self.protocol
    }

    /// The limits this invocation runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The outcome, once ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.phase {
            Phase::Ended(outcome) => Some(outcome),
            Phase::Idle
            | Phase::Deciding { .. }
            | Phase::Authorizing { .. }
            | Phase::Starting { .. }
            | Phase::Resuming { .. }
            | Phase::Approved { .. }
            | Phase::Executing { .. }
            | Phase::Reconciling(_)
            | Phase::Verifying { .. }
            | Phase::Committing { .. } => None,
        }
    }

    /// Whether a batch's calls are out (running, or their writes being reconciled): the
    /// turn ends with a commit of their results, which a drain waits for.
    pub fn is_executing(&self) -> bool {
        match &self.phase {
            Phase::Executing { .. } | Phase::Reconciling(_) => true,
            Phase::Idle
            | Phase::Deciding { .. }
            | Phase::Authorizing { .. }
            | Phase::Starting { .. }
            | Phase::Resuming { .. }
            | Phase::Approved { .. }
            | Phase::Verifying { .. }
            | Phase::Committing { .. }
            | Phase::Ended(_) => false,
        }
    }

    /// The name of the current phase, for logs and errors.
    pub fn phase_name(&self) -> &'static str {
        self.phase.name()
    }

    /// Advances the machine by one input at time `now`.
    ///
    /// On `Err` nothing changed: a late or duplicate input can be logged and dropped.
    pub fn step(&mut self, input: Input, now: UnixMillis) -> Result<Vec<Action>, StepError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match self.transition(phase, input, now) {
            Ok(actions) => Ok(actions),
            Err(refused) => {
                let (phase, error) = *refused;
                self.phase = phase;
                Err(error)
            }
        }
    }

    /// The transition table. Takes the phase by value so that in-flight payloads move
    /// instead of being cloned; a refusal hands the phase back untouched (boxed: it is the
    /// rare path and the phase is large).
    fn transition(
        &mut self,
        phase: Phase,
        input: Input,
        now: UnixMillis,
    ) -> Result<Vec<Action>, Refused> {
        match (phase, input) {
            (phase @ Phase::Ended(_), Input::Cancel { .. } | Input::Tick) => Ok(self.stay(phase)),
            (phase, Input::Cancel { reason }) => {
                Ok(self.request_stop(phase, Stop::Cancelled(reason.into())))
            }
            (phase, Input::Tick) if self.deadline_passed(now) => {
                Ok(self.request_stop(phase, Stop::Deadline))
            }
            (phase, Input::Tick) => Ok(self.stay(phase)),
            (Phase::Idle, Input::Start) => Ok(self.begin_turn(now)),
            (Phase::Resuming { draft, batch } | Phase::Approved { draft, batch }, Input::Start) => {
                Ok(self.authorize(draft, batch))
            }
            (
                Phase::Starting {
                    draft,
                    batch,
                    after,
                },
                Input::Committed,
            ) => {
                self.protocol = after;
                if self.stop.is_some() {
                    // Stopped while the start was being committed: nothing was sent.
                    let results = vec![CallOutcome::NotStarted; batch.calls.len()];
                    return Ok(self.commit_batch(draft, batch, results, None));
                }
                Ok(self.execute(draft, batch))
            }
            (Phase::Deciding { turn }, Input::Decided { decision, usage }) => {
                Ok(self.decided(Draft::new(turn, decision, usage), now))
            }
            (Phase::Deciding { .. }, Input::DecisionFailed { message }) => {
                Ok(self.end(Vec::new(), TerminalReason::ModelError, message, None, None))
            }
            (Phase::Authorizing { mut draft, batch }, Input::Authorized(authorization)) => {
                if let Some(policy) = authorization.policy {
                    draft.checked.get_or_insert_default().policy = Some(policy);
                }
                let verdict = authorization.verdict;
                if draft.at_dispatch() {
                    Ok(self.checked_at_dispatch(draft, batch, verdict, now))
                } else {
                    Ok(self.authorized(draft, batch, verdict, now))
                }
            }
            (
                Phase::Executing {
                    draft,
                    batch,
                    results,
                },
                Input::CallFinished { call_id, outcome },
            ) => self.call_finished(draft, batch, results, call_id, outcome),
            (Phase::Reconciling(waiting), Input::Reconciled { call_id, outcome }) => {
                self.reconciled(waiting, call_id, Ok(outcome))
            }
            (Phase::Reconciling(waiting), Input::ReconciliationFailed { call_id, detail }) => {
                self.reconciled(waiting, call_id, Err(detail))
            }
            (Phase::Verifying { draft, answer }, Input::Verified(verification)) => {
                Ok(self.verified(draft, answer, verification, now))
            }
            (Phase::Committing { after, end }, Input::Committed) => {
                Ok(self.committed(after, end, now))
            }
            (
                Phase::Committing { .. } | Phase::Starting { .. },
                Input::CommitFailed { message },
            ) => {
                // Nothing of the failed commit is applied: the log is as it was, and a
                // resume continues from the last event that is durable.
                let outcome = Outcome {
                    reason: TerminalReason::CheckpointFailed,
                    detail: message,
                    answer: None,
                    totals: self.protocol.totals,
                };
                self.phase = Phase::Ended(outcome.clone());
                Ok(vec![Action::Finish(outcome)])
            }
            (
                phase @ (Phase::Idle
                | Phase::Deciding { .. }
                | Phase::Authorizing { .. }
                | Phase::Starting { .. }
                | Phase::Resuming { .. }
                | Phase::Approved { .. }
                | Phase::Executing { .. }
                | Phase::Reconciling(_)
                | Phase::Verifying { .. }
                | Phase::Committing { .. }
                | Phase::Ended(_)),
                input @ (Input::Start
                | Input::Decided { .. }
                | Input::DecisionFailed { .. }
                | Input::Authorized(_)
                | Input::CallFinished { .. }
                | Input::Reconciled { .. }
                | Input::ReconciliationFailed { .. }
                | Input::Verified(_)
                | Input::Committed
                | Input::CommitFailed { .. }),
            ) => {
                let error = StepError::Unexpected {
                    input: input_name(&input),
                    phase: phase.name(),
                };
                Err(Box::new((phase, error)))
            }
        }
    }

    fn stay(&mut self, phase: Phase) -> Vec<Action> {
        self.phase = phase;
        Vec::new()
    }

    fn deadline_passed(&self, now: UnixMillis) -> bool {
        self.deadline().is_some_and(|deadline| now >= deadline)
    }

    /// At a turn boundary: stop if anything says so, else ask the model.
    fn begin_turn(&mut self, now: UnixMillis) -> Vec<Action> {
        let totals = self.protocol.totals;
        if let Some(stop) = self.stop.take() {
            return self.end_stopped(None, *stop);
        }
        if self.deadline_passed(now) {
            return self.end_stopped(None, Stop::Deadline);
        }
        if totals.steps >= self.limits.max_steps {
            let detail = format!(
                "{} turns taken, the budget is {}",
                totals.steps, self.limits.max_steps
            );
            return self.end(Vec::new(), TerminalReason::MaxSteps, detail, None, None);
        }
        let used = tokens_used(&totals);
        if let Some(max) = self.limits.max_tokens.filter(|max| used >= *max) {
            let detail = format!("{used} tokens used, the budget is {max}");
            return self.end(
                Vec::new(),
                TerminalReason::TokenBudgetExhausted,
                detail,
                None,
                None,
            );
        }
        if let Some(max) = self.limits.max_cost.filter(|max| totals.cost >= *max) {
            let detail = format!(
                "the cost budget is spent: {} used, the cost budget is {max}",
                totals.cost
            );
            return self.end(
                Vec::new(),
                TerminalReason::TokenBudgetExhausted,
                detail,
                None,
                None,
            );
        }
        let turn = totals.steps + 1;
        self.phase = Phase::Deciding { turn };
        vec![Action::Decide { turn }]
    }

    fn decided(&mut self, draft: Draft, now: UnixMillis) -> Vec<Action> {
        let after = tokens_used(&self.protocol.totals).saturating_add(draft.usage.total());
        if let Some(max) = self.limits.max_tokens.filter(|max| after > *max) {
            let detail =
                format!("this decision brings the tokens used to {after}, the budget is {max}");
            return self.stop(draft, TerminalReason::TokenBudgetExhausted, detail);
        }
        if let Some(max) = self.limits.max_cost {
            let Some(cost) = draft.usage.cost else {
                // Counting it as free would make the budget silently unlimited; the fix
                // is configuration (a price for the model), so this is the model's error.
                let detail = format!(
                    "the model reported no cost for this decision (it has no price), so the cost budget of {max} cannot be enforced"
                );
                return self.stop(draft, TerminalReason::ModelError, detail);
            };
            let after = self.protocol.totals.cost.saturating_add(cost);
            if after > max {
                let detail = format!(
                    "the cost budget is spent: this decision brings the cost to {after}, the cost budget is {max}"
                );
                return self.stop(draft, TerminalReason::TokenBudgetExhausted, detail);
            }
        }
        if self.deadline_passed(now) {
            return self.end_stopped(Some(draft), Stop::Deadline);
        }
        let decision = match validate(&draft.decision, &self.catalog, &self.limits.bounds) {
            Ok(decision) => decision,
            Err(error) => return self.reject(draft, error.to_string()),
        };
        match decision {
            Decision::Final(FinalAnswer { answer, evidence }) => {
                let turn = draft.turn;
                self.phase = Phase::Verifying {
                    draft,
                    answer: answer.clone(),
                };
                vec![Action::Verify {
                    turn,
                    answer,
                    evidence,
                }]
            }
            // A proposal for a human passes the same budget, progress and policy checks
            // as calls that would run at once: a human is never asked to approve what
            // could not run anyway.
            Decision::ToolCalls(batch) | Decision::RequestApproval { batch, .. } => {
                self.propose_batch(draft, batch)
            }
            Decision::Clarification(question) => self.wait(
                vec![EventBody::Turn(draft.record(None))],
                TerminalReason::ClarificationRequired,
                question,
                None,
                now,
            ),
            Decision::CannotContinue(reason) => self.end(
                vec![EventBody::Turn(draft.record(None))],
                TerminalReason::CannotContinue,
                reason,
                None,
                None,
            ),
        }
    }

    /// Budget and progress checks on a valid batch, then policy.
    fn propose_batch(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let used = self.protocol.totals.tool_calls;
        let proposed = u32::try_from(batch.calls.len()).unwrap_or(u32::MAX);
        if used.saturating_add(proposed) > self.limits.max_tool_calls {
            let detail = format!(
                "{proposed} calls proposed with {used} of {} used",
                self.limits.max_tool_calls
            );
            return self.stop(draft, TerminalReason::ToolBudgetExhausted, detail);
        }
        if let (Some(limit), Some((last, streak))) =
            (self.limits.max_repeated_plan, self.protocol.last_plan)
            && last == batch.fingerprint
            && streak >= limit.get()
        {
            let detail = format!("the same plan already ran {streak} time(s) in a row");
            return self.stop(draft, TerminalReason::NoProgress, detail);
        }
        if self.protocol.was_denied(&batch.fingerprint) {
            let message = format!(
                "a human denied exactly these calls (proposal {}) in this invocation; \
                 they will not be put to a human again: propose something else",
                batch.fingerprint
            );
            return self.reject(draft, message);
        }
        self.authorize(draft, batch)
    }

    /// Asks policy about a batch (again, at dispatch, for one a human approved).
    fn authorize(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let turn = draft.turn;
        let calls = batch.calls.clone();
        let approved = draft.approved.then_some(batch.fingerprint);
        self.phase = Phase::Authorizing { draft, batch };
        vec![Action::Authorize {
            turn,
            calls,
            approved,
        }]
    }

    fn authorized(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        verdict: Verdict,
        now: UnixMillis,
    ) -> Vec<Action> {
        // The model's summary, when it asked for a human itself.
        let summary = match &draft.decision {
            ProposedDecision::RequestApproval { summary, .. } => Some(summary.clone()),
            ProposedDecision::Final { .. }
            | ProposedDecision::ToolCalls { .. }
            | ProposedDecision::Clarification { .. }
            | ProposedDecision::CannotContinue { .. }
            | ProposedDecision::Unparseable { .. } => None,
        };
        match verdict {
            Verdict::Allow | Verdict::RequireApproval { .. } if self.deadline_passed(now) => {
                self.end_stopped(Some(draft), Stop::Deadline)
            }
            Verdict::Allow if let Some(summary) = summary => {
                let proposal = Some(batch.fingerprint);
                let turn = EventBody::Turn(draft.record(None));
                self.wait(
                    vec![turn],
                    TerminalReason::ApprovalRequired,
                    summary,
                    proposal,
                    now,
                )
            }
            Verdict::Allow => self.run_batch(draft, batch),
            Verdict::Deny { reason, refusals } => {
                self.reject_calls(draft, format!("denied by policy: {reason}"), refusals)
            }
            Verdict::RequireApproval { reason } => {
                let proposal = Some(batch.fingerprint);
                // What the model said it proposes, if it asked itself, else why policy asks.
                let detail = match summary {
                    Some(summary) => format!("{summary} (policy: {reason})"),
                    None => reason.clone(),
                };
                let turn = draft.stopped(&reason);
                self.wait(
                    vec![turn],
                    TerminalReason::ApprovalRequired,
                    detail,
                    proposal,
                    now,
                )
            }
        }
    }

    /// Policy's verdict on calls about to be sent without the model deciding again
    /// (approved, or a resumed batch): what it refuses now is not sent, and comes back
    /// as a `permission_denied` result; the rest runs.
    fn checked_at_dispatch(
        &mut self,
        mut draft: Draft,
        batch: ValidBatch,
        verdict: Verdict,
        now: UnixMillis,
    ) -> Vec<Action> {
        let refuse_all = |message: &str| -> Vec<Refusal> {
            batch
                .calls
                .iter()
                .map(|call| Refusal {
                    call_id: call.call_id.clone(),
                    error_type: ErrorType::PermissionDenied,
                    message: message.to_owned(),
                    policies: Vec::new(),
                })
                .collect()
        };
        let refused = match verdict {
            Verdict::Allow => Vec::new(),
            // The approval gate the human passed for exactly these calls.
            Verdict::RequireApproval { .. } if draft.approved => Vec::new(),
            // Gated since the batch started, and nobody approved it.
            Verdict::RequireApproval { reason } => refuse_all(&format!(
                "not sent: it now needs a human approval ({reason})"
            )),
            Verdict::Deny { reason, refusals } if refusals.is_empty() => {
                refuse_all(&format!("not sent: denied by policy at dispatch: {reason}"))
            }
            Verdict::Deny { refusals, .. } => refusals,
        };
        if !refused.is_empty() {
            draft.checked.get_or_insert_default().refused = refused;
        }
        if self.deadline_passed(now) {
            return if draft.started {
                self.request_stop(Phase::Resuming { draft, batch }, Stop::Deadline)
            } else {
                self.end_stopped(Some(draft), Stop::Deadline)
            };
        }
        if draft.started {
            // Its `BatchStarted` is committed already.
            self.execute(draft, batch)
        } else {
            self.run_batch(draft, batch)
        }
    }

    /// Runs an authorized batch: a batch with writes after its start is committed.
    fn run_batch(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let writes = batch.calls.iter().any(|call| {
            self.catalog
                .get(&call.tool)
                .is_some_and(|spec| spec.side_effect.writes())
        });
        if writes {
            self.start_batch(draft, batch)
        } else {
            self.execute(draft, batch)
        }
    }

    /// Commits `BatchStarted` before a batch with writes runs, so the batch survives a
    /// crash of this worker (see [`EventBody::BatchStarted`]).
    fn start_batch(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let mut record = draft.clone().record(None);
        record.plan = Some(batch.fingerprint);
        match self.stage(vec![EventBody::BatchStarted(record)]) {
            Ok((expected_version, events, after)) => {
                let totals = after.totals;
                self.phase = Phase::Starting {
                    draft,
                    batch,
                    after,
                };
                vec![Action::Commit {
                    expected_version,
                    events,
                    totals,
                }]
            }
            Err(actions) => actions,
        }
    }

    /// Runs an authorized batch.
    fn execute(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let turn = draft.turn;
        let plan = ExecutionPlan::for_calls(&batch.calls, &self.catalog);
        let calls = batch.calls.clone();
        let results = vec![None; calls.len()];
        let refused = draft
            .checked
            .as_ref()
            .map(|checked| checked.refused.clone())
            .unwrap_or_default();
        self.phase = Phase::Executing {
            draft,
            batch,
            results,
        };
        vec![Action::Execute {
            turn,
            calls,
            plan,
            refused,
        }]
    }

    /// An invalid decision: a repair turn if one is left, else `invalid_decision`.
    fn reject(&mut self, draft: Draft, message: String) -> Vec<Action> {
        self.reject_calls(draft, message, Vec::new())
    }

    /// A decision policy denied, with the calls it refused: as [`Invocation::reject`].
    fn reject_calls(
        &mut self,
        draft: Draft,
        message: String,
        refusals: Vec<Refusal>,
    ) -> Vec<Action> {
        let repair = self.protocol.decision_repairs_used < self.limits.decision_repairs;
        let rejection = Rejection {
            kind: RejectionKind::InvalidDecision,
            message,
            refusals,
        };
        let turn = draft.record(Some(rejection));
        self.repair_or_end(turn, TerminalReason::InvalidDecision, repair)
    }

    /// Commits a rejected decision's `turn`: as a repair turn (the model hears why and
    /// decides again) when `repair`, else together with the end `reason`.
    fn repair_or_end(
        &mut self,
        turn: TurnRecord,
        reason: TerminalReason,
        repair: bool,
    ) -> Vec<Action> {
        let message = turn
            .rejection
            .as_ref()
            .map(|rejection| rejection.message.clone())
            .unwrap_or_default();
        let turn = EventBody::Turn(turn);
        if repair {
            self.commit(vec![turn])
        } else {
            self.end(vec![turn], reason, message, None, None)
        }
    }

    fn call_finished(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        mut results: Vec<Option<CallOutcome>>,
        call_id: CallId,
        outcome: CallOutcome,
    ) -> Result<Vec<Action>, Refused> {
        let slot = match batch.calls.iter().position(|call| call.call_id == call_id) {
            None => Err(StepError::UnknownCall(call_id)),
            Some(index) if results[index].is_some() => Err(StepError::DuplicateResult(call_id)),
            Some(index) => Ok(index),
        };
        let index = match slot {
            Ok(index) => index,
            Err(error) => {
                let phase = Phase::Executing {
                    draft,
                    batch,
                    results,
                };
                return Err(Box::new((phase, error)));
            }
        };
        results[index] = Some(outcome);
        if results.iter().any(Option::is_none) {
            self.phase = Phase::Executing {
                draft,
                batch,
                results,
            };
            return Ok(Vec::new());
        }
        let results: Vec<CallOutcome> = results.into_iter().flatten().collect();
        Ok(self.batch_done(draft, batch, results))
    }

    /// Every call has its result. Writes whose outcome is unknown are reconciled before
    /// anything is committed; otherwise the turn is committed.
    fn batch_done(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        results: Vec<CallOutcome>,
    ) -> Vec<Action> {
        let pending: Vec<usize> = batch
            .calls
            .iter()
            .zip(&results)
            .enumerate()
            .filter(|(_, (call, outcome))| {
                matches!(outcome, CallOutcome::Unknown { .. })
                    && self
                        .catalog
                        .get(&call.tool)
                        .is_some_and(|spec| spec.side_effect.writes())
            })
            .map(|(index, _)| index)
            .collect();
        if pending.is_empty() {
            return self.commit_batch(draft, batch, results, None);
        }
        let turn = draft.turn;
        let calls = pending
            .iter()
            .map(|&index| batch.calls[index].clone())
            .collect();
        self.phase = Phase::Reconciling(Reconciling {
            draft,
            batch,
            results,
            pending,
            unresolved: None,
        });
        vec![Action::Reconcile { turn, calls }]
    }

    fn reconciled(
        &mut self,
        mut waiting: Reconciling,
        call_id: CallId,
        answer: Result<CallOutcome, String>,
    ) -> Result<Vec<Action>, Refused> {
        let Some(at) = waiting
            .pending
            .iter()
            .position(|&index| waiting.batch.calls[index].call_id == call_id)
        else {
            let error = StepError::NotReconciling(call_id);
            return Err(Box::new((Phase::Reconciling(waiting), error)));
        };
        let index = waiting.pending.swap_remove(at);
        match answer {
            Ok(outcome) => waiting.results[index] = outcome,
            Err(detail) => {
                waiting.unresolved.get_or_insert((call_id, detail));
            }
        }
        if !waiting.pending.is_empty() {
            self.phase = Phase::Reconciling(waiting);
            return Ok(Vec::new());
        }
        let Reconciling {
            draft,
            batch,
            results,
            unresolved,
            ..
        } = waiting;
        Ok(self.commit_batch(draft, batch, results, unresolved))
    }

    /// Commits an executed turn, ending the invocation if a call could not be reconciled
    /// or a stop is pending.
    fn commit_batch(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        results: Vec<CallOutcome>,
        unresolved: Option<(CallId, String)>,
    ) -> Vec<Action> {
        let mut record = draft.record(None);
        record.plan = Some(batch.fingerprint);
        record.tools = batch
            .calls
            .iter()
            .filter_map(|call| {
                let digest = self.catalog.get(&call.tool)?.digest?;
                Some((call.tool.clone(), digest))
            })
            .collect();
        record.results = batch
            .calls
            .into_iter()
            .zip(results)
            .map(|(call, outcome)| CallResult {
                call_id: call.call_id,
                outcome,
            })
            .collect();
        let turn = EventBody::Turn(record);
        match (unresolved, self.stop.take().map(|stop| *stop)) {
            (Some((call_id, detail)), _) => self.end(
                vec![turn],
                TerminalReason::ReconciliationRequired,
                format!(
                    "the outcome of call {call_id} is unknown and cannot be reconciled: {detail}"
                ),
                None,
                None,
            ),
            (None, Some(stop)) => self.end(
                vec![turn],
                stop.reason(),
                stop.detail().to_owned(),
                None,
                None,
            ),
            (None, None) => self.commit(vec![turn]),
        }
    }

    fn verified(
        &mut self,
        draft: Draft,
        answer: String,
        verification: Verification,
        now: UnixMillis,
    ) -> Vec<Action> {
        match verification {
            Verification::Accepted { .. } if self.deadline_passed(now) => {
                self.end_stopped(Some(draft), Stop::Deadline)
            }
            // The checks go with the end, which the same commit carries: the log says
            // once what accepted the answer.
            Verification::Accepted { checks } => {
                let turn = draft.record(None);
                self.commit(vec![
                    EventBody::Turn(turn),
                    EventBody::Ended(EndRecord {
                        reason: TerminalReason::Completed,
                        detail: String::new(),
                        answer: Some(answer),
                        proposal: None,
                        wait: None,
                        accepted_by: checks,
                    }),
                ])
            }
            Verification::Rejected { reason, checks } => {
                let repair =
                    self.protocol.verification_repairs_used < self.limits.verification_repairs;
                let rejection = Rejection {
                    kind: RejectionKind::VerificationFailed,
                    message: reason,
                    refusals: Vec::new(),
                };
                let mut turn = draft.record(Some(rejection));
                turn.checks = checks;
                self.repair_or_end(turn, TerminalReason::VerificationFailed, repair)
            }
        }
    }

    /// A cancel or the deadline. What is in flight decides how soon it takes effect:
    /// running calls are cancelled and their results still committed; a pending commit
    /// finishes first; anything else ends now.
    fn request_stop(&mut self, phase: Phase, stop: Stop) -> Vec<Action> {
        if self.stop.is_some() {
            return self.stay(phase);
        }
        match phase {
            Phase::Idle | Phase::Deciding { .. } => self.end_stopped(None, stop),
            // Checked again before a resumed batch runs: writes of it may have been sent
            // before the crash, so it is settled as below.
            Phase::Authorizing { draft, batch } if draft.started => {
                self.request_stop(Phase::Resuming { draft, batch }, stop)
            }
            Phase::Authorizing { draft, .. }
            | Phase::Approved { draft, .. }
            | Phase::Verifying { draft, .. } => self.end_stopped(Some(draft), stop),
            // The start commit decides whether anything may run; see `Starting` +
            // `Committed`.
            Phase::Starting {
                draft,
                batch,
                after,
            } => {
                self.stop = Some(Box::new(stop));
                self.stay(Phase::Starting {
                    draft,
                    batch,
                    after,
                })
            }
            // Writes of the batch may have been sent before the crash: run it again with
            // its calls cancelled at once, so each one is settled (unsent ones come back
            // `not_started`, sent writes are reconciled) and its turn committed.
            Phase::Resuming { draft, batch } => {
                self.stop = Some(Box::new(stop));
                let turn = draft.turn;
                let mut actions = self.execute(draft, batch);
                actions.push(Action::CancelCalls { turn });
                actions
            }
            Phase::Executing {
                draft,
                batch,
                results,
            } => {
                self.stop = Some(Box::new(stop));
                let turn = draft.turn;
                self.phase = Phase::Executing {
                    draft,
                    batch,
                    results,
                };
                vec![Action::CancelCalls { turn }]
            }
            // Reconciling asks the executors' records, starts no side effect and is what
            // tells the truth about the turn: let it finish, then stop.
            phase @ Phase::Reconciling(_) => {
                self.stop = Some(Box::new(stop));
                self.stay(phase)
            }
            Phase::Committing { after, end } => {
                // Ending already? Then this stop changes nothing.
                if end.is_none() {
                    self.stop = Some(Box::new(stop));
                }
                self.stay(Phase::Committing { after, end })
            }
            phase @ Phase::Ended(_) => self.stay(phase),
        }
    }

    fn committed(
        &mut self,
        after: Protocol,
        end: Option<EndRecord>,
        now: UnixMillis,
    ) -> Vec<Action> {
        self.protocol = after;
        match end {
            Some(end) => {
                let outcome = self.outcome_of(&end);
                self.stop = None;
                self.phase = Phase::Ended(outcome.clone());
                vec![Action::Finish(outcome)]
            }
            None => self.begin_turn(now),
        }
    }

    fn outcome_of(&self, end: &EndRecord) -> Outcome {
        Outcome {
            reason: end.reason,
            detail: end.detail.clone(),
            answer: end.answer.clone(),
            totals: self.protocol.totals,
        }
    }

    /// Ends for a cancel or the deadline, recording the decision in flight if there is one.
    fn end_stopped(&mut self, draft: Option<Draft>, stop: Stop) -> Vec<Action> {
        let turn = draft.map(|draft| draft.stopped(stop.detail()));
        self.end(
            turn.into_iter().collect(),
            stop.reason(),
            stop.detail().to_owned(),
            None,
            None,
        )
    }

    /// Ends the invocation before `draft`'s decision is carried out: the turn is
    /// committed as stopped, with `detail` as why.
    fn stop(&mut self, draft: Draft, reason: TerminalReason, detail: String) -> Vec<Action> {
        self.end(vec![draft.stopped(&detail)], reason, detail, None, None)
    }

    fn end(
        &mut self,
        mut bodies: Vec<EventBody>,
        reason: TerminalReason,
        detail: String,
        answer: Option<String>,
        proposal: Option<Fingerprint>,
    ) -> Vec<Action> {
        bodies.push(EventBody::Ended(EndRecord {
            reason,
            detail,
            answer,
            proposal,
            wait: None,
            accepted_by: Vec::new(),
        }));
        self.commit(bodies)
    }

    /// Ends the run to wait for a human: its log holds all a resume needs (the turn in
    /// `bodies`, the proposal), and the wait is bounded by `limits.max_wait_ms`.
    fn wait(
        &mut self,
        mut bodies: Vec<EventBody>,
        reason: TerminalReason,
        detail: String,
        proposal: Option<Fingerprint>,
        now: UnixMillis,
    ) -> Vec<Action> {
        bodies.push(EventBody::Ended(EndRecord {
            reason,
            detail,
            answer: None,
            proposal,
            wait: Some(Wait {
                since: now,
                until: now.saturating_add(self.limits.max_wait_ms),
            }),
            accepted_by: Vec::new(),
        }));
        self.commit(bodies)
    }

    /// Hands events to the shell. The protocol state they lead to is computed now, by the
    /// same fold a restore uses, and takes effect only when the shell says they are durable.
    fn commit(&mut self, bodies: Vec<EventBody>) -> Vec<Action> {
        let (expected_version, events, after) = match self.stage(bodies) {
            Ok(staged) => staged,
            Err(actions) => return actions,
        };
        let end = events.iter().rev().find_map(|event| match &event.body {
            EventBody::Ended(end) => Some(end.clone()),
            EventBody::Turn(_)
            | EventBody::BatchStarted(_)
            | EventBody::ApprovalResolved(_)
            | EventBody::ClarificationAnswered(_) => None,
        });
        let totals = after.totals;
        self.phase = Phase::Committing { after, end };
        vec![Action::Commit {
            expected_version,
            events,
            totals,
        }]
    }
}

impl Invocation {
    /// Numbers events after the last committed one and computes the protocol state they
    /// lead to. `Err` carries the actions that end the invocation if they do not apply.
    fn stage(
        &mut self,
        bodies: Vec<EventBody>,
    ) -> Result<(u64, Vec<Event>, Protocol), Vec<Action>> {
        let expected_version = self.protocol.version;
        let events: Vec<Event> = bodies
            .into_iter()
            .zip(expected_version + 1..)
            .map(|(body, seq)| Event { seq, body })
            .collect();
        let mut after = self.protocol.clone();
        if let Err(error) = events.iter().try_for_each(|event| after.apply(event)) {
            // The events were built on this very state, so they always apply; if one did
            // not, that is an engine bug, surfaced as checkpoint_failed instead of a panic.
            let outcome = Outcome {
                reason: TerminalReason::CheckpointFailed,
                detail: format!("engine invariant broken: {error}"),
                answer: None,
                totals: self.protocol.totals,
            };
            self.phase = Phase::Ended(outcome.clone());
            return Err(vec![Action::Finish(outcome)]);
        }
        Ok((expected_version, events, after))
    }
}

fn tokens_used(totals: &Totals) -> u64 {
    totals.input_tokens.saturating_add(totals.output_tokens)
}

fn input_name(input: &Input) -> &'static str {
    match input {
        Input::Start => "start",
        Input::Decided { .. } => "decided",
        Input::DecisionFailed { .. } => "decision_failed",
        Input::Authorized(_) => "authorized",
        Input::CallFinished { .. } => "call_finished",
        Input::Reconciled { .. } => "reconciled",
        Input::ReconciliationFailed { .. } => "reconciliation_failed",
        Input::Verified(_) => "verified",
        Input::Committed => "committed",
        Input::CommitFailed { .. } => "commit_failed",
        Input::Cancel { .. } => "cancel",
        Input::Tick => "tick",
    }
}
