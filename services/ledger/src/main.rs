//! `agentloop-ledger`: serves the effect ledger. All logic is in the library.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`): a bad configuration, an invalid `database_url`
//! or a taken port exits with 78.

use std::path::PathBuf;

use agentloop_ledger::LedgerConfig;
use agentloop_server::Service;
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
    SERVICE
        .main::<Own, LedgerConfig, _, _, _>(LedgerConfig::validate, async |started| {
            let config = &started.config;
            tracing::info!(backend = %config.describe_backend(), "effect ledger starting");
            let access = SERVICE.access(config);
            let shutdown = agentloop_server::shutdown_signal();
            agentloop_ledger::run(started.listener, config, access, shutdown).await?;
            tracing::info!("effect ledger stopped");
            Ok(())
        })
        .await
}
