//! Tool calls at the edge: dispatching one call, retrying what may be retried, and the
//! effect-ledger protocol around every write.
//!
//! A write is recorded `prepared` before anything is sent and `dispatched` just before it
//! is; its outcome is recorded after. Preparing is idempotent on the effect key, so the
//! same call met again — after a crash, a takeover, a resumed turn — finds its entry and
//! goes where the entry says instead of being sent again:
//!
//! - `prepared`: never sent; send it now.
//! - `dispatched`: sent, and whoever sent it never recorded what happened (it died or was
//!   cut off mid-call): mark it `outcome_unknown` and reconcile.
//! - `outcome_unknown`: ask the executor (`Reconcile`). Applied: its answer is the result.
//!   Not applied: the executor's own records say so, so sending it again is not a blind
//!   retry. Cannot tell: the result is `unknown`, and the engine's reconcile step asks
//!   once more, then stops the invocation with `reconciliation_required` and the entry is
//!   flagged for an operator.
//! - `committed`: applied; the executor's `Reconcile` gives the output back.
//! - `rejected`: not applied; the recorded reason is the result.
//!
//! Retries follow the error class: a retryable error of a read-only or idempotent call is
//! sent again, a bounded number of times; a plain write is never sent twice by this code.
//!
//! The decisions above are `agentloop_effects::settle`, pure and tested there against the
//! ledger's own transitions; this module does the I/O they call for.

use std::time::Duration;

use agentloop_effects::EffectState;
use agentloop_effects::settle::{self, Answer, InTurn, OnEntry, Recorded};
use agentloop_engine::{
    CallId, CallOutcome, ErrorType, Input, InputAnswer, NextAction, Refusal, SideEffect, ToolCall,
    ToolDigest, ToolError,
};
use futures::future::join_all;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::ports::{Dispatch, Failure, FailureKind, NewEffect, Ports, Sent};

/// Sends of one read-only or idempotent call, the first included.
const SEND_ATTEMPTS: u32 = 3;
/// Pause before the first resend; doubled for each further one.
const RESEND_PAUSE: Duration = Duration::from_millis(50);
/// Attempts to record one ledger transition while the ledger is unreachable.
const RECORD_ATTEMPTS: u32 = 3;

/// One call of a batch, with what the runner knows about it.
pub(crate) struct Call<'a> {
    /// The tool gateway and the effect ledger (of the orchestrator's ports).
    pub(crate) ports: &'a Ports,
    pub(crate) invocation: Uuid,
    pub(crate) turn: u32,
    pub(crate) call: &'a ToolCall,
    pub(crate) side_effect: SideEffect,
    pub(crate) timeout_ms: u64,
    /// The tool's contract version the invocation plans under; the gateway refuses the
    /// call if the tool has changed since.
    pub(crate) digest: Option<ToolDigest>,
    /// Fired when the batch is cancelled: nothing new may start after it.
    pub(crate) token: &'a CancellationToken,
    /// Set when policy refused the call at dispatch: it is not sent (a write sent
    /// before is still settled from its ledger entry).
    pub(crate) refused: Option<&'a Refusal>,
    /// A person's answer to the question the call asked when it was sent before: it
    /// goes with the call, which is a new effect (its first send applied nothing).
    pub(crate) answer: Option<&'a InputAnswer>,
}

