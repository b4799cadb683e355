//! The life of one effect as the effect ledger keeps it: a pure transition function, so
//! the whole table can be tested exhaustively and the ledger's store only executes its
//! answers.
//!
//! ```text
//!   Prepare            Dispatch           Record(outcome)
//!  ─────────▶ PREPARED ────────▶ DISPATCHED ──────────────▶ COMMITTED | REJECTED | OUTCOME_UNKNOWN
//!                                    ▲                                                  │
//!                                    └──── Dispatch (reconcile found it NOT applied) ───┤
//!                                          Record(COMMITTED | REJECTED) (reconcile) ◀───┤
//!                                                                                       │
//!                      Record(RECONCILIATION_REQUIRED) (reconcile could not tell) ◀─────┘
//!                          │
//!                          ▼
//!               RECONCILIATION_REQUIRED ──── Record(COMMITTED | REJECTED) (operator) ──▶
//! ```
//!
//! Decisions worth knowing:
//!
//! - **Reconciliation is expressed by `expected_state = OUTCOME_UNKNOWN`.** The proto has
//!   no "this is a reconciliation" flag and needs none: an entry can only be in
//!   OUTCOME_UNKNOWN because its outcome was lost, and the only way out of that state is
//!   what the executor's reconcile answer justifies — `Record(COMMITTED | REJECTED)` when
//!   it could tell, or `Dispatch` (attempt + 1) when it found the change not applied.
//!   Recording OUTCOME_UNKNOWN again is refused: "still unknown" changes nothing; the
//!   worker records RECONCILIATION_REQUIRED instead and the invocation stops with
//!   `reconciliation_required`.
//! - **No `DISPATCHED -> DISPATCHED` re-dispatch.** A worker that lost the outcome of a
//!   dispatch cannot know whether the change was applied, so it must first record
//!   OUTCOME_UNKNOWN and reconcile; allowing a blind re-dispatch would let two workers
//!   (or one worker twice) apply the change twice with non-idempotent executors.
//! - **An effect the executor cannot reconcile is handed to an operator.** Recording
//!   RECONCILIATION_REQUIRED from OUTCOME_UNKNOWN flags it (the detail says why); it stays
//!   unresolved, and only `Record(COMMITTED | REJECTED)` guarded by RECONCILIATION_REQUIRED
//!   settles it — what the operator found in the executor's system. It is never
//!   dispatched again: the runtime has already shown it cannot tell whether the first
//!   dispatch took effect. It is a state rather than a flag beside OUTCOME_UNKNOWN so the
//!   same compare-and-set on the state guards it.
//! - **A prepared effect that will not be sent is `Record(REJECTED)`** (from PREPARED):
//!   its call was cancelled before dispatch, so it was not applied and never will be, and
//!   it should not stay listed as unresolved. Nothing else leaves PREPARED but `Dispatch`.
//! - Terminal states (COMMITTED, REJECTED) have no way out.

use std::fmt;

/// Where an effect is in its life (the stored form of `agentloop.v1.EffectState`,
/// without the wire-only `UNSPECIFIED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectState {
    /// Recorded before anything was sent to the executor.
    Prepared,
    /// Sent to the executor; the outcome is not known yet.
    Dispatched,
    /// The executor confirmed the change was applied.
    Committed,
    /// The executor confirmed the change was not applied and will not be.
    Rejected,
    /// Dispatched, but the outcome was lost; must be reconciled.
    OutcomeUnknown,
    /// Reconciliation could not tell; waits for an operator.
    ReconciliationRequired,
}

impl EffectState {
    /// Every state, for exhaustive tests.
    pub const ALL: [EffectState; 6] = [
        EffectState::Prepared,
        EffectState::Dispatched,
        EffectState::Committed,
        EffectState::Rejected,
        EffectState::OutcomeUnknown,
        EffectState::ReconciliationRequired,
    ];

