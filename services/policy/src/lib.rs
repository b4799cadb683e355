//! The policy service of agentloop: the trusted judge of what the model proposes,
//! served as `PolicyService` (`Evaluate`, `ValidateFinal`).
//!
//! `Evaluate` refuses a batch for an empty batch, a missing or duplicate call ID, an
//! unknown tool, arguments that are not a JSON object, and JSON Schema violations (each
//! with its JSON pointer); then it puts each call to the profile's Cedar policies
//! ([`agentloop_authz`]) for the invocation's actor, tenant and roles, and refuses the
//! batch if any call is denied (PERMISSION_DENIED, naming the deciding policies). It
//! asks for approval when a gated tool is called or a policy gates a call (the digest is
//! the engine's [`agentloop_engine::Fingerprint`] of the calls' canonical arguments);
//! otherwise it allows the batch. Which calls of an allowed batch run together is the
//! engine's plan, not policy's. `ValidateFinal` runs the profile's acceptance rules on a
//! final answer (see [`AcceptanceRules`]).
//!
//! It is *not* an executor and keeps no invocation state: every answer depends only on
//! the request, the tool descriptors loaded at startup, the policy sets in force (see
//! [`Profiles`]: reloaded when their files change) and the configuration. Budgets are
//! the engine's job (checked before policy is asked).

#![warn(missing_docs)]

mod acceptance;
mod error;
mod profiles;
mod tools;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop_proto::client::ClientConfig;
use agentloop_proto::v1::policy_service_server::PolicyService;
use agentloop_proto::v1::{
    EvaluateRequest, EvaluateResponse, ListToolsRequest, ToolDescriptor, ValidateFinalRequest,
    ValidateFinalResponse,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use acceptance::{
    Acceptance, AcceptanceRules, Condition, Json, MAX_EVIDENCE_REFS, MAX_REQUIREMENTS, Requirement,
    Writes,
};
pub use error::PolicyError;
pub use profiles::{ProfilePolicies, Profiles, compile_policies, tool_facts};
pub use tools::{
    MAX_ARGUMENTS_BYTES, MAX_CALLS, MAX_INVOCATION_ID_BYTES, MAX_SCHEMA_VIOLATIONS_PER_CALL,
    ToolPolicy,
};

/// Configuration of the policy service (layered by `agentloop_server::config`;
/// environment prefix `AGENTLOOP_POLICY_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The callers it accepts, each by its service token (`[[auth.callers]]`). With
    /// none, anyone who reaches the port is served, so it must be loopback (or
    /// `insecure_no_auth`).
    pub auth: agentloop_auth::CallersConfig,
    /// Serve a non-loopback address without `auth` all the same (`--insecure-no-auth`).
    pub insecure_no_auth: bool,
    /// TLS on the listener; with `client_ca_file`, mutual TLS, and `auth.callers` may name
    /// callers by the SPIFFE ID of their certificates.
    pub server_tls: Option<agentloop_server::ServerTls>,
    /// The tool gateway (`http://host:port`) whose `ListTools` gives the descriptors.
    pub tools_endpoint: Option<String>,
    /// This service's token for the tool gateway, when the gateway checks its callers.
    pub service_token_file: Option<PathBuf>,
    /// TLS of its calls (`https://` endpoints): the CA and, for mutual TLS, its
    /// certificate.
    pub client_tls: Option<agentloop_server::ClientTlsFiles>,
    /// The tool gateway's registry file (`agentloop_tools::ToolsConfig` TOML), read
    /// instead of asking the gateway; exactly one of this and `tools_endpoint`.
    pub tools_file: Option<PathBuf>,
    /// Attempts at `ListTools` during startup (the gateway may start after policy).
    pub tools_attempts: u32,
    /// Wait between those attempts, in milliseconds.
    pub tools_backoff_ms: u64,
    /// Tools whose calls need a human approval bound to the proposal digest.
    pub require_approval_for: Vec<String>,
    /// The acceptance rules of final answers, by profile (`[acceptance.default]`); a
    /// profile without an entry gets [`Acceptance::default`].
    pub acceptance: BTreeMap<String, Acceptance>,
    /// The Cedar policy files of each profile (`[policies] default = ["a.cedar"]`). With
    /// none, authorization is off: every call that passes its schema is allowed. With
    /// some, a profile that has none is refused every call.
    pub policies: BTreeMap<String, Vec<PathBuf>>,
    /// How often the policy files are read for changes, in milliseconds (0: on SIGHUP
    /// only).
    pub policy_watch_ms: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50053)),
            auth: agentloop_auth::CallersConfig::default(),
            insecure_no_auth: false,
            server_tls: None,
            tools_endpoint: None,
            service_token_file: None,
            client_tls: None,
            tools_file: None,
            tools_attempts: 40,
            tools_backoff_ms: 250,
            require_approval_for: Vec::new(),
            acceptance: BTreeMap::new(),
            policies: BTreeMap::new(),
            policy_watch_ms: 2000,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl PolicyConfig {
    /// The checks that need no network: exactly one source of tool descriptors. Run at
    /// start (so `--dump-config` refuses what the service would) and by
    /// [`PolicyServer::from_config`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::NoToolSource`] or [`PolicyError::ConflictingToolSources`].
    pub fn validate(&self) -> Result<(), PolicyError> {
        match (&self.tools_file, &self.tools_endpoint) {
            (None, None) => Err(PolicyError::NoToolSource),
            (Some(_), Some(_)) => Err(PolicyError::ConflictingToolSources),
            (Some(_), None) | (None, Some(_)) => Ok(()),
        }
    }
}

