//! Harness of the end-to-end tests: the whole of agentloop, either as separate gRPC
//! servers on loopback ports (each service in its own tonic server, talking gRPC to the
//! others, exactly as deployed) or as the embedded in-process stack of `agentloop dev`.
//! Both give an orchestrator endpoint, so every scenario runs against both.
#![warn(missing_docs)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)] // test support

use std::sync::Arc;

use agentloop::embedded::{Stack, StackOptions};
use agentloop_decision::DecisionServer;
use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_orchestrator::{Orchestrator, OrchestratorConfig, Ports};
use agentloop_policy::{PolicyConfig, PolicyServer};
use agentloop_proto::client::{ClientConfig, Transport, connect};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use agentloop_store::SqliteStore;
use agentloop_tools::{Gateway, GatewayLimits, ToolsConfig};
use futures::StreamExt;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The two ways of running agentloop that every scenario is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wiring {
    /// Five services plus the demo executor, each its own gRPC server on 127.0.0.1:0.
    Distributed,
    /// The embedded stack: one process, in-process ports, one port.
    Embedded,
}

/// A running deployment; stops (gracefully) when dropped via [`System::stop`].
#[derive(Debug)]
pub struct System {
    /// The orchestrator's endpoint.
    pub endpoint: String,
    /// The effect ledger's endpoint (the same as `endpoint` when embedded).
    pub ledger_endpoint: String,
    /// The demo executor, to observe what tools saw.
    pub executor: DemoExecutor,
    shutdown: CancellationToken,
    servers: Vec<JoinHandle<()>>,
    stack: Option<Stack>,
    _dir: TempDir,
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    (listener, endpoint)
}

async fn channel(endpoint: &str) -> Transport {
    connect(
        endpoint,
        ClientConfig::default()
            .with_lazy(true)
            .with_request_timeout(None),
    )
    .await
    .unwrap()
}

impl System {
    /// Starts agentloop wired as asked, with the orchestrator configured by `config`.
    pub async fn start(wiring: Wiring, config: OrchestratorConfig) -> System {
        agentloop_server::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        match wiring {
            Wiring::Embedded => {
                let stack = Stack::start(StackOptions {
                    orchestrator: config,
                    ..StackOptions::embedded(dir.path().join("data"), None)
                })
                .await
                .unwrap();
                System {
                    ledger_endpoint: stack.endpoint(),
                    endpoint: stack.endpoint(),
                    executor: stack.demo_executor().clone(),
                    shutdown: CancellationToken::new(),
                    servers: Vec::new(),
                    stack: Some(stack),
                    _dir: dir,
                }
            }
            Wiring::Distributed => {
                let shutdown = CancellationToken::new();
                let mut servers = Vec::new();
                let mut spawn = |future: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| {
                    servers.push(tokio::spawn(future));
                };

                let executor = DemoExecutor::open(DemoConfig {
                    data_dir: dir.path().join("executor"),
                    ..DemoConfig::default()
                })
                .unwrap();
                let (l, executor_endpoint) = listener().await;
                let (e, s) = (executor.clone(), shutdown.clone());
                spawn(Box::pin(async move {
                    agentloop_demo_executor::run(l, e, s.cancelled_owned())
                        .await
                        .unwrap();
                }));

                let tools = ToolsConfig::from_descriptors(
                    &executor_endpoint,
                    agentloop_demo_executor::descriptors(),
                )
                .unwrap();
                let gateway = Gateway::new(tools.clone(), GatewayLimits::default())
                    .await
                    .unwrap();
                let (l, tools_endpoint) = listener().await;
                let s = shutdown.clone();
                spawn(Box::pin(async move {
                    agentloop_tools::run(l, gateway, s.cancelled_owned())
                        .await
                        .unwrap();
                }));

                let policy =
                    PolicyServer::from_descriptors(&tools.descriptors(), &PolicyConfig::default())
                        .unwrap();
                let (l, policy_endpoint) = listener().await;
                let s = shutdown.clone();
                spawn(Box::pin(async move {
                    agentloop_policy::run(l, policy, s.cancelled_owned())
                        .await
                        .unwrap();
                }));

                let ledger_config = agentloop_ledger::LedgerConfig {
                    data_dir: dir.path().join("ledger"),
                    ..agentloop_ledger::LedgerConfig::default()
                };
                let (l, ledger_endpoint) = listener().await;
                let s = shutdown.clone();
                spawn(Box::pin(async move {
                    agentloop_ledger::run(l, &ledger_config, s.cancelled_owned())
                        .await
                        .unwrap();
                }));

                let (l, decision_endpoint) = listener().await;
                let s = shutdown.clone();
                spawn(Box::pin(async move {
                    agentloop_decision::run(l, DecisionServer::new(None), s.cancelled_owned())
                        .await
                        .unwrap();
                }));

                let store = SqliteStore::open_in(&dir.path().join("orchestrator"))
                    .await
                    .unwrap();
                let ports = Ports::grpc(
                    channel(&decision_endpoint).await,
                    channel(&policy_endpoint).await,
                    channel(&tools_endpoint).await,
                    channel(&ledger_endpoint).await,
                );
                let orchestrator = Orchestrator::new(config, Arc::new(store), ports);
                let (l, endpoint) = listener().await;
                let s = shutdown.clone();
                spawn(Box::pin(async move {
                    agentloop_orchestrator::run(l, orchestrator, s.cancelled_owned())
                        .await
                        .unwrap();
                }));
                System {
                    endpoint,
                    ledger_endpoint,
                    executor,
                    shutdown,
                    servers,
                    stack: None,
                    _dir: dir,
                }
            }
        }
    }

