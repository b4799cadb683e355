//! The embedded default: every service in one process, on one loopback port, over SQLite
//! files in one data directory. No Redis, no PostgreSQL, no other server.
//!
//! The orchestrator reaches decision, policy and the tool gateway in-process; the gateway
//! reaches tool executors over gRPC as it would in production, and the demo executor is
//! served on the same port, so the demo tools work with no set-up.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop_decision::DecisionServer;
use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_ledger::{LedgerConfig, LedgerService};
use agentloop_orchestrator::{InProcess, Orchestrator, OrchestratorConfig, Ports, wire};
use agentloop_policy::{PolicyConfig, PolicyServer};
use agentloop_proto::server;
use agentloop_proto::v1 as pb;
use agentloop_server::{ServeError, ServiceSet};
use agentloop_store::{EventStore, SqliteStore, StoreError};
use agentloop_tools::{Gateway, GatewayLimits, ToolsConfig};
use anyhow::{Context, bail};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The effect ledger's directory inside the data directory.
pub const LEDGER_DIR: &str = "ledger";

/// What to start.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where to serve (`127.0.0.1:0` for any free port).
    pub listen: String,
    /// The data directory.
    pub data_dir: PathBuf,
    /// A tools config; without it, the demo executor's tools.
    pub tools: Option<PathBuf>,
    /// The orchestrator's configuration (its `data_dir` and `listen` are ignored).
    pub orchestrator: OrchestratorConfig,
    /// The model for invocations started without a script (`run --model`); `None`:
    /// such invocations fail with model_error.
    pub model: Option<Arc<dyn agentloop_decision::Model>>,
}

impl StackOptions {
    /// The embedded default of `run` and `demo`: any free loopback port.
    pub fn embedded(data_dir: PathBuf, tools: Option<PathBuf>) -> StackOptions {
        StackOptions {
            listen: "127.0.0.1:0".into(),
            data_dir,
            tools,
            orchestrator: OrchestratorConfig::default(),
            model: None,
        }
    }
}

/// A running embedded deployment.
#[derive(Debug)]
pub struct Stack {
    endpoint: String,
    orchestrator: Orchestrator,
    demo: DemoExecutor,
    stop: CancellationToken,
    server: JoinHandle<Result<(), ServeError>>,
    /// Held for the stack's life: one process per data directory.
    _lock: File,
}

impl Stack {
    /// Opens the data directory, starts every service and resumes invocations that a
    /// previous run left unfinished.
    pub async fn start(options: StackOptions) -> anyhow::Result<Stack> {
        let data_dir = options.data_dir;
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
        let lock = lock(&data_dir)?;
        let listener = tokio::net::TcpListener::bind(&options.listen)
            .await
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        let endpoint = format!("http://{}", listener.local_addr()?);

        let demo = DemoExecutor::open(DemoConfig {
            data_dir: data_dir.join("demo-executor"),
            ..DemoConfig::default()
        })?;
        let tools = match &options.tools {
            Some(path) => ToolsConfig::load(path)?,
            None => {
                ToolsConfig::from_descriptors(&endpoint, agentloop_demo_executor::descriptors())?
            }
        };
        let gateway = Gateway::new(tools.clone(), GatewayLimits::default()).await?;
        let policy =
            PolicyServer::from_descriptors(&tools.descriptors(), &PolicyConfig::default())?;
        let decision = DecisionServer::new(options.model.clone());
        let ledger = LedgerService::new(
            LedgerConfig {
                data_dir: data_dir.join(LEDGER_DIR),
                ..LedgerConfig::default()
            }
            .open_store()
            .await?,
        );
        let store = SqliteStore::open_in(&data_dir).await?;
        let ports = Ports {
            decision: Arc::new(decision.clone()),
            policy: Arc::new(InProcess(Arc::new(policy.clone()))),
            tools: Arc::new(InProcess(Arc::new(gateway.clone()))),
            ledger: Arc::new(InProcess(Arc::new(ledger.clone()))),
        };
        let config = OrchestratorConfig {
            data_dir: data_dir.clone(),
            ..options.orchestrator
        };
        let orchestrator = Orchestrator::new(config, Arc::new(store), ports);

        let services = ServiceSet::new()
            .add(orchestrator.service())
            .add(server::decision(decision))
            .add(server::policy(policy))
            .add(server::tool_gateway(gateway))
            .add(server::effect_ledger(ledger))
            .add(server::tool_executor(demo.clone()));
        let stop = CancellationToken::new();
        let drained = orchestrator.clone();
        let stopped = stop.clone();
        let server = tokio::spawn(agentloop_server::serve(listener, services, async move {
            stopped.cancelled().await;
            drained.shutdown().await;
        }));
        // Resume only once the executor is served: resumed calls may need it at once.
        orchestrator.resume().await?;
        Ok(Stack {
            endpoint,
            orchestrator,
            demo,
            stop,
            server,
            _lock: lock,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The in-process orchestrator.
    pub fn orchestrator(&self) -> &Orchestrator {
        &self.orchestrator
    }

    /// The demo executor (its counters show what it applied).
    pub fn demo_executor(&self) -> &DemoExecutor {
        &self.demo
    }

    /// Graceful stop: in-flight turns commit, running invocations park, the server drains.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.server.await.context("the server task failed")??;
        Ok(())
    }
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

/// The committed events of an invocation in an embedded data directory.
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
