//! Where the workload runs: the embedded or distributed stack in this process, or the
//! cluster as processes; and how the bench reaches their orchestrators.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentloop_auth::{AuthConfig, AuthMode, DevToken};
use agentloop_orchestrator::{Api, OrchestratorConfig};
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
use agentloop_stack::{ServiceTelemetry, ServicesOptions, Stack, StackOptions, Wiring};
use agentloop_store::databases::{self, Database};
use agentloop_telemetry::receiver::OtlpReceiver;
use agentloop_telemetry::{Metrics, Telemetry, metrics};
use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::metadata::{Ascii, MetadataValue};

use crate::{
    BenchOptions, KEYS, LOOKUP, Mode, Spans, StoreFigures,
    cluster::{ClusterOptions, LocalCluster},
    measure::{cpu_time, process_status},
    model::{BenchModel, script},
    wire,
    wire::{CountingProxy, Protocol},
};

/// How the bench reaches the orchestrator.
#[derive(Clone)]
pub(crate) enum Client {
    /// The API in this process, and the `authorization` each call carries, if any.
    InProcess(Api, Option<MetadataValue<Ascii>>),
    Grpc(OrchestratorServiceClient<Transport>),
}

impl Client {
    /// `message` as a call of the in-process API, with the token.
    pub(crate) fn request<T>(
        message: T,
        authorization: Option<&MetadataValue<Ascii>>,
    ) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }
}

type Events = BoxStream<'static, Result<pb::WatchInvocationResponse, tonic::Status>>;

impl Client {
    pub(crate) async fn start(
        &self,
        request: pb::StartInvocationRequest,
    ) -> Result<String, tonic::Status> {
        let response = match self {
            Client::InProcess(api, authorization) => {
                api.start_invocation(Client::request(request, authorization.as_ref()))
                    .await?
            }
            Client::Grpc(client) => client.clone().start_invocation(request).await?,
        };
        response
            .into_inner()
            .invocation
            .map(|invocation| invocation.invocation_id)
            .ok_or_else(|| tonic::Status::internal("the start response names no invocation"))
    }

    pub(crate) async fn watch(&self, invocation_id: String) -> Result<Events, tonic::Status> {
        let request = pb::WatchInvocationRequest {
            invocation_id,
            from_seq: 1,
        };
        Ok(match self {
            Client::InProcess(api, authorization) => api
                .watch_invocation(Client::request(request, authorization.as_ref()))
                .await?
                .into_inner(),
            Client::Grpc(client) => client
                .clone()
                .watch_invocation(request)
                .await?
                .into_inner()
                .boxed(),
        })
    }
}

pub(crate) struct Deployment {
    /// Where invocations start, in turn: one client, or one per orchestrator.
    pub(crate) clients: Vec<Client>,
    /// What every start request asks for.
    pub(crate) start: pb::StartInvocationRequest,
    pub(crate) backend: Backend,
}

pub(crate) enum Backend {
    /// Every service in this process.
    InProcess {
        stack: Stack,
        /// With `--traces`: the receiver, and every service's telemetry.
        traced: Option<(OtlpReceiver, Vec<Telemetry>)>,
    },
    /// The local cluster's processes.
    Cluster(ClusterBackend),
}

/// The cluster and what it runs on; the fields drop in order, so the processes stop
/// before the proxies and the databases go.
pub(crate) struct ClusterBackend {
    pub(crate) cluster: LocalCluster,
    pub(crate) postgres: CountingProxy,
    pub(crate) redis: CountingProxy,
    pub(crate) databases: [Database; 2],
}

/// The prefix of the bench's databases.
pub(crate) const DATABASE_PREFIX: &str = "agentloop_bench_";

