//! A server's questions for a person (`elicitation/create`, form mode) during a tool
//! call.
//!
//! A person may take hours to answer, and an invocation must survive a crash while it
//! waits, so a tool call is never held open for one. The first send of the call answers
//! the question `cancel` and ends as `input_required` with the question and its schema:
//! the orchestrator commits the turn, waits for the answer, and sends the call again with
//! it. On that send the server asks again, and this time gets the answer. What a server
//! does between the two sends is its own: a server that applies something before it asks
//! must be idempotent under the effect key it is given.
//!
//! MCP's elicitation request does not say which call it belongs to. Over streamable
//! HTTP it comes on the response stream of that call's POST, which rmcp records
//! (`InboundStreamOrigin`): the call with that request ID asked. Otherwise (stdio), with
//! one call in flight on the connection it is that one; with several, nobody can tell,
//! so the question is answered `cancel` and no call waits for it.

use std::sync::{Mutex, PoisonError};

use agentloop_proto::v1::{InputAction, InputAnswer};
use rmcp::model::{ElicitResult, ElicitationAction, RequestId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A question longer than this is cut at a character boundary; a requested schema
/// larger than this (as JSON) fails the call. The gateway takes no larger one from any
/// executor.
pub use agentloop_proto::input::{MAX_QUESTION_BYTES, MAX_QUESTION_SCHEMA_BYTES};

/// What the gateway does with a server's questions for a person.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Elicitation {
    /// Ask a person: the invocation waits for the answer (`clarification_required`).
    #[default]
    Ask,
    /// Accept at once with the schema's defaults when they give every required property
    /// (for unattended servers whose questions have safe defaults); ask a person
    /// otherwise.
    Defaults,
    /// Decline every question, and declare no elicitation capability.
    Decline,
}

impl Elicitation {
    /// Whether it is the default, [`Elicitation::Ask`].
    pub fn is_ask(&self) -> bool {
        *self == Elicitation::Ask
    }
}

/// What became of the questions a call met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Asked {
    /// The server asked this, and it was answered `cancel`: the call waits for a person.
    Question {
        /// The question, cut to [`MAX_QUESTION_BYTES`].
        message: String,
        /// The requested schema, as JSON text.
        schema_json: String,
    },
    /// The call cannot wait for this question; why.
    Refused(String),
}

/// The tool calls in flight on one server's connections, and the questions they met.
#[derive(Debug)]
pub(crate) struct Questions {
    mode: Elicitation,
    calls: Mutex<Calls>,
}

#[derive(Debug, Default)]
struct Calls {
    next: u64,
    flying: Vec<Flying>,
}

#[derive(Debug)]
struct Flying {
    id: u64,
    /// The JSON-RPC ID of its `tools/call`, once sent.
    request: Option<RequestId>,
    /// The answer the call was sent with, until the server's question takes it.
    answer: Option<InputAnswer>,
    /// Whether it had an answer (taken or not).
    answered: bool,
    asked: Option<Asked>,
}

/// A call's place among those in flight; dropping it (the call is over) removes it.
pub(crate) struct InFlight<'a> {
    questions: &'a Questions,
    id: u64,
}

impl Questions {
    pub(crate) fn new(mode: Elicitation) -> Questions {
        Questions {
            mode,
            calls: Mutex::new(Calls::default()),
        }
    }

    /// Whether the gateway tells servers it takes questions.
    pub(crate) fn declared(&self) -> bool {
        self.mode != Elicitation::Decline
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        // A poisoned lock only means a holder panicked between plain stores.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a call in flight, sent with `answer` when it asked before.
    pub(crate) fn fly(&self, answer: Option<InputAnswer>) -> InFlight<'_> {
        let mut calls = self.calls();
        calls.next += 1;
        let id = calls.next;
        let answered = answer.is_some();
        calls.flying.push(Flying {
            id,
            request: None,
            answer,
            answered,
            asked: None,
        });
        InFlight {
            questions: self,
            id,
        }
    }

