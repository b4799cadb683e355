//! `agentloop-stack`: the services of agentloop wired into one deployment, in one place.
//!
//! Two wirings, the same services:
//! - [`Wiring::Embedded`]: one process, one port. The orchestrator reaches decision,
//!   policy, the tool gateway and the effect ledger in-process, and the gateway reaches
//!   the demo executor in-process; the port serves the orchestrator's public API alone
//!   (with health and reflection), so nothing internal is reachable from outside.
//!   This is `agentloop run`, `demo` and `dev`: no Redis, no PostgreSQL, no other server.
//! - [`Wiring::Distributed`]: each service is its own gRPC server on a loopback port of
//!   this process and reaches the others over gRPC with the shared client settings,
//!   exactly as when each runs as its own binary. Each internal service accepts only its
//!   callers, by service tokens generated at start: the orchestrator's for decision,
//!   policy, the gateway and the ledger, the gateway's for the executor.
//!
//! The CLI, `agentloop bench` and the end-to-end tests start a [`Stack`]; tests that run
//! their own orchestrator workers (over PostgreSQL and Redis) start only the
//! [`Services`] an orchestrator reaches. No other crate wires the services.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop_auth::{Authenticator, Callers};
use agentloop_decision::{DecisionServer, Model};
use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_ledger::{LedgerConfig, LedgerService};
use agentloop_orchestrator::{Api, OrchestratorConfig};
use agentloop_policy::{PolicyConfig, PolicyServer, Profiles};
use agentloop_proto::client::{ClientConfig, Transport, connect};
use agentloop_proto::server;
use agentloop_proto::server::ToolExecutor;
use agentloop_proto::v1 as pb;
use agentloop_runtime::{Ports, Runtime, Workers};
use agentloop_server::{Access, ServeError, ServiceSet};
use agentloop_store::{EventStore, SqliteStore, StoreError};
use agentloop_telemetry::Telemetry;
use agentloop_tools::{Gateway, GatewayLimits, ToolsConfig, VerifierEntry};
use agentloop_wire as wire;
use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use uuid::Uuid;

mod in_process;
pub use in_process::{InProcessDecision, InProcessLedger, InProcessPolicy, InProcessTools};

/// The caller name under which the distributed gateway admits a registrar (its token is
/// [`ServiceTokens::registrar`]).
pub const REGISTRAR: &str = "registrar";

/// The effect ledger's directory inside the data directory.
pub const LEDGER_DIR: &str = "ledger";
/// The demo executor's directory inside the data directory.
pub const DEMO_EXECUTOR_DIR: &str = "demo-executor";
/// The endpoint name under which the embedded gateway finds the in-process demo executor.
/// It is never dialled: the gateway routes its tools to the executor in memory.
const IN_PROCESS_EXECUTOR: &str = "http://demo-executor.in-process.localhost";

/// The tools an embedded stack registers when it is given no tool registry: the demo
/// executor's. `agentloop policy` judges policies against these too, so a policy set
/// checked without `--tools` is checked for the tools `run` registers without it.
///
/// # Errors
///
/// When the demo executor's descriptors do not make a valid registry (a bug).
pub fn demo_tools() -> anyhow::Result<ToolsConfig> {
    demo_tools_at(IN_PROCESS_EXECUTOR)
}

/// The policy service over the gateway's tools, and its watcher, which for as long as
/// the handle lives reloads the policy files when they change (not on SIGHUP: in the CLI
/// that means its terminal closed) and follows the gateway's registry every
/// `tools_refresh_ms`.
fn policy_service(
    gateway: &Gateway,
    config: &PolicyConfig,
) -> anyhow::Result<(PolicyServer, AbortOnDropHandle<()>)> {
    let policy = PolicyServer::from_listed(&gateway.list(), config)?;
    let files = policy.watch(false);
    let follow = (config.tools_refresh_ms > 0).then(|| {
        let gateway = gateway.clone();
        policy.follow(
            std::time::Duration::from_millis(config.tools_refresh_ms),
            move || std::future::ready(Ok(gateway.list())),
        )
    });
    let watch = AbortOnDropHandle::new(tokio::spawn(async move {
        match follow {
            Some(follow) => {
                tokio::join!(files, follow);
            }
            None => files.await,
        }
    }));
    Ok((policy, watch))
}

