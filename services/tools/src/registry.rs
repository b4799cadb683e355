//! The registry the gateway routes by, and how it stays current.
//!
//! Tools and verifiers come from three sources: the registry file's hand-written
//! `[[tools]]` and `[[verifiers]]` (fixed for the process's life), its `[[executors]]`
//! (registered by endpoint, described by the gateway) and `RegisterExecutor` calls. Each
//! change builds a whole new [`Registry`] and swaps it in, so a call sees one consistent
//! version from start to end, and no call waits for a registration.
//!
//! A name belongs to whoever registered it first: hand-written entries, then executors
//! in the order they registered. A description that claims a name someone else holds is
//! refused whole, and the executor keeps what it had.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use agentloop_proto::client::{self, ClientConfig, Transport};
use agentloop_proto::server::ToolExecutor;
use agentloop_proto::v1::tool_executor_service_client::ToolExecutorServiceClient;
use agentloop_proto::v1::tool_executor_service_server::SERVICE_NAME;
use agentloop_proto::v1::{DescribeRequest, ToolDescriptor};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, Semaphore};
use tonic::Request;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use agentloop_mcp::{Health, McpExecutor};

use crate::config::{ConfigError, MAX_EXECUTORS, ToolEntry, ToolsConfig, VerifierEntry};
use crate::error::GatewayError;

/// How the gateway reaches one executor endpoint.
#[expect(
    clippy::large_enum_variant,
    reason = "one per executor endpoint, held behind an Arc"
)]
pub(crate) enum Route {
    /// A lazily connected transport (cheap to clone, multiplexed), and the same
    /// transport's health client.
    Grpc {
        client: ToolExecutorServiceClient<Transport>,
        health: HealthClient<Transport>,
    },
    /// The executor's service implementation, in this process.
    InProcess(Arc<ToolExecutor>),
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Grpc { client, .. } => f.debug_tuple("Grpc").field(client).finish(),
            Route::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

/// What is known of an executor's `ExecuteStage`.
const STAGES_UNKNOWN: u8 = 0;
const STAGES_SERVED: u8 = 1;
const STAGES_NOT_SERVED: u8 = 2;

/// One executor endpoint: its route, its concurrency slots and whether it answers.
#[derive(Debug)]
pub(crate) struct Executor {
    pub(crate) endpoint: String,
    pub(crate) route: Route,
    pub(crate) slots: Arc<Semaphore>,
    /// Cleared when a call cannot connect or a health check fails, set again when a
    /// health check passes: while it is clear, calls answer `unavailable` at once
    /// instead of waiting for a connection that will not come.
    up: AtomicBool,
    /// Whether it serves `ExecuteStage`: [`STAGES_UNKNOWN`] until it answers one, and
    /// again each time it comes back (it may have been replaced by another version).
    stages: AtomicU8,
    /// The health an in-process executor reports of what is behind it (an MCP server's
    /// connection); `None`: an in-process executor is always up.
    reports: Option<Arc<McpExecutor>>,
}

impl Executor {
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Whether a stage of its calls may go to it as one `ExecuteStage`: unless it
    /// answered one that it does not serve them.
    pub(crate) fn serves_stages(&self) -> bool {
        self.stages.load(Ordering::Relaxed) != STAGES_NOT_SERVED
    }

    /// Whether it has answered an `ExecuteStage` since it last came back.
    pub(crate) fn knows_stages(&self) -> bool {
        self.stages.load(Ordering::Relaxed) != STAGES_UNKNOWN
    }

    /// Records whether it answered an `ExecuteStage` (`false`: UNIMPLEMENTED).
    pub(crate) fn set_serves_stages(&self, serves: bool) {
        let stages = if serves {
            STAGES_SERVED
        } else {
            tracing::info!(endpoint = %self.endpoint, "executor serves no stages: its calls go one by one");
            STAGES_NOT_SERVED
        };
        self.stages.store(stages, Ordering::Relaxed);
    }

