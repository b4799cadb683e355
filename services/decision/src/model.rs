//! The model seam: every adapter (scripted today, OpenAI/Anthropic later) implements
//! [`Model`] and hands back a closed [`ModelReply`]; provider formats never leave it.

use std::fmt;

use agentloop_engine::{MicroUsd, ProposedCall, ProposedDecision, Usage};
use agentloop_proto::v1::decide_response::Outcome;
use agentloop_proto::v1::{DecideRequest, DecideResponse, Event, InvalidOutput, ToolDescriptor};

use agentloop_script::{ScriptError, ScriptedCall, ScriptedDecision, ScriptedModel};

/// The name the scripted model reports in `DecideResponse.model`.
pub const SCRIPTED_MODEL_NAME: &str = "scripted";

/// One turn's question to a model, borrowed from whoever asks: a `DecideRequest` at the
/// gRPC edge, the runtime's own values in the same process, where no request is built.
#[derive(Debug, Clone, Copy, Default)]
pub struct Question<'a> {
    /// The invocation.
    pub invocation_id: &'a str,
    /// The turn to decide, from 1.
    pub turn: u32,
    /// The task, in the caller's words.
    pub goal: &'a str,
    /// What came before the window, if the caller summarised it.
    pub summary: &'a str,
    /// The sequence number the window starts from.
    pub context_from_seq: u64,
    /// The window of committed events, oldest first.
    pub history: &'a [Event],
}

impl<'a> From<&'a DecideRequest> for Question<'a> {
    fn from(request: &'a DecideRequest) -> Question<'a> {
        Question {
            invocation_id: &request.invocation_id,
            turn: request.turn,
            goal: &request.goal,
            summary: &request.summary,
            context_from_seq: request.context_from_seq,
            history: &request.history,
        }
    }
}

/// What a model proposed for one turn, in the engine's terms (and in a cassette).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proposal {
    /// A decision, which the engine judges.
    Decision(ProposedDecision),
    /// Output that is no decision.
    Invalid {
        /// Why it is none.
        reason: String,
        /// The output, bounded.
        raw: String,
    },
}

impl Proposal {
    /// What the engine is given: output that is no decision is `Unparseable`.
    pub fn proposed(self) -> ProposedDecision {
        match self {
            Proposal::Decision(decision) => decision,
            Proposal::Invalid { reason, raw } => ProposedDecision::unparseable(reason, raw),
        }
    }
}

/// What a model produced for one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelReply {
    /// A decision, or output that is not one.
    pub proposal: Proposal,
    /// Tokens the call consumed (also for invalid output), and their cost.
    pub usage: Usage,
    /// The model that answered, as the provider names it.
    pub model: String,
    /// The provider's response ID; empty when there is none.
    pub response_id: String,
}

/// What a model reads, as an answer tells the caller.
impl From<Reads> for agentloop_proto::v1::Reads {
    fn from(reads: Reads) -> Self {
        Self {
            history: u32::try_from(reads.history).unwrap_or(u32::MAX),
            tools: reads.tools,
        }
    }
}

/// The reply on the wire: the one place the decision service converts its answer.
impl From<ModelReply> for DecideResponse {
    fn from(reply: ModelReply) -> Self {
        let outcome = match reply.proposal {
            Proposal::Decision(decision) => match agentloop_wire::decision(&decision) {
                Some(decision) => Outcome::Decision(decision),
                None => Outcome::Invalid(InvalidOutput {
                    reason: "the output is not a decision".to_owned(),
                    raw: match decision {
                        ProposedDecision::Unparseable { text } => text,
                        ProposedDecision::Final { .. }
                        | ProposedDecision::ToolCalls { .. }
                        | ProposedDecision::RequestApproval { .. }
                        | ProposedDecision::Clarification { .. }
                        | ProposedDecision::CannotContinue { .. } => String::new(),
                    },
                }),
            },
            Proposal::Invalid { reason, raw } => Outcome::Invalid(InvalidOutput { reason, raw }),
        };
        DecideResponse {
            outcome: Some(outcome),
            usage: Some(agentloop_wire::usage(reply.usage)),
            model: reply.model,
            response_id: reply.response_id,
            reads: None,
        }
    }
}

/// Why no reply could be produced. Mapped to a gRPC status in one place
/// (`impl From<ModelError> for tonic::Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The request itself is wrong (missing invocation ID, turn 0, ...): INVALID_ARGUMENT.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request's scripted model does not parse: INVALID_ARGUMENT.
    #[error("invalid scripted_model_json: {0}")]
    Script(#[from] ScriptError),
    /// Neither the request nor the server configuration names a model: FAILED_PRECONDITION.
    #[error(
        "no model configured: the request has no scripted_model_json and the server has no default script (config `script_file`)"
    )]
    NoModel,
    /// The script has no turn for this number and does not repeat its last one:
    /// FAILED_PRECONDITION (asking again cannot help; the orchestrator maps it to
    /// model_error).
    #[error("scripted model has no turn {turn} (it has {turns} turns and repeat_last is false)")]
    NoSuchTurn {
        /// The turn asked for.
        turn: u32,
        /// Turns in the script.
        turns: usize,
    },
    /// A cassette has no decision for what the runtime asks now (a tool answered
    /// differently than when it was recorded): FAILED_PRECONDITION, so the invocation
    /// ends `model_error` with the turn named.
    #[error("the replay diverges at {0}")]
    Diverged(String),
    /// The provider failed (a scripted `model_error`, later: unreachable, quota, an
    /// error response): UNAVAILABLE.
    #[error("model provider failed: {0}")]
    Provider(String),
}