impl Deployment {
    pub(crate) async fn start(
        dir: &Path,
        options: &BenchOptions,
        model: Arc<BenchModel>,
    ) -> anyhow::Result<Deployment> {
        let data_file = dir.join("lookup.json");
        let table: BTreeMap<_, _> = KEYS.into_iter().collect();
        std::fs::write(&data_file, serde_json::to_vec(&table)?)?;
        match options.mode {
            Mode::Embedded => {
                Deployment::in_process(dir, options, model, &data_file, Wiring::Embedded).await
            }
            Mode::Distributed => {
                Deployment::in_process(dir, options, model, &data_file, Wiring::Distributed).await
            }
            Mode::Cluster => Deployment::cluster(dir, options, &data_file).await,
        }
    }

    pub(crate) async fn in_process(
        dir: &Path,
        options: &BenchOptions,
        model: Arc<BenchModel>,
        data_file: &Path,
        wiring: Wiring,
    ) -> anyhow::Result<Deployment> {
        let mut services = ServicesOptions::new(dir.to_path_buf());
        services.demo.data_file = Some(data_file.to_path_buf());
        // Every invocation's two lookups may be in flight at once.
        services.gateway.max_concurrent_calls_per_executor =
            (2 * options.invocations as usize).max(64);
        // The workload only reads, so the ledger is never written; it is wired all the
        // same, as in every deployment.
        services.model = Some(model);
        if !options.policies.is_empty() {
            services.policy.policies = std::collections::BTreeMap::from([(
                "default".to_owned(),
                options.policies.clone(),
            )]);
        }
        let mut orchestrator = orchestrator_config(options);
        let token = if options.auth {
            let secret_file = dir.join("jwt-secret");
            let secret = hex_secret();
            std::fs::write(&secret_file, &secret)?;
            orchestrator.server.auth = AuthConfig {
                mode: AuthMode::Jwt,
                hs256_secret_file: Some(secret_file),
                issuer: Some(ISSUER.to_owned()),
                audience: Some(AUDIENCE.to_owned()),
                ..AuthConfig::default()
            };
            let token = DevToken {
                issuer: ISSUER.to_owned(),
                audience: AUDIENCE.to_owned(),
                actor: "bench".to_owned(),
                tenant: "bench".to_owned(),
                roles: Vec::new(),
                valid_for_s: 24 * 3600,
            };
            Some(agentloop_auth::mint_hs256(&secret, &token)?)
        } else {
            None
        };
        let (telemetry, traced) = if options.traces {
            let receiver = OtlpReceiver::counting().await?;
            let of = |service: &str| receiver.telemetry(service, Metrics::new(), std::env::vars());
            let orchestrator = of("agentloop-orchestrator")?;
            services.telemetry = ServiceTelemetry {
                decision: of("agentloop-decision")?,
                policy: of("agentloop-policy")?,
                tools: of("agentloop-tools")?,
                ledger: of("agentloop-ledger")?,
                demo_executor: of("agentloop-demo-executor")?,
            };
            let t = &services.telemetry;
            let every = vec![
                orchestrator.clone(),
                t.decision.clone(),
                t.policy.clone(),
                t.tools.clone(),
                t.ledger.clone(),
                t.demo_executor.clone(),
            ];
            (orchestrator, Some((receiver, every)))
        } else {
            let off = Telemetry::off();
            services.telemetry = ServiceTelemetry::shared(&off);
            (off, None)
        };
        let stack = Stack::start(StackOptions {
            wiring,
            orchestrator,
            services,
            telemetry,
            ..StackOptions::embedded(dir.to_path_buf())
        })
        .await?;
        let client = match wiring {
            Wiring::Embedded => {
                let authorization = token
                    .map(|token| format!("Bearer {token}").parse())
                    .transpose()?;
                Client::InProcess(stack.api().clone(), authorization)
            }
            Wiring::Distributed => Client::Grpc(agentloop_proto::client::orchestrator(
                agentloop_stack::channel_as(&stack.endpoint(), token.as_deref()).await?,
            )),
        };
        Ok(Deployment {
            clients: vec![client],
            start: start_request(),
            backend: Backend::InProcess { stack, traced },
        })
    }