impl agentloop_server::ServiceConfig for PolicyConfig {
    fn listen(&self) -> SocketAddr {
        self.listen
    }

    fn authenticates_callers(&self) -> bool {
        self.auth.is_on()
    }

    fn insecure_no_auth(&self) -> bool {
        self.insecure_no_auth
    }
}

/// Most attempts [`fetch_tools`] makes, whatever the configuration says.
pub const MAX_TOOLS_ATTEMPTS: u32 = 1000;

/// Lists every tool at the gateway `endpoint`, retrying up to `attempts` times
/// (capped at [`MAX_TOOLS_ATTEMPTS`], at least once) with `backoff` between attempts.
///
/// # Errors
///
/// [`PolicyError::ToolsUnavailable`] with the last failure when every attempt failed.
pub async fn fetch_tools(
    endpoint: &str,
    client: ClientConfig,
    attempts: u32,
    backoff: Duration,
) -> Result<Vec<ToolDescriptor>, PolicyError> {
    let attempts = attempts.clamp(1, MAX_TOOLS_ATTEMPTS);
    let client_config = client
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Some(Duration::from_secs(10)));
    let mut last = String::new();
    for attempt in 1..=attempts {
        match agentloop_proto::client::connect(endpoint, client_config.clone()).await {
            Ok(channel) => {
                let mut client = agentloop_proto::client::tool_gateway(channel);
                match client.list_tools(ListToolsRequest::default()).await {
                    Ok(response) => return Ok(response.into_inner().tools),
                    Err(status) => last = format!("ListTools failed: {status}"),
                }
            }
            Err(error) => last = with_sources(&error),
        }
        tracing::warn!(endpoint, attempt, attempts, error = %last, "tool gateway not ready");
        if attempt < attempts {
            tokio::time::sleep(backoff).await;
        }
    }
    Err(PolicyError::ToolsUnavailable {
        endpoint: endpoint.to_owned(),
        attempts,
        detail: last,
    })
}

