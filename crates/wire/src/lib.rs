//! Conversions between the engine's types and the wire types of `agentloop.v1`.
//!
//! Provider and wire formats stay at the edges: the engine and the runtime never see a
//! proto type, and this crate is the one place that knows both vocabularies. Every gRPC
//! edge that carries engine values uses it: the orchestrator's API and its port adapters,
//! and the policy and tool services as they take calls and give verdicts and outcomes.
//! Every match is exhaustive, so a new engine variant fails to compile here until it has
//! a wire form.

use agentloop_engine::{
    Authorization, CallId, CallOutcome, Check, CheckKind, CheckVerdict, EndRecord, ErrorType,
    Event, EventBody, InputAction, InputAnswer, InputRequest, Judgement, Limits, MicroUsd,
    NextAction, PendingInput, Permit, ProposedCall, ProposedDecision, Refusal, Rejection,
    RejectionKind, Ruling, SideEffect, TerminalReason, ToolCall, ToolError, Totals, TurnRecord,
    UnixMillis, Usage,
};
use std::time::SystemTime;

use agentloop_effects::{Acceptance, Cited, Claim, Effect, EffectState};
use agentloop_proto::v1 as pb;

/// Engine terminal reason -> wire enum.
pub fn terminal_reason(reason: TerminalReason) -> pb::TerminalReason {
    match reason {
        TerminalReason::Completed => pb::TerminalReason::Completed,
        TerminalReason::ApprovalRequired => pb::TerminalReason::ApprovalRequired,
        TerminalReason::ClarificationRequired => pb::TerminalReason::ClarificationRequired,
        TerminalReason::Cancelled => pb::TerminalReason::Cancelled,
        TerminalReason::DeadlineExceeded => pb::TerminalReason::DeadlineExceeded,
        TerminalReason::MaxSteps => pb::TerminalReason::MaxSteps,
        TerminalReason::ToolBudgetExhausted => pb::TerminalReason::ToolBudgetExhausted,
        TerminalReason::TokenBudgetExhausted => pb::TerminalReason::TokenBudgetExhausted,
        TerminalReason::NoProgress => pb::TerminalReason::NoProgress,
        TerminalReason::InvalidDecision => pb::TerminalReason::InvalidDecision,
        TerminalReason::ModelError => pb::TerminalReason::ModelError,
        TerminalReason::CheckpointFailed => pb::TerminalReason::CheckpointFailed,
        TerminalReason::CannotContinue => pb::TerminalReason::CannotContinue,
        TerminalReason::VerificationFailed => pb::TerminalReason::VerificationFailed,
        TerminalReason::ReconciliationRequired => pb::TerminalReason::ReconciliationRequired,
    }
}

/// Wire enum -> engine terminal reason; `None` for UNSPECIFIED.
pub fn terminal_reason_from(reason: pb::TerminalReason) -> Option<TerminalReason> {
    TerminalReason::ALL
        .into_iter()
        .find(|candidate| terminal_reason(*candidate) == reason)
}

/// A wire terminal reason by its name (`completed`), as people and reports read it;
/// `unknown(N)` for a value this build does not know.
pub fn reason_name(raw: i32) -> String {
    pb::TerminalReason::try_from(raw)
        .ok()
        .and_then(terminal_reason_from)
        .map_or_else(|| format!("unknown({raw})"), |r| r.as_str().to_owned())
}

/// A wire effect state by its lowercase name (`reconciliation_required`), in the style of
/// [`reason_name`]; `unknown(N)` for a value this build does not know.
pub fn effect_state_name(raw: i32) -> String {
    pb::EffectState::try_from(raw)
        .ok()
        .and_then(EffectState::from_proto)
        .map_or_else(
            || format!("unknown({raw})"),
            |state| state.as_str().to_ascii_lowercase(),
        )
}

/// Wire side effect -> engine; UNSPECIFIED is the most dangerous kind, a write.
pub fn side_effect(side_effect: pb::SideEffect) -> SideEffect {
    match side_effect {
        pb::SideEffect::ReadOnly => SideEffect::ReadOnly,
        pb::SideEffect::IdempotentWrite => SideEffect::IdempotentWrite,
        pb::SideEffect::Write | pb::SideEffect::Unspecified => SideEffect::Write,
    }
}

/// Engine side effect -> wire.
pub fn side_effect_of(side_effect: SideEffect) -> pb::SideEffect {
    match side_effect {
        SideEffect::ReadOnly => pb::SideEffect::ReadOnly,
        SideEffect::IdempotentWrite => pb::SideEffect::IdempotentWrite,
        SideEffect::Write => pb::SideEffect::Write,
    }
}

/// A validated engine call -> wire call.
pub fn tool_call(call: &ToolCall) -> pb::ToolCall {
    pb::ToolCall {
        call_id: call.call_id.as_str().to_owned(),
        tool: call.tool.clone(),
        arguments_json: call.arguments_json.clone(),
    }
}

