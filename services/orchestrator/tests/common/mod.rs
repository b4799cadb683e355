//! Shared harness of the worker tests: the services an orchestrator reaches (decision,
//! policy, tools, the demo executor), each a real gRPC server on a loopback port of this
//! test process, plus a throwaway PostgreSQL database and a private `redis-server`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    dead_code
)]

use std::sync::Arc;
use std::time::Duration;

use agentloop_demo_executor::{DemoExecutor, FaultConfig};
use agentloop_engine::{TerminalReason, UnixMillis};
use agentloop_lease::testing::RedisServer;
use agentloop_lease::{
    Lease, LeaseBackend, LeaseError, RedisHandoff, RedisLeaseConfig, RedisLeases, Revocations,
};
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::client::{ClientConfig, Transport, connect};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use agentloop_runtime::{Runtime, Workers};
use agentloop_stack::{Services, ServicesOptions, Wiring};
use agentloop_store::testing::{PostgresServer, TestDatabase};
use agentloop_store::{
    Append, Created, EventStore, InvocationRecord, ListRequest, NewInvocation, PgOptions, PgStore,
    StoreError, StoredEvent,
};
use async_trait::async_trait;
use futures::StreamExt;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use uuid::Uuid;

/// A client of an orchestrator worker.
pub(crate) type Client = OrchestratorServiceClient<Transport>;

pub(crate) async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    (listener, endpoint)
}

pub(crate) async fn channel(endpoint: &str) -> Transport {
    agentloop_stack::channel(endpoint).await.unwrap()
}

/// PostgreSQL + Redis + the four services; `None` (after a loud message) when PostgreSQL
/// or `redis-server` is missing and the environment does not require them.
pub(crate) struct Cluster {
    pub(crate) database: TestDatabase,
    pub(crate) redis: RedisServer,
    pub(crate) executor: DemoExecutor,
    pub(crate) decision: String,
    pub(crate) policy: String,
    pub(crate) tools: String,
    pub(crate) ledger: String,
    pub(crate) services: Services,
    _dir: TempDir,
}

impl Cluster {
    pub(crate) async fn start_or_skip(test: &str) -> Option<Cluster> {
        Cluster::start_with(test, FaultConfig::default(), None).await
    }

    /// Like [`Cluster::start_or_skip`], with an executor that applies each write at once
    /// but holds its reply for a minute, so a test can kill or freeze the worker that
    /// sent it while the write is in flight.
    pub(crate) async fn start_holding_replies(test: &str) -> Option<Cluster> {
        let faults = FaultConfig {
            reply_delay_ms: 60_000,
            ..FaultConfig::default()
        };
        Cluster::start_with(test, faults, None).await
    }

    /// Like [`Cluster::start_or_skip`], with the executor injecting `faults` and
    /// `transfer` calls timing out after `transfer_timeout_ms` if given.
    pub(crate) async fn start_with(
        test: &str,
        faults: FaultConfig,
        transfer_timeout_ms: Option<u64>,
    ) -> Option<Cluster> {
        Cluster::start_configured(test, |options| {
            options.demo.faults = faults;
            options
                .demo_timeouts_ms
                .extend(transfer_timeout_ms.map(|ms| ("transfer".to_owned(), ms)));
        })
        .await
    }

    /// Like [`Cluster::start_or_skip`], with the services' options changed by `configure`.
    pub(crate) async fn start_configured(
        test: &str,
        configure: impl FnOnce(&mut ServicesOptions),
    ) -> Option<Cluster> {
        agentloop_server::install_crypto_provider();
        let postgres = PostgresServer::for_test(test).await?;
        let redis = RedisServer::start_or_skip(test).await?;
        let database = postgres.create_database().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut options = ServicesOptions::new(dir.path().to_path_buf());
        configure(&mut options);
        // The ledger shares the event store's PostgreSQL database, as in production.
        options.ledger.database_url = Some(database.url().to_owned());
        let services = Services::start(Wiring::Distributed, options).await.unwrap();
        let endpoints = services.endpoints().unwrap().clone();
        Some(Cluster {
            database,
            redis,
            executor: services.demo_executor().clone(),
            decision: endpoints.decision,
            policy: endpoints.policy,
            tools: endpoints.tools,
            ledger: endpoints.ledger,
            services,
            _dir: dir,
        })
    }

