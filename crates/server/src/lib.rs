//! The one gRPC server builder of agentloop, shared by every service binary.
//!
//! Six services would otherwise repeat the same plumbing; here it is written once:
//!
//! - [`Service::start`] with [`CommonFlags`]: the start of every `main.rs` — the
//!   `--config`, `--listen` and `--dump-config` flags, the layered configuration,
//!   the service's validation, and bind-or-exit, with one exit code
//!   ([`EXIT_BAD_CONFIG`]) and one message shape for every configuration problem;
//! - [`serve`] with a [`ServiceSet`]: a tonic server over a caller-bound listener (its
//!   connections with TCP_NODELAY), with a tracing layer, the standard gRPC health
//!   service (SERVING for every added service, NOT_SERVING as soon as shutdown begins)
//!   and gRPC server reflection from the agentloop descriptor set, then a graceful drain
//!   of in-flight RPCs;
//! - [`config::load`]: layered configuration (defaults -> TOML file -> `AGENTLOOP_*`
//!   environment -> command-line overrides);
//! - [`shutdown_signal`] for the binaries, and [`install_crypto_provider`] for the
//!   processes and tests that build rustls clients without the rest of the start.
//!
//! It is *not* a service: it holds no business logic, no storage and no client code.
//! [`serve`] does not choose addresses (the caller binds the listener, so tests can use
//! port 0); [`Service::start`] binds the address the configuration names.

#![warn(missing_docs)]

pub mod config;
mod dump;
mod guard;
mod observe;
mod settings;
mod start;
mod tls;

pub use observe::Observed;
pub use settings::{CallerAuth, ClientSettings, ServerSettings, UnknownKeys};
pub use start::{
    CommonFlags, Configured, Flags, Prepared, Service, ServiceConfig, StartError, Started,
    client_config, exposure,
};
pub use tls::{Access, ClientTlsFiles, ServerTls};

use std::convert::Infallible;
use std::future::Future;
use std::sync::Once;

use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::Service as TowerService;
use tonic::codegen::http::{Request, Response};
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tower_http::classify::{GrpcCode, GrpcErrorsAsFailures, SharedClassifier};
use tower_http::trace::TraceLayer;

/// Process exit code for a configuration that cannot be loaded or is invalid
/// (`EX_CONFIG` from BSD `sysexits.h`). A fixed, distinct code lets supervisors tell
/// "fix the config" apart from a crash and stop restarting a binary that cannot start.
pub const EXIT_BAD_CONFIG: i32 = 78;

/// Reports a configuration that cannot be used and exits with [`EXIT_BAD_CONFIG`]: to the
/// log and to stderr (the log may not be set up, or go somewhere nobody looks at start-up).
/// Binaries reach it as [`Service::exit_bad_config`], which supplies `service`.
pub(crate) fn exit_bad_config(service: &str, error: &dyn std::fmt::Display) -> ! {
    tracing::error!(service, %error, "bad configuration");
    eprintln!("{service}: bad configuration: {error}");
    std::process::exit(EXIT_BAD_CONFIG)
}

static CRYPTO_PROVIDER: Once = Once::new();

/// The telemetry of the service this process runs, set by [`Service::start`].
static PROCESS_TELEMETRY: std::sync::OnceLock<agentloop_telemetry::Telemetry> =
    std::sync::OnceLock::new();

/// The telemetry [`Service::start`] built for this process's service (its tracer, its
/// `/metrics` registry), which [`ServiceSet::new`] records with; before a start, or in
/// a process that runs several services (tests, the embedded stack), telemetry that
/// exports nothing, unless a set is given its own with [`ServiceSet::telemetry`].
pub fn process_telemetry() -> agentloop_telemetry::Telemetry {
    PROCESS_TELEMETRY.get().cloned().unwrap_or_default()
}

pub(crate) fn set_process_telemetry(telemetry: &agentloop_telemetry::Telemetry) {
    let _ = PROCESS_TELEMETRY.set(telemetry.clone());
}