    /// Records what a call or a health check found; `true` when it changed.
    pub(crate) fn set_up(&self, up: bool) -> bool {
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                self.stages.store(STAGES_UNKNOWN, Ordering::Relaxed);
                tracing::info!(endpoint = %self.endpoint, "executor is available again");
            } else {
                tracing::warn!(endpoint = %self.endpoint, "executor is unavailable");
            }
        }
        was != up
    }

    /// Asks the executor's health service about the executor contract (or, if it does
    /// not report that service, about the server as a whole). An executor without a
    /// health service counts as up when it answers at all.
    async fn probe(&self, timeout: Duration) -> bool {
        let Route::Grpc { health, .. } = &self.route else {
            // An MCP server still connecting is not known to be down (its first
            // connection is under way, and its calls say so themselves meanwhile).
            return self
                .reports
                .as_ref()
                .is_none_or(|mcp| !matches!(mcp.health(), Health::Down { .. } | Health::Stopped));
        };
        for service in [SERVICE_NAME, ""] {
            let mut request = Request::new(HealthCheckRequest {
                service: service.to_owned(),
            });
            request.set_timeout(timeout);
            let answer = tokio::time::timeout(timeout, health.clone().check(request)).await;
            match answer {
                Ok(Ok(response)) => {
                    return response.into_inner().status == ServingStatus::Serving as i32;
                }
                Ok(Err(status)) if status.code() == tonic::Code::NotFound => {}
                Ok(Err(status)) => return status.code() == tonic::Code::Unimplemented,
                Err(_elapsed) => return false,
            }
        }
        false
    }

    /// The executor's `Describe`, as a registry of its endpoint.
    async fn describe(&self, timeout: Duration) -> Result<ToolsConfig, GatewayError> {
        let unreachable = |detail: String| GatewayError::Describe {
            endpoint: self.endpoint.clone(),
            detail,
        };
        let mut request = Request::new(DescribeRequest {});
        request.set_timeout(timeout);
        let answer = match &self.route {
            Route::Grpc { client, .. } => {
                tokio::time::timeout(timeout, client.clone().describe(request)).await
            }
            Route::InProcess(service) => {
                tokio::time::timeout(timeout, service.describe(request)).await
            }
        };
        let described = answer
            .map_err(|_| unreachable(format!("Describe took longer than {timeout:?}")))?
            .map_err(|status| unreachable(format!("Describe failed: {}", status.message())))?
            .into_inner();
        ToolsConfig::from_describe(&self.endpoint, described).map_err(|source| {
            GatewayError::InvalidDescription {
                endpoint: self.endpoint.clone(),
                source,
            }
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Tool {
    pub(crate) entry: ToolEntry,
    pub(crate) descriptor: ToolDescriptor,
    /// The descriptor's digest, read once here so that each call compares it with the
    /// one it was planned under without writing it out.
    pub(crate) digest: Option<agentloop_engine::ToolDigest>,
    pub(crate) executor: Arc<Executor>,
}

/// A verifier shares its executor (channel and slots) with the tools at its endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Verifier {
    pub(crate) entry: VerifierEntry,
    pub(crate) executor: Arc<Executor>,
}

/// One version of the registry: every routable tool and verifier.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) tools: BTreeMap<String, Tool>,
    pub(crate) verifiers: BTreeMap<String, Verifier>,
    /// `ListToolsResponse.registry_digest`: of every tool's digest, in name order.
    pub(crate) digest: String,
}

impl Registry {
    /// The descriptors of `tools`, each marked unavailable while its executor is.
    pub(crate) fn listed<'a>(tools: impl Iterator<Item = &'a Tool>) -> Vec<ToolDescriptor> {
        tools
            .map(|tool| ToolDescriptor {
                unavailable: !tool.executor.is_up(),
                ..tool.descriptor.clone()
            })
            .collect()
    }
}

/// An executor registered by endpoint, with what it described last.
#[derive(Debug)]
struct Described {
    endpoint: String,
    /// Named by the registry file: it cannot be deregistered, only described again.
    configured: bool,
    /// Its last accepted description; `None` until it first answers.
    registry: Option<ToolsConfig>,
}

/// Where every name comes from, and the executors by endpoint.
struct Sources {
    /// The hand-written `[[tools]]` and `[[verifiers]]`.
    fixed: ToolsConfig,
    /// In the order they registered: the first to claim a name keeps it.
    described: Vec<Described>,
    executors: HashMap<String, Arc<Executor>>,
    in_process: Vec<(String, Arc<ToolExecutor>)>,
    /// The MCP servers of the registry, by the endpoint their tools are routed to.
    mcp: Vec<(String, Arc<McpExecutor>)>,
    client_config: ClientConfig,
    slots: usize,
}