/// The demo executor's tools and verifier, all served at `endpoint`.
fn demo_tools_at(endpoint: &str) -> anyhow::Result<ToolsConfig> {
    let mut tools =
        ToolsConfig::from_descriptors(endpoint, agentloop_demo_executor::descriptors())?;
    tools.verifiers = agentloop_demo_executor::verifiers()
        .into_iter()
        .map(|v| VerifierEntry::new(v.name, endpoint, v.description))
        .collect();
    Ok(tools)
}

/// How the services reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wiring {
    /// One process, in-process ports, every service on one port.
    Embedded,
    /// Every service its own gRPC server on a loopback port, reached over gRPC.
    Distributed,
}

/// What the services an orchestrator reaches are started with.
#[derive(Debug, Clone)]
pub struct ServicesOptions {
    /// Holds the demo executor's record ([`DEMO_EXECUTOR_DIR`]) and the SQLite ledger
    /// ([`LEDGER_DIR`]).
    pub data_dir: PathBuf,
    /// A tool registry; without it, the demo executor's tools.
    pub tools: Option<ToolsConfig>,
    /// Verifiers registered beside the registry's (tests add ones they serve).
    pub verifiers: Vec<VerifierEntry>,
    /// Per-tool timeouts (ms) that replace the demo executor's own (tests shorten
    /// `transfer`'s to see late replies).
    pub demo_timeouts_ms: BTreeMap<String, u64>,
    /// The demo executor's configuration; its `data_dir` is [`DEMO_EXECUTOR_DIR`] of
    /// `data_dir` and its `listen` is not used.
    pub demo: DemoConfig,
    /// The gateway's limits.
    pub gateway: GatewayLimits,
    /// The policy service's configuration: its `[policies]` per profile and approval
    /// gates (its tool source and `listen` are not used).
    pub policy: PolicyConfig,
    /// The ledger's configuration: with `database_url`, PostgreSQL; otherwise its
    /// `data_dir` is [`LEDGER_DIR`] of `data_dir`. Its `listen` is not used.
    pub ledger: LedgerConfig,
    /// The model for invocations started without a script; `None`: they end
    /// `model_error`.
    pub model: Option<Arc<dyn Model>>,
    /// What each service records its spans and metrics with.
    pub telemetry: ServiceTelemetry,
}

/// The telemetry of each service, as each would have its own in its own process: a test
/// gives each an exporter under its own `service.name` and reads each one's metrics.
/// [`ServiceTelemetry::shared`] gives them all one (a process's, embedded).
#[derive(Debug, Clone)]
pub struct ServiceTelemetry {
    /// The decision service's.
    pub decision: Telemetry,
    /// The policy service's.
    pub policy: Telemetry,
    /// The tool gateway's.
    pub tools: Telemetry,
    /// The effect ledger's.
    pub ledger: Telemetry,
    /// The demo executor's.
    pub demo_executor: Telemetry,
}

impl ServiceTelemetry {
    /// `telemetry` for every service.
    pub fn shared(telemetry: &Telemetry) -> ServiceTelemetry {
        ServiceTelemetry {
            decision: telemetry.clone(),
            policy: telemetry.clone(),
            tools: telemetry.clone(),
            ledger: telemetry.clone(),
            demo_executor: telemetry.clone(),
        }
    }
}

impl ServicesOptions {
    /// The defaults over `data_dir`: the demo tools, default limits, no model, the
    /// process's telemetry.
    pub fn new(data_dir: PathBuf) -> ServicesOptions {
        ServicesOptions {
            data_dir,
            tools: None,
            verifiers: Vec::new(),
            demo_timeouts_ms: BTreeMap::new(),
            demo: DemoConfig::default(),
            gateway: GatewayLimits::default(),
            policy: PolicyConfig::default(),
            ledger: LedgerConfig::default(),
            model: None,
            telemetry: ServiceTelemetry::shared(&agentloop_server::process_telemetry()),
        }
    }
}

