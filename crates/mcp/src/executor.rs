//! [`McpExecutor`]: one MCP server as a `ToolExecutorService`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, ReconcileStatus, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceReconcileResponse, ToolExecutorServiceVerifyRequest,
    ToolExecutorServiceVerifyResponse, ToolResult,
};
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, JsonObject, RequestId, RequestMetaObject, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpError;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::config::{McpConfigError, McpServerConfig};
use crate::describe;
use crate::elicit::Asked;
use crate::error::ExecutorError;
use crate::link::{FaultKind, Link};
use crate::names;
use crate::outcome;
use crate::stdio::StdioError;
use crate::supervisor::{self, Health, Shared, Supervision};

/// The `_meta` key a call's effect key is sent under, so a server that wants to can
/// apply the same change once however often it is sent.
pub const EFFECT_KEY_META: &str = "agentloop/effect_key";
/// Longest wait for a `notifications/cancelled` to be handed to the transport.
const CANCEL_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// One MCP server as a tool executor: `Describe` is `tools/list`, `Execute` is
/// `tools/call`, under the names `<server>__<tool>`. Register it with the gateway as an
/// in-process executor (`Arc<McpExecutor>` is an
/// `Arc<`[`agentloop_proto::server::ToolExecutor`]`>`).
///
/// It keeps its server connected in a task of its own (see [`Health`]); calls while the
/// server is down answer UNAVAILABLE at once. Dropping the executor, or
/// [`McpExecutor::shutdown`], stops that task and the server.
pub struct McpExecutor {
    shared: Arc<Shared>,
    config: McpServerConfig,
    shutdown: CancellationToken,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for McpExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpExecutor")
            .field("config", &self.config)
            .field("health", &self.shared.health())
            .finish_non_exhaustive()
    }
}

impl McpExecutor {
    /// Validates `config`, reads what it names from the process environment (the bearer
    /// token, inherited variables) and starts keeping the server connected. Returns at
    /// once: the server starts in the background, and a `Describe` waits for it.
    /// Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`McpConfigError`] naming the server, when the entry is invalid or a variable it
    /// names is not set.
    pub fn start(config: McpServerConfig) -> Result<Arc<McpExecutor>, McpConfigError> {
        McpExecutor::start_with(config, Supervision::default(), &|var| {
            std::env::var(var).ok()
        })
    }

    /// Like [`McpExecutor::start`], with the reconnect policy `supervision` and the
    /// environment read through `env` (which is asked once per variable, now).
    ///
    /// # Errors
    ///
    /// As [`McpExecutor::start`].
    pub fn start_with(
        config: McpServerConfig,
        supervision: Supervision,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Arc<McpExecutor>, McpConfigError> {
        let endpoint = config.endpoint(env)?;
        let shared = Arc::new(Shared::new(
            Arc::from(config.name.as_str()),
            endpoint,
            supervision,
            config.elicitation,
        ));
        let shutdown = CancellationToken::new();
        let supervisor = tokio::spawn(supervisor::supervise(Arc::clone(&shared), shutdown.clone()));
        Ok(Arc::new(McpExecutor {
            shared,
            config,
            shutdown,
            supervisor: Mutex::new(Some(supervisor)),
        }))
    }

    /// The server's name, the prefix of its tools.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// What the executor knows about its server now.
    pub fn health(&self) -> Health {
        self.shared.health()
    }

    /// Whether calls are sent to the server now; when not, its tools are unavailable.
    pub fn is_up(&self) -> bool {
        self.health().is_up()
    }

    /// Every change of [`McpExecutor::health`], for a gateway that reports it.
    pub fn watch_health(&self) -> watch::Receiver<Health> {
        self.shared.watch_health()
    }

    /// Stops the server (a stdio server gets a moment to exit after its stdin closes)
    /// and waits for that. Calls after it answer UNAVAILABLE.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let supervisor = self
            .supervisor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(supervisor) = supervisor {
            let _ = supervisor.await;
        }
    }

    /// Why the server is not connected, for a call's message.
    fn why_down(&self) -> String {
        match self.health() {
            Health::Down { reason, retry_in } => {
                format!("{reason}; reconnecting in {retry_in:?}")
            }
            Health::Connecting { .. } | Health::Up { .. } => "it is connecting".to_owned(),
            Health::Stopped => "the executor is stopped".to_owned(),
        }
    }

