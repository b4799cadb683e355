//! Evaluation of agentloop runs, judged by whole trajectories rather than final text:
//! which tools were called with which arguments, which writes the ledger applied (once,
//! and only allowed ones), how and when the run stopped, and what it cost.
//!
//! A suite is a set of case files ([`case`]); each run of a case is read from its
//! committed log and the effect ledger into a [`run::Run`] and judged against the case's
//! expectations; [`report`] aggregates the verdicts and renders them for people and for
//! CI. Running the cases is the command line's (`agentloop eval`): this crate does no I/O
//! beyond reading case files.

pub mod case;
pub mod report;
pub mod run;
