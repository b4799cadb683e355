//! The span and attribute names agentloop records, in one place.
//!
//! The `gen_ai.*` names follow the OpenTelemetry semantic conventions for generative AI
//! (agent, model and tool spans); the Rust semconv crate marks its GenAI constants
//! deprecated while the conventions move, so they are written here once and every
//! service uses these. The `rpc.*` names are those of the RPC conventions for gRPC.
//! `agentloop.*` are this project's own.

/// `gen_ai.operation.name`: `invoke_agent`, `chat` or `execute_tool`.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// `gen_ai.provider.name`: `openai`, `anthropic`, ... (the model's provider).
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// `gen_ai.request.model`: the model asked for.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// `gen_ai.response.model`: the model that answered.
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// `gen_ai.usage.input_tokens`.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// `gen_ai.usage.output_tokens`.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `gen_ai.agent.name`: the invocation's profile.
pub const GEN_AI_AGENT_NAME: &str = "gen_ai.agent.name";
/// `gen_ai.conversation.id`: the invocation ID, which groups its model calls.
pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
/// `gen_ai.tool.name`.
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
/// `gen_ai.tool.call.id`: the model's ID of the call.
pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// `gen_ai.tool.type`: `function` for every executor tool.
pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
/// `gen_ai.tool.call.arguments` (content: only when recorded).
pub const GEN_AI_TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
/// `gen_ai.tool.call.result` (content: only when recorded).
pub const GEN_AI_TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
/// `gen_ai.input.messages` (content: only when recorded).
pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
/// `gen_ai.output.messages` (content: only when recorded).
pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// `error.type`: why an operation failed, low-cardinality.
pub const ERROR_TYPE: &str = "error.type";

/// `invoke_agent`: an invocation (one span per process that runs part of it).
pub const OP_INVOKE_AGENT: &str = "invoke_agent";
/// `chat`: one model call.
pub const OP_CHAT: &str = "chat";
/// `execute_tool`: one tool call.
pub const OP_EXECUTE_TOOL: &str = "execute_tool";

/// `rpc.system`: `grpc`.
pub const RPC_SYSTEM: &str = "rpc.system";
/// `rpc.service`: `agentloop.v1.DecisionService`.
pub const RPC_SERVICE: &str = "rpc.service";
/// `rpc.method`: `Decide`.
pub const RPC_METHOD: &str = "rpc.method";
/// `rpc.grpc.status_code`: the numeric gRPC status.
pub const RPC_GRPC_STATUS_CODE: &str = "rpc.grpc.status_code";

/// `agentloop.invocation.id`.
pub const INVOCATION_ID: &str = "agentloop.invocation.id";
/// `agentloop.tenant`.
pub const TENANT: &str = "agentloop.tenant";
/// `agentloop.turn`: the turn an operation belongs to.
pub const TURN: &str = "agentloop.turn";
/// `agentloop.terminal_reason`: how an invocation ended (on its last `invoke_agent`).
pub const TERMINAL_REASON: &str = "agentloop.terminal_reason";
/// `agentloop.resumed_by`: what continues an invocation in this span (`reply`: a
/// human answered its wait; `sweep`: a restart or a worker gone; `handoff`: a worker
/// drained); absent on the first.
pub const RESUMED_BY: &str = "agentloop.resumed_by";
/// On the span of a `StartInvocation` whose idempotency key named an existing
/// invocation: nothing new runs under it.
pub const REPLAYED: &str = "agentloop.start.replayed";
/// `agentloop.effect.key`: the business change a write call makes.
pub const EFFECT_KEY: &str = "agentloop.effect.key";
/// `agentloop.tool.outcome`: `output`, `error`, `cancelled`, `not_started`, `unknown`.
pub const TOOL_OUTCOME: &str = "agentloop.tool.outcome";
/// `agentloop.policy.verdict`: `allow`, `deny`, `approval_required`.
pub const POLICY_VERDICT: &str = "agentloop.policy.verdict";
/// `agentloop.verification.verdict`: `accepted` or `rejected`.
pub const VERIFICATION_VERDICT: &str = "agentloop.verification.verdict";
/// `agentloop.commit.events`: events in one commit.
pub const COMMIT_EVENTS: &str = "agentloop.commit.events";
/// `agentloop.calls`: calls in one policy request or stage.
pub const CALLS: &str = "agentloop.calls";
/// `agentloop.goal` (content: only when recorded).
pub const GOAL: &str = "agentloop.goal";
/// `agentloop.answer` (content: only when recorded).
pub const ANSWER: &str = "agentloop.answer";

/// Name of the policy span (`PolicyService.Evaluate`, in-process or remote).
pub const SPAN_AUTHORIZE: &str = "authorize";
/// Name of the verification span (acceptance rules and verifiers).
pub const SPAN_VERIFY: &str = "verify";
/// Name of the commit span (one turn's events to the store).
pub const SPAN_COMMIT: &str = "commit";
/// Prefix of the reconcile span's name (`reconcile {tool}`).
pub const SPAN_RECONCILE: &str = "reconcile";