impl Call<'_> {
    /// Runs the call to its one result.
    pub(crate) async fn run(&self) -> CallOutcome {
        if self.side_effect.writes() {
            return self.write().await;
        }
        if let Some(refusal) = self.refused {
            return refusal.outcome();
        }
        if self.token.is_cancelled() {
            return CallOutcome::NotStarted;
        }
        self.send_retrying("", 1).await.outcome
    }

    fn key(&self) -> String {
        effect_key(
            self.invocation,
            self.turn,
            self.call,
            self.answer.map(|answer| answer.seq),
        )
    }

    /// Sends the call, again while the answer is a retryable error and the call may be
    /// repeated (read-only, or an idempotent write under the same effect key).
    async fn send_retrying(&self, effect_key: &str, attempt: u32) -> Sent {
        let sent = self.send(effect_key, attempt).await;
        self.resend_while_retryable(sent, effect_key, attempt).await
    }

    /// After a first send answered `sent`: sends again while the answer is a retryable
    /// error and the call may be repeated, [`SEND_ATTEMPTS`] sends in all.
    async fn resend_while_retryable(&self, mut sent: Sent, effect_key: &str, attempt: u32) -> Sent {
        let repeatable = match self.side_effect {
            SideEffect::ReadOnly | SideEffect::IdempotentWrite => true,
            SideEffect::Write => false,
        };
        let mut pause = RESEND_PAUSE;
        let mut sends = 1;
        loop {
            let retryable = matches!(&sent.outcome, CallOutcome::Error(error) if error.retryable);
            if !(repeatable && retryable) || sends == SEND_ATTEMPTS {
                return sent;
            }
            tokio::select! {
                () = self.token.cancelled() => return sent,
                () = tokio::time::sleep(pause) => {}
            }
            debug!(invocation = %self.invocation, call = %self.call.call_id, sends, "sending a retryable call again");
            pause *= 2;
            sends += 1;
            sent = self.send(effect_key, attempt).await;
        }
    }

    /// One send of the call, as the gateway is asked for it.
    fn dispatch_of<'k>(&'k self, effect_key: &'k str, attempt: u32) -> Dispatch<'k> {
        Dispatch {
            invocation: self.invocation,
            call: self.call,
            effect_key,
            attempt,
            timeout_ms: self.timeout_ms,
            digest: self.digest,
            answer: self.answer,
        }
    }

    /// One send through the gateway; dropping it (cancellation) drops the RPC, which
    /// cancels it at the executor.
    async fn send(&self, effect_key: &str, attempt: u32) -> Sent {
        let writes = self.side_effect.writes();
        let dispatch = self.dispatch_of(effect_key, attempt);
        let tools = &self.ports.tools;
        tokio::select! {
            biased;
            // A write may already have been applied, so its outcome is unknown and gets
            // reconciled, never assumed.
            () = self.token.cancelled() => Sent {
                outcome: if writes {
                    CallOutcome::Unknown { detail: "cancelled while in flight".into() }
                } else {
                    CallOutcome::Cancelled
                },
                receipt: String::new(),
            },
            result = tools.execute(dispatch) => match result {
                Ok(sent) => sent,
                Err(failure) => unanswered(writes, gateway_failed(&failure)),
            },
        }
    }

    /// A write, under the ledger protocol (module docs).
    async fn write(&self) -> CallOutcome {
        if self.token.is_cancelled() {
            // Not even prepared: nothing to record, nothing to settle.
            return CallOutcome::NotStarted;
        }
        let key = self.key();
        let prepared = self
            .ports
            .ledger
            .prepare(NewEffect {
                invocation: self.invocation,
                call_id: self.call.call_id.as_str(),
                effect_key: &key,
                tool: &self.call.tool,
            })
            .await;
        let entry = match prepared {
            Ok(entry) => entry,
            Err(failure) => {
                return not_sent(format!(
                    "the effect ledger did not record the write: {failure}"
                ));
            }
        };
        // A state this runtime does not know (a newer ledger's) is never a send.
        match entry.state.map_or(OnEntry::Unresolved, settle::on_entry) {
            OnEntry::Send => self.dispatch(&key, EffectState::Prepared).await,
            OnEntry::MarkUnknownAndReconcile => {
                let detail = "dispatched, and no outcome was recorded: the worker that sent it \
                              stopped or was cut off mid-call";
                self.record(&key, EffectState::Dispatched, Recorded::unknown(detail))
                    .await;
                self.reconcile_and_finish(&key).await
            }
            OnEntry::Reconcile => self.reconcile_and_finish(&key).await,
            OnEntry::RecoverOutput => settle::result_from_answer(
                ask(self.ports, self.call, &key).await,
                "the ledger says the write was applied, but its executor cannot give its \
                 output back"
                    .into(),
            ),
            OnEntry::Rejected => CallOutcome::Error(ToolError {
                error_type: ErrorType::Rejected,
                message: format!("the write was not applied: {}", entry.detail),
                retryable: false,
                next_allowed_action: NextAction::None,
            }),
            OnEntry::Unresolved => CallOutcome::Unknown {
                detail: entry.detail,
            },
        }
    }

    /// Marks the write dispatched (from `expected`), sends it, records the outcome.
    async fn dispatch(&self, key: &str, expected: EffectState) -> CallOutcome {
        if let Some(refusal) = self.refused {
            // Never sent (or found not applied): settled as not applied, for good.
            let detail = format!(
                "not sent: policy refused it at dispatch: {}",
                refusal.message
            );
            self.record(key, expected, Recorded::rejected(&detail))
                .await;
            return refusal.outcome();
        }
        if self.token.is_cancelled() {
            // Settled, so the entry does not stay listed as unresolved.
            let detail = if expected == EffectState::OutcomeUnknown {
                "not applied (its executor says so) and cancelled before it was sent again"
            } else {
                "cancelled before it was sent"
            };
            self.record(key, expected, Recorded::rejected(detail)).await;
            return CallOutcome::NotStarted;
        }
        let marked = self.ports.ledger.mark_dispatched(key, expected).await;
        let attempt = match marked {
            Ok(entry) => entry.attempt,
            // Someone else moved the entry since it was read: its outcome is theirs to
            // know, so this worker only asks.
            Err(failure) if failure.kind == FailureKind::FailedPrecondition => {
                return settle::result_from_answer(
                    ask(self.ports, self.call, key).await,
                    format!("another worker moved the effect: {}", failure.message),
                );
            }
            Err(failure) => {
                return not_sent(format!(
                    "the effect ledger did not record the dispatch: {failure}"
                ));
            }
        };
        let sent = self.send_retrying(key, attempt).await;
        let recorded = settle::recorded_after_send(&sent.outcome, &sent.receipt);
        self.record(key, EffectState::Dispatched, recorded).await;
        sent.outcome
    }

    /// An `outcome_unknown` write met again: the executor's answer settles it; a
    /// not-applied write is sent again (its entry says it never took effect).
    async fn reconcile_and_finish(&self, key: &str) -> CallOutcome {
        match settle::in_turn(ask(self.ports, self.call, key).await) {
            InTurn::Done { recorded, outcome } => {
                if let Some(recorded) = recorded {
                    self.record(key, EffectState::OutcomeUnknown, recorded)
                        .await;
                }
                outcome
            }
            InTurn::SendAgain => self.dispatch(key, EffectState::OutcomeUnknown).await,
        }
    }

    async fn record(&self, key: &str, expected: EffectState, recorded: Recorded) {
        record(self.ports, key, expected, recorded).await;
    }
}

