//! How a worker settles a write, as decisions without I/O: what to do with a write whose
//! ledger entry was prepared, or found, in a given state; what to record after a send;
//! and how its executor's answer to `Reconcile` settles a write of unknown outcome, in a
//! running turn or at the engine's reconcile step. The orchestrator carries them out.
//!
//! The ledger's side is [`crate::entry`]. Every transition a worker records here is one
//! the ledger allows, and a write is sent only from `prepared`, or again when its
//! executor's own records say it was not applied: never blindly. The tests below walk
//! every entry state against every answer to hold both.

use agentloop_engine::{CallOutcome, ErrorType, NextAction, ToolError};

use crate::entry::{EffectState, Outcome};

/// What an executor's `Reconcile` said of an effect key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Applied: its output and its receipt.
    Applied {
        /// The call's output, as the executor gives it back.
        output_json: String,
        /// The executor's identifier of the change.
        receipt: String,
    },
    /// Not applied, by the executor's own records.
    NotApplied,
    /// It cannot tell, or could not be asked: why.
    Unknown(String),
}

/// What to do with a write whose ledger entry was prepared, or found, in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEntry {
    /// Never sent: mark it dispatched, then send it.
    Send,
    /// Sent, with no outcome recorded (its sender stopped mid-call): record
    /// `outcome_unknown`, then reconcile.
    MarkUnknownAndReconcile,
    /// Its outcome is unknown: reconcile.
    Reconcile,
    /// Applied: its output comes back from the executor's `Reconcile`.
    RecoverOutput,
    /// Not applied: the recorded reason is the call's result.
    Rejected,
    /// Waiting for an operator: the result is unknown, never a send.
    Unresolved,
}

/// What to do with a write met in `state`.
pub fn on_entry(state: EffectState) -> OnEntry {
    match state {
        EffectState::Prepared => OnEntry::Send,
        EffectState::Dispatched => OnEntry::MarkUnknownAndReconcile,
        EffectState::OutcomeUnknown => OnEntry::Reconcile,
        EffectState::Committed => OnEntry::RecoverOutput,
        EffectState::Rejected => OnEntry::Rejected,
        EffectState::ReconciliationRequired => OnEntry::Unresolved,
    }
}

/// A ledger transition to record: an outcome, with the executor's receipt and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The outcome, which is the entry's next state.
    pub outcome: Outcome,
    /// The executor's identifier of an applied change.
    pub receipt: String,
    /// Why, for an operator.
    pub detail: String,
}

impl Recorded {
    /// Applied, with its receipt.
    pub fn committed(receipt: &str) -> Recorded {
        Recorded {
            outcome: Outcome::Committed,
            receipt: receipt.to_owned(),
            detail: String::new(),
        }
    }

    /// Not applied, and never will be.
    pub fn rejected(detail: &str) -> Recorded {
        Recorded::with(Outcome::Rejected, detail)
    }

    /// Lost.
    pub fn unknown(detail: &str) -> Recorded {
        Recorded::with(Outcome::OutcomeUnknown, detail)
    }

    fn with(outcome: Outcome, detail: &str) -> Recorded {
        Recorded {
            outcome,
            receipt: String::new(),
            detail: detail.to_owned(),
        }
    }
}

/// The detail of a write whose tool asked a person for input and applied nothing: the
/// call is sent again with the answer, as an effect of its own, so this entry is
/// superseded ([`crate::Effect::superseded`]).
pub const ASKED_FOR_INPUT: &str = "the tool asked a person for input and applied nothing";

/// What the ledger records, from `dispatched`, after a send that ended in `outcome`
/// (`receipt` is the executor's, for an applied write).
pub fn recorded_after_send(outcome: &CallOutcome, receipt: &str) -> Recorded {
    match outcome {
        CallOutcome::Output { .. } => Recorded::committed(receipt),
        CallOutcome::Error(error) => Recorded::rejected(&error.message),
        CallOutcome::Cancelled | CallOutcome::NotStarted => {
            Recorded::rejected("the executor answered that it did not start it")
        }
        // Sent again with the person's answer as a new effect (keyed by the answer).
        CallOutcome::InputRequired(_) => Recorded::rejected(ASKED_FOR_INPUT),
        CallOutcome::Unknown { detail } => Recorded::unknown(detail),
    }
}

