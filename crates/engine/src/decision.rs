//! Decisions: what the model proposes, and the validated form the engine acts on.
//!
//! A [`ProposedDecision`] is untrusted text from a model adapter and is what the event log
//! records, so that even a rejected proposal stays auditable. [`validate`] turns it into
//! a [`Decision`] or a [`DecisionError`] that names what was wrong.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::canonical::{Fingerprint, canonical_json};
use crate::catalog::ToolCatalog;
use crate::money::MicroUsd;

/// One tool call as the model proposed it: nothing checked yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposedCall {
    /// The model's ID for this call; results are correlated by it.
    pub call_id: String,
    /// The tool to call.
    pub tool: String,
    /// The arguments, as JSON text (kept as text: integers beyond 53 bits survive).
    pub arguments_json: String,
}

/// What the model proposed for this turn, unvalidated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposedDecision {
    /// A final answer (a claim, until verified).
    Final {
        /// The answer text.
        answer: String,
        /// The call IDs of the committed results the answer says it rests on.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evidence: Vec<String>,
    },
    /// A batch of tool calls to execute.
    ToolCalls {
        /// The calls, in the model's order.
        calls: Vec<ProposedCall>,
    },
    /// Calls the model wants a human to approve first.
    RequestApproval {
        /// What is being asked, for the human.
        summary: String,
        /// The exact calls the approval would cover.
        calls: Vec<ProposedCall>,
    },
    /// A question the user must answer.
    Clarification {
        /// The question.
        question: String,
    },
    /// The model gives up, saying why.
    CannotContinue {
        /// The model's reason.
        reason: String,
    },
    /// Output the adapter could not parse into any of the above.
    Unparseable {
        /// The raw output, for the log.
        text: String,
    },
}

impl ProposedDecision {
    /// Output that is no decision, kept for the log: the output itself, or why it is
    /// none when there is no output to show.
    pub fn unparseable(reason: String, raw: String) -> ProposedDecision {
        ProposedDecision::Unparseable {
            text: if raw.is_empty() { reason } else { raw },
        }
    }
}

/// A call ID that passed validation: non-empty and unique within its batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(String);

impl CallId {
    /// Wraps an ID. Validation of proposals is done by [`validate`]; this is for results
    /// and tests that name an existing call.
    pub fn new(id: impl Into<String>) -> CallId {
        CallId(id.into())
    }

    /// The ID text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated tool call: known tool, unique ID, arguments a JSON object within bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's ID.
    pub call_id: CallId,
    /// The tool, known to the catalog.
    pub tool: String,
    /// The arguments exactly as proposed (forwarded to the executor unchanged).
    pub arguments_json: String,
}

/// A validated decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A final answer.
    Final(FinalAnswer),
    /// Tool calls to execute, with the fingerprint of the plan.
    ToolCalls(ValidBatch),
    /// Calls that need approval, bound to their fingerprint.
    RequestApproval {
        /// What is being asked.
        summary: String,
        /// The calls.
        batch: ValidBatch,
    },
    /// A question for the user.
    Clarification(String),
    /// The model gives up.
    CannotContinue(String),
}

/// A final answer with the calls it cites; whether those are committed outputs is for
/// the verification that follows, which sees the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalAnswer {
    /// The answer, not empty.
    pub answer: String,
    /// The cited call IDs, each within the call-ID bound, without repeats, in the
    /// model's order.
    pub evidence: Vec<CallId>,
}

/// A non-empty batch of validated calls and the digest of what they do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidBatch {
    /// The calls, in the model's order.
    pub calls: Vec<ToolCall>,
    /// Order-insensitive digest of (tool, canonical arguments).
    pub fingerprint: Fingerprint,
}

/// Bounds on what a single decision may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DecisionBounds {
    /// Most calls in one batch.
    pub max_batch_calls: usize,
    /// Largest arguments text of one call, in bytes.
    pub max_arguments_bytes: usize,
    /// Longest call ID, in bytes.
    pub max_call_id_bytes: usize,
    /// Most call IDs a final answer may cite.
    pub max_evidence: usize,
}

