//! The one client factory for agentloop services.
//!
//! [`connect`] builds a [`Transport`] with the connect and request timeouts of a
//! [`ClientConfig`]; the per-service functions ([`orchestrator`], [`decision`], ...)
//! wrap a transport in the generated client with the message size limit
//! ([`MAX_MESSAGE_BYTES`]). Every service of the workspace gets its clients here, so
//! those settings are chosen in one place. Why a transport of our own rather than
//! tonic's `Channel`: see [`Transport`]'s module.
//!
//! Compression: none. The services' messages are small (a few KB) and travel inside a
//! cluster, and tonic's gzip builds a fresh deflate state for every message (hundreds
//! of KB, zeroed): in the distributed benchmark it cost a third of a turn's CPU and
//! saved nothing worth it. The servers still accept gzip and answer with it when asked
//! (see the `server` module), so a client across a slow link can opt in with
//! `send_compressed` / `accept_compressed` on the generated client.

mod transport;

use std::time::Duration;

use tonic::codegen::http::HeaderValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

pub use transport::Transport;

use crate::MAX_MESSAGE_BYTES;
use crate::v1::decision_service_client::DecisionServiceClient;
use crate::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use crate::v1::orchestrator_service_client::OrchestratorServiceClient;
use crate::v1::policy_service_client::PolicyServiceClient;
use crate::v1::tool_executor_service_client::ToolExecutorServiceClient;
use crate::v1::tool_gateway_service_client::ToolGatewayServiceClient;

/// How [`connect`] builds a transport.
///
/// Construct it with [`ClientConfig::default`] and the `with_*` methods, so fields can
/// be added later without breaking callers.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Longest time to establish the connection (TCP and, for `https`, TLS).
    pub connect_timeout: Duration,
    /// Longest time one unary call may take until its response arrives; `None` leaves
    /// calls unbounded except by their own gRPC deadline. For a server-streaming call
    /// it bounds only the wait for the stream to open. Model calls (`Decide`) can be
    /// slow, so a client of the decision service may want a larger value.
    pub request_timeout: Option<Duration>,
    /// Whether [`connect`] returns at once and connects on first use, instead of
    /// connecting before it returns. Lazy suits services that start before the
    /// services they call; eager reports a wrong address at startup.
    pub lazy: bool,
    /// `authorization: Bearer <token>` on every call that does not carry its own: a
    /// caller's JWT, or a service's token for the services it calls. Never printed.
    bearer: Option<HeaderValue>,
    /// The CA and client certificate of `https` endpoints; `None`: the system's roots.
    tls: Option<ClientTls>,
}

/// What a client trusts and presents over TLS: the servers' CA and, for mutual TLS, its
/// own certificate and key (PEM). The key is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTls {
    /// Trust `ca` (PEM); present `identity` (certificate chain and key, PEM) if given.
    pub fn new(ca: Vec<u8>, identity: Option<(Vec<u8>, Vec<u8>)>) -> ClientTls {
        ClientTls { ca, identity }
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("lazy", &self.lazy)
            .field("bearer", &self.bearer.as_ref().map(|_| "REDACTED"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(30)),
            lazy: false,
            bearer: None,
            tls: None,
        }
    }
}

