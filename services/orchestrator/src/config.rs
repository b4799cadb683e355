//! Orchestrator configuration: defaults, then a TOML file, then `AGENTLOOP_*`
//! environment variables, then command-line flags (see `agentloop_server::config`).

use std::net::SocketAddr;
use std::path::PathBuf;

use agentloop_auth::AuthConfig;
use agentloop_runtime::{LimitsConfig, RequestBounds, RuntimeConfig, TenantLimits, WorkersConfig};
use agentloop_server::{ClientSettings, ServerSettings, UnknownKeys};
use serde::{Deserialize, Serialize};

/// Everything the orchestrator can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OrchestratorConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]` (who may
    /// call the public API: `mode = "jwt"` verifies a bearer token on every call and
    /// takes the caller's actor, tenant and roles from it), `insecure_no_auth` (anyone
    /// who reaches the port then acts as any tenant), `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: ServerSettings<AuthConfig>,
    /// Where the public API is also served as HTTP/JSON (`docs/http.md`); unset: not
    /// served. Its callers are authenticated as the gRPC API's, by the same code.
    pub http_listen: Option<SocketAddr>,
    /// How the orchestrator presents itself as an A2A agent on `http_listen`
    /// (`docs/a2a.md`).
    pub a2a: AgentConfig,
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
    /// How it calls the services above, when they check their callers:
    /// `service_token_file`, `[client_tls]`.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// The default profile's budgets.
    pub limits: LimitsConfig,
    /// Bounds on requests.
    pub bounds: RequestBounds,
    /// How this process shares invocations with other orchestrator processes.
    pub workers: WorkersConfig,
    /// Fair use per tenant, beside `bounds.max_running`.
    pub tenants: TenantLimits,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: UnknownKeys,
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            server: ServerSettings::on_port(50051),
            http_listen: None,
            a2a: AgentConfig::default(),
            data_dir: PathBuf::from(".agentloop"),
            decision_endpoint: "http://127.0.0.1:50052".into(),
            policy_endpoint: "http://127.0.0.1:50053".into(),
            tools_endpoint: "http://127.0.0.1:50054".into(),
            ledger_endpoint: "http://127.0.0.1:50055".into(),
            database_url: None,
            client: ClientSettings::default(),
            limits: LimitsConfig::default(),
            bounds: RequestBounds::default(),
            workers: WorkersConfig::default(),
            tenants: TenantLimits::default(),
            unknown: UnknownKeys,
        }
    }
}

/// The orchestrator's Agent Card, as far as an operator words it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's name.
    pub name: String,
    /// What it does, for people and for a calling agent's model.
    pub description: String,
}

impl Default for AgentConfig {
    fn default() -> AgentConfig {
        let card = agentloop_a2a::CardSettings::default();
        AgentConfig {
            name: card.name,
            description: card.description,
        }
    }
}

impl AgentConfig {
    /// The card's settings; `bearer` when the API authenticates its callers.
    pub fn card(&self, bearer: bool) -> agentloop_a2a::CardSettings {
        agentloop_a2a::CardSettings {
            name: self.name.clone(),
            description: self.description.clone(),
            bearer,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for OrchestratorConfig {
    type Auth = AuthConfig;

    fn server(&self) -> &ServerSettings<AuthConfig> {
        &self.server
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
        self.server.auth.validate()?;
        if self.a2a.name.trim().is_empty() || self.a2a.name.len() > 256 {
            return Err("a2a.name must be 1 to 256 bytes".into());
        }
        if self.a2a.description.len() > 4096 {
            return Err("a2a.description must be at most 4096 bytes".into());
        }
        if self.http_listen.is_some() && self.server.server_tls.is_some() {
            return Err(
                "http_listen serves plain HTTP: with server_tls, terminate TLS in front of it \
                 (an ingress or a sidecar) or leave http_listen unset"
                    .into(),
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_card_is_named_within_bounds() {
        assert_eq!(OrchestratorConfig::default().validate(), Ok(()));
        for a2a in [
            AgentConfig {
                name: " ".into(),
                ..AgentConfig::default()
            },
            AgentConfig {
                name: "n".repeat(257),
                ..AgentConfig::default()
            },
            AgentConfig {
                description: "d".repeat(4097),
                ..AgentConfig::default()
            },
        ] {
            let config = OrchestratorConfig {
                a2a,
                ..OrchestratorConfig::default()
            };
            assert!(config.validate().is_err(), "{:?}", config.a2a);
        }
    }
}