/// The read-only calls of one stage (all under `token`), sent to the gateway as one
/// request: each call's first answer is what its own send would have been, and a call
/// answered with a retryable error is sent again on its own, as [`Call::run`] would.
/// The outcomes are in the order of `calls`.
pub(crate) async fn run_stage(
    ports: &Ports,
    token: &CancellationToken,
    calls: &[Call<'_>],
) -> Vec<CallOutcome> {
    if token.is_cancelled() {
        return calls.iter().map(|_| CallOutcome::NotStarted).collect();
    }
    let dispatches: Vec<Dispatch<'_>> = calls.iter().map(|call| call.dispatch_of("", 1)).collect();
    let answered = tokio::select! {
        biased;
        () = token.cancelled() => return calls.iter().map(|_| CallOutcome::Cancelled).collect(),
        answered = ports.tools.execute_stage(&dispatches) => answered,
    };
    // The stage's answers, or why none of them can be taken.
    let answers = match answered {
        Ok(answers) if answers.len() == calls.len() => Ok(answers),
        Ok(answers) => Err(format!(
            "the tool gateway answered {} calls of a stage of {}",
            answers.len(),
            calls.len()
        )),
        Err(failure) => Err(gateway_failed(&failure)),
    };
    let first: Vec<Sent> = match answers {
        Ok(answers) => answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|failure| unanswered(false, gateway_failed(&failure)))
            })
            .collect(),
        Err(detail) => calls
            .iter()
            .map(|_| unanswered(false, detail.clone()))
            .collect(),
    };
    join_all(
        calls.iter().zip(first).map(|(call, sent)| async move {
            call.resend_while_retryable(sent, "", 1).await.outcome
        }),
    )
    .await
}

/// What a call's outcome says when the gateway failed it instead of answering.
fn gateway_failed(failure: &Failure) -> String {
    format!("the tool gateway failed: {failure}")
}

/// The answer of a call that never came (the gateway failed, the transport broke). A
/// write may have been applied, so its outcome is unknown; a read is a retryable
/// unavailability.
fn unanswered(writes: bool, detail: String) -> Sent {
    let outcome = if writes {
        CallOutcome::Unknown { detail }
    } else {
        CallOutcome::Error(ToolError {
            error_type: ErrorType::Unavailable,
            message: detail,
            retryable: true,
            next_allowed_action: NextAction::Retry,
        })
    };
    Sent {
        outcome,
        receipt: String::new(),
    }
}

