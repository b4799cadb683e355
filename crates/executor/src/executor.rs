//! [`Executor`]: the registered tools and verifiers behind the `ToolExecutorService`
//! contract, and [`ExecutorBuilder`], which checks them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::server::StageStream;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, ErrorType, NextAction, ReconcileStatus, SideEffect,
    StageAnswer, ToolCall, ToolDescriptor, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceExecuteStageRequest,
    ToolExecutorServiceExecuteStageResponse, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceReconcileResponse, ToolExecutorServiceVerifyRequest,
    ToolExecutorServiceVerifyResponse, ToolOutput, ToolResult, VerifierDescriptor,
};
use futures::stream::FuturesUnordered;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::{Request, Response, Status};

use crate::locks::KeyLocks;
use crate::{
    Appended, AppliedEffect, BuildError, CallError, Context, MAX_ARGUMENTS_BYTES,
    MAX_EFFECT_KEY_BYTES, MAX_ID_BYTES, MAX_RECORDED_OUTPUT_BYTES, Record, RecordError,
    RequestError, Tool, Verdict, Verifier, descriptor,
};

/// Longest timeout a tool or verifier may declare (ten minutes), as the gateway's
/// registry bounds it.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(600_000);
/// Longest tool or verifier description, in bytes (it goes into every prompt).
pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// Largest input schema, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// How long [`serve`](crate::serve) lets in-flight calls finish after shutdown begins,
/// unless [`ExecutorBuilder::drain_timeout`] says otherwise.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Collects tools, verifiers and the record, and checks them in [`ExecutorBuilder::build`].
pub struct ExecutorBuilder {
    tools: Vec<PendingTool>,
    verifiers: Vec<VerifierEntry>,
    record: Option<Record>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for ExecutorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorBuilder")
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| &t.descriptor.name)
                    .collect::<Vec<_>>(),
            )
            .field("verifiers", &verifier_names(&self.verifiers))
            .field("record", &self.record)
            .field("drain_timeout", &self.drain_timeout)
            .finish()
    }
}

/// A tool as registered, before `build` knows the record its writes go to.
struct PendingTool {
    descriptor: ToolDescriptor,
    side_effect: SideEffect,
    timeout: Duration,
    /// Makes the runner and says which record it writes to; `None` for a write without
    /// a record.
    make: Box<dyn FnOnce(Option<Record>) -> Option<Runner> + Send>,
}

/// A runnable tool and the record it writes to (`None`: read-only).
type Runner = (Box<dyn RunTool>, Option<Record>);

impl ExecutorBuilder {
    /// Adds a tool. `Describe` lists tools in the order added.
    #[must_use]
    pub fn tool<T: Tool>(mut self, tool: T) -> ExecutorBuilder {
        let make = move |record: Option<Record>| -> Option<Runner> {
            match T::SIDE_EFFECT {
                SideEffect::ReadOnly => Some((Box::new(ReadTool(tool)), None)),
                // Unspecified is refused by `build`; were it not, it would be handled
                // as what callers take it for, a write.
                SideEffect::IdempotentWrite | SideEffect::Write | SideEffect::Unspecified => {
                    let record = record?;
                    let writes_to = Some(record.clone());
                    Some((Box::new(WriteTool { tool, record }), writes_to))
                }
            }
        };
        self.tools.push(PendingTool {
            descriptor: descriptor::<T>(),
            side_effect: T::SIDE_EFFECT,
            timeout: T::TIMEOUT,
            make: Box::new(make),
        });
        self
    }

    /// Adds a verifier. `Describe` lists verifiers in the order added.
    #[must_use]
    pub fn verifier<V: Verifier>(mut self, verifier: V) -> ExecutorBuilder {
        self.verifiers.push(VerifierEntry {
            descriptor: VerifierDescriptor {
                name: V::NAME.to_owned(),
                description: V::DESCRIPTION.to_owned(),
                timeout: Some(crate::proto_duration(V::TIMEOUT)),
            },
            timeout: V::TIMEOUT,
            runner: Box::new(verifier),
        });
        self
    }

    /// The record that writes are deduped in and recorded to; required when any tool
    /// writes. Share a clone with verifiers that read it.
    #[must_use]
    pub fn record(mut self, record: Record) -> ExecutorBuilder {
        self.record = Some(record);
        self
    }

