//! The A2A endpoint: the Agent Card, and the JSON-RPC methods as calls of the
//! orchestrator's own gRPC API, in this process, with the caller's credentials.

use std::sync::Arc;
use std::time::Duration;

use agentloop_http::{Body, Mount, respond};
use agentloop_proto::v1 as pb;
use bytes::Bytes;
use futures::StreamExt;
use http::header::{AUTHORIZATION, HOST};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use pb::orchestrator_service_client::OrchestratorServiceClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;

use crate::A2aError;
use crate::task::{self, Reply};
use crate::types::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, ListTasksRequest, ListTasksResponse,
    SendMessageRequest, SendMessageResponse, StreamResponse, TaskRequest, TaskState,
};

/// Where the Agent Card is served (and under [`RPC_PATH`], for a client given the
/// endpoint as the agent's URL).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// Where the JSON-RPC binding is served.
pub const RPC_PATH: &str = "/a2a";
/// The protocol version spoken.
pub const VERSION: &str = "1.0";
/// The header a client names its protocol version in.
const VERSION_HEADER: &str = "a2a-version";
/// How long a `SendMessage` that waits for its task's end or wait may take; after it the
/// task is answered as it is (working), and the client polls or subscribes.
const MAX_BLOCK: Duration = Duration::from_secs(600);
/// How long `CancelTask` waits for a running task to end before answering with it as it
/// is.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Stream events buffered for a slow client before the watch waits for it.
const STREAM_BUFFER: usize = 32;
/// Most tasks one `ListTasks` page holds.
const MAX_PAGE: i32 = 100;
/// Tasks on a `ListTasks` page that names no size.
const DEFAULT_PAGE: i32 = 50;

/// How the agent presents itself in its card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardSettings {
    /// The agent's name.
    pub name: String,
    /// What it does, for people and for a calling agent's model.
    pub description: String,
    /// Whether calls need a bearer token (the orchestrator's authentication is on).
    pub bearer: bool,
}

impl Default for CardSettings {
    fn default() -> CardSettings {
        CardSettings {
            name: "agentloop".to_owned(),
            description: "Runs a task as a bounded, durable agent loop with checked tools; \
                          its answer is accepted only with the evidence it cites."
                .to_owned(),
            bearer: false,
        }
    }
}

/// The A2A endpoint, calling the orchestrator's gRPC service `S` in this process.
#[derive(Clone)]
pub struct Agent<S> {
    grpc: S,
    card: Arc<CardSettings>,
}

impl<S> std::fmt::Debug for Agent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("card", &self.card)
            .finish_non_exhaustive()
    }
}

type Api<S> = OrchestratorServiceClient<S>;
type Call = std::pin::Pin<Box<dyn Future<Output = Response<Body>> + Send + 'static>>;

impl<S: agentloop_http::Grpc + Sync> Agent<S> {
    /// The endpoint of `grpc`, presented as `card` says.
    pub fn new(grpc: S, card: CardSettings) -> Agent<S> {
        Agent {
            grpc,
            card: Arc::new(card),
        }
    }

