//! The gateway service: routes each call to the executor that owns its tool, and each
//! verification to the executor that serves its verifier.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentloop_auth::Caller;
use agentloop_engine::{CallOutcome, SideEffect, ToolCall, ToolDigest};
use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::client::ClientConfig;
use agentloop_proto::server::ToolExecutor;
use agentloop_proto::v1::stage_answer::Answer;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    Check, DeregisterExecutorRequest, DeregisterExecutorResponse, ErrorType, ExecuteStageRequest,
    ExecuteStageResponse, InputAction, InputAnswer, ListToolsRequest, ListToolsResponse,
    NextAction, RegisterExecutorRequest, RegisterExecutorResponse, StageAnswer, ToolDescriptor,
    ToolError, ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteStageRequest,
    ToolExecutorServiceExecuteStageResponse, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceVerifyRequest, ToolGatewayServiceExecuteRequest,
    ToolGatewayServiceExecuteResponse, ToolGatewayServiceReconcileRequest,
    ToolGatewayServiceReconcileResponse, ToolGatewayServiceVerifyRequest,
    ToolGatewayServiceVerifyResponse, ToolResult,
};
use futures::future::join_all;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Request, Response, Status};

use crate::config::ToolsConfig;
use crate::error::GatewayError;
use crate::observe::Observed;
use crate::outcome::{CallFailure, classify_status, failure_outcome};
use crate::registry::{self, Executor, Registrar, Registry, Route, Tool};
use crate::verdict;

/// One call to send to the executor of its tool, as the runtime planned it.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    /// The invocation the call belongs to.
    pub invocation_id: &'a str,
    /// The call.
    pub call: &'a ToolCall,
    /// The write's effect key; empty for a read.
    pub effect_key: &'a str,
    /// Which dispatch of the effect this is, from 1.
    pub attempt: u32,
    /// The longest the caller waits; the tool's own timeout bounds it too.
    pub timeout: Option<Duration>,
    /// The tool's contract version the call was planned under; a call planned under
    /// another is not sent.
    pub planned: Option<ToolDigest>,
    /// A person's answer to the question the call asked when it was sent before; passed
    /// on to the executor.
    pub answer: Option<&'a InputAnswer>,
}

/// What became of a call the gateway sent, in the engine's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The call's result.
    pub outcome: CallOutcome,
    /// The executor's identifier of an applied write; empty otherwise.
    pub receipt: String,
}

/// Longest invocation ID, call ID or effect key the gateway forwards, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Most names one `ListTools` request may filter by.
pub const MAX_LIST_NAMES: usize = 1024;

/// Limits of the gateway (file, `AGENTLOOP_TOOLS_*` env, flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayLimits {
    /// Most calls in flight to one executor endpoint; further calls wait for a slot
    /// until their deadline, then end `not_started`.
    pub max_concurrent_calls_per_executor: usize,
    /// Largest `arguments_json` forwarded, in bytes.
    pub max_arguments_bytes: usize,
    /// Longest time to establish a connection to an executor, in milliseconds.
    pub connect_timeout_ms: u64,
    /// How often every executor's health is checked, in milliseconds. An executor that
    /// fails it (or that a call cannot reach) has its tools listed unavailable, and
    /// their calls answer `unavailable` at once, until a check passes again.
    pub health_check_ms: u64,
    /// How often the executors registered by endpoint are described again, in
    /// milliseconds (they are also described when they come back, and when they
    /// register again).
    pub describe_every_ms: u64,
    /// Longest one `Describe` or health check may take, in milliseconds.
    pub describe_timeout_ms: u64,
}

impl GatewayLimits {
    /// Checks every limit is in range.
    ///
    /// # Errors
    ///
    /// [`GatewayError::InvalidLimits`] naming the first one that is not.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.max_concurrent_calls_per_executor == 0
            || self.max_concurrent_calls_per_executor > Semaphore::MAX_PERMITS
        {
            return Err(GatewayError::InvalidLimits(
                "max_concurrent_calls_per_executor must be at least 1".to_owned(),
            ));
        }
        for (name, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("health_check_ms", self.health_check_ms),
            ("describe_every_ms", self.describe_every_ms),
            ("describe_timeout_ms", self.describe_timeout_ms),
        ] {
            if !(1..=crate::config::MAX_TIMEOUT_MS).contains(&value) {
                return Err(GatewayError::InvalidLimits(format!(
                    "{name} must be 1..={}, got {value}",
                    crate::config::MAX_TIMEOUT_MS
                )));
            }
        }
        Ok(())
    }
}

impl Default for GatewayLimits {
    fn default() -> Self {
        GatewayLimits {
            max_concurrent_calls_per_executor: 64,
            max_arguments_bytes: 1024 * 1024,
            connect_timeout_ms: 2_000,
            health_check_ms: 2_000,
            describe_every_ms: 30_000,
            describe_timeout_ms: 5_000,
        }
    }
}

/// Executors that run in the gateway's own process, by the endpoint the registry names
/// them with. Calls to their tools skip the network: the executor's service is called
/// directly, under the same deadline, slots and result mapping as over gRPC, and
/// dropping the call still cancels it. For embedding and benchmarks; a deployment
/// reaches its executors over gRPC.
pub type InProcessExecutors = Vec<(String, Arc<ToolExecutor>)>;

/// The tool gateway. Cheap to clone; serve it with
/// [`agentloop_proto::server::tool_gateway`] or [`crate::run`].
#[derive(Debug, Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registrar: Arc<Registrar>,
    limits: GatewayLimits,
    /// The callers (by their `auth.callers` names) that may register and deregister
    /// executors, and may do nothing else; unset when callers are not authenticated.
    registrars: std::sync::OnceLock<Vec<String>>,
    /// The call metrics, into the process's telemetry unless [`Gateway::with_telemetry`]
    /// gave it another.
    observed: Observed,
    /// Health checks and descriptions on a period, until the gateway is dropped.
    _upkeep: AbortOnDropHandle<()>,
}

