//! `agentloop-executor`: write a tool executor by implementing one small trait per tool.
//!
//! Tool owners serve their tools to agentloop over the `ToolExecutorService` contract
//! (`proto/agentloop/v1/tool_executor.proto`). Honouring that contract by hand means
//! getting the same hard parts right every time: dedupe writes on the effect key,
//! durably, across retries, concurrent requests and restarts; answer `Reconcile` from
//! the same record; parse arguments strictly and report bad ones as structured errors;
//! stop work the caller no longer wants; report health and drain on shutdown. This
//! crate does all of that once. A tool owner writes:
//!
//! - a [`Tool`] per tool: its name, description, [`SideEffect`] and timeout as
//!   constants, typed arguments (`Deserialize` + `JsonSchema`: the input schema is
//!   derived from the type), and an async [`Tool::call`] that gets the parsed arguments
//!   and a [`Context`] (invocation, call, effect key, attempt, caller, a cancellation
//!   token), and returns an output or a structured [`CallError`];
//! - optionally a [`Verifier`], which judges final answers against the owner's data;
//! - an [`Executor`] built from them and a [`Record`] (required when a tool writes),
//!   served with [`serve`].
//!
//! What the executor then guarantees:
//!
//! 1. **Writes apply once per effect key.** A write's output is appended to the
//!    [`Record`] and `fsync`ed before the reply; a second request with the key returns
//!    the recorded output without calling the tool, and a per-key lock keeps concurrent
//!    requests with one key from both calling it. The same key with other arguments is
//!    a CONFLICT error.
//! 2. **`Reconcile` answers from the record**: APPLIED with the receipt and output,
//!    NOT_APPLIED when the key is absent (it was never acknowledged), UNKNOWN only when
//!    the record is in doubt.
//! 3. **No side effect the caller no longer wants is started.** When the caller goes
//!    away or its deadline passes, tonic drops the call's future, and the context's
//!    token fires; the tool's own timeout does the same. Only the record's append, once
//!    started, runs to completion.
//! 4. **Describe comes from the types**, so what the model is shown and what policy
//!    checks cannot drift from what the executor parses. Names, timeouts and sizes are
//!    checked when the executor is built ([`BuildError`]), not at the first call.
//! 5. **[`serve`]** adds agentloop's shared server (`agentloop-server`: tracing, gRPC
//!    health and reflection, caller authentication by service token or client
//!    certificate through [`Access`]), flips health to
//!    NOT_SERVING as soon as shutdown begins, and lets in-flight calls finish for
//!    [`ExecutorBuilder::drain_timeout`] before it cancels them.
//! 6. **A stage of reads is one request.** `ExecuteStage` runs the read-only calls the
//!    gateway sends together at the same time and streams each answer as it finishes,
//!    so a slow call holds back no other; it refuses writes, which come one by one.
//!
//! It is *not* a framework for the tools' own data: a write whose effect lives in
//! another system must pass [`Context::effect_key`] on as that system's idempotency key
//! (see [`Tool`]). The record is a local file held in memory, bounded in size
//! ([`MAX_RECORDS`]); one process opens a data directory at a time.
//!
//! # Example
//!
//! A write tool, run in-process twice under one effect key: applied once, then replayed.
//!
//! ```
//! use std::time::Duration;
//!
//! use agentloop_executor::{CallError, Context, Disposition, Executor, Record, SideEffect, Tool};
//! use agentloop_proto::v1::{ToolCall, ToolExecutorServiceExecuteRequest};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! /// Arguments of `deposit`.
//! #[derive(Deserialize, JsonSchema)]
//! #[serde(deny_unknown_fields)] // an executor never trusts that every caller validated
//! struct DepositArgs {
//!     /// The account to pay into.
//!     #[schemars(length(min = 1, max = 64))]
//!     account: String,
//!     /// The amount, in cents.
//!     #[schemars(range(min = 1))]
//!     cents: u64,
//! }
//!
//! #[derive(Serialize)]
//! struct Deposited {
//!     receipt: String,
//!     account: String,
//!     cents: u64,
//! }
//!
//! struct Deposit;
//!
//! impl Tool for Deposit {
//!     const NAME: &'static str = "deposit";
//!     const DESCRIPTION: &'static str = "Pays a positive amount into an account. Applied \
//!         once per effect key; the result carries a receipt.";
//!     const SIDE_EFFECT: SideEffect = SideEffect::Write;
//!     const TIMEOUT: Duration = Duration::from_secs(10);
//!     type Args = DepositArgs;
//!     type Output = Deposited;
//!
//!     fn receipt(output: &Deposited) -> String {
//!         output.receipt.clone()
//!     }
//!
//!     async fn call(&self, args: DepositArgs, ctx: &Context) -> Result<Deposited, CallError> {
//!         if args.cents == 0 {
//!             return Err(CallError::invalid_arguments("cents must be positive"));
//!         }
//!         // A real tool pays into its bank here, with ctx.effect_key() as the bank's
//!         // idempotency key, and stops when ctx.cancellation() fires.
//!         Ok(Deposited {
//!             receipt: format!("dep-{}", ctx.effect_key()),
//!             account: args.account,
//!             cents: args.cents,
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let executor = Executor::builder()
//!     .record(Record::open(dir.path())?)
//!     .tool(Deposit)
//!     .build()?;
//!
//! let request = || {
//!     tonic::Request::new(ToolExecutorServiceExecuteRequest {
//!         invocation_id: "inv-1".into(),
//!         call: Some(ToolCall {
//!             call_id: "c1".into(),
//!             tool: "deposit".into(),
//!             arguments_json: r#"{"account": "acct-1", "cents": 500}"#.into(),
//!         }),
//!         effect_key: "inv-1/c1".into(),
//!         attempt: 1,
//!         input_answer: None,
//!     })
//! };
//! let first = executor.execute_request(request()).await?;
//! let again = executor.execute_request(request()).await?;
//! assert_eq!(first.disposition(), Disposition::Applied);
//! assert_eq!(again.disposition(), Disposition::Replayed);
//! assert_eq!(first.result(), again.result());
//! # Ok(())
//! # }
//! ```
//!
//! Served, with health, reflection, the callers' service tokens and a drain on SIGTERM:
//!
//! ```no_run
//! # async fn run(executor: agentloop_executor::Executor) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:50061").await?;
//! let access = agentloop_server::Access::default(); // or Access::load(&callers, tls)
//! agentloop_executor::serve(listener, executor, access, agentloop_server::shutdown_signal())
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! `services/demo-executor` is a complete executor built on this crate: a read-only
//! lookup, a sleep that honours cancellation, a transfer deduped on its effect key, and
//! a verifier that confirms transfers against the record.