/// Installs `ring` as the process-wide rustls crypto provider.
///
/// The workspace builds rustls with `ring` only (no aws-lc-rs), so rustls cannot pick a
/// provider by itself: without this call, building any rustls client (reqwest, rmcp,
/// a TLS tonic channel) panics, even for `http://` URLs. Call it first thing in `main`
/// and in tests that build such clients. Calling it more than once is harmless; if
/// another provider was installed first, that one stays.
pub fn install_crypto_provider() {
    CRYPTO_PROVIDER.call_once(|| {
        // An `Err` only means a provider is already installed, which is what we want.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Sets up the log of a service binary (step 4 of [`Service::start`], once the
/// configuration chose the format): `RUST_LOG` syntax
/// (default `info`), text lines or, with `format` JSON, JSON lines with trace IDs. Safe
/// to call more than once (later calls, and calls after a test harness installed its own
/// subscriber, do nothing).
pub(crate) fn init_log(service: &str, format: agentloop_telemetry::LogFormat) {
    if agentloop_telemetry::log::init(format, "info") {
        tracing::info!(service, ?format, "log initialised");
    }
}

/// Resolves when the process receives SIGTERM (what orchestrators send) or SIGINT
/// (Ctrl-C), whichever comes first. Pass it to [`serve`] as the shutdown future.
///
/// If a handler cannot be installed (which only happens in unusual sandboxes), the
/// failure is logged and the other signal still works.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
}

/// Why [`serve`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not be built from the descriptor sets (a build
    /// problem in `agentloop-proto`, not a runtime one).
    #[error("cannot build the gRPC reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed while serving (accepting or serving connections).
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A generated tonic server (or one wrapped like it) that a [`ServiceSet`] can route to.
pub trait Routable:
    TowerService<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Routable for S where
    S: TowerService<
            Request<Body>,
            Response = Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The gRPC services one process serves, collected before [`serve`] adds the shared
/// health, reflection and tracing on top.
///
/// Services of different types are combined through tonic's [`RoutesBuilder`]; the
/// names are kept so that health can report each one.
pub struct ServiceSet {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    telemetry: agentloop_telemetry::Telemetry,
    drain: Option<Drain>,
}

/// What a service does between NOT_SERVING and closing its listener.
type Drain = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl std::fmt::Debug for ServiceSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSet")
            .field("names", &self.names)
            .field("tls", &self.tls.is_some())
            .field("drain", &self.drain.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ServiceSet {
    fn default() -> Self {
        Self {
            routes: RoutesBuilder::default(),
            names: Vec::new(),
            tls: None,
            telemetry: process_telemetry(),
            drain: None,
        }
    }
}

impl ServiceSet {
    /// An empty set (health and reflection are still served), recording with the
    /// process's telemetry ([`process_telemetry`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a generated tonic server (e.g. from `agentloop_proto::server`). Its
    /// [`NamedService::NAME`] is reported SERVING by health and advertised by reflection.
    #[must_use]
    #[allow(
        clippy::should_implement_trait,
        reason = "the builder name every service codes against; `+` on services would be odd"
    )]
    pub fn add<S: Routable>(mut self, service: S) -> Self {
        self.routes.add_service(service);
        self.names.push(S::NAME);
        self
    }

    /// Records the RPCs' server spans and answer counts with `telemetry` (the service's
    /// own); without it, into a registry nobody scrapes, and no spans.
    #[must_use]
    pub fn telemetry(mut self, telemetry: &agentloop_telemetry::Telemetry) -> Self {
        self.telemetry = telemetry.clone();
        self
    }

    /// Runs `drain` once shutdown is asked for, after health has turned NOT_SERVING
    /// and before the listener closes: the service's own wind-down (the orchestrator
    /// parks its runners), during which balancers and readiness probes already see the
    /// process leaving while its connections still serve.
    #[must_use]
    pub fn drain(mut self, drain: impl Future<Output = ()> + Send + 'static) -> Self {
        self.drain = Some(Box::pin(drain));
        self
    }

    /// Serves over TLS (`None`: plain text); with a client CA, mutual TLS.
    #[must_use]
    pub fn tls(mut self, tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// Adds `service` as `access` says: over its TLS, and behind its callers (`None`:
    /// open, as [`ServiceSet::add`] adds it). A call without the credentials of one of the
    /// callers is UNAUTHENTICATED before it reaches the service, and the service finds the
    /// caller's name in the request's extensions ([`agentloop_auth::Caller`]). Health and
    /// reflection stay open (probes carry no credentials, and neither reveals data).
    #[must_use]
    pub fn add_for<S: Routable>(self, service: S, access: &Access) -> Self {
        let set = self.tls(access.tls.clone());
        match &access.callers {
            Some(callers) => set.add(guard::Guarded::new(service, callers.clone())),
            None => set.add(service),
        }
    }

    /// The fully-qualified gRPC names of the added services, in the order added.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }
}

fn caller_errors_are_not_failures() -> GrpcErrorsAsFailures {
    [
        GrpcCode::Cancelled,
        GrpcCode::InvalidArgument,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::FailedPrecondition,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
    ]
    .into_iter()
    .fold(
        GrpcErrorsAsFailures::new(),
        GrpcErrorsAsFailures::with_success,
    )
}

/// `service` with what [`serve`] records of every RPC it answers, in `telemetry`: a server
/// span that continues the caller's trace, and the count of answers by code. For callers
/// that hand requests to a service themselves (the HTTP/JSON API), so that their calls
/// are observed as the gRPC listener's are.
pub fn observed<S: tonic::server::NamedService>(
    telemetry: &agentloop_telemetry::Telemetry,
    service: S,
) -> Observed<S> {
    use tower::Layer;
    observe::Observe::new(telemetry.clone(), vec![S::NAME]).layer(service)
}

/// Serves `services` on `listener` until `shutdown` resolves, then drains.
///
/// Adds, for every process alike: a tracing span per RPC, a server span continuing the
/// caller's trace and the count of answers by code (with the set's telemetry), `grpc.health.v1.Health`
/// (overall status `""` and each added service SERVING) and gRPC reflection v1 and
/// v1alpha over the agentloop descriptor set. When `shutdown` resolves, health flips
/// every status to NOT_SERVING first (so load balancers stop routing), then the set's
/// [`ServiceSet::drain`] runs, then tonic stops accepting connections and waits for
/// in-flight RPCs to finish before this returns `Ok(())`.
///
/// The caller binds the listener, so tests can bind `127.0.0.1:0` and read the port. The
/// connections it accepts get TCP_NODELAY.
pub async fn serve(
    listener: TcpListener,
    services: ServiceSet,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let ServiceSet {
        mut routes,
        names,
        tls,
        telemetry,
        drain: wind_down,
    } = services;
    let observe = observe::Observe::new(
        telemetry,
        names
            .iter()
            .copied()
            .chain([
                HEALTH_SERVICE,
                REFLECTION_V1_SERVICE,
                REFLECTION_V1ALPHA_SERVICE,
            ])
            .collect(),
    );

    let (reporter, health) = tonic_health::server::health_reporter();
    for name in &names {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }

    // Advertise what this process serves, not every service in the descriptor set.
    let advertised = names
        .iter()
        .map(|name| (*name).to_owned())
        .chain([
            HEALTH_SERVICE.to_owned(),
            REFLECTION_V1_SERVICE.to_owned(),
            REFLECTION_V1ALPHA_SERVICE.to_owned(),
        ])
        .collect::<Vec<_>>();
    let reflection = |builder: tonic_reflection::server::Builder<'static>| {
        advertised
            .iter()
            .fold(builder, |builder, name| {
                builder.with_service_name(name.clone())
            })
            .register_encoded_file_descriptor_set(agentloop_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure()).build_v1()?;
    let reflection_v1alpha =
        reflection(tonic_reflection::server::Builder::configure()).build_v1alpha()?;

    routes
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);

    let drain = async move {
        shutdown.await;
        // NOT_SERVING before the listener closes, so watchers and balancers see the
        // process leaving before connections start being refused.
        for name in names.iter().copied().chain([""]) {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        tracing::info!("shutdown requested: health NOT_SERVING, draining");
        if let Some(wind_down) = wind_down {
            wind_down.await;
        }
    };

    let local_addr = listener.local_addr().ok();
    tracing::info!(?local_addr, tls = tls.is_some(), "gRPC server listening");
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        // One span per request, with gRPC-aware status classification: a non-OK
        // grpc-status is a failure even though HTTP says 200 — except the codes that
        // report the caller's mistake or a normal outcome, which are not the server's
        // failures and must not be logged as errors.
        .layer(TraceLayer::new(SharedClassifier::new(
            caller_errors_are_not_failures(),
        )))
        // A server span continuing the caller's trace, and the answers counted by code.
        .layer(observe)
        .add_routes(routes.routes())
        .serve_with_incoming_shutdown(incoming(listener), drain)
        .await?;
    tracing::info!("gRPC server drained and stopped");
    Ok(())
}

/// The connections `listener` accepts, with TCP_NODELAY on.
///
/// Without it, a reply written in pieces waits for the peer's delayed ACK (Nagle's
/// algorithm): on loopback, a lone invocation's turn took 43 ms instead of 2. tonic sets
/// it only on the listeners it binds itself, not on one handed to it.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Service name of the standard gRPC health service.
const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// Service name of gRPC reflection v1.
const REFLECTION_V1_SERVICE: &str = "grpc.reflection.v1.ServerReflection";
/// Service name of gRPC reflection v1alpha (still the one many tools ask for).
const REFLECTION_V1ALPHA_SERVICE: &str = "grpc.reflection.v1alpha.ServerReflection";

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() -> std::io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let mut incoming = incoming(listener);
        let _client = tokio::net::TcpStream::connect(address).await?;
        let accepted = incoming
            .next()
            .await
            .ok_or_else(|| std::io::Error::other("the listener closed"))??;
        assert!(accepted.nodelay()?, "TCP_NODELAY is off");
        Ok(())
    }
}