    /// The connection, waiting while the server is still connecting (until `deadline`).
    async fn connected(&self, deadline: Instant) -> Result<Link, ExecutorError> {
        let mut health = self.shared.watch_health();
        loop {
            let state = health.borrow_and_update().clone();
            let waiting = match state {
                Health::Up { .. } => match self.shared.link() {
                    Some(link) => return Ok(link),
                    // Just went down; the next change says so.
                    None => true,
                },
                Health::Connecting { .. } => true,
                Health::Down { .. } | Health::Stopped => false,
            };
            let changed = waiting
                && matches!(
                    tokio::time::timeout_at(deadline, health.changed()).await,
                    Ok(Ok(()))
                );
            if !changed {
                return Err(ExecutorError::NotConnected {
                    server: self.config.name.clone(),
                    reason: self.why_down(),
                });
            }
        }
    }

    async fn describe_tools(&self) -> Result<DescribeResponse, ExecutorError> {
        let server = &self.config.name;
        let timeout = self.config.timeout();
        let link = self.connected(Instant::now() + timeout).await?;
        let tools = match tokio::time::timeout(timeout, describe::list_all(&link.peer)).await {
            Err(_elapsed) => {
                return Err(ExecutorError::ListTimeout {
                    server: server.clone(),
                    timeout,
                });
            }
            Ok(Err(error)) => {
                if error.is_violation() {
                    link.fault.violation(server, error.to_string());
                }
                return Err(ExecutorError::List {
                    server: server.clone(),
                    error: Box::new(error),
                });
            }
            Ok(Ok(tools)) => tools,
        };
        let (tools, _skipped) =
            describe::descriptors(server, &self.config.idempotent, timeout, &tools);
        Ok(DescribeResponse {
            tools,
            ..DescribeResponse::default()
        })
    }

    /// Runs one call to its result, or to the failure the gateway classifies.
    async fn call(
        &self,
        request: ToolExecutorServiceExecuteRequest,
        timeout: Duration,
    ) -> Result<ToolResult, ExecutorError> {
        let deadline = Instant::now() + timeout;
        let server = self.config.name.as_str();
        let call = request
            .call
            .ok_or_else(|| ExecutorError::InvalidRequest("call is required".to_owned()))?;
        let tool = names::local(server, &call.tool).ok_or_else(|| {
            ExecutorError::InvalidRequest(format!(
                "tool {:?} is not one of MCP server {server:?}'s",
                agentloop_proto::prefix(&call.tool, 128)
            ))
        })?;
        let finished = |outcome: Outcome| ToolResult {
            call_id: call.call_id.clone(),
            outcome: Some(outcome),
        };
        let arguments = match arguments(&call.arguments_json) {
            Ok(arguments) => arguments,
            Err(message) => return Ok(finished(outcome::invalid_arguments(message))),
        };
        let Some(link) = self.shared.link() else {
            return Ok(finished(outcome::not_sent(format!(
                "MCP server {server:?} is not connected ({}); the call was not sent",
                self.why_down()
            ))));
        };
        // A call with an effect key may change something; one without is a read.
        let writes = !request.effect_key.is_empty();
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        if writes {
            let mut meta = RequestMetaObject::new();
            meta.insert(
                EFFECT_KEY_META.to_owned(),
                serde_json::Value::String(request.effect_key.clone()),
            );
            params.meta = Some(meta);
        }
        // In flight from before it is sent: the server may ask at once.
        let flight = self.shared.questions.fly(request.input_answer.clone());
        let sent = link
            .peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await;
        let handle = match sent {
            Ok(handle) => handle,
            Err(_) => {
                return Ok(finished(outcome::not_sent(format!(
                    "the connection to MCP server {server:?} is closed; the call was not sent"
                ))));
            }
        };
        flight.sent(handle.id.clone());
        let mut cancel = CancelOnDrop::new(&link.peer, handle.id.clone(), &self.shared.name);
        let answer = match tokio::time::timeout_at(deadline, handle.await_response()).await {
            Ok(answer) => {
                cancel.disarm();
                answer
            }
            Err(_elapsed) => {
                cancel.now("the call's deadline passed").await;
                return Err(ExecutorError::Deadline {
                    server: server.to_owned(),
                    timeout,
                });
            }
        };
        // A question the call met decides its result, whatever the server answered after
        // the `cancel` it got; but only an answer: a call cut off after it asked may have
        // done anything since, and is settled as any lost call.
        let answered = matches!(answer, Ok(_) | Err(ServiceError::McpError(_)));
        match flight.asked().filter(|_| answered) {
            Some(Asked::Question {
                message,
                schema_json,
            }) => return Ok(finished(outcome::input_required(message, schema_json))),
            Some(Asked::Refused(why)) => return Ok(finished(outcome::unanswerable(why))),
            None => {}
        }
        match answer {
            Ok(ServerResult::CallToolResult(result)) => {
                Ok(finished(outcome::answered(server, result, writes)))
            }
            // A result without content is an empty result on the wire.
            Ok(ServerResult::EmptyResult(_)) => Ok(finished(outcome::answered(
                server,
                CallToolResult::success(Vec::new()),
                writes,
            ))),
            Ok(_) => Err(ExecutorError::Malformed {
                server: server.to_owned(),
                detail: "a result that is not a tool result".to_owned(),
            }),
            Err(ServiceError::McpError(refusal)) => {
                Ok(finished(outcome::refused(server, &refusal)))
            }
            Err(error) if !delivered(&error) => {
                // The server is unreachable: reconnect, and the call may simply go again.
                link.fault
                    .lost(format!("a call could not be delivered: {error}"));
                Ok(finished(outcome::not_sent(format!(
                    "MCP server {server:?} could not be reached; the call was not sent: {error}"
                ))))
            }
            Err(error) => Err(match link.fault.get() {
                Some((FaultKind::Violation, reason)) => ExecutorError::CutOff {
                    server: server.to_owned(),
                    reason: reason.clone(),
                },
                Some((FaultKind::Lost, reason)) => ExecutorError::Lost {
                    server: server.to_owned(),
                    reason: reason.clone(),
                },
                None => ExecutorError::Lost {
                    server: server.to_owned(),
                    reason: error.to_string(),
                },
            }),
        }
    }

