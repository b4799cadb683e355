//! The agentloop runtime: the turn runner as a library.
//!
//! It owns invocations: it accepts them (idempotent on a key), drives each through the
//! pure turn engine with one runner task, commits every turn to the event store before
//! the next model call, holds each invocation's lease, executes writes through the
//! effect ledger, verifies answers, waits for humans, publishes committed events to
//! watchers, and cancels on request. It reaches the model, policy, the tool gateway and
//! the ledger through [`ports`]: traits in its own types, which the orchestrator service
//! implements over gRPC and the embedded wiring over services in the same process.
//!
//! It is not the engine (no turn logic lives here, only I/O), and it speaks no wire
//! format: the orchestrator's API and its port adapters are the one seam to the wire.
#![warn(missing_docs)]

mod config;
mod context;
mod effects;
mod error;
mod fair;
mod hub;
mod instruments;
mod intern;
pub mod ports;
pub mod replay;
mod requests;
mod runner;
mod spec;
mod verify;
mod waits;
mod watch;
mod workers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use agentloop_engine::{Clock, Invocation, SystemClock, ToolCatalog};
use agentloop_lease::Lease;
use agentloop_script::Script;
use agentloop_store::{EventStore, InvocationRecord, InvocationState, StoreError, StoredEvent};
use agentloop_telemetry::{ActiveSpan, Telemetry};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};
use uuid::Uuid;

pub use config::{LimitsConfig, RequestBounds, RuntimeConfig, TenantLimits, WorkersConfig};
pub use error::RuntimeError;
pub use ports::{DecisionPort, LedgerPort, PolicyPort, Ports, ToolsPort};
pub use requests::{Start, Started};
pub use spec::InvocationSpec;
pub use watch::Watched;
pub use workers::Workers;

use crate::context::ModelContext;
use crate::instruments::{Instruments, Resumed};
use crate::intern::{Descriptors, Interner};
use crate::ports::Tool;
use crate::runner::Runner;
use crate::spec::RunnerSpec;

/// Events a resumed runner reads back to rebuild its state, per page.
const RESTORE_PAGE: u32 = 1_000;
/// Distinct tool sets whose lists (as the spec, the engine and the model see them)
/// invocations share; beyond it each invocation has its own.
const MAX_SHARED_CATALOGS: usize = 1_024;

/// State shared by the gRPC handlers and the runners.
pub(crate) struct Shared {
    config: RuntimeConfig,
    store: Arc<dyn EventStore>,
    ports: Ports,
    hub: hub::Hub,
    clock: Arc<dyn Clock>,
    /// Invocations running in this process, with their cancellation tokens and progress.
    running: Mutex<HashMap<Uuid, Running>>,
    /// One permit per invocation this process may run (`bounds.max_running`). A start
    /// or an adoption takes one before it does anything, so concurrent starts cannot
    /// pass the bound together; a runner's permit comes back when it is forgotten.
    slots: Semaphore,
    /// Each tenant's running invocations and start rate (`tenants`).
    tenants: fair::Tenants,
    /// Every runner task; shutdown waits for them.
    tracker: TaskTracker,
    /// Leases, hand-off and timings shared with other orchestrator processes.
    workers: Workers,
    /// Signalled when a runner ends, so a full worker's hand-off loop takes work again.
    freed: Notify,
    /// Set once the sweep, wait and hand-off loops run.
    started: AtomicBool,
    /// Fired on shutdown: runners stop at the next safe point (after an in-flight turn
    /// commits) and leave the invocation to be resumed.
    drain: CancellationToken,
    /// The tool gateway's descriptors as last listed (`limits.tools_refresh_ms`).
    descriptors: RwLock<Option<Arc<Vec<Tool>>>>,
    /// Bumped whenever the listed descriptors change, so a runner knows to take its
    /// tools again at its next model call, and only then.
    tools_generation: AtomicU64,
    /// The invocations' tools (the engine's catalogs, with timeouts), one per distinct
    /// set of tools.
    catalogs: Interner<ToolCatalog>,
    /// The tools' descriptors shown to the model, one list per distinct set of tools.
    tool_lists: Interner<Descriptors>,
    /// The scripts of offline runs, parsed, one per distinct script.
    scripts: Interner<Script>,
    /// The orchestrator's telemetry and metrics.
    instruments: Instruments,
}

