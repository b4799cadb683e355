//! A remote A2A agent as a tool (`[[a2a_agents]]`): the tool gateway runs this executor
//! in its own process, and a call is one task of the remote agent.
//!
//! - **Described by its card.** `Describe` reads the agent's card, takes its JSON-RPC
//!   interface of version 1.x, and offers one tool named as the entry, with the card's
//!   description and one argument, `message`.
//! - **One message per effect.** A call's message ID is its effect key, the same on
//!   every worker and after every crash, so the remote agent sees one message however
//!   often the call is resumed. A read-only entry's calls have no key, and get a fresh
//!   ID each.
//! - **Answered when the task ends.** The call sends `SendMessage` and, if the task is
//!   still running when it answers, gets it again until it ends, within the call's
//!   timeout. A completed task is the call's output (its artifacts; the task ID is the
//!   receipt); a failed, rejected or cancelled one is a tool error with the agent's
//!   words.
//! - **An unknown outcome is reconciled by finding the task.** `Reconcile` lists the
//!   caller's tasks newest first and looks for the one whose history holds the message
//!   with the effect key as its ID: a completed one is applied (with its output); none,
//!   when the listing ends, means the message never arrived (not applied); a task still
//!   running is waited for within the entry's timeout; anything else is unknown, for an
//!   operator.
//! - **Secrets.** The bearer token comes from a variable or a file the entry names,
//!   never from the entry itself, and is never logged.

use std::path::PathBuf;
use std::time::Duration;

use agentloop_proto::v1 as pb;
use pb::tool_executor_service_server::ToolExecutorService;
use pb::{
    DescribeRequest, DescribeResponse, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceReconcileResponse, ToolExecutorServiceVerifyRequest,
    ToolExecutorServiceVerifyResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

use crate::agent::{CARD_PATH, VERSION};
use crate::types::{AgentCard, ListTasksResponse, Part, SendMessageResponse, Task, TaskState};

/// Most bytes read of one answer of the remote agent.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes of the card's description offered as the tool's.
const MAX_DESCRIPTION_BYTES: usize = 1024;
/// How long to wait between two reads of a running task.
const POLL: Duration = Duration::from_millis(250);
/// Tasks a reconcile reads, a page at a time, before it gives up as unknown.
const RECONCILE_PAGES: u32 = 10;
/// Tasks per page of a reconcile's listing.
const RECONCILE_PAGE_SIZE: i32 = 100;
/// How long a connection to the remote agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a remote agent's task does to the world, as the registry declares it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteSideEffect {
    /// It may change things: a call runs under the effect ledger, once.
    #[default]
    Write,
    /// It only answers: a call may run in parallel and be sent again.
    ReadOnly,
}

/// An `[[a2a_agents]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteAgentConfig {
    /// The tool's name.
    pub name: String,
    /// The agent's base URL: its card is at `<url>/.well-known/agent-card.json`.
    pub url: String,
    /// The environment variable holding a bearer token, read at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_env: Option<String>,
    /// A file holding a bearer token, read at every call (a rotated token is picked up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<PathBuf>,
    /// `write` (the default) or `read_only`.
    #[serde(default)]
    pub side_effect: RemoteSideEffect,
    /// Longest one call may take, in milliseconds (1..=600000): the remote task's whole
    /// run.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    300_000
}

/// Why an `[[a2a_agents]]` entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("A2A agent {name:?}: {why}")]
pub struct RemoteConfigError {
    /// The entry.
    pub name: String,
    /// What is wrong.
    pub why: String,
}

impl RemoteAgentConfig {
    /// Checks the entry: a tool name of `[a-zA-Z0-9_.-]{1,64}`, an http(s) URL, at most one
    /// token source, a timeout in 1..=600000 ms.
    ///
    /// # Errors
    ///
    /// The first rule broken.
    pub fn validate(&self) -> Result<(), RemoteConfigError> {
        let wrong = |why: String| RemoteConfigError {
            name: self.name.clone(),
            why,
        };
        let name_ok = (1..=64).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(wrong(
                "the name must be 1 to 64 of [a-zA-Z0-9_.-]".to_owned(),
            ));
        }
        match reqwest::Url::parse(&self.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
            _ => return Err(wrong(format!("url {:?} is not an http(s) URL", self.url))),
        }
        if self.bearer_token_env.is_some() && self.bearer_token_file.is_some() {
            return Err(wrong(
                "give bearer_token_env or bearer_token_file, not both".to_owned(),
            ));
        }
        if !(1..=600_000).contains(&self.timeout_ms) {
            return Err(wrong("timeout_ms must be in 1..=600000".to_owned()));
        }
        Ok(())
    }
}