impl Default for DecisionBounds {
    fn default() -> Self {
        DecisionBounds {
            max_batch_calls: 32,
            max_arguments_bytes: 64 * 1024,
            max_call_id_bytes: 128,
            max_evidence: 64,
        }
    }
}

/// Why a proposed decision is not a valid one. Fed back to the model on a repair turn and
/// recorded as the detail of `invalid_decision`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DecisionError {
    /// A tool-call batch with no calls.
    #[error("the tool-call batch is empty")]
    EmptyBatch,
    /// More calls than a batch may carry.
    #[error("the batch has {calls} calls; at most {limit} are allowed")]
    BatchTooLarge {
        /// Calls proposed.
        calls: usize,
        /// The bound.
        limit: usize,
    },
    /// A call without an ID.
    #[error("call #{index} has no call ID")]
    MissingCallId {
        /// Position of the call in the batch (0-based).
        index: usize,
    },
    /// A call ID longer than allowed.
    #[error("call #{index} has a call ID of {bytes} bytes; at most {limit} are allowed")]
    CallIdTooLong {
        /// Position of the call.
        index: usize,
        /// Its length.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// Two calls in one batch share an ID.
    #[error("call ID {call_id:?} is used twice in one batch")]
    DuplicateCallId {
        /// The repeated ID.
        call_id: String,
    },
    /// A tool the invocation does not have.
    #[error("call {call_id:?} names unknown tool {tool:?}")]
    UnknownTool {
        /// The call.
        call_id: String,
        /// The tool name proposed.
        tool: String,
    },
    /// Arguments larger than allowed.
    #[error("call {call_id:?} has {bytes} bytes of arguments; at most {limit} are allowed")]
    ArgumentsTooLarge {
        /// The call.
        call_id: String,
        /// Size of the arguments text.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// Arguments that do not parse as JSON.
    #[error("call {call_id:?} has arguments that are not JSON: {detail}")]
    ArgumentsNotJson {
        /// The call.
        call_id: String,
        /// The parser's message.
        detail: String,
    },
    /// Arguments that are JSON but not an object.
    #[error("call {call_id:?} has arguments that are not a JSON object")]
    ArgumentsNotObject {
        /// The call.
        call_id: String,
    },
    /// A final answer citing more results than allowed.
    #[error("the answer cites {cited} results; at most {limit} are allowed")]
    TooMuchEvidence {
        /// Citations given.
        cited: usize,
        /// The bound.
        limit: usize,
    },
    /// A citation that cannot be a call ID.
    #[error("evidence #{index} is not a call ID (empty, or longer than {limit} bytes)")]
    BadEvidence {
        /// Position of the citation (0-based).
        index: usize,
        /// The call-ID bound.
        limit: usize,
    },
    /// A final answer, question or reason with no text.
    #[error("the {field} is empty")]
    EmptyText {
        /// Which text: `answer`, `question`, `reason` or `summary`.
        field: String,
    },
    /// Output the adapter could not parse.
    #[error("the model output is not a decision")]
    Unparseable,
}

/// Checks a proposal against the catalog and the bounds.
pub fn validate(
    proposed: &ProposedDecision,
    catalog: &ToolCatalog,
    bounds: &DecisionBounds,
) -> Result<Decision, DecisionError> {
    match proposed {
        ProposedDecision::Final { answer, evidence } => Ok(Decision::Final(FinalAnswer {
            answer: non_empty("answer", answer)?,
            evidence: validate_evidence(evidence, bounds)?,
        })),
        ProposedDecision::ToolCalls { calls } => {
            Ok(Decision::ToolCalls(validate_batch(calls, catalog, bounds)?))
        }
        ProposedDecision::RequestApproval { summary, calls } => Ok(Decision::RequestApproval {
            summary: non_empty("summary", summary)?,
            batch: validate_batch(calls, catalog, bounds)?,
        }),
        ProposedDecision::Clarification { question } => {
            Ok(Decision::Clarification(non_empty("question", question)?))
        }
        ProposedDecision::CannotContinue { reason } => {
            Ok(Decision::CannotContinue(non_empty("reason", reason)?))
        }
        ProposedDecision::Unparseable { .. } => Err(DecisionError::Unparseable),
    }
}

fn validate_evidence(
    evidence: &[String],
    bounds: &DecisionBounds,
) -> Result<Vec<CallId>, DecisionError> {
    if evidence.len() > bounds.max_evidence {
        return Err(DecisionError::TooMuchEvidence {
            cited: evidence.len(),
            limit: bounds.max_evidence,
        });
    }
    let mut cited: Vec<CallId> = Vec::with_capacity(evidence.len());
    for (index, id) in evidence.iter().enumerate() {
        if id.trim().is_empty() || id.len() > bounds.max_call_id_bytes {
            return Err(DecisionError::BadEvidence {
                index,
                limit: bounds.max_call_id_bytes,
            });
        }
        // Citing a result twice says no more than citing it once.
        if !cited.iter().any(|c| c.as_str() == id) {
            cited.push(CallId::new(id.as_str()));
        }
    }
    Ok(cited)
}

fn non_empty(field: &str, text: &str) -> Result<String, DecisionError> {
    if text.trim().is_empty() {
        return Err(DecisionError::EmptyText {
            field: field.to_owned(),
        });
    }
    Ok(text.to_owned())
}

/// Validates a batch and computes its fingerprint. Shared by the live path and by
/// [`crate::Invocation::restore`], which recomputes fingerprints from the log.
pub(crate) fn validate_batch(
    calls: &[ProposedCall],
    catalog: &ToolCatalog,
    bounds: &DecisionBounds,
) -> Result<ValidBatch, DecisionError> {
    if calls.is_empty() {
        return Err(DecisionError::EmptyBatch);
    }
    if calls.len() > bounds.max_batch_calls {
        return Err(DecisionError::BatchTooLarge {
            calls: calls.len(),
            limit: bounds.max_batch_calls,
        });
    }
    let mut seen = HashSet::with_capacity(calls.len());
    let mut validated = Vec::with_capacity(calls.len());
    let mut canonical = Vec::with_capacity(calls.len());
    for (index, call) in calls.iter().enumerate() {
        if call.call_id.trim().is_empty() {
            return Err(DecisionError::MissingCallId { index });
        }
        if call.call_id.len() > bounds.max_call_id_bytes {
            return Err(DecisionError::CallIdTooLong {
                index,
                bytes: call.call_id.len(),
                limit: bounds.max_call_id_bytes,
            });
        }
        if !seen.insert(call.call_id.as_str()) {
            return Err(DecisionError::DuplicateCallId {
                call_id: call.call_id.clone(),
            });
        }
        if catalog.get(&call.tool).is_none() {
            return Err(DecisionError::UnknownTool {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
            });
        }
        if call.arguments_json.len() > bounds.max_arguments_bytes {
            return Err(DecisionError::ArgumentsTooLarge {
                call_id: call.call_id.clone(),
                bytes: call.arguments_json.len(),
                limit: bounds.max_arguments_bytes,
            });
        }
        let value: serde_json::Value = serde_json::from_str(&call.arguments_json).map_err(|e| {
            DecisionError::ArgumentsNotJson {
                call_id: call.call_id.clone(),
                detail: e.to_string(),
            }
        })?;
        if !value.is_object() {
            return Err(DecisionError::ArgumentsNotObject {
                call_id: call.call_id.clone(),
            });
        }
        canonical.push(canonical_json(&value));
        validated.push(ToolCall {
            call_id: CallId::new(call.call_id.clone()),
            tool: call.tool.clone(),
            arguments_json: call.arguments_json.clone(),
        });
    }
    let fingerprint = Fingerprint::of_calls(
        validated
            .iter()
            .zip(&canonical)
            .map(|(call, args)| (call.tool.as_str(), args.as_str())),
    );
    Ok(ValidBatch {
        calls: validated,
        fingerprint,
    })
}

/// What one model call consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// What the call cost, from the decision service's price table; `None` when the model
    /// has no price, which is not the same as free: a cost budget refuses it. Absent from
    /// histories recorded before costs existed, which therefore load as unpriced.
    #[serde(
        default,
        rename = "cost_micro_usd",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost: Option<MicroUsd>,
}

