//! `agentloop-decision`: serves `DecisionService` with the configured models (scripted,
//! OpenAI-compatible, Anthropic), priced by the config's price table.
//!
//! Configuration layers: defaults -> `--config` TOML file -> `AGENTLOOP_DECISION_*`
//! environment -> flags. A bad configuration exits with `EXIT_BAD_CONFIG` (78).

use std::path::PathBuf;

use agentloop_decision::{DecisionConfig, DecisionServer};
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one given overrides the configuration file and environment.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "agentloop-decision",
    version,
    about = "The agentloop decision service"
)]
struct Flags {
    /// TOML configuration file.
    #[arg(long, env = "AGENTLOOP_DECISION_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on (e.g. 127.0.0.1:50052).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Scripted-model file used when a request carries no script.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    script_file: Option<PathBuf>,
}

fn bad_config(error: &dyn std::fmt::Display) -> ! {
    agentloop_server::exit_bad_config("agentloop-decision", error)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::init_tracing("agentloop-decision");
    let flags = Flags::parse();
    let config: DecisionConfig =
        agentloop_server::config::load(flags.config.as_deref(), "AGENTLOOP_DECISION_", &flags)
            .unwrap_or_else(|error| bad_config(&error));
    let server = DecisionServer::from_config(&config).unwrap_or_else(|error| bad_config(&error));
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .unwrap_or_else(|error| {
            bad_config(&format!("cannot listen on {}: {error}", config.listen))
        });
    let address = listener
        .local_addr()
        .map_or_else(|_| config.listen.clone(), |a| a.to_string());
    tracing::info!(%address, "serving DecisionService");
    agentloop_decision::run(listener, server, agentloop_server::shutdown_signal()).await?;
    Ok(())
}
