//! Provider adapters: OpenAI Chat Completions and Anthropic Messages over HTTP. What
//! they share: configuration, the retrying transport, the neutral prompt and the
//! conversion of a provider's answer into a closed `Decision`.

pub(crate) mod anthropic;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod http;
pub(crate) mod openai;

use agentloop_proto::v1::decide_response::Outcome;
use agentloop_proto::v1::decision::{CannotContinue, Final, Kind, ToolCalls};
use agentloop_proto::v1::{DecideRequest, Decision, InvalidOutput, ToolCall};

/// Most raw output quoted in an `InvalidOutput`.
const MAX_RAW_BYTES: usize = 4096;

/// Most tool calls taken from one response; more is invalid output.
pub const MAX_CALLS_PER_RESPONSE: usize = 64;

/// A tool call as a provider returned it, before validation.
pub(crate) struct RawCall<'a> {
    pub(crate) id: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    /// The arguments as JSON text.
    pub(crate) arguments: String,
}

pub(crate) fn decision(kind: Kind) -> Outcome {
    Outcome::Decision(Decision { kind: Some(kind) })
}

pub(crate) fn invalid(reason: impl Into<String>, raw: &str) -> Outcome {
    Outcome::Invalid(InvalidOutput {
        reason: reason.into(),
        raw: context::truncate(raw, MAX_RAW_BYTES),
    })
}

pub(crate) fn cannot_continue(reason: &str) -> Outcome {
    decision(Kind::CannotContinue(CannotContinue {
        reason: reason.to_owned(),
    }))
}

pub(crate) fn final_answer(text: String) -> Outcome {
    decision(Kind::Final(Final { answer: text }))
}

/// Tool calls become a `ToolCalls` decision; malformed arguments or a missing name make
/// the whole output invalid (the engine turns that into a repair turn or
/// invalid_decision). Unknown tools and non-object arguments pass: policy judges them.
pub(crate) fn tool_calls(request: &DecideRequest, raw: &[RawCall<'_>]) -> Outcome {
    if raw.len() > MAX_CALLS_PER_RESPONSE {
        return invalid(
            format!(
                "{} tool calls in one response; at most {MAX_CALLS_PER_RESPONSE} are accepted",
                raw.len()
            ),
            "",
        );
    }
    for (index, call) in raw.iter().enumerate() {
        let Some(name) = call.name.filter(|n| !n.trim().is_empty()) else {
            return invalid(
                format!("tool call {index} has no tool name"),
                &call.arguments,
            );
        };
        if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments) {
            return invalid(
                format!("tool call {index} ({name}): arguments are not valid JSON: {error}"),
                &call.arguments,
            );
        }
    }
    let used = context::history_call_ids(request);
    let ids: Vec<Option<&str>> = raw.iter().map(|c| c.id).collect();
    let ids = context::assign_ids(request.turn, &ids, &used);
    let calls = raw
        .iter()
        .zip(ids)
        .map(|(call, call_id)| ToolCall {
            call_id,
            tool: call.name.unwrap_or_default().to_owned(),
            arguments_json: call.arguments.clone(),
        })
        .collect();
    decision(Kind::ToolCalls(ToolCalls { calls }))
}

/// A tool's input schema as JSON; a descriptor with none (or a broken one) gets the
/// schema of "any object", since providers require one.
pub(crate) fn schema(text: &str) -> serde_json::Value {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({"type": "object"}))
}

/// A u64 field of a JSON object, 0 when absent.
pub(crate) fn tokens(value: &serde_json::Value, field: &str) -> u64 {
    value
        .get(field)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}