    /// Whether a resuming worker must still look at this effect (what ListUnresolved
    /// returns).
    pub fn is_unresolved(self) -> bool {
        match self {
            EffectState::Prepared
            | EffectState::Dispatched
            | EffectState::OutcomeUnknown
            | EffectState::ReconciliationRequired => true,
            EffectState::Committed | EffectState::Rejected => false,
        }
    }

    /// The name used in storage and in error messages (the proto name without prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Prepared => "PREPARED",
            EffectState::Dispatched => "DISPATCHED",
            EffectState::Committed => "COMMITTED",
            EffectState::Rejected => "REJECTED",
            EffectState::OutcomeUnknown => "OUTCOME_UNKNOWN",
            EffectState::ReconciliationRequired => "RECONCILIATION_REQUIRED",
        }
    }

    /// Parses [`EffectState::as_str`]; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        EffectState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
    }

    /// The wire enum value.
    #[cfg(feature = "proto")]
    pub fn to_proto(self) -> agentloop_proto::v1::EffectState {
        use agentloop_proto::v1::EffectState as Wire;
        match self {
            EffectState::Prepared => Wire::Prepared,
            EffectState::Dispatched => Wire::Dispatched,
            EffectState::Committed => Wire::Committed,
            EffectState::Rejected => Wire::Rejected,
            EffectState::OutcomeUnknown => Wire::OutcomeUnknown,
            EffectState::ReconciliationRequired => Wire::ReconciliationRequired,
        }
    }

    /// The domain state of a wire value; `None` for `UNSPECIFIED`.
    #[cfg(feature = "proto")]
    pub fn from_proto(wire: agentloop_proto::v1::EffectState) -> Option<Self> {
        use agentloop_proto::v1::EffectState as Wire;
        match wire {
            Wire::Unspecified => None,
            Wire::Prepared => Some(EffectState::Prepared),
            Wire::Dispatched => Some(EffectState::Dispatched),
            Wire::Committed => Some(EffectState::Committed),
            Wire::Rejected => Some(EffectState::Rejected),
            Wire::OutcomeUnknown => Some(EffectState::OutcomeUnknown),
            Wire::ReconciliationRequired => Some(EffectState::ReconciliationRequired),
        }
    }
}

impl fmt::Display for EffectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a Record request may report; PREPARED and DISPATCHED are not outcomes, so a
/// request naming them is malformed (INVALID_ARGUMENT), not an illegal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Applied.
    Committed,
    /// Not applied and never will be.
    Rejected,
    /// Lost.
    OutcomeUnknown,
    /// Reconciliation could not tell; an operator must.
    ReconciliationRequired,
}

impl Outcome {
    /// Every outcome, for exhaustive tests.
    pub const ALL: [Outcome; 4] = [
        Outcome::Committed,
        Outcome::Rejected,
        Outcome::OutcomeUnknown,
        Outcome::ReconciliationRequired,
    ];

    /// The state an entry is in after this outcome is recorded.
    pub fn state(self) -> EffectState {
        match self {
            Outcome::Committed => EffectState::Committed,
            Outcome::Rejected => EffectState::Rejected,
            Outcome::OutcomeUnknown => EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired => EffectState::ReconciliationRequired,
        }
    }

    /// The outcome a state names, if it is one.
    pub fn from_state(state: EffectState) -> Option<Self> {
        match state {
            EffectState::Committed => Some(Outcome::Committed),
            EffectState::Rejected => Some(Outcome::Rejected),
            EffectState::OutcomeUnknown => Some(Outcome::OutcomeUnknown),
            EffectState::ReconciliationRequired => Some(Outcome::ReconciliationRequired),
            EffectState::Prepared | EffectState::Dispatched => None,
        }
    }
}

/// A change requested of an existing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// MarkDispatched: about to send (again) to the executor; attempt + 1.
    Dispatch,
    /// Record: the outcome of a dispatch, or of a reconciliation.
    Record(Outcome),
}

impl Action {
    /// Every action, for exhaustive tests.
    pub const ALL: [Action; 5] = [
        Action::Dispatch,
        Action::Record(Outcome::Committed),
        Action::Record(Outcome::Rejected),
        Action::Record(Outcome::OutcomeUnknown),
        Action::Record(Outcome::ReconciliationRequired),
    ];
}