    pub(crate) async fn store(&self) -> Arc<dyn EventStore> {
        Arc::new(
            PgStore::connect(PgOptions::new(self.database.url()))
                .await
                .unwrap(),
        )
    }

    /// The cluster's event store with a test's `faults` in it.
    pub(crate) async fn store_with(&self, faults: impl StoreFaults) -> Arc<dyn EventStore> {
        Arc::new(FaultyStore {
            inner: self.store().await,
            faults,
        })
    }

    pub(crate) fn leases(&self) -> Arc<RedisLeases> {
        Arc::new(RedisLeases::new(RedisLeaseConfig::new(self.redis.url())).unwrap())
    }

    /// The cluster's leases with a test's `faults` in them.
    pub(crate) fn leases_with(&self, faults: impl LeaseFaults) -> Arc<dyn LeaseBackend> {
        Arc::new(FaultyLeases {
            inner: self.leases(),
            faults,
        })
    }

    pub(crate) fn handoff(&self) -> Arc<RedisHandoff> {
        Arc::new(
            RedisHandoff::new(
                &self.redis.url(),
                "agentloop:runnable",
                Duration::from_millis(200),
                Duration::from_secs(1),
            )
            .unwrap(),
        )
    }

    /// The configuration of a worker of this cluster: short leases and sweeps so tests
    /// see takeovers quickly.
    pub(crate) fn config(&self, name: &str, ttl_ms: u64, sweep_ms: u64) -> OrchestratorConfig {
        let mut config = OrchestratorConfig {
            decision_endpoint: self.decision.clone(),
            policy_endpoint: self.policy.clone(),
            tools_endpoint: self.tools.clone(),
            ledger_endpoint: self.ledger.clone(),
            database_url: Some(self.database.url().to_owned()),
            ..OrchestratorConfig::default()
        };
        config.workers.redis_url = Some(self.redis.url());
        config.workers.worker_id = Some(name.to_owned());
        config.workers.lease_ttl_ms = ttl_ms;
        config.workers.sweep_every_ms = sweep_ms;
        config.limits.drain_timeout_ms = 50;
        config
    }

    /// An in-process worker over `store` and `leases` (tests wrap them to inject faults).
    pub(crate) async fn worker(
        &self,
        config: OrchestratorConfig,
        store: Arc<dyn EventStore>,
        leases: Arc<dyn LeaseBackend>,
    ) -> Worker {
        // The tenants' places in the cluster's Redis, as `Workers::from_config` keeps them.
        let workers =
            Workers::new(leases, self.handoff(), &config.workers).with_places(self.leases());
        let runtime = Runtime::new(
            config.runtime(),
            store,
            self.services.ports(),
            workers,
            agentloop_telemetry::Telemetry::off(),
        );
        runtime.resume().await.unwrap();
        let (l, endpoint) = listener().await;
        let shutdown = CancellationToken::new();
        let (o, s) = (runtime.clone(), shutdown.clone());
        let server = tokio::spawn(async move {
            agentloop_orchestrator::run(
                l,
                None,
                agentloop_a2a::CardSettings::default(),
                o,
                None,
                None,
                s.cancelled_owned(),
            )
            .await
            .unwrap();
        });
        Worker {
            endpoint,
            runtime,
            shutdown,
            server,
        }
    }

    pub(crate) async fn stop(self) {
        self.services.stop().await.unwrap();
    }
}