    /// The card, with its endpoint on the host the client reached (behind a proxy that
    /// terminates TLS, `X-Forwarded-Proto: https` makes it an `https` URL).
    pub fn card(&self, headers: &HeaderMap) -> AgentCard {
        let host = headers
            .get(HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("localhost");
        let scheme = match headers
            .get("x-forwarded-proto")
            .and_then(|proto| proto.to_str().ok())
        {
            Some("https") => "https",
            _ => "http",
        };
        let mut security_schemes = serde_json::Map::new();
        let mut security_requirements = Vec::new();
        if self.card.bearer {
            security_schemes.insert(
                "bearer".to_owned(),
                json!({"httpAuthSecurityScheme": {
                    "scheme": "Bearer", "bearerFormat": "JWT",
                    "description": "The same token as the gRPC API's: its tenant is the task's."
                }}),
            );
            security_requirements.push(json!({"schemes": {"bearer": {"list": []}}}));
        }
        AgentCard {
            name: self.card.name.clone(),
            description: self.card.description.clone(),
            supported_interfaces: vec![AgentInterface {
                url: format!("{scheme}://{host}{RPC_PATH}"),
                protocol_binding: "JSONRPC".to_owned(),
                protocol_version: VERSION.to_owned(),
            }],
            version: env!("CARGO_PKG_VERSION").to_owned(),
            capabilities: AgentCapabilities {
                streaming: true,
                push_notifications: false,
                extended_agent_card: false,
            },
            security_schemes,
            security_requirements,
            default_input_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
            default_output_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
            skills: vec![AgentSkill {
                id: "task".to_owned(),
                name: self.card.name.clone(),
                description: self.card.description.clone(),
                tags: vec!["agent".to_owned()],
            }],
        }
    }

    /// Answers one JSON-RPC request.
    async fn rpc(self, request: Request<Bytes>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let envelope = match envelope(&parts.headers, &body) {
            Ok(envelope) => envelope,
            Err((id, error)) => return failure(&id, &error),
        };
        let Envelope { id, method, params } = envelope;
        let headers = parts.headers;
        let streaming = matches!(method.as_str(), "SendStreamingMessage" | "SubscribeToTask");
        if streaming {
            return match self.open(&method, params, &headers).await {
                Ok(events) => stream(id, events),
                Err(error) => failure(&id, &error),
            };
        }
        match self.unary(&method, params, &headers).await {
            Ok(result) => success(&id, result),
            Err(error) => failure(&id, &error),
        }
    }

    async fn unary(
        &self,
        method: &str,
        params: Value,
        headers: &HeaderMap,
    ) -> Result<Value, A2aError> {
        let api = self.api();
        match method {
            "SendMessage" => {
                let request: SendMessageRequest = params_of(params)?;
                let at_once = request
                    .configuration
                    .as_ref()
                    .is_some_and(|configuration| configuration.return_immediately);
                let invocation = self.send(&api, &request, headers).await?;
                let invocation = match at_once {
                    true => invocation,
                    false => settled_within(&api, headers, invocation, MAX_BLOCK).await?,
                };
                to_value(&SendMessageResponse::Task(task::task(&invocation)))
            }
            "GetTask" => {
                let request: TaskRequest = params_of(params)?;
                let history = history_length(request.history_length)?;
                let mut task = task::task(&get(&api, headers, &request.id).await?);
                task::keep_history(&mut task, history);
                to_value(&task)
            }
            "CancelTask" => {
                let request: TaskRequest = params_of(params)?;
                let current = get(&api, headers, &request.id).await?;
                if current.state() == pb::InvocationState::Ended {
                    return Err(A2aError::TaskNotCancelable(format!(
                        "task {} has ended",
                        request.id
                    )));
                }
                let cancelled = api
                    .clone()
                    .cancel_invocation(call(
                        headers,
                        pb::CancelInvocationRequest {
                            invocation_id: request.id.clone(),
                            reason: "cancelled by an A2A client".to_owned(),
                        },
                    ))
                    .await?
                    .into_inner()
                    .invocation
                    .ok_or_else(|| A2aError::Internal("the cancel returned no task".into()))?;
                let ended = settled_within(&api, headers, cancelled, CANCEL_WAIT).await?;
                to_value(&task::task(&ended))
            }
            "ListTasks" => {
                let request: ListTasksRequest = params_of(params)?;
                self.list(&api, headers, request).await
            }
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig" => Err(A2aError::PushNotificationNotSupported),
            "GetExtendedAgentCard" => Err(A2aError::ExtendedAgentCardNotConfigured),
            other => Err(A2aError::MethodNotFound(other.to_owned())),
        }
    }

    /// The events of a streaming method, the task first.
    async fn open(
        &self,
        method: &str,
        params: Value,
        headers: &HeaderMap,
    ) -> Result<mpsc::Receiver<Result<StreamResponse, A2aError>>, A2aError> {
        let api = self.api();
        let invocation = match method {
            "SendStreamingMessage" => {
                let request: SendMessageRequest = params_of(params)?;
                self.send(&api, &request, headers).await?
            }
            _ => {
                let request: TaskRequest = params_of(params)?;
                let invocation = get(&api, headers, &request.id).await?;
                if invocation.state() == pb::InvocationState::Ended {
                    return Err(A2aError::UnsupportedOperation(format!(
                        "task {} has ended: get it instead",
                        request.id
                    )));
                }
                invocation
            }
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let headers = headers.clone();
        tokio::spawn(async move {
            let first = StreamResponse::Task(task::task(&invocation));
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            if let Err(error) = follow(api, headers, invocation, Some(&tx)).await {
                let _ = tx.send(Err(error)).await;
            }
        });
        Ok(rx)
    }

    /// Starts the task a message states, or gives a waiting task its reply.
    async fn send(
        &self,
        api: &Api<S>,
        request: &SendMessageRequest,
        headers: &HeaderMap,
    ) -> Result<pb::Invocation, A2aError> {
        let message = &request.message;
        if message.message_id.is_empty() {
            return Err(A2aError::InvalidParams(
                "message.messageId is required".into(),
            ));
        }
        if request
            .configuration
            .as_ref()
            .is_some_and(|configuration| configuration.task_push_notification_config.is_some())
        {
            return Err(A2aError::PushNotificationNotSupported);
        }
        if message.task_id.is_empty() {
            let started = api
                .clone()
                .start_invocation(call(
                    headers,
                    pb::StartInvocationRequest {
                        // A client that sends the same message again (a retry after a
                        // lost answer) gets the task it started, not a second one.
                        idempotency_key: message.message_id.clone(),
                        goal: task::goal(message)?,
                        tenant: request.tenant.clone(),
                        ..pb::StartInvocationRequest::default()
                    },
                ))
                .await?;
            return started
                .into_inner()
                .invocation
                .ok_or_else(|| A2aError::Internal("the start returned no task".into()));
        }
        let waiting = get(api, headers, &message.task_id).await?;
        if waiting.state() != pb::InvocationState::Waiting {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {} does not wait for input: it is {}",
                message.task_id,
                waiting.state().as_str_name()
            )));
        }
        // Authentication off: a reply is recorded as this client's, so that an approval
        // names someone. On, the caller's identity is used (an empty actor).
        let actor = match headers.contains_key(AUTHORIZATION) {
            true => String::new(),
            false => "a2a-client".to_owned(),
        };
        let invocation_id = message.task_id.clone();
        let resumed = match task::reply(&waiting, message)? {
            Reply::Answer { answer, action } => {
                api.clone()
                    .answer_clarification(call(
                        headers,
                        pb::AnswerClarificationRequest {
                            invocation_id,
                            answer,
                            actor,
                            action: action.into(),
                        },
                    ))
                    .await?
                    .into_inner()
                    .invocation
            }
            Reply::Resolve {
                approve,
                proposal_digest,
                comment,
            } => {
                let verdict = match approve {
                    true => pb::ApprovalVerdict::Approve,
                    false => pb::ApprovalVerdict::Deny,
                };
                api.clone()
                    .resolve_approval(call(
                        headers,
                        pb::ResolveApprovalRequest {
                            invocation_id,
                            proposal_digest,
                            verdict: verdict.into(),
                            actor,
                            comment,
                        },
                    ))
                    .await?
                    .into_inner()
                    .invocation
            }
        };
        resumed.ok_or_else(|| A2aError::Internal("the reply returned no task".into()))
    }

    async fn list(
        &self,
        api: &Api<S>,
        headers: &HeaderMap,
        request: ListTasksRequest,
    ) -> Result<Value, A2aError> {
        let page_size = match request.page_size {
            None => DEFAULT_PAGE,
            Some(size @ 1..=MAX_PAGE) => size,
            Some(size) => {
                return Err(A2aError::InvalidParams(format!(
                    "pageSize {size} is not in 1..={MAX_PAGE}"
                )));
            }
        };
        let history = history_length(request.history_length)?;
        let after = request
            .status_timestamp_after
            .as_deref()
            .map(|text| {
                text.parse::<prost_types::Timestamp>().map_err(|_| {
                    A2aError::InvalidParams(format!(
                        "statusTimestampAfter {text:?} is not an RFC 3339 time"
                    ))
                })
            })
            .transpose()?;
        let wanted = request
            .status
            .filter(|state| *state != TaskState::Unspecified);
        let listed = api
            .clone()
            .list_invocations(call(
                headers,
                pb::ListInvocationsRequest {
                    page_size: page_size.unsigned_abs(),
                    page_token: request.page_token.clone(),
                    state: wanted
                        .map_or(pb::InvocationState::Unspecified, task::invocation_state)
                        .into(),
                    tenant: request.tenant.clone(),
                    ..pb::ListInvocationsRequest::default()
                },
            ))
            .await?
            .into_inner();
        let tasks: Vec<_> = listed
            .invocations
            .iter()
            .filter(|invocation| {
                after.as_ref().is_none_or(|after| {
                    invocation
                        .updated_at
                        .as_ref()
                        .is_some_and(|at| (at.seconds, at.nanos) >= (after.seconds, after.nanos))
                })
            })
            .map(task::task)
            .filter(|task| wanted.is_none_or(|state| state == task.status.state))
            .filter(|task| request.context_id.is_empty() || task.context_id == request.context_id)
            .map(|mut task| {
                task::keep_history(&mut task, history);
                if request.include_artifacts != Some(true) {
                    task.artifacts.clear();
                }
                task
            })
            .collect();
        to_value(&ListTasksResponse {
            total_size: i32::try_from(tasks.len()).unwrap_or(i32::MAX),
            tasks,
            next_page_token: listed.next_page_token,
            page_size,
        })
    }

    fn api(&self) -> Api<S> {
        OrchestratorServiceClient::new(self.grpc.clone())
    }
}

