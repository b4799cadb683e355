//! The orchestrator that `dev`, `run`, `demo` and the embedded replies start in this
//! process: configured and observed as the orchestrator binary is (its file, its
//! `AGENTLOOP_ORCHESTRATOR_*` variables, `[telemetry]` and the `OTEL_*` variables), so a
//! setting means the same embedded and deployed, and an embedded invocation is one trace
//! of the same spans.

use std::net::SocketAddr;
use std::path::Path;

use agentloop_orchestrator::OrchestratorConfig;
use agentloop_server::{CommonFlags, Configured, Service};
use agentloop_stack::{ServiceTelemetry, Stack, StackOptions};
use agentloop_telemetry::{Metrics, Telemetry};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// The configuration is the orchestrator's, under its variables; spans are exported as
/// the orchestrator's unless `OTEL_SERVICE_NAME` says otherwise.
const ORCHESTRATOR: Service = Service::new("agentloop-orchestrator");

/// A configuration the operator must fix: the command exits 78, as the orchestrator
/// binary does.
#[derive(Debug, thiserror::Error)]
#[error("bad configuration: {0}")]
pub(crate) struct BadConfig(String);

/// How the embedded orchestrator is served, from the command's flags.
#[derive(Debug)]
pub(crate) struct Serving<'a> {
    /// `--config`; without it, the file `AGENTLOOP_ORCHESTRATOR_CONFIG` names, if any.
    pub(crate) config: Option<&'a Path>,
    /// Where the orchestrator listens, over the file's `listen`.
    pub(crate) listen: SocketAddr,
    /// Where `/metrics` is served.
    pub(crate) metrics: MetricsAt,
    /// Where the HTTP/JSON API is served.
    pub(crate) http: HttpAt,
    /// `--insecure-no-auth`.
    pub(crate) insecure_no_auth: bool,
}

/// Where `/metrics` is served.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MetricsAt {
    /// Nowhere, whatever the file says: a command that runs one invocation and exits.
    Nowhere,
    /// At this address (`dev --metrics`), else at the file's `metrics_listen`, if any.
    Configured(Option<SocketAddr>),
}

/// Where `dev` serves the HTTP/JSON API unless told otherwise.
pub(crate) const DEFAULT_HTTP: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 50080);

/// Where the HTTP/JSON API is served.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HttpAt {
    /// Nowhere, whatever the file says: a command that runs one invocation and exits.
    Nowhere,
    /// As `dev --http` says; without the flag, the file's `http_listen`, else
    /// [`DEFAULT_HTTP`].
    Dev(Option<HttpFlag>),
}

/// `--http`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpFlag {
    Off,
    At(SocketAddr),
}

impl std::str::FromStr for HttpFlag {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "off" => Ok(HttpFlag::Off),
            _ => text
                .parse()
                .map(HttpFlag::At)
                .map_err(|_| format!("{text:?} is neither an address (host:port) nor off")),
        }
    }
}

impl Serving<'_> {
    /// A free loopback port, no `/metrics`, nothing else given: the orchestrator of a
    /// command that runs one invocation.
    pub(crate) fn local() -> Self {
        Serving {
            config: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: MetricsAt::Nowhere,
            http: HttpAt::Nowhere,
            insecure_no_auth: false,
        }
    }
}

/// The flags, as overrides of the configuration's keys.
#[derive(Serialize)]
struct Overrides<'a> {
    #[serde(flatten)]
    common: &'a CommonFlags,
    metrics_listen: Option<SocketAddr>,
}

/// The loaded configuration and its telemetry, before the stack starts: the command
/// may still adjust [`Configuration::config`] (a real model's repair turn).
#[derive(Debug)]
pub(crate) struct Configuration {
    /// The orchestrator's configuration, validated, the flags applied.
    pub(crate) config: OrchestratorConfig,
    telemetry: Telemetry,
}

