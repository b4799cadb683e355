//! `agentloop-ledger`: serves the effect ledger. All logic is in the library.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`): a bad configuration, an invalid `database_url`
//! or a taken port exits with 78.

use std::path::PathBuf;

use agentloop_ledger::LedgerConfig;
use agentloop_server::{Service, Started};
use serde::Serialize;

const SERVICE: Service = Service::new("agentloop-ledger").about("The agentloop effect ledger");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// A PostgreSQL database (`postgres://...`) instead of the SQLite file. Prefer
    /// AGENTLOOP_LEDGER_DATABASE_URL when the URL holds a password: flags show in `ps`.
    #[arg(long)]
    database_url: Option<String>,
    /// Directory of the SQLite database [default: data/ledger].
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = SERVICE.parse::<Own, LedgerConfig>();
    let Started {
        config,
        listener,
        telemetry,
        ..
    } = SERVICE
        .start(&flags.common, &flags, LedgerConfig::validate)
        .await;
    tracing::info!(backend = %config.describe_backend(), "effect ledger starting");
    let access = SERVICE.access(&config.server.auth, config.server.server_tls.as_ref());
    agentloop_ledger::run(
        listener,
        &config,
        access,
        agentloop_server::shutdown_signal(),
    )
    .await?;
    tracing::info!("effect ledger stopped");
    // The spans still buffered leave before the process does.
    telemetry.shutdown().await;
    Ok(())
}
