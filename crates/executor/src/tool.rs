//! [`Tool`]: what a tool owner implements, and what a call gets ([`Context`]) and may
//! fail with ([`CallError`]).

use std::future::Future;
use std::time::Duration;

use agentloop_proto::v1::{ErrorType, NextAction, SideEffect, ToolDescriptor};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Longest tool error message passed on, in bytes: it goes to the model.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 * 1024;

/// One tool: its contract as associated constants (what `Describe` reports, and what the
/// gateway's digest of the tool covers), its typed arguments and output, and the call.
///
/// The constants are the tool's *type*, not its state, so a descriptor exists without
/// an instance ([`descriptor`]) and cannot drift between calls. The executor checks
/// them when it is built ([`ExecutorBuilder::build`](crate::ExecutorBuilder::build)).
///
/// What the executor does around [`Tool::call`], so the tool does not:
///
/// - parses `arguments_json` into [`Tool::Args`]; a failure is a structured
///   INVALID_ARGUMENTS error with serde's message, and the tool is not called. Derive
///   `Deserialize` with `#[serde(deny_unknown_fields)]`: an executor must not trust that
///   every caller validated against the schema;
/// - for writes ([`SideEffect::Write`] and [`SideEffect::IdempotentWrite`]): refuses a
///   call without an effect key, holds a lock on (tool, effect key) around the call, answers
///   a key already in the [record](crate::Record) with the recorded output without
///   calling the tool, and appends the output durably before replying;
/// - bounds the call by [`Tool::TIMEOUT`] and drops it when the caller goes away; the
///   context's cancellation token fires either way.
///
/// A write whose effect lives outside the record (a database, another service) must
/// pass [`Context::effect_key`] on as that system's idempotency key: a crash between
/// its effect and the record's append leaves the key out of the record, `Reconcile`
/// answers NOT_APPLIED, and the call is sent again with the same key.
pub trait Tool: Send + Sync + 'static {
    /// Unique name, as calls name it: `[a-zA-Z0-9_.-]{1,64}`.
    const NAME: &'static str;
    /// What the tool does, written for the model (at most 16 KiB).
    const DESCRIPTION: &'static str;
    /// What it does to the outside world. Declare it: `SIDE_EFFECT_UNSPECIFIED` is
    /// refused, because callers treat it as the most dangerous kind anyway.
    const SIDE_EFFECT: SideEffect;
    /// The longest one call may take, 1 ms to 10 minutes. The runtime cancels a call
    /// after it; so does the executor, answering ERROR_TYPE_TIMEOUT.
    const TIMEOUT: Duration;
    /// Whether calls may run in any order relative to each other, so policy may put
    /// several of them in one parallel stage even though they write.
    const COMMUTATIVE: bool = false;
    /// Whether calls need a human approval before they run (policy's approval gate).
    const REQUIRES_APPROVAL: bool = false;

    /// The arguments, parsed from the call's `arguments_json`.
    type Args: DeserializeOwned + JsonSchema + Send;
    /// The output, returned as the call's `output_json`.
    type Output: Serialize + Send;

    /// The JSON Schema of the arguments, shown to the model and checked by policy before
    /// a call is dispatched. Derived from [`Tool::Args`] ([`derived_schema`]); override it
    /// to give one by hand (`schemars::json_schema!`).
    fn input_schema() -> Schema {
        derived_schema::<Self::Args>()
    }

    /// The identifier of the change `output` reports, copied into the effect ledger
    /// (e.g. an order ID). Empty (the default) for read-only tools.
    fn receipt(output: &Self::Output) -> String {
        let _ = output;
        String::new()
    }

    /// Runs one call. An `Err` is a structured tool error the model reads; for a write
    /// it must mean that nothing was applied.
    fn call(
        &self,
        args: Self::Args,
        ctx: &Context,
    ) -> impl Future<Output = Result<Self::Output, CallError>> + Send;
}

/// The JSON Schema (draft 2020-12) schemars derives for `T`, without the `$schema`
/// keyword: the schema goes to model APIs verbatim, and some refuse keywords they do not
/// know, while validators assume 2020-12 without it.
pub fn derived_schema<T: JsonSchema>() -> Schema {
    SchemaSettings::draft2020_12()
        .with(|settings| settings.meta_schema = None)
        .into_generator()
        .into_root_schema_for::<T>()
}

/// The descriptor `Describe` reports for `T`, as the executor builds it (unchecked: the
/// executor checks it when it is built). `digest` and `unavailable` are the gateway's and
/// left empty.
pub fn descriptor<T: Tool>() -> ToolDescriptor {
    ToolDescriptor {
        name: T::NAME.to_owned(),
        description: T::DESCRIPTION.to_owned(),
        input_schema_json: T::input_schema().as_value().to_string(),
        side_effect: T::SIDE_EFFECT as i32,
        commutative: T::COMMUTATIVE,
        timeout: Some(crate::proto_duration(T::TIMEOUT)),
        requires_approval: T::REQUIRES_APPROVAL,
        digest: String::new(),
        unavailable: false,
    }
}

/// What one call knows about itself.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) invocation_id: String,
    pub(crate) call_id: String,
    pub(crate) effect_key: String,
    pub(crate) attempt: u32,
    pub(crate) caller: Option<String>,
    pub(crate) cancellation: CancellationToken,
}

impl Context {
    /// The invocation the call belongs to (for logs and audit).
    pub fn invocation_id(&self) -> &str {
        &self.invocation_id
    }

