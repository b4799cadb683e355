//! agentloop as an A2A v1.0 agent: another framework's agent hands it a task as it would
//! to any A2A agent, and gets the answer back with the evidence that backs it.
//!
//! - **One implementation.** Every method is a call of the orchestrator's own gRPC API
//!   in this process, made with the HTTP caller's `Authorization` header: the same
//!   authentication, tenancy (another tenant's task is not found), roles, bounds and
//!   durability as a gRPC caller gets. Nothing here keeps state of its own; a task is
//!   an invocation, and its ID is the invocation's.
//! - **The JSON-RPC binding** is served at [`agent::RPC_PATH`] on the orchestrator's
//!   HTTP listener, and the Agent Card at [`agent::CARD_PATH`].
//! - **Streams** (`SendStreamingMessage`, `SubscribeToTask`) follow the invocation's
//!   committed event log: the task first, a `working` update per committed turn, then
//!   the answer's artifact and the final status; a stream ends when the task ends or
//!   waits for the client.
//! - **input-required** is each of the invocation's waits: the model's question, a
//!   tool's question (with the schema its answer must satisfy) and an approval (with
//!   the digest a reply must name). A message with the task's ID is the reply
//!   ([`task::reply`]).
//! - **A remote agent as a tool** ([`remote`]): an `[[a2a_agents]]` entry of the tool
//!   registry, called once per effect key.
//! - **Idempotent sends.** A new task's invocation is keyed by the message ID, so a
//!   client that sends the same message again gets the same task.

pub mod agent;
mod error;
pub mod remote;
pub mod task;
pub mod types;

pub use agent::{Agent, CardSettings};
pub use error::A2aError;
pub use remote::{RemoteAgent, RemoteAgentConfig, RemoteConfigError, RemoteSideEffect};
