//! MCP servers as agentloop tools, through the official Rust SDK (`rmcp`).
//!
//! A tool owner adds an `[[mcp_servers]]` entry ([`McpServerConfig`]) to the registry;
//! the gateway starts one [`McpExecutor`] per entry and routes the server's tools to it
//! in-process (it is a `ToolExecutorService`). The executor:
//!
//! - spawns a stdio server as a child process, or opens a streamable HTTP session (with
//!   headers, and a bearer token from the environment or its own OAuth token from the
//!   client credentials grant), initializes it, and keeps it
//!   connected: a server that exits or is cut off is reconnected with backoff, and calls
//!   meanwhile answer UNAVAILABLE at once ([`Health`], [`Supervision`]);
//! - describes the server's tools (`tools/list`) as `<server>__<tool>`, with their input
//!   schemas and a side-effect class: read-only when the server hints so, an idempotent
//!   write when the registry lists the tool in `idempotent`, else a write;
//! - executes calls (`tools/call`): an `isError` result is a tool error the model reads,
//!   a lost answer is a status the gateway turns into `unknown` for a write, and a call
//!   that is given up on (deadline, caller gone) is cancelled at the server
//!   (`notifications/cancelled`);
//! - reconciles by the registry alone (MCP has no reconcile): NOT_APPLIED for idempotent
//!   tools, so they are sent again, UNKNOWN otherwise, so an operator decides.
//!
//! Nothing a server sends can take the gateway down: every list, schema, message and
//! output is bounded, and a server that sends garbage or more than the bounds is cut off
//! (and reconnected) with the reason logged under its name.
//!
//! It is *not* the gateway: registering the tools, checking arguments against their
//! schemas and enforcing policy happen there. Nor does it serve MCP: agentloop is the
//! client here.

#![warn(missing_docs)]

mod client;
mod config;
mod describe;
mod elicit;
mod error;
mod executor;
mod http;
mod link;
mod login;
mod logs;
mod names;
mod oauth;
mod outcome;
mod stdio;
mod supervisor;
mod token_file;

pub use config::{
    DEFAULT_TIMEOUT_MS, INHERITED_ENV, MAX_ENTRIES, MAX_SERVER_NAME_BYTES, MAX_TIMEOUT_MS,
    MAX_VALUE_BYTES, McpConfigError, McpOAuthConfig, McpServerConfig,
};
pub use describe::{MAX_DESCRIPTION_BYTES, MAX_PAGES, MAX_SCHEMA_BYTES, MAX_TOOLS};
pub use elicit::{Elicitation, MAX_QUESTION_BYTES, MAX_QUESTION_SCHEMA_BYTES};
pub use executor::{EFFECT_KEY_META, McpExecutor};
pub use login::{Login, McpLoginError, login};
pub use names::MAX_TOOL_NAME_BYTES;
pub use outcome::{MAX_ERROR_MESSAGE_BYTES, MAX_OUTPUT_BYTES};
pub use stdio::MAX_MESSAGE_BYTES;
pub use supervisor::{Health, Supervision};