/// An `agentloop-orchestrator` process of a cluster; killed (SIGKILL) when dropped.
pub(crate) struct Process {
    pub(crate) child: std::process::Child,
    pub(crate) endpoint: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// A client once the process answers (it is starting: connection refused until then).
    pub(crate) async fn client(&self) -> OrchestratorServiceClient<Transport> {
        for _ in 0..200 {
            if let Ok(transport) = connect(&self.endpoint, ClientConfig::default()).await {
                return agentloop_proto::client::orchestrator(transport);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} never answered", self.endpoint);
    }

    /// SIGKILL, and the process is gone once this returns.
    pub(crate) fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Cluster {
    /// Starts an orchestrator process of this cluster named `name`, logging to
    /// `dir/name.log`, with the given lease TTL and sweep period.
    pub(crate) fn spawn_worker(
        &self,
        name: &str,
        dir: &std::path::Path,
        ttl_ms: u64,
        sweep_ms: u64,
    ) -> Process {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        // The orchestrator's service token, as a deployment mounts it.
        let token_file = dir.join(format!("{name}.token"));
        let tokens = &self.services.endpoints().unwrap().tokens;
        std::fs::write(&token_file, &tokens.orchestrator).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop-orchestrator"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--database-url", self.database.url()])
            .args(["--decision-endpoint", &self.decision])
            .args(["--policy-endpoint", &self.policy])
            .args(["--tools-endpoint", &self.tools])
            .args(["--ledger-endpoint", &self.ledger])
            .env(
                "AGENTLOOP_ORCHESTRATOR_WORKERS__REDIS_URL",
                self.redis.url(),
            )
            .env("AGENTLOOP_ORCHESTRATOR_WORKERS__WORKER_ID", name)
            .env("AGENTLOOP_ORCHESTRATOR_SERVICE_TOKEN_FILE", &token_file)
            .env(
                "AGENTLOOP_ORCHESTRATOR_WORKERS__LEASE_TTL_MS",
                ttl_ms.to_string(),
            )
            .env(
                "AGENTLOOP_ORCHESTRATOR_WORKERS__SWEEP_EVERY_MS",
                sweep_ms.to_string(),
            )
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Process {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// One in-process orchestrator worker serving gRPC.
pub(crate) struct Worker {
    pub(crate) endpoint: String,
    pub(crate) runtime: Runtime,
    shutdown: CancellationToken,
    server: JoinHandle<()>,
}

impl Worker {
    pub(crate) async fn client(&self) -> OrchestratorServiceClient<Transport> {
        agentloop_proto::client::orchestrator(channel(&self.endpoint).await)
    }

    /// Graceful stop: running invocations park and are handed off.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap();
    }
}

pub(crate) fn start_request(script: &str, key: &str) -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        goal: "worker test".into(),
        scripted_model_json: script.into(),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

pub(crate) async fn start(
    client: &mut OrchestratorServiceClient<Transport>,
    script: &str,
    key: &str,
) -> String {
    client
        .start_invocation(start_request(script, key))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
        .invocation_id
}

/// The invocation as the orchestrator reports it now.
pub(crate) async fn get(client: &mut Client, id: &str) -> pb::Invocation {
    client
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
}

/// Asks to cancel invocation `id` through `client`, for `reason`; returns the invocation
/// as the cancel left it.
pub(crate) async fn cancel(client: &mut Client, id: &str, reason: &str) -> pb::Invocation {
    client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.to_owned(),
            reason: reason.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
}

/// A watch of `id` from its first event.
pub(crate) async fn watch(client: &mut Client, id: &str) -> Streaming<pb::WatchInvocationResponse> {
    client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.into(),
            from_seq: 1,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Every committed event of `id`, once it has ended (the watch follows it wherever it runs).
pub(crate) async fn events_until_end(
    client: &mut OrchestratorServiceClient<Transport>,
    id: &str,
) -> Vec<pb::Event> {
    let mut stream = watch(client, id).await;
    let mut events = Vec::new();
    // Bounded, so a lost invocation fails the test instead of hanging it.
    let all = async {
        while let Some(item) = stream.next().await {
            events.push(item.unwrap().event.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .unwrap_or_else(|_| panic!("invocation {id} did not end within 120 s"));
    events
}

/// Checks the log of an ended invocation is whole: seqs 1..=n, turns 1..=k in order with
/// none repeated, exactly one `Ended`, last. Returns the terminal reason.
pub(crate) fn check_log(events: &[pb::Event]) -> pb::TerminalReason {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "seqs are contiguous from 1");
    let turns: Vec<u32> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(pb::event::Body::Turn(turn)) => Some(turn.turn),
            _ => None,
        })
        .collect();
    let expected: Vec<u32> = (1..=turns.len() as u32).collect();
    assert_eq!(turns, expected, "every turn once, in order");
    let ends: Vec<&pb::InvocationEnded> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(pb::event::Body::Ended(ended)) => Some(ended),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 1, "exactly one end");
    assert!(
        matches!(
            events.last().and_then(|e| e.body.as_ref()),
            Some(pb::event::Body::Ended(_))
        ),
        "the end is last"
    );
    ends[0].reason()
}

/// Percentile of sorted durations.
pub(crate) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1);
    sorted[index.min(sorted.len() - 1)]
}

