//! Orchestrator configuration: defaults, then a TOML file, then `AGENTLOOP_*`
//! environment variables, then command-line flags (see `agentloop_server::config`).

use std::net::SocketAddr;
use std::path::PathBuf;

use agentloop_auth::AuthConfig;
use agentloop_runtime::{LimitsConfig, RequestBounds, RuntimeConfig, TenantLimits, WorkersConfig};
use serde::{Deserialize, Serialize};

/// Everything the orchestrator can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrchestratorConfig {
    /// Address to serve gRPC on.
    pub listen: SocketAddr,
    /// Where `/metrics` is served, as IP:port (Prometheus); unset: nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Where the embedded event store keeps its files (unused with `database_url`).
    pub data_dir: PathBuf,
    /// A PostgreSQL event store (`postgres://…`) shared by several orchestrator
    /// processes; unset for the embedded SQLite store in `data_dir`.
    pub database_url: Option<String>,
    /// The decision service.
    pub decision_endpoint: String,
    /// The policy service.
    pub policy_endpoint: String,
    /// The tool gateway.
    pub tools_endpoint: String,
    /// The effect ledger.
    pub ledger_endpoint: String,
    /// This orchestrator's token for the services above, when they check their callers.
    pub service_token_file: Option<PathBuf>,
    /// TLS of its calls to the services above (`https://` endpoints): the CA and, for
    /// mutual TLS, its certificate.
    pub client_tls: Option<agentloop_server::ClientTlsFiles>,
    /// TLS on the public listener.
    pub server_tls: Option<agentloop_server::ServerTls>,
    /// The default profile's budgets.
    pub limits: LimitsConfig,
    /// Bounds on requests.
    pub bounds: RequestBounds,
    /// How this process shares invocations with other orchestrator processes.
    pub workers: WorkersConfig,
    /// Who may call the public API: `mode = "jwt"` verifies a bearer token on every
    /// call and takes the caller's actor, tenant and roles from it.
    pub auth: AuthConfig,
    /// Fair use per tenant, beside `bounds.max_running`.
    pub tenants: TenantLimits,
    /// Serve a non-loopback address without `auth` all the same (`--insecure-no-auth`):
    /// anyone who reaches the port acts as any tenant. Logged as a warning at start.
    pub insecure_no_auth: bool,
    /// Traces (OTLP), what content they may carry, and the log format (`[telemetry]`).
    pub telemetry: agentloop_telemetry::TelemetryConfig,
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from(".agentloop"),
            decision_endpoint: "http://127.0.0.1:50052".into(),
            policy_endpoint: "http://127.0.0.1:50053".into(),
            tools_endpoint: "http://127.0.0.1:50054".into(),
            ledger_endpoint: "http://127.0.0.1:50055".into(),
            database_url: None,
            service_token_file: None,
            client_tls: None,
            server_tls: None,
            limits: LimitsConfig::default(),
            bounds: RequestBounds::default(),
            workers: WorkersConfig::default(),
            auth: AuthConfig::default(),
            tenants: TenantLimits::default(),
            insecure_no_auth: false,
            metrics_listen: None,
            telemetry: agentloop_telemetry::TelemetryConfig::default(),
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for OrchestratorConfig {
    fn listen(&self) -> SocketAddr {
        self.listen
    }

    fn authenticates_callers(&self) -> bool {
        self.auth.is_on()
    }

    fn insecure_no_auth(&self) -> bool {
        self.insecure_no_auth
    }

    fn metrics_listen(&self) -> Option<std::net::SocketAddr> {
        self.metrics_listen
    }

    fn telemetry(&self) -> &agentloop_telemetry::TelemetryConfig {
        &self.telemetry
    }
}

impl OrchestratorConfig {
    /// The settings its runtime reads.
    pub fn runtime(&self) -> RuntimeConfig {
        RuntimeConfig {
            limits: self.limits,
            bounds: self.bounds,
            tenants: self.tenants,
        }
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.limits.max_steps == 0 {
            return Err("limits.max_steps must be at least 1".into());
        }
        if self.limits.max_steps > self.bounds.max_steps_cap {
            return Err("limits.max_steps is above bounds.max_steps_cap".into());
        }
        if self.limits.max_wait_ms == 0 || self.limits.max_wait_ms > self.bounds.max_wait_cap_ms {
            return Err("limits.max_wait_ms must be within 1..=bounds.max_wait_cap_ms".into());
        }
        if self.limits.wait_sweep_ms == 0 {
            return Err("limits.wait_sweep_ms must be at least 1".into());
        }
        if self.limits.tool_timeout_ms == 0 {
            return Err("limits.tool_timeout_ms must be at least 1".into());
        }
        if self.workers.lease_ttl_ms < 30 {
            return Err("workers.lease_ttl_ms must be at least 30".into());
        }
        if self.workers.sweep_every_ms == 0 {
            return Err("workers.sweep_every_ms must be at least 1".into());
        }
        if let Some(url) = &self.database_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            // Not echoed: it may hold a password.
            return Err("database_url must be a postgres:// URL".into());
        }
        if let Some(url) = &self.workers.redis_url
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return Err("workers.redis_url must be a redis:// or rediss:// URL".into());
        }
        if self.bounds.max_running == 0 {
            return Err("bounds.max_running must be at least 1".into());
        }
        if self.tenants.start_burst > 0 && self.tenants.starts_per_s == 0 {
            return Err("tenants.start_burst needs tenants.starts_per_s".into());
        }
        self.auth.validate()?;
        for (name, endpoint) in [
            ("decision_endpoint", &self.decision_endpoint),
            ("policy_endpoint", &self.policy_endpoint),
            ("tools_endpoint", &self.tools_endpoint),
            ("ledger_endpoint", &self.ledger_endpoint),
        ] {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(format!(
                    "{name} must be an http:// or https:// URL, not {endpoint:?}"
                ));
            }
        }
        Ok(())
    }
}