    /// MCP has no way to ask whether a call took effect, so the answer follows from the
    /// registry alone:
    ///
    /// - A tool in `idempotent` answers NOT_APPLIED. Sending it again has the effect of
    ///   sending it once (that is what listing it means), so "not applied, may be
    ///   dispatched again" is true of it in every way that matters: the orchestrator
    ///   re-sends it under the same effect key (a write met again in its turn), or the
    ///   model gets a retryable error and may call it again.
    /// - Any other tool answers UNKNOWN with a detail saying so: the orchestrator then
    ///   ends the invocation `reconciliation_required`, and an operator checks the
    ///   server's system, because sending a plain write again could apply it twice.
    fn reconcile_effect(
        &self,
        request: &ToolExecutorServiceReconcileRequest,
    ) -> Result<ToolExecutorServiceReconcileResponse, ExecutorError> {
        let server = self.config.name.as_str();
        let tool = names::local(server, &request.tool).ok_or_else(|| {
            ExecutorError::InvalidRequest(format!(
                "tool {:?} is not one of MCP server {server:?}'s",
                agentloop_proto::prefix(&request.tool, 128)
            ))
        })?;
        let (status, detail) = if self.config.idempotent.iter().any(|listed| listed == tool) {
            (
                ReconcileStatus::NotApplied,
                format!(
                    "MCP has no reconcile; {tool:?} of MCP server {server:?} is idempotent \
                     (the registry says so), so it may be sent again with the same effect key"
                ),
            )
        } else {
            (
                ReconcileStatus::Unknown,
                format!(
                    "MCP has no reconcile: MCP server {server:?} cannot tell whether the call \
                     of {tool:?} took effect; check its system"
                ),
            )
        };
        Ok(ToolExecutorServiceReconcileResponse {
            status: status as i32,
            detail,
            ..ToolExecutorServiceReconcileResponse::default()
        })
    }
}

impl Drop for McpExecutor {
    fn drop(&mut self) {
        // The supervisor stops the server; `shutdown` is the way to wait for it.
        self.shutdown.cancel();
    }
}

#[tonic::async_trait]
impl ToolExecutorService for McpExecutor {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(self.describe_tools().await?))
    }

    /// Runs under the smaller of the server's timeout and the request's `grpc-timeout`.
    /// When the deadline passes, or the caller goes away and drops this future, the
    /// server gets `notifications/cancelled` for the call.
    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        let timeout = agentloop_proto::within_deadline(request.metadata(), self.config.timeout());
        let result = self.call(request.into_inner(), timeout).await?;
        Ok(Response::new(ToolExecutorServiceExecuteResponse {
            result: Some(result),
        }))
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    /// Not served: an MCP server's executor runs in the gateway's process, which sends
    /// it each call as an `Execute` of its own (a future per call costs less there than
    /// a stream of answers).
    async fn execute_stage(
        &self,
        _request: tonic::Request<agentloop_proto::v1::ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "an MCP server's calls go one by one",
        ))
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Ok(Response::new(self.reconcile_effect(request.get_ref())?))
    }

    async fn verify(
        &self,
        _request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        Err(ExecutorError::NoVerifiers.into())
    }
}

