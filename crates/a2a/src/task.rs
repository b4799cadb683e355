//! Tasks as invocations, in pure functions: the task an invocation is, the stream event
//! a committed event is, the goal a client's message states, and the reply a message
//! to a waiting task gives.
//!
//! | invocation | task |
//! |---|---|
//! | pending | submitted |
//! | running | working |
//! | waiting for a clarification, a tool's question or an approval | input-required |
//! | completed | completed: the answer is the artifact, with the checks that accepted it |
//! | cancelled | canceled |
//! | the model said it cannot continue | rejected |
//! | any other end | failed; the typed reason and its detail are the status message |

use agentloop_proto::v1 as pb;
use pb::{decision::Kind, event::Body};
use serde_json::{Map, Value, json};

use crate::A2aError;
use crate::types::{
    Artifact, Message, Part, Role, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};

/// The ID of the artifact that holds a completed task's answer.
pub const ANSWER_ARTIFACT: &str = "answer";

/// The task `invocation` is.
pub fn task(invocation: &pb::Invocation) -> Task {
    let status = status(invocation);
    Task {
        id: invocation.invocation_id.clone(),
        context_id: invocation.invocation_id.clone(),
        artifacts: answer(invocation).into_iter().collect(),
        history: vec![Message {
            message_id: invocation.idempotency_key.clone(),
            context_id: invocation.invocation_id.clone(),
            task_id: invocation.invocation_id.clone(),
            role: Role::User,
            parts: vec![Part::text(invocation.goal.clone())],
            metadata: None,
        }],
        status,
        metadata: None,
    }
}

/// Keeps at most the last `length` messages of `task`'s history (all for `None`).
pub fn keep_history(task: &mut Task, length: Option<usize>) {
    if let Some(length) = length {
        let drop = task.history.len().saturating_sub(length);
        task.history.drain(..drop);
    }
}

/// The state of the invocations a task in `state` may be: the one to list them by.
pub fn invocation_state(state: TaskState) -> pb::InvocationState {
    match state {
        TaskState::Submitted => pb::InvocationState::Pending,
        TaskState::Working => pb::InvocationState::Running,
        TaskState::InputRequired | TaskState::AuthRequired => pb::InvocationState::Waiting,
        TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected => {
            pb::InvocationState::Ended
        }
        TaskState::Unspecified => pb::InvocationState::Unspecified,
    }
}

/// The state of `invocation`, with the agent's words on it.
fn status(invocation: &pb::Invocation) -> TaskStatus {
    let reason = invocation.terminal_reason();
    let state = match invocation.state() {
        pb::InvocationState::Pending | pb::InvocationState::Unspecified => TaskState::Submitted,
        pb::InvocationState::Running => TaskState::Working,
        pb::InvocationState::Waiting => TaskState::InputRequired,
        pb::InvocationState::Ended => match reason {
            pb::TerminalReason::Completed => TaskState::Completed,
            pb::TerminalReason::Cancelled => TaskState::Canceled,
            pb::TerminalReason::CannotContinue => TaskState::Rejected,
            pb::TerminalReason::Unspecified
            | pb::TerminalReason::ApprovalRequired
            | pb::TerminalReason::ClarificationRequired
            | pb::TerminalReason::DeadlineExceeded
            | pb::TerminalReason::MaxSteps
            | pb::TerminalReason::ToolBudgetExhausted
            | pb::TerminalReason::TokenBudgetExhausted
            | pb::TerminalReason::NoProgress
            | pb::TerminalReason::InvalidDecision
            | pb::TerminalReason::ModelError
            | pb::TerminalReason::CheckpointFailed
            | pb::TerminalReason::VerificationFailed
            | pb::TerminalReason::ReconciliationRequired => TaskState::Failed,
        },
    };
    let words = match state {
        TaskState::InputRequired => Some(wanted(invocation)),
        TaskState::Failed | TaskState::Rejected | TaskState::Canceled => {
            let mut text = reason.as_str_name().to_owned();
            if !invocation.terminal_detail.is_empty() {
                text.push_str(": ");
                text.push_str(&invocation.terminal_detail);
            }
            Some(vec![Part::text(text)])
        }
        TaskState::Unspecified
        | TaskState::Submitted
        | TaskState::Working
        | TaskState::Completed
        | TaskState::AuthRequired => None,
    };
    TaskStatus {
        state,
        message: words.map(|parts| agent_message(invocation, parts)),
        timestamp: invocation.updated_at.as_ref().map(ToString::to_string),
    }
}

