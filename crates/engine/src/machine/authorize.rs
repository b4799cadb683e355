//! Policy's verdicts on a batch: when the model proposes it, and again at dispatch for
//! one a human approved or one resumed.

use crate::decision::{ProposedDecision, ValidBatch};
use crate::event::{EventBody, Refusal};
use crate::outcome::ErrorType;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

use super::phase::{Draft, Phase};
use super::stop::Asks;
use super::{Action, Invocation, Stop, Verdict};

impl Invocation {
    /// Asks policy about a batch (again, at dispatch, for one a human approved).
    pub(super) fn authorize(&mut self, draft: Draft, batch: ValidBatch) -> Vec<Action> {
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

    pub(super) fn authorized(
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
                let turn = EventBody::Turn(draft.record(None));
                self.wait(
                    vec![turn],
                    TerminalReason::ApprovalRequired,
                    summary,
                    Asks::Approval(batch.fingerprint),
                    now,
                )
            }
            Verdict::Allow => self.run_batch(draft, batch),
            Verdict::Deny { reason, refusals } => {
                self.reject_calls(draft, format!("denied by policy: {reason}"), refusals)
            }
            Verdict::RequireApproval { reason } => {
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
                    Asks::Approval(batch.fingerprint),
                    now,
                )
            }
        }
    }

    /// Policy's verdict on calls about to be sent without the model deciding again
    /// (approved, or a resumed batch): what it refuses now is not sent, and comes back
    /// as a `permission_denied` result; the rest runs.
    pub(super) fn checked_at_dispatch(
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
}