/// The service tokens of the distributed wiring, generated at start.
#[derive(Clone)]
pub struct ServiceTokens {
    /// The orchestrator's, which decision, policy, the gateway and the ledger accept.
    pub orchestrator: String,
    /// The tool gateway's, which the demo executor accepts.
    pub tools: String,
    /// A registrar's, which the gateway accepts for `RegisterExecutor` and
    /// `DeregisterExecutor` alone ([`REGISTRAR`]).
    pub registrar: String,
}

impl std::fmt::Debug for ServiceTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceTokens(REDACTED)")
    }
}

impl ServiceTokens {
    fn generate() -> ServiceTokens {
        let token = || {
            let bytes: [u8; 32] = rand::random();
            hex::encode(bytes)
        };
        ServiceTokens {
            orchestrator: token(),
            tools: token(),
            registrar: token(),
        }
    }
}

/// Where each service is served, in the distributed wiring.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The decision service.
    pub decision: String,
    /// The policy service.
    pub policy: String,
    /// The tool gateway.
    pub tools: String,
    /// The effect ledger.
    pub ledger: String,
    /// The demo executor.
    pub demo_executor: String,
    /// What each caller presents.
    pub tokens: ServiceTokens,
}

/// How the services are reached, by wiring.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per running stack, never moved on a hot path"
)]
enum Reached {
    /// Embedded: in-process, through the ports alone.
    InProcess,
    /// Distributed: each service's own server, and where it listens.
    Served {
        endpoints: Endpoints,
        stop: CancellationToken,
        servers: Vec<JoinHandle<Result<(), ServeError>>>,
    },
}

/// The services an orchestrator reaches (decision, policy, tool gateway, effect ledger)
/// and the demo executor, running.
#[derive(Debug)]
pub struct Services {
    demo: DemoExecutor,
    ports: Ports,
    reached: Reached,
    policies: Arc<Profiles>,
    /// Reloads the policies when their files change, for as long as the services run.
    _policy_watch: AbortOnDropHandle<()>,
    /// Counts the ledger's unresolved effects for its metrics.
    _ledger_count: AbortOnDropHandle<()>,
}