/// Where the bearer token is.
#[derive(Clone)]
enum Token {
    None,
    /// Read from the variable at start.
    Value(String),
    File(PathBuf),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::None => f.write_str("None"),
            Token::Value(_) => f.write_str("Value(<redacted>)"),
            Token::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

/// A remote A2A agent, served to the gateway as an executor of one tool.
#[derive(Debug)]
pub struct RemoteAgent {
    config: RemoteAgentConfig,
    http: reqwest::Client,
    token: Token,
    /// The JSON-RPC endpoint its card gave, once read.
    endpoint: tokio::sync::RwLock<Option<String>>,
}

/// How a call to the remote agent failed.
#[derive(Debug)]
enum Failure {
    /// The request never left: nothing reached the agent.
    NotSent(String),
    /// The request may have reached the agent; its answer was lost.
    Lost(String),
    /// The agent answered with a JSON-RPC error.
    Refused { code: i64, message: String },
    /// The agent answered with something that is not A2A.
    Malformed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(why) => write!(f, "not sent: {why}"),
            Failure::Lost(why) => write!(f, "no answer: {why}"),
            Failure::Refused { code, message } => write!(f, "refused ({code}): {message}"),
            Failure::Malformed(why) => write!(f, "not an A2A answer: {why}"),
        }
    }
}