    /// How long [`serve`](crate::serve) lets in-flight calls finish once shutdown begins,
    /// before it cancels them ([`DEFAULT_DRAIN_TIMEOUT`] unless set).
    #[must_use]
    pub fn drain_timeout(mut self, timeout: Duration) -> ExecutorBuilder {
        self.drain_timeout = timeout;
        self
    }

    /// Checks every tool and verifier and builds the executor.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the first tool or verifier at fault: a duplicate or
    /// invalid name, a timeout outside 1 ms..=600000 ms, an unspecified side effect, an
    /// oversized description or schema, or a write without a record.
    pub fn build(self) -> Result<Executor, BuildError> {
        let mut tools = Vec::with_capacity(self.tools.len());
        let mut tool_index = HashMap::new();
        for pending in self.tools {
            let name = pending.descriptor.name.clone();
            check_tool(&pending)?;
            if tool_index.insert(name.clone(), tools.len()).is_some() {
                return Err(BuildError::DuplicateTool { tool: name });
            }
            let (runner, record) = (pending.make)(self.record.clone())
                .ok_or_else(|| BuildError::NoRecord { tool: name.clone() })?;
            tools.push(ToolEntry {
                descriptor: pending.descriptor,
                record,
                runner,
            });
        }
        let mut verifier_index = HashMap::new();
        for (index, verifier) in self.verifiers.iter().enumerate() {
            let name = verifier.descriptor.name.clone();
            check_verifier(verifier)?;
            if verifier_index.insert(name.clone(), index).is_some() {
                return Err(BuildError::DuplicateVerifier { verifier: name });
            }
        }
        Ok(Executor {
            inner: Arc::new(Inner {
                tools,
                tool_index,
                verifiers: self.verifiers,
                verifier_index,
                locks: KeyLocks::default(),
                stop: CancellationToken::new(),
                drain_timeout: self.drain_timeout,
            }),
        })
    }
}

/// `[a-zA-Z0-9_.-]{1,64}`, as the gateway's registry names tools and verifiers.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_timeout(timeout: Duration) -> bool {
    timeout >= Duration::from_millis(1) && timeout <= MAX_TIMEOUT
}

fn check_tool(pending: &PendingTool) -> Result<(), BuildError> {
    let tool = &pending.descriptor.name;
    if !valid_name(tool) {
        return Err(BuildError::InvalidToolName { tool: tool.clone() });
    }
    if !valid_timeout(pending.timeout) {
        return Err(BuildError::InvalidToolTimeout {
            tool: tool.clone(),
            timeout: pending.timeout,
        });
    }
    if pending.side_effect == SideEffect::Unspecified {
        return Err(BuildError::UnspecifiedSideEffect { tool: tool.clone() });
    }
    let oversized = |reason: String| BuildError::OversizedTool {
        tool: tool.clone(),
        reason,
    };
    if pending.descriptor.description.len() > MAX_DESCRIPTION_BYTES {
        return Err(oversized(format!(
            "description longer than {MAX_DESCRIPTION_BYTES} bytes"
        )));
    }
    if pending.descriptor.input_schema_json.len() > MAX_SCHEMA_BYTES {
        return Err(oversized(format!(
            "input schema larger than {MAX_SCHEMA_BYTES} bytes"
        )));
    }
    Ok(())
}

