//! `agentloop-demo-executor`: serves the demo tools (lookup, sleep, transfer).

use std::net::SocketAddr;
use std::path::PathBuf;

use agentloop_demo_executor::{DemoConfig, DemoError, DemoExecutor, run};
use clap::Parser;
use serde::Serialize;

/// Command-line flags; each one overrides the config file and the environment.
#[derive(Debug, Parser, Serialize)]
#[command(version, about = "The agentloop demo tool executor")]
struct Flags {
    /// TOML config file (layered under AGENTLOOP_DEMO_EXECUTOR_* env and these flags).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to serve on [default: 127.0.0.1:50061].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Directory of the transfer record.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// JSON file of extra lookup entries.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(skip_serializing_if = "FaultFlags::is_empty")]
    faults: FaultFlags,
}

/// Fault-injection flags (for chaos tests), nested as `faults.*` in the config.
#[derive(Debug, clap::Args, Serialize)]
struct FaultFlags {
    /// Probability of failing before applying a transfer.
    #[arg(long = "fail-before-apply")]
    #[serde(skip_serializing_if = "Option::is_none")]
    fail_before_apply: Option<f64>,
    /// Probability of applying a transfer, then answering UNAVAILABLE.
    #[arg(long = "drop-reply-after-apply")]
    #[serde(skip_serializing_if = "Option::is_none")]
    drop_reply_after_apply: Option<f64>,
    /// Delay (ms) after applying a transfer, before replying.
    #[arg(long = "reply-delay-ms")]
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_delay_ms: Option<u64>,
    /// Probability that a reply is delayed by --reply-delay-ms (default 1: every one).
    #[arg(long = "slow-reply")]
    #[serde(skip_serializing_if = "Option::is_none")]
    slow_reply: Option<f64>,
    /// Seed of the fault RNG.
    #[arg(long = "fault-seed")]
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
}

impl FaultFlags {
    fn is_empty(&self) -> bool {
        self.fail_before_apply.is_none()
            && self.drop_reply_after_apply.is_none()
            && self.reply_delay_ms.is_none()
            && self.slow_reply.is_none()
            && self.seed.is_none()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentloop_server::init_tracing("agentloop-demo-executor");
    let flags = Flags::parse();
    let config: DemoConfig = match agentloop_server::config::load(
        flags.config.as_deref(),
        "AGENTLOOP_DEMO_EXECUTOR_",
        &flags,
    ) {
        Ok(config) => config,
        Err(error) => bad_config(&error),
    };
    let executor = match DemoExecutor::open(config.clone()) {
        Ok(executor) => executor,
        Err(error @ (DemoError::InvalidConfig(_) | DemoError::DataFile { .. })) => {
            bad_config(&error)
        }
        // A damaged record or an unwritable data dir is not a config problem.
        Err(error) => return Err(error.into()),
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, data_dir = %config.data_dir.display(), "serving");
    run(listener, executor, agentloop_server::shutdown_signal()).await?;
    Ok(())
}

fn bad_config(error: &dyn std::fmt::Display) -> ! {
    agentloop_server::exit_bad_config("agentloop-demo-executor", error)
}
