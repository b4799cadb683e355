//! Running an authorized batch: its start commit, the correlation of results by call ID,
//! the reconciliation of unknown writes, and the commit of the executed turn.

use crate::decision::{CallId, ValidBatch};
use crate::event::{EventBody, PendingInput};
use crate::outcome::{CallOutcome, CallResult};
use crate::plan::ExecutionPlan;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::{Draft, Earlier, Phase, Reconciling, Refused};
use super::stop::Asks;
use super::{Action, Invocation, StepError};

impl Invocation {
    /// Runs an authorized batch: a batch with writes to send is committed as started
    /// first.
    pub(super) fn run_batch(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let earlier = draft.earlier.as_deref();
        let writes = batch.calls.iter().enumerate().any(|(index, call)| {
            // A reopened turn sends only the call that asked.
            let sent = earlier.is_none_or(|earlier| earlier.results[index].is_none());
            sent && self
                .catalog
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

    /// Runs an authorized batch: all its calls, or, in a turn reopened by a person's
    /// answer to a tool's question, the call that asked, with the answer.
    pub(super) fn execute(&mut self, mut draft: Draft, batch: ValidBatch) -> Vec<Action> {
        let turn = draft.turn;
        let (results, calls, answer) = match draft.earlier.take() {
            Some(earlier) => {
                let Earlier { results, answer } = *earlier;
                let calls = batch
                    .calls
                    .iter()
                    .zip(&results)
                    .filter(|(_, result)| result.is_none())
                    .map(|(call, _)| call.clone())
                    .collect();
                (results, calls, Some(Box::new(answer)))
            }
            None => (vec![None; batch.calls.len()], batch.calls.clone(), None),
        };
        let plan = ExecutionPlan::for_calls(&calls, &self.catalog);
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
            answer,
        }]
    }

    pub(super) fn call_finished(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        mut results: Vec<Option<CallOutcome>>,
        call_id: CallId,
        outcome: CallOutcome,
        now: UnixMillis,
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
        Ok(self.batch_done(draft, batch, results, now))
    }

    /// Every call has its result. Writes whose outcome is unknown are reconciled before
    /// anything is committed; otherwise the turn is committed.
    fn batch_done(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        results: Vec<CallOutcome>,
        now: UnixMillis,
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
            return self.commit_batch(draft, batch, results, None, now);
        }
        let turn = draft.turn;
        let calls = pending
            .iter()
            .map(|&index| batch.calls[index].clone())
            .collect();
        self.phase = Phase::Reconciling(Box::new(Reconciling {
            draft,
            batch,
            results,
            pending,
            unresolved: None,
        }));
        vec![Action::Reconcile { turn, calls }]
    }

    pub(super) fn reconciled(
        &mut self,
        mut waiting: Box<Reconciling>,
        call_id: CallId,
        answer: Result<CallOutcome, String>,
        now: UnixMillis,
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
        } = *waiting;
        Ok(self.commit_batch(draft, batch, results, unresolved, now))
    }

    /// Commits an executed turn, ending the invocation if a call could not be reconciled
    /// or a stop is pending, or waiting for a person if a call asked one for input.
    pub(super) fn commit_batch(
        &mut self,
        draft: Draft,
        batch: ValidBatch,
        results: Vec<CallOutcome>,
        unresolved: Option<(CallId, String)>,
        now: UnixMillis,
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
        // The first call that asked a person: the others that asked wait their turn.
        let asking = batch
            .calls
            .iter()
            .zip(&results)
            .find_map(|(call, outcome)| {
                let CallOutcome::InputRequired(request) = outcome else {
                    return None;
                };
                Some((call, request))
            })
            .map(|(call, request)| {
                let input = PendingInput {
                    call_id: call.call_id.clone(),
                    tool: call.tool.clone(),
                    schema_json: request.schema_json.clone(),
                };
                (request.message.clone(), Box::new(input))
            });
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
        match (unresolved, self.stop.take().map(|stop| *stop), asking) {
            (Some((call_id, detail)), _, _) => self.end(
                vec![turn],
                TerminalReason::ReconciliationRequired,
                format!(
                    "the outcome of call {call_id} is unknown and cannot be reconciled: {detail}"
                ),
                None,
                None,
            ),
            (None, Some(stop), _) => self.end(
                vec![turn],
                stop.reason(),
                stop.detail().to_owned(),
                None,
                None,
            ),
            (None, None, Some((question, input))) => self.wait(
                vec![turn],
                TerminalReason::ClarificationRequired,
                question,
                Asks::Input(input),
                now,
            ),
            (None, None, None) => self.commit(vec![turn]),
        }
    }
}