impl Shared {
    /// The runner of `invocation_id`, of `tenant`, stopped.
    fn forget(&self, invocation_id: Uuid, tenant: &str) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let removed = running.remove(&invocation_id).is_some();
        drop(running);
        if removed {
            self.instruments.running.dec();
            // The permit and the tenant's place `spawn_runner` kept for this runner.
            self.slots.add_permits(1);
            self.tenants.release(tenant);
        }
        self.freed.notify_waiters();
    }

    /// Takes an invocation's lease and claims its epoch in the store, so from then on
    /// the previous holder cannot commit. Lets the lease go again when there is nothing
    /// to run (ended, or a newer epoch already claimed).
    async fn take(&self, id: Uuid) -> Result<Taken, RuntimeError> {
        let workers = &self.workers;
        let Some(lease) = workers
            .leases
            .acquire(&id.to_string(), &workers.id, workers.ttl)
            .await?
        else {
            return Ok(Taken::Elsewhere);
        };
        let taken = match self.store.claim(id, lease.epoch).await {
            Ok(record) if record.state == InvocationState::Running => {
                return Ok(Taken::Held(lease, Box::new(record)));
            }
            Ok(_ended) => Ok(Taken::Ended),
            Err(StoreError::StaleEpoch { .. }) => Ok(Taken::Elsewhere),
            Err(error) => Err(error.into()),
        };
        self.let_go(&lease).await;
        taken
    }

    /// Releases a lease this worker will not use, so nobody waits out its TTL.
    async fn let_go(&self, lease: &Lease) {
        if let Err(error) = self.workers.leases.release(lease).await {
            debug!(key = %lease.key, %error, "lease left to expire");
        }
    }

    fn runs(&self, invocation_id: Uuid) -> bool {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.contains_key(&invocation_id)
    }

    fn is_full(&self) -> bool {
        self.slots.available_permits() == 0
    }

    /// A slot for one more runner, or `None` when this process runs all it may.
    fn slot(&self) -> Option<Slot<'_>> {
        let permit = self.slots.try_acquire().ok()?;
        Some(Slot {
            permit,
            ticket: None,
        })
    }

    /// The refusal of work when this process runs all it may (`bounds.max_running`).
    fn full(&self) -> RuntimeError {
        RuntimeError::ResourceExhausted(format!(
            "{} invocations are running, the most this orchestrator runs at once \
             (bounds.max_running); retry when one ends",
            self.config.bounds.max_running
        ))
    }

    fn running_count(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Live progress of an invocation this process runs.
    fn progress(&self, invocation_id: Uuid) -> Option<Arc<Progress>> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.get(&invocation_id).map(|r| r.progress.clone())
    }

    /// The descriptors of the invocation's tools, for the model; shared with every
    /// invocation of the same tools. Empty while the gateway's tools are not known yet.
    fn descriptors_for(&self, tools: &ToolCatalog) -> Arc<Descriptors> {
        let Some(all) = self.cached_descriptors() else {
            return Arc::default();
        };
        let own = all
            .iter()
            .filter(|d| tools.get(&d.name).is_some())
            .cloned()
            .collect();
        self.tool_lists.intern(Descriptors(own))
    }

    fn cached_descriptors(&self) -> Option<Arc<Vec<Tool>>> {
        self.descriptors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// All the gateway's tools; listed on first use, kept afterwards and refreshed by
    /// [`Runtime::tools_loop`].
    async fn descriptors(&self) -> Result<Arc<Vec<Tool>>, RuntimeError> {
        if let Some(cached) = self.cached_descriptors() {
            return Ok(cached);
        }
        self.list_tools().await
    }

    /// The generation of the listed descriptors: it changes whenever they do.
    pub(crate) fn tools_generation(&self) -> u64 {
        self.tools_generation.load(Ordering::Acquire)
    }

    /// Lists the gateway's tools and keeps them, moving the generation on if they
    /// changed (a tool added, removed, changed, or its availability).
    async fn list_tools(&self) -> Result<Arc<Vec<Tool>>, RuntimeError> {
        let listed = self.ports.tools.list().await.map_err(|failure| {
            RuntimeError::Unavailable(format!(
                "the tool gateway did not list its tools: {failure}"
            ))
        })?;
        let mut held = self
            .descriptors
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = held.as_ref().filter(|current| ***current == listed) {
            return Ok(Arc::clone(current));
        }
        let tools = Arc::new(listed);
        *held = Some(Arc::clone(&tools));
        drop(held);
        self.tools_generation.fetch_add(1, Ordering::AcqRel);
        Ok(tools)
    }
}