/// A wire call -> the engine's, as policy and the tool gateway judge and send it.
pub fn tool_call_from(call: pb::ToolCall) -> ToolCall {
    ToolCall {
        call_id: CallId::new(call.call_id),
        tool: call.tool,
        arguments_json: call.arguments_json,
    }
}

fn proposed_call(call: &ProposedCall) -> pb::ToolCall {
    pb::ToolCall {
        call_id: call.call_id.clone(),
        tool: call.tool.clone(),
        arguments_json: call.arguments_json.clone(),
    }
}

fn proposed_call_from(call: pb::ToolCall) -> ProposedCall {
    ProposedCall {
        call_id: call.call_id,
        tool: call.tool,
        arguments_json: call.arguments_json,
    }
}

/// Engine proposal -> wire decision. Unparseable output has no decision kind on the
/// wire: the turn's rejection carries the explanation.
pub fn decision(decision: &ProposedDecision) -> Option<pb::Decision> {
    use pb::decision::Kind;
    let kind = match decision {
        ProposedDecision::Final { answer, evidence } => Kind::Final(pb::decision::Final {
            answer: answer.clone(),
            evidence: evidence.clone(),
        }),
        ProposedDecision::ToolCalls { calls } => Kind::ToolCalls(pb::decision::ToolCalls {
            calls: calls.iter().map(proposed_call).collect(),
        }),
        ProposedDecision::RequestApproval { summary, calls } => {
            Kind::RequestApproval(pb::decision::RequestApproval {
                summary: summary.clone(),
                calls: calls.iter().map(proposed_call).collect(),
            })
        }
        ProposedDecision::Clarification { question } => {
            Kind::Clarification(pb::decision::Clarification {
                question: question.clone(),
            })
        }
        ProposedDecision::CannotContinue { reason } => {
            Kind::CannotContinue(pb::decision::CannotContinue {
                reason: reason.clone(),
            })
        }
        ProposedDecision::Unparseable { .. } => return None,
    };
    Some(pb::Decision { kind: Some(kind) })
}

/// A decision service's answer -> the engine's proposal and usage. A response with no
/// decision kind is the model breaking the protocol, which the engine turns into
/// `invalid_decision`.
pub fn decided(response: pb::DecideResponse) -> (ProposedDecision, Usage) {
    use pb::decide_response::Outcome;
    use pb::decision::Kind;
    let usage = response.usage.map(usage_from).unwrap_or_default();
    let decision = match response.outcome {
        Some(Outcome::Decision(pb::Decision { kind: Some(kind) })) => match kind {
            Kind::Final(f) => ProposedDecision::Final {
                answer: f.answer,
                evidence: f.evidence,
            },
            Kind::ToolCalls(t) => ProposedDecision::ToolCalls {
                calls: t.calls.into_iter().map(proposed_call_from).collect(),
            },
            Kind::RequestApproval(r) => ProposedDecision::RequestApproval {
                summary: r.summary,
                calls: r.calls.into_iter().map(proposed_call_from).collect(),
            },
            Kind::Clarification(c) => ProposedDecision::Clarification {
                question: c.question,
            },
            Kind::CannotContinue(c) => ProposedDecision::CannotContinue { reason: c.reason },
        },
        Some(Outcome::Decision(pb::Decision { kind: None })) => ProposedDecision::Unparseable {
            text: "a decision with no kind".into(),
        },
        Some(Outcome::Invalid(invalid)) => {
            ProposedDecision::unparseable(invalid.reason, invalid.raw)
        }
        // Asked of a whole request, which leaves nothing out: the service broke the
        // protocol as an empty response does.
        Some(Outcome::Resend(_)) => ProposedDecision::Unparseable {
            text: "a request to send again what was sent whole".into(),
        },
        None => ProposedDecision::Unparseable {
            text: "an empty response".into(),
        },
    };
    (decision, usage)
}

/// Usage on the wire -> the engine's.
pub fn usage_from(usage: pb::Usage) -> Usage {
    Usage {
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cost: usage.cost_micro_usd.map(MicroUsd),
    }
}

/// The engine's usage -> the wire's.
pub fn usage(usage: Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cost_micro_usd: usage.cost.map(|cost| cost.0),
    }
}

/// Policy's answer on the wire -> what the engine is told of it.
pub fn authorization(response: pb::EvaluateResponse) -> Authorization {
    judgement(response).authorization()
}

