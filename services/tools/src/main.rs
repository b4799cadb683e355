//! `agentloop-tools`: the tool registry and gateway.

use std::net::SocketAddr;
use std::path::PathBuf;

use agentloop_tools::{Gateway, ToolsConfig, ToolsServiceConfig, run};
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one overrides the config file and the environment.
#[derive(Debug, Parser, Serialize)]
#[command(version, about = "The agentloop tool gateway")]
struct Flags {
    /// TOML config file (layered under AGENTLOOP_TOOLS_* env and these flags).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to serve on [default: 127.0.0.1:50054].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// The tool registry (TOML with [[tools]] entries).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::init_tracing("agentloop-tools");
    agentloop_server::install_crypto_provider(); // https executors use rustls
    let flags = Flags::parse();
    let config: ToolsServiceConfig =
        match agentloop_server::config::load(flags.config.as_deref(), "AGENTLOOP_TOOLS_", &flags) {
            Ok(config) => config,
            Err(error) => bad_config(&error),
        };
    let Some(tools_path) = config.tools.as_deref() else {
        bad_config(&"no tool registry: pass --tools <file> (or set `tools` in the config)")
    };
    let registry = match ToolsConfig::load(tools_path) {
        Ok(registry) => registry,
        Err(error) => bad_config(&error),
    };
    let count = registry.tools.len();
    let gateway = match Gateway::new(registry, config.limits.clone()).await {
        Ok(gateway) => gateway,
        Err(error) => bad_config(&error),
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, tools = count, "serving");
    run(listener, gateway, agentloop_server::shutdown_signal()).await?;
    Ok(())
}

fn bad_config(error: &dyn std::fmt::Display) -> ! {
    agentloop_server::exit_bad_config("agentloop-tools", error)
}
