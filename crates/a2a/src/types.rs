//! The A2A v1.0 messages this agent reads and writes, in the JSON form of the protocol's
//! proto (`lf.a2a.v1`): lowerCamelCase names (a request's snake_case names are read
//! too), enums by their full names, `google.protobuf.Struct` and `Value` as plain JSON.
//!
//! Everything is read leniently: a field not used is ignored, as a proto JSON reader that
//! knows a newer minor version would, and a field left out has its default (proto JSON
//! leaves default values out). Answers carry only what is set.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Not given.
    #[default]
    #[serde(rename = "ROLE_UNSPECIFIED")]
    Unspecified,
    /// The client.
    #[serde(rename = "ROLE_USER", alias = "user")]
    User,
    /// This agent.
    #[serde(rename = "ROLE_AGENT", alias = "agent")]
    Agent,
}

/// One piece of a message or an artifact: exactly one of its contents is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// Text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Bytes, base64 in JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// A file by reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Structured data: any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// The part's media type.
    #[serde(
        default,
        alias = "media_type",
        skip_serializing_if = "String::is_empty"
    )]
    pub media_type: String,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Part {
        Part {
            text: Some(text.into()),
            ..Part::default()
        }
    }

    /// A data part.
    pub fn data(data: Value) -> Part {
        Part {
            data: Some(data),
            media_type: "application/json".to_owned(),
            ..Part::default()
        }
    }
}

/// A message of a conversation with the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Message {
    /// Chosen by its writer; a client's message ID makes its send idempotent.
    #[serde(default, alias = "message_id")]
    pub message_id: String,
    /// The conversation.
    #[serde(
        default,
        alias = "context_id",
        skip_serializing_if = "String::is_empty"
    )]
    pub context_id: String,
    /// The task it belongs to; a client sets it to reply to a task that waits.
    #[serde(default, alias = "task_id", skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    /// Who wrote it.
    pub role: Role,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// The writer's own data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Not given; a filter with it matches every state.
    #[default]
    #[serde(rename = "TASK_STATE_UNSPECIFIED")]
    Unspecified,
    /// Accepted, not started.
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    /// Running.
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    /// Done, with its answer.
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    /// Ended without an answer.
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    /// Cancelled.
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    /// Waits for the client's reply.
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    /// The agent declined the task.
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    /// Waits for credentials.
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
}

impl TaskState {
    /// Whether a task in this state will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Whether a stream of the task ends at this state: it is terminal, or the task
    /// waits for the client.
    pub fn ends_stream(self) -> bool {
        self.is_terminal() || matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

/// A task's state, with the agent's words about it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// What the agent says about it: the question, the approval asked for, why it
    /// failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// When the task reached it, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// An output of a task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    pub artifact_id: String,
    /// A name for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its content.
    pub parts: Vec<Part>,
}

/// A task: one invocation of the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Task {
    /// The task's ID: the invocation's.
    pub id: String,
    /// Its conversation.
    pub context_id: String,
    /// Where it is.
    pub status: TaskStatus,
    /// Its outputs: the answer, once completed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// The messages of the task so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// The agent's own data about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A change of a task's state, in a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its conversation.
    pub context_id: String,
    /// Its new status.
    pub status: TaskStatus,
    /// The agent's own data about the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A new artifact of a task, in a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its conversation.
    pub context_id: String,
    /// The artifact, whole.
    pub artifact: Artifact,
    /// Whether it extends an artifact sent before.
    #[serde(default)]
    pub append: bool,
    /// Whether it is the artifact's last piece.
    #[serde(default)]
    pub last_chunk: bool,
}

/// One event of a stream: the task first, then its changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    /// The task as it is.
    Task(Task),
    /// A message (never sent by this agent: every answer is a task).
    Message(Message),
    /// A change of state.
    StatusUpdate(TaskStatusUpdateEvent),
    /// An artifact.
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

/// The answer to `SendMessage`: always a task here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SendMessageResponse {
    /// The task the message started or continued.
    Task(Task),
    /// A direct reply (never sent by this agent).
    Message(Message),
}

/// How a client wants `SendMessage` answered.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Answer at once, with the task as started, instead of when it ends or waits.
    #[serde(default, alias = "return_immediately")]
    pub return_immediately: bool,
    /// A push-notification target: not supported.
    #[serde(default, alias = "task_push_notification_config")]
    pub task_push_notification_config: Option<Value>,
}

