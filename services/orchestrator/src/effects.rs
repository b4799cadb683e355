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
            OnEntry::Send => self.dispatch(&key, pb::EffectState::Prepared).await,
            OnEntry::MarkUnknownAndReconcile => {
                let detail = "dispatched, and no outcome was recorded: the worker that sent it \
                              stopped or was cut off mid-call";
                self.record(&key, pb::EffectState::Dispatched, Recorded::unknown(detail))
                    .await;
                self.reconcile_and_finish(&key).await
            }
            OnEntry::Reconcile => self.reconcile_and_finish(&key).await,
            OnEntry::RecoverOutput => match ask(self.ports, self.call, &key).await {
                Answer::Applied { output_json, .. } => CallOutcome::Output { output_json },
                Answer::NotApplied | Answer::Unknown(_) => CallOutcome::Unknown {
                    detail: "the ledger says the write was applied, but its executor cannot \
                             give its output back"
                        .into(),
                },
            },
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
    async fn dispatch(&self, key: &str, expected: pb::EffectState) -> CallOutcome {
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
            let detail = if expected == pb::EffectState::OutcomeUnknown {
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
                expected_state: expected.into(),
            })
            .await;
        let attempt = match marked {
            Ok(response) => response.entry.map_or(1, |entry| entry.attempt),
            // Someone else moved the entry since it was read: its outcome is theirs to
            // know, so this worker only asks.
            Err(status) if status.code() == Code::FailedPrecondition => {
                return match ask(self.ports, self.call, key).await {
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
        self.record(key, pb::EffectState::Dispatched, recorded_after_send(&sent))
            .await;
        sent.outcome
    }

    /// An `outcome_unknown` write met again: the executor's answer settles it; a
    /// not-applied write is sent again (its entry says it never took effect).
    async fn reconcile_and_finish(&self, key: &str) -> CallOutcome {
        match settle_in_turn(ask(self.ports, self.call, key).await) {
            InTurn::Done { recorded, outcome } => {
                if let Some(recorded) = recorded {
                    self.record(key, pb::EffectState::OutcomeUnknown, recorded)
                        .await;
                }
                outcome
            }
            InTurn::SendAgain => self.dispatch(key, pb::EffectState::OutcomeUnknown).await,
        }
    }

    async fn record(&self, key: &str, expected: pb::EffectState, recorded: Recorded) {
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
    let (recorded, settled) = settle_at_reconcile(ask(ports, call, &key).await);
    record(ports, &key, pb::EffectState::OutcomeUnknown, recorded).await;
    let call_id: CallId = call.call_id.clone();
    match settled {
        Ok(outcome) => Input::Reconciled { call_id, outcome },
        Err(detail) => Input::ReconciliationFailed { call_id, detail },
    }
}

/// What an executor's `Reconcile` said.
#[derive(Debug)]
enum Answer {
    Applied {
        output_json: String,
        receipt: String,
    },
    NotApplied,
    Unknown(String),
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

// ---------------------------------------------------------------------------------------
// The protocol's client side as decisions, without I/O; the functions above carry them
// out. The server side is the ledger's own state machine (`agentloop_ledger::state`).

/// What to do with a write whose ledger entry was prepared, or found, in a given state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnEntry {
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
    /// Waiting for an operator, or a state this client does not know: the result is
    /// unknown, never a send.
    Unresolved,
}

fn on_entry(state: pb::EffectState) -> OnEntry {
    match state {
        pb::EffectState::Prepared => OnEntry::Send,
        pb::EffectState::Dispatched => OnEntry::MarkUnknownAndReconcile,
        pb::EffectState::OutcomeUnknown => OnEntry::Reconcile,
        pb::EffectState::Committed => OnEntry::RecoverOutput,
        pb::EffectState::Rejected => OnEntry::Rejected,
        pb::EffectState::ReconciliationRequired | pb::EffectState::Unspecified => {
            OnEntry::Unresolved
        }
    }
}

/// What the ledger records after a send from `dispatched`.
fn recorded_after_send(sent: &Sent) -> Recorded {
    match &sent.outcome {
        CallOutcome::Output { .. } => Recorded::committed(&sent.receipt),
        CallOutcome::Error(error) => Recorded::rejected(&error.message),
        CallOutcome::Cancelled | CallOutcome::NotStarted => {
            Recorded::rejected("the executor answered that it did not start it")
        }
        CallOutcome::Unknown { detail } => Recorded::unknown(detail),
    }
}

/// How a write of unknown outcome met again in a running turn (after a crash, a
/// takeover, a resume) goes on, from its executor's answer.
#[derive(Debug, Clone, PartialEq)]
enum InTurn {
    /// Settled: record this (from `outcome_unknown`), if anything, and this is the result.
    /// A write nobody can tell about records nothing here: its result is `unknown`, and
    /// the engine's reconcile step asks again.
    Done {
        recorded: Option<Recorded>,
        outcome: CallOutcome,
    },
    /// Its executor says it was not applied: send it again (the dispatch records it).
    SendAgain,
}

fn settle_in_turn(answer: Answer) -> InTurn {
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
fn settle_at_reconcile(answer: Answer) -> (Recorded, Result<CallOutcome, String>) {
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
            Recorded {
                state: pb::EffectState::ReconciliationRequired,
                receipt: String::new(),
                detail: detail.clone(),
            },
            Err(detail),
        ),
    }
}

/// A ledger transition to record.
#[derive(Debug, Clone, PartialEq, Eq)]
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
async fn record(ports: &Ports, key: &str, expected: pb::EffectState, recorded: Recorded) {
    let mut pause = RESEND_PAUSE;
    for attempt in 1..=RECORD_ATTEMPTS {
        let request = pb::RecordRequest {
            effect_key: key.to_owned(),
            expected_state: expected.into(),
            state: recorded.state.into(),
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
    fn only_a_prepared_entry_is_sent() {
        let every = [
            (pb::EffectState::Unspecified, OnEntry::Unresolved),
            (pb::EffectState::Prepared, OnEntry::Send),
            (
                pb::EffectState::Dispatched,
                OnEntry::MarkUnknownAndReconcile,
            ),
            (pb::EffectState::Committed, OnEntry::RecoverOutput),
            (pb::EffectState::Rejected, OnEntry::Rejected),
            (pb::EffectState::OutcomeUnknown, OnEntry::Reconcile),
            (pb::EffectState::ReconciliationRequired, OnEntry::Unresolved),
        ];
        // Every state of the contract is in the table.
        let states: Vec<i32> = every.iter().map(|(state, _)| *state as i32).collect();
        assert_eq!(states.len(), 7);
        assert!((0..7).all(|state| states.contains(&state)));
        for (state, expected) in every {
            assert_eq!(on_entry(state), expected, "{state:?}");
        }
    }

    #[test]
    fn a_send_is_recorded_by_its_outcome() {
        let sent = |outcome| Sent {
            outcome,
            receipt: "r-1".into(),
        };
        let output = sent(CallOutcome::Output {
            output_json: "{}".into(),
        });
        assert_eq!(recorded_after_send(&output), Recorded::committed("r-1"));
        let error = sent(CallOutcome::Error(ToolError {
            error_type: ErrorType::Rejected,
            message: "insufficient funds".into(),
            retryable: false,
            next_allowed_action: NextAction::None,
        }));
        assert_eq!(
            recorded_after_send(&error),
            Recorded::rejected("insufficient funds")
        );
        for never in [CallOutcome::Cancelled, CallOutcome::NotStarted] {
            assert_eq!(
                recorded_after_send(&sent(never)).state,
                pb::EffectState::Rejected
            );
        }
        let lost = sent(CallOutcome::Unknown {
            detail: "reply lost".into(),
        });
        assert_eq!(recorded_after_send(&lost), Recorded::unknown("reply lost"));
    }

    #[test]
    fn an_unknown_outcome_is_settled_by_the_executors_answer() {
        let applied = || Answer::Applied {
            output_json: r#"{"ok":true}"#.into(),
            receipt: "r-2".into(),
        };
        let output = CallOutcome::Output {
            output_json: r#"{"ok":true}"#.into(),
        };
        assert_eq!(
            settle_in_turn(applied()),
            InTurn::Done {
                recorded: Some(Recorded::committed("r-2")),
                outcome: output.clone(),
            }
        );
        assert_eq!(
            settle_at_reconcile(applied()),
            (Recorded::committed("r-2"), Ok(output))
        );
        // In a turn, not applied means: send it again (the dispatch records the rest).
        assert_eq!(settle_in_turn(Answer::NotApplied), InTurn::SendAgain);
        // At the reconcile step nothing is sent: the model gets a retryable error.
        let (recorded, settled) = settle_at_reconcile(Answer::NotApplied);
        assert_eq!(recorded.state, pb::EffectState::Rejected);
        assert!(
            matches!(settled, Ok(CallOutcome::Error(ref e)) if e.retryable),
            "{settled:?}"
        );
        // Cannot tell: nothing recorded in a turn (the reconcile step asks again), and an
        // operator is asked for at the reconcile step.
        assert_eq!(
            settle_in_turn(Answer::Unknown("no record".into())),
            InTurn::Done {
                recorded: None,
                outcome: CallOutcome::Unknown {
                    detail: "no record".into()
                },
            }
        );
        let (recorded, settled) = settle_at_reconcile(Answer::Unknown("no record".into()));
        assert_eq!(recorded.state, pb::EffectState::ReconciliationRequired);
        assert_eq!(settled, Err("no record".into()));
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