fn check_verifier(verifier: &VerifierEntry) -> Result<(), BuildError> {
    let name = &verifier.descriptor.name;
    if !valid_name(name) {
        return Err(BuildError::InvalidVerifierName {
            verifier: name.clone(),
        });
    }
    let invalid = |reason: String| BuildError::InvalidVerifier {
        verifier: name.clone(),
        reason,
    };
    if !valid_timeout(verifier.timeout) {
        return Err(invalid(format!(
            "timeout {:?} is outside 1 ms..=600000 ms",
            verifier.timeout
        )));
    }
    if verifier.descriptor.description.len() > MAX_DESCRIPTION_BYTES {
        return Err(invalid(format!(
            "description longer than {MAX_DESCRIPTION_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The executor: serves its tools and verifiers over `ToolExecutorService`. Cheap to
/// clone (shared state behind an `Arc`). Serve it with [`serve`](crate::serve), or
/// in-process as any `ToolExecutorService`.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field(
                "tools",
                &self
                    .inner
                    .tools
                    .iter()
                    .map(|t| &t.descriptor.name)
                    .collect::<Vec<_>>(),
            )
            .field("verifiers", &verifier_names(&self.inner.verifiers))
            .field("drain_timeout", &self.inner.drain_timeout)
            .finish_non_exhaustive()
    }
}

fn verifier_names(verifiers: &[VerifierEntry]) -> Vec<&str> {
    verifiers
        .iter()
        .map(|v| v.descriptor.name.as_str())
        .collect()
}

struct Inner {
    tools: Vec<ToolEntry>,
    tool_index: HashMap<String, usize>,
    verifiers: Vec<VerifierEntry>,
    verifier_index: HashMap<String, usize>,
    locks: KeyLocks,
    /// Parent of every call's cancellation token; cancelled when a drain runs out of time.
    stop: CancellationToken,
    drain_timeout: Duration,
}

impl Inner {
    fn tool(&self, name: &str) -> Option<&ToolEntry> {
        self.tools.get(*self.tool_index.get(name)?)
    }

    fn verifier(&self, name: &str) -> Option<&VerifierEntry> {
        self.verifiers.get(*self.verifier_index.get(name)?)
    }
}

struct ToolEntry {
    descriptor: ToolDescriptor,
    /// The record of a write; `None` for a read-only tool.
    record: Option<Record>,
    runner: Box<dyn RunTool>,
}

struct VerifierEntry {
    descriptor: VerifierDescriptor,
    timeout: Duration,
    runner: Box<dyn RunVerifier>,
}

/// What one Execute did, beside its result: for wrappers that count or inject faults
/// around [`Executor::execute_request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    result: ToolResult,
    disposition: Disposition,
}

/// How a call ended. Exhaustive, so that a wrapper matching it must handle a new kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// A read-only tool returned an output.
    Read,
    /// A write was applied now and recorded durably.
    Applied,
    /// A write's effect key was applied before: the recorded output was returned and the
    /// tool was not called.
    Replayed,
    /// The call ended with a structured tool error (bad arguments, the tool's refusal,
    /// its timeout, a key reused with other arguments). Nothing was applied.
    Failed,
}

impl Executed {
    fn output(
        call_id: &str,
        output_json: String,
        receipt: String,
        disposition: Disposition,
    ) -> Self {
        Executed {
            result: ToolResult {
                call_id: call_id.to_owned(),
                outcome: Some(Outcome::Output(ToolOutput {
                    output_json,
                    receipt,
                })),
            },
            disposition,
        }
    }

    fn failed(call_id: &str, error: CallError) -> Self {
        Executed {
            result: ToolResult {
                call_id: call_id.to_owned(),
                outcome: Some(Outcome::Error(error.into())),
            },
            disposition: Disposition::Failed,
        }
    }

    /// How the call ended.
    pub fn disposition(&self) -> Disposition {
        self.disposition
    }

    /// The call's result.
    pub fn result(&self) -> &ToolResult {
        &self.result
    }

    /// The Execute response.
    pub fn into_response(self) -> ToolExecutorServiceExecuteResponse {
        ToolExecutorServiceExecuteResponse {
            result: Some(self.result),
        }
    }
}

/// One call as the runners see it: the request, checked.
struct Call {
    invocation_id: String,
    call: ToolCall,
    effect_key: String,
    attempt: u32,
    caller: Option<String>,
}

impl Call {
    /// The tool's view of the call, cancelled when the executor stops or when the guard
    /// returned with it is dropped: the guard lives in the call's future, so when the
    /// caller goes away or its deadline passes, work the tool started elsewhere stops too.
    fn context(&self, stop: &CancellationToken) -> (Context, DropGuard) {
        let cancellation = stop.child_token();
        let guard = cancellation.clone().drop_guard();
        let context = Context {
            invocation_id: self.invocation_id.clone(),
            call_id: self.call.call_id.clone(),
            effect_key: self.effect_key.clone(),
            attempt: self.attempt,
            caller: self.caller.clone(),
            cancellation,
        };
        (context, guard)
    }
}

/// A tool behind its type: the typed pipeline, monomorphised per tool.
trait RunTool: Send + Sync {
    fn run<'a>(
        &'a self,
        inner: &'a Inner,
        call: Call,
    ) -> BoxFuture<'a, Result<Executed, RequestError>>;
}

/// A verifier behind its type.
trait RunVerifier: Send + Sync {
    fn run(&self, claim: agentloop_proto::v1::Claim) -> BoxFuture<'_, Verdict>;
}

