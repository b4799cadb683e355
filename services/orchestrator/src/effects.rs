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
    CallId, CallOutcome, ErrorType, Input, NextAction, Refusal, SideEffect, ToolCall, ToolDigest,
    ToolError,
};
use agentloop_proto::v1 as pb;
use futures::future::join_all;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::{Ports, wire};

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
            timeout: Some(wire::duration(timeout_ms)),
            descriptor_digest: self.digest.map(|d| d.to_string()).unwrap_or_default(),
        }
    }

    /// One send through the gateway; dropping it (cancellation) drops the RPC, which
    /// cancels it at the executor.
    async fn send(&self, effect_key: &str, attempt: u32) -> Sent {
        let writes = self.side_effect.writes();
        let request = self.request(effect_key, attempt);
        let tools = self.ports.tools.clone();
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
        match on_entry(entry.state()) {
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
        let marked = self
            .ports
            .ledger
            .mark_dispatched(pb::MarkDispatchedRequest {
                effect_key: key.to_owned(),
                expected_state: expected.to_proto().into(),
            })
            .await;
        let attempt = match marked {
            Ok(response) => response.entry.map_or(1, |entry| entry.attempt),
            // Someone else moved the entry since it was read: its outcome is theirs to
            // know, so this worker only asks.
            Err(status) if status.code() == Code::FailedPrecondition => {
                return settle::result_from_answer(
                    ask(self.ports, self.call, key).await,
                    format!("another worker moved the effect: {}", status.message()),
                );
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
    let request = pb::ExecuteStageRequest {
        calls: calls.iter().map(|call| call.request("", 1)).collect(),
    };
    let answered = tokio::select! {
        biased;
        () = token.cancelled() => return calls.iter().map(|_| CallOutcome::Cancelled).collect(),
        answered = ports.tools.execute_stage(request) => answered,
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
    ports: &Ports,
    invocation: Uuid,
    turn: u32,
    call: &ToolCall,
) -> Input {
    let key = effect_key(invocation, turn, call);
    let (recorded, settled) = settle::at_reconcile(ask(ports, call, &key).await);
    record(ports, &key, EffectState::OutcomeUnknown, recorded).await;
    let call_id: CallId = call.call_id.clone();
    match settled {
        Ok(outcome) => Input::Reconciled { call_id, outcome },
        Err(detail) => Input::ReconciliationFailed { call_id, detail },
    }
}

async fn ask(ports: &Ports, call: &ToolCall, key: &str) -> Answer {
    let request = pb::ToolGatewayServiceReconcileRequest {
        tool: call.tool.clone(),
        effect_key: key.to_owned(),
    };
    match ports.tools.reconcile(request).await {
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

/// Records a transition, retrying a bounded number of times while the ledger is
/// unreachable. A refusal (the entry moved on) or a ledger that stays down is logged and
/// left: the result still reaches the engine, and an entry left behind stays listed as
/// unresolved for an operator.
async fn record(ports: &Ports, key: &str, expected: EffectState, recorded: Recorded) {
    let mut pause = RESEND_PAUSE;
    for attempt in 1..=RECORD_ATTEMPTS {
        let request = pb::RecordRequest {
            effect_key: key.to_owned(),
            expected_state: expected.to_proto().into(),
            state: recorded.outcome.state().to_proto().into(),
            receipt: recorded.receipt.clone(),
            detail: recorded.detail.clone(),
        };
        match ports.ledger.record(request).await {
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

/// What to do with a write whose entry the ledger says is in `state` on the wire: a state
/// this client does not know (`UNSPECIFIED`, or one of a newer ledger) is never a send.
fn on_entry(state: pb::EffectState) -> OnEntry {
    EffectState::from_proto(state).map_or(OnEntry::Unresolved, settle::on_entry)
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
    fn a_state_on_the_wire_goes_where_the_settling_table_says_and_unknown_is_never_sent() {
        assert_eq!(on_entry(pb::EffectState::Unspecified), OnEntry::Unresolved);
        for state in EffectState::ALL {
            assert_eq!(
                on_entry(state.to_proto()),
                settle::on_entry(state),
                "{state:?}"
            );
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
