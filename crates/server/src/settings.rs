//! The settings every service shares, defined once: where it listens and serves
//! metrics, who may call it and over which TLS, its telemetry, and how it calls the
//! other services. Each service's configuration flattens them in, so their keys stay at
//! the top level of its file (`listen`, `metrics_listen`, `[auth]`, `insecure_no_auth`,
//! `[telemetry]`, `[server_tls]`; `service_token_file`, `[client_tls]`).
//!
//! A flattened configuration cannot refuse unknown keys the usual way (serde's
//! `deny_unknown_fields` does not combine with `flatten`), so each one ends with an
//! [`UnknownKeys`] field, which refuses whatever key no other field took.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{ClientTlsFiles, ServerTls};

/// How a service's callers are authenticated: the callers it lists by service token or
/// certificate (`agentloop_auth::CallersConfig`), or, for the orchestrator's public API,
/// verified tokens (`agentloop_auth::AuthConfig`).
pub trait CallerAuth {
    /// Whether every caller is authenticated.
    fn is_on(&self) -> bool;
}

impl CallerAuth for agentloop_auth::CallersConfig {
    fn is_on(&self) -> bool {
        agentloop_auth::CallersConfig::is_on(self)
    }
}

impl CallerAuth for agentloop_auth::AuthConfig {
    fn is_on(&self) -> bool {
        agentloop_auth::AuthConfig::is_on(self)
    }
}

/// Where a service listens and who may call it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerSettings<A = agentloop_auth::CallersConfig> {
    /// The address to serve gRPC on, as IP:port.
    pub listen: SocketAddr,
    /// Where `/metrics` is served, as IP:port (Prometheus); unset: nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Who may call it (`[auth]`). With nobody authenticated, anyone who reaches the
    /// port is served, so it must be loopback (or `insecure_no_auth`).
    pub auth: A,
    /// Serve a non-loopback address without `auth` all the same (`--insecure-no-auth`):
    /// logged as a warning at start.
    pub insecure_no_auth: bool,
    /// Traces (OTLP), what content they may carry, and the log format (`[telemetry]`).
    pub telemetry: agentloop_telemetry::TelemetryConfig,
    /// TLS on the listener; with `client_ca_file`, mutual TLS, and `auth` may name
    /// callers by the SPIFFE ID of their certificates.
    pub server_tls: Option<ServerTls>,
}

impl<A: Default> ServerSettings<A> {
    /// The settings of a service whose default address is `127.0.0.1:port`.
    pub fn on_port(port: u16) -> Self {
        ServerSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            metrics_listen: None,
            auth: A::default(),
            insecure_no_auth: false,
            telemetry: agentloop_telemetry::TelemetryConfig::default(),
            server_tls: None,
        }
    }
}

impl<A: Default> Default for ServerSettings<A> {
    /// Port 0: a service's own default names its port ([`ServerSettings::on_port`]).
    fn default() -> Self {
        ServerSettings::on_port(0)
    }
}

/// How a service calls the others, when they check their callers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientSettings {
    /// The file holding this service's token for the services it calls.
    pub service_token_file: Option<PathBuf>,
    /// TLS of its calls (`https://` endpoints): the CA and, for mutual TLS, its
    /// certificate.
    pub client_tls: Option<ClientTlsFiles>,
}

/// The keys of a configuration that no setting took: refused, by name, as it loads.
/// Put it last in a configuration that flattens [`ServerSettings`], flattened too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnknownKeys;

impl<'de> Deserialize<'de> for UnknownKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Refuse;

        impl<'de> Visitor<'de> for Refuse {
            type Value = UnknownKeys;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("no other keys")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<UnknownKeys, M::Error> {
                match map.next_key::<String>()? {
                    Some(key) => Err(serde::de::Error::unknown_field(&key, &[])),
                    None => Ok(UnknownKeys),
                }
            }
        }

        deserializer.deserialize_map(Refuse)
    }
}

impl Serialize for UnknownKeys {
    /// Nothing: it holds no setting.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        serializer.serialize_map(Some(0))?.end()
    }
}