/// The faults a test puts into a worker's event store: each method stands in for the
/// store's own and is given the real `store`; a method left out passes straight through.
#[async_trait]
pub(crate) trait StoreFaults: Send + Sync + 'static {
    async fn append(
        &self,
        store: &dyn EventStore,
        id: Uuid,
        append: Append<'_>,
    ) -> Result<(), StoreError> {
        store.append(id, append).await
    }

    async fn request_cancel(
        &self,
        store: &dyn EventStore,
        id: Uuid,
        at: UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError> {
        store.request_cancel(id, at, reason).await
    }
}

/// An event store with a test's [`StoreFaults`] over a real one ([`Cluster::store_with`]).
struct FaultyStore<F> {
    inner: Arc<dyn EventStore>,
    faults: F,
}

#[async_trait]
impl<F: StoreFaults> EventStore for FaultyStore<F> {
    async fn create(&self, new: NewInvocation) -> Result<Created, StoreError> {
        self.inner.create(new).await
    }
    async fn get(&self, id: Uuid) -> Result<InvocationRecord, StoreError> {
        self.inner.get(id).await
    }
    async fn list(&self, request: ListRequest) -> Result<Vec<InvocationRecord>, StoreError> {
        self.inner.list(request).await
    }
    async fn append(&self, id: Uuid, append: Append<'_>) -> Result<(), StoreError> {
        self.faults.append(&*self.inner, id, append).await
    }
    async fn events(
        &self,
        id: Uuid,
        from: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.events(id, from, limit).await
    }
    async fn running(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        self.inner.running(after, limit).await
    }
    async fn claim(&self, id: Uuid, epoch: u64) -> Result<InvocationRecord, StoreError> {
        self.inner.claim(id, epoch).await
    }
    async fn request_cancel(
        &self,
        id: Uuid,
        at: UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError> {
        self.faults
            .request_cancel(&*self.inner, id, at, reason)
            .await
    }
    async fn expired_waits(&self, now: UnixMillis, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        self.inner.expired_waits(now, limit).await
    }
    async fn count_waiting(&self) -> Result<Vec<(TerminalReason, u64)>, StoreError> {
        self.inner.count_waiting().await
    }
}

/// The faults a test puts into a worker's leases: each method stands in for the
/// backend's own and is given the real `leases`; a method left out passes straight
/// through. (Renewing many at once renews them one by one, each through `renew`.)
#[async_trait]
pub(crate) trait LeaseFaults: Send + Sync + std::fmt::Debug + 'static {
    async fn renew(
        &self,
        leases: &dyn LeaseBackend,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool, LeaseError> {
        leases.renew(lease, ttl).await
    }

    async fn release(&self, leases: &dyn LeaseBackend, lease: &Lease) -> Result<bool, LeaseError> {
        leases.release(lease).await
    }

    async fn subscribe_revocations(
        &self,
        leases: &dyn LeaseBackend,
    ) -> Result<Revocations, LeaseError> {
        leases.subscribe_revocations().await
    }
}

/// Leases with a test's [`LeaseFaults`] over real ones ([`Cluster::leases_with`]).
#[derive(Debug)]
struct FaultyLeases<F> {
    inner: Arc<dyn LeaseBackend>,
    faults: F,
}

#[async_trait]
impl<F: LeaseFaults> LeaseBackend for FaultyLeases<F> {
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, LeaseError> {
        self.inner.acquire(key, owner, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LeaseError> {
        self.faults.renew(&*self.inner, lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        self.faults.release(&*self.inner, lease).await
    }
    async fn revoke(&self, key: &str) -> Result<bool, LeaseError> {
        self.inner.revoke(key).await
    }
    async fn subscribe_revocations(&self) -> Result<Revocations, LeaseError> {
        self.faults.subscribe_revocations(&*self.inner).await
    }
}
