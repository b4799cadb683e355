//! The effect protocol of agentloop, as pure tables: how an external write is recorded
//! so that a crash never repeats or loses one.
//!
//! - [`entry`]: the life of one effect as the effect ledger keeps it, a guarded
//!   transition function over its states. The ledger's store executes its answers.
//! - [`settle`]: the worker's side, what to do with a write from its entry's state and
//!   its executor's answer to `Reconcile`. The orchestrator executes its answers.
//!
//! Both sides live here, side by side, so that one test can hold that every transition
//! a worker records is one the ledger allows. Beside them, [`claim`]: the entry as
//! every side reads it, and what a final answer claims about the invocation's results
//! and writes. This crate does no I/O; with the `proto` feature it also names an
//! entry's states on the wire.

#![warn(missing_docs)]

pub mod claim;
pub mod entry;
pub mod settle;

pub use claim::{Acceptance, Cited, Claim, Effect};
pub use entry::{Action, EffectState, Outcome};