impl<S: agentloop_http::Grpc + Sync> Mount for Agent<S>
where
    S::Future: Send,
{
    fn claims(&self, method: &Method, path: &str) -> bool {
        claimed(method, path)
    }

    fn handle(&self, request: Request<Bytes>) -> Call {
        let agent = self.clone();
        Box::pin(async move {
            if is_card(request.uri().path()) {
                let card = agent.card(request.headers());
                return match serde_json::to_vec(&card) {
                    Ok(body) => respond(StatusCode::OK, "application/json", Bytes::from(body)),
                    Err(_) => respond(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        Bytes::new(),
                    ),
                };
            }
            if request.method() != Method::POST {
                let mut response =
                    respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Bytes::new());
                response
                    .headers_mut()
                    .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
                return response;
            }
            agent.rpc(request).await
        })
    }
}

fn is_card(path: &str) -> bool {
    path == CARD_PATH || path.strip_prefix(RPC_PATH) == Some(CARD_PATH)
}

/// Whether a request is the endpoint's: a read of the card, or anything at [`RPC_PATH`]
/// (a method other than POST is answered 405 there).
fn claimed(method: &Method, path: &str) -> bool {
    (is_card(path) && matches!(*method, Method::GET | Method::HEAD)) || path == RPC_PATH
}