impl Sources {
    /// The executor at `endpoint`, created on first mention: every tool and verifier it
    /// serves shares its channel and its slots.
    async fn executor(&mut self, endpoint: &str) -> Result<Arc<Executor>, GatewayError> {
        if let Some(executor) = self.executors.get(endpoint) {
            return Ok(Arc::clone(executor));
        }
        let local = self.in_process.iter().find(|(at, _)| at == endpoint);
        let mcp = self.mcp.iter().find(|(at, _)| at == endpoint);
        let (route, reports) = match (local, mcp) {
            (Some((_, service)), _) => (Route::InProcess(Arc::clone(service)), None),
            (None, Some((_, mcp))) => {
                let service: Arc<ToolExecutor> = mcp.clone();
                (Route::InProcess(service), Some(Arc::clone(mcp)))
            }
            (None, None) => {
                let transport = client::connect(endpoint, self.client_config.clone()).await?;
                let route = Route::Grpc {
                    client: client::tool_executor(transport.clone()),
                    health: HealthClient::new(transport),
                };
                (route, None)
            }
        };
        let executor = Arc::new(Executor {
            endpoint: endpoint.to_owned(),
            route,
            slots: Arc::new(Semaphore::new(self.slots)),
            up: AtomicBool::new(true),
            stages: AtomicU8::new(STAGES_UNKNOWN),
            reports,
        });
        self.executors
            .insert(endpoint.to_owned(), Arc::clone(&executor));
        Ok(executor)
    }

    /// Closes the channel to `endpoint` unless an entry still routes to it.
    fn forget_unused(&mut self, endpoint: &str) {
        let used = self.fixed.tools.iter().any(|t| t.endpoint == endpoint)
            || self.fixed.verifiers.iter().any(|v| v.endpoint == endpoint)
            || self.described.iter().any(|d| d.endpoint == endpoint);
        if !used {
            self.executors.remove(endpoint);
        }
    }

    /// Who holds each name: the fixed entries, then each described executor in order.
    /// `Err` names the first name claimed twice and who claimed it first.
    fn check_names(&self) -> Result<(), GatewayError> {
        let mut tools: BTreeMap<&str, &str> = BTreeMap::new();
        let mut verifiers: BTreeMap<&str, &str> = BTreeMap::new();
        let fixed = std::iter::once(("the registry file", &self.fixed));
        let described = self
            .described
            .iter()
            .filter_map(|d| d.registry.as_ref().map(|r| (d.endpoint.as_str(), r)));
        for (holder, registry) in fixed.chain(described) {
            for (kind, names, held) in [
                (
                    "tool",
                    registry
                        .tools
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>(),
                    &mut tools,
                ),
                (
                    "verifier",
                    registry.verifiers.iter().map(|v| v.name.as_str()).collect(),
                    &mut verifiers,
                ),
            ] {
                for name in names {
                    if let Some(first) = held.insert(name, holder) {
                        return Err(GatewayError::NameTaken {
                            kind,
                            name: name.to_owned(),
                            holder: first.to_owned(),
                            claimant: holder.to_owned(),
                        });
                    }
                }
            }
        }
        if tools.len() > crate::config::MAX_TOOLS {
            return Err(ConfigError::TooManyTools { count: tools.len() }.into());
        }
        Ok(())
    }

    /// The registry of what every source holds now.
    async fn assemble(&mut self) -> Result<Registry, GatewayError> {
        self.check_names()?;
        let mut entries = self.fixed.clone();
        for described in &self.described {
            if let Some(registry) = &described.registry {
                entries.tools.extend(registry.tools.iter().cloned());
                entries.verifiers.extend(registry.verifiers.iter().cloned());
            }
        }
        let mut registry = Registry::default();
        for entry in entries.tools {
            let executor = self.executor(&entry.endpoint).await?;
            let descriptor = entry.descriptor();
            registry.tools.insert(
                entry.name.clone(),
                Tool {
                    digest: descriptor.digest.parse().ok(),
                    descriptor,
                    entry,
                    executor,
                },
            );
        }
        for entry in entries.verifiers {
            let executor = self.executor(&entry.endpoint).await?;
            registry
                .verifiers
                .insert(entry.name.clone(), Verifier { entry, executor });
        }
        let mut hasher = Sha256::new();
        for tool in registry.tools.values() {
            hasher.update(tool.descriptor.name.as_bytes());
            hasher.update([0]);
            hasher.update(tool.descriptor.digest.as_bytes());
            hasher.update([0]);
        }
        registry.digest = hex::encode(&hasher.finalize()[..16]);
        Ok(registry)
    }
}

