//! The agentloop orchestrator.
//!
//! It owns invocations: it accepts them (`StartInvocation`, idempotent on a key), drives
//! each through the pure turn engine with one runner task, commits every turn to the event
//! store before the next model call, streams committed events to watchers, and cancels on
//! request. It reaches the decision, policy and tool services through [`ports`], over gRPC
//! or in-process.
//!
//! It is not the engine (no turn logic lives here, only I/O) and not a model adapter, a
//! policy or a tool router: those are the other services.
#![warn(missing_docs)]

mod config;
mod error;
mod hub;
pub mod ports;
mod runner;
mod service;
mod spec;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use agentloop_engine::{Clock, Invocation, SystemClock};
use agentloop_proto::v1 as pb;
use agentloop_store::{EventStore, InvocationRecord, InvocationState, StoreError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use uuid::Uuid;

pub use config::{LimitsConfig, OrchestratorConfig, RequestBounds};
pub use error::OrchestratorError;
pub use ports::{DecisionPort, InProcess, PolicyPort, Ports, ToolsPort};

use crate::runner::Runner;
use crate::spec::InvocationSpec;

/// Events a resumed runner reads back to rebuild its state, per page.
const RESTORE_PAGE: u32 = 1_000;

/// State shared by the gRPC handlers and the runners.
pub(crate) struct Shared {
    config: OrchestratorConfig,
    store: Arc<dyn EventStore>,
    ports: Ports,
    hub: hub::Hub,
    clock: Arc<dyn Clock>,
    /// Invocations running in this process, with their cancellation tokens and progress.
    running: Mutex<HashMap<Uuid, Running>>,
    /// Every runner task; shutdown waits for them.
    tracker: TaskTracker,
    /// Fired on shutdown: runners stop at the next safe point (after an in-flight turn
    /// commits) and leave the invocation to be resumed.
    drain: CancellationToken,
    /// The tool gateway's descriptors, fetched once and kept.
    descriptors: RwLock<Option<Arc<Vec<pb::ToolDescriptor>>>>,
}

impl Shared {
    fn forget(&self, invocation_id: Uuid) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.remove(&invocation_id);
    }

    fn running_count(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn cancel_token(&self, invocation_id: Uuid) -> Option<CancellationToken> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.get(&invocation_id).map(|r| r.cancel.clone())
    }

    /// Live progress of an invocation this process runs.
    fn progress(&self, invocation_id: Uuid) -> Option<Arc<Progress>> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.get(&invocation_id).map(|r| r.progress.clone())
    }

    /// The descriptors of the invocation's tools, for the model.
    fn descriptors_for(&self, spec: &InvocationSpec) -> Vec<pb::ToolDescriptor> {
        self.cached_descriptors()
            .map(|all| {
                all.iter()
                    .filter(|d| spec.tool(&d.name).is_some())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn cached_descriptors(&self) -> Option<Arc<Vec<pb::ToolDescriptor>>> {
        self.descriptors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// All the gateway's tools; fetched on first use, kept afterwards. Two first uses at
    /// once may both fetch; the answers are the same.
    async fn descriptors(&self) -> Result<Arc<Vec<pb::ToolDescriptor>>, OrchestratorError> {
        if let Some(cached) = self.cached_descriptors() {
            return Ok(cached);
        }
        let listed = self
            .ports
            .tools
            .list_tools(pb::ListToolsRequest::default())
            .await
            .map_err(|status| {
                OrchestratorError::Unavailable(format!(
                    "the tool gateway did not list its tools: {:?}: {}",
                    status.code(),
                    status.message()
                ))
            })?;
        let tools = Arc::new(listed.tools);
        *self
            .descriptors
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(tools.clone());
        Ok(tools)
    }
}

/// Serves `orchestrator` on `listener` until `shutdown` resolves, then drains: new
/// invocations are refused, in-flight turns commit, running invocations park (they
/// resume on the next start) and in-flight RPCs finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    orchestrator: Orchestrator,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let services = agentloop_server::ServiceSet::new().add(orchestrator.service());
    agentloop_server::serve(listener, services, async move {
        shutdown.await;
        orchestrator.shutdown().await;
    })
    .await
}

/// What the process keeps of an invocation it runs.
struct Running {
    cancel: CancellationToken,
    progress: Arc<Progress>,
}

/// Where a running invocation is, for callers who ask while it runs. Not durable, and
/// only ever a hint: the committed events are the truth.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// The turn being decided or executed.
    pub(crate) turn: AtomicU32,
    /// Calls of that turn dispatched and not finished.
    pub(crate) in_flight: AtomicU32,
}

/// An orchestrator: cheap to clone, one per process.
#[derive(Clone)]
pub struct Orchestrator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("running", &self.shared.running_count())
            .finish_non_exhaustive()
    }
}

