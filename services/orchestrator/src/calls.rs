//! The ports' calls on the wire: each runtime request as the service's request message,
//! and each response message as the runtime's answer. The gRPC adapters
//! ([`crate::grpc`]) send them over the network; a service in the same process that has
//! no runtime-typed core yet is called with the same messages.
//!
//! A response that breaks the contract (a missing entry, an answer for another call)
//! is a [`Failure`] here, so the runtime treats it as a service that did not answer.

use std::sync::Arc;
use std::time::Duration;

use agentloop_effects::EffectState;
use agentloop_effects::settle::{Answer, Recorded};
use agentloop_engine::Check;
use agentloop_proto::v1 as pb;
use agentloop_runtime::ports::{
    Ask, Batch, Claim, Decided, Dispatch, Effect, EffectPage, Failure, FailureKind, NewEffect,
    Sent, Tool,
};
use agentloop_script::Script;
use agentloop_store::StoredEvent;
use tonic::{Code, Status};

use agentloop_wire as wire;

/// A service's refusal, as the runtime reads it.
pub fn failure(status: &Status) -> Failure {
    Failure::new(failure_kind(status.code()), status.message())
}

/// A status code as the runtime's class of failure.
pub fn failure_kind(code: Code) -> FailureKind {
    match code {
        Code::Cancelled => FailureKind::Cancelled,
        Code::InvalidArgument => FailureKind::InvalidArgument,
        Code::DeadlineExceeded => FailureKind::DeadlineExceeded,
        Code::NotFound => FailureKind::NotFound,
        Code::AlreadyExists => FailureKind::AlreadyExists,
        Code::PermissionDenied => FailureKind::PermissionDenied,
        Code::ResourceExhausted => FailureKind::ResourceExhausted,
        Code::FailedPrecondition => FailureKind::FailedPrecondition,
        Code::Aborted => FailureKind::Aborted,
        Code::OutOfRange => FailureKind::OutOfRange,
        Code::Unimplemented => FailureKind::Unimplemented,
        Code::Internal => FailureKind::Internal,
        Code::Unavailable => FailureKind::Unavailable,
        Code::DataLoss => FailureKind::DataLoss,
        Code::Unauthenticated => FailureKind::Unauthenticated,
        // OK is no failure; a service that fails with it broke the contract.
        Code::Ok | Code::Unknown => FailureKind::Unknown,
    }
}

/// The runtime's class of failure as a status code.
pub fn code(kind: FailureKind) -> Code {
    match kind {
        FailureKind::Cancelled => Code::Cancelled,
        FailureKind::Unknown => Code::Unknown,
        FailureKind::InvalidArgument => Code::InvalidArgument,
        FailureKind::DeadlineExceeded => Code::DeadlineExceeded,
        FailureKind::NotFound => Code::NotFound,
        FailureKind::AlreadyExists => Code::AlreadyExists,
        FailureKind::PermissionDenied => Code::PermissionDenied,
        FailureKind::ResourceExhausted => Code::ResourceExhausted,
        FailureKind::FailedPrecondition => Code::FailedPrecondition,
        FailureKind::Aborted => Code::Aborted,
        FailureKind::OutOfRange => Code::OutOfRange,
        FailureKind::Unimplemented => Code::Unimplemented,
        FailureKind::Internal => Code::Internal,
        FailureKind::Unavailable => Code::Unavailable,
        FailureKind::DataLoss => Code::DataLoss,
        FailureKind::Unauthenticated => Code::Unauthenticated,
    }
}

fn broken(message: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Internal, message)
}

/// A gateway's descriptor as the runtime's tool.
pub fn tool(descriptor: pb::ToolDescriptor) -> Tool {
    let timeout_ms = descriptor
        .timeout
        .as_ref()
        .and_then(wire::millis)
        .filter(|ms| *ms > 0);
    Tool {
        side_effect: wire::side_effect(descriptor.side_effect()),
        // A gateway that does not version its tools sends none.
        digest: descriptor.digest.parse().ok(),
        name: descriptor.name,
        description: descriptor.description,
        input_schema_json: descriptor.input_schema_json,
        commutative: descriptor.commutative,
        timeout_ms,
        requires_approval: descriptor.requires_approval,
        unavailable: descriptor.unavailable,
    }
}

/// The runtime's tool as a descriptor, for the model.
fn descriptor(tool: &Tool) -> pb::ToolDescriptor {
    pb::ToolDescriptor {
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema_json: tool.input_schema_json.clone(),
        side_effect: wire::side_effect_of(tool.side_effect).into(),
        commutative: tool.commutative,
        timeout: tool.timeout_ms.map(wire::duration),
        requires_approval: tool.requires_approval,
        digest: tool.digest.map(|d| d.to_string()).unwrap_or_default(),
        unavailable: tool.unavailable,
    }
}