impl Gateway {
    /// Builds the gateway over a validated registry: one channel per distinct endpoint,
    /// whether it serves tools, verifiers or both, created now but connected on first
    /// use, so the gateway can start before its executors. The executors the registry
    /// names by endpoint (`[[executors]]`) are described before it returns if they
    /// answer, and on every health round until they do. Must be called inside a tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// [`GatewayError::Config`] if the registry is invalid, [`GatewayError::InvalidLimits`]
    /// for limits out of range, [`GatewayError::Connect`] if an endpoint cannot be
    /// turned into a channel.
    pub async fn new(tools: ToolsConfig, limits: GatewayLimits) -> Result<Gateway, GatewayError> {
        Gateway::with_in_process(
            tools,
            limits,
            InProcessExecutors::new(),
            ClientConfig::default(),
        )
        .await
    }

    /// Like [`Gateway::new`], with the tools of the endpoints in `in_process` routed to
    /// those executors without a network (see [`InProcessExecutors`]), and the others
    /// reached as `client` says: its service token and TLS, for executors that check who
    /// calls them (the gateway sets the timeouts).
    ///
    /// # Errors
    ///
    /// As [`Gateway::new`].
    pub async fn with_in_process(
        tools: ToolsConfig,
        limits: GatewayLimits,
        in_process: InProcessExecutors,
        client: ClientConfig,
    ) -> Result<Gateway, GatewayError> {
        limits.validate()?;
        let client_config = client
            .with_lazy(true)
            .with_connect_timeout(Duration::from_millis(limits.connect_timeout_ms))
            // Each call carries its own deadline (the smaller of the tool's timeout and
            // the request's), so the channel adds none.
            .with_request_timeout(None);
        let registrar = Arc::new(
            Registrar::new(
                tools,
                in_process,
                client_config,
                limits.max_concurrent_calls_per_executor,
                Duration::from_millis(limits.describe_timeout_ms),
            )
            .await?,
        );
        registrar.refresh(true).await;
        let upkeep = AbortOnDropHandle::new(tokio::spawn(registry::upkeep(
            Arc::downgrade(&registrar),
            Duration::from_millis(limits.health_check_ms),
            Duration::from_millis(limits.describe_every_ms),
        )));
        Ok(Gateway {
            inner: Arc::new(Inner {
                registrar,
                limits,
                registrars: std::sync::OnceLock::new(),
                observed: Observed::new(&agentloop_server::process_telemetry()),
                _upkeep: upkeep,
            }),
        })
    }

    /// Admits only `callers` (by their `auth.callers` names) to `RegisterExecutor` and
    /// `DeregisterExecutor`, and admits them to nothing else: an executor that may
    /// register itself may not run other executors' tools. Without it (callers not
    /// authenticated), whoever reaches the gateway may register. Set once, at start: a
    /// second call changes nothing.
    #[must_use]
    pub fn with_registrars(self, callers: Vec<String>) -> Gateway {
        if self.inner.registrars.set(callers).is_err() {
            tracing::warn!("the gateway's registrars were already set; kept the first list");
        }
        self
    }

