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
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use agentloop_engine::Judgement;
use agentloop_proto::client::ClientConfig;
use agentloop_proto::v1::policy_service_server::PolicyService;
use agentloop_proto::v1::{
    EvaluateRequest, EvaluateResponse, ListToolsRequest, ListToolsResponse, ToolDescriptor,
    ValidateFinalRequest, ValidateFinalResponse,
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
    Proposal, ToolPolicy,
};

/// Configuration of the policy service (layered by `agentloop_server::config`;
/// environment prefix `AGENTLOOP_POLICY_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: agentloop_server::ServerSettings,
    /// The tool gateway (`http://host:port`) whose `ListTools` gives the descriptors.
    pub tools_endpoint: Option<String>,
    /// The tool gateway's registry file (`agentloop_registry::ToolsConfig` TOML), read
    /// instead of asking the gateway; exactly one of this and `tools_endpoint`.
    pub tools_file: Option<PathBuf>,
    /// Attempts at `ListTools` during startup (the gateway may start after policy).
    pub tools_attempts: u32,
    /// Wait between those attempts, in milliseconds.
    pub tools_backoff_ms: u64,
    /// How often the gateway's tools are listed again (with `tools_endpoint`), in
    /// milliseconds, so executors that register, change or leave are followed without a
    /// restart; 0 lists them at start only.
    pub tools_refresh_ms: u64,
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
    /// How it calls the services it needs: `service_token_file`, `[client_tls]`.
    #[serde(flatten)]
    pub client: agentloop_server::ClientSettings,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: agentloop_server::UnknownKeys,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            server: agentloop_server::ServerSettings::on_port(50053),
            tools_endpoint: None,
            tools_file: None,
            tools_attempts: 40,
            tools_backoff_ms: 250,
            tools_refresh_ms: 2000,
            require_approval_for: Vec::new(),
            acceptance: BTreeMap::new(),
            policies: BTreeMap::new(),
            policy_watch_ms: 2000,
            client: agentloop_server::ClientSettings::default(),
            unknown: agentloop_server::UnknownKeys,
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
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &agentloop_server::ServerSettings {
        &self.server
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
) -> Result<ListToolsResponse, PolicyError> {
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
                    Ok(response) => return Ok(response.into_inner()),
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

/// The client settings of calls to the gateway: this service's token and TLS.
fn gateway_client(config: &PolicyConfig) -> Result<ClientConfig, PolicyError> {
    agentloop_server::client_config(&config.client).map_err(PolicyError::ServiceToken)
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

/// The shortest time between two listings of the gateway's tools asked for by batches
/// that name a tool policy does not know: a caller that sends unknown names cannot make
/// policy list the gateway more often than this.
pub const MIN_ASKED_REFRESH: Duration = Duration::from_millis(250);

/// Lists the gateway's tools.
type Lister = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn Future<Output = Result<ListToolsResponse, tonic::Status>> + Send>,
        > + Send
        + Sync,
>;

/// The gateway policy follows, and when it listed its tools.
struct Following {
    list: Lister,
    /// Held through each listing, so requests that ask at once share one.
    listings: tokio::sync::Mutex<Listings>,
}

/// When the last listing started, and the last one a batch asked for.
struct Listings {
    started: tokio::time::Instant,
    asked: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for Following {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Following").finish_non_exhaustive()
    }
}

/// The `PolicyService` implementation. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct PolicyServer {
    catalog: Arc<RwLock<Arc<Catalog>>>,
    profiles: Arc<Profiles>,
    /// What the catalog is rebuilt from when the gateway's tools change.
    config: Arc<PolicyConfig>,
    /// The gateway it follows, once [`PolicyServer::follow`] runs.
    following: Arc<std::sync::OnceLock<Following>>,
    watch_every: Option<Duration>,
}

/// What policy derives from the tool descriptors, swapped whole when they change.
#[derive(Debug)]
struct Catalog {
    tools: ToolPolicy,
    acceptance: AcceptanceRules,
    /// The gateway's `registry_digest` it was built from; empty when built from a file
    /// or from descriptors.
    digest: String,
}

impl Catalog {
    fn build(
        descriptors: &[ToolDescriptor],
        config: &PolicyConfig,
        digest: String,
    ) -> Result<Catalog, PolicyError> {
        let tools = ToolPolicy::new(descriptors)?
            .with_approval_gates(config.require_approval_for.iter().cloned());
        let names = descriptors.iter().map(|d| d.name.as_str());
        let acceptance = AcceptanceRules::compile(&config.acceptance, names)?;
        Ok(Catalog {
            tools,
            acceptance,
            digest,
        })
    }
}

impl PolicyServer {
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
        PolicyServer::listed(descriptors, config, String::new())
    }

    /// [`PolicyServer::from_descriptors`] of the tools a gateway listed, remembering its
    /// registry digest so [`PolicyServer::update`] recompiles only when it changes.
    ///
    /// # Errors
    ///
    /// As [`PolicyServer::from_descriptors`].
    pub fn from_listed(
        listed: &ListToolsResponse,
        config: &PolicyConfig,
    ) -> Result<PolicyServer, PolicyError> {
        PolicyServer::listed(&listed.tools, config, listed.registry_digest.clone())
    }

    fn listed(
        descriptors: &[ToolDescriptor],
        config: &PolicyConfig,
        digest: String,
    ) -> Result<PolicyServer, PolicyError> {
        let catalog = Catalog::build(descriptors, config, digest)?;
        let profiles = if config.policies.is_empty() {
            Profiles::off()
        } else {
            Profiles::load(config.policies.clone(), descriptors.to_vec())?
        };
        Ok(PolicyServer {
            catalog: Arc::new(RwLock::new(Arc::new(catalog))),
            profiles: Arc::new(profiles),
            watch_every: (config.policy_watch_ms > 0)
                .then(|| Duration::from_millis(config.policy_watch_ms)),
            config: Arc::new(config.clone()),
            following: Arc::default(),
        })
    }

    fn catalog(&self) -> Arc<Catalog> {
        // A swap is one store, so a poisoned lock still holds a whole catalog.
        self.catalog
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes the gateway's tools as listed: when its registry digest changed since the
    /// last update, compiles the schemas, approval gates, acceptance rules and policy
    /// sets for them and swaps them in together. Returns whether anything changed. A
    /// failure keeps what is in force.
    ///
    /// # Errors
    ///
    /// The errors of [`PolicyServer::from_descriptors`] for the new tools.
    pub fn update(&self, listed: ListToolsResponse) -> Result<bool, PolicyError> {
        if !listed.registry_digest.is_empty() && listed.registry_digest == self.catalog().digest {
            return Ok(false);
        }
        let catalog = Catalog::build(&listed.tools, &self.config, listed.registry_digest)?;
        self.profiles.set_tools(listed.tools)?;
        *self.catalog.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(catalog);
        Ok(true)
    }

    /// Follows the gateway's registry until dropped: every `every`, `list` asks for its
    /// tools and [`PolicyServer::update`] takes them. A listing or update that fails is
    /// logged and what is in force stays. From then on, a batch that names a tool policy
    /// does not know also lists them first (at most once per [`MIN_ASKED_REFRESH`]), so
    /// a tool that the orchestrator saw registered before policy did is not refused.
    pub fn follow<L, Listed>(
        &self,
        every: Duration,
        list: L,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        L: Fn() -> Listed + Send + Sync + 'static,
        Listed: Future<Output = Result<ListToolsResponse, tonic::Status>> + Send + 'static,
    {
        let lister: Lister = Arc::new(move || Box::pin(list()));
        let following = Following {
            list: lister,
            listings: tokio::sync::Mutex::new(Listings {
                started: tokio::time::Instant::now(),
                asked: None,
            }),
        };
        if self.following.set(following).is_err() {
            tracing::warn!("policy already follows a gateway; the first one is followed");
        }
        let server = self.clone();
        async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is now: the tools were just listed.
            ticks.tick().await;
            loop {
                ticks.tick().await;
                server.refresh(false).await;
            }
        }
    }

    /// Lists the gateway's tools and takes them; a no-op unless following a gateway.
    /// A batch that `asked` (it names a tool policy does not know) is spared the listing
    /// when one started after it asked (and has ended: the lock is held through it), or
    /// when another batch asked less than [`MIN_ASKED_REFRESH`] ago.
    async fn refresh(&self, asked: bool) {
        let Some(following) = self.following.get() else {
            return;
        };
        let asked_at = tokio::time::Instant::now();
        let mut listings = following.listings.lock().await;
        if asked {
            let recent = listings
                .asked
                .is_some_and(|at| at.elapsed() < MIN_ASKED_REFRESH);
            if listings.started >= asked_at || recent {
                return;
            }
            listings.asked = Some(tokio::time::Instant::now());
        }
        listings.started = tokio::time::Instant::now();
        let updated = match (following.list)().await {
            Ok(listed) => {
                let tools = listed.tools.len();
                let server = self.clone();
                // Compiling schemas and policies is blocking work.
                tokio::task::spawn_blocking(move || server.update(listed))
                    .await
                    .map(|updated| updated.map(|changed| (changed, tools)))
            }
            Err(status) => {
                tracing::warn!(%status, "the tool gateway did not list its tools");
                return;
            }
        };
        match updated {
            Ok(Ok((true, tools))) => tracing::info!(tools, "tool descriptors updated"),
            Ok(Ok((false, _))) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, "tool descriptors refused; the ones in force stay");
            }
            Err(error) => tracing::warn!(%error, "tool descriptor update failed"),
        }
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
        let listed = match (&config.tools_file, &config.tools_endpoint) {
            // Both at once was refused by `validate`.
            (Some(path), _) => ListToolsResponse {
                tools: agentloop_registry::ToolsConfig::load(path)
                    .map_err(|e| PolicyError::ToolsFile {
                        path: path.display().to_string(),
                        detail: e.to_string(),
                    })?
                    .descriptors(),
                registry_digest: String::new(),
            },
            (None, Some(endpoint)) => {
                fetch_tools(
                    endpoint,
                    gateway_client(config)?,
                    config.tools_attempts,
                    Duration::from_millis(config.tools_backoff_ms),
                )
                .await?
            }
            (None, None) => return Err(PolicyError::NoToolSource),
        };
        tracing::info!(tools = listed.tools.len(), "tool descriptors loaded");
        PolicyServer::listed(&listed.tools, config, listed.registry_digest)
    }

    /// [`PolicyServer::follow`] of the gateway `tools_endpoint` names, every
    /// `tools_refresh_ms`; `None` without one (or with a refresh of 0).
    ///
    /// # Errors
    ///
    /// [`PolicyError::ServiceToken`] when the service token cannot be read,
    /// [`PolicyError::ToolsUnavailable`] for an endpoint that is not a URL.
    pub async fn follow_gateway(
        &self,
    ) -> Result<Option<impl Future<Output = ()> + Send + 'static>, PolicyError> {
        let config = &self.config;
        let (Some(endpoint), 1..) = (&config.tools_endpoint, config.tools_refresh_ms) else {
            return Ok(None);
        };
        let client = gateway_client(config)?
            .with_lazy(true)
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Some(Duration::from_secs(10)));
        let transport = agentloop_proto::client::connect(endpoint, client)
            .await
            .map_err(|error| PolicyError::ToolsUnavailable {
                endpoint: endpoint.clone(),
                attempts: 0,
                detail: with_sources(&error),
            })?;
        let gateway = agentloop_proto::client::tool_gateway(transport);
        Ok(Some(self.follow(
            Duration::from_millis(config.tools_refresh_ms),
            move || {
                let mut gateway = gateway.clone();
                async move {
                    gateway
                        .list_tools(ListToolsRequest::default())
                        .await
                        .map(tonic::Response::into_inner)
                }
            },
        )))
    }

    /// The catalog in force, first brought up to date when `tools` names one it does
    /// not know (see [`PolicyServer::follow`]).
    async fn knowing<'a>(&self, mut tools: impl Iterator<Item = &'a str>) -> Arc<Catalog> {
        let catalog = self.catalog();
        if tools.any(|tool| !catalog.tools.knows(tool)) {
            self.refresh(true).await;
            return self.catalog();
        }
        catalog
    }

    /// Judges a batch in the engine's terms; see [`ToolPolicy::evaluate`]. The embedded
    /// runtime's path: nothing of it is a wire message.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a malformed batch.
    pub async fn judge(&self, proposal: &Proposal<'_>) -> Result<Judgement, PolicyError> {
        let catalog = self
            .knowing(proposal.calls.iter().map(|c| c.tool.as_str()))
            .await;
        let policies = self.profiles.get(proposal.profile);
        catalog.tools.evaluate(proposal, &policies)
    }

    /// `Evaluate` without the gRPC wrapping; see [`ToolPolicy::evaluate_request`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a malformed request.
    pub fn evaluate(&self, request: EvaluateRequest) -> Result<EvaluateResponse, PolicyError> {
        let policies = self.profiles.get(&request.profile);
        self.catalog().tools.evaluate_request(request, &policies)
    }

    /// Runs `profile`'s acceptance rules on a claim in the domain's terms; see
    /// [`AcceptanceRules::judge`]. The embedded runtime's path.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a claim beyond its bounds.
    pub fn accept(
        &self,
        profile: &str,
        claim: &agentloop_effects::Claim,
    ) -> Result<agentloop_effects::Acceptance, PolicyError> {
        self.catalog().acceptance.judge(profile, claim)
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
        self.catalog().acceptance.validate(request)
    }
}

#[tonic::async_trait]
impl PolicyService for PolicyServer {
    async fn evaluate(
        &self,
        request: tonic::Request<EvaluateRequest>,
    ) -> Result<tonic::Response<EvaluateResponse>, tonic::Status> {
        let request = request.into_inner();
        self.knowing(request.calls.iter().map(|c| c.tool.as_str()))
            .await;
        PolicyServer::evaluate(self, request)
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
    let follower = match server.follow_gateway().await {
        Ok(follower) => follower.map(tokio::spawn),
        Err(error) => {
            tracing::error!(%error, "cannot follow the tool gateway; its tools at start stay");
            None
        }
    };
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::policy(server), &access);
    let served = agentloop_server::serve(listener, services, shutdown).await;
    watcher.abort();
    if let Some(follower) = follower {
        follower.abort();
    }
    served
}