/// What a waiting invocation asks of the client: the question in words, and a data part
/// saying what kind of reply it takes and what the reply must name.
fn wanted(invocation: &pb::Invocation) -> Vec<Part> {
    if let Some(approval) = &invocation.pending_approval {
        let calls: Vec<Value> = approval
            .calls
            .iter()
            .map(|call| {
                json!({
                    "callId": call.call_id,
                    "tool": call.tool,
                    "arguments": serde_json::from_str::<Value>(&call.arguments_json)
                        .unwrap_or(Value::String(call.arguments_json.clone())),
                })
            })
            .collect();
        let text = match approval.summary.is_empty() {
            true => "These calls need an approval.".to_owned(),
            false => approval.summary.clone(),
        };
        return vec![
            Part::text(text),
            Part::data(json!({
                "kind": "approval",
                "proposalDigest": approval.proposal_digest,
                "calls": calls,
            })),
        ];
    }
    if let Some(input) = &invocation.pending_input {
        let schema =
            serde_json::from_str::<Value>(&input.requested_schema_json).unwrap_or(Value::Null);
        return vec![
            Part::text(invocation.pending_question.clone().unwrap_or_default()),
            Part::data(json!({
                "kind": "input",
                "callId": input.call_id,
                "tool": input.tool,
                "requestedSchema": schema,
            })),
        ];
    }
    vec![
        Part::text(invocation.pending_question.clone().unwrap_or_default()),
        Part::data(json!({"kind": "clarification"})),
    ]
}

/// A completed invocation's answer, with the checks that accepted it and what each
/// rests on.
fn answer(invocation: &pb::Invocation) -> Option<Artifact> {
    if invocation.state() != pb::InvocationState::Ended
        || invocation.terminal_reason() != pb::TerminalReason::Completed
    {
        return None;
    }
    let checks: Vec<Value> = invocation
        .accepted_by
        .iter()
        .map(|check| json!({"name": check.name, "evidence": check.evidence}))
        .collect();
    Some(Artifact {
        artifact_id: ANSWER_ARTIFACT.to_owned(),
        name: "answer".to_owned(),
        parts: vec![
            Part::text(invocation.answer.clone().unwrap_or_default()),
            Part::data(json!({"acceptedBy": checks})),
        ],
    })
}

fn agent_message(invocation: &pb::Invocation, parts: Vec<Part>) -> Message {
    Message {
        message_id: format!("{}-{}", invocation.invocation_id, invocation.last_seq),
        context_id: invocation.invocation_id.clone(),
        task_id: invocation.invocation_id.clone(),
        role: Role::Agent,
        parts,
        metadata: None,
    }
}

/// The stream events that follow `invocation`'s task once it has changed to its
/// current state: the answer's artifact for a completed one, then its status.
pub fn settled(invocation: &pb::Invocation) -> Vec<StreamResponse> {
    let task = task(invocation);
    let mut events: Vec<StreamResponse> = task
        .artifacts
        .into_iter()
        .map(|artifact| {
            StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                artifact,
                append: false,
                last_chunk: true,
            })
        })
        .collect();
    events.push(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
        task_id: task.id,
        context_id: task.context_id,
        status: task.status,
        metadata: Some(seq(invocation.last_seq)),
    }));
    events
}

/// What a committed event of a running task shows a stream: `None` for the event that
/// ends the run (the caller reads the invocation and sends [`settled`]) and for a batch
/// about to start (its turn follows).
pub fn progress(invocation_id: &str, event: &pb::Event) -> Option<StreamResponse> {
    let text = match event.body.as_ref()? {
        Body::Ended(_) | Body::BatchStarted(_) => return None,
        Body::Turn(turn) => turn_words(turn),
        Body::ApprovalResolved(resolved) => match resolved.verdict() {
            pb::ApprovalVerdict::Approve => "approved; running again".to_owned(),
            pb::ApprovalVerdict::Deny | pb::ApprovalVerdict::Unspecified => {
                "denied; running again".to_owned()
            }
        },
        Body::ClarificationAnswered(_) => "answered; running again".to_owned(),
    };
    let message = Message {
        message_id: format!("{invocation_id}-{}", event.seq),
        context_id: invocation_id.to_owned(),
        task_id: invocation_id.to_owned(),
        role: Role::Agent,
        parts: vec![Part::text(text)],
        metadata: None,
    };
    Some(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
        task_id: invocation_id.to_owned(),
        context_id: invocation_id.to_owned(),
        status: TaskStatus {
            state: TaskState::Working,
            message: Some(message),
            timestamp: event.committed_at.as_ref().map(ToString::to_string),
        },
        metadata: Some(seq(event.seq)),
    }))
}