    /// The answer to a server's form question `message` with `schema`, which came on
    /// the response stream of request `origin`, when the transport knows.
    pub(crate) fn answer(
        &self,
        message: &str,
        schema: &Value,
        origin: Option<&RequestId>,
    ) -> ElicitResult {
        if self.mode == Elicitation::Decline {
            return ElicitResult::new(ElicitationAction::Decline);
        }
        let defaults = (self.mode == Elicitation::Defaults)
            .then(|| defaults_answer(schema))
            .flatten();
        let mut calls = self.calls();
        let in_flight = calls.flying.len();
        let by_origin = origin.and_then(|origin| {
            calls
                .flying
                .iter()
                .position(|call| call.request.as_ref() == Some(origin))
        });
        let asker = match (by_origin, calls.flying.as_mut_slice()) {
            (Some(at), flying) => flying.get_mut(at),
            (None, [call]) => Some(call),
            (None, _) => None,
        };
        let Some(call) = asker else {
            if let Some(content) = defaults {
                return accept(content);
            }
            tracing::warn!(
                in_flight,
                "an MCP server asked a question that no single call can be waiting for; \
                 answered cancel"
            );
            return ElicitResult::new(ElicitationAction::Cancel);
        };
        if let Some(answer) = call.answer.take() {
            return given(&answer);
        }
        if call.answered {
            // The answer was for the first question; one send carries one answer.
            call.asked.get_or_insert(Asked::Refused(
                "the tool asked a second question in one call; agentloop answers one question \
                 per call"
                    .to_owned(),
            ));
            return ElicitResult::new(ElicitationAction::Cancel);
        }
        if let Some(content) = defaults {
            return accept(content);
        }
        let asked = match serde_json::to_string(schema) {
            Ok(schema_json) if schema_json.len() <= MAX_QUESTION_SCHEMA_BYTES => Asked::Question {
                message: agentloop_proto::prefix(message, MAX_QUESTION_BYTES).to_owned(),
                schema_json,
            },
            Ok(_) | Err(_) => Asked::Refused(format!(
                "the tool asked a question whose schema is larger than \
                 {MAX_QUESTION_SCHEMA_BYTES} bytes"
            )),
        };
        // The first question is the one a person answers.
        call.asked.get_or_insert(asked);
        ElicitResult::new(ElicitationAction::Cancel)
    }
}

impl InFlight<'_> {
    /// The call was sent as JSON-RPC request `request`.
    pub(crate) fn sent(&self, request: RequestId) {
        let mut calls = self.questions.calls();
        if let Some(call) = calls.flying.iter_mut().find(|call| call.id == self.id) {
            call.request = Some(request);
        }
    }

    /// What the call's questions came to, once it is over.
    pub(crate) fn asked(&self) -> Option<Asked> {
        let calls = self.questions.calls();
        calls
            .flying
            .iter()
            .find(|call| call.id == self.id)
            .and_then(|call| call.asked.clone())
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.questions
            .calls()
            .flying
            .retain(|call| call.id != self.id);
    }
}

fn accept(content: Map<String, Value>) -> ElicitResult {
    ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content))
}

/// A person's answer as the server gets it. The orchestrator checked the content
/// against the schema (with its defaults) before it committed it.
fn given(answer: &InputAnswer) -> ElicitResult {
    match answer.action() {
        InputAction::Accept => match serde_json::from_str(&answer.content_json) {
            Ok(Value::Object(content)) => accept(content),
            // Not what the orchestrator sends; nothing a server can use.
            Ok(_) | Err(_) => ElicitResult::new(ElicitationAction::Cancel),
        },
        InputAction::Decline => ElicitResult::new(ElicitationAction::Decline),
        InputAction::Cancel | InputAction::Unspecified => {
            ElicitResult::new(ElicitationAction::Cancel)
        }
    }
}