    /// Records the call metrics into `telemetry` (one service's of several in a
    /// process). Set at start, before the gateway is cloned or served: on a gateway
    /// already shared it changes nothing.
    #[must_use]
    pub fn with_telemetry(mut self, telemetry: &agentloop_telemetry::Telemetry) -> Gateway {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.observed = Observed::new(telemetry),
            None => tracing::warn!("the gateway is already shared; kept its telemetry"),
        }
        self
    }

    /// The descriptors of every registered tool, sorted by name, each marked
    /// unavailable while its executor is.
    pub fn descriptors(&self) -> Vec<ToolDescriptor> {
        Registry::listed(self.inner.registrar.current().tools.values())
    }

    /// What `ListTools` answers for every tool: the descriptors and the registry digest.
    pub fn list(&self) -> ListToolsResponse {
        let registry = self.inner.registrar.current();
        ListToolsResponse {
            tools: Registry::listed(registry.tools.values()),
            registry_digest: registry.digest.clone(),
        }
    }

    /// Checks that the caller may call a tool method: not a registrar.
    fn admit_caller<T>(&self, request: &Request<T>) -> Result<(), GatewayError> {
        match (
            self.inner.registrars.get(),
            request.extensions().get::<Caller>(),
        ) {
            (Some(registrars), Some(Caller(name))) if registrars.contains(name) => {
                Err(GatewayError::NotAllowed(name.clone()))
            }
            _ => Ok(()),
        }
    }

    /// Checks that the caller may register executors: a registrar, when callers are
    /// authenticated.
    fn admit_registrar<T>(&self, request: &Request<T>) -> Result<(), GatewayError> {
        match (
            self.inner.registrars.get(),
            request.extensions().get::<Caller>(),
        ) {
            (Some(registrars), Some(Caller(name))) if !registrars.contains(name) => {
                Err(GatewayError::NotAllowed(name.clone()))
            }
            (Some(_), None) => Err(GatewayError::NotAllowed("an unnamed caller".to_owned())),
            _ => Ok(()),
        }
    }

    /// Sends one call in the engine's terms: the embedded runtime's path, where nothing
    /// but the executor's own request is a wire message.
    ///
    /// # Errors
    ///
    /// As `Execute` refuses a call: [`GatewayError::InvalidRequest`],
    /// [`GatewayError::UnknownTool`].
    pub async fn dispatch(&self, dispatch: Dispatch<'_>) -> Result<Answered, GatewayError> {
        let outcome = self.execute_call(dispatch).await?;
        let receipt = match &outcome {
            Outcome::Output(output) => output.receipt.clone(),
            Outcome::Error(_)
            | Outcome::Cancelled(_)
            | Outcome::NotStarted(_)
            | Outcome::Unknown(_)
            | Outcome::InputRequired(_) => String::new(),
        };
        Ok(Answered {
            outcome: agentloop_wire::outcome_from(outcome),
            receipt,
        })
    }

    /// Executes one call as it came over the wire: the API's path.
    async fn execute_request(
        &self,
        request: ToolGatewayServiceExecuteRequest,
    ) -> Result<ToolResult, GatewayError> {
        let registry = self.inner.registrar.current();
        let began = Instant::now();
        let (tool, call_id, deadline, timeout, request) =
            match self.check_request(&registry, request, began)? {
                (tool, Checked::Ready(ready)) => (
                    tool,
                    ready.call_id().to_owned(),
                    ready.deadline,
                    ready.timeout,
                    ready.request,
                ),
                (tool, Checked::Answered { call_id, outcome }) => {
                    self.observe(tool, &outcome, began);
                    return Ok(ToolResult {
                        call_id,
                        outcome: Some(outcome),
                    });
                }
            };
        let outcome = self
            .forward_call(tool, &call_id, deadline, timeout, request)
            .await;
        self.observe(tool, &outcome, began);
        Ok(ToolResult {
            call_id,
            outcome: Some(outcome),
        })
    }

    /// Executes one call: checks it, forwards it under its deadline and turns any
    /// failure into the call's one terminal result.
    ///
    /// The embedded runtime's path, where every call in flight holds this future: the
    /// checked call is taken apart inside the `match`, so that no part of it is kept
    /// beside what `forward_call` holds (a local moved in part stays in the future).
    async fn execute_call(&self, dispatch: Dispatch<'_>) -> Result<Outcome, GatewayError> {
        let registry = self.inner.registrar.current();
        let began = Instant::now();
        let (tool, deadline, timeout, request) = match self.check(&registry, dispatch, began)? {
            (tool, Checked::Ready(ready)) => (tool, ready.deadline, ready.timeout, ready.request),
            (tool, Checked::Answered { outcome, .. }) => {
                self.observe(tool, &outcome, began);
                return Ok(outcome);
            }
        };
        let call_id = dispatch.call.call_id.as_str();
        let outcome = self
            .forward_call(tool, call_id, deadline, timeout, request)
            .await;
        self.observe(tool, &outcome, began);
        Ok(outcome)
    }

    /// Counts a call of `tool` that came to `outcome`, begun at `began`.
    fn observe(&self, tool: &Tool, outcome: &Outcome, began: Instant) {
        self.inner
            .observed
            .call_done(&tool.entry.name, outcome, began.elapsed());
    }

    /// Checks one call as it came over the wire, as [`Gateway::check`] does.
    fn check_request<'r>(
        &self,
        registry: &'r Registry,
        request: ToolGatewayServiceExecuteRequest,
        began: Instant,
    ) -> Result<(&'r Tool, Checked), GatewayError> {
        let call = request
            .call
            .map(agentloop_wire::tool_call_from)
            .ok_or_else(|| GatewayError::InvalidRequest("call is required".to_owned()))?;
        let planned = match request.descriptor_digest.as_str() {
            "" => None,
            digest => Some(digest.parse().map_err(|_| {
                GatewayError::InvalidRequest(format!(
                    "descriptor_digest {:?} is not a tool digest",
                    agentloop_proto::prefix(digest, 64)
                ))
            })?),
        };
        let timeout = requested_timeout(request.timeout)?;
        self.check(
            registry,
            Dispatch {
                invocation_id: &request.invocation_id,
                call: &call,
                effect_key: &request.effect_key,
                attempt: request.attempt,
                timeout,
                planned,
                answer: request.input_answer.as_ref(),
            },
            began,
        )
    }

    /// Checks one call and makes the executor's request of it, with its deadline from
    /// `began`; or answers it at once when it cannot be sent.
    fn check<'r>(
        &self,
        registry: &'r Registry,
        dispatch: Dispatch<'_>,
        began: Instant,
    ) -> Result<(&'r Tool, Checked), GatewayError> {
        let call = dispatch.call;
        for (field, value) in [
            ("invocation_id", dispatch.invocation_id),
            ("call.call_id", call.call_id.as_str()),
            ("effect_key", dispatch.effect_key),
        ] {
            if value.len() > MAX_ID_BYTES {
                return Err(GatewayError::InvalidRequest(format!(
                    "{field} longer than {MAX_ID_BYTES} bytes"
                )));
            }
        }
        if call.call_id.as_str().is_empty() {
            return Err(GatewayError::InvalidRequest(
                "call.call_id is required".to_owned(),
            ));
        }
        let max_args = self.inner.limits.max_arguments_bytes;
        if call.arguments_json.len() > max_args {
            return Err(GatewayError::InvalidRequest(format!(
                "arguments_json is {} bytes, more than {max_args}",
                call.arguments_json.len()
            )));
        }
        if let Some(answer) = dispatch.answer {
            check_answer(answer, max_args)?;
        }
        let tool = tool(registry, &call.tool)?;
        // Never dispatch a write the executor could not dedupe.
        if tool.entry.side_effect.writes() && dispatch.effect_key.is_empty() {
            return Err(GatewayError::InvalidRequest(format!(
                "tool {:?} writes, so the call needs an effect key",
                call.tool
            )));
        }
        if let Some(outcome) = unsendable(tool, dispatch.planned) {
            let call_id = call.call_id.as_str().to_owned();
            return Ok((tool, Checked::Answered { call_id, outcome }));
        }
        let timeout = bounded(dispatch.timeout, tool.entry.timeout());
        let request = ToolExecutorServiceExecuteRequest {
            invocation_id: dispatch.invocation_id.to_owned(),
            call: Some(agentloop_wire::tool_call(call)),
            effect_key: dispatch.effect_key.to_owned(),
            attempt: dispatch.attempt,
            input_answer: dispatch.answer.cloned(),
        };
        Ok((
            tool,
            Checked::Ready(Ready {
                deadline: began + timeout,
                timeout,
                request,
            }),
        ))
    }

    /// Forwards one checked call to its tool's executor; what it came to.
    async fn forward_call(
        &self,
        tool: &Tool,
        call_id: &str,
        deadline: Instant,
        timeout: Duration,
        request: ToolExecutorServiceExecuteRequest,
    ) -> Outcome {
        let route = &tool.executor.route;
        let forwarded = self
            .forward(
                &tool.executor,
                &tool.entry.name,
                deadline,
                timeout,
                request,
                |request| async move {
                    match route {
                        Route::Grpc { client, .. } => client.clone().execute(request).await,
                        Route::InProcess(service) => service.execute(request).await,
                    }
                },
            )
            .await;
        let side_effect = tool.entry.side_effect;
        match forwarded {
            Ok(reply) => reply_outcome(side_effect, call_id, reply.result),
            Err(failure) => {
                tracing::info!(tool = %tool.entry.name, ?failure, "executor call failed");
                failure_outcome(side_effect, &failure)
            }
        }
    }

    /// A stage of reads, answered call by call as `Execute` would have. The calls to
    /// one executor across the network go to it as one `ExecuteStage` (as many as its
    /// slots allow in each); the others, and those to an executor that does not serve
    /// stages, go one by one. All run at the same time.
    async fn stage(&self, calls: Vec<ToolGatewayServiceExecuteRequest>) -> Vec<StageAnswer> {
        let registry = self.inner.registrar.current();
        let began = Instant::now();
        let mut answers: Vec<Option<StageAnswer>> = vec![None; calls.len()];
        let mut ready: Vec<Staged<'_>> = Vec::with_capacity(calls.len());
        for (index, request) in calls.into_iter().enumerate() {
            let write = request
                .call
                .as_ref()
                .and_then(|call| registry.tools.get(&call.tool))
                .filter(|tool| tool.entry.side_effect.writes());
            let checked = match write {
                Some(tool) => Err(GatewayError::WriteInStage(tool.entry.name.clone())),
                None => self.check_request(&registry, request, began),
            };
            let answer = match checked {
                Ok((tool, Checked::Ready(call))) => {
                    ready.push((index, tool, call));
                    continue;
                }
                Ok((tool, Checked::Answered { call_id, outcome })) => {
                    self.observe(tool, &outcome, began);
                    stage_result(call_id, outcome)
                }
                Err(error) => agentloop_proto::stage_answer(Err(error.into())),
            };
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        let sent = join_all(self.batches(ready).into_iter().map(|batch| async move {
            match batch {
                Batch::One(call) => vec![self.forward_one(call, began).await],
                Batch::Stage(executor, calls) => self.forward_stage(&executor, calls, began).await,
            }
        }))
        .await;
        for (index, answer) in sent.into_iter().flatten() {
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                // Every index was answered above; the default only keeps this total.
                answer.unwrap_or_else(|| {
                    agentloop_proto::stage_answer(Err(Status::internal("the call was not sent")))
                })
            })
            .collect()
    }

    /// The stage's sendable calls, in the requests they go in: those to one executor
    /// across the network that serves stages together, at most as many as its slots
    /// in one request; any other alone.
    fn batches<'r>(&self, ready: Vec<Staged<'r>>) -> Vec<Batch<'r>> {
        let most = self
            .inner
            .limits
            .max_concurrent_calls_per_executor
            .min(MAX_STAGE_CALLS);
        let mut batches = Vec::new();
        let mut staged: Vec<(Arc<Executor>, Vec<Staged<'r>>)> = Vec::new();
        for (index, tool, call) in ready {
            let executor = &tool.executor;
            if !matches!(executor.route, Route::Grpc { .. }) || !executor.serves_stages() {
                batches.push(Batch::One((index, tool, call)));
                continue;
            }
            match staged
                .iter_mut()
                .find(|(to, calls)| Arc::ptr_eq(to, executor) && calls.len() < most)
            {
                Some((_, calls)) => calls.push((index, tool, call)),
                None => staged.push((Arc::clone(executor), vec![(index, tool, call)])),
            }
        }
        for (executor, mut calls) in staged {
            if calls.len() == 1
                && let Some(call) = calls.pop()
            {
                batches.push(Batch::One(call));
            } else {
                batches.push(Batch::Stage(executor, calls));
            }
        }
        batches
    }

    /// Sends one call of a stage on its own.
    async fn forward_one(
        &self,
        (index, tool, call): Staged<'_>,
        began: Instant,
    ) -> (usize, StageAnswer) {
        let call_id = call.call_id().to_owned();
        let Ready {
            deadline,
            timeout,
            request,
        } = call;
        let outcome = self
            .forward_call(tool, &call_id, deadline, timeout, request)
            .await;
        self.observe(tool, &outcome, began);
        (index, stage_result(call_id, outcome))
    }

    /// Sends `calls`, reads all, to `executor` as one `ExecuteStage` in as many of its
    /// slots, under the latest of their deadlines, and takes each answer as `Execute`
    /// would have: one that comes after its own call's deadline is that call's
    /// deadline passing. An executor that answers UNIMPLEMENTED gets these calls, and
    /// the later ones, one by one.
    async fn forward_stage(
        &self,
        executor: &Executor,
        calls: Vec<Staged<'_>>,
        began: Instant,
    ) -> Vec<(usize, StageAnswer)> {
        let (Route::Grpc { client, .. }, Some(latest)) = (
            &executor.route,
            calls.iter().map(|(_, _, call)| call.deadline).max(),
        ) else {
            return join_all(calls.into_iter().map(|call| self.forward_one(call, began))).await;
        };
        let mut stage = Stage::new(&self.inner.observed, began, calls.len());
        let permits = u32::try_from(calls.len()).unwrap_or(u32::MAX);
        let slots = tokio::time::timeout_at(
            latest,
            Arc::clone(&executor.slots).acquire_many_owned(permits),
        )
        .await;
        // Waiting for slots sends nothing, so running out of time here is `not_started`.
        let Ok(Ok(slots)) = slots else {
            stage.fail(Sent::all(calls), &self.busy(executor));
            return stage.answers;
        };
        let now = Instant::now();
        let (late, calls): (Vec<_>, Vec<_>) = calls
            .into_iter()
            .partition(|(_, _, call)| call.deadline <= now);
        stage.fail(Sent::all(late), &self.busy(executor));
        // Until the executor has answered a stage, the calls are kept to be sent one by
        // one if it does not serve them.
        let kept = (!executor.knows_stages()).then(|| calls.clone());
        let (calls, requests): (Vec<Sent<'_>>, Vec<_>) = calls
            .into_iter()
            .map(|(index, tool, call)| (Sent::new(index, tool, &call), call.request))
            .unzip();
        stage.pending = calls.into_iter().map(Some).collect();
        let mut request = Request::new(ToolExecutorServiceExecuteStageRequest { calls: requests });
        request.set_timeout(latest.saturating_duration_since(now));
        let mut client = client.clone();
        let opening = client.execute_stage(request);
        tokio::pin!(opening);
        let opened = loop {
            let Some(next) = stage.next_deadline() else {
                return stage.answers;
            };
            match tokio::time::timeout_at(next, &mut opening).await {
                Ok(opened) => break opened,
                Err(_elapsed) => stage.expire(),
            }
        };
        let mut replies = match opened {
            Ok(response) => {
                // Written once, not on every stage: the executor is shared by all calls.
                if kept.is_some() {
                    executor.set_serves_stages(true);
                }
                response.into_inner()
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                executor.set_serves_stages(false);
                drop(slots);
                let Some(kept) = kept else {
                    // It served stages before and no longer does (replaced without a
                    // failed health check): these calls fail, as an Execute answered
                    // UNIMPLEMENTED would; the next ones go one by one.
                    stage.fail_pending(&self.failed(executor, &status));
                    return stage.answers;
                };
                let unanswered = kept
                    .into_iter()
                    .filter(|(index, _, _)| stage.is_pending(*index));
                let sent = join_all(unanswered.map(|call| self.forward_one(call, began))).await;
                stage.answers.extend(sent);
                return stage.answers;
            }
            Err(status) => {
                stage.fail_pending(&self.failed(executor, &status));
                return stage.answers;
            }
        };
        // An executor may send one answer per call: the bound on a stream that repeats
        // or invents indices.
        let mut budget = stage.pending.len();
        while let Some(next) = stage.next_deadline() {
            if budget == 0 {
                stage.fail_pending(&CallFailure::MalformedReply {
                    detail: "the stage's answers repeat or name calls it was not sent".to_owned(),
                });
                break;
            }
            let reply = match tokio::time::timeout_at(next, replies.message()).await {
                Err(_elapsed) => {
                    stage.expire();
                    continue;
                }
                Ok(Ok(Some(reply))) => reply,
                Ok(Ok(None)) => {
                    stage.fail_pending(&CallFailure::MalformedReply {
                        detail: "the stage ended without an answer for the call".to_owned(),
                    });
                    break;
                }
                Ok(Err(status)) => {
                    stage.fail_pending(&self.failed(executor, &status));
                    break;
                }
            };
            budget -= 1;
            if !stage.answer(reply) {
                tracing::info!(
                    endpoint = %executor.endpoint,
                    "an executor's stage answered a call twice, or one it was not sent"
                );
            }
        }
        // Calls still running at the executor, if any, are cancelled with the stream.
        drop(replies);
        drop(slots);
        stage.answers
    }

    /// The failure of calls that waited for `executor`'s slots until their deadline.
    fn busy(&self, executor: &Executor) -> CallFailure {
        CallFailure::NotSent {
            detail: format!(
                "the executor at {} was busy ({} calls in flight) until the deadline",
                executor.endpoint, self.inner.limits.max_concurrent_calls_per_executor
            ),
        }
    }

    /// What a status from `executor` means for its calls; an executor that cannot be
    /// reached is marked down, so that its calls answer at once until a health check
    /// passes.
    fn failed(&self, executor: &Executor, status: &Status) -> CallFailure {
        let failure = classify_status(status);
        if let CallFailure::Unreachable { .. } = failure {
            executor.set_up(false);
        }
        failure
    }

    /// Sends `request` to `executor` through `send`, in one of the executor's slots and
    /// under `deadline`; `name` is the tool or verifier, for the failure's detail.
    ///
    /// Cancellation needs no code: this future is awaited inside the gRPC handler, so
    /// when the gateway's caller goes away tonic drops the handler, which drops this
    /// future, the in-flight client call and its HTTP/2 stream; the executor sees the
    /// reset and drops its own handler. An in-process executor's future is dropped
    /// with it.
    async fn forward<Req, Resp, Sent>(
        &self,
        executor: &Executor,
        name: &str,
        deadline: Instant,
        timeout: Duration,
        request: Req,
        send: impl FnOnce(Request<Req>) -> Sent,
    ) -> Result<Resp, CallFailure>
    where
        Sent: Future<Output = Result<Response<Resp>, Status>>,
    {
        // Waiting for a slot sends nothing, so running out of time here is `not_started`.
        let Ok(slot) =
            tokio::time::timeout_at(deadline, Arc::clone(&executor.slots).acquire_owned()).await
        else {
            return Err(CallFailure::NotSent {
                detail: format!(
                    "the executor of {name:?} was busy ({} calls in flight) until the deadline",
                    self.inner.limits.max_concurrent_calls_per_executor
                ),
            });
        };
        let Ok(slot) = slot else {
            // The semaphore is never closed; treat it like a busy executor anyway.
            return Err(CallFailure::NotSent {
                detail: "executor slots closed".to_owned(),
            });
        };
        let mut grpc_request = Request::new(request);
        // Tell the executor the deadline too (grpc-timeout), so it can stop in time.
        grpc_request.set_timeout(
            deadline
                .saturating_duration_since(Instant::now())
                .min(timeout),
        );
        let result = tokio::time::timeout_at(deadline, send(grpc_request)).await;
        drop(slot);
        match result {
            Err(_elapsed) => Err(CallFailure::DeadlineExceeded),
            Ok(Err(status)) => Err(self.failed(executor, &status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// Asks the verifier's executor to judge the claim. Only a request the gateway
    /// cannot route is an error; whatever happens once it is routed is a check.
    async fn verify_claim(
        &self,
        request: ToolGatewayServiceVerifyRequest,
    ) -> Result<Check, GatewayError> {
        let registry = self.inner.registrar.current();
        let verifier = registry
            .verifiers
            .get(&request.verifier)
            .ok_or_else(|| GatewayError::UnknownVerifier(request.verifier.clone()))?;
        let claim = request
            .claim
            .ok_or_else(|| GatewayError::InvalidRequest("claim is required".to_owned()))?;
        let timeout = effective_timeout(request.timeout, verifier.entry.timeout())?;
        let deadline = Instant::now() + timeout;
        let name = verifier.entry.name.as_str();
        if !verifier.executor.is_up() {
            return Ok(verdict::unanswered(
                name,
                timeout,
                &unavailable_failure(&verifier.executor),
            ));
        }
        let route = &verifier.executor.route;
        let forwarded = self
            .forward(
                &verifier.executor,
                name,
                deadline,
                timeout,
                ToolExecutorServiceVerifyRequest {
                    verifier: request.verifier,
                    claim: Some(claim),
                },
                |request| async move {
                    match route {
                        Route::Grpc { client, .. } => client.clone().verify(request).await,
                        Route::InProcess(service) => service.verify(request).await,
                    }
                },
            )
            .await;
        let check = match forwarded {
            Ok(reply) => verdict::answered(name, reply),
            // The executor enforces the same deadline (grpc-timeout) and may answer
            // first, with CANCELLED or DEADLINE_EXCEEDED: past the deadline, whatever
            // failed, it ran out of time.
            Err(CallFailure::Status { .. }) if Instant::now() >= deadline => {
                verdict::unanswered(name, timeout, &CallFailure::DeadlineExceeded)
            }
            Err(failure) => {
                tracing::info!(verifier = %name, ?failure, "verifier call failed");
                verdict::unanswered(name, timeout, &failure)
            }
        };
        Ok(check)
    }

    async fn reconcile_effect(
        &self,
        request: ToolGatewayServiceReconcileRequest,
    ) -> Result<ToolGatewayServiceReconcileResponse, GatewayError> {
        if request.effect_key.is_empty() || request.effect_key.len() > MAX_ID_BYTES {
            return Err(GatewayError::InvalidRequest(format!(
                "effect_key must be 1 to {MAX_ID_BYTES} bytes"
            )));
        }
        let registry = self.inner.registrar.current();
        let tool = tool(&registry, &request.tool)?;
        match tool.entry.side_effect {
            SideEffect::ReadOnly => return Err(GatewayError::NotReconcilable(request.tool)),
            SideEffect::IdempotentWrite | SideEffect::Write => {}
        }
        let mut grpc_request = Request::new(ToolExecutorServiceReconcileRequest {
            tool: request.tool,
            effect_key: request.effect_key,
        });
        grpc_request.set_timeout(tool.entry.timeout());
        let timeout = tool.entry.timeout();
        let reply = match &tool.executor.route {
            Route::Grpc { client, .. } => {
                tokio::time::timeout(timeout, client.clone().reconcile(grpc_request)).await
            }
            Route::InProcess(service) => {
                tokio::time::timeout(timeout, service.reconcile(grpc_request)).await
            }
        };
        let reply = reply
            .map_err(|_| GatewayError::Executor(Status::deadline_exceeded("reconcile timed out")))?
            .map_err(GatewayError::Executor)?
            .into_inner();
        Ok(ToolGatewayServiceReconcileResponse {
            status: reply.status,
            receipt: reply.receipt,
            output_json: reply.output_json,
            detail: reply.detail,
        })
    }
}

/// A timeout on the wire, which must not be negative.
/// A call checked and ready for its tool's executor.
#[derive(Debug, Clone)]
struct Ready {
    deadline: Instant,
    /// The time from the check to the deadline: the longest the call may take.
    timeout: Duration,
    request: ToolExecutorServiceExecuteRequest,
}

impl Ready {
    fn call_id(&self) -> &str {
        self.request
            .call
            .as_ref()
            .map_or("", |call| call.call_id.as_str())
    }
}

/// A checked call: ready to send, or answered without being sent.
#[derive(Debug)]
enum Checked {
    Ready(Ready),
    /// Its answer is known without asking (a contract that changed, an executor known
    /// to be down).
    Answered {
        call_id: String,
        outcome: Outcome,
    },
}

/// A call of a stage ready to send: its place in the stage, its tool, the call.
type Staged<'r> = (usize, &'r Tool, Ready);

/// How the sendable calls of a stage go out.
enum Batch<'r> {
    /// On its own, as `Execute` sends it: its index in the stage, its tool, the call.
    One(Staged<'r>),
    /// With others to the same executor, in one `ExecuteStage`.
    Stage(Arc<Executor>, Vec<Staged<'r>>),
}

/// A call of a stage whose request went out: what its answer is checked against.
struct Sent<'r> {
    index: usize,
    tool: &'r Tool,
    deadline: Instant,
    call_id: String,
}

impl<'r> Sent<'r> {
    fn new(index: usize, tool: &'r Tool, call: &Ready) -> Sent<'r> {
        Sent {
            index,
            tool,
            deadline: call.deadline,
            call_id: call.call_id().to_owned(),
        }
    }

    fn all(calls: Vec<Staged<'r>>) -> Vec<Sent<'r>> {
        calls
            .into_iter()
            .map(|(index, tool, call)| Sent::new(index, tool, &call))
            .collect()
    }
}

/// The answers of one `ExecuteStage`, each counted in the call metrics as it comes,
/// and the calls sent that are still unanswered.
struct Stage<'o, 'r> {
    observed: &'o Observed,
    began: Instant,
    answers: Vec<(usize, StageAnswer)>,
    /// By their place in the request; `None` once answered.
    pending: Vec<Option<Sent<'r>>>,
}

impl<'o, 'r> Stage<'o, 'r> {
    fn new(observed: &'o Observed, began: Instant, calls: usize) -> Stage<'o, 'r> {
        Stage {
            observed,
            began,
            answers: Vec::with_capacity(calls),
            pending: Vec::new(),
        }
    }

    fn done(&mut self, sent: Sent<'_>, outcome: Outcome) {
        self.observed
            .call_done(&sent.tool.entry.name, &outcome, self.began.elapsed());
        self.answers
            .push((sent.index, stage_result(sent.call_id, outcome)));
    }

    /// Answers `calls` with `failure`.
    fn fail(&mut self, calls: Vec<Sent<'_>>, failure: &CallFailure) {
        if !calls.is_empty() {
            tracing::info!(?failure, calls = calls.len(), "executor stage failed");
        }
        for sent in calls {
            let outcome = failure_outcome(sent.tool.entry.side_effect, failure);
            self.done(sent, outcome);
        }
    }

    /// Answers every call still pending with `failure`.
    fn fail_pending(&mut self, failure: &CallFailure) {
        let pending = std::mem::take(&mut self.pending);
        self.fail(pending.into_iter().flatten().collect(), failure);
    }

    fn is_pending(&self, index: usize) -> bool {
        self.pending
            .iter()
            .flatten()
            .any(|sent| sent.index == index)
    }

    /// The earliest deadline of a call still pending; `None` when all are answered.
    fn next_deadline(&self) -> Option<Instant> {
        self.pending
            .iter()
            .flatten()
            .map(|sent| sent.deadline)
            .min()
    }

    /// Answers the pending calls whose deadline has passed: the executor's answer, if
    /// it comes, is not waited for, as `Execute` would not have waited.
    fn expire(&mut self) {
        let now = Instant::now();
        let expired: Vec<Sent<'_>> = self
            .pending
            .iter_mut()
            .filter(|slot| slot.as_ref().is_some_and(|sent| sent.deadline <= now))
            .filter_map(Option::take)
            .collect();
        for sent in expired {
            let outcome =
                failure_outcome(sent.tool.entry.side_effect, &CallFailure::DeadlineExceeded);
            self.done(sent, outcome);
        }
    }

    /// Takes the executor's answer to one call; `false` if that call was not pending.
    fn answer(&mut self, reply: ToolExecutorServiceExecuteStageResponse) -> bool {
        let sent = usize::try_from(reply.index)
            .ok()
            .and_then(|index| self.pending.get_mut(index))
            .and_then(Option::take);
        let Some(sent) = sent else {
            return false;
        };
        let outcome = stage_outcome(sent.tool.entry.side_effect, &sent.call_id, reply.answer);
        self.done(sent, outcome);
        true
    }
}

/// A call's outcome as the stage answers it.
fn stage_result(call_id: String, outcome: Outcome) -> StageAnswer {
    agentloop_proto::stage_answer(Ok(ToolResult {
        call_id,
        outcome: Some(outcome),
    }))
}

/// What an executor's reply to a call (`call_id`) came to: its result, unless the
/// reply is malformed (no result, another call's, a question out of bounds).
fn reply_outcome(side_effect: SideEffect, call_id: &str, reply: Option<ToolResult>) -> Outcome {
    let malformed =
        |detail: String| failure_outcome(side_effect, &CallFailure::MalformedReply { detail });
    match reply {
        Some(ToolResult {
            outcome: Some(Outcome::InputRequired(asked)),
            ..
        }) if !agentloop_proto::input::within_bounds(&asked) => malformed(format!(
            "a question over {} bytes or a schema over {} bytes",
            agentloop_proto::input::MAX_QUESTION_BYTES,
            agentloop_proto::input::MAX_QUESTION_SCHEMA_BYTES
        )),
        Some(ToolResult {
            call_id: reply_id,
            outcome: Some(outcome),
        }) if reply_id == call_id || reply_id.is_empty() => outcome,
        Some(ToolResult {
            call_id: reply_id,
            outcome: Some(_),
        }) => malformed(format!("result for call {reply_id:?}")),
        Some(ToolResult { outcome: None, .. }) | None => malformed("no result".to_owned()),
    }
}

/// What an executor's answer to one call of a stage came to, as `Execute` answering
/// the same would have: a refusal is the status Execute would have failed with.
fn stage_outcome(side_effect: SideEffect, call_id: &str, answer: Option<StageAnswer>) -> Outcome {
    match answer.and_then(|answer| answer.answer) {
        Some(Answer::Result(result)) => reply_outcome(side_effect, call_id, Some(result)),
        Some(Answer::Refused(refused)) => failure_outcome(
            side_effect,
            &CallFailure::Status {
                code: tonic::Code::from(refused.code),
                message: agentloop_proto::bounded_message(refused.message),
            },
        ),
        None => reply_outcome(side_effect, call_id, None),
    }
}

fn requested_timeout(
    requested: Option<prost_types::Duration>,
) -> Result<Option<Duration>, GatewayError> {
    requested
        .map(|requested| {
            Duration::try_from(requested).map_err(|_| {
                GatewayError::InvalidRequest("timeout must not be negative".to_owned())
            })
        })
        .transpose()
}

/// The smaller of the request's timeout (if any) and the registered one.
fn effective_timeout(
    requested: Option<prost_types::Duration>,
    registered: Duration,
) -> Result<Duration, GatewayError> {
    Ok(bounded(requested_timeout(requested)?, registered))
}

/// The smaller of the caller's timeout (if any) and the registered one.
fn bounded(asked: Option<Duration>, registered: Duration) -> Duration {
    asked.map_or(registered, |asked| asked.min(registered))
}

/// The registered tool `name`.
fn tool<'r>(registry: &'r Registry, name: &str) -> Result<&'r Tool, GatewayError> {
    registry
        .tools
        .get(name)
        .ok_or_else(|| GatewayError::UnknownTool(name.to_owned()))
}

/// The outcome of a call to `tool` that must not be sent: its contract changed since the
/// caller planned the call under `planned` (a call approved, authorized and planned for
/// one contract must not run under another), or its executor is unavailable, so the call
/// answers at once instead of waiting for a connection.
/// Whether a person's answer is one an executor can be given: an action, and content
/// (within the arguments' bound) exactly when accepted.
fn check_answer(answer: &InputAnswer, max_bytes: usize) -> Result<(), GatewayError> {
    let refuse = |why: String| Err(GatewayError::InvalidRequest(why));
    let content = &answer.content_json;
    match answer.action() {
        InputAction::Unspecified => refuse("input_answer.action is required".to_owned()),
        _ if content.len() > max_bytes => refuse(format!(
            "input_answer.content_json is {} bytes, more than {max_bytes}",
            content.len()
        )),
        InputAction::Accept if content.is_empty() => {
            refuse("an accepted input_answer needs content_json".to_owned())
        }
        InputAction::Decline | InputAction::Cancel if !content.is_empty() => {
            refuse("a declined or cancelled input_answer has no content_json".to_owned())
        }
        InputAction::Accept | InputAction::Decline | InputAction::Cancel => Ok(()),
    }
}

fn unsendable(tool: &Tool, planned: Option<ToolDigest>) -> Option<Outcome> {
    if let Some(planned) = planned
        && Some(planned) != tool.digest
    {
        return Some(Outcome::Error(ToolError {
            error_type: ErrorType::Conflict as i32,
            message: format!(
                "tool {:?} changed since this invocation started (its contract {} is now {}); \
                 the call was not sent: a new invocation uses the new one",
                tool.entry.name, planned, tool.descriptor.digest
            ),
            retryable: false,
            next_allowed_action: NextAction::None as i32,
        }));
    }
    (!tool.executor.is_up())
        .then(|| failure_outcome(tool.entry.side_effect, &unavailable_failure(&tool.executor)))
}

/// The failure of a call to an executor known to be down: nothing is sent.
fn unavailable_failure(executor: &Executor) -> CallFailure {
    CallFailure::Unreachable {
        detail: format!(
            "the executor at {} is unavailable (its last call or health check failed)",
            executor.endpoint
        ),
    }
}

#[tonic::async_trait]
impl ToolGatewayService for Gateway {
    async fn list_tools(
        &self,
        request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        self.admit_caller(&request)?;
        let names = request.into_inner().names;
        if names.len() > MAX_LIST_NAMES {
            return Err(
                GatewayError::InvalidRequest(format!("more than {MAX_LIST_NAMES} names")).into(),
            );
        }
        let registry = self.inner.registrar.current();
        // BTreeMap order keeps the answer sorted by name, as the contract says.
        let tools = Registry::listed(
            registry
                .tools
                .values()
                .filter(|t| names.is_empty() || names.contains(&t.entry.name)),
        );
        Ok(Response::new(ListToolsResponse {
            tools,
            registry_digest: registry.digest.clone(),
        }))
    }

    async fn register_executor(
        &self,
        request: Request<RegisterExecutorRequest>,
    ) -> Result<Response<RegisterExecutorResponse>, Status> {
        self.admit_registrar(&request)?;
        let endpoint = request.into_inner().endpoint;
        let registered = self.inner.registrar.register(&endpoint).await?;
        Ok(Response::new(RegisterExecutorResponse {
            tools: registered.tools,
            verifiers: registered.verifiers,
        }))
    }

    async fn deregister_executor(
        &self,
        request: Request<DeregisterExecutorRequest>,
    ) -> Result<Response<DeregisterExecutorResponse>, Status> {
        self.admit_registrar(&request)?;
        let endpoint = request.into_inner().endpoint;
        let removed = self.inner.registrar.deregister(&endpoint).await?;
        Ok(Response::new(DeregisterExecutorResponse {
            tools: removed.tools.into_iter().map(|t| t.name).collect(),
            verifiers: removed.verifiers,
        }))
    }

    async fn execute(
        &self,
        request: Request<ToolGatewayServiceExecuteRequest>,
    ) -> Result<Response<ToolGatewayServiceExecuteResponse>, Status> {
        self.admit_caller(&request)?;
        let result = self.execute_request(request.into_inner()).await?;
        Ok(Response::new(ToolGatewayServiceExecuteResponse {
            result: Some(result),
        }))
    }

    /// The calls run at the same time, within this one handler: dropping it (the caller
    /// went away) cancels every one of them, as it would cancel one `Execute`.
    async fn execute_stage(
        &self,
        request: Request<ExecuteStageRequest>,
    ) -> Result<Response<ExecuteStageResponse>, Status> {
        self.admit_caller(&request)?;
        let calls = request.into_inner().calls;
        if calls.len() > MAX_STAGE_CALLS {
            return Err(GatewayError::InvalidRequest(format!(
                "{} calls in one stage, more than {MAX_STAGE_CALLS}",
                calls.len()
            ))
            .into());
        }
        Ok(Response::new(ExecuteStageResponse {
            answers: self.stage(calls).await,
        }))
    }

    async fn reconcile(
        &self,
        request: Request<ToolGatewayServiceReconcileRequest>,
    ) -> Result<Response<ToolGatewayServiceReconcileResponse>, Status> {
        self.admit_caller(&request)?;
        Ok(Response::new(
            self.reconcile_effect(request.into_inner()).await?,
        ))
    }

    /// Covered by the same caller check as `Execute`: the guard in front of this
    /// service admits a caller to every method or to none.
    async fn verify(
        &self,
        request: Request<ToolGatewayServiceVerifyRequest>,
    ) -> Result<Response<ToolGatewayServiceVerifyResponse>, Status> {
        self.admit_caller(&request)?;
        let check = self.verify_claim(request.into_inner()).await?;
        Ok(Response::new(ToolGatewayServiceVerifyResponse {
            check: Some(check),
        }))
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::config::VerifierEntry;

    /// A verifier at a tool's endpoint is reached over the tool's channel and slots, not
    /// a second connection.
    #[tokio::test]
    async fn a_verifier_shares_the_executor_of_its_endpoint() {
        let mut tools = ToolsConfig::parse(
            r#"
[[tools]]
name = "lookup"
endpoint = "http://127.0.0.1:1"
description = "d"
side_effect = "read_only"
timeout_ms = 5000
input_schema = '{}'
"#,
        )
        .unwrap();
        tools.verifiers = vec![
            VerifierEntry::new("same", "http://127.0.0.1:1", "d"),
            VerifierEntry::new("other", "http://127.0.0.1:2", "d"),
        ];
        let gateway = Gateway::new(tools, GatewayLimits::default()).await.unwrap();
        let registry = gateway.inner.registrar.current();
        let tool = &registry.tools["lookup"].executor;
        assert!(Arc::ptr_eq(tool, &registry.verifiers["same"].executor));
        assert!(!Arc::ptr_eq(tool, &registry.verifiers["other"].executor));
    }

    #[test]
    fn the_smaller_timeout_wins_and_a_negative_one_is_refused() {
        let registered = Duration::from_secs(5);
        let short = prost_types::Duration {
            seconds: 1,
            nanos: 0,
        };
        let long = prost_types::Duration {
            seconds: 60,
            nanos: 0,
        };
        assert_eq!(effective_timeout(None, registered).unwrap(), registered);
        assert_eq!(
            effective_timeout(Some(short), registered).unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            effective_timeout(Some(long), registered).unwrap(),
            registered
        );
        let negative = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert!(matches!(
            effective_timeout(Some(negative), registered),
            Err(GatewayError::InvalidRequest(_))
        ));
    }
}
