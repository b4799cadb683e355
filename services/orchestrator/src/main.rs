//! `agentloop-orchestrator`: serves `OrchestratorService`, reaching the decision, policy
//! and tool services over gRPC. Alone it keeps events in SQLite under `data_dir` with
//! in-process leases; several processes share a PostgreSQL event store (`database_url`)
//! and Redis leases (`workers.redis_url`), and any of them may die at any moment.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`); an endpoint or a Redis URL that cannot be used
//! exits with 78 too. SIGTERM/SIGINT: new invocations are refused, in-flight turns
//! commit, running invocations park (they resume on the next start), then the process
//! exits.

use std::path::PathBuf;
use std::sync::Arc;

use agentloop_auth::Authenticator;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::client::connect;
use agentloop_runtime::{Runtime, Workers};
use agentloop_server::{Service, Started};
use agentloop_store::{EventStore, PgOptions, PgStore, SqliteStore};
use serde::Serialize;

const SERVICE: Service = Service::new("agentloop-orchestrator").about("The agentloop orchestrator");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// Directory of the embedded event store.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A PostgreSQL event store shared by several orchestrators (postgres://…).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The decision service, e.g. http://127.0.0.1:50052.
    #[arg(long)]
    decision_endpoint: Option<String>,
    /// The policy service, e.g. http://127.0.0.1:50053.
    #[arg(long)]
    policy_endpoint: Option<String>,
    /// The tool gateway, e.g. http://127.0.0.1:50054.
    #[arg(long)]
    tools_endpoint: Option<String>,
    /// The effect ledger, e.g. http://127.0.0.1:50055.
    #[arg(long)]
    ledger_endpoint: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    SERVICE
        .main::<Own, OrchestratorConfig, _, _, _>(OrchestratorConfig::validate, serve)
        .await
}

async fn serve(started: Started<OrchestratorConfig, ()>) -> anyhow::Result<()> {
    let Started {
        config,
        listener,
        telemetry,
        ..
    } = started;

    // Lazy channels: the other services may start after this one.
    let lazy = SERVICE
        .client(&config.client)
        .with_lazy(true)
        .with_request_timeout(None);
    let channel = |endpoint: &str| {
        let lazy = lazy.clone();
        let endpoint = endpoint.to_owned();
        async move {
            connect(&endpoint, lazy)
                .await
                .unwrap_or_else(|error| SERVICE.exit_bad_config(&error))
        }
    };
    let ports = agentloop_orchestrator::grpc::ports(
        channel(&config.decision_endpoint).await,
        channel(&config.policy_endpoint).await,
        channel(&config.tools_endpoint).await,
        channel(&config.ledger_endpoint).await,
    );
    let store: Arc<dyn EventStore> = match &config.database_url {
        Some(url) => Arc::new(PgStore::connect(PgOptions::new(url.clone())).await?),
        None => Arc::new(SqliteStore::open_in(&config.data_dir).await?),
    };
    let workers =
        Workers::from_config(&config.workers).unwrap_or_else(|e| SERVICE.exit_bad_config(&e));

    let auth = Authenticator::from_config(&config.server.auth)
        .await
        .unwrap_or_else(|error| SERVICE.exit_bad_config(&error));
    let tls = config.server.server_tls.as_ref().map(|tls| {
        tls.load()
            .unwrap_or_else(|error| SERVICE.exit_bad_config(&error))
    });
    let http = match config.http_listen {
        Some(address) => {
            agentloop_server::exposure(address, auth.is_some(), config.server.insecure_no_auth)
                .unwrap_or_else(|error| SERVICE.exit_bad_config(&error));
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .unwrap_or_else(|error| {
                    SERVICE.exit_bad_config(&format!("cannot listen on {address}: {error}"))
                });
            tracing::info!(%address, "HTTP/JSON API listening");
            Some(listener)
        }
        None => None,
    };
    let card = config.a2a.card(auth.is_some());
    let runtime = Runtime::new(config.runtime(), store, ports, workers, telemetry.clone());
    tracing::info!(worker = runtime.worker_id(), "worker started");
    runtime.resume().await?;
    let shutdown = agentloop_server::shutdown_signal();
    Ok(agentloop_orchestrator::run(listener, http, card, runtime, auth, tls, shutdown).await?)
}