    /// The call's ID within its turn.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The effect key of a write: the same for every attempt of one effect, never empty
    /// for a write (a read-only tool gets whatever the caller sent, usually nothing).
    pub fn effect_key(&self) -> &str {
        &self.effect_key
    }

    /// Which dispatch of this effect this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The authenticated caller, by the name its service token or certificate has in
    /// `auth.callers`; `None` when the port is open or the call comes in-process.
    pub fn caller(&self) -> Option<&str> {
        self.caller.as_deref()
    }

    /// Fires when the call is no longer wanted: the caller went away, its deadline
    /// passed, [`Tool::TIMEOUT`] passed, or the executor stopped; and once the call is
    /// over. The call's future is dropped then anyway; hand a clone to work the call
    /// started elsewhere (a spawned task, a child process), so that it stops too.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }
}

/// A structured tool failure: the proto's `ToolError`, which the model reads and
/// trusted code acts on (`retryable`, the next allowed action).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    error_type: ErrorType,
    message: String,
    retryable: bool,
    next: NextAction,
}

impl CallError {
    /// An error of `error_type`, with that type's usual advice ([`CallError::retryable`]
    /// and [`CallError::next_action`] say which); change it with
    /// [`CallError::with_retryable`] and [`CallError::with_next_action`].
    pub fn new(error_type: ErrorType, message: impl Into<String>) -> CallError {
        let (retryable, next) = match error_type {
            ErrorType::InvalidArguments | ErrorType::NotFound => (false, NextAction::FixArguments),
            ErrorType::Timeout | ErrorType::Unavailable => (true, NextAction::Retry),
            ErrorType::PermissionDenied | ErrorType::Conflict | ErrorType::Rejected => {
                (false, NextAction::Stop)
            }
            ErrorType::Internal | ErrorType::Unspecified => (false, NextAction::None),
        };
        CallError {
            error_type,
            message: message.into(),
            retryable,
            next,
        }
    }

    /// The arguments are malformed or break a rule the schema cannot express: fix them.
    pub fn invalid_arguments(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::InvalidArguments, message)
    }

    /// A thing the call named does not exist: fix the arguments.
    pub fn not_found(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::NotFound, message)
    }

    /// A business rule refused the call: it was understood and said no. Do not retry.
    pub fn rejected(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::Rejected, message)
    }

    /// The call clashed with the current state of the data. Do not retry unchanged.
    pub fn conflict(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::Conflict, message)
    }

    /// A system behind the tool is temporarily unreachable: the same call may succeed.
    pub fn unavailable(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::Unavailable, message)
    }

    /// The tool failed for a reason of its own.
    pub fn internal(message: impl Into<String>) -> CallError {
        CallError::new(ErrorType::Internal, message)
    }

    /// Sets whether sending the same call again (same effect key) may succeed.
    #[must_use]
    pub fn with_retryable(mut self, retryable: bool) -> CallError {
        self.retryable = retryable;
        self
    }

    /// Sets what the loop may do next.
    #[must_use]
    pub fn with_next_action(mut self, next: NextAction) -> CallError {
        self.next = next;
        self
    }

    /// The category.
    pub fn error_type(&self) -> ErrorType {
        self.error_type
    }

    /// The explanation.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the same call may succeed if sent again.
    pub fn retryable(&self) -> bool {
        self.retryable
    }

    /// What the loop may do next.
    pub fn next_action(&self) -> NextAction {
        self.next
    }
}

impl From<CallError> for agentloop_proto::v1::ToolError {
    fn from(error: CallError) -> Self {
        let mut message = error.message;
        let end = agentloop_proto::prefix(&message, MAX_ERROR_MESSAGE_BYTES).len();
        message.truncate(end);
        agentloop_proto::v1::ToolError {
            error_type: error.error_type as i32,
            message,
            retryable: error.retryable,
            next_allowed_action: error.next as i32,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn each_error_type_has_its_usual_advice() {
        let cases = [
            (ErrorType::InvalidArguments, false, NextAction::FixArguments),
            (ErrorType::NotFound, false, NextAction::FixArguments),
            (ErrorType::Timeout, true, NextAction::Retry),
            (ErrorType::Unavailable, true, NextAction::Retry),
            (ErrorType::PermissionDenied, false, NextAction::Stop),
            (ErrorType::Conflict, false, NextAction::Stop),
            (ErrorType::Rejected, false, NextAction::Stop),
            (ErrorType::Internal, false, NextAction::None),
        ];
        for (error_type, retryable, next) in cases {
            let error = CallError::new(error_type, "x");
            assert_eq!(
                (error.retryable(), error.next_action()),
                (retryable, next),
                "{error_type:?}"
            );
        }
        let proto = agentloop_proto::v1::ToolError::from(
            CallError::rejected("no")
                .with_retryable(true)
                .with_next_action(NextAction::AskUser),
        );
        assert_eq!(proto.error_type(), ErrorType::Rejected);
        assert_eq!(proto.message, "no");
        assert!(proto.retryable);
        assert_eq!(proto.next_allowed_action(), NextAction::AskUser);
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let proto = agentloop_proto::v1::ToolError::from(CallError::internal("é".repeat(10_000)));
        assert!(proto.message.len() <= MAX_ERROR_MESSAGE_BYTES);
        assert!(proto.message.chars().all(|c| c == 'é'));
    }
}
