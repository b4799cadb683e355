//! The agentloop tool gateway: the registry of tools and the one route from the
//! orchestrator to the tool executors.
//!
//! - [`config`]: the registry file, loaded from TOML ([`ToolsConfig::load`]): tools and
//!   verifiers by hand, executors by endpoint, MCP servers; and an executor's `Describe`
//!   output as registry entries ([`ToolsConfig::from_describe`]).
//! - The registry in force (`registry`): built from the file's hand-written entries, the
//!   executors it names and those that call `RegisterExecutor`, whose descriptions the
//!   gateway keeps current (health checks, periodic descriptions); every change is one
//!   new registry swapped in whole. A name belongs to whoever registered it first. An
//!   executor that is down has its tools listed unavailable and their calls answered at
//!   once; a call planned under an older contract digest is refused. MCP servers
//!   ([`agentloop_mcp`]) are executors in this process.
//! - [`Gateway`]: the `ToolGatewayService`. It forwards each call to the executor that
//!   owns the tool, under the smaller of the tool's and the request's timeout, with a
//!   bounded number of calls in flight per executor, and cancels the forwarded call
//!   when its own caller goes away. `ExecuteStage` takes the read-only calls of one
//!   stage in one request; it sends those to one executor across the network as one
//!   `ExecuteStage` of the executor's, streamed back and each held to its own deadline
//!   (one by one to an executor that answers UNIMPLEMENTED), and the others as
//!   `Execute` does. It refuses writes, which go one by one under the effect ledger.
//!   Executors in the same process can be
//!   called without a network ([`InProcessExecutors`]), with the same limits and
//!   results.
//!   `Verify` asks a registered verifier's executor to judge a final answer, over the
//!   same channel and slots as the tools of that executor, under the smaller of the
//!   verifier's and the request's timeout.
//! - [`outcome`]: how a failed forward becomes the call's one terminal result. A write
//!   whose request may have reached the executor is `unknown`, never a plain error.
//! - [`verdict`]: how a verifier's answer, or the lack of one, becomes its check. Every
//!   failure (unreachable, error status, timeout, no verdict, an answer beyond bounds)
//!   is an UNDECIDED check, never an error: verifiers fail closed.
//!
//! It is *not* a policy engine (schemas and authorization are checked by the policy
//! service before a call gets here), not an executor, and it keeps no durable state:
//! the registry is rebuilt from the file and the executors at start, and effect keys are
//! enforced by the executors.

#![warn(missing_docs)]

pub use agentloop_registry as config;
mod error;
mod gateway;
mod observe;
pub mod outcome;
mod registry;
pub mod verdict;

use std::future::Future;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use config::{ConfigError, ExecutorEntry, ToolEntry, ToolsConfig, VerifierEntry};
pub use error::GatewayError;
pub use gateway::{
    Answered, Dispatch, Gateway, GatewayLimits, InProcessExecutors, MAX_ID_BYTES, MAX_LIST_NAMES,
};

/// Configuration of the tools service (file, `AGENTLOOP_TOOLS_*` env, flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolsServiceConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: agentloop_server::ServerSettings,
    /// The tool registry file (TOML, `[[tools]]` and `[[verifiers]]`); required to start.
    pub tools: Option<PathBuf>,
    /// The callers (names of `auth.callers` entries) that may register and deregister
    /// executors (`RegisterExecutor`, `DeregisterExecutor`), and may call nothing else.
    /// Empty: with `auth`, nobody may; without, whoever reaches the port may.
    pub registrars: Vec<String>,
    /// Gateway limits.
    pub limits: GatewayLimits,
    /// How it calls the services it needs: `service_token_file`, `[client_tls]`.
    #[serde(flatten)]
    pub client: agentloop_server::ClientSettings,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: agentloop_server::UnknownKeys,
}

impl Default for ToolsServiceConfig {
    fn default() -> Self {
        ToolsServiceConfig {
            server: agentloop_server::ServerSettings::on_port(50054),
            tools: None,
            registrars: Vec::new(),
            limits: GatewayLimits::default(),
            client: agentloop_server::ClientSettings::default(),
            unknown: agentloop_server::UnknownKeys,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for ToolsServiceConfig {
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &agentloop_server::ServerSettings {
        &self.server
    }
}

/// Serves `gateway` on `listener` (with health, reflection and tracing from
/// `agentloop-server`) until `shutdown` resolves, then drains in-flight calls.
///
/// # Errors
///
/// When the server fails to start or to serve.
pub async fn run(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    access: agentloop_server::Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::tool_gateway(gateway), &access);
    agentloop_server::serve(listener, services, shutdown).await
}