    /// Two databases and two counting proxies, then the cluster over them.
    pub(crate) async fn cluster(
        dir: &Path,
        options: &BenchOptions,
        data_file: &Path,
    ) -> anyhow::Result<Deployment> {
        let settings = &options.cluster;
        let postgres_upstream = wire::upstream(&settings.postgres_url, Protocol::Postgres)?;
        let redis_upstream = wire::upstream(&settings.redis_url, Protocol::Redis)?;
        let create = || async {
            Database::create(&settings.postgres_url, DATABASE_PREFIX)
                .await
                .with_context(|| {
                    format!(
                        "cannot create a database on {}",
                        databases::redact(&settings.postgres_url)
                    )
                })
        };
        let databases = [create().await?, create().await?];
        let postgres = CountingProxy::start(Protocol::Postgres, postgres_upstream).await?;
        let redis = CountingProxy::start(Protocol::Redis, redis_upstream).await?;
        let cluster = LocalCluster::up(&ClusterOptions {
            script: settings.script.clone(),
            bin_dir: settings.bin_dir.clone(),
            parent_dir: Some(dir.to_path_buf()),
            database_url: wire::through(databases[0].url(), postgres.address())?,
            ledger_database_url: wire::through(databases[1].url(), postgres.address())?,
            redis_url: wire::through(&settings.redis_url, redis.address())?,
            env: vec![format!(
                "AGENTLOOP_DEMO_EXECUTOR_DATA_FILE={}",
                data_file.display()
            )],
            netns: None,
        })
        .await?;
        let mut clients = Vec::with_capacity(2);
        for endpoint in cluster.orchestrators()? {
            clients.push(Client::Grpc(cluster.client(endpoint).await?));
        }
        let tool_calls = 2 * options.turns.saturating_sub(1);
        Ok(Deployment {
            clients,
            start: pb::StartInvocationRequest {
                scripted_model_json: script(options.turns),
                budget_overrides: Some(pb::BudgetOverrides {
                    max_steps: Some(options.turns),
                    max_tool_calls: Some(tool_calls),
                    ..pb::BudgetOverrides::default()
                }),
                ..start_request()
            },
            backend: Backend::Cluster(ClusterBackend {
                cluster,
                postgres,
                redis,
                databases,
            }),
        })
    }

    /// The in-process services (park mode needs them).
    pub(crate) fn stack(&self) -> anyhow::Result<&Stack> {
        match &self.backend {
            Backend::InProcess { stack, .. } => Ok(stack),
            Backend::Cluster(_) => bail!("the cluster's services are not in this process"),
        }
    }

    /// With `--traces`, waits until every service has exported what it buffers.
    pub(crate) async fn flush_spans(&self) {
        if let Backend::InProcess {
            traced: Some((_, every)),
            ..
        } = &self.backend
        {
            for telemetry in every {
                telemetry.flush().await;
            }
        }
    }

    /// With `--traces`, the spans the services ended and those the receiver got.
    pub(crate) fn spans(&self) -> Spans {
        let Backend::InProcess {
            traced: Some((receiver, every)),
            ..
        } = &self.backend
        else {
            return Spans::default();
        };
        let ended = every
            .iter()
            .filter_map(|telemetry| {
                metrics::sample(&telemetry.metrics().encode(), "agentloop_spans_ended_total")
            })
            .sum::<f64>();
        Spans {
            // A count, exact below 2^53.
            ended: ended as u64,
            received: receiver.count(),
        }
    }

    /// The processes whose CPU and memory are measured: none but this one in-process.
    pub(crate) fn pids(&self) -> Vec<String> {
        match &self.backend {
            Backend::InProcess { .. } => vec!["self".to_owned()],
            Backend::Cluster(backend) => backend
                .cluster
                .pids()
                .values()
                .map(u32::to_string)
                .collect(),
        }
    }