/// The registry in force and what it is built from.
pub(crate) struct Registrar {
    current: RwLock<Arc<Registry>>,
    sources: Mutex<Sources>,
    /// How long one Describe or health check may take.
    timeout: Duration,
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar")
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

/// What a registration changed, for its caller.
pub(crate) struct Registered {
    pub(crate) tools: Vec<ToolDescriptor>,
    pub(crate) verifiers: Vec<String>,
}

impl Registrar {
    /// The registrar over the file's entries; its `[[executors]]` are registered but not
    /// described yet ([`Registrar::refresh`] does that, and keeps trying).
    pub(crate) async fn new(
        config: ToolsConfig,
        in_process: Vec<(String, Arc<ToolExecutor>)>,
        client_config: ClientConfig,
        slots: usize,
        timeout: Duration,
    ) -> Result<Registrar, GatewayError> {
        config.validate()?;
        let ToolsConfig {
            tools,
            verifiers,
            executors,
            mcp_servers,
            a2a_agents,
        } = config;
        // Each MCP server is an executor of its own, in this process, registered by an
        // endpoint that is never dialled.
        let mcp = mcp_servers
            .into_iter()
            .map(|server| {
                let endpoint = mcp_endpoint(&server.name);
                McpExecutor::start(server)
                    .map(|executor| (endpoint, executor))
                    .map_err(|error| ConfigError::InvalidMcpServer(error.to_string()))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        // Each remote A2A agent likewise: one tool, described from its card.
        let mut in_process = in_process;
        let mut agents = Vec::with_capacity(a2a_agents.len());
        for agent in a2a_agents {
            let endpoint = a2a_endpoint(&agent.name);
            let executor = agentloop_a2a::RemoteAgent::new(agent)
                .map_err(|error| ConfigError::InvalidA2aAgent(error.to_string()))?;
            agents.push(endpoint.clone());
            in_process.push((endpoint, Arc::new(executor) as Arc<ToolExecutor>));
        }
        let described = executors
            .into_iter()
            .map(|e| e.endpoint)
            .chain(mcp.iter().map(|(endpoint, _)| endpoint.clone()))
            .chain(agents)
            .map(|endpoint| Described {
                endpoint,
                configured: true,
                registry: None,
            })
            .collect();
        let mut sources = Sources {
            fixed: ToolsConfig {
                tools,
                verifiers,
                ..ToolsConfig::default()
            },
            described,
            executors: HashMap::new(),
            in_process,
            mcp,
            client_config,
            slots,
        };
        let endpoints: Vec<String> = sources
            .described
            .iter()
            .map(|d| d.endpoint.clone())
            .collect();
        for endpoint in endpoints {
            sources.executor(&endpoint).await?;
        }
        let registry = sources.assemble().await?;
        Ok(Registrar {
            current: RwLock::new(Arc::new(registry)),
            sources: Mutex::new(sources),
            timeout,
        })
    }

    /// The registry in force.
    pub(crate) fn current(&self) -> Arc<Registry> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn publish(&self, sources: &mut Sources) -> Result<(), GatewayError> {
        let registry = sources.assemble().await?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(registry);
        Ok(())
    }

    /// Registers the executor at `endpoint`, or describes it again: what it describes
    /// replaces what it had, unless it claims a name another source holds, or is
    /// invalid, in which case nothing changes.
    pub(crate) async fn register(&self, endpoint: &str) -> Result<Registered, GatewayError> {
        self.describe_into(endpoint, false).await
    }

    /// [`Registrar::register`]; with `existing_only`, an executor deregistered meanwhile
    /// stays deregistered.
    async fn describe_into(
        &self,
        endpoint: &str,
        existing_only: bool,
    ) -> Result<Registered, GatewayError> {
        crate::config::ExecutorEntry::new(endpoint)
            .validate()
            .map_err(|error| GatewayError::InvalidRequest(error.to_string()))?;
        let executor = {
            let mut sources = self.sources.lock().await;
            let known = sources.described.iter().any(|d| d.endpoint == endpoint);
            if !known && sources.described.len() >= MAX_EXECUTORS {
                return Err(GatewayError::InvalidRequest(format!(
                    "{MAX_EXECUTORS} executors are registered, the most a gateway holds"
                )));
            }
            sources.executor(endpoint).await?
        };
        // Described without the lock: a slow executor holds up no other registration.
        let described = executor.describe(self.timeout).await;
        let mut sources = self.sources.lock().await;
        let known = sources.described.iter().any(|d| d.endpoint == endpoint);
        if existing_only && !known {
            sources.forget_unused(endpoint);
            return Err(GatewayError::UnknownExecutor(endpoint.to_owned()));
        }
        let described = match described {
            Ok(described) => described,
            Err(error) => {
                sources.forget_unused(endpoint);
                return Err(error);
            }
        };
        let registered = Registered {
            tools: described.descriptors(),
            verifiers: described.verifiers.iter().map(|v| v.name.clone()).collect(),
        };
        let previous = match sources
            .described
            .iter_mut()
            .find(|d| d.endpoint == endpoint)
        {
            Some(entry) => entry.registry.replace(described),
            None => {
                sources.described.push(Described {
                    endpoint: endpoint.to_owned(),
                    configured: false,
                    registry: Some(described),
                });
                None
            }
        };
        if let Err(error) = self.publish(&mut sources).await {
            // Put back what was there: the first holder keeps its names.
            match sources
                .described
                .iter()
                .position(|d| d.endpoint == endpoint)
            {
                Some(at) if known => sources.described[at].registry = previous,
                Some(at) => {
                    sources.described.remove(at);
                    sources.forget_unused(endpoint);
                }
                None => {}
            }
            return Err(error);
        }
        executor.set_up(true);
        tracing::info!(
            endpoint,
            tools = registered.tools.len(),
            verifiers = registered.verifiers.len(),
            "executor registered"
        );
        Ok(registered)
    }

    /// Removes a registered executor and everything it served.
    pub(crate) async fn deregister(&self, endpoint: &str) -> Result<Registered, GatewayError> {
        let mut sources = self.sources.lock().await;
        let at = sources
            .described
            .iter()
            .position(|d| d.endpoint == endpoint)
            .ok_or_else(|| GatewayError::UnknownExecutor(endpoint.to_owned()))?;
        if sources.described[at].configured {
            return Err(GatewayError::ConfiguredExecutor(endpoint.to_owned()));
        }
        let removed = sources.described.remove(at);
        sources.forget_unused(endpoint);
        self.publish(&mut sources).await?;
        let registry = removed.registry.unwrap_or_default();
        tracing::info!(
            endpoint,
            tools = registry.tools.len(),
            "executor deregistered"
        );
        Ok(Registered {
            tools: registry.descriptors(),
            verifiers: registry.verifiers.into_iter().map(|v| v.name).collect(),
        })
    }

    /// One round of upkeep: every executor's health is checked, and the executors
    /// registered by endpoint are described again when `describe_all`, when they came
    /// back, or when they were never described. A description that fails or conflicts
    /// is logged and leaves the executor's last one in force.
    pub(crate) async fn refresh(&self, describe_all: bool) {
        let (executors, described): (Vec<Arc<Executor>>, BTreeSet<(String, bool)>) = {
            let sources = self.sources.lock().await;
            (
                sources.executors.values().cloned().collect(),
                sources
                    .described
                    .iter()
                    .map(|d| (d.endpoint.clone(), d.registry.is_none()))
                    .collect(),
            )
        };
        let probes = executors.iter().map(|executor| async {
            let up = executor.probe(self.timeout).await;
            (Arc::clone(executor), executor.set_up(up) && up)
        });
        let probed = futures::future::join_all(probes).await;
        let due = described.into_iter().filter(|(endpoint, never)| {
            let (mut up, mut back) = (false, false);
            for (executor, came_back) in &probed {
                if &executor.endpoint == endpoint {
                    up = executor.is_up();
                    back = *came_back;
                }
            }
            // One never described is tried on every round until it answers.
            *never || (up && (describe_all || back))
        });
        let described = due.map(|(endpoint, _)| async move {
            if let Err(error) = self.redescribe(&endpoint).await {
                tracing::warn!(%endpoint, %error, "executor not described");
            }
        });
        futures::future::join_all(described).await;
    }

    /// Describes a registered executor again, if it is still registered.
    async fn redescribe(&self, endpoint: &str) -> Result<(), GatewayError> {
        match self.describe_into(endpoint, true).await {
            Ok(_) | Err(GatewayError::UnknownExecutor(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// The endpoint the tools of MCP server `name` are routed by: a URL, as every endpoint
/// is, that no network request is ever made to.
pub(crate) fn mcp_endpoint(name: &str) -> String {
    format!("http://mcp.in-process.localhost/{name}")
}

/// The endpoint an `[[a2a_agents]]` entry's executor is registered by; never dialled.
pub(crate) fn a2a_endpoint(name: &str) -> String {
    format!("http://a2a.in-process.localhost/{name}")
}

/// Keeps the registry current until the gateway is dropped: health every `every`,
/// descriptions every `describe_every` (and whenever an executor comes back).
pub(crate) async fn upkeep(registrar: Weak<Registrar>, every: Duration, describe_every: Duration) {
    let rounds = u32::try_from(describe_every.as_millis() / every.as_millis().max(1))
        .unwrap_or(u32::MAX)
        .max(1);
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u32 = 0;
    loop {
        ticker.tick().await;
        let Some(registrar) = registrar.upgrade() else {
            return;
        };
        round = round.wrapping_add(1);
        registrar.refresh(round.is_multiple_of(rounds)).await;
    }
}
