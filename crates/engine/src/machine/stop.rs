//! Stops (a cancel, the deadline) and the ends of a run, for a stop, a terminal reason
//! or a wait for a human.

use crate::canonical::Fingerprint;
use crate::event::{EndRecord, EventBody, PendingInput, Wait};
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::{Draft, Phase};
use super::{Action, Invocation};

/// The terminal detail of a cancel that gave no reason.
pub(crate) const CANCELLED: &str = "cancelled by request";

/// What a waiting end puts to the human beside its detail.
pub(super) enum Asks {
    /// Nothing more: the model's question.
    Nothing,
    /// Approve the proposal with this digest.
    Approval(Fingerprint),
    /// Give a tool the input it asked for.
    Input(Box<PendingInput>),
}

/// Why a stop was requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stop {
    /// With the caller's reason (empty: none given).
    Cancelled(Box<str>),
    Deadline,
}

impl Stop {
    pub(super) fn reason(&self) -> TerminalReason {
        match self {
            Stop::Cancelled(_) => TerminalReason::Cancelled,
            Stop::Deadline => TerminalReason::DeadlineExceeded,
        }
    }

    pub(super) fn detail(&self) -> &str {
        match self {
            Stop::Cancelled(reason) if reason.is_empty() => CANCELLED,
            Stop::Cancelled(reason) => reason,
            Stop::Deadline => "the deadline passed",
        }
    }
}

impl Invocation {
    pub(super) fn deadline_passed(&self, now: UnixMillis) -> bool {
        self.deadline().is_some_and(|deadline| now >= deadline)
    }

    /// A cancel or the deadline. What is in flight decides how soon it takes effect:
    /// running calls are cancelled and their results still committed; a pending commit
    /// finishes first; anything else ends now.
    pub(super) fn request_stop(&mut self, phase: Phase, stop: Stop) -> Vec<Action> {
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

    /// Ends for a cancel or the deadline, recording the decision in flight if there is one.
    pub(super) fn end_stopped(&mut self, draft: Option<Draft>, stop: Stop) -> Vec<Action> {
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
    pub(super) fn stop(
        &mut self,
        draft: Draft,
        reason: TerminalReason,
        detail: String,
    ) -> Vec<Action> {
        self.end(vec![draft.stopped(&detail)], reason, detail, None, None)
    }

    pub(super) fn end(
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
            input: None,
        }));
        self.commit(bodies)
    }

    /// Ends the run to wait for a human: its log holds all a resume needs (the turn in
    /// `bodies`, the proposal, the tool's question), and the wait is bounded by
    /// `limits.max_wait_ms`.
    pub(super) fn wait(
        &mut self,
        mut bodies: Vec<EventBody>,
        reason: TerminalReason,
        detail: String,
        asks: Asks,
        now: UnixMillis,
    ) -> Vec<Action> {
        let (proposal, input) = match asks {
            Asks::Nothing => (None, None),
            Asks::Approval(proposal) => (Some(proposal), None),
            Asks::Input(input) => (None, Some(input)),
        };
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
            input,
        }));
        self.commit(bodies)
    }
}
