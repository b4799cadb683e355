//! The validators' verdict on a final answer.

use crate::event::{EndRecord, EventBody, Rejection, RejectionKind};
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::Draft;
use super::{Action, Invocation, Stop, Verification};

impl Invocation {
    pub(super) fn verified(
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
                        input: None,
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
}