/// The result of a write this worker neither sends nor records (one the ledger says was
/// applied, or one another worker moved on): the executor's output if it applied it,
/// else unknown, for the reason `otherwise` gives.
pub fn result_from_answer(answer: Answer, otherwise: String) -> CallOutcome {
    match answer {
        Answer::Applied { output_json, .. } => CallOutcome::Output { output_json },
        Answer::NotApplied | Answer::Unknown(_) => CallOutcome::Unknown { detail: otherwise },
    }
}

/// How a write of unknown outcome met again in a running turn (after a crash, a
/// takeover, a resume) goes on, from its executor's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum InTurn {
    /// Settled: record this (from `outcome_unknown`), if anything, and this is the result.
    /// A write nobody can tell about records nothing here: its result is `unknown`, and
    /// the engine's reconcile step asks again.
    Done {
        /// What to record, from `outcome_unknown`.
        recorded: Option<Recorded>,
        /// The call's result.
        outcome: CallOutcome,
    },
    /// Its executor says it was not applied: send it again (the dispatch records it).
    SendAgain,
}

/// [`InTurn`] from the executor's answer.
pub fn in_turn(answer: Answer) -> InTurn {
    match answer {
        Answer::Applied {
            output_json,
            receipt,
        } => InTurn::Done {
            recorded: Some(Recorded::committed(&receipt)),
            outcome: CallOutcome::Output { output_json },
        },
        Answer::NotApplied => InTurn::SendAgain,
        Answer::Unknown(detail) => InTurn::Done {
            recorded: None,
            outcome: CallOutcome::Unknown { detail },
        },
    }
}