fn seq(seq: u64) -> Map<String, Value> {
    let mut metadata = Map::new();
    metadata.insert("seq".to_owned(), Value::from(seq));
    metadata
}

/// A turn in a line: what the model decided.
fn turn_words(turn: &pb::TurnCommitted) -> String {
    let tools = |calls: &[pb::ToolCall]| {
        calls
            .iter()
            .map(|call| call.tool.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let what = match turn.decision.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::ToolCalls(calls)) => format!("called {}", tools(&calls.calls)),
        Some(Kind::RequestApproval(asked)) => {
            format!("asked to approve {}", tools(&asked.calls))
        }
        Some(Kind::Final(_)) => "proposed an answer".to_owned(),
        Some(Kind::Clarification(_)) => "asked a question".to_owned(),
        Some(Kind::CannotContinue(_)) => "said it cannot continue".to_owned(),
        None => "no decision".to_owned(),
    };
    let refused = match &turn.rejection {
        Some(_) => " (refused)",
        None => "",
    };
    format!("turn {}: {what}{refused}", turn.turn)
}

/// The goal a client's first message states: its text parts, then each data part as
/// JSON, one per paragraph. A file is refused: the agent reads text.
///
/// # Errors
///
/// [`A2aError::ContentTypeNotSupported`] for a file part, [`A2aError::InvalidParams`]
/// for a message with nothing in it.
pub fn goal(message: &Message) -> Result<String, A2aError> {
    let mut paragraphs = Vec::with_capacity(message.parts.len());
    for part in &message.parts {
        match part {
            Part {
                text: Some(text), ..
            } => paragraphs.push(text.clone()),
            Part {
                data: Some(data), ..
            } => paragraphs.push(data.to_string()),
            _ => {
                return Err(A2aError::ContentTypeNotSupported(
                    "this agent reads text and data parts, not files".to_owned(),
                ));
            }
        }
    }
    let goal = paragraphs.join("\n\n");
    match goal.trim().is_empty() {
        true => Err(A2aError::InvalidParams(
            "the message states no task".to_owned(),
        )),
        false => Ok(goal),
    }
}

/// What a message to a waiting task says.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An answer, as `AnswerClarification` takes it: words for the model's question
    /// (action unspecified), or for a tool's question the content (a JSON object as
    /// text) with `accept`, or nothing with `decline` or `cancel`.
    Answer {
        /// The words or the content.
        answer: String,
        /// What the client did with a tool's question.
        action: pb::InputAction,
    },
    /// An approval resolved, naming the proposal the client was shown.
    Resolve {
        /// Approve (`true`) or deny.
        approve: bool,
        /// The digest the input-required status gave.
        proposal_digest: String,
        /// Words for the model.
        comment: String,
    },
}

/// The reply `message` gives to `invocation`, which waits.
///
/// - The model's question takes text.
/// - A tool's question takes a data part holding the object that answers it, or the text
///   `decline` or `cancel`.
/// - An approval takes a data part `{"verdict": "approve" | "deny", "proposalDigest":
///   ..., "comment": ...}` naming the digest the input-required status gave, so that a
///   reply cannot approve calls its writer was not shown.
///
/// # Errors
///
/// [`A2aError::InvalidParams`] for a reply of the wrong form, saying which one is wanted.
pub fn reply(invocation: &pb::Invocation, message: &Message) -> Result<Reply, A2aError> {
    let text = message
        .parts
        .iter()
        .filter_map(|part| part.text.as_deref())
        .collect::<Vec<_>>()
        .join("\n");
    let data = message.parts.iter().find_map(|part| part.data.as_ref());
    if let Some(approval) = &invocation.pending_approval {
        let wrong = || {
            A2aError::InvalidParams(format!(
                "this task waits for an approval: reply with a data part {{\"verdict\": \
                 \"approve\" or \"deny\", \"proposalDigest\": \"{}\"}}",
                approval.proposal_digest
            ))
        };
        let data = data.ok_or_else(wrong)?;
        let approve = match data.get("verdict").and_then(Value::as_str) {
            Some("approve") => true,
            Some("deny") => false,
            _ => return Err(wrong()),
        };
        let proposal_digest = data
            .get("proposalDigest")
            .and_then(Value::as_str)
            .ok_or_else(wrong)?
            .to_owned();
        let comment = data
            .get("comment")
            .and_then(Value::as_str)
            .map_or_else(|| text.clone(), str::to_owned);
        return Ok(Reply::Resolve {
            approve,
            proposal_digest,
            comment,
        });
    }
    if invocation.pending_input.is_some() {
        return match (data, text.trim().to_ascii_lowercase().as_str()) {
            (Some(content @ Value::Object(_)), _) => {
                Ok(answered(content.to_string(), pb::InputAction::Accept))
            }
            (None, "decline") => Ok(answered(String::new(), pb::InputAction::Decline)),
            (None, "cancel") => Ok(answered(String::new(), pb::InputAction::Cancel)),
            _ => Err(A2aError::InvalidParams(
                "this task waits for a tool's question: reply with a data part holding the \
                 object that answers it, or the text decline or cancel"
                    .to_owned(),
            )),
        };
    }
    match text.trim().is_empty() {
        true => Err(A2aError::InvalidParams(
            "this task waits for an answer to its question: reply with text".to_owned(),
        )),
        false => Ok(answered(text, pb::InputAction::Unspecified)),
    }
}