impl Services {
    /// Starts the services, wired as asked.
    ///
    /// # Errors
    ///
    /// When a configuration is invalid, a store cannot be opened or a port cannot be bound.
    pub async fn start(wiring: Wiring, options: ServicesOptions) -> anyhow::Result<Services> {
        let demo = DemoExecutor::open(DemoConfig {
            data_dir: options.data_dir.join(DEMO_EXECUTOR_DIR),
            ..options.demo
        })?;
        let ledger_config = LedgerConfig {
            data_dir: options.data_dir.join(LEDGER_DIR),
            ..options.ledger
        };
        let telemetry = options.telemetry;
        let ledger =
            LedgerService::new(ledger_config.open_store().await?).with_telemetry(&telemetry.ledger);
        let ledger_count = AbortOnDropHandle::new(tokio::spawn(
            ledger.clone().keep_counting(agentloop_ledger::COUNT_EVERY),
        ));
        let decision = DecisionServer::new(options.model).with_telemetry(&telemetry.decision);
        let tools_for = |endpoint: &str| -> anyhow::Result<ToolsConfig> {
            let mut tools = match &options.tools {
                Some(tools) => tools.clone(),
                None => demo_tools_at(endpoint)?,
            };
            if options.tools.is_none() {
                for tool in &mut tools.tools {
                    if let Some(&timeout_ms) = options.demo_timeouts_ms.get(&tool.name) {
                        tool.timeout_ms = timeout_ms;
                    }
                }
            }
            tools.verifiers.extend(options.verifiers.iter().cloned());
            Ok(tools)
        };
        match wiring {
            Wiring::Embedded => {
                let tools = tools_for(IN_PROCESS_EXECUTOR)?;
                let executor: Arc<ToolExecutor> = Arc::new(demo.clone());
                let gateway = Gateway::with_in_process(
                    tools,
                    options.gateway,
                    vec![(IN_PROCESS_EXECUTOR.to_owned(), executor)],
                    ClientConfig::default(),
                )
                .await?
                .with_telemetry(&telemetry.tools);
                let (policy, policy_watch) = policy_service(&gateway, &options.policy)?;
                let policies = Arc::clone(policy.profiles());
                let ports = Ports {
                    decision: Arc::new(InProcessDecision(decision)),
                    policy: Arc::new(InProcessPolicy(policy)),
                    tools: Arc::new(InProcessTools::new(gateway)),
                    ledger: Arc::new(InProcessLedger(ledger)),
                };
                Ok(Services {
                    demo,
                    ports,
                    reached: Reached::InProcess,
                    policies,
                    _policy_watch: policy_watch,
                    _ledger_count: ledger_count,
                })
            }
            Wiring::Distributed => {
                let stop = CancellationToken::new();
                let mut servers = Vec::new();
                let mut serve = |listener, services| {
                    servers.push(tokio::spawn(agentloop_server::serve(
                        listener,
                        services,
                        stop.clone().cancelled_owned(),
                    )));
                };
                let tokens = ServiceTokens::generate();
                let accept = |name: &str, token: &str| -> anyhow::Result<Access> {
                    Ok(Access {
                        callers: Some(Callers::from_tokens([(name.to_owned(), token.to_owned())])?),
                        tls: None,
                    })
                };
                let orchestrator = accept("orchestrator", &tokens.orchestrator)?;
                let gateway_caller = accept("tools", &tokens.tools)?;
                // The gateway also admits a registrar, which may register executors and
                // call nothing else.
                let gateway_access = Access {
                    callers: Some(Callers::from_tokens([
                        ("orchestrator".to_owned(), tokens.orchestrator.clone()),
                        (REGISTRAR.to_owned(), tokens.registrar.clone()),
                    ])?),
                    tls: None,
                };
                let (listener, demo_executor) = listen("127.0.0.1:0").await?;
                serve(
                    listener,
                    ServiceSet::new()
                        .telemetry(&telemetry.demo_executor)
                        .add_for(server::tool_executor(demo.clone()), &gateway_caller),
                );
                let tools = tools_for(&demo_executor)?;
                let as_gateway = ClientConfig::default().with_bearer(Some(&tokens.tools))?;
                let gateway =
                    Gateway::with_in_process(tools, options.gateway, Vec::new(), as_gateway)
                        .await?
                        .with_telemetry(&telemetry.tools)
                        .with_registrars(vec![REGISTRAR.to_owned()]);
                let (policy, policy_watch) = policy_service(&gateway, &options.policy)?;
                let policies = Arc::clone(policy.profiles());
                let (listener, tools) = listen("127.0.0.1:0").await?;
                serve(
                    listener,
                    ServiceSet::new()
                        .telemetry(&telemetry.tools)
                        .add_for(server::tool_gateway(gateway), &gateway_access),
                );
                let (listener, policy_endpoint) = listen("127.0.0.1:0").await?;
                serve(
                    listener,
                    ServiceSet::new()
                        .telemetry(&telemetry.policy)
                        .add_for(server::policy(policy), &orchestrator),
                );
                let (listener, decision_endpoint) = listen("127.0.0.1:0").await?;
                serve(
                    listener,
                    ServiceSet::new()
                        .telemetry(&telemetry.decision)
                        .add_for(server::decision(decision), &orchestrator),
                );
                let (listener, ledger_endpoint) = listen("127.0.0.1:0").await?;
                serve(
                    listener,
                    ServiceSet::new()
                        .telemetry(&telemetry.ledger)
                        .add_for(server::effect_ledger(ledger), &orchestrator),
                );
                let as_orchestrator = Some(tokens.orchestrator.as_str());
                let ports = agentloop_orchestrator::grpc::ports(
                    channel_as(&decision_endpoint, as_orchestrator).await?,
                    channel_as(&policy_endpoint, as_orchestrator).await?,
                    channel_as(&tools, as_orchestrator).await?,
                    channel_as(&ledger_endpoint, as_orchestrator).await?,
                );
                let endpoints = Endpoints {
                    decision: decision_endpoint,
                    policy: policy_endpoint,
                    tools,
                    ledger: ledger_endpoint,
                    demo_executor,
                    tokens,
                };
                Ok(Services {
                    demo,
                    ports,
                    reached: Reached::Served {
                        endpoints,
                        stop,
                        servers,
                    },
                    policies,
                    _policy_watch: policy_watch,
                    _ledger_count: ledger_count,
                })
            }
        }
    }

