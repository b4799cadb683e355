//! `agentloop-ledger`: serves the effect ledger. All logic is in the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use agentloop_ledger::{ENV_PREFIX, LedgerConfig};
use anyhow::Context;
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one overrides the file and the environment when given.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "agentloop-ledger",
    version,
    about = "The agentloop effect ledger"
)]
struct Flags {
    /// Address to listen on [default: 127.0.0.1:50055].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// A PostgreSQL database (`postgres://...`) instead of the SQLite file. Prefer
    /// AGENTLOOP_LEDGER_DATABASE_URL when the URL holds a password: flags show in `ps`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    /// Directory of the SQLite database [default: data/ledger].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (must exist when given).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::install_crypto_provider();
    agentloop_server::init_tracing("agentloop-ledger");
    let flags = Flags::parse();

    let config: LedgerConfig =
        match agentloop_server::config::load(flags.config.as_deref(), ENV_PREFIX, &flags) {
            Ok(config) => config,
            Err(error) => agentloop_server::exit_bad_config("agentloop-ledger", &error),
        };
    if let Err(error) = config.validate() {
        agentloop_server::exit_bad_config("agentloop-ledger", &error);
    }

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(listen = %config.listen, backend = %config.describe_backend(), "effect ledger starting");
    agentloop_ledger::run(listener, &config, agentloop_server::shutdown_signal()).await?;
    tracing::info!("effect ledger stopped");
    Ok(())
}