/// A JSON-RPC request.
struct Envelope {
    id: Value,
    method: String,
    params: Value,
}

/// The request in `body`, or the error to answer with (and the ID it names, if any).
fn envelope(headers: &HeaderMap, body: &[u8]) -> Result<Envelope, (Value, A2aError)> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        (
            Value::Null,
            A2aError::Parse(format!("the body is not JSON: {e}")),
        )
    })?;
    let id = match value.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        Some(Value::Null) | None => Value::Null,
        Some(_) => {
            return Err((
                Value::Null,
                A2aError::InvalidRequest("id must be a string or a number".into()),
            ));
        }
    };
    let invalid = |why: &str| (id.clone(), A2aError::InvalidRequest(why.to_owned()));
    if value.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("not a JSON-RPC 2.0 request"));
    }
    if id.is_null() {
        return Err(invalid(
            "a request needs an id: notifications are not served",
        ));
    }
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("method is required"))?
        .to_owned();
    // An absent header is a 0.3 client by the protocol's rule; its methods have other
    // names, so it gets MethodNotFound. A version named and not 1.x is refused here.
    if let Some(version) = headers.get(VERSION_HEADER) {
        let version = version.to_str().unwrap_or_default();
        if version.split('.').next() != Some("1") {
            return Err((id, A2aError::VersionNotSupported(version.to_owned())));
        }
    }
    let params = value.get("params").cloned().unwrap_or(Value::Null);
    Ok(Envelope { id, method, params })
}