impl<V: Verifier> RunVerifier for V {
    fn run(&self, claim: agentloop_proto::v1::Claim) -> BoxFuture<'_, Verdict> {
        Box::pin(self.verify(claim))
    }
}

struct ReadTool<T>(T);

struct WriteTool<T> {
    tool: T,
    record: Record,
}

/// Parses the arguments; a failure is the model's to fix, so it is a structured error.
fn parse<T: Tool>(call: &Call) -> Result<T::Args, Executed> {
    serde_json::from_str(&call.call.arguments_json).map_err(|error| {
        Executed::failed(
            &call.call.call_id,
            CallError::invalid_arguments(format!("invalid arguments for {}: {error}", T::NAME)),
        )
    })
}

/// Runs the tool's call, bounded by its timeout and by the executor's stop. The outer
/// `Err` means the executor stopped; the inner one is the tool's (or its timeout).
async fn bounded_call<T: Tool>(
    tool: &T,
    args: T::Args,
    ctx: &Context,
) -> Result<Result<T::Output, CallError>, RequestError> {
    tokio::select! {
        biased;
        // Only the executor's stop gets here: a dropped request drops this future.
        () = ctx.cancellation.cancelled() => Err(RequestError::Stopped),
        outcome = tool.call(args, ctx) => Ok(outcome),
        () = tokio::time::sleep(T::TIMEOUT) => {
            ctx.cancellation.cancel();
            Ok(Err(CallError::new(
                ErrorType::Timeout,
                format!("{} did not finish within {} ms", T::NAME, T::TIMEOUT.as_millis()),
            )))
        }
    }
}

impl<T: Tool> RunTool for ReadTool<T> {
    fn run<'a>(
        &'a self,
        inner: &'a Inner,
        call: Call,
    ) -> BoxFuture<'a, Result<Executed, RequestError>> {
        Box::pin(async move {
            let (ctx, _cancel) = call.context(&inner.stop);
            let args = match parse::<T>(&call) {
                Ok(args) => args,
                Err(failed) => return Ok(failed),
            };
            let call_id = &call.call.call_id;
            let output = match bounded_call(&self.0, args, &ctx).await? {
                Ok(output) => output,
                Err(error) => return Ok(Executed::failed(call_id, error)),
            };
            Ok(match serde_json::to_string(&output) {
                Ok(json) => Executed::output(call_id, json, T::receipt(&output), Disposition::Read),
                Err(error) => Executed::failed(
                    call_id,
                    CallError::internal(format!(
                        "{} produced an output that is not JSON: {error}",
                        T::NAME
                    )),
                ),
            })
        })
    }
}