/// The engine's reconcile step for one write whose outcome is unknown: ask the executor,
/// record its answer in the ledger (flagging the effect for an operator when it cannot
/// tell), and turn it into the engine's input.
pub(crate) async fn reconcile(
    ports: &Ports,
    invocation: Uuid,
    turn: u32,
    call: &ToolCall,
    answered: Option<u64>,
) -> Input {
    let key = effect_key(invocation, turn, call, answered);
    let (recorded, settled) = settle::at_reconcile(ask(ports, call, &key).await);
    record(ports, &key, EffectState::OutcomeUnknown, recorded).await;
    let call_id: CallId = call.call_id.clone();
    match settled {
        Ok(outcome) => Input::Reconciled { call_id, outcome },
        Err(detail) => Input::ReconciliationFailed { call_id, detail },
    }
}

async fn ask(ports: &Ports, call: &ToolCall, key: &str) -> Answer {
    match ports.tools.reconcile(&call.tool, key).await {
        Ok(answer) => answer,
        Err(failure) => Answer::Unknown(format!("the executor could not be asked: {failure}")),
    }
}

/// Records a transition, retrying a bounded number of times while the ledger is
/// unreachable. A refusal (the entry moved on) or a ledger that stays down is logged and
/// left: the result still reaches the engine, and an entry left behind stays listed as
/// unresolved for an operator.
async fn record(ports: &Ports, key: &str, expected: EffectState, recorded: Recorded) {
    let mut pause = RESEND_PAUSE;
    for attempt in 1..=RECORD_ATTEMPTS {
        match ports.ledger.record(key, expected, &recorded).await {
            Ok(_) => return,
            Err(failure)
                if failure.kind == FailureKind::Unavailable && attempt < RECORD_ATTEMPTS =>
            {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(failure) => {
                warn!(effect_key = key, kind = ?failure.kind, message = %failure.message, "could not record an effect outcome");
                return;
            }
        }
    }
}

/// The result of a write that was not sent because the ledger could not record it first.
fn not_sent(message: String) -> CallOutcome {
    CallOutcome::Error(ToolError {
        error_type: ErrorType::Unavailable,
        message: format!("{message}; the write was not sent"),
        retryable: true,
        next_allowed_action: NextAction::Retry,
    })
}

/// The effect key of a write: stable for the same call of the same turn of the same
/// invocation, across retries, restarts and takeovers. Call IDs are only unique within a
/// batch, so the turn is part of the key; the tool and the exact arguments are too, so a
/// turn that is decided again after a crash with a *different* call under the same ID
/// gets a different key instead of being mistaken for the first.
pub(crate) fn effect_key(
    invocation_id: Uuid,
    turn: u32,
    call: &ToolCall,
    answered: Option<u64>,
) -> String {
    let mut hasher = Sha256::new();
    for part in [
        invocation_id.as_bytes().as_slice(),
        &turn.to_be_bytes(),
        call.call_id.as_str().as_bytes(),
        call.tool.as_bytes(),
        call.arguments_json.as_bytes(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    // The send of a call with a person's answer is an effect of its own; without one
    // the key is what it always was.
    if let Some(seq) = answered {
        hasher.update(8u64.to_be_bytes());
        hasher.update(seq.to_be_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            call_id: CallId::new(id),
            tool: "transfer".into(),
            arguments_json: args.into(),
        }
    }

    #[test]
    fn effect_keys_are_stable_and_tell_calls_apart() {
        let invocation = Uuid::from_u128(7);
        let key = effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#), None);
        assert_eq!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#), None)
        );
        assert_eq!(key.len(), 64);
        assert_ne!(
            key,
            effect_key(invocation, 2, &call("c1", r#"{"amount":5}"#), None)
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c2", r#"{"amount":5}"#), None)
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":6}"#), None)
        );
        assert_ne!(
            key,
            effect_key(Uuid::from_u128(8), 1, &call("c1", r#"{"amount":5}"#), None)
        );
        // Sent again with a person's answer: another effect, one per answer.
        let answered = effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#), Some(9));
        assert_ne!(key, answered);
        assert_ne!(
            answered,
            effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#), Some(12))
        );
    }
}