/// What the process keeps of an invocation it runs. (Its tenant's place is given back
/// by its runner, which knows the tenant: kept here, it cost every parked invocation
/// 16 bytes.)
struct Running {
    progress: Arc<Progress>,
}

/// Room for one more runner: one of `bounds.max_running` and, for a start, a place of
/// its tenant's (an adoption takes its tenant's place when it reads the spec).
pub(crate) struct Slot<'a> {
    permit: SemaphorePermit<'a>,
    ticket: Option<fair::Ticket<'a>>,
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

/// What a runner starts from, beside its spec, engine and lease.
struct Begun {
    /// The last committed events, which the model is shown.
    history: Vec<StoredEvent>,
    /// A cancel request is on record.
    cancel_requested: bool,
    created_at: agentloop_engine::UnixMillis,
    /// The segment's `invoke_agent` span.
    span: ActiveSpan,
}

/// What [`Shared::take`] found.
pub(crate) enum Taken {
    /// The lease is ours and its epoch claimed; the invocation as stored.
    Held(Lease, Box<InvocationRecord>),
    /// Another worker holds the lease (or a newer epoch is claimed).
    Elsewhere,
    /// It has ended.
    Ended,
}

/// What [`Runtime::adopt`] did with an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adopted {
    /// This worker now runs it.
    Started,
    /// It already runs here.
    Here,
    /// Another worker holds its lease (or a newer epoch committed).
    Elsewhere,
    /// It has ended.
    Ended,
    /// This worker runs as many invocations as it may.
    Full,
}