impl<T: Tool> RunTool for WriteTool<T> {
    /// The write. Read the order of the steps: it is the point of this crate.
    fn run<'a>(
        &'a self,
        inner: &'a Inner,
        call: Call,
    ) -> BoxFuture<'a, Result<Executed, RequestError>> {
        Box::pin(async move {
            let (ctx, _cancel) = call.context(&inner.stop);
            let call_id = &call.call.call_id;

            // 1. Arguments first: a bad one is refused before any lock is taken.
            let args = match parse::<T>(&call) {
                Ok(args) => args,
                Err(failed) => return Ok(failed),
            };

            // 2. The key's lock: a concurrent request with this key waits here, and then
            //    finds this one's entry in step 3.
            let held = tokio::select! {
                biased;
                () = ctx.cancellation.cancelled() => return Err(RequestError::Stopped),
                held = inner.locks.lock(T::NAME, &call.effect_key) => held,
            };

            // 3. Applied before? Then the recorded output, and the tool is not called.
            if let Some(entry) = self.record.get(T::NAME, &call.effect_key)? {
                return Ok(replay(entry, &call));
            }
            if !self.record.has_room()? {
                return Ok(Executed::failed(
                    call_id,
                    CallError::unavailable(
                        "the executor's effect record is full; nothing was applied",
                    )
                    .with_retryable(false)
                    .with_next_action(NextAction::Stop),
                ));
            }

            // 4. The tool. Until it returns, the call may be abandoned at any `.await`
            //    (the caller went away, the deadline or the timeout passed): nothing is
            //    recorded, and the key stays unapplied.
            let output = match bounded_call(&self.tool, args, &ctx).await? {
                Ok(output) => output,
                Err(error) => return Ok(Executed::failed(call_id, error)),
            };
            let receipt = T::receipt(&output);
            let output_json = serde_json::to_string(&output).map_err(|e| RequestError::Output {
                tool: T::NAME.to_owned(),
                reason: e.to_string(),
            })?;
            if output_json.len() > MAX_RECORDED_OUTPUT_BYTES {
                return Err(RequestError::Output {
                    tool: T::NAME.to_owned(),
                    reason: format!("larger than {MAX_RECORDED_OUTPUT_BYTES} bytes"),
                });
            }

            // 5. The durable append, on a blocking thread (fsync blocks), with the key's
            //    lock moved in. From here on it runs to completion even if the caller goes
            //    away (a dropped `JoinHandle` does not stop the task), and the lock is
            //    released only after it: the effect is recorded or not, never half, and a
            //    lost reply is exactly the case `Reconcile` answers. Nothing that can wait
            //    comes between the tool's return and this step.
            let entry = AppliedEffect {
                tool: T::NAME.to_owned(),
                effect_key: call.effect_key.clone(),
                invocation_id: call.invocation_id.clone(),
                call_id: call_id.clone(),
                attempt: call.attempt,
                arguments_json: call.call.arguments_json.clone(),
                receipt,
                output_json,
            };
            let record = self.record.clone();
            let appended = tokio::task::spawn_blocking(move || {
                let appended = record.append(entry);
                drop(held);
                appended
            })
            .await
            .map_err(|e| RecordError::InDoubt(format!("the append task failed: {e}")))??;
            Ok(match appended {
                Appended::New(entry) => {
                    tracing::info!(tool = T::NAME, effect_key = %entry.effect_key, receipt = %entry.receipt, "write applied");
                    Executed::output(
                        call_id,
                        entry.output_json,
                        entry.receipt,
                        Disposition::Applied,
                    )
                }
                // Not while the key's lock is held; the record's word stands all the same.
                Appended::Existing(entry) => replay(entry, &call),
            })
        })
    }
}

/// The answer to a request whose key is in the record: its original output, unless the
/// request asks for something else under the same key.
fn replay(entry: AppliedEffect, call: &Call) -> Executed {
    let call_id = &call.call.call_id;
    // The same key with different arguments is a caller bug: answering with the first
    // output would hide it, applying again would break the rule.
    if !same_arguments(&entry.arguments_json, &call.call.arguments_json) {
        return Executed::failed(
            call_id,
            CallError::conflict(format!(
                "effect key {:?} was already applied with different arguments",
                agentloop_proto::prefix(&entry.effect_key, MAX_EFFECT_KEY_BYTES)
            )),
        );
    }
    tracing::info!(tool = %entry.tool, effect_key = %entry.effect_key, receipt = %entry.receipt, "duplicate write: recorded output returned");
    Executed::output(
        call_id,
        entry.output_json,
        entry.receipt,
        Disposition::Replayed,
    )
}

/// Whether two argument texts are the same JSON value (key order and spacing aside).
fn same_arguments(recorded: &str, requested: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(recorded),
        serde_json::from_str::<serde_json::Value>(requested),
    ) {
        (Ok(recorded), Ok(requested)) => recorded == requested,
        (Ok(_) | Err(_), Ok(_) | Err(_)) => false,
    }
}

fn check_effect_key(key: &str) -> Result<(), RequestError> {
    if key.len() > MAX_EFFECT_KEY_BYTES {
        return Err(RequestError::InvalidRequest(format!(
            "effect key longer than {MAX_EFFECT_KEY_BYTES} bytes"
        )));
    }
    Ok(())
}

fn check_bounds(
    request: &ToolExecutorServiceExecuteRequest,
    call: &ToolCall,
) -> Result<(), RequestError> {
    for (field, value) in [
        ("invocation_id", &request.invocation_id),
        ("call.call_id", &call.call_id),
        ("call.tool", &call.tool),
    ] {
        if value.len() > MAX_ID_BYTES {
            return Err(RequestError::InvalidRequest(format!(
                "{field} longer than {MAX_ID_BYTES} bytes"
            )));
        }
    }
    if call.arguments_json.len() > MAX_ARGUMENTS_BYTES {
        return Err(RequestError::InvalidRequest(format!(
            "arguments_json larger than {MAX_ARGUMENTS_BYTES} bytes"
        )));
    }
    check_effect_key(&request.effect_key)
}