impl From<ModelError> for tonic::Status {
    fn from(error: ModelError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            ModelError::InvalidRequest(_) | ModelError::Script(_) => {
                tonic::Status::invalid_argument(message)
            }
            ModelError::NoModel | ModelError::NoSuchTurn { .. } | ModelError::Diverged(_) => {
                tonic::Status::failed_precondition(message)
            }
            ModelError::Provider(_) => tonic::Status::unavailable(message),
        }
    }
}

/// What of a request a model reads, beside the turn's number and the invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    /// How many of the last history events.
    pub history: usize,
    /// Whether the tools offered.
    pub tools: bool,
}

impl Reads {
    /// Everything: the whole window (up to [`crate::MAX_HISTORY_EVENTS`]) and the tools.
    pub const ALL: Reads = Reads {
        history: crate::MAX_HISTORY_EVENTS,
        tools: true,
    };

    /// Nothing but the turn's number.
    pub const NOTHING: Reads = Reads {
        history: 0,
        tools: false,
    };
}

/// A model adapter. Implementations are object-safe (`Arc<dyn Model>`) and must be
/// cancel-safe: the server drops the future when the client goes away.
#[async_trait::async_trait]
pub trait Model: Send + Sync + fmt::Debug {
    /// Proposes the decision for `request.turn`, offering the model `tools`; the
    /// request's own `tools` field is not read. The tools come apart so that a caller
    /// in the same process can share one list among all the invocations that may call
    /// the same tools, instead of a copy in each request.
    ///
    /// # Errors
    ///
    /// A [`ModelError`]; a provider failure is [`ModelError::Provider`], while output
    /// that is not a decision is an `Ok` reply with an `InvalidOutput` outcome.
    async fn decide_with(
        &self,
        question: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError>;

    /// [`Model::decide_with`] a request and its own tools.
    ///
    /// # Errors
    ///
    /// As [`Model::decide_with`].
    async fn decide(&self, request: &DecideRequest) -> Result<ModelReply, ModelError> {
        self.decide_with(&Question::from(request), &request.tools)
            .await
    }

    /// What of a request it reads ([`Reads::ALL`] unless it says less). A caller in the
    /// same process that keeps the history and the tools in other forms converts only
    /// these.
    fn reads(&self) -> Reads {
        Reads::ALL
    }

    /// Who serves it, as `gen_ai.provider.name` and the metrics' `provider` label name
    /// it (`openai`, `anthropic`, `scripted`).
    fn provider(&self) -> &'static str;

    /// The model it asks for, as configured (`gen_ai.request.model`, the `model` label).
    fn request_model(&self) -> &str;
}

fn call(call: &ScriptedCall) -> ProposedCall {
    ProposedCall {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments_json.clone(),
    }
}

#[async_trait::async_trait]
impl Model for ScriptedModel {
    /// Nothing: a script decides by the turn's number alone.
    fn reads(&self) -> Reads {
        Reads::NOTHING
    }

    fn provider(&self) -> &'static str {
        SCRIPTED_MODEL_NAME
    }

    fn request_model(&self) -> &str {
        SCRIPTED_MODEL_NAME
    }

    async fn decide_with(
        &self,
        request: &Question<'_>,
        _tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        if request.turn == 0 {
            return Err(ModelError::InvalidRequest("turn must be 1 or more".into()));
        }
        let turn = self.turn(request.turn).ok_or(ModelError::NoSuchTurn {
            turn: request.turn,
            turns: self.turns().len(),
        })?;
        if !turn.delay.is_zero() {
            // Dropping the request future (client gone, deadline) drops this sleep.
            tokio::time::sleep(turn.delay).await;
        }
        let proposal = match &turn.decision {
            ScriptedDecision::ToolCalls(calls) => ProposedDecision::ToolCalls {
                calls: calls.iter().map(call).collect(),
            },
            ScriptedDecision::Final { answer, evidence } => ProposedDecision::Final {
                answer: answer.clone(),
                evidence: evidence.clone(),
            },
            ScriptedDecision::RequestApproval { summary, calls } => {
                ProposedDecision::RequestApproval {
                    summary: summary.clone(),
                    calls: calls.iter().map(call).collect(),
                }
            }
            ScriptedDecision::Clarification(question) => ProposedDecision::Clarification {
                question: question.clone(),
            },
            ScriptedDecision::CannotContinue(reason) => ProposedDecision::CannotContinue {
                reason: reason.clone(),
            },
            ScriptedDecision::ModelError(message) => {
                return Err(ModelError::Provider(message.clone()));
            }
            ScriptedDecision::Raw(text) => {
                let invalid = Proposal::Invalid {
                    reason: "the scripted model produced raw output that is not a decision".into(),
                    raw: text.clone(),
                };
                return Ok(scripted_reply(invalid, turn, request));
            }
        };
        Ok(scripted_reply(Proposal::Decision(proposal), turn, request))
    }
}

/// A scripted turn's reply, with the usage the script gives it.
fn scripted_reply(
    proposal: Proposal,
    turn: &agentloop_script::ScriptedTurn,
    request: &Question<'_>,
) -> ModelReply {
    ModelReply {
        proposal,
        usage: Usage {
            input_tokens: turn.usage.input_tokens,
            output_tokens: turn.usage.output_tokens,
            cost: turn.usage.cost_micro_usd.map(MicroUsd),
        },
        model: SCRIPTED_MODEL_NAME.into(),
        response_id: format!("scripted-{}-{}", request.invocation_id, request.turn),
    }
}