impl RemoteAgent {
    /// The executor of `config`, its token variable read now.
    ///
    /// # Errors
    ///
    /// An invalid entry, or a token variable that is not set.
    pub fn new(config: RemoteAgentConfig) -> Result<RemoteAgent, RemoteConfigError> {
        config.validate()?;
        let token = match (&config.bearer_token_env, &config.bearer_token_file) {
            (Some(variable), _) => match std::env::var(variable) {
                Ok(value) if !value.trim().is_empty() => Token::Value(value.trim().to_owned()),
                _ => {
                    return Err(RemoteConfigError {
                        name: config.name.clone(),
                        why: format!("bearer_token_env {variable:?} is not set"),
                    });
                }
            },
            (None, Some(path)) => Token::File(path.clone()),
            (None, None) => Token::None,
        };
        // reqwest's rustls has no provider of its own (`rustls-no-provider`); the process
        // may not have installed one yet.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // No redirects: the bearer token goes to the configured agent and nowhere else.
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RemoteConfigError {
                name: config.name.clone(),
                why: format!("the HTTP client: {e}"),
            })?;
        Ok(RemoteAgent {
            config,
            http,
            token,
            endpoint: tokio::sync::RwLock::new(None),
        })
    }

    /// The entry's name: its tool's.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms)
    }

    /// The smaller of the entry's timeout and the request's `grpc-timeout`.
    fn deadline(&self, metadata: &tonic::metadata::MetadataMap) -> Duration {
        agentloop_proto::within_deadline(metadata, self.timeout())
    }

    async fn bearer(&self) -> Result<Option<String>, Failure> {
        match &self.token {
            Token::None => Ok(None),
            Token::Value(value) => Ok(Some(value.clone())),
            Token::File(path) => tokio::fs::read_to_string(path)
                .await
                .map(|text| Some(text.trim().to_owned()))
                .map_err(|e| {
                    Failure::NotSent(format!("bearer_token_file {}: {e}", path.display()))
                }),
        }
    }

    /// The answer's body, at most [`MAX_ANSWER_BYTES`].
    async fn body(mut response: reqwest::Response) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Failure::Lost(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(Failure::Malformed(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The agent's card, read now, and its JSON-RPC endpoint, kept for the calls.
    async fn card(&self) -> Result<(AgentCard, String), Failure> {
        let url = format!("{}{CARD_PATH}", self.config.url.trim_end_matches('/'));
        let response = self
            .http
            .get(&url)
            .timeout(self.timeout().min(Duration::from_secs(30)))
            .send()
            .await
            .map_err(|e| Failure::NotSent(format!("{url}: {e}")))?;
        if !response.status().is_success() {
            return Err(Failure::Malformed(format!(
                "{url}: HTTP {}",
                response.status()
            )));
        }
        let body = RemoteAgent::body(response).await?;
        let card: AgentCard = serde_json::from_slice(&body)
            .map_err(|e| Failure::Malformed(format!("the card: {e}")))?;
        let endpoint = jsonrpc_interface(&card)?;
        *self.endpoint.write().await = Some(endpoint.clone());
        Ok((card, endpoint))
    }

    /// The JSON-RPC endpoint, from the card (read once).
    async fn endpoint(&self) -> Result<String, Failure> {
        if let Some(endpoint) = self.endpoint.read().await.clone() {
            return Ok(endpoint);
        }
        Ok(self.card().await?.1)
    }

    /// Calls `method` with `params` and reads its result, within `timeout`.
    async fn rpc<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<T, Failure> {
        let endpoint = self.endpoint().await?;
        let mut request = self
            .http
            .post(&endpoint)
            .timeout(timeout)
            .header("A2A-Version", VERSION)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
        if let Some(token) = self.bearer().await? {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| match e.is_connect() {
            true => Failure::NotSent(e.to_string()),
            false => Failure::Lost(e.to_string()),
        })?;
        let status = response.status();
        let body = RemoteAgent::body(response).await?;
        let answer: Value = serde_json::from_slice(&body).map_err(|e| {
            Failure::Malformed(format!("HTTP {status}, and the body is not JSON: {e}"))
        })?;
        if let Some(error) = answer.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let message = agentloop_proto::prefix(
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                1024,
            )
            .to_owned();
            // A refusal of the request itself (its form, its credentials, an A2A rule)
            // applied nothing; an internal error, or a code of the agent's own, may have
            // come after it did something.
            let refused = matches!(code, -32700 | -32600 | -32601 | -32602 | -32009..=-32001)
                || matches!(status.as_u16(), 401 | 403);
            return Err(match refused {
                true => Failure::Refused { code, message },
                false => Failure::Lost(format!("error {code}: {message}")),
            });
        }
        let result = answer
            .get("result")
            .cloned()
            .ok_or_else(|| Failure::Malformed(format!("HTTP {status} without a result")))?;
        serde_json::from_value(result).map_err(|e| Failure::Malformed(format!("{method}: {e}")))
    }

    async fn get_task(&self, id: &str, timeout: Duration) -> Result<Task, Failure> {
        self.rpc("GetTask", json!({"id": id}), timeout).await
    }

    /// Reads `task` again until it ends, or waits for input, or `deadline` passes; the
    /// task as last read. A read that fails is a lost answer, never a message not sent.
    async fn until_settled(
        &self,
        mut task: Task,
        deadline: tokio::time::Instant,
    ) -> Result<Task, Failure> {
        while !task.status.state.ends_stream() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(POLL.min(left)).await;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            // The message was sent: whatever fails now, the task may be running.
            task = self
                .get_task(&task.id.clone(), left)
                .await
                .map_err(|failure| Failure::Lost(failure.to_string()))?;
        }
        Ok(task)
    }

    /// One call: the message sent, and the task's end as the call's result.
    async fn call(
        &self,
        request: &ToolExecutorServiceExecuteRequest,
        timeout: Duration,
    ) -> pb::ToolResult {
        let call_id = request
            .call
            .as_ref()
            .map(|call| call.call_id.clone())
            .unwrap_or_default();
        let write = self.config.side_effect == RemoteSideEffect::Write;
        let outcome = match arguments(request) {
            Err(why) => error(pb::ErrorType::InvalidArguments, why, false),
            Ok(text) => {
                let deadline = tokio::time::Instant::now() + timeout;
                let message_id = match request.effect_key.is_empty() {
                    false => request.effect_key.clone(),
                    true => uuid::Uuid::new_v4().to_string(),
                };
                let params = json!({"message": {
                    "messageId": message_id,
                    "role": "ROLE_USER",
                    "parts": [{"text": text}],
                }});
                let sent = self
                    .rpc::<SendMessageResponse>("SendMessage", params, timeout)
                    .await;
                let task = match sent {
                    Ok(SendMessageResponse::Task(task)) => self.until_settled(task, deadline).await,
                    Ok(SendMessageResponse::Message(message)) => {
                        // A direct reply, without a task: the answer itself.
                        Ok(Task {
                            id: message.message_id,
                            status: crate::types::TaskStatus {
                                state: TaskState::Completed,
                                ..crate::types::TaskStatus::default()
                            },
                            artifacts: vec![crate::types::Artifact {
                                artifact_id: "reply".to_owned(),
                                parts: message.parts,
                                ..crate::types::Artifact::default()
                            }],
                            ..Task::default()
                        })
                    }
                    Err(failure) => Err(failure),
                };
                match task {
                    Ok(task) => self.ended(task, write).await,
                    Err(failure) => failed(failure, write),
                }
            }
        };
        pb::ToolResult {
            call_id,
            outcome: Some(outcome),
        }
    }

    /// The result a task that has ended (or will not end in time) gives.
    async fn ended(&self, task: Task, write: bool) -> pb::tool_result::Outcome {
        match task.status.state {
            TaskState::Completed => pb::tool_result::Outcome::Output(output(&task)),
            TaskState::Failed | TaskState::Rejected | TaskState::Canceled => error(
                pb::ErrorType::Rejected,
                format!(
                    "the agent's task {} ended {}: {}",
                    task.id,
                    state_name(task.status.state),
                    words(&task)
                ),
                false,
            ),
            TaskState::InputRequired | TaskState::AuthRequired => {
                // A question the remote agent asks cannot reach a person from here (the
                // call's answered send would need the task, which only this call knows):
                // the task is cancelled, and the model hears the question.
                let _ = self
                    .rpc::<Task>(
                        "CancelTask",
                        json!({"id": task.id}),
                        Duration::from_secs(10),
                    )
                    .await;
                error(
                    pb::ErrorType::Rejected,
                    format!(
                        "the agent's task {} asked for input, which this tool cannot give; it \
                         was cancelled. The agent asked: {}",
                        task.id,
                        words(&task)
                    ),
                    false,
                )
            }
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => match write {
                true => pb::tool_result::Outcome::Unknown(pb::tool_result::OutcomeUnknown {
                    detail: format!("the agent's task {} had not ended in time", task.id),
                }),
                false => error(
                    pb::ErrorType::Timeout,
                    format!("the agent's task {} had not ended in time", task.id),
                    true,
                ),
            },
        }
    }

    /// What became of the message with ID `key`.
    async fn reconcile_key(
        &self,
        key: &str,
        timeout: Duration,
    ) -> ToolExecutorServiceReconcileResponse {
        let answer =
            |status: pb::ReconcileStatus, detail: String| ToolExecutorServiceReconcileResponse {
                status: status.into(),
                detail,
                ..ToolExecutorServiceReconcileResponse::default()
            };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut page_token = String::new();
        for _ in 0..RECONCILE_PAGES {
            let params = json!({"pageSize": RECONCILE_PAGE_SIZE, "pageToken": page_token,
                                "historyLength": 1});
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let page: ListTasksResponse = match self.rpc("ListTasks", params, left).await {
                Ok(page) => page,
                Err(failure) => {
                    return answer(
                        pb::ReconcileStatus::Unknown,
                        format!("the agent's tasks could not be listed: {failure}"),
                    );
                }
            };
            let found = page
                .tasks
                .into_iter()
                .find(|task| task.history.iter().any(|message| message.message_id == key));
            if let Some(task) = found {
                let task = match self.until_settled(task, deadline).await {
                    Ok(task) => task,
                    Err(failure) => {
                        return answer(
                            pb::ReconcileStatus::Unknown,
                            format!("the agent's task could not be read: {failure}"),
                        );
                    }
                };
                return match task.status.state {
                    TaskState::Completed => {
                        let output = output(&task);
                        ToolExecutorServiceReconcileResponse {
                            status: pb::ReconcileStatus::Applied.into(),
                            receipt: output.receipt,
                            output_json: output.output_json,
                            detail: format!("the agent's task {} completed", task.id),
                        }
                    }
                    state @ (TaskState::Unspecified
                    | TaskState::Submitted
                    | TaskState::Working
                    | TaskState::Failed
                    | TaskState::Canceled
                    | TaskState::InputRequired
                    | TaskState::Rejected
                    | TaskState::AuthRequired) => answer(
                        pb::ReconcileStatus::Unknown,
                        format!(
                            "the agent's task {} for this message is {}: check what it did",
                            task.id,
                            state_name(state)
                        ),
                    ),
                };
            }
            if page.next_page_token.is_empty() {
                return answer(
                    pb::ReconcileStatus::NotApplied,
                    "no task of the agent's holds this message: it never arrived".to_owned(),
                );
            }
            page_token = page.next_page_token;
        }
        answer(
            pb::ReconcileStatus::Unknown,
            format!(
                "no task holds this message among the agent's {} newest; check its system",
                RECONCILE_PAGES * RECONCILE_PAGE_SIZE.unsigned_abs()
            ),
        )
    }

    fn descriptor(&self, card: &AgentCard) -> pb::ToolDescriptor {
        let description = format!("A2A agent {:?}: {}", card.name, card.description);
        pb::ToolDescriptor {
            name: self.config.name.clone(),
            description: agentloop_proto::prefix(&description, MAX_DESCRIPTION_BYTES).to_owned(),
            input_schema_json: json!({
                "type": "object",
                "properties": {"message": {
                    "type": "string",
                    "description": "The task for the agent, in words: it sees nothing else."
                }},
                "required": ["message"],
                "additionalProperties": false,
            })
            .to_string(),
            side_effect: match self.config.side_effect {
                RemoteSideEffect::Write => pb::SideEffect::Write,
                RemoteSideEffect::ReadOnly => pb::SideEffect::ReadOnly,
            }
            .into(),
            timeout: prost_types::Duration::try_from(self.timeout()).ok(),
            ..pb::ToolDescriptor::default()
        }
    }
}