impl Executor {
    /// A builder with no tools, no verifiers and no record.
    pub fn builder() -> ExecutorBuilder {
        ExecutorBuilder {
            tools: Vec::new(),
            verifiers: Vec::new(),
            record: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// How long [`serve`](crate::serve) lets in-flight calls finish after shutdown begins.
    pub fn drain_timeout(&self) -> Duration {
        self.inner.drain_timeout
    }

    /// Cancels every call in flight and refuses new ones with UNAVAILABLE: the end of a
    /// drain that ran out of time. Appends already started complete.
    pub(crate) fn stop(&self) {
        self.inner.stop.cancel();
    }

    /// Runs one Execute request: the `ToolExecutorService::execute` of this executor,
    /// with how the call ended ([`Executed::disposition`]), for a wrapper that counts
    /// calls or injects faults around it.
    ///
    /// # Errors
    ///
    /// A [`RequestError`] for a malformed request (no call, an oversized field, a write
    /// without an effect key), an unknown tool, a record that cannot take the write, or
    /// an executor that stopped.
    //
    // Not an `async fn`: the future is `run_request`'s own, without a layer that would
    // hold the request a second time while the call runs.
    pub fn execute_request(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> impl Future<Output = Result<Executed, RequestError>> + Send + '_ {
        let caller = caller(&request);
        self.run_request(caller, request.into_inner())
    }

    /// Runs one checked request for `caller`: `Execute`, or one call of a stage.
    async fn run_request(
        &self,
        caller: Option<String>,
        mut request: ToolExecutorServiceExecuteRequest,
    ) -> Result<Executed, RequestError> {
        let call = request
            .call
            .take()
            .ok_or_else(|| RequestError::InvalidRequest("call is required".to_owned()))?;
        check_bounds(&request, &call)?;
        let tool = self
            .inner
            .tool(&call.tool)
            .ok_or_else(|| RequestError::UnknownTool(call.tool.clone()))?;
        if tool.record.is_some() && request.effect_key.is_empty() {
            return Err(RequestError::InvalidRequest(format!(
                "{} is a write and needs an effect key",
                call.tool
            )));
        }
        tracing::debug!(
            caller = caller.as_deref().unwrap_or("-"),
            tool = %call.tool,
            call = %call.call_id,
            "execute"
        );
        let call = Call {
            invocation_id: request.invocation_id,
            call,
            effect_key: request.effect_key,
            attempt: request.attempt,
            caller,
        };
        tool.runner.run(&self.inner, call).await
    }

    /// One call of a stage, answered as `Execute` would have. A write is refused before
    /// anything runs: it goes through `Execute`, under the gateway's effect ledger.
    async fn stage_call(
        &self,
        caller: Option<String>,
        request: ToolExecutorServiceExecuteRequest,
    ) -> StageAnswer {
        let write = request
            .call
            .as_ref()
            .and_then(|call| self.inner.tool(&call.tool))
            .filter(|tool| tool.record.is_some());
        let answered = match write {
            Some(tool) => Err(RequestError::InvalidRequest(format!(
                "{} is a write: it goes through Execute, not in a stage",
                tool.descriptor.name
            ))),
            None => self.run_request(caller, request).await,
        };
        agentloop_proto::stage_answer(
            answered
                .map(|executed| executed.result)
                .map_err(Status::from),
        )
    }

    fn reconcile_effect(
        &self,
        request: &ToolExecutorServiceReconcileRequest,
    ) -> Result<ToolExecutorServiceReconcileResponse, RequestError> {
        let tool = self
            .inner
            .tool(&request.tool)
            .ok_or_else(|| RequestError::UnknownTool(request.tool.clone()))?;
        let Some(record) = &tool.record else {
            return Err(RequestError::NotReconcilable(request.tool.clone()));
        };
        if request.effect_key.is_empty() {
            return Err(RequestError::InvalidRequest(
                "an effect key is required".to_owned(),
            ));
        }
        check_effect_key(&request.effect_key)?;
        Ok(match record.get(&request.tool, &request.effect_key) {
            Ok(Some(entry)) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::Applied as i32,
                detail: format!(
                    "applied by attempt {} of call {}",
                    entry.attempt, entry.call_id
                ),
                receipt: entry.receipt,
                output_json: entry.output_json,
            },
            // Every apply is recorded before it is acknowledged, so absence means it was
            // never acknowledged. A request with this key still in flight would be
            // deduped on the same key if it applies later, so re-dispatching stays safe.
            Ok(None) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::NotApplied as i32,
                detail: "nothing recorded under this effect key".to_owned(),
                ..Default::default()
            },
            // The record is in doubt after a failed rollback: the honest answer.
            Err(error) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::Unknown as i32,
                detail: error.to_string(),
                ..Default::default()
            },
        })
    }

    async fn verify_claim(
        &self,
        request: ToolExecutorServiceVerifyRequest,
    ) -> Result<ToolExecutorServiceVerifyResponse, RequestError> {
        let verifier = self
            .inner
            .verifier(&request.verifier)
            .ok_or_else(|| RequestError::UnknownVerifier(request.verifier.clone()))?;
        let claim = request
            .claim
            .ok_or_else(|| RequestError::InvalidRequest("claim is required".to_owned()))?;
        let verdict = tokio::select! {
            biased;
            () = self.inner.stop.cancelled() => return Err(RequestError::Stopped),
            verdict = tokio::time::timeout(verifier.timeout, verifier.runner.run(claim)) => {
                verdict.unwrap_or_else(|_| Verdict::undecided(format!(
                    "verifier {} did not answer within {} ms",
                    verifier.descriptor.name,
                    verifier.timeout.as_millis()
                )))
            }
        };
        Ok(verdict.into_response())
    }
}