/// Policy's answer on the wire -> its judgement. Anything but an explicit allow or
/// approval denies.
pub fn judgement(response: pb::EvaluateResponse) -> Judgement {
    let ruling = match response.verdict() {
        pb::Verdict::Allow => Ruling::Allow,
        pb::Verdict::RequireApproval => Ruling::RequireApproval,
        pb::Verdict::Deny | pb::Verdict::Unspecified => Ruling::Deny,
    };
    let violations = response
        .violations
        .into_iter()
        .map(|v| Refusal {
            // A violation of an older policy service has no kind.
            error_type: match v.error_type() {
                pb::ErrorType::Unspecified => ErrorType::InvalidArguments,
                kind @ (pb::ErrorType::InvalidArguments
                | pb::ErrorType::NotFound
                | pb::ErrorType::PermissionDenied
                | pb::ErrorType::Timeout
                | pb::ErrorType::Unavailable
                | pb::ErrorType::Conflict
                | pb::ErrorType::Rejected
                | pb::ErrorType::Internal) => error_type_from(kind),
            },
            call_id: CallId::new(v.call_id),
            message: v.message,
            policies: v.policy_ids,
        })
        .collect();
    Judgement {
        ruling,
        violations,
        proposal: response.proposal_digest.parse().ok(),
        policy: Some(response.policy_version).filter(|v| !v.is_empty()),
        permits: response.permits.into_iter().map(permit_from).collect(),
    }
}

/// A permit on the wire -> the engine's.
fn permit_from(permit: pb::Permit) -> Permit {
    Permit {
        call_id: CallId::new(permit.call_id),
        policies: permit.policy_ids,
    }
}

/// The engine's permit -> its wire form.
fn permit(permit: &Permit) -> pb::Permit {
    pb::Permit {
        call_id: permit.call_id.as_str().to_owned(),
        policy_ids: permit.policies.clone(),
    }
}

/// Policy's judgement -> its answer on the wire.
pub fn evaluate_response(judgement: Judgement) -> pb::EvaluateResponse {
    let verdict = match judgement.ruling {
        Ruling::Allow => pb::Verdict::Allow,
        Ruling::Deny => pb::Verdict::Deny,
        Ruling::RequireApproval => pb::Verdict::RequireApproval,
    };
    pb::EvaluateResponse {
        verdict: verdict.into(),
        violations: judgement
            .violations
            .into_iter()
            .map(|v| pb::Violation {
                call_id: v.call_id.as_str().to_owned(),
                message: v.message,
                error_type: error_type(v.error_type).into(),
                policy_ids: v.policies,
            })
            .collect(),
        proposal_digest: judgement
            .proposal
            .map(|digest| digest.to_string())
            .unwrap_or_default(),
        policy_version: judgement.policy.unwrap_or_default(),
        permits: judgement.permits.iter().map(permit).collect(),
    }
}

/// A check on the wire -> the engine's. Anything but an explicit verdict is undecided,
/// which fails closed.
pub fn check_from(check: pb::Check) -> Check {
    let verdict = match check.verdict() {
        pb::CheckVerdict::Accepted => CheckVerdict::Accepted,
        pb::CheckVerdict::Rejected => CheckVerdict::Rejected,
        pb::CheckVerdict::Undecided | pb::CheckVerdict::Unspecified => CheckVerdict::Undecided,
    };
    let kind = match check.kind() {
        pb::CheckKind::Verifier => CheckKind::Verifier,
        pb::CheckKind::Rule | pb::CheckKind::Unspecified => CheckKind::Rule,
    };
    Check {
        name: check.name,
        kind,
        verdict,
        reasons: check.reasons,
        evidence: check.evidence,
    }
}

/// The engine's check -> the wire's.
fn check(check: &Check) -> pb::Check {
    let verdict = match check.verdict {
        CheckVerdict::Accepted => pb::CheckVerdict::Accepted,
        CheckVerdict::Rejected => pb::CheckVerdict::Rejected,
        CheckVerdict::Undecided => pb::CheckVerdict::Undecided,
    };
    let kind = match check.kind {
        CheckKind::Rule => pb::CheckKind::Rule,
        CheckKind::Verifier => pb::CheckKind::Verifier,
    };
    pb::Check {
        name: check.name.clone(),
        kind: kind.into(),
        verdict: verdict.into(),
        reasons: check.reasons.clone(),
        evidence: check.evidence.clone(),
    }
}

/// The checks that accepted an answer -> the wire's.
pub fn checks(checks: &[Check]) -> Vec<pb::Check> {
    checks.iter().map(check).collect()
}

/// The engine's error kind -> the wire's, whose names the API documents.
pub fn error_type(error_type: ErrorType) -> pb::ErrorType {
    match error_type {
        ErrorType::InvalidArguments => pb::ErrorType::InvalidArguments,
        ErrorType::NotFound => pb::ErrorType::NotFound,
        ErrorType::PermissionDenied => pb::ErrorType::PermissionDenied,
        ErrorType::Timeout => pb::ErrorType::Timeout,
        ErrorType::Unavailable => pb::ErrorType::Unavailable,
        ErrorType::Conflict => pb::ErrorType::Conflict,
        ErrorType::Rejected => pb::ErrorType::Rejected,
        ErrorType::Internal => pb::ErrorType::Internal,
    }
}

