//! A turn's start and the model's decision: budgets, validation and progress checks, and
//! the repair turn or end when a decision is rejected.

use crate::decision::{Decision, FinalAnswer, ValidBatch, validate};
use crate::event::{EventBody, Refusal, Rejection, RejectionKind, TurnRecord};
use crate::outcome::Totals;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::{Draft, Phase};
use super::stop::Asks;
use super::{Action, Invocation, Stop};

impl Invocation {
    /// At a turn boundary: stop if anything says so, else ask the model.
    pub(super) fn begin_turn(&mut self, now: UnixMillis) -> Vec<Action> {
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

    pub(super) fn decided(&mut self, draft: Draft, now: UnixMillis) -> Vec<Action> {
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
                Asks::Nothing,
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

    /// An invalid decision: a repair turn if one is left, else `invalid_decision`.
    fn reject(&mut self, draft: Draft, message: String) -> Vec<Action> {
        self.reject_calls(draft, message, Vec::new())
    }

    /// A decision policy denied, with the calls it refused: as [`Invocation::reject`].
    pub(super) fn reject_calls(
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
    pub(super) fn repair_or_end(
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
}

fn tokens_used(totals: &Totals) -> u64 {
    totals.input_tokens.saturating_add(totals.output_tokens)
}