#[tonic::async_trait]
impl ToolExecutorService for Executor {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse {
            tools: self
                .inner
                .tools
                .iter()
                .map(|t| t.descriptor.clone())
                .collect(),
            verifiers: self
                .inner
                .verifiers
                .iter()
                .map(|v| v.descriptor.clone())
                .collect(),
        }))
    }

    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        Ok(Response::new(
            self.execute_request(request).await?.into_response(),
        ))
    }

    type ExecuteStageStream = StageStream;

    /// Each call runs in a future of the stream, so the answers go out in the order the
    /// calls finish, and dropping the stream (the gateway gave up, or went away)
    /// cancels those still running, as a dropped `Execute` would.
    async fn execute_stage(
        &self,
        request: Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<Response<StageStream>, Status> {
        let caller = caller(&request);
        let calls = request.into_inner().calls;
        if calls.len() > MAX_STAGE_CALLS {
            return Err(RequestError::InvalidRequest(format!(
                "{} calls in one stage, more than {MAX_STAGE_CALLS}",
                calls.len()
            ))
            .into());
        }
        let answers: FuturesUnordered<_> = calls
            .into_iter()
            .zip(0u32..)
            .map(|(call, index)| {
                let executor = self.clone();
                let caller = caller.clone();
                async move {
                    Ok(ToolExecutorServiceExecuteStageResponse {
                        index,
                        answer: Some(executor.stage_call(caller, call).await),
                    })
                }
            })
            .collect();
        Ok(Response::new(Box::pin(answers)))
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Ok(Response::new(self.reconcile_effect(request.get_ref())?))
    }

    async fn verify(
        &self,
        request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        Ok(Response::new(
            self.verify_claim(request.into_inner()).await?,
        ))
    }
}

/// Who calls, as the guard in front of this service established it (`auth.callers`).
/// `None` when the port is open or the call comes in-process.
fn caller<T>(request: &Request<T>) -> Option<String> {
    request
        .extensions()
        .get::<agentloop_auth::Caller>()
        .map(|caller| caller.0.clone())
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn names_follow_the_registrys_rule() {
        for good in ["a", "lookup", "db.query-v2_x", &"n".repeat(64)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "has space", "ünï", "a/b", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert!(!valid_timeout(Duration::ZERO));
        assert!(!valid_timeout(Duration::from_micros(999)));
        assert!(valid_timeout(Duration::from_millis(1)));
        assert!(valid_timeout(MAX_TIMEOUT));
        assert!(!valid_timeout(MAX_TIMEOUT + Duration::from_millis(1)));
    }

    #[test]
    fn arguments_are_the_same_whatever_their_spacing_and_key_order() {
        assert!(same_arguments(
            r#"{"a":1,"b":[2]}"#,
            r#"{ "b": [2], "a": 1 }"#
        ));
        assert!(!same_arguments(r#"{"a":1}"#, r#"{"a":2}"#));
        assert!(!same_arguments(r#"{"a":1}"#, "not json"));
    }
}