/// A turn's question as the decision service's request, with as much of the window and
/// the tools as `reads` names (all of both when `None`), and what was left out said.
pub fn decide_request(ask: &Ask<'_>, reads: Option<pb::Reads>) -> pb::DecideRequest {
    let invocation_id = ask.invocation.to_string();
    let (events, tools) = reads.map_or((usize::MAX, true), |reads| {
        (
            usize::try_from(reads.history).unwrap_or(usize::MAX),
            reads.tools,
        )
    });
    let sent = window(ask.history, events);
    pb::DecideRequest {
        turn: ask.turn,
        goal: ask.goal.to_owned(),
        profile: ask.profile.to_owned(),
        tools: descriptors(ask.tools, tools),
        history: history(&invocation_id, sent),
        context_from_seq: sent.first().map_or(0, |stored| stored.event.seq),
        summary: String::new(),
        scripted_model_json: ask.script.map(Script::text).unwrap_or_default().to_owned(),
        invocation_id,
        history_left_out: u32::try_from(ask.history.len() - sent.len()).unwrap_or(u32::MAX),
        tools_left_out: !tools && !ask.tools.is_empty(),
    }
}

/// The tools as descriptors for a model that reads them (`read`); none for one that
/// does not.
pub fn descriptors(tools: &[Tool], read: bool) -> Vec<pb::ToolDescriptor> {
    match read {
        true => tools.iter().map(descriptor).collect(),
        false => Vec::new(),
    }
}

/// The last `events` of a window: what a model that reads that many is shown.
pub fn window(history: &[Arc<StoredEvent>], events: usize) -> &[Arc<StoredEvent>] {
    &history[history.len().saturating_sub(events)..]
}

/// A window of committed events as the decision service reads them.
pub fn history(invocation_id: &str, window: &[Arc<StoredEvent>]) -> Vec<pb::Event> {
    window
        .iter()
        .map(|stored| wire::event(invocation_id, stored.committed_at, &stored.event))
        .collect()
}

/// A decision service's answer. A response with no decision kind is the model breaking
/// the protocol, which the engine turns into `invalid_decision`.
pub fn decided(response: pb::DecideResponse) -> Decided {
    let (decision, usage) = wire::decided(response);
    Decided { decision, usage }
}

/// A batch as policy's request.
pub fn evaluate_request(batch: &Batch<'_>) -> pb::EvaluateRequest {
    pb::EvaluateRequest {
        invocation_id: batch.invocation.to_string(),
        turn: batch.turn,
        profile: batch.profile.to_owned(),
        calls: batch.calls.iter().map(wire::tool_call).collect(),
        actor: batch.actor.to_owned(),
        tenant: batch.tenant.to_owned(),
        roles: batch.roles.to_vec(),
        approved_proposal_digest: batch.approved.map(|p| p.to_string()).unwrap_or_default(),
    }
}

/// An answer to policy's acceptance rules, as its request.
pub fn validate_final_request(profile: &str, claim: &Claim) -> pb::ValidateFinalRequest {
    pb::ValidateFinalRequest {
        profile: profile.to_owned(),
        claim: Some(wire::claim(claim)),
    }
}

/// One send as the gateway's request.
pub fn execute_request(dispatch: &Dispatch<'_>) -> pb::ToolGatewayServiceExecuteRequest {
    pb::ToolGatewayServiceExecuteRequest {
        invocation_id: dispatch.invocation.to_string(),
        call: Some(wire::tool_call(dispatch.call)),
        effect_key: dispatch.effect_key.to_owned(),
        attempt: dispatch.attempt,
        timeout: Some(wire::duration(dispatch.timeout_ms)),
        descriptor_digest: dispatch.digest.map(|d| d.to_string()).unwrap_or_default(),
        input_answer: dispatch.answer.map(wire::input_answer),
    }
}

/// The gateway's answer to one send.
pub fn sent(response: pb::ToolGatewayServiceExecuteResponse) -> Result<Sent, Failure> {
    let result = response
        .result
        .ok_or_else(|| broken("the tool gateway sent no result"))?;
    sent_result(result)
}

fn sent_result(result: pb::ToolResult) -> Result<Sent, Failure> {
    let receipt = match &result.outcome {
        Some(pb::tool_result::Outcome::Output(output)) => output.receipt.clone(),
        Some(_) => String::new(),
        None => return Err(broken("the tool result carried no outcome")),
    };
    Ok(Sent {
        outcome: wire::call_outcome(result),
        receipt,
    })
}