#![warn(missing_docs)]

mod error;
mod executor;
mod locks;
mod record;
mod tool;
mod verifier;

use std::future::Future;
use std::time::Duration;

use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_server::{Access, ServeError, ServiceSet};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use agentloop_proto::server::StageStream;
pub use agentloop_proto::v1::{ErrorType, NextAction, SideEffect};
pub use error::{BuildError, RequestError};
pub use executor::{
    DEFAULT_DRAIN_TIMEOUT, Disposition, Executed, Executor, ExecutorBuilder, MAX_DESCRIPTION_BYTES,
    MAX_SCHEMA_BYTES, MAX_TIMEOUT,
};
pub use record::{
    Appended, AppliedEffect, MAX_RECORD_LINE_BYTES, MAX_RECORDS, RECORD_FILE_NAME, Record,
    RecordError,
};
pub use schemars;
pub use tool::{CallError, Context, MAX_ERROR_MESSAGE_BYTES, Tool, derived_schema, descriptor};
pub use verifier::{Verdict, Verifier};

/// Longest effect key accepted, in bytes. Keys are identifiers, not payloads.
pub const MAX_EFFECT_KEY_BYTES: usize = 256;
/// Longest invocation ID, call ID or tool name accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Largest `arguments_json` accepted, in bytes.
pub const MAX_ARGUMENTS_BYTES: usize = 64 * 1024;
/// Largest output of a write, in bytes: it is recorded, and held in memory.
pub const MAX_RECORDED_OUTPUT_BYTES: usize = 256 * 1024;

/// How long [`serve`] still waits, once the drain bound passed and the calls were
/// cancelled, for the last replies to go out before it returns anyway.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What [`serve`] serves: an [`Executor`], or a service wrapping one (one that counts
/// calls or injects faults around [`Executor::execute_request`]). The executor is the
/// one whose calls a drain that runs out of time cancels.
pub trait ExecutorService: ToolExecutorService {
    /// The executor inside.
    fn executor(&self) -> &Executor;
}

impl ExecutorService for Executor {
    fn executor(&self) -> &Executor {
        self
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then drains.
///
/// It is `agentloop-server`'s [`serve`](agentloop_server::serve) (a tracing span per
/// RPC, gRPC health and reflection, TCP_NODELAY) with the service behind `access`: a call
/// without the service token or client certificate of one of its callers is
/// UNAUTHENTICATED before it reaches a tool, and the caller's name reaches
/// [`Context::caller`]. When `shutdown` resolves, health turns NOT_SERVING at once, the
/// listener closes and in-flight calls may finish for the executor's
/// [drain timeout](ExecutorBuilder::drain_timeout); calls still running then are
/// cancelled (their callers get UNAVAILABLE, and nothing is recorded for them), and
/// `serve` returns a few seconds later at most.
///
/// The caller binds the listener, so tests can bind `127.0.0.1:0` and read the port.
///
/// # Errors
///
/// When the server cannot start (TLS, reflection) or fails while serving.
pub async fn serve<S: ExecutorService>(
    listener: TcpListener,
    service: S,
    access: Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let executor = service.executor().clone();
    let draining = CancellationToken::new();
    let signal = {
        let draining = draining.clone();
        async move {
            shutdown.await;
            draining.cancel();
        }
    };
    let services =
        ServiceSet::new().add_for(agentloop_proto::server::tool_executor(service), &access);
    let server = agentloop_server::serve(listener, services, signal);
    tokio::pin!(server);
    let out_of_time = async {
        draining.cancelled().await;
        tokio::time::sleep(executor.drain_timeout()).await;
    };
    tokio::select! {
        served = &mut server => return served,
        () = out_of_time => {}
    }
    tracing::warn!(
        drain_timeout_ms = executor.drain_timeout().as_millis(),
        "in-flight calls did not finish within the drain timeout: cancelling them"
    );
    executor.stop();
    tokio::select! {
        served = &mut server => served,
        () = tokio::time::sleep(STOP_GRACE) => {
            tracing::warn!("connections still open after the calls were cancelled: stopping anyway");
            Ok(())
        }
    }
}

/// A duration as the wire type.
pub(crate) fn proto_duration(duration: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}
