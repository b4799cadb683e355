//! `agentloop-policy`: serves `PolicyService` over the tools listed by the gateway
//! (`tools_endpoint`) or read from its registry file (`tools_file`).
//!
//! Configuration layers: defaults -> `--config` TOML file -> `AGENTLOOP_POLICY_*`
//! environment -> flags. A bad configuration (including a tool schema that does not
//! compile) exits with `EXIT_BAD_CONFIG` (78); an unreachable gateway exits with 1.

use std::path::PathBuf;

use agentloop_policy::{PolicyConfig, PolicyError, PolicyServer};
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one given overrides the configuration file and environment.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "agentloop-policy",
    version,
    about = "The agentloop policy service"
)]
struct Flags {
    /// TOML configuration file.
    #[arg(long, env = "AGENTLOOP_POLICY_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on (e.g. 127.0.0.1:50053).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// The tool gateway to list tools from (e.g. http://127.0.0.1:50054).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tools_endpoint: Option<String>,
    /// The tool registry file to read instead (the tools service's TOML format).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tools_file: Option<PathBuf>,
}

fn bad_config(error: &dyn std::fmt::Display) -> ! {
    agentloop_server::exit_bad_config("agentloop-policy", error)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::init_tracing("agentloop-policy");
    let flags = Flags::parse();
    let config: PolicyConfig =
        agentloop_server::config::load(flags.config.as_deref(), "AGENTLOOP_POLICY_", &flags)
            .unwrap_or_else(|error| bad_config(&error));
    let server = match PolicyServer::from_config(&config).await {
        Ok(server) => server,
        Err(error @ PolicyError::ToolsUnavailable { .. }) => return Err(error.into()),
        Err(error) => bad_config(&error),
    };
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .unwrap_or_else(|error| {
            bad_config(&format!("cannot listen on {}: {error}", config.listen))
        });
    let address = listener
        .local_addr()
        .map_or_else(|_| config.listen.clone(), |a| a.to_string());
    tracing::info!(%address, "serving PolicyService");
    agentloop_policy::run(listener, server, agentloop_server::shutdown_signal()).await?;
    Ok(())
}
