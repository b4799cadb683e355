//! What the runtime needs of the services around it ("ports"), in the runtime's own
//! types: the model decides from the engine's events, policy judges engine calls, the tool
//! gateway answers with engine outcomes, the effect ledger keeps [`Effect`]s.
//!
//! Two kinds of adapters implement them, both outside this crate: over gRPC (the
//! orchestrator service, the one place that converts to and from the wire) and over a
//! service in the same process (the embedded wiring). The runtime cannot tell them apart.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agentloop_effects::EffectState;
use agentloop_effects::settle::{Answer, Recorded};
pub use agentloop_effects::{Acceptance, Cited, Claim, Effect};
use agentloop_engine::{
    Authorization, CallOutcome, Check, Fingerprint, InputAnswer, ProposedDecision, SideEffect,
    ToolCall, ToolDigest, Usage,
};
use agentloop_script::Script;
use agentloop_store::StoredEvent;
use async_trait::async_trait;
use uuid::Uuid;

/// Why a service gave no answer: a class from the canonical error codes every service
/// maps its errors to, and the service's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Which kind of failure.
    pub kind: FailureKind,
    /// What the service said.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`, saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Failure {}

/// The canonical error classes (those of `google.rpc.Code`, without OK), so a failure
/// reads the same whichever adapter reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[expect(missing_docs, reason = "the canonical codes, named as everywhere else")]
pub enum FailureKind {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

/// A tool as the gateway describes it: what the model is shown, and the contract an
/// invocation plans its calls under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tool {
    /// Its name, as calls name it.
    pub name: String,
    /// What it does, written for the model.
    pub description: String,
    /// The JSON Schema its arguments must satisfy, as JSON text.
    pub input_schema_json: String,
    /// What it does to the outside world.
    pub side_effect: SideEffect,
    /// Whether its calls may run in any order relative to each other.
    pub commutative: bool,
    /// The longest one call may take, in milliseconds; `None` when it names none.
    pub timeout_ms: Option<u64>,
    /// Whether its calls need a human's approval.
    pub requires_approval: bool,
    /// Its contract's version; `None` from a gateway that does not version tools.
    pub digest: Option<ToolDigest>,
    /// Its executor is unhealthy or gone: a call fails at once, and the model is told.
    pub unavailable: bool,
}

/// One turn's question to the model.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The invocation.
    pub invocation: Uuid,
    /// The turn to decide, from 1.
    pub turn: u32,
    /// The profile it runs under.
    pub profile: &'a str,
    /// The task, as the caller gave it.
    pub goal: &'a str,
    /// The last committed events, oldest first; older ones are in the log only.
    pub history: &'a [Arc<StoredEvent>],
    /// The scripted model of an offline run, parsed once as the invocation's runner
    /// started.
    pub script: Option<&'a Script>,
    /// The tools the model may call.
    pub tools: &'a [Tool],
}

/// The model's answer: a decision, which the engine judges, and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// What the model proposed (output that is no decision is `Unparseable`).
    pub decision: ProposedDecision,
    /// Tokens and cost.
    pub usage: Usage,
}

/// The model, behind the decision service.
#[async_trait]
pub trait DecisionPort: Send + Sync + 'static {
    /// One decision. Dropping the future cancels the model call.
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure>;
}

/// A batch of calls to authorize, with who asks.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The invocation.
    pub invocation: Uuid,
    /// The turn that proposed the calls.
    pub turn: u32,
    /// The profile whose policies apply.
    pub profile: &'a str,
    /// Who the invocation acts for.
    pub actor: &'a str,
    /// The actor's tenant.
    pub tenant: &'a str,
    /// The actor's roles as the invocation started.
    pub roles: &'a [String],
    /// The calls.
    pub calls: &'a [ToolCall],
    /// The digest a human approved exactly these calls under, if one did.
    pub approved: Option<Fingerprint>,
}

/// Policy: argument schemas, authorization, approval gates, acceptance rules.
#[async_trait]
pub trait PolicyPort: Send + Sync + 'static {
    /// Judges a batch.
    async fn authorize(&self, batch: Batch<'_>) -> Result<Authorization, Failure>;
    /// Runs `profile`'s acceptance rules on a final answer.
    async fn accept(&self, profile: &str, claim: &Claim) -> Result<Acceptance, Failure>;
}

