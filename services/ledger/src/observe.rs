//! What the ledger records of the effects it keeps: every move of an effect, by the
//! state it reached, and how many wait unresolved in each unresolved state.
//!
//! The moves are counted by the process that made them (sum them over the ledger's
//! replicas); the unresolved ones are counted in the database, so every replica on one
//! PostgreSQL database reports the same figures (take their maximum, not their sum).

use agentloop_telemetry::Telemetry;
use agentloop_telemetry::prometheus_client::encoding::EncodeLabelSet;
use agentloop_telemetry::prometheus_client::metrics::counter::Counter;
use agentloop_telemetry::prometheus_client::metrics::family::Family;
use agentloop_telemetry::prometheus_client::metrics::gauge::Gauge;

use crate::state::EffectState;

/// A state's label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

impl State {
    fn of(state: EffectState) -> State {
        let state = match state {
            EffectState::Prepared => "prepared",
            EffectState::Dispatched => "dispatched",
            EffectState::Committed => "committed",
            EffectState::Rejected => "rejected",
            EffectState::OutcomeUnknown => "outcome_unknown",
            EffectState::ReconciliationRequired => "reconciliation_required",
        };
        State { state }
    }
}

/// The ledger's effect metrics.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    moved: Family<State, Counter>,
    unresolved: Family<State, Gauge>,
}

impl Observed {
    pub(crate) fn new(telemetry: &Telemetry) -> Observed {
        let m = telemetry.metrics();
        Observed {
            moved: m.counters(
                "effect_transitions",
                "Effects this process moved, by the state they reached (prepared: recorded).",
            ),
            unresolved: m.gauges(
                "effects_unresolved",
                "Effects in the database that are not resolved yet, by state (the same on \
                 every replica of one database).",
            ),
        }
    }

    /// An effect reached `state`.
    pub(crate) fn moved(&self, state: EffectState) {
        self.moved.get_or_create(&State::of(state)).inc();
    }

    /// The database holds `counts` unresolved effects by state (a state absent has none).
    pub(crate) fn unresolved(&self, counts: &[(EffectState, u64)]) {
        for state in EffectState::ALL.into_iter().filter(|s| s.is_unresolved()) {
            let count = counts
                .iter()
                .find(|(counted, _)| *counted == state)
                .map_or(0, |(_, count)| *count);
            self.unresolved
                .get_or_create(&State::of(state))
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}
