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
mod service;

use agentloop_auth::Authenticator;
use agentloop_proto::v1 as pb;
use agentloop_runtime::Runtime;

pub use config::OrchestratorConfig;
pub use error::OrchestratorError;
pub use service::Api;

/// The public gRPC API of `runtime`, its callers authenticated by `auth` (`None`: nobody
/// is, and every caller sees every tenant), with the message limits and compression of
/// `agentloop_proto::server`.
pub fn service(
    runtime: &Runtime,
    auth: Option<Authenticator>,
) -> pb::orchestrator_service_server::OrchestratorServiceServer<Api> {
    agentloop_proto::server::orchestrator(Api::new(runtime.clone(), auth))
}

/// Serves `runtime` on `listener` (over `tls`, if given), its callers authenticated by
/// `auth` (`None`: nobody is), until `shutdown` resolves, then drains: new invocations
/// are refused, in-flight turns commit, running invocations park (they are handed off to
/// another worker, or resume on the next start) and in-flight RPCs finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    runtime: Runtime,
    auth: Option<Authenticator>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let services = agentloop_server::ServiceSet::new()
        .tls(tls)
        .add(service(&runtime, auth))
        .drain(async move { runtime.shutdown().await });
    agentloop_server::serve(listener, services, shutdown).await
}
