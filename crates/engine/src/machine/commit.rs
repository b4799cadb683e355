//! Handing events to the shell to commit, and what follows once they are durable.

use crate::event::{EndRecord, Event, EventBody};
use crate::outcome::Outcome;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::Phase;
use super::{Action, Invocation, Protocol};

impl Invocation {
    pub(super) fn committed(
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

    pub(super) fn outcome_of(&self, end: &EndRecord) -> Outcome {
        Outcome {
            reason: end.reason,
            detail: end.detail.clone(),
            answer: end.answer.clone(),
            totals: self.protocol.totals,
        }
    }

    /// Hands events to the shell. The protocol state they lead to is computed now, by the
    /// same fold a restore uses, and takes effect only when the shell says they are durable.
    pub(super) fn commit(&mut self, bodies: Vec<EventBody>) -> Vec<Action> {
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

    /// Numbers events after the last committed one and computes the protocol state they
    /// lead to. `Err` carries the actions that end the invocation if they do not apply.
    pub(super) fn stage(
        &mut self,
        bodies: Vec<EventBody>,
    ) -> Result<(u64, Vec<Event>, Box<Protocol>), Vec<Action>> {
        let expected_version = self.protocol.version;
        let events: Vec<Event> = bodies
            .into_iter()
            .zip(expected_version + 1..)
            .map(|(body, seq)| Event { seq, body })
            .collect();
        let mut after = Box::new(self.protocol.clone());
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