/// `error` and its chain of causes, so a log line says *why* a connection failed.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    // Bounded: error chains are short, but a cyclic one must not loop for ever.
    for _ in 0..8 {
        let Some(cause) = source else { break };
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The `PolicyService` implementation. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct PolicyServer {
    tools: Arc<ToolPolicy>,
    profiles: Arc<Profiles>,
    acceptance: Arc<AcceptanceRules>,
    watch_every: Option<Duration>,
}

impl PolicyServer {
    /// A server judging calls with `tools` and the policies of `profiles`, and answers
    /// by the `acceptance` rules.
    pub fn new(tools: ToolPolicy, profiles: Profiles, acceptance: AcceptanceRules) -> PolicyServer {
        PolicyServer {
            tools: Arc::new(tools),
            profiles: Arc::new(profiles),
            acceptance: Arc::new(acceptance),
            watch_every: None,
        }
    }

    /// A server for `config` over the given descriptors (approval gates, policies and
    /// acceptance rules from `config`; `tools_endpoint` is not used).
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidSchema`] or [`PolicyError::DuplicateTool`] from
    /// [`ToolPolicy::new`], [`PolicyError::Policies`] for policies that do not load,
    /// [`PolicyError::Acceptance`] for invalid acceptance rules.
    pub fn from_descriptors(
        descriptors: &[ToolDescriptor],
        config: &PolicyConfig,
    ) -> Result<PolicyServer, PolicyError> {
        let tools = ToolPolicy::new(descriptors)?
            .with_approval_gates(config.require_approval_for.iter().cloned());
        let profiles = if config.policies.is_empty() {
            Profiles::off()
        } else {
            Profiles::load(config.policies.clone(), descriptors.to_vec())?
        };
        let names = descriptors.iter().map(|d| d.name.as_str());
        let acceptance = AcceptanceRules::compile(&config.acceptance, names)?;
        let mut server = PolicyServer::new(tools, profiles, acceptance);
        server.watch_every =
            (config.policy_watch_ms > 0).then(|| Duration::from_millis(config.policy_watch_ms));
        Ok(server)
    }

    /// The policy sets in force.
    pub fn profiles(&self) -> &Arc<Profiles> {
        &self.profiles
    }

    /// Reloads the policies when their files change (and on SIGHUP with `on_hangup`),
    /// until dropped; a no-op without policies. [`run`] runs it with SIGHUP, as a daemon
    /// does; an embedding (the CLI's, whose SIGHUP means its terminal closed) without.
    pub fn watch(&self, on_hangup: bool) -> impl Future<Output = ()> + Send + 'static {
        let (profiles, every) = (Arc::clone(&self.profiles), self.watch_every);
        async move {
            if profiles.is_off() {
                return;
            }
            profiles::watch(profiles, every, on_hangup).await;
        }
    }

    /// A server for `config`: reads the tools from `tools_file`, or lists them at
    /// `tools_endpoint` (with the configured bounded retry), then compiles them.
    ///
    /// # Errors
    ///
    /// [`PolicyError::NoToolSource`] / [`PolicyError::ConflictingToolSources`] unless
    /// exactly one source is set, [`PolicyError::ToolsFile`], then the errors of
    /// [`fetch_tools`] and [`PolicyServer::from_descriptors`].
    pub async fn from_config(config: &PolicyConfig) -> Result<PolicyServer, PolicyError> {
        config.validate()?;
        let descriptors = match (&config.tools_file, &config.tools_endpoint) {
            // Both at once was refused by `validate`.
            (Some(path), _) => agentloop_tools::ToolsConfig::load(path)
                .map_err(|e| PolicyError::ToolsFile {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?
                .descriptors(),
            (None, Some(endpoint)) => {
                let client = agentloop_server::client_config(
                    config.service_token_file.as_deref(),
                    config.client_tls.as_ref(),
                )
                .map_err(PolicyError::ServiceToken)?;
                fetch_tools(
                    endpoint,
                    client,
                    config.tools_attempts,
                    Duration::from_millis(config.tools_backoff_ms),
                )
                .await?
            }
            (None, None) => return Err(PolicyError::NoToolSource),
        };
        tracing::info!(tools = descriptors.len(), "tool descriptors loaded");
        PolicyServer::from_descriptors(&descriptors, config)
    }

    /// `Evaluate` without the gRPC wrapping; see [`ToolPolicy::evaluate`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a malformed request.
    pub fn evaluate(&self, request: &EvaluateRequest) -> Result<EvaluateResponse, PolicyError> {
        self.tools
            .evaluate(request, &self.profiles.get(&request.profile))
    }

    /// `ValidateFinal` without the gRPC wrapping; see [`AcceptanceRules::validate`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a malformed request.
    pub fn validate_final(
        &self,
        request: &ValidateFinalRequest,
    ) -> Result<ValidateFinalResponse, PolicyError> {
        self.acceptance.validate(request)
    }
}

#[tonic::async_trait]
impl PolicyService for PolicyServer {
    async fn evaluate(
        &self,
        request: tonic::Request<EvaluateRequest>,
    ) -> Result<tonic::Response<EvaluateResponse>, tonic::Status> {
        PolicyServer::evaluate(self, request.get_ref())
            .map(tonic::Response::new)
            .map_err(tonic::Status::from)
    }

    async fn validate_final(
        &self,
        request: tonic::Request<ValidateFinalRequest>,
    ) -> Result<tonic::Response<ValidateFinalResponse>, tonic::Status> {
        PolicyServer::validate_final(self, request.get_ref())
            .map(tonic::Response::new)
            .map_err(tonic::Status::from)
    }
}

/// Serves `server` on `listener` with the shared server setup (health, reflection,
/// tracing) until `shutdown` resolves, then drains in-flight requests.
///
/// # Errors
///
/// [`agentloop_server::ServeError`] when the server fails.
pub async fn run(
    listener: TcpListener,
    server: PolicyServer,
    access: agentloop_server::Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let watcher = tokio::spawn(server.watch(true));
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::policy(server), &access);
    let served = agentloop_server::serve(listener, services, shutdown).await;
    watcher.abort();
    served
}
