//! `agentloop-tools`: the tool registry and gateway.
//!
//! Flags, configuration layers and exit codes are those of every agentloop service
//! (`agentloop_server::Service::start`). Loading the registry is the validation: no
//! `tools` file, or one that is unreadable or invalid, exits with 78, `--dump-config`
//! included.

use std::path::PathBuf;

use agentloop_server::{Service, Started};
use agentloop_tools::{Gateway, ToolsConfig, ToolsServiceConfig, run};
use serde::Serialize;

const SERVICE: Service = Service::new("agentloop-tools").about("The agentloop tool gateway");

/// The flags of this service beside the common ones; each one given overrides the
/// configuration key of its name.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    /// The tool registry (TOML with [[tools]], [[verifiers]] and [[executors]] entries).
    #[arg(long)]
    tools: Option<PathBuf>,
}

/// The registry `config.tools` names, loaded and validated, once the registrars are
/// known callers.
fn registry(config: &ToolsServiceConfig) -> anyhow::Result<ToolsConfig> {
    for registrar in &config.registrars {
        if !config
            .server
            .auth
            .callers
            .iter()
            .any(|caller| &caller.name == registrar)
        {
            anyhow::bail!("registrar {registrar:?} is not one of auth.callers");
        }
    }
    let path = config.tools.as_deref().ok_or_else(|| {
        anyhow::anyhow!("no tool registry: pass --tools <file> (or set `tools` in the config)")
    })?;
    Ok(ToolsConfig::load(path)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    SERVICE
        .main::<Own, ToolsServiceConfig, _, _, _>(registry, async |started| {
            let Started {
                config,
                validated: registry,
                listener,
                ..
            } = started;
            let executors = registry.executors.len();
            let client = SERVICE.client(&config.client);
            let limits = config.limits.clone();
            let gateway = Gateway::with_in_process(registry, limits, Vec::new(), client)
                .await
                .unwrap_or_else(|error| SERVICE.exit_bad_config(&error));
            // With callers authenticated, only the named registrars may register executors.
            let gateway = if config.server.auth.is_on() {
                gateway.with_registrars(config.registrars.clone())
            } else {
                gateway
            };
            let tools = gateway.descriptors().len();
            tracing::info!(tools, executors, "serving");
            let access = SERVICE.access(&config);
            Ok(run(
                listener,
                gateway,
                access,
                agentloop_server::shutdown_signal(),
            )
            .await?)
        })
        .await
}