/// One send of a call to its executor.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    /// The invocation the call belongs to.
    pub invocation: Uuid,
    /// The call.
    pub call: &'a ToolCall,
    /// The write's effect key; empty for a read.
    pub effect_key: &'a str,
    /// Which dispatch of the effect this is, from 1.
    pub attempt: u32,
    /// How long it may take.
    pub timeout_ms: u64,
    /// The contract version it was planned under; the gateway refuses it if the tool
    /// changed since.
    pub digest: Option<ToolDigest>,
    /// A person's answer to the question the call asked when it was sent before.
    pub answer: Option<&'a InputAnswer>,
}

/// An executor's answer to a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The call's result.
    pub outcome: CallOutcome,
    /// The executor's identifier of an applied write; empty otherwise.
    pub receipt: String,
}

/// The tool gateway.
#[async_trait]
pub trait ToolsPort: Send + Sync + 'static {
    /// The registered tools.
    async fn list(&self) -> Result<Vec<Tool>, Failure>;
    /// Runs one call. Dropping the future cancels the call at the executor.
    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure>;
    /// Runs the read-only calls of one stage together: each call's answer, in the order
    /// asked, as `execute` would have given it. Dropping the future cancels them all.
    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure>;
    /// Asks the owning executor what became of an effect.
    async fn reconcile(&self, tool: &str, effect_key: &str) -> Result<Answer, Failure>;
    /// Has verifier `name` judge a final answer within `within`; `None` when it gave no
    /// verdict. Dropping the future cancels it.
    async fn verify(
        &self,
        name: &str,
        claim: &Claim,
        within: Option<Duration>,
    ) -> Result<Option<Check>, Failure>;
    /// The most reads one `execute_stage` carries; below 2, every call goes on its own.
    /// Across a network a stage saves a round trip per call but one; in the same process
    /// there is none to save, and a future per call costs less than gathering a stage.
    fn max_stage(&self) -> usize;
}

/// A write to prepare.
#[derive(Debug, Clone, Copy)]
pub struct NewEffect<'a> {
    /// The invocation making it.
    pub invocation: Uuid,
    /// The call.
    pub call_id: &'a str,
    /// Its effect key.
    pub effect_key: &'a str,
    /// The tool.
    pub tool: &'a str,
}

/// A page of entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectPage {
    /// The entries.
    pub entries: Vec<Effect>,
    /// Where the next page starts; empty after the last.
    pub next_page_token: String,
}

/// The effect ledger: every write is recorded before it is dispatched and after.
#[async_trait]
pub trait LedgerPort: Send + Sync + 'static {
    /// Records an effect before dispatch (idempotent on the effect key): the entry as it
    /// is now, new or found.
    async fn prepare(&self, effect: NewEffect<'_>) -> Result<Effect, Failure>;
    /// Records that the effect is about to be sent, if it is in `expected`
    /// (FAILED_PRECONDITION otherwise).
    async fn mark_dispatched(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Effect, Failure>;
    /// Records an outcome, if the entry is in `expected` (FAILED_PRECONDITION otherwise).
    async fn record(
        &self,
        effect_key: &str,
        expected: EffectState,
        recorded: &Recorded,
    ) -> Result<Effect, Failure>;
    /// One entry (NOT_FOUND when there is none).
    async fn get(&self, effect_key: &str) -> Result<Effect, Failure>;
    /// A page of unresolved entries, of one invocation or (`invocation` empty) all.
    async fn list_unresolved(
        &self,
        invocation: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure>;
    /// A page of one invocation's entries in every state.
    async fn list_by_invocation(
        &self,
        invocation: Uuid,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure>;
}

/// The ports one runtime uses.
#[derive(Clone)]
pub struct Ports {
    /// The decision service.
    pub decision: Arc<dyn DecisionPort>,
    /// The policy service.
    pub policy: Arc<dyn PolicyPort>,
    /// The tool gateway.
    pub tools: Arc<dyn ToolsPort>,
    /// The effect ledger.
    pub ledger: Arc<dyn LedgerPort>,
}

impl fmt::Debug for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ports").finish_non_exhaustive()
    }
}