/// The JSON-RPC endpoint of version 1.x a card offers.
fn jsonrpc_interface(card: &AgentCard) -> Result<String, Failure> {
    card.supported_interfaces
        .iter()
        .find(|interface| {
            interface.protocol_binding == "JSONRPC"
                && interface.protocol_version.split('.').next() == Some("1")
        })
        .map(|interface| interface.url.clone())
        .ok_or_else(|| {
            Failure::Malformed("the card offers no JSON-RPC interface of A2A 1.x".into())
        })
}

/// The `message` argument.
fn arguments(request: &ToolExecutorServiceExecuteRequest) -> Result<String, String> {
    let call = request.call.as_ref().ok_or("the request has no call")?;
    let arguments: Value = serde_json::from_str(&call.arguments_json)
        .map_err(|e| format!("the arguments are not JSON: {e}"))?;
    match arguments.get("message").and_then(Value::as_str) {
        Some(text) if !text.trim().is_empty() => Ok(text.to_owned()),
        _ => Err("the argument message (the task, in words) is required".to_owned()),
    }
}

/// A completed task as the call's output: its text, its data, and the task as receipt.
fn output(task: &Task) -> pb::ToolOutput {
    let parts: Vec<&Part> = task.artifacts.iter().flat_map(|a| a.parts.iter()).collect();
    let answer = parts
        .iter()
        .filter_map(|part| part.text.as_deref())
        .collect::<Vec<_>>()
        .join("\n");
    let data: Vec<&Value> = parts.iter().filter_map(|part| part.data.as_ref()).collect();
    pb::ToolOutput {
        output_json: json!({"taskId": task.id, "answer": answer, "data": data}).to_string(),
        receipt: task.id.clone(),
    }
}

