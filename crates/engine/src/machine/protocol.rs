//! The protocol state and the fold of committed events into it, shared by the live path
//! (on commit) and by restore.

use std::num::NonZeroU32;

use crate::canonical::Fingerprint;
use crate::event::{Event, EventBody, RejectionKind};
use crate::outcome::{CallOutcome, Totals};

use super::RestoreError;

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
    /// One more than the calls of the last committed turn that finished (all but those
    /// that asked a person for input), if it ran calls: a reopened turn's commit counts
    /// only the calls it adds, and its plan once. One more, so that it takes four bytes
    /// and a running invocation's state stays as small as it was.
    pub finished_in_turn: Option<NonZeroU32>,
    /// What humans did, once one replied. Boxed: most invocations never wait, and every
    /// running one keeps a protocol state (two while a batch starts).
    pub humans: Option<Box<Humans>>,
}

/// What humans did in an invocation, as its replies committed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Humans {
    /// A human approved the last turn's proposal, or answered a question one of its
    /// calls asked: that turn is committed again, with the approved calls' results or the
    /// asking call's new one.
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

    pub(super) fn reopened(&self) -> bool {
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
    pub(super) fn apply(&mut self, event: &Event) -> Result<(), RestoreError> {
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
                let asked = record
                    .results
                    .iter()
                    .filter(|result| matches!(result.outcome, CallOutcome::InputRequired(_)))
                    .count();
                let finished = u32::try_from(record.results.len() - asked).unwrap_or(u32::MAX);
                // The same turn again (a human reopened it): what its first commit ran.
                let ran_before = if record.turn == self.totals.steps {
                    self.finished_in_turn.map(|n| n.get() - 1)
                } else {
                    None
                };
                self.finished_in_turn = (!record.results.is_empty())
                    .then(|| NonZeroU32::new(finished.saturating_add(1)))
                    .flatten();
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
                    let added = finished.saturating_sub(ran_before.unwrap_or(0));
                    totals.tool_calls = totals.tool_calls.saturating_add(added);
                    self.last_plan = Some(match self.last_plan {
                        // A reopened turn's plan ran once, whatever it sent again.
                        Some((last, streak)) if last == plan && ran_before.is_some() => {
                            (plan, streak)
                        }
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
                // A tool's question reopens its turn; the model's starts the next one.
                if answer.action.is_some() {
                    humans.reopened = true;
                }
            }
        }
        self.version = event.seq;
        Ok(())
    }
}