impl Usage {
    /// Input plus output, saturating.
    pub const fn total(self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ToolSpec;

    fn call(id: &str, tool: &str, args: &str) -> ProposedCall {
        ProposedCall {
            call_id: id.into(),
            tool: tool.into(),
            arguments_json: args.into(),
        }
    }

    fn check(calls: Vec<ProposedCall>) -> Result<Decision, DecisionError> {
        let catalog = ToolCatalog::new().with("lookup", ToolSpec::read_only());
        validate(
            &ProposedDecision::ToolCalls { calls },
            &catalog,
            &DecisionBounds::default(),
        )
    }

    #[test]
    fn each_structural_fault_is_named() {
        assert_eq!(check(vec![]), Err(DecisionError::EmptyBatch));
        assert_eq!(
            check(vec![call(" ", "lookup", "{}")]),
            Err(DecisionError::MissingCallId { index: 0 })
        );
        assert_eq!(
            check(vec![call("a", "lookup", "{}"), call("a", "lookup", "{}")]),
            Err(DecisionError::DuplicateCallId {
                call_id: "a".into()
            })
        );
        assert_eq!(
            check(vec![call("a", "delete_everything", "{}")]),
            Err(DecisionError::UnknownTool {
                call_id: "a".into(),
                tool: "delete_everything".into()
            })
        );
        assert!(matches!(
            check(vec![call("a", "lookup", "{key:")]),
            Err(DecisionError::ArgumentsNotJson { call_id, .. }) if call_id == "a"
        ));
        assert_eq!(
            check(vec![call("a", "lookup", "[1]")]),
            Err(DecisionError::ArgumentsNotObject {
                call_id: "a".into()
            })
        );
        let huge = format!("{{\"k\":\"{}\"}}", "x".repeat(70_000));
        assert!(matches!(
            check(vec![call("a", "lookup", &huge)]),
            Err(DecisionError::ArgumentsTooLarge { .. })
        ));
        let many: Vec<_> = (0..33)
            .map(|i| call(&format!("c{i}"), "lookup", "{}"))
            .collect();
        assert_eq!(
            check(many),
            Err(DecisionError::BatchTooLarge {
                calls: 33,
                limit: 32
            })
        );
        let long_id = "i".repeat(129);
        assert!(matches!(
            check(vec![call(&long_id, "lookup", "{}")]),
            Err(DecisionError::CallIdTooLong { .. })
        ));
    }

    #[test]
    fn texts_must_not_be_blank() {
        let catalog = ToolCatalog::new();
        let bounds = DecisionBounds::default();
        for (proposed, field) in [
            (
                ProposedDecision::Final {
                    answer: " ".into(),
                    evidence: Vec::new(),
                },
                "answer",
            ),
            (
                ProposedDecision::Clarification {
                    question: String::new(),
                },
                "question",
            ),
            (
                ProposedDecision::CannotContinue {
                    reason: "\n".into(),
                },
                "reason",
            ),
        ] {
            assert_eq!(
                validate(&proposed, &catalog, &bounds),
                Err(DecisionError::EmptyText {
                    field: field.into()
                })
            );
        }
        assert_eq!(
            validate(
                &ProposedDecision::Unparseable { text: "hm".into() },
                &catalog,
                &bounds
            ),
            Err(DecisionError::Unparseable)
        );
    }

    #[test]
    fn a_valid_batch_keeps_arguments_verbatim() {
        let big = r#"{"amount": 12345678901234567890}"#;
        let Ok(Decision::ToolCalls(batch)) = check(vec![call("a", "lookup", big)]) else {
            panic!("expected a batch");
        };
        assert_eq!(batch.calls[0].arguments_json, big);
        assert_eq!(batch.calls[0].call_id.as_str(), "a");
    }
}
