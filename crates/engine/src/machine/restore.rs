//! Rebuilding an invocation from its committed events.

use std::sync::Arc;

use crate::catalog::ToolCatalog;
use crate::decision::{Usage, ValidBatch};
use crate::event::{Answer, EndRecord, Event, EventBody, PendingInput, TurnRecord};
use crate::limits::Limits;
use crate::outcome::{CallOutcome, CallResult, InputAnswer};
use crate::terminal::TerminalReason;

use super::phase::{Draft, Earlier, Phase};
use super::{Invocation, RestoreError};

impl Invocation {
    /// Rebuilds an invocation from its committed events, by the same fold the live path
    /// uses. An ended history gives an ended invocation, and so does one that waits for
    /// a human (the outcome of its run); otherwise, after a reply too, feed it
    /// [`Input::Start`](super::Input::Start) and it continues where the log stops: the
    /// first turn not committed, a started batch, or the calls a human approved.
    pub fn restore<'a>(
        limits: Limits,
        catalog: Arc<ToolCatalog>,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Invocation, RestoreError> {
        let mut invocation = Invocation::new(limits, catalog);
        // The end the invocation waits after, and the last turn (the one a reply resumes).
        let mut waiting: Option<&EndRecord> = None;
        let mut last_turn: Option<&TurnRecord> = None;
        // The turn a human approved, and what a reopened turn whose tool asked for input
        // had, until that turn is committed again.
        let mut approved_turn: Option<u32> = None;
        let mut earlier: Option<Earlier> = None;
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
                (EventBody::ClarificationAnswered(answer), Some(end)) => {
                    if end.reason != TerminalReason::ClarificationRequired {
                        return Err(bad("no question is pending"));
                    }
                    if answer.action.is_some() != end.input.is_some() {
                        return Err(bad("not an answer to the pending question"));
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
            let replied_to = waiting.take();
            invocation.phase = match &event.body {
                EventBody::Ended(end) => {
                    waiting = end.waits().then_some(end);
                    Phase::Ended(invocation.outcome_of(end))
                }
                EventBody::BatchStarted(record) => {
                    invocation.resuming(record, earlier.as_ref(), approved_turn)?
                }
                EventBody::Turn(record) => {
                    last_turn = Some(record);
                    earlier = None;
                    Phase::Idle
                }
                EventBody::ApprovalResolved(resolution) if resolution.approved => {
                    let record = last_turn.ok_or_else(|| bad("no turn was approved"))?;
                    approved_turn = Some(record.turn);
                    invocation.reopened(record, true, None)?
                }
                EventBody::ClarificationAnswered(answer) if answer.action.is_some() => {
                    let record = last_turn.ok_or_else(|| bad("no turn asked"))?;
                    let input = replied_to
                        .and_then(|end| end.input.as_deref())
                        .ok_or_else(|| bad("no tool asked"))?;
                    let reopened = invocation
                        .answered(record, input, answer, event.seq)
                        .map_err(bad)?;
                    // Under the approval its turn had, if any.
                    let approved = approved_turn == Some(record.turn);
                    let phase = invocation.reopened(record, approved, Some(reopened.clone()))?;
                    earlier = Some(reopened);
                    phase
                }
                EventBody::ApprovalResolved(_) | EventBody::ClarificationAnswered(_) => Phase::Idle,
            };
        }
        Ok(invocation)
    }

    /// The phase of a batch restored from its `BatchStarted` event.
    fn resuming(
        &self,
        record: &TurnRecord,
        earlier: Option<&Earlier>,
        approved_turn: Option<u32>,
    ) -> Result<Phase, RestoreError> {
        let (mut draft, batch) = self.restored_batch(record)?;
        draft.started = true;
        if self.protocol.reopened() {
            // Reopened by an answer to a tool's question: only the asking call is sent,
            // under the approval its turn had, if any.
            if let Some(earlier) = earlier {
                draft.earlier = Some(Box::new(earlier.clone()));
                draft.approved = approved_turn == Some(record.turn);
            } else {
                // Reopened by an approval: the batch runs under it.
                draft.approved = true;
            }
        }
        Ok(Phase::Resuming { draft, batch })
    }

    /// What a turn reopened by `answer` to the question `input` put had: its committed
    /// results, the asking call's slot empty for the answer to fill.
    fn answered(
        &self,
        record: &TurnRecord,
        input: &PendingInput,
        answer: &Answer,
        seq: u64,
    ) -> Result<Earlier, &'static str> {
        let action = answer.action.ok_or("no tool asked")?;
        let asked = |result: &CallResult| {
            result.call_id == input.call_id
                && matches!(result.outcome, CallOutcome::InputRequired(_))
        };
        if !record.results.iter().any(asked) {
            return Err("the call that asked has no question in its turn");
        }
        let results = record
            .results
            .iter()
            .map(|result| (!asked(result)).then(|| result.outcome.clone()))
            .collect();
        Ok(Earlier {
            results,
            answer: InputAnswer {
                call_id: input.call_id.clone(),
                action,
                content_json: answer.answer.clone(),
                seq,
            },
        })
    }

    /// The phase after a human replied to the turn `record`: approved its calls (then
    /// they run under the approval), or answered the question one of them asked (then
    /// that one is sent again with `earlier`'s answer, under the approval the turn had,
    /// if `approved`).
    fn reopened(
        &self,
        record: &TurnRecord,
        approved: bool,
        earlier: Option<Earlier>,
    ) -> Result<Phase, RestoreError> {
        let (mut draft, batch) = self.restored_batch(record)?;
        draft.approved = approved;
        // Its tokens were counted when the turn was first committed.
        draft.usage = Usage::default();
        draft.earlier = earlier.map(Box::new);
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
}