impl ClientConfig {
    /// Sets [`ClientConfig::connect_timeout`].
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`ClientConfig::request_timeout`].
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`ClientConfig::lazy`].
    #[must_use]
    pub fn with_lazy(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// Trusts the CA of `tls` (instead of the system's roots) for `https` endpoints, and
    /// presents its client certificate; `None` keeps the system's roots.
    #[must_use]
    pub fn with_tls(mut self, tls: Option<ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    /// Sends `authorization: Bearer <token>` with every call (a caller's JWT, or a
    /// service token); `None` sends none.
    ///
    /// # Errors
    ///
    /// [`ConnectError::InvalidToken`] when the token cannot be a header value (control
    /// characters, non-ASCII).
    pub fn with_bearer(mut self, token: Option<&str>) -> Result<Self, ConnectError> {
        self.bearer = match token {
            None => None,
            Some(token) => {
                let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                    .map_err(|_| ConnectError::InvalidToken)?;
                // Kept out of HPACK's table, like every credential.
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(self)
    }
}

/// Why [`connect`] could not produce a transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The endpoint is not a valid URI (expected e.g. `http://127.0.0.1:50051`).
    #[error("invalid endpoint {endpoint:?}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// The parse error.
        #[source]
        source: tonic::transport::Error,
    },
    /// TLS could not be configured for an `https` endpoint.
    #[error("cannot configure TLS for {endpoint:?}")]
    Tls {
        /// The endpoint as given.
        endpoint: String,
        /// The TLS configuration error.
        #[source]
        source: tonic::transport::Error,
    },
    /// TLS settings were given for an `http://` endpoint, which would send in clear.
    #[error("{endpoint:?} is not https:// although TLS is configured")]
    PlainWithTls {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The bearer token is not a valid header value.
    #[error("the token is not a valid header value (control characters or non-ASCII)")]
    InvalidToken,
    /// The connection could not be established (refused, unreachable, timed out).
    #[error("cannot connect to {endpoint:?}")]
    Connect {
        /// The endpoint as given.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::codegen::StdError,
    },
}

/// Builds a transport to `endpoint` (`http://host:port`, or `https://...` for TLS with
/// the system's root certificates) with the timeouts of `config`.
///
/// A [`Transport`] is cheap to clone and multiplexes calls over one HTTP/2 connection;
/// build one per target service and share it. A closed connection is opened again by
/// the next call.
///
/// # Errors
///
/// [`ConnectError::InvalidEndpoint`] for an unparsable endpoint, [`ConnectError::Tls`]
/// when TLS cannot be configured, and [`ConnectError::Connect`] when an eager
/// connection fails.
pub async fn connect(endpoint: &str, config: ClientConfig) -> Result<Transport, ConnectError> {
    let builder = Endpoint::from_shared(endpoint.to_owned()).map_err(|source| {
        ConnectError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            source,
        }
    })?;
    let connect_failed = |source| ConnectError::Connect {
        endpoint: endpoint.to_owned(),
        source,
    };
    let transport = match (builder.uri().scheme_str(), builder.uri().authority()) {
        (Some("https"), _) => {
            let tls = match &config.tls {
                None => ClientTlsConfig::new().with_native_roots(),
                Some(tls) => {
                    let trusted =
                        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
                    match &tls.identity {
                        Some((cert, key)) => trusted.identity(Identity::from_pem(cert, key)),
                        None => trusted,
                    }
                }
            };
            let mut builder = builder
                .connect_timeout(config.connect_timeout)
                .tcp_nodelay(true)
                .tls_config(tls)
                .map_err(|source| ConnectError::Tls {
                    endpoint: endpoint.to_owned(),
                    source,
                })?;
            if let Some(timeout) = config.request_timeout {
                builder = builder.timeout(timeout);
            }
            if config.lazy {
                return Ok(Transport::tls(builder.connect_lazy()).with_authorization(config.bearer));
            }
            let channel = builder
                .connect()
                .await
                .map_err(|error| connect_failed(error.into()))?;
            Transport::tls(channel)
        }
        (_, Some(_)) if config.tls.is_some() => {
            return Err(ConnectError::PlainWithTls {
                endpoint: endpoint.to_owned(),
            });
        }
        (_, Some(authority)) => Transport::plain(
            authority.clone(),
            config.connect_timeout,
            config.request_timeout,
        ),
        (_, None) => {
            return Err(connect_failed(
                "the endpoint names no host (expected e.g. http://127.0.0.1:50051)".into(),
            ));
        }
    };
    if !config.lazy {
        transport.open().await.map_err(connect_failed)?;
    }
    Ok(transport.with_authorization(config.bearer))
}

/// Applies the shared limits to a generated client. A macro because the generated
/// clients share these methods by name, not through a trait.
macro_rules! configured {
    ($client:expr) => {
        $client
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    };
}

/// A client of the orchestrator's public API, with the shared limits.
#[must_use]
pub fn orchestrator(transport: Transport) -> OrchestratorServiceClient<Transport> {
    configured!(OrchestratorServiceClient::new(transport))
}

/// A client of the decision service, with the shared limits.
#[must_use]
pub fn decision(transport: Transport) -> DecisionServiceClient<Transport> {
    configured!(DecisionServiceClient::new(transport))
}

/// A client of the policy service, with the shared limits.
#[must_use]
pub fn policy(transport: Transport) -> PolicyServiceClient<Transport> {
    configured!(PolicyServiceClient::new(transport))
}

/// A client of the tool gateway, with the shared limits.
#[must_use]
pub fn tool_gateway(transport: Transport) -> ToolGatewayServiceClient<Transport> {
    configured!(ToolGatewayServiceClient::new(transport))
}

/// A client of a tool executor, with the shared limits.
#[must_use]
pub fn tool_executor(transport: Transport) -> ToolExecutorServiceClient<Transport> {
    configured!(ToolExecutorServiceClient::new(transport))
}

/// A client of the effect ledger, with the shared limits.
#[must_use]
pub fn effect_ledger(transport: Transport) -> EffectLedgerServiceClient<Transport> {
    configured!(EffectLedgerServiceClient::new(transport))
}