    /// A client of the orchestrator.
    pub async fn client(&self) -> OrchestratorServiceClient<Transport> {
        agentloop_proto::client::orchestrator(channel(&self.endpoint).await)
    }

    /// A client of the effect ledger.
    pub async fn ledger(&self) -> EffectLedgerServiceClient<Transport> {
        agentloop_proto::client::effect_ledger(channel(&self.ledger_endpoint).await)
    }

    /// Graceful stop of every server.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for server in self.servers {
            server.await.unwrap();
        }
        if let Some(stack) = self.stack {
            stack.stop().await.unwrap();
        }
    }
}

/// A scripted-model start request.
pub fn start_request(script: &str) -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        goal: "end-to-end scenario".into(),
        scripted_model_json: script.into(),
        ..Default::default()
    }
}

/// Starts an invocation; returns its ID.
pub async fn start(
    client: &mut OrchestratorServiceClient<Transport>,
    request: pb::StartInvocationRequest,
) -> String {
    client
        .start_invocation(request)
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
        .invocation_id
}

/// Every committed event from `from_seq` to the end.
pub async fn events_until_end(
    client: &mut OrchestratorServiceClient<Transport>,
    id: &str,
    from_seq: u64,
) -> Vec<pb::Event> {
    let mut stream = client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.into(),
            from_seq,
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().event.unwrap());
    }
    events
}

/// The invocation as the orchestrator reports it now.
pub async fn get(client: &mut OrchestratorServiceClient<Transport>, id: &str) -> pb::Invocation {
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

/// Runs a script to its end; returns the ended invocation and its events.
pub async fn run_to_end(
    client: &mut OrchestratorServiceClient<Transport>,
    request: pb::StartInvocationRequest,
) -> (pb::Invocation, Vec<pb::Event>) {
    let id = start(client, request).await;
    let events = events_until_end(client, &id, 1).await;
    (get(client, &id).await, events)
}

/// The terminal reason of an invocation.
pub fn reason(invocation: &pb::Invocation) -> pb::TerminalReason {
    invocation.terminal_reason()
}

/// The turn events of a log.
pub fn turns(events: &[pb::Event]) -> Vec<&pb::TurnCommitted> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(pb::event::Body::Turn(turn)) => Some(turn),
            _ => None,
        })
        .collect()
}
