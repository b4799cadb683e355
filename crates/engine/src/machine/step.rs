//! The transition table: which input each phase accepts, and where it goes.

use crate::outcome::{CallOutcome, Outcome};
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::{Draft, Phase, Refused};
use super::{Action, Input, Invocation, StepError, Stop};

impl Invocation {
    /// The transition table. Takes the phase by value so that in-flight payloads move
    /// instead of being cloned; a refusal hands the phase back untouched (boxed: it is the
    /// rare path and the phase is large).
    pub(super) fn transition(
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
                    mut draft,
                    batch,
                    after,
                },
                Input::Committed,
            ) => {
                self.protocol = *after;
                if self.stop.is_some() {
                    // Stopped while the start was being committed: nothing was sent.
                    let results = match draft.earlier.take() {
                        Some(earlier) => earlier
                            .results
                            .into_iter()
                            .map(|result| result.unwrap_or(CallOutcome::NotStarted))
                            .collect(),
                        None => vec![CallOutcome::NotStarted; batch.calls.len()],
                    };
                    return Ok(self.commit_batch(draft, batch, results, None, now));
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
                if !authorization.permits.is_empty() {
                    draft.checked.get_or_insert_default().permits = authorization.permits;
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
            ) => self.call_finished(draft, batch, results, call_id, outcome, now),
            (Phase::Reconciling(waiting), Input::Reconciled { call_id, outcome }) => {
                self.reconciled(waiting, call_id, Ok(outcome), now)
            }
            (Phase::Reconciling(waiting), Input::ReconciliationFailed { call_id, detail }) => {
                self.reconciled(waiting, call_id, Err(detail), now)
            }
            (Phase::Verifying { draft, answer }, Input::Verified(verification)) => {
                Ok(self.verified(draft, answer, verification, now))
            }
            (Phase::Committing { after, end }, Input::Committed) => {
                Ok(self.committed(*after, end, now))
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

    pub(super) fn stay(&mut self, phase: Phase) -> Vec<Action> {
        self.phase = phase;
        Vec::new()
    }
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
