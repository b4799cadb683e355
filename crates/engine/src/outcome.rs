//! The result of one tool call, and the result of a whole invocation.

use serde::{Deserialize, Serialize};

use crate::decision::CallId;
use crate::money::MicroUsd;
use crate::terminal::TerminalReason;

/// What kind of failure a tool reported, so the model and the retry policy can tell a bad
/// argument from a timeout from a business refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The arguments were refused by the tool.
    InvalidArguments,
    /// The thing asked for does not exist.
    NotFound,
    /// The caller may not do this.
    PermissionDenied,
    /// The call ran out of time.
    Timeout,
    /// The tool or something behind it is unavailable.
    Unavailable,
    /// The request conflicts with the current state.
    Conflict,
    /// A business rule refused the request.
    Rejected,
    /// The tool failed in a way it did not classify.
    Internal,
}

/// What the tool says may be done next after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextAction {
    /// No advice.
    None,
    /// The same call may be tried again.
    Retry,
    /// Try again with different arguments.
    FixArguments,
    /// A human must approve first.
    RequestApproval,
    /// The user must say more.
    AskUser,
    /// Do not go on with this.
    Stop,
}

/// A structured tool error: never flattened into a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    /// The kind of failure.
    pub error_type: ErrorType,
    /// A human-readable message.
    pub message: String,
    /// Whether the same call may succeed if tried again.
    pub retryable: bool,
    /// What the tool advises next.
    pub next_allowed_action: NextAction,
}

/// The one terminal result every call of an executed batch gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    /// The tool answered; its output as JSON text.
    Output {
        /// The output.
        output_json: String,
    },
    /// The tool reported an error.
    Error(ToolError),
    /// The call was started and then cancelled.
    Cancelled,
    /// The call was never started (cancelled before its turn came).
    NotStarted,
    /// Nobody knows whether the call took effect (timed out, cut off).
    Unknown {
        /// What is known.
        detail: String,
    },
    /// The tool cannot finish without a person's answer (an MCP server's elicitation)
    /// and applied nothing: the invocation waits for the answer, then sends the call
    /// again with it. Boxed: rare, and every result of every batch is as large as the
    /// largest kind.
    InputRequired(Box<InputRequest>),
}

/// What a tool asks a person before it can finish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRequest {
    /// The question, shown to the person.
    pub message: String,
    /// The JSON Schema (as JSON text) an accepted answer must satisfy: a flat object of
    /// primitive properties, as MCP's elicitation allows.
    pub schema_json: String,
}

/// What a person did with a tool's question, as MCP's elicitation names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputAction {
    /// Answered, with content that satisfies the requested schema.
    Accept,
    /// Refused to answer.
    Decline,
    /// Dismissed the question without choosing.
    Cancel,
}

impl InputAction {
    /// Its name in snake case, as it is serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            InputAction::Accept => "accept",
            InputAction::Decline => "decline",
            InputAction::Cancel => "cancel",
        }
    }
}

/// A person's answer to a tool's question, sent with the call again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputAnswer {
    /// The call that asked.
    pub call_id: CallId,
    /// What the person did.
    pub action: InputAction,
    /// For `accept`, the content (a JSON object, as text); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_json: String,
    /// The seq of the committed answer: the call is sent again as a new effect, keyed
    /// by it, since the first send was settled as not applied.
    pub seq: u64,
}

impl CallOutcome {
    /// Its kind in snake case, as its serialized tag and `agentloop.tool.outcome` name it:
    /// `output`, `error`, `cancelled`, `not_started`, `unknown` or `input_required`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallOutcome::Output { .. } => "output",
            CallOutcome::Error(_) => "error",
            CallOutcome::Cancelled => "cancelled",
            CallOutcome::NotStarted => "not_started",
            CallOutcome::Unknown { .. } => "unknown",
            CallOutcome::InputRequired(_) => "input_required",
        }
    }
}

/// A call's ID with its outcome, as committed in call order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallResult {
    /// The call.
    pub call_id: CallId,
    /// What happened.
    pub outcome: CallOutcome,
}

/// Totals an invocation has used, as derived from its committed events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Model decisions taken (turns committed).
    pub steps: u32,
    /// Tool calls executed.
    pub tool_calls: u32,
    /// Prompt tokens used.
    pub input_tokens: u64,
    /// Completion tokens used.
    pub output_tokens: u64,
    /// Turn events committed.
    pub turn_events: u32,
    /// Money spent on priced decisions; an unpriced decision adds nothing.
    #[serde(default, rename = "cost_micro_usd")]
    pub cost: MicroUsd,
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Why it ended.
    pub reason: TerminalReason,
    /// A human-readable detail (the validation error, the question, ...).
    pub detail: String,
    /// The answer, when `reason` is `completed`.
    pub answer: Option<String>,
    /// What it used.
    pub totals: Totals,
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn a_kind_is_the_serialized_tag() {
        let every = [
            CallOutcome::Output {
                output_json: "{}".into(),
            },
            CallOutcome::Error(ToolError {
                error_type: ErrorType::Rejected,
                message: "no".into(),
                retryable: false,
                next_allowed_action: NextAction::None,
            }),
            CallOutcome::Cancelled,
            CallOutcome::NotStarted,
            CallOutcome::Unknown {
                detail: "lost".into(),
            },
            CallOutcome::InputRequired(Box::new(InputRequest {
                message: "which account?".into(),
                schema_json: "{}".into(),
            })),
        ];
        for outcome in every {
            let tagged = serde_json::to_value(&outcome).unwrap();
            let tag = tagged
                .as_str()
                .map(str::to_owned)
                .or_else(|| tagged.as_object().and_then(|o| o.keys().next().cloned()))
                .unwrap();
            assert_eq!(outcome.kind(), tag);
        }
    }
}