/// A `historyLength` as asked: `None` keeps the whole history.
fn history_length(asked: Option<i32>) -> Result<Option<usize>, A2aError> {
    asked
        .map(|length| {
            usize::try_from(length)
                .map_err(|_| A2aError::InvalidParams(format!("historyLength {length} is negative")))
        })
        .transpose()
}

fn params_of<T: DeserializeOwned>(params: Value) -> Result<T, A2aError> {
    serde_json::from_value(params).map_err(|e| A2aError::InvalidParams(format!("params: {e}")))
}

fn to_value<T: Serialize>(value: &T) -> Result<Value, A2aError> {
    serde_json::to_value(value).map_err(|e| A2aError::Internal(e.to_string()))
}

/// A gRPC request carrying the HTTP caller's credentials and trace context, and nothing
/// else it sent.
fn call<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    for name in [AUTHORIZATION.as_str(), "traceparent", "tracestate"] {
        if let Some(value) = headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<MetadataValue<_>>().ok())
        {
            request.metadata_mut().insert(name, value);
        }
    }
    request
}

async fn get<S: agentloop_http::Grpc + Sync>(
    api: &Api<S>,
    headers: &HeaderMap,
    id: &str,
) -> Result<pb::Invocation, A2aError> {
    // Every task's ID is an invocation's: anything else names no task (the API would
    // call it a malformed argument).
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(A2aError::TaskNotFound(format!(
            "no task {:?}",
            agentloop_proto::prefix(id, 128)
        )));
    }
    api.clone()
        .get_invocation(call(
            headers,
            pb::GetInvocationRequest {
                invocation_id: id.to_owned(),
            },
        ))
        .await?
        .into_inner()
        .invocation
        .ok_or_else(|| A2aError::Internal(format!("no task {id} in the answer")))
}

/// `invocation` once it ends or waits for the client, followed for at most `bound`; after
/// that, as it is then.
async fn settled_within<S: agentloop_http::Grpc + Sync>(
    api: &Api<S>,
    headers: &HeaderMap,
    invocation: pb::Invocation,
    bound: Duration,
) -> Result<pb::Invocation, A2aError> {
    let id = invocation.invocation_id.clone();
    match tokio::time::timeout(
        bound,
        follow(api.clone(), headers.clone(), invocation, None),
    )
    .await
    {
        Ok(settled) => settled,
        Err(_) => get(api, headers, &id).await,
    }
}

/// Follows `invocation` from its last event until it ends or waits for the client, and
/// returns it then; with `events`, each committed change is sent there as it happens,
/// and the follow stops when the receiver goes away. The orchestrator ends a watch when
/// it drains: the task is then read and returned as it is.
async fn follow<S: agentloop_http::Grpc + Sync>(
    api: Api<S>,
    headers: HeaderMap,
    mut invocation: pb::Invocation,
    events: Option<&mpsc::Sender<Result<StreamResponse, A2aError>>>,
) -> Result<pb::Invocation, A2aError> {
    let id = invocation.invocation_id.clone();
    loop {
        if task::task(&invocation).status.state.ends_stream() {
            return Ok(invocation);
        }
        let mut watch = api
            .clone()
            .watch_invocation(call(
                &headers,
                pb::WatchInvocationRequest {
                    invocation_id: id.clone(),
                    from_seq: invocation.last_seq + 1,
                },
            ))
            .await?
            .into_inner();
        let mut changed = false;
        loop {
            let next = match events {
                Some(tx) => tokio::select! {
                    next = watch.next() => next,
                    () = tx.closed() => return Ok(invocation),
                },
                None => watch.next().await,
            };
            let Some(next) = next else { break };
            let Some(event) = next?.event else { continue };
            if let Some(progress) = task::progress(&id, &event) {
                if let Some(tx) = events
                    && tx.send(Ok(progress)).await.is_err()
                {
                    return Ok(invocation);
                }
                continue;
            }
            if matches!(event.body, Some(pb::event::Body::Ended(_))) {
                changed = true;
                break;
            }
        }
        let now = get(&api, &headers, &id).await?;
        if (changed || now.last_seq != invocation.last_seq)
            && let Some(tx) = events
        {
            for event in task::settled(&now) {
                if tx.send(Ok(event)).await.is_err() {
                    return Ok(now);
                }
            }
        }
        if !changed {
            // The watch ended without an end: the orchestrator is draining.
            return Ok(now);
        }
        invocation = now;
    }
}