    /// The ports an orchestrator reaches these services through.
    pub fn ports(&self) -> Ports {
        self.ports.clone()
    }

    /// Where each service is served: `Some` in the distributed wiring.
    pub fn endpoints(&self) -> Option<&Endpoints> {
        match &self.reached {
            Reached::InProcess => None,
            Reached::Served { endpoints, .. } => Some(endpoints),
        }
    }

    /// The demo executor (its counters show what it applied).
    pub fn demo_executor(&self) -> &DemoExecutor {
        &self.demo
    }

    /// The policy sets in force (a test reloads them after changing their files).
    pub fn policies(&self) -> &Arc<Profiles> {
        &self.policies
    }

    /// Stops the servers of the distributed wiring, gracefully.
    ///
    /// # Errors
    ///
    /// When a server failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Reached::Served { stop, servers, .. } = self.reached {
            stop.cancel();
            for server in servers {
                server.await.context("a service's server task failed")??;
            }
        }
        Ok(())
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// How the services reach each other.
    pub wiring: Wiring,
    /// Where the orchestrator is served (`127.0.0.1:0` for any free port).
    pub listen: String,
    /// The orchestrator's configuration, `auth` included; its event store is SQLite in
    /// the services' `data_dir` (its own `data_dir` and `listen` are replaced).
    pub orchestrator: OrchestratorConfig,
    /// The other services.
    pub services: ServicesOptions,
    /// What the orchestrator records its spans and metrics with.
    pub telemetry: Telemetry,
}

impl StackOptions {
    /// The embedded default of `run` and `demo`: any free loopback port, the demo tools.
    pub fn embedded(data_dir: PathBuf) -> StackOptions {
        StackOptions {
            wiring: Wiring::Embedded,
            listen: "127.0.0.1:0".into(),
            orchestrator: OrchestratorConfig::default(),
            services: ServicesOptions::new(data_dir),
            telemetry: agentloop_server::process_telemetry(),
        }
    }
}

/// A running deployment.
#[derive(Debug)]
pub struct Stack {
    endpoint: String,
    /// Where the HTTP/JSON API is served, if it is.
    http: Option<SocketAddr>,
    runtime: Runtime,
    api: Api,
    store: SqliteStore,
    services: Services,
    stop: CancellationToken,
    server: JoinHandle<Result<(), ServeError>>,
    http_server: Option<JoinHandle<std::io::Result<()>>>,
    /// Held for the stack's life: one process per data directory.
    _lock: File,
}

impl Stack {
    /// Opens the data directory, starts every service and resumes invocations that a
    /// previous run left unfinished.
    ///
    /// # Errors
    ///
    /// When the data directory is in use or cannot be opened, a configuration is invalid
    /// or a port cannot be bound.
    pub async fn start(options: StackOptions) -> anyhow::Result<Stack> {
        let data_dir = options.services.data_dir.clone();
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
        let lock = lock(&data_dir)?;
        let telemetry = options.telemetry;
        let (listener, endpoint) = listen(&options.listen).await?;
        let services = Services::start(options.wiring, options.services).await?;
        let store = SqliteStore::open_in(&data_dir).await?;
        let config = OrchestratorConfig {
            data_dir,
            ..options.orchestrator
        };
        let auth = Authenticator::from_config(&config.server.auth).await?;
        let auth_on = auth.is_some();
        let workers = Workers::in_process(&config.workers);
        let runtime = Runtime::new(
            config.runtime(),
            Arc::new(store.clone()),
            services.ports(),
            workers,
            telemetry.clone(),
        );
        // The public port: the orchestrator's API alone, whatever the wiring.
        let api = Api::new(runtime.clone(), auth);
        let drained = runtime.clone();
        let grpc = server::orchestrator(api.clone());
        let served = ServiceSet::new()
            .telemetry(&telemetry)
            .add(grpc.clone())
            .drain(async move { drained.shutdown().await });
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        // The same API as HTTP/JSON, where the configuration says.
        let (http, http_server) = match config.http_listen {
            Some(address) => {
                let listener = TcpListener::bind(address)
                    .await
                    .with_context(|| format!("cannot serve HTTP on {address}"))?;
                let bound = listener.local_addr()?;
                let card = config.a2a.card(auth_on);
                let gateway = agentloop_orchestrator::http_api(grpc, &telemetry, card)?;
                let stopped = stop.clone();
                let task = tokio::spawn(agentloop_http::serve(listener, gateway, async move {
                    stopped.cancelled().await;
                }));
                (Some(bound), Some(task))
            }
            None => (None, None),
        };
        let server = tokio::spawn(agentloop_server::serve(listener, served, async move {
            stopped.cancelled().await;
        }));
        runtime.resume().await?;
        Ok(Stack {
            endpoint,
            http,
            runtime,
            api,
            store,
            services,
            stop,
            server,
            http_server,
            _lock: lock,
        })
    }

