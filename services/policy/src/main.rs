//! `agentloop-policy`: serves `PolicyService` over the tools listed by the gateway
//! (`tools_endpoint`) or read from its registry file (`tools_file`).
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`). The tool descriptors are loaded after the
//! port is bound, since the gateway may still be starting: a tool source that is
//! missing, doubled or unreadable, or a tool schema that does not compile, exits with
//! 78; a gateway that never answers exits with 1.

use std::path::PathBuf;

use agentloop_policy::{PolicyConfig, PolicyError, PolicyServer};
use agentloop_server::Service;
use serde::Serialize;

const SERVICE: Service = Service::new("agentloop-policy").about("The agentloop policy service");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// The tool gateway to list tools from (e.g. http://127.0.0.1:50054).
    #[arg(long)]
    tools_endpoint: Option<String>,
    /// The tool registry file to read instead (the tools service's TOML format).
    #[arg(long)]
    tools_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The tool descriptors may come from the network: only their source is checked
    // before the start.
    SERVICE
        .main::<Own, PolicyConfig, _, _, _>(PolicyConfig::validate, async |started| {
            let server = match PolicyServer::from_config(&started.config).await {
                Ok(server) if server.profiles().is_off() => {
                    tracing::warn!(
                        "no [policies] configured: authorization is off, every call that passes its schema is allowed"
                    );
                    server
                }
                Ok(server) => server,
                Err(error @ PolicyError::ToolsUnavailable { .. }) => return Err(error.into()),
                Err(error) => SERVICE.exit_bad_config(&error),
            };
            let access = SERVICE.access(&started.config);
            let shutdown = agentloop_server::shutdown_signal();
            Ok(agentloop_policy::run(started.listener, server, access, shutdown).await?)
        })
        .await
}