    /// User + system CPU time of the measured processes so far.
    pub(crate) fn cpu_time(&self) -> anyhow::Result<Duration> {
        self.pids().iter().map(|pid| cpu_time(pid)).sum()
    }

    /// The measured processes' peak resident sets, summed.
    pub(crate) fn peak_rss(&self) -> u64 {
        self.pids()
            .iter()
            .filter_map(|pid| process_status(pid, "VmHWM:"))
            .sum()
    }

    /// What the cluster's processes sent PostgreSQL and Redis so far.
    pub(crate) fn wire_counts(&self) -> Option<wire::WireCounts> {
        let Backend::Cluster(backend) = &self.backend else {
            return None;
        };
        Some(wire::WireCounts::join(
            backend.postgres.counts(),
            backend.redis.counts(),
        ))
    }

    /// The SQLite store's figures, per turn.
    pub(crate) async fn store_figures(&self, turns: f64) -> anyhow::Result<Option<StoreFigures>> {
        let Backend::InProcess { stack, .. } = &self.backend else {
            return Ok(None);
        };
        let storage = stack.store().storage().await?;
        let stats = stack.store().stats();
        let fsyncs = stats.commits + 2 * stats.checkpoints;
        Ok(Some(StoreFigures {
            stored_bytes_per_turn: storage.used_bytes as f64 / turns,
            event_bytes_per_turn: storage.event_body_bytes as f64 / turns,
            fsyncs,
            commits: stats.commits,
            fsyncs_per_turn: fsyncs as f64 / turns,
            largest_group: stats.largest_group,
        }))
    }

    /// Drains the orchestrators and stops the services; a cluster's databases go too.
    pub(crate) async fn stop(self) {
        match self.backend {
            Backend::InProcess { stack, .. } => {
                if let Err(error) = stack.stop().await {
                    tracing::warn!(%error, "a bench server failed");
                }
            }
            Backend::Cluster(backend) => {
                let ClusterBackend {
                    cluster,
                    postgres,
                    redis,
                    databases,
                } = backend;
                if let Err(error) = cluster.down().await {
                    tracing::warn!(%error, "the cluster did not stop cleanly");
                }
                drop((postgres, redis));
                for database in databases {
                    if let Err(error) = database.drop_database().await {
                        tracing::warn!(%error, "a bench database was not dropped");
                    }
                }
            }
        }
    }
}

/// The issuer and audience of the bench's tokens.
pub(crate) const ISSUER: &str = "https://agentloop-bench.invalid";
pub(crate) const AUDIENCE: &str = "agentloop";

/// A fresh 256-bit HS256 secret, as hex.
pub(crate) fn hex_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The orchestrator's configuration for the workload: budgets that fit T turns exactly,
/// room for N invocations at once, and the HTTP/JSON API served beside the gRPC one, as
/// `agentloop dev` serves it (the workload calls gRPC; what the listener costs idle is
/// measured).
pub(crate) fn orchestrator_config(options: &BenchOptions) -> OrchestratorConfig {
    let mut config = OrchestratorConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..OrchestratorConfig::default()
    };
    let tool_calls = 2 * options.turns.saturating_sub(1);
    config.limits.max_steps = options.turns;
    config.limits.max_tool_calls = tool_calls;
    config.bounds.max_steps_cap = config.bounds.max_steps_cap.max(options.turns);
    config.bounds.max_tool_calls_cap = config.bounds.max_tool_calls_cap.max(tool_calls);
    config.bounds.max_running = config.bounds.max_running.max(options.invocations as usize);
    config
}

pub(crate) fn start_request() -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        goal: "Look up the customer's records, two at a time, and summarise the last two."
            .to_owned(),
        allowed_tools: vec![LOOKUP.to_owned()],
        ..pb::StartInvocationRequest::default()
    }
}