    /// `http://127.0.0.1:PORT`: the orchestrator.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Where each internal service is served: `Some` in the distributed wiring.
    pub fn endpoints(&self) -> Option<&Endpoints> {
        self.services.endpoints()
    }

    /// `http://127.0.0.1:PORT`: the HTTP/JSON API, when the orchestrator's
    /// `http_listen` asked for it.
    pub fn http_endpoint(&self) -> Option<String> {
        self.http.map(|address| format!("http://{address}"))
    }

    /// The in-process runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The orchestrator's public API as the port serves it (authenticated as configured),
    /// for callers in this process.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The orchestrator's event store.
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// The demo executor (its counters show what it applied).
    pub fn demo_executor(&self) -> &DemoExecutor {
        self.services.demo_executor()
    }

    /// The policy sets in force.
    pub fn policies(&self) -> &Arc<Profiles> {
        self.services.policies()
    }

    /// Graceful stop: in-flight turns commit, running invocations park, the servers
    /// drain, the event store closes.
    ///
    /// # Errors
    ///
    /// When a server failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        let served = self.server.await.context("the server task failed");
        if let Some(http) = self.http_server {
            http.await.context("the HTTP server task failed")??;
        }
        let services = self.services.stop().await;
        self.store.close().await;
        served??;
        services
    }
}

/// Binds `address`; the endpoint a client dials.
async fn listen(address: &str) -> anyhow::Result<(TcpListener, String)> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    Ok((listener, endpoint))
}

/// The channel every part of a stack reaches a service with: lazy (the service may start
/// after its caller) and without a request timeout (watches last as long as their
/// invocation). The bench's client and the tests' clients use it too.
///
/// # Errors
///
/// When `endpoint` is not a URL the client factory accepts.
pub async fn channel(endpoint: &str) -> anyhow::Result<Transport> {
    channel_as(endpoint, None).await
}

/// [`channel`], its calls carrying `token` (a caller's JWT, a service token).
///
/// # Errors
///
/// As [`channel`], and when `token` cannot be a header value.
pub async fn channel_as(endpoint: &str, token: Option<&str>) -> anyhow::Result<Transport> {
    let config = ClientConfig::default()
        .with_lazy(true)
        .with_request_timeout(None)
        .with_bearer(token)?;
    Ok(connect(endpoint, config).await?)
}

