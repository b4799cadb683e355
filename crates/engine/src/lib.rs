//! The pure turn engine of agentloop.
//!
//! It decides *what happens next* in an invocation and nothing else: it validates the
//! model's proposals, enforces budgets and the repeat check, correlates tool results by
//! call ID, and says when to commit and when to stop. It performs no I/O, spawns no task
//! and reads no clock: the shell (the orchestrator, a test, a benchmark) carries out its
//! [`Action`]s and reports back with [`Input`]s.
//!
//! It is not a client of any service and knows no wire format: gRPC, SQL and Redis types
//! never appear here, so every transition can be tested with plain values.
//!
//! ```
//! use std::sync::Arc;
//! use agentloop_engine::*;
//!
//! let catalog = Arc::new(ToolCatalog::new().with("lookup", ToolSpec::read_only()));
//! let mut invocation = Invocation::new(Limits::default(), catalog);
//! let now = UnixMillis(0);
//! assert_eq!(invocation.step(Input::Start, now).unwrap(), vec![Action::Decide { turn: 1 }]);
//! let answer = ProposedDecision::Final { answer: "42".into(), evidence: vec![] };
//! let actions = invocation.step(Input::Decided { decision: answer, usage: Usage::default() }, now).unwrap();
//! assert_eq!(actions, vec![Action::Verify { turn: 1, answer: "42".into(), evidence: vec![] }]);
//! let accepted = Verification::Accepted { checks: vec![] };
//! let actions = invocation.step(Input::Verified(accepted), now).unwrap();
//! assert!(matches!(&actions[0], Action::Commit { expected_version: 0, events, .. } if events.len() == 2));
//! let actions = invocation.step(Input::Committed, now).unwrap();
//! let [Action::Finish(outcome)] = actions.as_slice() else { panic!("expected the end") };
//! assert_eq!(outcome.reason, TerminalReason::Completed);
//! ```
#![warn(missing_docs)]

mod canonical;
mod catalog;
mod check;
mod decision;
mod event;
mod human;
mod limits;
mod machine;
mod money;
mod outcome;
mod plan;
mod terminal;
mod time;

pub use canonical::{BadFingerprint, Fingerprint, canonical_json};
pub use catalog::{SideEffect, ToolCatalog, ToolDigest, ToolDigests, ToolSpec};
pub use check::{Check, CheckKind, CheckVerdict, MAX_CLAIM_EFFECTS, MAX_PROFILE_VERIFIERS};
pub use decision::{
    CallId, Decision, DecisionBounds, DecisionError, FinalAnswer, ProposedCall, ProposedDecision,
    ToolCall, Usage, ValidBatch, validate,
};
pub use event::{
    Answer, EndRecord, Event, EventBody, PendingInput, Permit, Refusal, Rejection, RejectionKind,
    Resolution, TurnRecord, Wait,
};
pub use human::{Reply, ReplyError, WaitEnd, end_wait, reply};
pub use limits::{DEFAULT_MAX_WAIT_MS, Limits};
pub use machine::{
    Action, Authorization, Humans, Input, Invocation, Judgement, Protocol, RestoreError, Ruling,
    StepError, Verdict, Verification,
};
pub use money::{BadUsd, MicroUsd};
pub use outcome::{
    CallOutcome, CallResult, ErrorType, InputAction, InputAnswer, InputRequest, NextAction,
    Outcome, ToolError, Totals,
};
pub use plan::ExecutionPlan;
pub use terminal::{TerminalReason, UnknownTerminalReason};
pub use time::{Clock, SystemClock, UnixMillis, nearest_rank};