impl Orchestrator {
    /// An orchestrator over `store` and `ports`. Call [`Orchestrator::resume`] to pick up
    /// invocations a previous process left running.
    pub fn new(
        config: OrchestratorConfig,
        store: Arc<dyn EventStore>,
        ports: Ports,
    ) -> Orchestrator {
        Orchestrator::with_clock(config, store, ports, Arc::new(SystemClock))
    }

    /// Like [`Orchestrator::new`] with an injected clock.
    pub fn with_clock(
        config: OrchestratorConfig,
        store: Arc<dyn EventStore>,
        ports: Ports,
        clock: Arc<dyn Clock>,
    ) -> Orchestrator {
        Orchestrator {
            shared: Arc::new(Shared {
                config,
                store,
                ports,
                hub: hub::Hub::default(),
                clock,
                running: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
                drain: CancellationToken::new(),
                descriptors: RwLock::new(None),
            }),
        }
    }

    /// Resumes every invocation the store says is running, from its last committed event.
    /// Returns how many were resumed.
    pub async fn resume(&self) -> Result<usize, OrchestratorError> {
        let limit = u32::try_from(self.shared.config.bounds.max_running).unwrap_or(u32::MAX);
        let ids = self.shared.store.running(limit).await?;
        let mut resumed = 0;
        for id in ids {
            let record = self.shared.store.get(id).await?;
            match self.launch(&record).await {
                Ok(()) => resumed += 1,
                Err(error) => warn!(invocation = %id, %error, "could not resume"),
            }
        }
        if resumed > 0 {
            info!(resumed, "resumed running invocations");
        }
        Ok(resumed)
    }

    /// The gRPC service, with the message limits and compression of `agentloop_proto::server`.
    pub fn service(
        &self,
    ) -> pb::orchestrator_service_server::OrchestratorServiceServer<Orchestrator> {
        agentloop_proto::server::orchestrator(self.clone())
    }

    /// Graceful shutdown: refuse new invocations, let in-flight turns commit, wait for
    /// every runner to park or finish. Parked invocations resume on the next start.
    pub async fn shutdown(&self) {
        self.shared.drain.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
    }

    /// Starts a runner for a stored, running invocation: restores the engine from the log.
    async fn launch(&self, record: &InvocationRecord) -> Result<(), OrchestratorError> {
        let id = record.invocation_id;
        if record.state == InvocationState::Ended {
            return Ok(());
        }
        let spec: InvocationSpec = serde_json::from_str(&record.spec)
            .map_err(|e| StoreError::Corrupt(format!("invocation {id}: spec: {e}")))?;
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let page = self.shared.store.events(id, from, RESTORE_PAGE).await?;
            let Some(last) = page.last() else { break };
            from = last.event.seq + 1;
            let full = page.len() == RESTORE_PAGE as usize;
            events.extend(page);
            if !full {
                break;
            }
        }
        let engine =
            Invocation::restore(spec.limits, spec.catalog(), events.iter().map(|e| &e.event))
                .map_err(|e| StoreError::Corrupt(format!("invocation {id}: {e}")))?;
        let id_text = id.to_string();
        let skip = events.len().saturating_sub(runner::HISTORY);
        let recent: VecDeque<pb::Event> = events[skip..]
            .iter()
            .map(|stored| wire::event(&id_text, stored.committed_at, &stored.event))
            .collect();
        self.spawn_runner(id, spec, engine, recent);
        Ok(())
    }

    /// Registers and starts the runner of an invocation this process now owns (a no-op
    /// if it already runs here).
    fn spawn_runner(
        &self,
        id: Uuid,
        spec: InvocationSpec,
        engine: Invocation,
        recent: VecDeque<pb::Event>,
    ) {
        let cancel = CancellationToken::new();
        let progress = Arc::new(Progress::default());
        {
            let mut running = self
                .shared
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if running.contains_key(&id) {
                return;
            }
            running.insert(
                id,
                Running {
                    cancel: cancel.clone(),
                    progress: progress.clone(),
                },
            );
        }
        self.shared.hub.open(id);
        let runner = Runner {
            shared: self.shared.clone(),
            id,
            spec: Arc::new(spec),
            engine,
            cancel,
            recent,
            progress,
        };
        self.shared.tracker.spawn(runner.run());
    }
}