fn error_type_from(error_type: pb::ErrorType) -> ErrorType {
    match error_type {
        pb::ErrorType::InvalidArguments => ErrorType::InvalidArguments,
        pb::ErrorType::NotFound => ErrorType::NotFound,
        pb::ErrorType::PermissionDenied => ErrorType::PermissionDenied,
        pb::ErrorType::Timeout => ErrorType::Timeout,
        pb::ErrorType::Unavailable => ErrorType::Unavailable,
        pb::ErrorType::Conflict => ErrorType::Conflict,
        pb::ErrorType::Rejected => ErrorType::Rejected,
        pb::ErrorType::Internal | pb::ErrorType::Unspecified => ErrorType::Internal,
    }
}

fn next_action(action: NextAction) -> pb::NextAction {
    match action {
        NextAction::None => pb::NextAction::None,
        NextAction::Retry => pb::NextAction::Retry,
        NextAction::FixArguments => pb::NextAction::FixArguments,
        NextAction::RequestApproval => pb::NextAction::RequestApproval,
        NextAction::AskUser => pb::NextAction::AskUser,
        NextAction::Stop => pb::NextAction::Stop,
    }
}

fn next_action_from(action: pb::NextAction) -> NextAction {
    match action {
        pb::NextAction::Retry => NextAction::Retry,
        pb::NextAction::FixArguments => NextAction::FixArguments,
        pb::NextAction::RequestApproval => NextAction::RequestApproval,
        pb::NextAction::AskUser => NextAction::AskUser,
        pb::NextAction::Stop => NextAction::Stop,
        pb::NextAction::None | pb::NextAction::Unspecified => NextAction::None,
    }
}

/// A wire tool result -> the engine's outcome. A result with no outcome is a broken
/// executor, and nobody knows what happened.
pub fn call_outcome(result: pb::ToolResult) -> CallOutcome {
    match result.outcome {
        Some(outcome) => outcome_from(outcome),
        None => CallOutcome::Unknown {
            detail: "the tool result carried no outcome".into(),
        },
    }
}

/// An executor's outcome on the wire -> the engine's. Every executor's answer (over the
/// network, in the gateway's process, MCP, A2A) passes here on its way into a turn.
pub fn outcome_from(outcome: pb::tool_result::Outcome) -> CallOutcome {
    use pb::tool_result::Outcome;
    match outcome {
        Outcome::Output(output) => {
            // Without the spare room of the buffer it was built in (`serde_json` starts
            // at 128 bytes and doubles): the text lives as long as its turn is in memory,
            // in the model's window of every running invocation.
            let mut output_json = output.output_json;
            output_json.shrink_to_fit();
            CallOutcome::Output { output_json }
        }
        Outcome::Error(error) => CallOutcome::Error(ToolError {
            error_type: error_type_from(error.error_type()),
            next_allowed_action: next_action_from(error.next_allowed_action()),
            message: error.message,
            retryable: error.retryable,
        }),
        Outcome::Cancelled(_) => CallOutcome::Cancelled,
        Outcome::NotStarted(_) => CallOutcome::NotStarted,
        Outcome::Unknown(unknown) => CallOutcome::Unknown {
            detail: unknown.detail,
        },
        Outcome::InputRequired(asked) => CallOutcome::InputRequired(Box::new(InputRequest {
            message: asked.message,
            schema_json: asked.requested_schema_json,
        })),
    }
}

/// An engine outcome -> the wire's result of call `call_id`.
pub fn tool_result(call_id: &str, outcome: &CallOutcome) -> pb::ToolResult {
    use pb::tool_result::Outcome;
    let outcome = match outcome {
        CallOutcome::Output { output_json } => Outcome::Output(pb::ToolOutput {
            output_json: output_json.clone(),
            receipt: String::new(),
        }),
        CallOutcome::Error(error) => Outcome::Error(pb::ToolError {
            error_type: error_type(error.error_type).into(),
            message: error.message.clone(),
            retryable: error.retryable,
            next_allowed_action: next_action(error.next_allowed_action).into(),
        }),
        CallOutcome::Cancelled => Outcome::Cancelled(pb::tool_result::Cancelled {
            reason: String::new(),
        }),
        CallOutcome::NotStarted => Outcome::NotStarted(pb::tool_result::NotStarted {
            reason: String::new(),
        }),
        CallOutcome::Unknown { detail } => Outcome::Unknown(pb::tool_result::OutcomeUnknown {
            detail: detail.clone(),
        }),
        CallOutcome::InputRequired(asked) => {
            Outcome::InputRequired(pb::tool_result::InputRequired {
                message: asked.message.clone(),
                requested_schema_json: asked.schema_json.clone(),
            })
        }
    };
    pb::ToolResult {
        call_id: call_id.to_owned(),
        outcome: Some(outcome),
    }
}

fn rejection(rejection: &Rejection) -> pb::Rejection {
    let kind = match rejection.kind {
        RejectionKind::InvalidDecision => pb::RejectionKind::InvalidDecision,
        RejectionKind::VerificationFailed => pb::RejectionKind::VerificationFailed,
        RejectionKind::Stopped => pb::RejectionKind::Stopped,
    };
    pb::Rejection {
        kind: kind.into(),
        message: rejection.message.clone(),
        refusals: rejection
            .refusals
            .iter()
            .map(|refusal| pb::Refusal {
                call_id: refusal.call_id.as_str().to_owned(),
                error_type: error_type(refusal.error_type).into(),
                message: refusal.message.clone(),
                policy_ids: refusal.policies.clone(),
            })
            .collect(),
    }
}

