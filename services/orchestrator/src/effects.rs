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

use std::time::Duration;

use agentloop_engine::{
    CallId, CallOutcome, ErrorType, Input, NextAction, SideEffect, ToolCall, ToolError,
};
use agentloop_proto::v1 as pb;
use futures::future::join_all;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::{Shared, wire};

/// Sends of one read-only or idempotent call, the first included.
const SEND_ATTEMPTS: u32 = 3;
/// Pause before the first resend; doubled for each further one.
const RESEND_PAUSE: Duration = Duration::from_millis(50);
/// Attempts to record one ledger transition while the ledger is unreachable.
const RECORD_ATTEMPTS: u32 = 3;

/// One call of a batch, with what the runner knows about it.
pub(crate) struct Call<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) invocation: Uuid,
    pub(crate) turn: u32,
    pub(crate) call: &'a ToolCall,
    pub(crate) side_effect: SideEffect,
    pub(crate) timeout_ms: u64,
    /// Fired when the batch is cancelled: nothing new may start after it.
    pub(crate) token: &'a CancellationToken,
}

impl Call<'_> {
    /// Runs the call to its one result.
    pub(crate) async fn run(&self) -> CallOutcome {
        if self.side_effect.writes() {
            return self.write().await;
        }
        if self.token.is_cancelled() {
            return CallOutcome::NotStarted;
        }
        self.send_retrying("", 1).await.outcome
    }

    fn key(&self) -> String {
        effect_key(self.invocation, self.turn, self.call)
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

    /// The gateway's request for one send of the call.
    fn request(&self, effect_key: &str, attempt: u32) -> pb::ToolGatewayServiceExecuteRequest {
        let timeout_ms = self.timeout_ms;
        pb::ToolGatewayServiceExecuteRequest {
            invocation_id: self.invocation.to_string(),
            call: Some(wire::tool_call(self.call)),
            effect_key: effect_key.to_owned(),
            attempt,
            timeout: Some(prost_types::Duration {
                seconds: i64::try_from(timeout_ms / 1000).unwrap_or(i64::MAX),
                nanos: i32::try_from((timeout_ms % 1000) * 1_000_000).unwrap_or(0),
            }),
        }
    }

    /// One send through the gateway; dropping it (cancellation) drops the RPC, which
    /// cancels it at the executor.
    async fn send(&self, effect_key: &str, attempt: u32) -> Sent {
        let writes = self.side_effect.writes();
        let request = self.request(effect_key, attempt);
        let tools = self.shared.ports.tools.clone();
        tokio::select! {
            biased;
            // A write may already have been applied, so its outcome is unknown and gets
            // reconciled, never assumed.
            () = self.token.cancelled() => Sent::of(if writes {
                CallOutcome::Unknown { detail: "cancelled while in flight".into() }
            } else {
                CallOutcome::Cancelled
            }),
            result = tools.execute(request) => match result {
                Ok(response) => match response.result {
                    Some(result) => Sent::from_result(result, writes),
                    None => Sent::of(wire::unanswered(writes, "the tool gateway sent no result".into())),
                },
                Err(status) => Sent::of(wire::unanswered(
                    writes,
                    gateway_failed(status.code(), status.message()),
                )),
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
            .shared
            .ports
            .ledger
            .prepare(pb::PrepareRequest {
                invocation_id: self.invocation.to_string(),
                call_id: self.call.call_id.as_str().to_owned(),
                effect_key: key.clone(),
                tool: self.call.tool.clone(),
            })
            .await;
        let entry = match prepared {
            Ok(pb::PrepareResponse {
                entry: Some(entry), ..
            }) => entry,
            Ok(_) => return not_sent("the effect ledger answered without an entry".into()),
            Err(status) => {
                return not_sent(format!(
                    "the effect ledger did not record the write: {:?}: {}",
                    status.code(),
                    status.message()
                ));
            }
        };
        match entry.state() {
            pb::EffectState::Prepared => self.dispatch(&key, pb::EffectState::Prepared).await,
            pb::EffectState::Dispatched => {
                let detail = "dispatched, and no outcome was recorded: the worker that sent it \
                              stopped or was cut off mid-call";
                self.record(&key, pb::EffectState::Dispatched, Recorded::unknown(detail))
                    .await;
                self.reconcile_and_finish(&key).await
            }
            pb::EffectState::OutcomeUnknown => self.reconcile_and_finish(&key).await,
            pb::EffectState::Committed => match ask(self.shared, self.call, &key).await {
                Answer::Applied { output_json, .. } => CallOutcome::Output { output_json },
                Answer::NotApplied | Answer::Unknown(_) => CallOutcome::Unknown {
                    detail: "the ledger says the write was applied, but its executor cannot \
                             give its output back"
                        .into(),
                },
            },
            pb::EffectState::Rejected => CallOutcome::Error(ToolError {
                error_type: ErrorType::Rejected,
                message: format!("the write was not applied: {}", entry.detail),
                retryable: false,
                next_allowed_action: NextAction::None,
            }),
            pb::EffectState::ReconciliationRequired | pb::EffectState::Unspecified => {
                CallOutcome::Unknown {
                    detail: entry.detail,
                }
            }
        }
    }

    /// Marks the write dispatched (from `expected`), sends it, records the outcome.
    async fn dispatch(&self, key: &str, expected: pb::EffectState) -> CallOutcome {
        if self.token.is_cancelled() {
            // Settled, so the entry does not stay listed as unresolved.
            let detail = if expected == pb::EffectState::OutcomeUnknown {
                "not applied (its executor says so) and cancelled before it was sent again"
            } else {
                "cancelled before it was sent"
            };
            self.record(key, expected, Recorded::rejected(detail)).await;
            return CallOutcome::NotStarted;
        }
        let marked = self
            .shared
            .ports
            .ledger
            .mark_dispatched(pb::MarkDispatchedRequest {
                effect_key: key.to_owned(),
                expected_state: expected.into(),
            })
            .await;
        let attempt = match marked {
            Ok(response) => response.entry.map_or(1, |entry| entry.attempt),
            // Someone else moved the entry since it was read: its outcome is theirs to
            // know, so this worker only asks.
            Err(status) if status.code() == Code::FailedPrecondition => {
                return match ask(self.shared, self.call, key).await {
                    Answer::Applied { output_json, .. } => CallOutcome::Output { output_json },
                    Answer::NotApplied | Answer::Unknown(_) => CallOutcome::Unknown {
                        detail: format!("another worker moved the effect: {}", status.message()),
                    },
                };
            }
            Err(status) => {
                return not_sent(format!(
                    "the effect ledger did not record the dispatch: {:?}: {}",
                    status.code(),
                    status.message()
                ));
            }
        };
        let sent = self.send_retrying(key, attempt).await;
        let recorded = match &sent.outcome {
            CallOutcome::Output { .. } => Recorded::committed(&sent.receipt),
            CallOutcome::Error(error) => Recorded::rejected(&error.message),
            CallOutcome::Cancelled | CallOutcome::NotStarted => {
                Recorded::rejected("the executor answered that it did not start it")
            }
            CallOutcome::Unknown { detail } => Recorded::unknown(detail),
        };
        self.record(key, pb::EffectState::Dispatched, recorded)
            .await;
        sent.outcome
    }

    /// An `outcome_unknown` write met again: the executor's answer settles it; a
    /// not-applied write is sent again (its entry says it never took effect).
    async fn reconcile_and_finish(&self, key: &str) -> CallOutcome {
        match ask(self.shared, self.call, key).await {
            Answer::Applied {
                output_json,
                receipt,
            } => {
                self.record(
                    key,
                    pb::EffectState::OutcomeUnknown,
                    Recorded::committed(&receipt),
                )
                .await;
                CallOutcome::Output { output_json }
            }
            Answer::NotApplied => self.dispatch(key, pb::EffectState::OutcomeUnknown).await,
            Answer::Unknown(detail) => CallOutcome::Unknown { detail },
        }
    }

    async fn record(&self, key: &str, expected: pb::EffectState, recorded: Recorded) {
        record(self.shared, key, expected, recorded).await;
    }
}

/// The read-only calls of one stage (all under `token`), sent to the gateway as one
/// request: each call's first answer is what its own send would have been, and a call
/// answered with a retryable error is sent again on its own, as [`Call::run`] would.
/// The outcomes are in the order of `calls`.
pub(crate) async fn run_stage(
    shared: &Shared,
    token: &CancellationToken,
    calls: &[Call<'_>],
) -> Vec<CallOutcome> {
    if token.is_cancelled() {
        return calls.iter().map(|_| CallOutcome::NotStarted).collect();
    }
    let request = pb::ExecuteStageRequest {
        calls: calls.iter().map(|call| call.request("", 1)).collect(),
    };
    let answered = tokio::select! {
        biased;
        () = token.cancelled() => return calls.iter().map(|_| CallOutcome::Cancelled).collect(),
        answered = shared.ports.tools.execute_stage(request) => answered,
    };
    let unanswered = |detail: String| -> Vec<Sent> {
        calls
            .iter()
            .map(|_| Sent::of(wire::unanswered(false, detail.clone())))
            .collect()
    };
    let first = match answered {
        Ok(response) if response.answers.len() == calls.len() => calls
            .iter()
            .zip(response.answers)
            .map(|(call, answer)| Sent::from_stage_answer(call.call, answer))
            .collect(),
        Ok(response) => unanswered(format!(
            "the tool gateway answered {} calls of a stage of {}",
            response.answers.len(),
            calls.len()
        )),
        Err(status) => unanswered(gateway_failed(status.code(), status.message())),
    };
    join_all(
        calls.iter().zip(first).map(|(call, sent)| async move {
            call.resend_while_retryable(sent, "", 1).await.outcome
        }),
    )
    .await
}

/// What a call's outcome says when the gateway failed it instead of answering.
fn gateway_failed(code: Code, message: &str) -> String {
    format!("the tool gateway failed: {code:?}: {message}")
}

/// The engine's reconcile step for one write whose outcome is unknown: ask the executor,
/// record its answer in the ledger (flagging the effect for an operator when it cannot
/// tell), and turn it into the engine's input.
pub(crate) async fn reconcile(
    shared: &Shared,
    invocation: Uuid,
    turn: u32,
    call: &ToolCall,
) -> Input {
    let key = effect_key(invocation, turn, call);
    let call_id: CallId = call.call_id.clone();
    match ask(shared, call, &key).await {
        Answer::Applied {
            output_json,
            receipt,
        } => {
            record(
                shared,
                &key,
                pb::EffectState::OutcomeUnknown,
                Recorded::committed(&receipt),
            )
            .await;
            Input::Reconciled {
                call_id,
                outcome: CallOutcome::Output { output_json },
            }
        }
        Answer::NotApplied => {
            let detail = "the executor's records show the effect was not applied";
            record(
                shared,
                &key,
                pb::EffectState::OutcomeUnknown,
                Recorded::rejected(detail),
            )
            .await;
            Input::Reconciled {
                call_id,
                outcome: CallOutcome::Error(ToolError {
                    error_type: ErrorType::Unavailable,
                    message: detail.into(),
                    retryable: true,
                    next_allowed_action: NextAction::Retry,
                }),
            }
        }
        Answer::Unknown(detail) => {
            record(
                shared,
                &key,
                pb::EffectState::OutcomeUnknown,
                Recorded {
                    state: pb::EffectState::ReconciliationRequired,
                    receipt: String::new(),
                    detail: detail.clone(),
                },
            )
            .await;
            Input::ReconciliationFailed { call_id, detail }
        }
    }
}

/// What an executor's `Reconcile` said.
enum Answer {
    Applied {
        output_json: String,
        receipt: String,
    },
    NotApplied,
    Unknown(String),
}

async fn ask(shared: &Shared, call: &ToolCall, key: &str) -> Answer {
    let request = pb::ToolGatewayServiceReconcileRequest {
        tool: call.tool.clone(),
        effect_key: key.to_owned(),
    };
    match shared.ports.tools.reconcile(request).await {
        Ok(answer) => match answer.status() {
            pb::ReconcileStatus::Applied => Answer::Applied {
                output_json: answer.output_json,
                receipt: answer.receipt,
            },
            pb::ReconcileStatus::NotApplied => Answer::NotApplied,
            pb::ReconcileStatus::Unknown | pb::ReconcileStatus::Unspecified => {
                Answer::Unknown(if answer.detail.is_empty() {
                    "the executor cannot tell".into()
                } else {
                    answer.detail
                })
            }
        },
        Err(status) => Answer::Unknown(format!(
            "the executor could not be asked: {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// A ledger transition to record.
struct Recorded {
    state: pb::EffectState,
    receipt: String,
    detail: String,
}

impl Recorded {
    fn committed(receipt: &str) -> Recorded {
        Recorded {
            state: pb::EffectState::Committed,
            receipt: receipt.to_owned(),
            detail: String::new(),
        }
    }

    fn rejected(detail: &str) -> Recorded {
        Recorded {
            state: pb::EffectState::Rejected,
            receipt: String::new(),
            detail: detail.to_owned(),
        }
    }

    fn unknown(detail: &str) -> Recorded {
        Recorded {
            state: pb::EffectState::OutcomeUnknown,
            receipt: String::new(),
            detail: detail.to_owned(),
        }
    }
}

/// Records a transition, retrying a bounded number of times while the ledger is
/// unreachable. A refusal (the entry moved on) or a ledger that stays down is logged and
/// left: the result still reaches the engine, and an entry left behind stays listed as
/// unresolved for an operator.
async fn record(shared: &Shared, key: &str, expected: pb::EffectState, recorded: Recorded) {
    let mut pause = RESEND_PAUSE;
    for attempt in 1..=RECORD_ATTEMPTS {
        let request = pb::RecordRequest {
            effect_key: key.to_owned(),
            expected_state: expected.into(),
            state: recorded.state.into(),
            receipt: recorded.receipt.clone(),
            detail: recorded.detail.clone(),
        };
        match shared.ports.ledger.record(request).await {
            Ok(_) => return,
            Err(status) if status.code() == Code::Unavailable && attempt < RECORD_ATTEMPTS => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(status) => {
                warn!(effect_key = key, code = ?status.code(), message = status.message(), "could not record an effect outcome");
                return;
            }
        }
    }
}

/// A send's result, with the executor's receipt of an applied write.
struct Sent {
    outcome: CallOutcome,
    receipt: String,
}

impl Sent {
    fn of(outcome: CallOutcome) -> Sent {
        Sent {
            outcome,
            receipt: String::new(),
        }
    }

    /// A read's answer within a stage: its result, or how the gateway refused it.
    fn from_stage_answer(call: &ToolCall, answer: pb::StageAnswer) -> Sent {
        use pb::stage_answer::Answer;
        Sent::of(match answer.answer {
            Some(Answer::Result(result)) if result.call_id == call.call_id.as_str() => {
                return Sent::from_result(result, false);
            }
            Some(Answer::Result(result)) => wire::unanswered(
                false,
                format!(
                    "the tool gateway answered for call {:?} in the place of {:?}",
                    result.call_id,
                    call.call_id.as_str()
                ),
            ),
            Some(Answer::Refused(refused)) => wire::unanswered(
                false,
                gateway_failed(Code::from(refused.code), &refused.message),
            ),
            None => wire::unanswered(false, "the tool gateway sent no result".into()),
        })
    }

    fn from_result(result: pb::ToolResult, writes: bool) -> Sent {
        let receipt = match &result.outcome {
            Some(pb::tool_result::Outcome::Output(output)) => output.receipt.clone(),
            _ => String::new(),
        };
        Sent {
            outcome: wire::call_outcome(result, writes),
            receipt,
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
pub(crate) fn effect_key(invocation_id: Uuid, turn: u32, call: &ToolCall) -> String {
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
        let key = effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#));
        assert_eq!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#))
        );
        assert_eq!(key.len(), 64);
        assert_ne!(
            key,
            effect_key(invocation, 2, &call("c1", r#"{"amount":5}"#))
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c2", r#"{"amount":5}"#))
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":6}"#))
        );
        assert_ne!(
            key,
            effect_key(Uuid::from_u128(8), 1, &call("c1", r#"{"amount":5}"#))
        );
    }
}
