//! `agentloop-decision`: serves `DecisionService` with the configured models (scripted,
//! OpenAI-compatible, Anthropic), priced by the config's price table.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`). Building the models is the validation: a
//! missing API key variable or an unreadable script exits with 78, `--dump-config`
//! included.

use std::path::PathBuf;

use agentloop_decision::{DecisionConfig, DecisionServer};
use agentloop_server::Service;
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
    SERVICE
        .main::<Own, DecisionConfig, _, _, _>(DecisionServer::from_config, async |started| {
            let access = SERVICE.access(&started.config);
            let server = started.validated.with_telemetry(&started.telemetry);
            let shutdown = agentloop_server::shutdown_signal();
            Ok(agentloop_decision::run(started.listener, server, access, shutdown).await?)
        })
        .await
}