fn turn(record: &TurnRecord) -> pb::TurnCommitted {
    pb::TurnCommitted {
        turn: record.turn,
        decision: decision(&record.decision),
        results: record
            .results
            .iter()
            .map(|r| tool_result(r.call_id.as_str(), &r.outcome))
            .collect(),
        usage: Some(usage(record.usage)),
        rejection: record.rejection.as_ref().map(rejection),
        plan_digest: record.plan.map(|p| p.to_string()).unwrap_or_default(),
        policy_version: record.policy.clone().unwrap_or_default(),
        checks: checks(&record.checks),
        tool_digests: record
            .tools
            .iter()
            .map(|(tool, digest)| (tool.to_owned(), digest.to_string()))
            .collect(),
        permits: record.permits.iter().map(permit).collect(),
    }
}

/// The wire form of an end.
pub fn ended(end: &EndRecord) -> pb::InvocationEnded {
    pb::InvocationEnded {
        reason: terminal_reason(end.reason).into(),
        detail: end.detail.clone(),
        answer: end.answer.clone(),
        proposal_digest: end.proposal.map(|p| p.to_string()).unwrap_or_default(),
        wait_until: end.wait.map(|wait| timestamp(wait.until)),
        accepted_by: checks(&end.accepted_by),
        input: end.input.as_deref().map(pending_input),
    }
}

/// The wire form of the question a tool of the waiting turn asked.
pub fn pending_input(input: &PendingInput) -> pb::PendingInput {
    pb::PendingInput {
        call_id: input.call_id.as_str().to_owned(),
        tool: input.tool.clone(),
        requested_schema_json: input.schema_json.clone(),
    }
}

/// What a person did with a tool's question -> the wire's (`None`: not a tool's).
pub fn input_action(action: Option<InputAction>) -> pb::InputAction {
    match action {
        None => pb::InputAction::Unspecified,
        Some(InputAction::Accept) => pb::InputAction::Accept,
        Some(InputAction::Decline) => pb::InputAction::Decline,
        Some(InputAction::Cancel) => pb::InputAction::Cancel,
    }
}

/// The wire's action -> the engine's (`None`: unspecified).
pub fn input_action_from(action: pb::InputAction) -> Option<InputAction> {
    match action {
        pb::InputAction::Unspecified => None,
        pb::InputAction::Accept => Some(InputAction::Accept),
        pb::InputAction::Decline => Some(InputAction::Decline),
        pb::InputAction::Cancel => Some(InputAction::Cancel),
    }
}

/// The wire form of an answer a call is sent again with.
pub fn input_answer(answer: &InputAnswer) -> pb::InputAnswer {
    pb::InputAnswer {
        action: input_action(Some(answer.action)).into(),
        content_json: answer.content_json.clone(),
    }
}

/// A protobuf duration -> milliseconds (saturating); `None` when it is negative or not
/// normalized.
pub fn millis(duration: &prost_types::Duration) -> Option<u64> {
    let seconds = u64::try_from(duration.seconds).ok()?;
    let nanos = u64::try_from(duration.nanos)
        .ok()
        .filter(|nanos| *nanos < 1_000_000_000)?;
    Some(
        seconds
            .saturating_mul(1000)
            .saturating_add(nanos / 1_000_000),
    )
}

