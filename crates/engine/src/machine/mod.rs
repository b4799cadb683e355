//! The turn state machine: `step(state, input) -> actions`.
//!
//! The I/O shell performs the [`Action`]s (call the model, ask policy, run tools, write
//! the log) and feeds what happened back as [`Input`]s. Nothing here blocks, sleeps,
//! reads a clock or touches the network; the current time is an argument.
//!
//! Ordering rules the machine enforces (ARCHITECTURE.md, "One turn, in order"):
//! - nothing executes before the decision is validated, budgeted, progress-checked and
//!   authorized;
//! - every call of an executed batch gets exactly one result, committed in call order;
//! - a turn is committed before the next `Decide` is emitted — no commit, no next turn;
//! - the end is committed too, and `Finish` is emitted exactly once per run (a run that
//!   stops for a human ends; the reply, committed by the shell, starts the next one from
//!   the log: [`Invocation::restore`]).
//!
//! The machine is split by what each part of a turn does: `input` and `action` are what
//! the shell and the engine say to each other, `protocol` is the state the log folds
//! into, `phase` is the turn in flight, and the rest are the transitions (`step`
//! dispatches to `decide`, `authorize`, `execute`, `verify`, `stop`, `commit`; `restore`
//! rebuilds from the log).

mod action;
mod authorize;
mod commit;
mod decide;
mod error;
mod execute;
mod input;
mod phase;
mod protocol;
mod restore;
mod step;
mod stop;
mod verify;

use std::sync::Arc;

use crate::catalog::ToolCatalog;
use crate::limits::Limits;
use crate::outcome::Outcome;
use crate::time::UnixMillis;

pub use action::Action;
pub use error::{RestoreError, StepError};
pub use input::{Authorization, Input, Judgement, Ruling, Verdict, Verification};
use phase::Phase;
pub use protocol::{Humans, Protocol};
pub(crate) use stop::CANCELLED;
use stop::Stop;

/// One invocation's engine state: protocol state, plus the phase of the turn in flight.
#[derive(Debug, Clone)]
pub struct Invocation {
    limits: Limits,
    catalog: Arc<ToolCatalog>,
    protocol: Protocol,
    phase: Phase,
    /// A stop that arrived while calls or a commit were in flight; honoured as soon as
    /// they settle. Not durable: after a crash the shell asks again (the lease is revoked).
    /// Boxed: it is rare, and its reason would make every running invocation larger.
    stop: Option<Box<Stop>>,
}

impl Invocation {
    /// A new invocation with nothing committed. Feed it [`Input::Start`].
    pub fn new(limits: Limits, catalog: Arc<ToolCatalog>) -> Invocation {
        Invocation {
            limits,
            catalog,
            protocol: Protocol::default(),
            phase: Phase::Idle,
            stop: None,
        }
    }

    /// When the invocation must stop, if ever: its deadline, moved on by the time it
    /// waited for humans unless its limits count that time too.
    pub fn deadline(&self) -> Option<UnixMillis> {
        let waited = if self.limits.wait_counts_toward_deadline {
            0
        } else {
            self.protocol.waited_ms()
        };
        self.limits
            .deadline
            .map(|deadline| deadline.saturating_add(waited))
    }

    /// Protocol state (version, totals, repairs, repeat tracking).
    pub fn protocol(&self) -> &Protocol {
        &self.protocol
    }

    /// The limits this invocation runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The outcome, once ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.phase {
            Phase::Ended(outcome) => Some(outcome),
            Phase::Idle
            | Phase::Deciding { .. }
            | Phase::Authorizing { .. }
            | Phase::Starting { .. }
            | Phase::Resuming { .. }
            | Phase::Approved { .. }
            | Phase::Executing { .. }
            | Phase::Reconciling(_)
            | Phase::Verifying { .. }
            | Phase::Committing { .. } => None,
        }
    }

    /// Whether a batch's calls are out (running, or their writes being reconciled): the
    /// turn ends with a commit of their results, which a drain waits for.
    pub fn is_executing(&self) -> bool {
        match &self.phase {
            Phase::Executing { .. } | Phase::Reconciling(_) => true,
            Phase::Idle
            | Phase::Deciding { .. }
            | Phase::Authorizing { .. }
            | Phase::Starting { .. }
            | Phase::Resuming { .. }
            | Phase::Approved { .. }
            | Phase::Verifying { .. }
            | Phase::Committing { .. }
            | Phase::Ended(_) => false,
        }
    }

    /// The name of the current phase, for logs and errors.
    pub fn phase_name(&self) -> &'static str {
        self.phase.name()
    }

    /// Advances the machine by one input at time `now`.
    ///
    /// On `Err` nothing changed: a late or duplicate input can be logged and dropped.
    pub fn step(&mut self, input: Input, now: UnixMillis) -> Result<Vec<Action>, StepError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match self.transition(phase, input, now) {
            Ok(actions) => Ok(actions),
            Err(refused) => {
                let (phase, error) = *refused;
                self.phase = phase;
                Err(error)
            }
        }
    }
}