/// The engine's reconcile step, after the turn's results are in: nothing is sent. What
/// to record (from `outcome_unknown`), and the call's result, or why nobody can tell
/// (the entry is then flagged for an operator). A write that was not applied becomes a
/// retryable error for the model.
pub fn at_reconcile(answer: Answer) -> (Recorded, Result<CallOutcome, String>) {
    match answer {
        Answer::Applied {
            output_json,
            receipt,
        } => (
            Recorded::committed(&receipt),
            Ok(CallOutcome::Output { output_json }),
        ),
        Answer::NotApplied => {
            let detail = "the executor's records show the effect was not applied";
            (
                Recorded::rejected(detail),
                Ok(CallOutcome::Error(ToolError {
                    error_type: ErrorType::Unavailable,
                    message: detail.into(),
                    retryable: true,
                    next_allowed_action: NextAction::Retry,
                })),
            )
        }
        Answer::Unknown(detail) => (
            Recorded::with(Outcome::ReconciliationRequired, &detail),
            Err(detail),
        ),
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::entry::{Action, next_state};
    use EffectState::{
        Committed, Dispatched, OutcomeUnknown, Prepared, ReconciliationRequired, Rejected,
    };

    fn applied() -> Answer {
        Answer::Applied {
            output_json: r#"{"ok":true}"#.into(),
            receipt: "r-2".into(),
        }
    }

    /// The ledger actions a worker takes, each with the state it expects the entry in.
    type Actions = Vec<(EffectState, Action)>;

    /// A row: a state, an answer (its index in [`answers`]), the ledger actions, whether
    /// the write is sent, the result's kind.
    type Row = (
        EffectState,
        usize,
        &'static [(EffectState, Action)],
        bool,
        &'static str,
    );

    fn answers() -> [Answer; 3] {
        [
            applied(),
            Answer::NotApplied,
            Answer::Unknown("no record".into()),
        ]
    }

    /// What a worker does in a turn with a write met in `state` whose executor answers
    /// `answer` (and whose send, if any, is applied): the ledger actions it takes, each
    /// with the state it expects, whether it sends, and the kind of the result. The
    /// orchestrator's `effects` carries out the same decisions.
    fn in_a_turn(state: EffectState, answer: Answer) -> (Actions, bool, &'static str) {
        let mut actions = Vec::new();
        let send = |actions: &mut Actions, from: EffectState| {
            actions.push((from, Action::Dispatch));
            let sent = CallOutcome::Output {
                output_json: "{}".into(),
            };
            let recorded = recorded_after_send(&sent, "r-1");
            actions.push((Dispatched, Action::Record(recorded.outcome)));
        };
        let reconcile = |actions: &mut Actions, answer: Answer| match in_turn(answer) {
            InTurn::Done { recorded, outcome } => {
                if let Some(recorded) = recorded {
                    actions.push((OutcomeUnknown, Action::Record(recorded.outcome)));
                }
                (false, outcome.kind())
            }
            InTurn::SendAgain => {
                send(actions, OutcomeUnknown);
                (true, "output")
            }
        };
        let (sends, result) = match on_entry(state) {
            OnEntry::Send => {
                send(&mut actions, Prepared);
                (true, "output")
            }
            OnEntry::MarkUnknownAndReconcile => {
                actions.push((Dispatched, Action::Record(Outcome::OutcomeUnknown)));
                reconcile(&mut actions, answer)
            }
            OnEntry::Reconcile => reconcile(&mut actions, answer),
            OnEntry::RecoverOutput => (false, result_from_answer(answer, "x".into()).kind()),
            OnEntry::Rejected => (false, "error"),
            OnEntry::Unresolved => (false, "unknown"),
        };
        (actions, sends, result)
    }

    #[test]
    fn every_state_against_every_answer() {
        use Action::{Dispatch, Record};
        use Outcome as O;
        let (a, n, u) = (0, 1, 2);
        // (state, answer, ledger actions, sent, result)
        let table: [Row; 18] = [
            (
                Prepared,
                a,
                &[(Prepared, Dispatch), (Dispatched, Record(O::Committed))],
                true,
                "output",
            ),
            (
                Prepared,
                n,
                &[(Prepared, Dispatch), (Dispatched, Record(O::Committed))],
                true,
                "output",
            ),
            (
                Prepared,
                u,
                &[(Prepared, Dispatch), (Dispatched, Record(O::Committed))],
                true,
                "output",
            ),
            (
                Dispatched,
                a,
                &[
                    (Dispatched, Record(O::OutcomeUnknown)),
                    (OutcomeUnknown, Record(O::Committed)),
                ],
                false,
                "output",
            ),
            (
                Dispatched,
                n,
                &[
                    (Dispatched, Record(O::OutcomeUnknown)),
                    (OutcomeUnknown, Dispatch),
                    (Dispatched, Record(O::Committed)),
                ],
                true,
                "output",
            ),
            (
                Dispatched,
                u,
                &[(Dispatched, Record(O::OutcomeUnknown))],
                false,
                "unknown",
            ),
            (
                OutcomeUnknown,
                a,
                &[(OutcomeUnknown, Record(O::Committed))],
                false,
                "output",
            ),
            (
                OutcomeUnknown,
                n,
                &[
                    (OutcomeUnknown, Dispatch),
                    (Dispatched, Record(O::Committed)),
                ],
                true,
                "output",
            ),
            (OutcomeUnknown, u, &[], false, "unknown"),
            (Committed, a, &[], false, "output"),
            (Committed, n, &[], false, "unknown"),
            (Committed, u, &[], false, "unknown"),
            (Rejected, a, &[], false, "error"),
            (Rejected, n, &[], false, "error"),
            (Rejected, u, &[], false, "error"),
            (ReconciliationRequired, a, &[], false, "unknown"),
            (ReconciliationRequired, n, &[], false, "unknown"),
            (ReconciliationRequired, u, &[], false, "unknown"),
        ];
        // Every pair is in the table once.
        for state in EffectState::ALL {
            for answer in 0..3 {
                let rows = table
                    .iter()
                    .filter(|row| row.0 == state && row.1 == answer)
                    .count();
                assert_eq!(rows, 1, "{state:?} x answer {answer}");
            }
        }
        for (state, answer, actions, sends, result) in table {
            let got = in_a_turn(state, answers()[answer].clone());
            assert_eq!(
                got,
                (actions.to_vec(), sends, result),
                "{state:?} x {:?}",
                answers()[answer]
            );
            // The ledger allows each action, from the state the one before left.
            let mut at = state;
            for (expected, action) in &got.0 {
                assert_eq!(
                    *expected, at,
                    "{state:?}: {action:?} expects where the entry is"
                );
                at = next_state(at, *action).unwrap_or_else(|| {
                    panic!("{state:?}: the ledger refuses {action:?} from {at:?}")
                });
            }
            // Sent only from `prepared`, or when the executor's records say not applied.
            assert_eq!(
                got.1,
                state == Prepared || (answer == n && matches!(state, Dispatched | OutcomeUnknown))
            );
        }
    }

    #[test]
    fn the_reconcile_step_records_what_the_ledger_allows_from_outcome_unknown() {
        let expected = [
            (applied(), Outcome::Committed, "output"),
            (Answer::NotApplied, Outcome::Rejected, "error"),
            (
                Answer::Unknown("no record".into()),
                Outcome::ReconciliationRequired,
                "none",
            ),
        ];
        for (answer, outcome, result) in expected {
            let (recorded, settled) = at_reconcile(answer.clone());
            assert_eq!(recorded.outcome, outcome, "{answer:?}");
            assert!(next_state(OutcomeUnknown, Action::Record(outcome)).is_some());
            assert_eq!(
                settled.as_ref().map(CallOutcome::kind).unwrap_or("none"),
                result,
                "{answer:?}"
            );
        }
        // Not applied is a retryable error for the model; cannot tell names why.
        let (_, settled) = at_reconcile(Answer::NotApplied);
        assert!(
            matches!(settled, Ok(CallOutcome::Error(ref e)) if e.retryable),
            "{settled:?}"
        );
        let (recorded, settled) = at_reconcile(Answer::Unknown("no record".into()));
        assert_eq!(recorded.detail, "no record");
        assert_eq!(settled, Err("no record".into()));
        let (recorded, _) = at_reconcile(applied());
        assert_eq!(recorded, Recorded::committed("r-2"));
    }

    #[test]
    fn a_send_is_recorded_by_its_outcome() {
        let output = CallOutcome::Output {
            output_json: "{}".into(),
        };
        assert_eq!(
            recorded_after_send(&output, "r-1"),
            Recorded::committed("r-1")
        );
        let error = CallOutcome::Error(ToolError {
            error_type: ErrorType::Rejected,
            message: "insufficient funds".into(),
            retryable: false,
            next_allowed_action: NextAction::None,
        });
        assert_eq!(
            recorded_after_send(&error, "r-1"),
            Recorded::rejected("insufficient funds")
        );
        let asked = CallOutcome::InputRequired(Box::new(agentloop_engine::InputRequest {
            message: "which account?".into(),
            schema_json: "{}".into(),
        }));
        for never in [
            CallOutcome::Cancelled,
            CallOutcome::NotStarted,
            asked.clone(),
        ] {
            assert_eq!(
                recorded_after_send(&never, "r-1").outcome,
                Outcome::Rejected
            );
        }
        let lost = CallOutcome::Unknown {
            detail: "reply lost".into(),
        };
        assert_eq!(
            recorded_after_send(&lost, ""),
            Recorded::unknown("reply lost")
        );
        // Whatever a send ends in, the ledger allows recording it from `dispatched`.
        for outcome in [
            output,
            error,
            CallOutcome::Cancelled,
            CallOutcome::NotStarted,
            asked,
            lost,
        ] {
            let recorded = recorded_after_send(&outcome, "");
            assert!(next_state(Dispatched, Action::Record(recorded.outcome)).is_some());
        }
    }
}