/// Milliseconds -> a protobuf duration.
pub fn duration(millis: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(millis / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((millis % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// A committed event -> its wire form.
pub fn event(invocation_id: &str, committed_at: UnixMillis, event: &Event) -> pb::Event {
    use pb::event::Body;
    let body = match &event.body {
        EventBody::Turn(record) => Body::Turn(turn(record)),
        EventBody::BatchStarted(record) => Body::BatchStarted(turn(record)),
        EventBody::Ended(end) => Body::Ended(ended(end)),
        EventBody::ApprovalResolved(resolution) => Body::ApprovalResolved(pb::ApprovalResolved {
            proposal_digest: resolution.proposal.to_string(),
            verdict: if resolution.approved {
                pb::ApprovalVerdict::Approve
            } else {
                pb::ApprovalVerdict::Deny
            }
            .into(),
            actor: resolution.actor.clone(),
            comment: resolution.comment.clone(),
            waited: Some(duration(resolution.waited_ms)),
        }),
        EventBody::ClarificationAnswered(answer) => {
            Body::ClarificationAnswered(pb::ClarificationAnswered {
                answer: answer.answer.clone(),
                actor: answer.actor.clone(),
                waited: Some(duration(answer.waited_ms)),
                action: input_action(answer.action).into(),
            })
        }
    };
    pb::Event {
        invocation_id: invocation_id.to_owned(),
        seq: event.seq,
        committed_at: Some(timestamp(committed_at)),
        body: Some(body),
    }
}

/// Milliseconds since the epoch -> a protobuf timestamp.
pub fn timestamp(at: UnixMillis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(at.0 / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((at.0 % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// A protobuf timestamp -> milliseconds since the epoch (sub-millisecond parts dropped);
/// `None` for an instant before the epoch or a timestamp that is not one (nanos out of
/// range).
pub fn unix_millis(at: &prost_types::Timestamp) -> Option<UnixMillis> {
    let seconds = u64::try_from(at.seconds).ok()?;
    let nanos = u64::try_from(at.nanos)
        .ok()
        .filter(|nanos| *nanos < 1_000_000_000)?;
    seconds
        .checked_mul(1000)?
        .checked_add(nanos / 1_000_000)
        .map(UnixMillis)
}

/// Engine totals -> wire usage.
pub fn budget_usage(totals: &Totals) -> pb::BudgetUsage {
    pb::BudgetUsage {
        steps: totals.steps,
        tool_calls: totals.tool_calls,
        input_tokens: totals.input_tokens,
        output_tokens: totals.output_tokens,
        cost_micro_usd: totals.cost.0,
    }
}

/// Engine limits -> the wire budget, with the deadline relative to `started`.
pub fn budget(limits: &Limits, started: UnixMillis) -> pb::Budget {
    pb::Budget {
        max_steps: limits.max_steps,
        max_tool_calls: limits.max_tool_calls,
        max_tokens: limits.max_tokens,
        max_cost_micro_usd: limits.max_cost.map(|max| max.0),
        max_repeated_plan: limits.max_repeated_plan.map_or(0, |n| n.get()),
        deadline: limits
            .deadline
            .map(|deadline| duration(deadline.0.saturating_sub(started.0))),
        max_wait: Some(duration(limits.max_wait_ms)),
    }
}

/// A claim on the wire.
pub fn claim(claim: &Claim) -> pb::Claim {
    pb::Claim {
        invocation_id: claim.invocation_id.clone(),
        actor: claim.actor.clone(),
        tenant: claim.tenant.clone(),
        goal: claim.goal.clone(),
        answer: claim.answer.clone(),
        evidence: claim.evidence.clone(),
        cited: claim.cited.iter().map(cited).collect(),
        effects: claim.effects.iter().map(entry).collect(),
    }
}

fn cited(cited: &Cited) -> pb::CitedResult {
    pb::CitedResult {
        call_id: cited.call_id.clone(),
        turn: cited.turn,
        tool: cited.tool.clone(),
        arguments_json: cited.arguments_json.clone(),
        result: Some(tool_result(&cited.call_id, &cited.outcome)),
    }
}

/// What policy's acceptance rules said.
pub fn acceptance(response: pb::ValidateFinalResponse) -> Acceptance {
    Acceptance {
        accepted: response.accepted,
        reasons: response.reasons,
        checks: response.checks.into_iter().map(check_from).collect(),
        verifiers: response.verifiers,
    }
}

/// A ledger entry as the runtime's.
pub fn effect(entry: pb::EffectEntry) -> Effect {
    let at = |time: Option<prost_types::Timestamp>| {
        time.and_then(|time| SystemTime::try_from(time).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    Effect {
        state: EffectState::from_proto(entry.state()),
        created_at: at(entry.created_at),
        updated_at: at(entry.updated_at),
        invocation_id: entry.invocation_id,
        call_id: entry.call_id,
        effect_key: entry.effect_key,
        attempt: entry.attempt,
        tool: entry.tool,
        receipt: entry.receipt,
        detail: entry.detail,
    }
}

/// The runtime's entry on the wire.
pub fn entry(effect: &Effect) -> pb::EffectEntry {
    pb::EffectEntry {
        invocation_id: effect.invocation_id.clone(),
        call_id: effect.call_id.clone(),
        effect_key: effect.effect_key.clone(),
        attempt: effect.attempt,
        tool: effect.tool.clone(),
        state: effect
            .state
            .map_or(pb::EffectState::Unspecified, EffectState::to_proto)
            .into(),
        receipt: effect.receipt.clone(),
        created_at: Some(effect.created_at.into()),
        updated_at: Some(effect.updated_at.into()),
        detail: effect.detail.clone(),
    }
}

/// A claim on the wire -> the one policy's rules judge. A cited call without a result
/// has an unknown outcome, which no rule takes for an output.
pub fn claim_from(claim: pb::Claim) -> Claim {
    Claim {
        invocation_id: claim.invocation_id,
        actor: claim.actor,
        tenant: claim.tenant,
        goal: claim.goal,
        answer: claim.answer,
        evidence: claim.evidence,
        cited: claim.cited.into_iter().map(cited_from).collect(),
        effects: claim.effects.into_iter().map(effect).collect(),
    }
}

fn cited_from(cited: pb::CitedResult) -> Cited {
    let outcome = match cited.result {
        Some(result) => call_outcome(result),
        None => CallOutcome::Unknown {
            detail: "no result".into(),
        },
    };
    Cited {
        call_id: cited.call_id,
        turn: cited.turn,
        tool: cited.tool,
        arguments_json: cited.arguments_json,
        outcome,
    }
}

/// What the acceptance rules said -> their answer on the wire.
pub fn validate_final_response(acceptance: Acceptance) -> pb::ValidateFinalResponse {
    pb::ValidateFinalResponse {
        accepted: acceptance.accepted,
        reasons: acceptance.reasons,
        checks: checks(&acceptance.checks),
        verifiers: acceptance.verifiers,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentloop_engine::{Fingerprint, Verdict};

    use super::*;

    #[test]
    fn names_are_lowercase_and_unknown_values_are_named() {
        assert_eq!(
            reason_name(pb::TerminalReason::Completed as i32),
            "completed"
        );
        assert_eq!(
            effect_state_name(pb::EffectState::ReconciliationRequired as i32),
            "reconciliation_required"
        );
        assert_eq!(
            effect_state_name(pb::EffectState::OutcomeUnknown as i32),
            "outcome_unknown"
        );
        assert_eq!(effect_state_name(0), "unknown(0)");
        assert_eq!(effect_state_name(99), "unknown(99)");
        assert_eq!(reason_name(999), "unknown(999)");
    }

    #[test]
    fn terminal_reasons_round_trip_and_none_is_unspecified() {
        for reason in TerminalReason::ALL {
            assert_eq!(terminal_reason_from(terminal_reason(reason)), Some(reason));
        }
        assert_eq!(terminal_reason_from(pb::TerminalReason::Unspecified), None);
    }

    #[test]
    fn every_outcome_survives_the_wire() {
        let outcomes = [
            CallOutcome::Output {
                output_json: r#"{"n":12345678901234567890}"#.into(),
            },
            CallOutcome::Error(ToolError {
                error_type: ErrorType::Conflict,
                message: "m".into(),
                retryable: true,
                next_allowed_action: NextAction::AskUser,
            }),
            CallOutcome::Cancelled,
            CallOutcome::NotStarted,
            CallOutcome::Unknown { detail: "d".into() },
        ];
        for outcome in outcomes {
            let wire = tool_result("c", &outcome);
            assert_eq!(call_outcome(wire), outcome);
        }
    }

    #[test]
    fn a_missing_outcome_is_unknown() {
        let empty = pb::ToolResult {
            call_id: "c".into(),
            outcome: None,
        };
        assert!(matches!(call_outcome(empty), CallOutcome::Unknown { .. }));
    }

    #[test]
    fn decisions_survive_the_wire_and_garbage_is_unparseable() {
        let proposals = [
            ProposedDecision::Final {
                answer: "a".into(),
                evidence: vec!["c".into()],
            },
            ProposedDecision::ToolCalls {
                calls: vec![ProposedCall {
                    call_id: "c".into(),
                    tool: "t".into(),
                    arguments_json: "{}".into(),
                }],
            },
            ProposedDecision::RequestApproval {
                summary: "s".into(),
                calls: vec![],
            },
            ProposedDecision::Clarification {
                question: "q".into(),
            },
            ProposedDecision::CannotContinue { reason: "r".into() },
        ];
        for proposal in proposals {
            let response = pb::DecideResponse {
                outcome: decision(&proposal).map(pb::decide_response::Outcome::Decision),
                usage: Some(pb::Usage {
                    input_tokens: 3,
                    output_tokens: 4,
                    cost_micro_usd: Some(9),
                }),
                ..Default::default()
            };
            let (decision, usage) = decided(response);
            assert_eq!(decision, proposal);
            assert_eq!(usage.total(), 7);
            assert_eq!(usage.cost, Some(MicroUsd(9)));
        }
        let invalid = pb::DecideResponse {
            outcome: Some(pb::decide_response::Outcome::Invalid(pb::InvalidOutput {
                reason: "not JSON".into(),
                raw: "call lookup pls".into(),
            })),
            ..Default::default()
        };
        assert_eq!(
            decided(invalid),
            (
                ProposedDecision::Unparseable {
                    text: "call lookup pls".into()
                },
                Usage::default(),
            )
        );
    }

    #[test]
    fn a_judgement_crosses_the_wire_unchanged() {
        let violation = |call: &str, error_type| Refusal {
            call_id: CallId::new(call),
            error_type,
            message: format!("no {call}"),
            policies: vec!["p1".into()],
        };
        for ruling in [Ruling::Allow, Ruling::Deny, Ruling::RequireApproval] {
            let judged = Judgement {
                ruling,
                violations: vec![
                    violation("c1", ErrorType::PermissionDenied),
                    violation("", ErrorType::InvalidArguments),
                ],
                proposal: Some(Fingerprint::of_calls([("lookup", "{}")])),
                policy: Some("v3".into()),
                permits: vec![Permit {
                    call_id: CallId::new("c2"),
                    policies: vec!["p2".into(), "p3".into()],
                }],
            };
            assert_eq!(judgement(evaluate_response(judged.clone())), judged);
        }
        let plain = Judgement {
            ruling: Ruling::Allow,
            violations: Vec::new(),
            proposal: None,
            policy: None,
            permits: Vec::new(),
        };
        assert_eq!(judgement(evaluate_response(plain.clone())), plain);
    }

    #[test]
    fn only_an_explicit_allow_allows() {
        let response = |verdict: pb::Verdict| pb::EvaluateResponse {
            verdict: verdict.into(),
            violations: vec![
                pb::Violation {
                    call_id: "c1".into(),
                    message: "permission denied by policy p1".into(),
                    error_type: pb::ErrorType::PermissionDenied.into(),
                    policy_ids: vec!["p1".into()],
                },
                pb::Violation {
                    call_id: String::new(),
                    message: "the tool-call batch is empty".into(),
                    ..Default::default()
                },
            ],
            policy_version: "v7".into(),
            ..Default::default()
        };
        assert_eq!(
            authorization(response(pb::Verdict::Allow)).verdict,
            Verdict::Allow
        );
        let denied = authorization(response(pb::Verdict::Unspecified));
        assert_eq!(denied.policy.as_deref(), Some("v7"));
        assert_eq!(
            denied.verdict,
            Verdict::Deny {
                reason:
                    "call c1: permission denied by policy p1; call : the tool-call batch is empty"
                        .into(),
                refusals: vec![Refusal {
                    call_id: CallId::new("c1"),
                    error_type: ErrorType::PermissionDenied,
                    message: "permission denied by policy p1".into(),
                    policies: vec!["p1".into()],
                }],
            }
        );
        assert!(matches!(
            authorization(response(pb::Verdict::RequireApproval)).verdict,
            Verdict::RequireApproval { .. }
        ));
    }

    #[test]
    fn an_entry_survives_the_wire_and_an_unknown_state_is_none() {
        // Sub-millisecond times too: an entry's times go back to the caller as they came.
        let at = |seconds, nanos| SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos);
        let runtime = Effect {
            invocation_id: "i".into(),
            call_id: "c".into(),
            effect_key: "k".into(),
            attempt: 2,
            tool: "transfer".into(),
            state: Some(EffectState::OutcomeUnknown),
            receipt: "r".into(),
            detail: "d".into(),
            created_at: at(1_700_000_000, 123_456_789),
            updated_at: at(1_700_000_001, 1),
        };
        let wire_entry = entry(&runtime);
        assert_eq!(wire_entry.state(), pb::EffectState::OutcomeUnknown);
        assert_eq!(effect(wire_entry.clone()), runtime);
        for state in EffectState::ALL {
            let mut with = wire_entry.clone();
            with.state = state.to_proto().into();
            assert_eq!(effect(with).state, Some(state));
        }
        let unknown = pb::EffectEntry {
            state: pb::EffectState::Unspecified.into(),
            ..wire_entry
        };
        assert_eq!(effect(unknown).state, None);
    }

    #[test]
    fn a_claim_survives_the_wire() {
        let cited = |call_id: &str, outcome| Cited {
            call_id: call_id.into(),
            turn: 3,
            tool: "lookup".into(),
            arguments_json: r#"{"key":"k"}"#.into(),
            outcome,
        };
        let claim = Claim {
            invocation_id: "inv-1".into(),
            actor: "ana".into(),
            tenant: "acme".into(),
            goal: "check".into(),
            answer: "gold".into(),
            evidence: vec!["c1".into(), "c2".into()],
            cited: vec![
                cited(
                    "c1",
                    CallOutcome::Output {
                        output_json: "{}".into(),
                    },
                ),
                cited("c2", CallOutcome::Cancelled),
            ],
            effects: Vec::new(),
        };
        assert_eq!(claim_from(self::claim(&claim)), claim);
        let accepted = Acceptance {
            accepted: false,
            reasons: vec!["citations: none".into()],
            checks: Vec::new(),
            verifiers: vec!["ledger".into()],
        };
        assert_eq!(
            acceptance(validate_final_response(accepted.clone())),
            accepted
        );
    }

    /// An output enters the engine without the room its buffer had: a short one in a
    /// buffer of 128 bytes, as `serde_json` starts one, and a long one in a doubled one.
    #[test]
    fn an_output_keeps_no_spare_room() {
        for text in [r#"{"key":"k","value":"v"}"#.to_owned(), "x".repeat(300)] {
            let mut built = String::with_capacity(128.max(2 * text.len()));
            built.push_str(&text);
            assert!(built.capacity() > built.len());
            let outcome = outcome_from(pb::tool_result::Outcome::Output(pb::ToolOutput {
                output_json: built,
                receipt: String::new(),
            }));
            let CallOutcome::Output { output_json } = outcome else {
                panic!("an output became {outcome:?}");
            };
            assert_eq!(output_json, text);
            assert_eq!(output_json.capacity(), output_json.len());
        }
    }
}
