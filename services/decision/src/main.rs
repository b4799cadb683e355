//! `agentloop-decision`: serves `DecisionService` with the configured models (scripted,
//! OpenAI-compatible, Anthropic), priced by the config's price table.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`). Building the models is the validation: a
//! missing API key variable or an unreadable script exits with 78, `--dump-config`
//! included.

use std::path::PathBuf;

use agentloop_decision::{DecisionConfig, DecisionServer};
use agentloop_server::{Service, Started};
use serde::Serialize;

const SERVICE: Service = Service::new("agentloop-decision").about("The agentloop decision service");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// Scripted-model file used when a request carries no script.
    #[arg(long)]
    script_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = SERVICE.parse::<Own, DecisionConfig>();
    let Started {
        config,
        listener,
        validated: server,
        telemetry,
        ..
    } = SERVICE
        .start(&flags.common, &flags, DecisionServer::from_config)
        .await;
    let access = SERVICE.access(&config.server.auth, config.server.server_tls.as_ref());
    agentloop_decision::run(
        listener,
        server.with_telemetry(&telemetry),
        access,
        agentloop_server::shutdown_signal(),
    )
    .await?;
    // The spans still buffered leave before the process does.
    telemetry.shutdown().await;
    Ok(())
}