/// The result of a legal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The state after the transition.
    pub next: EffectState,
    /// Whether the dispatch attempt counter goes up by one.
    pub increments_attempt: bool,
}

/// Why a transition was refused. Both map to FAILED_PRECONDITION: the request was
/// well-formed but the entry is not in a state that allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The caller's guard does not hold: someone else moved the entry.
    #[error("expected state {expected}, but the entry is {found}")]
    NotInExpectedState {
        /// What the caller expected.
        expected: EffectState,
        /// What is stored.
        found: EffectState,
    },
    /// No such edge in the life of an effect.
    #[error("illegal transition from {from} to {to}")]
    Illegal {
        /// The current state.
        from: EffectState,
        /// The state the action would lead to.
        to: EffectState,
    },
}

/// The state after `action`, or `None` if there is no such edge.
pub fn next_state(from: EffectState, action: Action) -> Option<EffectState> {
    match (from, action) {
        (EffectState::Prepared | EffectState::OutcomeUnknown, Action::Dispatch) => {
            Some(EffectState::Dispatched)
        }
        (
            EffectState::Dispatched,
            Action::Record(
                outcome @ (Outcome::Committed | Outcome::Rejected | Outcome::OutcomeUnknown),
            ),
        )
        | (
            EffectState::OutcomeUnknown,
            Action::Record(
                outcome
                @ (Outcome::Committed | Outcome::Rejected | Outcome::ReconciliationRequired),
            ),
        )
        | (
            EffectState::ReconciliationRequired,
            Action::Record(outcome @ (Outcome::Committed | Outcome::Rejected)),
        )
        // Abandoned before it was sent (the call was cancelled): it was not applied and
        // never will be.
        | (EffectState::Prepared, Action::Record(outcome @ Outcome::Rejected)) => {
            Some(outcome.state())
        }
        // A dispatch whose outcome was lost is first recorded OUTCOME_UNKNOWN and
        // reconciled; only a reconcile can conclude that an operator is needed.
        (EffectState::Dispatched, Action::Record(Outcome::ReconciliationRequired))
        | (EffectState::OutcomeUnknown, Action::Record(Outcome::OutcomeUnknown))
        | (
            EffectState::ReconciliationRequired,
            Action::Dispatch
            | Action::Record(Outcome::OutcomeUnknown | Outcome::ReconciliationRequired),
        )
        | (EffectState::Dispatched, Action::Dispatch)
        | (
            EffectState::Prepared,
            Action::Record(
                Outcome::Committed | Outcome::OutcomeUnknown | Outcome::ReconciliationRequired,
            ),
        )
        | (EffectState::Committed | EffectState::Rejected, Action::Dispatch | Action::Record(_)) => {
            None
        }
    }
}

/// The state the action aims at, for error messages about illegal transitions.
fn target(action: Action) -> EffectState {
    match action {
        Action::Dispatch => EffectState::Dispatched,
        Action::Record(outcome) => outcome.state(),
    }
}