/// A runtime: cheap to clone, one per process.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("worker", &self.shared.workers.id)
            .field("running", &self.shared.running_count())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime over `store` and `ports`, which shares invocations with other processes
    /// through `workers` (or with none: [`Workers::in_process`]) and records its spans and
    /// metrics through `telemetry`. Call [`Runtime::resume`] to pick up invocations left
    /// running.
    pub fn new(
        config: RuntimeConfig,
        store: Arc<dyn EventStore>,
        ports: Ports,
        workers: Workers,
        telemetry: Telemetry,
    ) -> Runtime {
        let slots = Semaphore::new(config.bounds.max_running.min(Semaphore::MAX_PERMITS));
        Runtime {
            shared: Arc::new(Shared {
                store,
                ports,
                hub: hub::Hub::default(),
                clock: Arc::new(SystemClock),
                running: Mutex::new(HashMap::new()),
                slots,
                tenants: fair::Tenants::shared(config.tenants, workers.places.clone(), workers.ttl),
                tracker: TaskTracker::new(),
                drain: CancellationToken::new(),
                descriptors: RwLock::new(None),
                tools_generation: AtomicU64::new(0),
                catalogs: Interner::new(MAX_SHARED_CATALOGS),
                tool_lists: Interner::new(MAX_SHARED_CATALOGS),
                scripts: Interner::new(MAX_SHARED_CATALOGS),
                workers,
                freed: Notify::new(),
                started: AtomicBool::new(false),
                instruments: Instruments::new(telemetry),
                config,
            }),
        }
    }

    /// This worker's name in leases.
    pub fn worker_id(&self) -> &str {
        &self.shared.workers.id
    }

    /// Takes up every running invocation nobody holds (one sweep of the store), then
    /// starts the sweep of waits past their bound and, when other processes share the
    /// leases, the periodic orphan sweep and the hand-off loop, which run until shutdown.
    /// Returns how many invocations the first sweep took up.
    ///
    /// A lease backend that is down does not fail it (the periodic sweep takes the
    /// invocations up once it is back); an event store that cannot be read does.
    pub async fn resume(&self) -> Result<usize, RuntimeError> {
        let resumed = match self.sweep().await {
            Ok(resumed) => resumed,
            Err(RuntimeError::Lease(error)) => {
                warn!(%error, "leases unavailable at start; the sweep retries");
                0
            }
            Err(error) => return Err(error),
        };
        if resumed > 0 {
            info!(resumed, "resumed running invocations");
        }
        if !self.shared.started.swap(true, Ordering::SeqCst) {
            self.shared.tracker.spawn(self.clone().waits_loop());
            if self.shared.config.limits.tools_refresh_ms > 0 {
                self.shared.tracker.spawn(self.clone().tools_loop());
            }
            if self.shared.workers.shared {
                self.shared.tracker.spawn(self.clone().sweep_loop());
                self.shared.tracker.spawn(self.clone().handoff_loop());
            }
        }
        Ok(resumed)
    }

    /// Graceful shutdown: refuse new invocations, let in-flight turns commit, wait for
    /// every runner to park or finish. Parked invocations are released and handed off,
    /// so another worker continues them at once (or this one on its next start).
    pub async fn shutdown(&self) {
        self.shared.drain.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
    }

    /// One pass over the store's running invocations, adopting those nobody holds while
    /// this worker has room. Returns how many it adopted.
    async fn sweep(&self) -> Result<usize, RuntimeError> {
        let mut adopted = 0;
        let mut after = None;
        while !self.shared.drain.is_cancelled() {
            let page = self
                .shared
                .store
                .running(after, workers::SWEEP_PAGE)
                .await?;
            for &id in &page {
                match self.adopt(id, Resumed::Sweep).await {
                    Ok(Adopted::Started) => adopted += 1,
                    Ok(Adopted::Full) => return Ok(adopted),
                    Ok(Adopted::Here | Adopted::Elsewhere | Adopted::Ended) => {}
                    // The backend is down: every other acquisition would wait out its
                    // timeout too. The next sweep tries again.
                    Err(error @ RuntimeError::Lease(_)) => return Err(error),
                    Err(error) => warn!(invocation = %id, %error, "sweep could not adopt"),
                }
            }
            match page.last() {
                Some(&last) if page.len() == workers::SWEEP_PAGE as usize => after = Some(last),
                _ => break,
            }
        }
        Ok(adopted)
    }

    /// Lists the gateway's tools every `limits.tools_refresh_ms` until shutdown. A
    /// listing that fails keeps the tools listed before.
    async fn tools_loop(self) {
        let every = std::time::Duration::from_millis(self.shared.config.limits.tools_refresh_ms);
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.shared.drain.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if let Err(error) = self.shared.list_tools().await {
                warn!(%error, "the tools listed before stay");
            }
        }
    }

    async fn sweep_loop(self) {
        let mut every = tokio::time::interval(self.shared.workers.sweep_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; `resume` just swept.
        every.tick().await;
        loop {
            tokio::select! {
                () = self.shared.drain.cancelled() => return,
                _ = every.tick() => {}
            }
            if let Err(error) = self.sweep().await {
                warn!(%error, "orphan sweep failed");
            }
        }
    }

    /// Takes handed-off invocations while this worker has room.
    async fn handoff_loop(self) {
        let shared = &self.shared;
        loop {
            let freed = shared.freed.notified();
            if shared.is_full() {
                tokio::select! {
                    () = shared.drain.cancelled() => return,
                    () = freed => continue,
                }
            }
            // Not raced against the drain: a Redis `BRPOP` that is dropped mid-wait still
            // pops the next key on the server, and the key would be lost. The take ends
            // within its wait bound; a key taken after the drain began goes back.
            let taken = shared.workers.handoff.take().await;
            if shared.drain.is_cancelled() {
                if let Ok(Some(key)) = taken {
                    self.hand_back(&key).await;
                }
                return;
            }
            match taken {
                Ok(Some(key)) => match Uuid::parse_str(&key) {
                    Ok(id) => match self.adopt(id, Resumed::Handoff).await {
                        // Another worker may have room, or this one after its drain.
                        Ok(Adopted::Full) => self.hand_back(&key).await,
                        Ok(Adopted::Elsewhere) if shared.drain.is_cancelled() => {
                            self.hand_back(&key).await;
                        }
                        Ok(adopted) => debug!(invocation = %id, ?adopted, "hand-off taken"),
                        Err(error) => warn!(invocation = %id, %error, "could not adopt a hand-off"),
                    },
                    Err(_) => warn!(key, "ignoring a hand-off that is not an invocation ID"),
                },
                Ok(None) => {}
                Err(error) => {
                    warn!(%error, "the hand-off queue failed; the sweep still finds orphans");
                    tokio::select! {
                        () = shared.drain.cancelled() => return,
                        () = tokio::time::sleep(workers::RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// Offers a taken key again, for a worker that can run it.
    async fn hand_back(&self, key: &str) {
        if let Err(error) = self.shared.workers.handoff.offer(key).await {
            warn!(key, %error, "could not hand a key back; the sweep finds it");
        }
    }

    /// Takes over a stored invocation if nobody holds it: acquire its lease, claim the
    /// lease's epoch in the store (from then on the previous holder cannot commit), and
    /// run it from its last committed event.
    pub(crate) async fn adopt(&self, id: Uuid, why: Resumed) -> Result<Adopted, RuntimeError> {
        if self.shared.runs(id) {
            return Ok(Adopted::Here);
        }
        let Some(slot) = self.shared.slot() else {
            return Ok(Adopted::Full);
        };
        self.adopt_in(id, slot, why).await
    }

    /// [`Runtime::adopt`], in a slot the caller took.
    pub(crate) async fn adopt_in(
        &self,
        id: Uuid,
        slot: Slot<'_>,
        why: Resumed,
    ) -> Result<Adopted, RuntimeError> {
        let shared = &self.shared;
        if shared.runs(id) {
            return Ok(Adopted::Here);
        }
        if shared.drain.is_cancelled() {
            return Ok(Adopted::Elsewhere);
        }
        let (lease, record) = match shared.take(id).await? {
            Taken::Held(lease, record) => (lease, record),
            Taken::Elsewhere => return Ok(Adopted::Elsewhere),
            Taken::Ended => return Ok(Adopted::Ended),
        };
        if let Err(error) = self.launch(&record, lease.clone(), slot, why).await {
            shared.let_go(&lease).await;
            return Err(error);
        }
        Ok(Adopted::Started)
    }

    /// Runs an invocation `StartInvocation` just stored. Its lease cannot be held by
    /// anyone yet (a sweep that saw the new row may race us for it: then that worker runs
    /// it). A lease backend that is down leaves it stored and running, for a sweep to
    /// start once the backend is back; the error says so.
    pub(crate) async fn start_new(
        &self,
        record: &InvocationRecord,
        spec: InvocationSpec,
        slot: Slot<'_>,
        span: ActiveSpan,
    ) -> Result<(), RuntimeError> {
        let workers = &self.shared.workers;
        let id = record.invocation_id;
        let Some(lease) = workers
            .leases
            .acquire(&id.to_string(), &workers.id, workers.ttl)
            .await?
        else {
            return Ok(());
        };
        // Nothing is committed yet: no log to read back.
        let spec = spec.share_tools(&self.shared.catalogs);
        let engine = Invocation::new(spec.limits, Arc::clone(&spec.tools));
        let started = Begun {
            history: Vec::new(),
            cancel_requested: false,
            created_at: record.created_at,
            span,
        };
        self.spawn_runner(id, spec, engine, started, lease, slot)
            .await
    }

    /// Starts a runner for a stored, running invocation this worker holds the lease of:
    /// restores the engine from the log.
    async fn launch(
        &self,
        record: &InvocationRecord,
        lease: Lease,
        slot: Slot<'_>,
        why: Resumed,
    ) -> Result<(), RuntimeError> {
        let id = record.invocation_id;
        let mut spec = InvocationSpec::of(record)?.share_tools(&self.shared.catalogs);
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
        let engine = Invocation::restore(
            spec.limits,
            Arc::clone(&spec.tools),
            events.iter().map(|e| &e.event),
        )
        .map_err(|e| StoreError::Corrupt(format!("invocation {id}: {e}")))?;
        let skip = events.len().saturating_sub(context::HISTORY);
        let history = events.split_off(skip);
        let instruments = &self.shared.instruments;
        instruments.taken_over(why);
        let earlier = spec.trace.take();
        let span = instruments.invoke_agent(
            id,
            &spec.profile,
            &spec.tenant,
            earlier.as_deref(),
            Some(why),
        );
        let started = Begun {
            history,
            cancel_requested: record.cancel_requested_at.is_some(),
            created_at: record.created_at,
            span,
        };
        self.spawn_runner(id, spec, engine, started, lease, slot)
            .await
    }

    /// Keeps `lease` alive and starts the runner of an invocation this worker now holds,
    /// in `slot`: the runner keeps it until [`Shared::forget`] gives it back.
    async fn spawn_runner(
        &self,
        id: Uuid,
        mut spec: InvocationSpec,
        engine: Invocation,
        started: Begun,
        lease: Lease,
        slot: Slot<'_>,
    ) -> Result<(), RuntimeError> {
        let Begun {
            history,
            cancel_requested,
            created_at,
            span,
        } = started;
        let workers = &self.shared.workers;
        let keepers = workers.keepers().await?;
        let progress = Arc::new(Progress::default());
        let Slot { permit, ticket } = slot;
        let ticket = match ticket {
            Some(ticket) => ticket,
            None => self.shared.tenants.hold_again(&spec.tenant, id).await,
        };
        {
            let mut running = self
                .shared
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if running.contains_key(&id) {
                // Cannot happen (one lease, one runner); keep the running one.
                return Ok(());
            }
            // From here the runner gives the place back, in `forget`.
            ticket.keep();
            running.insert(
                id,
                Running {
                    progress: progress.clone(),
                },
            );
            // From here the entry holds the slot: `forget` removes both together.
            permit.forget();
            self.shared.instruments.running.inc();
        }
        // Kept only once this runner is sure to start: a second keeper of the same key
        // would take the running one's place.
        let lost = CancellationToken::new();
        let keeper = keepers.keep(lease, lost.clone());
        self.shared.instruments.leases_held.inc();
        self.shared.hub.open(id, engine.protocol().version);
        let context = ModelContext::new(&mut spec, history, &self.shared.scripts);
        let tools_generation = self.shared.tools_generation();
        let tools = self.shared.descriptors_for(&spec.tools);
        let runner = Runner {
            shared: self.shared.clone(),
            id,
            spec: Arc::new(RunnerSpec::from(spec)),
            engine,
            keeper: Some(keeper),
            lost,
            cancel_requested,
            context,
            tools,
            tools_generation,
            progress,
            span,
            created_at,
        };
        self.shared.tracker.spawn(runner.run());
        Ok(())
    }
}