/// The events as Server-Sent Events, each a JSON-RPC answer to request `id`; a failure
/// is the last event, an error answer.
fn stream(id: Value, events: mpsc::Receiver<Result<StreamResponse, A2aError>>) -> Response<Body> {
    let frames = ReceiverStream::new(events).map(move |event| {
        let answer = match event {
            Ok(event) => match serde_json::to_value(&event) {
                Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err(e) => json!({"jsonrpc": "2.0", "id": id,
                                 "error": A2aError::Internal(e.to_string()).object()}),
            },
            Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error.object()}),
        };
        let mut frame = b"data: ".to_vec();
        frame.extend(answer.to_string().into_bytes());
        frame.extend(b"\n\n");
        Ok(http_body::Frame::data(Bytes::from(frame)))
    });
    agentloop_http::event_stream(frames)
}

fn success(id: &Value, result: Value) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
    respond(
        StatusCode::OK,
        "application/json",
        Bytes::from(body.to_string()),
    )
}

fn failure(id: &Value, error: &A2aError) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": error.object()});
    let mut response = respond(
        error.http_status(),
        "application/json",
        Bytes::from(body.to_string()),
    );
    if error.http_status() == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_must_be_json_rpc_with_an_id_and_a_version_we_speak() {
        let headers = HeaderMap::new();
        let parsed = envelope(&headers, br#"{"jsonrpc":"2.0","id":7,"method":"GetTask"}"#);
        assert!(matches!(parsed, Ok(Envelope { ref method, .. }) if method == "GetTask"));
        let cases: [(&[u8], i64); 4] = [
            (b"{", -32700),
            (br#"{"id":1,"method":"GetTask"}"#, -32600),
            (br#"{"jsonrpc":"2.0","method":"GetTask"}"#, -32600),
            (br#"{"jsonrpc":"2.0","id":[1],"method":"GetTask"}"#, -32600),
        ];
        for (body, code) in cases {
            let Err((_, error)) = envelope(&headers, body) else {
                panic!("accepted {}", String::from_utf8_lossy(body))
            };
            assert_eq!(error.code(), code, "{}", String::from_utf8_lossy(body));
        }
        let mut old = HeaderMap::new();
        old.insert(VERSION_HEADER, HeaderValue::from_static("0.3"));
        let Err((id, error)) = envelope(&old, br#"{"jsonrpc":"2.0","id":"x","method":"GetTask"}"#)
        else {
            panic!("0.3 accepted")
        };
        assert_eq!((id, error.code()), (json!("x"), -32009));
    }

    #[test]
    fn a_history_length_is_never_negative_and_the_card_is_found_under_the_endpoint() {
        assert_eq!(history_length(None), Ok(None));
        assert_eq!(history_length(Some(2)), Ok(Some(2)));
        assert_eq!(history_length(Some(-1)).map_err(|e| e.code()), Err(-32602));
        for path in [
            "/.well-known/agent-card.json",
            "/a2a/.well-known/agent-card.json",
            "/a2a",
        ] {
            assert!(claimed(&Method::GET, path), "{path}");
        }
        assert!(claimed(&Method::POST, "/a2a"));
        assert!(!claimed(&Method::POST, "/.well-known/agent-card.json"));
        assert!(!claimed(&Method::GET, "/v1/.well-known/agent-card.json"));
        assert!(!claimed(&Method::GET, "/v1/invocations"));
    }
}
