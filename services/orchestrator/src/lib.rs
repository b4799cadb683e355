//! The agentloop orchestrator service: the runtime ([`agentloop_runtime`]) behind the
//! public gRPC API, reaching the decision, policy and tool services and the effect ledger
//! over gRPC.
//!
//! This crate is the runtime's one seam to the wire: the API converts requests into the
//! runtime's types and its answers back ([`service`]), the ports' adapters do the same
//! for the calls the runtime makes ([`grpc`], with the messages in [`calls`]), and
//! [`agentloop_wire`] holds the conversions of the engine's values that both use.
#![warn(missing_docs)]

pub mod calls;
mod config;
mod error;
pub mod grpc;
mod input;
mod service;
mod stats;

use agentloop_auth::Authenticator;
use agentloop_proto::v1 as pb;
use agentloop_runtime::Runtime;
use agentloop_server::Observed;

pub use config::{AgentConfig, OrchestratorConfig};
pub use error::OrchestratorError;
pub use service::Api;

/// The public gRPC API of `runtime`, its callers authenticated by `auth` (`None`: nobody
/// is, and every caller sees every tenant), with the message limits and compression of
/// `agentloop_proto::server`.
pub fn service(runtime: &Runtime, auth: Option<Authenticator>) -> OrchestratorApi {
    agentloop_proto::server::orchestrator(Api::new(runtime.clone(), auth))
}

/// The public API as HTTP/JSON ([`agentloop_http`]), with the operator console
/// ([`agentloop_console`]) at `/` and the A2A agent ([`agentloop_a2a`]) presented by
/// `card`: every call goes through `service`, the gRPC API the orchestrator's listener
/// serves, so all three share one implementation, its authentication and its bounds;
/// each call is recorded in `telemetry` as a gRPC one is (its server span, its answer's
/// code).
///
/// # Errors
///
/// When the protos' `google.api.http` options cannot be served (a build defect).
pub fn http_api(
    service: OrchestratorApi,
    telemetry: &agentloop_telemetry::Telemetry,
    card: agentloop_a2a::CardSettings,
) -> Result<agentloop_http::Gateway<Observed<OrchestratorApi>>, agentloop_http::RouteError> {
    use tonic::server::NamedService;
    let observed = agentloop_server::observed(telemetry, service);
    let agent = agentloop_a2a::Agent::new(observed.clone(), card);
    Ok(agentloop_http::Gateway::new(
        agentloop_proto::FILE_DESCRIPTOR_SET,
        OrchestratorApi::NAME,
        observed,
    )?
    .with_pages(agentloop_console::page)
    .with_mount(std::sync::Arc::new(agent)))
}

/// The gRPC API as [`service`] serves it.
pub type OrchestratorApi = pb::orchestrator_service_server::OrchestratorServiceServer<Api>;

/// Serves `runtime` on `listener` (over `tls`, if given), and as HTTP/JSON on `http` if
/// given, its callers authenticated by `auth` (`None`: nobody is), until `shutdown`
/// resolves, then drains: new invocations are refused, in-flight turns commit, running
/// invocations park (they are handed off to another worker, or resume on the next
/// start) and in-flight RPCs finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    http: Option<tokio::net::TcpListener>,
    card: agentloop_a2a::CardSettings,
    runtime: Runtime,
    auth: Option<Authenticator>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    use futures::FutureExt;
    let api = service(&runtime, auth);
    let telemetry = agentloop_server::process_telemetry();
    let gateway = http
        .is_some()
        .then(|| http_api(api.clone(), &telemetry, card))
        .transpose()?;
    let shutdown = shutdown.shared();
    let http = async {
        match (http, gateway) {
            (Some(listener), Some(gateway)) => {
                agentloop_http::serve(listener, gateway, shutdown.clone()).await
            }
            (_, _) => Ok(()),
        }
    };
    let services = agentloop_server::ServiceSet::new()
        .tls(tls)
        .add(api)
        .drain(async move { runtime.shutdown().await });
    let grpc = agentloop_server::serve(listener, services, shutdown.clone());
    let (grpc, http) = tokio::join!(grpc, http);
    grpc?;
    Ok(http?)
}

/// Why [`run`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The gRPC server failed.
    #[error(transparent)]
    Grpc(#[from] agentloop_server::ServeError),
    /// The HTTP/JSON routes could not be built.
    #[error("the HTTP/JSON API: {0}")]
    Routes(#[from] agentloop_http::RouteError),
    /// The HTTP/JSON server failed.
    #[error("the HTTP/JSON API: {0}")]
    Http(#[from] std::io::Error),
}