/// The schema's defaults, when they give every property it requires.
fn defaults_answer(schema: &Value) -> Option<Map<String, Value>> {
    let mut content = Map::new();
    agentloop_proto::input::with_defaults(schema, &mut content);
    let required = schema.get("required").and_then(Value::as_array);
    let covered = required.is_none_or(|required| {
        required
            .iter()
            .all(|name| name.as_str().is_some_and(|name| content.contains_key(name)))
    });
    covered.then_some(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tier": {"type": "string", "default": "free"}
            },
            "required": ["name"]
        })
    }

    fn action(result: &ElicitResult) -> ElicitationAction {
        result.action.clone()
    }

    #[test]
    fn a_lone_call_without_an_answer_waits_for_a_person() {
        let questions = Questions::new(Elicitation::Ask);
        let call = questions.fly(None);
        let result = questions.answer("which name?", &schema(), None);
        assert_eq!(action(&result), ElicitationAction::Cancel);
        // Only the first question waits.
        questions.answer("and another?", &schema(), None);
        let Some(Asked::Question {
            message,
            schema_json,
        }) = call.asked()
        else {
            panic!("the call waits: {:?}", call.asked())
        };
        assert_eq!(message, "which name?");
        assert_eq!(
            serde_json::from_str::<Value>(&schema_json).unwrap(),
            schema()
        );
        drop(call);
        assert!(questions.calls().flying.is_empty());
    }

    #[test]
    fn a_call_sent_with_an_answer_gives_it_once() {
        let questions = Questions::new(Elicitation::Ask);
        let call = questions.fly(Some(InputAnswer {
            action: InputAction::Accept.into(),
            content_json: r#"{"name":"ana","tier":"pro"}"#.into(),
        }));
        let result = questions.answer("which name?", &schema(), None);
        assert_eq!(action(&result), ElicitationAction::Accept);
        assert_eq!(
            result.content,
            Some(serde_json::json!({"name": "ana", "tier": "pro"}))
        );
        assert_eq!(call.asked(), None);
        // A second question cannot be answered by the same send.
        let again = questions.answer("and your age?", &schema(), None);
        assert_eq!(action(&again), ElicitationAction::Cancel);
        assert!(matches!(call.asked(), Some(Asked::Refused(_))));
    }

    #[test]
    fn a_decline_and_a_cancel_are_passed_on() {
        let questions = Questions::new(Elicitation::Ask);
        for (given, expected) in [
            (InputAction::Decline, ElicitationAction::Decline),
            (InputAction::Cancel, ElicitationAction::Cancel),
        ] {
            let _call = questions.fly(Some(InputAnswer {
                action: given.into(),
                content_json: String::new(),
            }));
            assert_eq!(action(&questions.answer("q", &schema(), None)), expected);
        }
    }

    #[test]
    fn defaults_answer_when_they_cover_what_is_required() {
        let questions = Questions::new(Elicitation::Defaults);
        let call = questions.fly(None);
        let all_defaults = serde_json::json!({
            "type": "object",
            "properties": {"tier": {"type": "string", "default": "free"}},
            "required": ["tier"]
        });
        let result = questions.answer("tier?", &all_defaults, None);
        assert_eq!(action(&result), ElicitationAction::Accept);
        assert_eq!(result.content, Some(serde_json::json!({"tier": "free"})));
        assert_eq!(call.asked(), None);
        // `name` has no default: a person is asked.
        let result = questions.answer("which name?", &schema(), None);
        assert_eq!(action(&result), ElicitationAction::Cancel);
        assert!(matches!(call.asked(), Some(Asked::Question { .. })));
    }

    #[test]
    fn a_question_no_single_call_can_own_is_cancelled() {
        let questions = Questions::new(Elicitation::Ask);
        assert_eq!(
            action(&questions.answer("q", &schema(), None)),
            ElicitationAction::Cancel
        );
        let first = questions.fly(None);
        let second = questions.fly(None);
        assert_eq!(
            action(&questions.answer("q", &schema(), None)),
            ElicitationAction::Cancel
        );
        assert_eq!(first.asked(), None);
        assert_eq!(second.asked(), None);
    }

    #[test]
    fn the_stream_a_question_came_on_names_the_call_that_asked() {
        let questions = Questions::new(Elicitation::Ask);
        let first = questions.fly(None);
        first.sent(RequestId::Number(7));
        let second = questions.fly(Some(InputAnswer {
            action: InputAction::Accept.into(),
            content_json: r#"{"name":"ana"}"#.into(),
        }));
        second.sent(RequestId::Number(8));
        let asked = questions.answer("which name?", &schema(), Some(&RequestId::Number(7)));
        assert_eq!(action(&asked), ElicitationAction::Cancel);
        assert!(matches!(first.asked(), Some(Asked::Question { .. })));
        let answered = questions.answer("which name?", &schema(), Some(&RequestId::Number(8)));
        assert_eq!(action(&answered), ElicitationAction::Accept);
        assert_eq!(second.asked(), None);
        // A stream no call of these was sent on: nobody can tell.
        let unknown = questions.answer("q", &schema(), Some(&RequestId::Number(9)));
        assert_eq!(action(&unknown), ElicitationAction::Cancel);
    }

    #[test]
    fn decline_declines_everything() {
        let questions = Questions::new(Elicitation::Decline);
        assert!(!questions.declared());
        let call = questions.fly(None);
        assert_eq!(
            action(&questions.answer("q", &schema(), None)),
            ElicitationAction::Decline
        );
        assert_eq!(call.asked(), None);
    }

    #[test]
    fn an_oversized_schema_fails_the_call() {
        let questions = Questions::new(Elicitation::Ask);
        let call = questions.fly(None);
        let big = serde_json::json!({
            "type": "object",
            "description": "x".repeat(MAX_QUESTION_SCHEMA_BYTES)
        });
        questions.answer("q", &big, None);
        assert!(matches!(call.asked(), Some(Asked::Refused(_))));
    }
}