/// The call's arguments: a JSON object, or none for empty text.
fn arguments(json: &str) -> Result<Option<JsonObject>, String> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(object)) => Ok(Some(object)),
        Ok(_) => Err("the arguments must be a JSON object".to_owned()),
        Err(e) => Err(format!("the arguments are not valid JSON: {e}")),
    }
}

/// Whether a failed call may have reached the server. It cannot have when the transport
/// says the write failed (stdio: the server's stdin is gone, and it only reads whole
/// lines) or the HTTP connection could not be made.
fn delivered(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(error) = error else {
        return true;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
    // The chain is finite (each error owns its source); the bound is belt and braces.
    for _ in 0..32 {
        let Some(current) = cause else { break };
        if current.is::<StdioError>() {
            return false;
        }
        if let Some(StreamableHttpError::Client(client)) =
            current.downcast_ref::<StreamableHttpError<reqwest::Error>>()
            && client.is_connect()
        {
            return false;
        }
        if current
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_connect)
        {
            return false;
        }
        cause = current.source();
    }
    true
}

/// Sends `notifications/cancelled` for a call that is given up on: at once with
/// [`CancelOnDrop::now`], or when dropped armed (the caller went away mid-call).
struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    id: RequestId,
    server: Arc<str>,
}

impl CancelOnDrop {
    fn new(peer: &Peer<RoleClient>, id: RequestId, server: &Arc<str>) -> CancelOnDrop {
        CancelOnDrop {
            peer: Some(peer.clone()),
            id,
            server: Arc::clone(server),
        }
    }

    /// The call ended with an answer: nothing to cancel.
    fn disarm(&mut self) {
        self.peer = None;
    }

    async fn now(&mut self, reason: &str) {
        if let Some(peer) = self.peer.take() {
            cancel(
                peer,
                self.id.clone(),
                Arc::clone(&self.server),
                reason.to_owned(),
            )
            .await;
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        // A drop cannot wait; the notification is sent from a short task of its own,
        // bounded by CANCEL_SEND_TIMEOUT. Outside a runtime there is no connection left
        // to tell.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let reason = "the caller went away".to_owned();
            runtime.spawn(cancel(
                peer,
                self.id.clone(),
                Arc::clone(&self.server),
                reason,
            ));
        }
    }
}

async fn cancel(peer: Peer<RoleClient>, id: RequestId, server: Arc<str>, reason: String) {
    tracing::info!(server = %server, request = %id, %reason, "cancelling an MCP call");
    let notification = CancelledNotificationParam::new(Some(id), Some(reason));
    let sent = tokio::time::timeout(CANCEL_SEND_TIMEOUT, peer.notify_cancelled(notification)).await;
    if !matches!(sent, Ok(Ok(()))) {
        tracing::info!(server = %server, "could not send notifications/cancelled");
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_gateway_sets_them() {
        let limit = Duration::from_secs(60);
        let mut request = Request::new(());
        request.set_timeout(Duration::from_millis(1500));
        // tonic may encode it in a finer unit; the value is the same.
        assert_eq!(
            agentloop_proto::within_deadline(request.metadata(), limit),
            Duration::from_millis(1500)
        );
        for (value, expected) in [
            ("2S", Duration::from_secs(2)),
            ("1H", limit),
            ("10n", Duration::from_nanos(10)),
            ("123456789S", limit),
            ("S", limit),
            ("5x", limit),
            ("-1S", limit),
        ] {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert("grpc-timeout", value.parse().unwrap());
            assert_eq!(
                agentloop_proto::within_deadline(&metadata, limit),
                expected,
                "{value}"
            );
        }
    }

    #[test]
    fn arguments_are_an_object_or_nothing() {
        assert_eq!(arguments("").unwrap(), None);
        assert_eq!(arguments(r#"{"a":1}"#).unwrap().unwrap()["a"], 1);
        assert!(arguments("[1]").is_err());
        assert!(arguments("{").is_err());
    }

    #[test]
    fn a_failed_write_to_stdin_was_not_delivered_and_a_lost_answer_may_have_been() {
        let not_written =
            ServiceError::TransportSend(rmcp::transport::DynamicTransportError::from_parts(
                "stdio",
                std::any::TypeId::of::<StdioError>(),
                Box::new(StdioError::Closed),
            ));
        assert!(!delivered(&not_written));
        assert!(delivered(&ServiceError::TransportClosed));
        assert!(delivered(&ServiceError::Cancelled { reason: None }));
    }
}
