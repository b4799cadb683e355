//! Rebuilding an invocation from its committed events.

use std::sync::Arc;

use crate::catalog::ToolCatalog;
use crate::decision::{Usage, ValidBatch};
use crate::event::{EndRecord, Event, EventBody, TurnRecord};
use crate::limits::Limits;
use crate::terminal::TerminalReason;

use super::phase::{Draft, Phase};
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
}