/// A stage of sends as the gateway's request.
pub fn stage_request(dispatches: &[Dispatch<'_>]) -> pb::ExecuteStageRequest {
    pb::ExecuteStageRequest {
        calls: dispatches.iter().map(execute_request).collect(),
    }
}

/// The gateway's answers to a stage, each checked against the call it answers (a
/// response with fewer answers than calls gives fewer, which the runtime refuses whole).
pub fn stage_answers(
    dispatches: &[Dispatch<'_>],
    response: pb::ExecuteStageResponse,
) -> Vec<Result<Sent, Failure>> {
    use pb::stage_answer::Answer;
    dispatches
        .iter()
        .zip(response.answers)
        .map(|(dispatch, answer)| match answer.answer {
            Some(Answer::Result(result)) if result.call_id == dispatch.call.call_id.as_str() => {
                sent_result(result)
            }
            Some(Answer::Result(result)) => Err(broken(format!(
                "the tool gateway answered for call {:?} in the place of {:?}",
                result.call_id,
                dispatch.call.call_id.as_str()
            ))),
            Some(Answer::Refused(refused)) => Err(Failure::new(
                failure_kind(Code::from(refused.code)),
                refused.message,
            )),
            None => Err(broken("the tool gateway sent no result")),
        })
        .collect()
}

/// The executor's answer to a reconcile.
pub fn answer(response: pb::ToolGatewayServiceReconcileResponse) -> Answer {
    match response.status() {
        pb::ReconcileStatus::Applied => Answer::Applied {
            output_json: response.output_json,
            receipt: response.receipt,
        },
        pb::ReconcileStatus::NotApplied => Answer::NotApplied,
        pb::ReconcileStatus::Unknown | pb::ReconcileStatus::Unspecified => {
            Answer::Unknown(if response.detail.is_empty() {
                "the executor cannot tell".into()
            } else {
                response.detail
            })
        }
    }
}

/// A verifier's question, as the gateway's request.
pub fn verify_request(
    name: &str,
    claim: &Claim,
    within: Option<Duration>,
) -> pb::ToolGatewayServiceVerifyRequest {
    pb::ToolGatewayServiceVerifyRequest {
        verifier: name.to_owned(),
        claim: Some(wire::claim(claim)),
        timeout: within
            .map(|left| wire::duration(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))),
    }
}

/// A verifier's verdict, if it gave one.
pub fn verdict(response: pb::ToolGatewayServiceVerifyResponse) -> Option<Check> {
    response.check.map(wire::check_from)
}

/// A write to prepare, as the ledger's request.
pub fn prepare_request(effect: &NewEffect<'_>) -> pb::PrepareRequest {
    pb::PrepareRequest {
        invocation_id: effect.invocation.to_string(),
        call_id: effect.call_id.to_owned(),
        effect_key: effect.effect_key.to_owned(),
        tool: effect.tool.to_owned(),
    }
}

/// A dispatch to record, as the ledger's request.
pub fn mark_dispatched_request(
    effect_key: &str,
    expected: EffectState,
) -> pb::MarkDispatchedRequest {
    pb::MarkDispatchedRequest {
        effect_key: effect_key.to_owned(),
        expected_state: expected.to_proto().into(),
    }
}

/// An outcome to record, as the ledger's request.
pub fn record_request(
    effect_key: &str,
    expected: EffectState,
    recorded: &Recorded,
) -> pb::RecordRequest {
    pb::RecordRequest {
        effect_key: effect_key.to_owned(),
        expected_state: expected.to_proto().into(),
        state: recorded.outcome.state().to_proto().into(),
        receipt: recorded.receipt.clone(),
        detail: recorded.detail.clone(),
    }
}

/// The entry a ledger answered with; a missing one breaks the contract.
pub fn answered_entry(entry: Option<pb::EffectEntry>) -> Result<Effect, Failure> {
    entry
        .map(wire::effect)
        .ok_or_else(|| broken("the effect ledger answered without an entry"))
}

/// A page of entries.
pub fn effect_page(entries: Vec<pb::EffectEntry>, next_page_token: String) -> EffectPage {
    EffectPage {
        entries: entries.into_iter().map(wire::effect).collect(),
        next_page_token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_kind_is_a_code_and_back() {
        // Every code but OK, by its number.
        let codes = (1..=16).map(Code::from);
        for code in codes {
            assert_eq!(self::code(failure_kind(code)), code);
        }
        let failure = failure(&Status::unavailable("down"));
        assert_eq!(failure.to_string(), "Unavailable: down");
    }

    #[test]
    fn a_stage_answer_for_another_call_is_a_failure() {
        let call = agentloop_engine::ToolCall {
            call_id: agentloop_engine::CallId::new("c1"),
            tool: "lookup".into(),
            arguments_json: "{}".into(),
        };
        let dispatch = Dispatch {
            invocation: uuid::Uuid::nil(),
            call: &call,
            effect_key: "",
            attempt: 1,
            timeout_ms: 100,
            digest: None,
            answer: None,
        };
        let answer = |call_id: &str| pb::StageAnswer {
            answer: Some(pb::stage_answer::Answer::Result(pb::ToolResult {
                call_id: call_id.into(),
                outcome: Some(pb::tool_result::Outcome::Output(pb::ToolOutput {
                    output_json: "{}".into(),
                    receipt: String::new(),
                })),
            })),
        };
        let response = pb::ExecuteStageResponse {
            answers: vec![answer("c1")],
        };
        assert!(stage_answers(&[dispatch], response)[0].is_ok());
        let response = pb::ExecuteStageResponse {
            answers: vec![answer("c2")],
        };
        let failure = stage_answers(&[dispatch], response)[0].clone().unwrap_err();
        assert!(failure.message.contains("in the place of"), "{failure}");
    }
}