/// `SendMessage` and `SendStreamingMessage`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    /// The tenant the caller acts for: checked against its credentials.
    #[serde(default)]
    pub tenant: String,
    /// The message.
    pub message: Message,
    /// How to answer.
    #[serde(default)]
    pub configuration: Option<SendMessageConfiguration>,
}

/// `GetTask`, `CancelTask` and `SubscribeToTask`: a task by its ID.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRequest {
    /// The tenant the caller acts for.
    #[serde(default)]
    pub tenant: String,
    /// The task.
    pub id: String,
    /// `GetTask`: most messages of its history to return.
    #[serde(default, alias = "history_length")]
    pub history_length: Option<i32>,
}

/// `ListTasks`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    /// The tenant the caller acts for.
    #[serde(default)]
    pub tenant: String,
    /// Only the tasks of this conversation.
    #[serde(default, alias = "context_id")]
    pub context_id: String,
    /// Only the tasks in this state.
    #[serde(default)]
    pub status: Option<TaskState>,
    /// Most tasks to return, 1 to 100; 50 when not given.
    #[serde(default, alias = "page_size")]
    pub page_size: Option<i32>,
    /// Where the previous page ended.
    #[serde(default, alias = "page_token")]
    pub page_token: String,
    /// Most messages of each task's history to return.
    #[serde(default, alias = "history_length")]
    pub history_length: Option<i32>,
    /// Only the tasks whose status changed at or after this time (RFC 3339).
    #[serde(default, alias = "status_timestamp_after")]
    pub status_timestamp_after: Option<String>,
    /// Whether each task's artifacts are returned (not by default).
    #[serde(default, alias = "include_artifacts")]
    pub include_artifacts: Option<bool>,
}

/// The answer to `ListTasks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListTasksResponse {
    /// The page, newest first.
    pub tasks: Vec<Task>,
    /// Where the next page starts; empty on the last one.
    pub next_page_token: String,
    /// The page's size as served.
    pub page_size: i32,
    /// How many tasks this page holds: the total is not counted.
    pub total_size: i32,
}

/// Where and how the agent is reached.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentInterface {
    /// The endpoint.
    pub url: String,
    /// `JSONRPC`, `GRPC` or `HTTP+JSON`.
    pub protocol_binding: String,
    /// The protocol version, `1.0`.
    pub protocol_version: String,
}

/// What the agent can do besides answering.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `SendStreamingMessage` and `SubscribeToTask`.
    pub streaming: bool,
    /// Push notifications.
    pub push_notifications: bool,
    /// An extended card for authenticated callers.
    pub extended_agent_card: bool,
}

/// A thing the agent does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentSkill {
    /// Unique within the card.
    pub id: String,
    /// For people.
    pub name: String,
    /// For people and for a calling agent's model.
    pub description: String,
    /// Keywords.
    pub tags: Vec<String>,
}

/// The card an agent publishes at `/.well-known/agent-card.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentCard {
    /// The agent's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Where it is reached, preferred first.
    pub supported_interfaces: Vec<AgentInterface>,
    /// The agent's own version.
    pub version: String,
    /// What it can do.
    pub capabilities: AgentCapabilities,
    /// The schemes a caller may authenticate with, by name.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub security_schemes: Map<String, Value>,
    /// Which schemes a call needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_requirements: Vec<Value>,
    /// The media types it reads.
    pub default_input_modes: Vec<String>,
    /// The media types it writes.
    pub default_output_modes: Vec<String>,
    /// What it does, in parts.
    pub skills: Vec<AgentSkill>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_as_the_python_sdk_writes_it() {
        let request: SendMessageRequest = serde_json::from_value(serde_json::json!({
            "message": {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [{"text": "hello"}, {"data": {"a": 1}}],
                "extensions": [],
            },
            "configuration": {"acceptedOutputModes": ["text/plain"], "returnImmediately": true},
        }))
        .unwrap();
        assert_eq!(request.message.message_id, "m-1");
        assert_eq!(request.message.role, Role::User);
        assert_eq!(
            request.message.parts[1].data,
            Some(serde_json::json!({"a": 1}))
        );
        assert!(request.configuration.unwrap().return_immediately);
    }

    #[test]
    fn a_stream_event_is_tagged_by_its_kind() {
        let event = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus {
                state: TaskState::InputRequired,
                message: None,
                timestamp: None,
            },
            metadata: None,
        });
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            serde_json::json!({"statusUpdate": {
                "taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}
            }})
        );
    }
}