/// Loads, validates and checks the configuration, and starts its telemetry (an exporter
/// when an endpoint is configured; so it runs inside the tokio runtime).
///
/// # Errors
///
/// [`BadConfig`] for anything the operator must fix.
pub(crate) fn configure(serving: Serving<'_>) -> Result<Configuration, BadConfig> {
    let bad = |error: &dyn std::fmt::Display| BadConfig(error.to_string());
    let flags = CommonFlags {
        config: serving.config.map(Path::to_path_buf),
        listen: Some(serving.listen),
        dump_config: false,
        insecure_no_auth: serving.insecure_no_auth,
    };
    let overrides = Overrides {
        common: &flags,
        metrics_listen: match serving.metrics {
            MetricsAt::Configured(address) => address,
            MetricsAt::Nowhere => None,
        },
    };
    let Configured {
        mut config,
        telemetry: resolved,
        ..
    } = ORCHESTRATOR
        .configure(
            &flags,
            &overrides,
            agentloop_server::config::process_env(),
            OrchestratorConfig::validate,
        )
        .map_err(|e| bad(&e))?;
    if let MetricsAt::Nowhere = serving.metrics {
        config.server.metrics_listen = None;
    }
    config.http_listen = match serving.http {
        HttpAt::Nowhere | HttpAt::Dev(Some(HttpFlag::Off)) => None,
        HttpAt::Dev(Some(HttpFlag::At(address))) => Some(address),
        HttpAt::Dev(None) => config.http_listen.or(Some(DEFAULT_HTTP)),
    };
    // The flags are in `config` now, as overrides of its keys.
    for address in std::iter::once(config.server.listen).chain(config.http_listen) {
        agentloop_server::exposure(
            address,
            config.server.auth.is_on(),
            config.server.insecure_no_auth,
        )
        .map_err(|e| bad(&e))?;
    }
    config.validate().map_err(|e| bad(&e))?;
    let telemetry = Telemetry::start(&resolved, Metrics::new()).map_err(|e| bad(&e))?;
    Ok(Configuration { config, telemetry })
}

/// The embedded orchestrator of one command, with what observes it.
#[derive(Debug)]
pub(crate) struct Embedded {
    stack: Stack,
    telemetry: Telemetry,
    metrics: Option<MetricsEndpoint>,
    authenticates: bool,
}

/// `/metrics`, served until [`Embedded::stop`].
#[derive(Debug)]
struct MetricsEndpoint {
    address: SocketAddr,
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl Configuration {
    /// Starts the stack `options` describes, under this configuration and telemetry,
    /// serving `/metrics` where the configuration says.
    ///
    /// # Errors
    ///
    /// [`BadConfig`] when the metrics address cannot be bound; the stack's own errors.
    pub(crate) async fn start(self, mut options: StackOptions) -> anyhow::Result<Embedded> {
        let metrics = match self.config.server.metrics_listen {
            Some(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|e| BadConfig(format!("cannot serve /metrics on {address}: {e}")))?,
            ),
            None => None,
        };
        let authenticates = self.config.server.auth.is_on();
        options.listen = self.config.server.listen.to_string();
        options.orchestrator = self.config;
        options.telemetry = self.telemetry.clone();
        options.services.telemetry = ServiceTelemetry::shared(&self.telemetry);
        let stack = Stack::start(options).await?;
        let metrics = match metrics {
            Some(listener) => {
                let address = listener.local_addr()?;
                let stop = CancellationToken::new();
                let stopped = stop.clone();
                let registry = self.telemetry.metrics().clone();
                let task = tokio::spawn(async move {
                    let shutdown = async move { stopped.cancelled().await };
                    if let Err(error) =
                        agentloop_telemetry::metrics::serve(listener, registry, shutdown).await
                    {
                        tracing::error!(%error, "the metrics endpoint stopped");
                    }
                });
                Some(MetricsEndpoint {
                    address,
                    stop,
                    task: AbortOnDropHandle::new(task),
                })
            }
            None => None,
        };
        Ok(Embedded {
            stack,
            telemetry: self.telemetry,
            metrics,
            authenticates,
        })
    }
}

impl Embedded {
    /// The stack.
    pub(crate) fn stack(&self) -> &Stack {
        &self.stack
    }

    /// Whether it verifies its callers' tokens (`[auth]` is on).
    pub(crate) fn authenticates(&self) -> bool {
        self.authenticates
    }

    /// Where `/metrics` is served, if it is.
    pub(crate) fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|metrics| metrics.address)
    }

    /// Stops the stack, then the metrics endpoint, and exports the spans still buffered
    /// (a command's process ends right after).
    ///
    /// # Errors
    ///
    /// The stack's.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let stopped = self.stack.stop().await;
        if let Some(metrics) = self.metrics {
            metrics.stop.cancel();
            let _ = metrics.task.await;
        }
        self.telemetry.shutdown().await;
        stopped
    }
}