/// Decides a guarded transition: `current` is what is stored, `expected` is the
/// caller's guard. The edge is checked first (a request that could never succeed is
/// reported as illegal whatever is stored), then the guard.
pub fn transition(
    current: EffectState,
    expected: EffectState,
    action: Action,
) -> Result<Step, TransitionError> {
    let next = next_state(expected, action).ok_or(TransitionError::Illegal {
        from: expected,
        to: target(action),
    })?;
    if current != expected {
        return Err(TransitionError::NotInExpectedState {
            expected,
            found: current,
        });
    }
    Ok(Step {
        next,
        increments_attempt: matches!(action, Action::Dispatch),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use EffectState::{
        Committed, Dispatched, OutcomeUnknown, Prepared, ReconciliationRequired, Rejected,
    };

    /// The whole table, written out: every (state, action) pair not listed is illegal.
    const LEGAL: [(EffectState, Action, EffectState); 10] = [
        (Prepared, Action::Dispatch, Dispatched),
        (Prepared, Action::Record(Outcome::Rejected), Rejected),
        (Dispatched, Action::Record(Outcome::Committed), Committed),
        (Dispatched, Action::Record(Outcome::Rejected), Rejected),
        (
            Dispatched,
            Action::Record(Outcome::OutcomeUnknown),
            OutcomeUnknown,
        ),
        (
            OutcomeUnknown,
            Action::Record(Outcome::Committed),
            Committed,
        ),
        (OutcomeUnknown, Action::Record(Outcome::Rejected), Rejected),
        (
            OutcomeUnknown,
            Action::Record(Outcome::ReconciliationRequired),
            ReconciliationRequired,
        ),
        (
            ReconciliationRequired,
            Action::Record(Outcome::Committed),
            Committed,
        ),
        (
            ReconciliationRequired,
            Action::Record(Outcome::Rejected),
            Rejected,
        ),
    ];
    const RECONCILED_REDISPATCH: (EffectState, Action, EffectState) =
        (OutcomeUnknown, Action::Dispatch, Dispatched);

    fn expected_next(from: EffectState, action: Action) -> Option<EffectState> {
        LEGAL
            .iter()
            .chain([&RECONCILED_REDISPATCH])
            .find(|(f, a, _)| *f == from && *a == action)
            .map(|(_, _, to)| *to)
    }

    #[test]
    fn table_is_exactly_the_documented_one() {
        let mut legal = 0;
        for from in EffectState::ALL {
            for action in Action::ALL {
                let got = next_state(from, action);
                assert_eq!(got, expected_next(from, action), "{from} + {action:?}");
                legal += usize::from(got.is_some());
            }
        }
        assert_eq!(legal, 11);
    }

    #[test]
    fn guarded_transition_matches_table_when_guard_holds() {
        for from in EffectState::ALL {
            for action in Action::ALL {
                match (transition(from, from, action), expected_next(from, action)) {
                    (Ok(step), Some(next)) => {
                        assert_eq!(step.next, next);
                        assert_eq!(step.increments_attempt, action == Action::Dispatch);
                    }
                    (Err(TransitionError::Illegal { from: f, to }), None) => {
                        assert_eq!(f, from);
                        assert_eq!(to, target(action));
                    }
                    (got, want) => panic!("{from} + {action:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn guard_mismatch_is_refused_even_for_a_legal_edge() {
        for current in EffectState::ALL {
            for expected in EffectState::ALL {
                for action in Action::ALL {
                    let got = transition(current, expected, action);
                    if current == expected {
                        continue;
                    }
                    match (got, next_state(expected, action)) {
                        (
                            Err(TransitionError::NotInExpectedState { expected: e, found }),
                            Some(_),
                        ) => {
                            assert_eq!((e, found), (expected, current));
                        }
                        (Err(TransitionError::Illegal { .. }), None) => {}
                        (got, _) => panic!("{current}/{expected} + {action:?}: {got:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn error_messages_name_both_states() {
        let illegal = transition(Committed, Committed, Action::Dispatch).unwrap_err();
        assert_eq!(
            illegal.to_string(),
            "illegal transition from COMMITTED to DISPATCHED"
        );
        let mismatch = transition(Dispatched, Prepared, Action::Dispatch).unwrap_err();
        assert_eq!(
            mismatch.to_string(),
            "expected state PREPARED, but the entry is DISPATCHED"
        );
    }

    #[test]
    fn names_round_trip_and_unresolved_is_the_non_terminal_set() {
        for state in EffectState::ALL {
            assert_eq!(EffectState::parse(state.as_str()), Some(state));
            #[cfg(feature = "proto")]
            assert_eq!(EffectState::from_proto(state.to_proto()), Some(state));
            assert_eq!(
                state.is_unresolved(),
                !matches!(state, Committed | Rejected)
            );
        }
        assert_eq!(EffectState::parse("prepared"), None);
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::from_state(outcome.state()), Some(outcome));
        }
    }
}