fn answered(answer: String, action: pb::InputAction) -> Reply {
    Reply::Answer { answer, action }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(reason: pb::TerminalReason) -> pb::Invocation {
        pb::Invocation {
            invocation_id: "inv".into(),
            goal: "find it".into(),
            state: pb::InvocationState::Waiting.into(),
            terminal_reason: reason.into(),
            last_seq: 4,
            ..pb::Invocation::default()
        }
    }

    fn says(parts: Vec<Part>) -> Message {
        Message {
            message_id: "m".into(),
            context_id: String::new(),
            task_id: "inv".into(),
            role: Role::User,
            parts,
            metadata: None,
        }
    }

    #[test]
    fn each_state_of_an_invocation_is_a_task_state() {
        let mut invocation = waiting(pb::TerminalReason::ClarificationRequired);
        let cases = [
            (
                pb::InvocationState::Pending,
                pb::TerminalReason::Unspecified,
                TaskState::Submitted,
            ),
            (
                pb::InvocationState::Running,
                pb::TerminalReason::Unspecified,
                TaskState::Working,
            ),
            (
                pb::InvocationState::Waiting,
                pb::TerminalReason::ApprovalRequired,
                TaskState::InputRequired,
            ),
            (
                pb::InvocationState::Ended,
                pb::TerminalReason::Completed,
                TaskState::Completed,
            ),
            (
                pb::InvocationState::Ended,
                pb::TerminalReason::Cancelled,
                TaskState::Canceled,
            ),
            (
                pb::InvocationState::Ended,
                pb::TerminalReason::CannotContinue,
                TaskState::Rejected,
            ),
            (
                pb::InvocationState::Ended,
                pb::TerminalReason::MaxSteps,
                TaskState::Failed,
            ),
        ];
        for (state, reason, expected) in cases {
            invocation.state = state.into();
            invocation.terminal_reason = reason.into();
            assert_eq!(
                task(&invocation).status.state,
                expected,
                "{state:?} {reason:?}"
            );
        }
        invocation.terminal_detail = "10 steps".into();
        invocation.terminal_reason = pb::TerminalReason::MaxSteps.into();
        let failed = task(&invocation).status.message.unwrap();
        assert_eq!(failed.role, Role::Agent);
        assert_eq!(
            failed.parts[0].text.as_deref(),
            Some("TERMINAL_REASON_MAX_STEPS: 10 steps")
        );
    }

    #[test]
    fn a_completed_task_carries_its_answer_and_what_accepted_it() {
        let mut invocation = waiting(pb::TerminalReason::Completed);
        invocation.state = pb::InvocationState::Ended.into();
        invocation.answer = Some("42".into());
        invocation.accepted_by = vec![pb::Check {
            name: "citations".into(),
            evidence: vec!["call-1".into()],
            ..pb::Check::default()
        }];
        let events = settled(&invocation);
        let StreamResponse::ArtifactUpdate(update) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(update.artifact.parts[0].text.as_deref(), Some("42"));
        assert_eq!(
            update.artifact.parts[1].data,
            Some(json!({"acceptedBy": [{"name": "citations", "evidence": ["call-1"]}]}))
        );
        let StreamResponse::StatusUpdate(done) = &events[1] else {
            panic!("{events:?}")
        };
        assert_eq!(done.status.state, TaskState::Completed);
    }

    #[test]
    fn a_question_takes_text() {
        let mut invocation = waiting(pb::TerminalReason::ClarificationRequired);
        invocation.pending_question = Some("Which city?".into());
        let status = task(&invocation).status;
        assert_eq!(
            status.message.unwrap().parts[0].text.as_deref(),
            Some("Which city?")
        );
        assert_eq!(
            reply(&invocation, &says(vec![Part::text("Paris")])),
            Ok(answered("Paris".into(), pb::InputAction::Unspecified))
        );
        assert!(matches!(
            reply(&invocation, &says(vec![Part::data(json!({"a": 1}))])),
            Err(A2aError::InvalidParams(_))
        ));
    }

    #[test]
    fn a_tools_question_takes_an_object_or_decline_or_cancel() {
        let mut invocation = waiting(pb::TerminalReason::ClarificationRequired);
        invocation.pending_question = Some("Your name?".into());
        invocation.pending_input = Some(pb::PendingInput {
            call_id: "c1".into(),
            tool: "form".into(),
            requested_schema_json: r#"{"type":"object"}"#.into(),
        });
        let asked = task(&invocation).status.message.unwrap();
        assert_eq!(
            asked.parts[1].data,
            Some(json!({"kind": "input", "callId": "c1", "tool": "form",
                        "requestedSchema": {"type": "object"}}))
        );
        assert_eq!(
            reply(&invocation, &says(vec![Part::data(json!({"name": "Ada"}))])),
            Ok(answered(
                r#"{"name":"Ada"}"#.into(),
                pb::InputAction::Accept
            ))
        );
        assert_eq!(
            reply(&invocation, &says(vec![Part::text(" Decline ")])),
            Ok(answered(String::new(), pb::InputAction::Decline))
        );
        assert_eq!(
            reply(&invocation, &says(vec![Part::text("cancel")])),
            Ok(answered(String::new(), pb::InputAction::Cancel))
        );
        for wrong in [Part::text("Ada"), Part::data(json!(["Ada"]))] {
            assert!(matches!(
                reply(&invocation, &says(vec![wrong])),
                Err(A2aError::InvalidParams(_))
            ));
        }
    }

    #[test]
    fn an_approval_must_name_the_proposal_it_approves() {
        let mut invocation = waiting(pb::TerminalReason::ApprovalRequired);
        invocation.pending_approval = Some(pb::PendingApproval {
            proposal_digest: "d1".into(),
            summary: "Refund order 7".into(),
            calls: vec![pb::ToolCall {
                call_id: "c1".into(),
                tool: "refund".into(),
                arguments_json: r#"{"order":7}"#.into(),
            }],
        });
        let asked = task(&invocation).status.message.unwrap();
        assert_eq!(
            asked.parts[1].data,
            Some(json!({"kind": "approval", "proposalDigest": "d1",
                        "calls": [{"callId": "c1", "tool": "refund", "arguments": {"order": 7}}]}))
        );
        let approve = says(vec![Part::data(
            json!({"verdict": "approve", "proposalDigest": "d1", "comment": "ok"}),
        )]);
        assert_eq!(
            reply(&invocation, &approve),
            Ok(Reply::Resolve {
                approve: true,
                proposal_digest: "d1".into(),
                comment: "ok".into()
            })
        );
        for wrong in [
            says(vec![Part::text("approve")]),
            says(vec![Part::data(json!({"verdict": "approve"}))]),
            says(vec![Part::data(
                json!({"verdict": "maybe", "proposalDigest": "d1"}),
            )]),
        ] {
            assert!(matches!(
                reply(&invocation, &wrong),
                Err(A2aError::InvalidParams(_))
            ));
        }
    }

    #[test]
    fn a_history_is_cut_to_its_last_messages() {
        let mut task = task(&waiting(pb::TerminalReason::ClarificationRequired));
        keep_history(&mut task, None);
        assert_eq!(task.history.len(), 1);
        keep_history(&mut task, Some(5));
        assert_eq!(task.history.len(), 1);
        keep_history(&mut task, Some(0));
        assert!(task.history.is_empty());
    }

    #[test]
    fn a_goal_is_the_text_and_data_of_the_message_and_never_a_file() {
        let message = says(vec![Part::text("Sum these"), Part::data(json!([1, 2]))]);
        assert_eq!(goal(&message), Ok("Sum these\n\n[1,2]".to_owned()));
        let file = says(vec![Part {
            url: Some("https://example.com/a.pdf".into()),
            ..Part::default()
        }]);
        assert!(matches!(
            goal(&file),
            Err(A2aError::ContentTypeNotSupported(_))
        ));
        assert!(matches!(
            goal(&says(vec![Part::text("  ")])),
            Err(A2aError::InvalidParams(_))
        ));
    }
}