/// One embedded process per data directory: a second one would interleave writes to the
/// demo executor's record and run the same invocations twice on resume.
fn lock(data_dir: &Path) -> anyhow::Result<File> {
    let path = data_dir.join(".lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "the data directory {} is in use by another agentloop process (use --data-dir)",
            data_dir.display()
        ),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Which committed invocations a replay reads.
#[derive(Debug, Clone)]
pub enum Replaying {
    /// These, in this order.
    Ids(Vec<String>),
    /// Every invocation created at or after this instant (all of them for none), newest
    /// first, at most this many.
    All {
        /// The earliest creation.
        since: Option<agentloop_engine::UnixMillis>,
        /// The most invocations read.
        limit: usize,
    },
}

/// Replays committed invocations against the tools, policies and acceptance rules
/// `services` names, as an embedded stack would judge them today
/// ([`agentloop_runtime::replay`]). The log is the PostgreSQL database at `database_url`
/// (a deployment's), or else the embedded data directory `services.data_dir`'s; the
/// ledger is `services.ledger`'s. The log and the ledger are read; no tool runs, no
/// verifier is asked and nothing is written. It needs no lock: the orchestrators, or a
/// running `dev`, may go on writing.
///
/// # Errors
///
/// When the directory holds no agentloop data, an ID is not an invocation's, or the
/// store, the ledger or the configuration fails.
pub async fn replay(
    services: ServicesOptions,
    database_url: Option<&str>,
    replaying: Replaying,
) -> anyhow::Result<Vec<agentloop_runtime::replay::Replayed>> {
    let store: Arc<dyn EventStore> = match database_url {
        Some(url) => Arc::new(
            agentloop_store::PgStore::connect(agentloop_store::PgOptions::new(url.to_owned()))
                .await?,
        ),
        None => {
            let data_dir = &services.data_dir;
            if !data_dir.join(agentloop_store::DATABASE_FILE).exists() {
                bail!(
                    "no agentloop data in {} (use --data-dir, or --database-url)",
                    data_dir.display()
                );
            }
            Arc::new(SqliteStore::open_in(data_dir).await?)
        }
    };
    let ids = match replaying {
        Replaying::Ids(ids) => ids
            .iter()
            .map(|id| {
                Uuid::parse_str(id).with_context(|| format!("{id:?} is not an invocation ID"))
            })
            .collect::<anyhow::Result<Vec<Uuid>>>()?,
        Replaying::All { since, limit } => {
            let mut ids = Vec::new();
            let mut before = None;
            while ids.len() < limit {
                let page = store
                    .list(agentloop_store::ListRequest {
                        limit: agentloop_store::MAX_PAGE_SIZE,
                        before,
                        created_from: since,
                        ..Default::default()
                    })
                    .await?;
                let Some(last) = page.last() else { break };
                before = Some(last.invocation_id);
                ids.extend(page.iter().map(|record| record.invocation_id));
            }
            ids.truncate(limit);
            ids
        }
    };
    let services = Services::start(Wiring::Embedded, services).await?;
    let ports = services.ports();
    let mut replayed = Vec::with_capacity(ids.len());
    for id in ids {
        let one = agentloop_runtime::replay::replay(
            store.as_ref(),
            ports.policy.as_ref(),
            ports.ledger.as_ref(),
            id,
        )
        .await
        .with_context(|| format!("invocation {id}"))?;
        replayed.push(one);
    }
    Ok(replayed)
}

/// The committed events of an invocation in an embedded data directory.
///
/// # Errors
///
/// When `id` is not an invocation ID, the directory holds no agentloop data or no such
/// invocation, or the store cannot be read.
pub async fn read_events(data_dir: &Path, id: &str) -> anyhow::Result<Vec<pb::Event>> {
    let invocation_id =
        Uuid::parse_str(id).with_context(|| format!("{id:?} is not an invocation ID"))?;
    if !data_dir.join(agentloop_store::DATABASE_FILE).exists() {
        bail!(
            "no agentloop data in {} (use --data-dir or --server)",
            data_dir.display()
        );
    }
    let store = SqliteStore::open_in(data_dir).await?;
    let mut events = Vec::new();
    let mut from = 1;
    loop {
        let page = match store.events(invocation_id, from, 1_000).await {
            Ok(page) => page,
            Err(StoreError::NotFound(_)) => bail!("no invocation {id} in {}", data_dir.display()),
            Err(error) => return Err(error.into()),
        };
        let Some(last) = page.last() else { break };
        from = last.event.seq + 1;
        events.extend(
            page.iter()
                .map(|stored| wire::event(id, stored.committed_at, &stored.event)),
        );
    }
    Ok(events)
}
