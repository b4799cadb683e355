//! `agentloop-demo-executor`: serves the demo tools (lookup, sleep, transfer) and the
//! `transfer_recorded` verifier.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`); fault probabilities out of range, or a lookup
//! data file that cannot be read, exit with 78.

use std::path::PathBuf;

use agentloop_demo_executor::{DemoConfig, DemoError, DemoExecutor, run};
use agentloop_server::Service;
use serde::Serialize;

const SERVICE: Service =
    Service::new("agentloop-demo-executor").about("The agentloop demo tool executor");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// Directory of the transfer record.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// JSON file of extra lookup entries.
    #[arg(long)]
    data_file: Option<PathBuf>,
    #[command(flatten)]
    faults: FaultFlags,
}

/// Fault-injection flags (for chaos tests), nested as `faults.*` in the config.
#[derive(Debug, clap::Args, Serialize)]
struct FaultFlags {
    /// Probability of failing before applying a transfer.
    #[arg(long = "fail-before-apply")]
    fail_before_apply: Option<f64>,
    /// Probability of applying a transfer, then answering UNAVAILABLE.
    #[arg(long = "drop-reply-after-apply")]
    drop_reply_after_apply: Option<f64>,
    /// Delay (ms) after applying a transfer, before replying.
    #[arg(long = "reply-delay-ms")]
    reply_delay_ms: Option<u64>,
    /// Probability that a reply is delayed by --reply-delay-ms (default 1: every one).
    #[arg(long = "slow-reply")]
    slow_reply: Option<f64>,
    /// Seed of the fault RNG.
    #[arg(long = "fault-seed")]
    seed: Option<u64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Opening the executor creates the data directory, which `--dump-config` must not:
    // only the faults are checked before the start.
    let faults = |config: &DemoConfig| config.faults.validate();
    SERVICE
        .main::<Own, DemoConfig, _, _, _>(faults, async |started| {
            let config = &started.config;
            let executor = match DemoExecutor::open(config.clone()) {
                Ok(executor) => executor,
                Err(error @ (DemoError::InvalidConfig(_) | DemoError::DataFile { .. })) => {
                    SERVICE.exit_bad_config(&error)
                }
                // A damaged record or an unwritable data dir is not a config problem.
                Err(error) => return Err(error.into()),
            };
            tracing::info!(data_dir = %config.data_dir.display(), "serving");
            let access = SERVICE.access(config);
            let shutdown = agentloop_server::shutdown_signal();
            Ok(run(started.listener, executor, access, shutdown).await?)
        })
        .await
}