/// The agent's words on a task's status.
fn words(task: &Task) -> String {
    let text = task
        .status
        .message
        .as_ref()
        .map(|message| {
            message
                .parts
                .iter()
                .filter_map(|part| part.text.as_deref())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    agentloop_proto::prefix(&text, 2048).to_owned()
}

fn state_name(state: TaskState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn error(kind: pb::ErrorType, message: String, retryable: bool) -> pb::tool_result::Outcome {
    pb::tool_result::Outcome::Error(pb::ToolError {
        error_type: kind.into(),
        message,
        retryable,
        next_allowed_action: match retryable {
            true => pb::NextAction::Retry,
            false => pb::NextAction::None,
        }
        .into(),
    })
}

/// The result of a send that failed: not sent, refused, or (for a write) unknown.
fn failed(failure: Failure, write: bool) -> pb::tool_result::Outcome {
    match failure {
        Failure::NotSent(why) => {
            pb::tool_result::Outcome::NotStarted(pb::tool_result::NotStarted {
                reason: format!("the agent was not reached: {why}"),
            })
        }
        Failure::Refused { code, message } => error(
            match code {
                -32602 | -32005 => pb::ErrorType::InvalidArguments,
                -32001 => pb::ErrorType::NotFound,
                _ => pb::ErrorType::Rejected,
            },
            format!("the agent refused the message ({code}): {message}"),
            false,
        ),
        failure @ (Failure::Lost(_) | Failure::Malformed(_)) => match write {
            true => pb::tool_result::Outcome::Unknown(pb::tool_result::OutcomeUnknown {
                detail: format!("the agent's answer: {failure}"),
            }),
            false => error(
                pb::ErrorType::Unavailable,
                format!("the agent's answer: {failure}"),
                true,
            ),
        },
    }
}

#[tonic::async_trait]
impl ToolExecutorService for RemoteAgent {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        let (card, _) = self.card().await.map_err(|failure| {
            Status::unavailable(format!("A2A agent {}: {failure}", self.name()))
        })?;
        Ok(Response::new(DescribeResponse {
            tools: vec![self.descriptor(&card)],
            ..DescribeResponse::default()
        }))
    }

    /// Runs under [`RemoteAgent::deadline`].
    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        let timeout = self.deadline(request.metadata());
        let request = request.into_inner();
        if request.input_answer.is_some() {
            return Err(Status::invalid_argument(
                "an A2A agent's tool asks no question, so a call carries no answer",
            ));
        }
        let result = self.call(&request, timeout).await;
        Ok(Response::new(ToolExecutorServiceExecuteResponse {
            result: Some(result),
        }))
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    /// Not served: a remote agent's executor runs in the gateway's process, which sends
    /// it each call as an `Execute` of its own.
    async fn execute_stage(
        &self,
        _request: tonic::Request<agentloop_proto::v1::ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "an A2A agent's calls go one by one",
        ))
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        let timeout = self.deadline(request.metadata());
        let request = request.into_inner();
        if request.tool != self.config.name {
            return Err(Status::invalid_argument(format!(
                "tool {:?} is not A2A agent {:?}'s",
                agentloop_proto::prefix(&request.tool, 128),
                self.config.name
            )));
        }
        Ok(Response::new(
            self.reconcile_key(&request.effect_key, timeout).await,
        ))
    }

    async fn verify(
        &self,
        _request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        Err(Status::unimplemented("an A2A agent serves no verifier"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> RemoteAgentConfig {
        RemoteAgentConfig {
            name: "research".into(),
            url: "http://127.0.0.1:9".into(),
            bearer_token_env: None,
            bearer_token_file: None,
            side_effect: RemoteSideEffect::Write,
            timeout_ms: 1_000,
        }
    }

    #[test]
    fn an_entry_is_checked() {
        assert_eq!(entry().validate(), Ok(()));
        let bad = [
            RemoteAgentConfig {
                name: "a b".into(),
                ..entry()
            },
            RemoteAgentConfig {
                url: "ftp://host".into(),
                ..entry()
            },
            RemoteAgentConfig {
                bearer_token_env: Some("T".into()),
                bearer_token_file: Some("/t".into()),
                ..entry()
            },
            RemoteAgentConfig {
                timeout_ms: 0,
                ..entry()
            },
        ];
        for entry in bad {
            assert!(entry.validate().is_err(), "{entry:?}");
        }
        let unset = RemoteAgentConfig {
            bearer_token_env: Some("AGENTLOOP_TEST_UNSET_A2A_TOKEN".into()),
            ..entry()
        };
        assert!(RemoteAgent::new(unset).is_err());
    }

    #[test]
    fn a_lost_answer_is_unknown_for_a_write_and_a_refusal_is_an_error() {
        let lost = failed(Failure::Lost("reset".into()), true);
        assert!(
            matches!(lost, pb::tool_result::Outcome::Unknown(_)),
            "{lost:?}"
        );
        let read = failed(Failure::Lost("reset".into()), false);
        assert!(matches!(read, pb::tool_result::Outcome::Error(ref e) if e.retryable));
        let never = failed(Failure::NotSent("refused".into()), true);
        assert!(matches!(never, pb::tool_result::Outcome::NotStarted(_)));
        let refused = failed(
            Failure::Refused {
                code: -32602,
                message: "no".into(),
            },
            true,
        );
        assert!(matches!(refused, pb::tool_result::Outcome::Error(ref e)
                if e.error_type() == pb::ErrorType::InvalidArguments && !e.retryable));
    }

    #[tokio::test]
    async fn a_read_that_fails_after_the_send_is_a_lost_answer_never_a_message_not_sent() {
        // Nothing listens on port 9: the read fails to connect.
        let agent = RemoteAgent::new(entry()).unwrap();
        *agent.endpoint.write().await = Some("http://127.0.0.1:9/a2a".to_owned());
        let running = Task {
            id: "t".into(),
            status: crate::types::TaskStatus {
                state: TaskState::Working,
                ..crate::types::TaskStatus::default()
            },
            ..Task::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let failure = agent.until_settled(running, deadline).await.unwrap_err();
        assert!(matches!(failure, Failure::Lost(_)), "{failure:?}");
        assert!(matches!(
            failed(failure, true),
            pb::tool_result::Outcome::Unknown(_)
        ));
    }

    #[test]
    fn a_token_is_never_shown() {
        let shown = format!("{:?}", Token::Value("s3cret".into()));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
