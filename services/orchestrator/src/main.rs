//! `agentloop-orchestrator`: serves `OrchestratorService`, reaching the decision, policy
//! and tool services over gRPC. Alone it keeps events in SQLite under `data_dir` with
//! in-process leases; several processes share a PostgreSQL event store (`database_url`)
//! and Redis leases (`workers.redis_url`), and any of them may die at any moment.
//!
//! Configuration layers: defaults -> `--config` TOML file -> `AGENTLOOP_ORCHESTRATOR_*`
//! environment -> flags. A bad configuration exits with `EXIT_BAD_CONFIG` (78).
//! SIGTERM/SIGINT: new invocations are refused, in-flight turns commit, running
//! invocations park (they resume on the next start), then the process exits.

use std::path::PathBuf;
use std::sync::Arc;

use agentloop_orchestrator::{Orchestrator, OrchestratorConfig, Ports, Workers};
use agentloop_proto::client::{ClientConfig, connect};
use agentloop_store::{EventStore, PgOptions, PgStore, SqliteStore};
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one given overrides the configuration file and environment.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "agentloop-orchestrator",
    version,
    about = "The agentloop orchestrator"
)]
struct Flags {
    /// TOML configuration file.
    #[arg(long, env = "AGENTLOOP_ORCHESTRATOR_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on (e.g. 127.0.0.1:50051).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Directory of the embedded event store.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// A PostgreSQL event store shared by several orchestrators (postgres://…).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    /// The decision service, e.g. http://127.0.0.1:50052.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    decision_endpoint: Option<String>,
    /// The policy service, e.g. http://127.0.0.1:50053.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_endpoint: Option<String>,
    /// The tool gateway, e.g. http://127.0.0.1:50054.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tools_endpoint: Option<String>,
    /// The effect ledger, e.g. http://127.0.0.1:50055.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ledger_endpoint: Option<String>,
}

fn bad_config(error: &dyn std::fmt::Display) -> ! {
    agentloop_server::exit_bad_config("agentloop-orchestrator", error)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::init_tracing("agentloop-orchestrator");
    agentloop_server::install_crypto_provider();
    let flags = Flags::parse();
    let config: OrchestratorConfig =
        agentloop_server::config::load(flags.config.as_deref(), "AGENTLOOP_ORCHESTRATOR_", &flags)
            .unwrap_or_else(|error| bad_config(&error));
    config.validate().unwrap_or_else(|error| bad_config(&error));

    // Lazy channels: the other services may start after this one.
    let lazy = ClientConfig::default()
        .with_lazy(true)
        .with_request_timeout(None);
    let channel = |endpoint: String| {
        let lazy = lazy.clone();
        async move { connect(&endpoint, lazy).await }
    };
    let ports = Ports::grpc(
        channel(config.decision_endpoint.clone())
            .await
            .unwrap_or_else(|e| bad_config(&e)),
        channel(config.policy_endpoint.clone())
            .await
            .unwrap_or_else(|e| bad_config(&e)),
        channel(config.tools_endpoint.clone())
            .await
            .unwrap_or_else(|e| bad_config(&e)),
        channel(config.ledger_endpoint.clone())
            .await
            .unwrap_or_else(|e| bad_config(&e)),
    );
    let store: Arc<dyn EventStore> = match &config.database_url {
        Some(url) => Arc::new(PgStore::connect(PgOptions::new(url.clone())).await?),
        None => Arc::new(SqliteStore::open_in(&config.data_dir).await?),
    };
    let workers = Workers::from_config(&config.workers).unwrap_or_else(|e| bad_config(&e));
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .unwrap_or_else(|error| {
            bad_config(&format!("cannot listen on {}: {error}", config.listen))
        });

    let orchestrator = Orchestrator::with_workers(config.clone(), store, ports, workers);
    tracing::info!(worker = orchestrator.worker_id(), "worker started");
    orchestrator.resume().await?;
    tracing::info!(address = %config.listen, "serving OrchestratorService");
    agentloop_orchestrator::run(listener, orchestrator, agentloop_server::shutdown_signal())
        .await?;
    Ok(())
}
