//! HTTP/JSON for a gRPC service: a caller without a gRPC stack (a browser, `curl`, a
//! serverless function) calls the same RPCs.
//!
//! - **Routes** come from the `google.api.http` option of each method in the protos
//!   (`POST /v1/invocations`, `GET /v1/invocations/{invocation_id}`, ...): a path
//!   segment fills a request field, the body fills the whole request (`body: "*"`), and
//!   on a route without a body the other fields are query parameters.
//! - **Bodies** are the canonical proto3 JSON mapping of the messages, read and written
//!   from the descriptors: lowerCamelCase names (proto names are accepted too), 64-bit
//!   integers as strings, enums by name. Unknown fields are refused.
//! - **Every call goes through the service's own gRPC implementation** in this process:
//!   the request is encoded as a gRPC request, with the caller's `Authorization` header,
//!   and handed to the same tower service the gRPC listener serves. Authentication,
//!   tenancy, roles, bounds and rate limits are therefore those of the gRPC API, by
//!   construction. No other header is passed on but the W3C trace context
//!   (`traceparent`, `tracestate`), so an HTTP caller cannot set what only the gRPC
//!   transport sets.
//! - **Errors** are `google.rpc.Status` JSON objects, with the HTTP status that
//!   `google.rpc.Code` maps each code to.
//! - **A server stream** (WatchInvocation) is Server-Sent Events: one `data:` line of JSON
//!   per message; a stream that fails ends with an `event: error` whose data is the
//!   status.
//! - **Browsers** (`origin`): a state-changing request from another site's page is
//!   refused, and so, on a loopback listener, is a host name that is not a loopback one
//!   (DNS rebinding); with authentication off a page could otherwise drive the API.
//! - **The OpenAPI 3 document** of the routes is generated from the same descriptors and
//!   served at `/v1/openapi.json`.
//! - **Pages** ([`Gateway::with_pages`]): a GET outside the API's routes may be answered
//!   by fixed files, such as the orchestrator's console; they carry their own headers.
//! - **Mounts** ([`Gateway::with_mount`]): another protocol served on the same listener
//!   (the orchestrator's A2A endpoint) answers the paths it claims, after the same
//!   browser checks and with its body read within the same bound.

mod openapi;
mod origin;
mod routes;
mod transcode;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::header::{ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost_reflect::DescriptorPool;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use crate::routes::{Found, Route, Routes};
use crate::transcode::Frames;

pub use crate::openapi::openapi;

/// The largest request body accepted, and the largest message read back: the gRPC
/// API's own message limit.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Connections served at once; further ones are closed on accept.
pub const MAX_CONNECTIONS: usize = 1_024;
/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop waits for requests in flight (a watch lasts as long as its
/// invocation, so it is cut at the end of this).
const DRAIN: Duration = Duration::from_secs(5);
/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";

/// Why a service's routes cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The descriptor set does not decode.
    #[error("the descriptor set: {0}")]
    Descriptors(#[from] prost_reflect::DescriptorError),
    /// The service is not in the descriptor set.
    #[error("no service {0} in the descriptor set")]
    NoService(String),
    /// The descriptor set lacks `google/api/annotations.proto`.
    #[error("the descriptor set does not define the google.api.http option")]
    NoHttpOption,
    /// A method's option cannot be served.
    #[error("{rpc}: {why}")]
    Invalid {
        /// The method.
        rpc: String,
        /// What is wrong with its option.
        why: String,
    },
}

/// Fixed pages beside the API: the answer to a GET of a path, or `None` when the path
/// is not a page.
pub type Pages = fn(&str) -> Option<Response<Bytes>>;

/// The body of every answer.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Another protocol beside the API on the same listener: it answers the requests whose
/// path it claims, their bodies already read (at most [`MAX_BODY_BYTES`]).
pub trait Mount: std::fmt::Debug + Send + Sync + 'static {
    /// Whether a `method` request for `path` is this mount's.
    fn claims(&self, method: &Method, path: &str) -> bool;
    /// The answer to `request`.
    fn handle(
        &self,
        request: Request<Bytes>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Response<Body>> + Send + 'static>>;
}

/// A gRPC service, as tonic serves it.
pub trait Grpc:
    Service<
        Request<tonic::body::Body>,
        Response = Response<tonic::body::Body>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Grpc for S where
    S: Service<
            Request<tonic::body::Body>,
            Response = Response<tonic::body::Body>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// The HTTP/JSON form of one gRPC service.
#[derive(Debug, Clone)]
pub struct Gateway<S> {
    shared: Arc<Shared>,
    grpc: S,
    /// Answers a GET of a path no route has, if it is one of its pages.
    pages: Option<Pages>,
    /// Answers the paths it claims instead of the API.
    mount: Option<Arc<dyn Mount>>,
    /// Served on a loopback address: only loopback host names are answered.
    loopback: bool,
}

#[derive(Debug)]
struct Shared {
    routes: Routes,
    /// Made on its first request: most processes never serve it.
    openapi: std::sync::OnceLock<Bytes>,
}

impl<S: Grpc> Gateway<S> {
    /// The routes of `service` (its full name, `agentloop.v1.OrchestratorService`) in
    /// the encoded descriptor set `descriptors`, each call handed to `grpc`.
    ///
    /// # Errors
    ///
    /// When the set does not decode, lacks the service or the option, or a method's
    /// option is one this gateway cannot serve.
    pub fn new(descriptors: &[u8], service: &str, grpc: S) -> Result<Gateway<S>, RouteError> {
        let pool = DescriptorPool::decode(descriptors)?;
        let routes = Routes::of(&pool, service)?;
        Ok(Gateway {
            shared: Arc::new(Shared {
                routes,
                openapi: std::sync::OnceLock::new(),
            }),
            grpc,
            pages: None,
            mount: None,
            loopback: false,
        })
    }

    /// Serves `pages` too, on the paths they know that the API does not.
    #[must_use]
    pub fn with_pages(mut self, pages: Pages) -> Gateway<S> {
        self.pages = Some(pages);
        self
    }

    /// Hands the requests `mount` claims to it.
    #[must_use]
    pub fn with_mount(mut self, mount: Arc<dyn Mount>) -> Gateway<S> {
        self.mount = Some(mount);
        self
    }

    /// Answers one HTTP request. By value, so that the answer's future is `Send` with a
    /// service that is only `Send` (a clone is two reference counts).
    pub async fn handle<B>(self, request: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let (parts, body) = request.into_parts();
        if let Err(status) = origin::check(&parts.method, &parts.uri, &parts.headers, self.loopback)
        {
            return error(&status);
        }
        let path = parts.uri.path();
        if let Some(mount) = self
            .mount
            .as_ref()
            .filter(|m| m.claims(&parts.method, path))
        {
            let body = match read(body).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            return mount.handle(Request::from_parts(parts, body)).await;
        }
        if path == OPENAPI_PATH && parts.method == Method::GET {
            let document = self.shared.openapi.get_or_init(|| {
                let document = openapi::document(&self.shared.routes);
                Bytes::from(serde_json::to_vec_pretty(&document).unwrap_or_default())
            });
            return respond(StatusCode::OK, "application/json", document.clone());
        }
        let (route, bound) = match self.shared.routes.find(&parts.method, path) {
            Found::Route(route, bound) => (route, bound),
            Found::OtherMethods(methods) => {
                let allow = methods
                    .iter()
                    .map(Method::as_str)
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut response = error(&Status::new(
                    Code::Unimplemented,
                    format!("{} is not a method of {path}", parts.method),
                ));
                *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
                if let Ok(allow) = HeaderValue::from_str(&allow) {
                    response.headers_mut().insert(ALLOW, allow);
                }
                return response;
            }
            Found::Nothing => {
                let page = match (&parts.method, self.pages) {
                    (&Method::GET | &Method::HEAD, Some(pages)) => pages(path),
                    _ => None,
                };
                return match page {
                    Some(page) => page.map(|body| Full::new(body).boxed_unsync()),
                    None => error(&Status::not_found(format!("no route {path}"))),
                };
            }
        };
        let body = match read(body).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        let message = match transcode::request(route, bound, parts.uri.query(), &body) {
            Ok(message) => message,
            Err(status) => return error(&status),
        };
        let call = grpc_request(route, transcode::frame(&message), &parts.headers);
        let Ok(response) = self.grpc.oneshot(call).await;
        match route.rpc.is_server_streaming() {
            true => events(route, response),
            false => unary(route, response).await,
        }
    }
}

/// A request's body, or the answer that refuses it (too large, or unreadable).
async fn read<B>(body: B) -> Result<Bytes, Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(why) if why.is::<http_body_util::LengthLimitError>() => {
            let mut response = error(&Status::resource_exhausted(format!(
                "the body is larger than {MAX_BODY_BYTES} bytes"
            )));
            *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            Err(response)
        }
        Err(_) => Err(error(&Status::invalid_argument(
            "the body could not be read",
        ))),
    }
}

/// The gRPC request of a call: its one frame, and of the HTTP request's headers only
/// `Authorization` and the W3C trace context.
fn grpc_request(route: &Route, frame: Bytes, headers: &HeaderMap) -> Request<tonic::body::Body> {
    let mut request = Request::new(tonic::body::Body::new(
        Full::new(frame).map_err(|never| match never {}),
    ));
    *request.method_mut() = Method::POST;
    if let Ok(uri) = route.grpc_path.parse() {
        *request.uri_mut() = uri;
    }
    let grpc_headers = request.headers_mut();
    grpc_headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    grpc_headers.insert("te", HeaderValue::from_static("trailers"));
    // The caller's credentials, and its W3C trace context (the call continues its trace).
    for name in [AUTHORIZATION.as_str(), "traceparent", "tracestate"] {
        if let Some(value) = headers.get(name) {
            grpc_headers.insert(name, value.clone());
        }
    }
    request
}

/// A unary answer: its one message as JSON, or its status.
async fn unary(route: &Route, response: Response<tonic::body::Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    if let Some(status) = Status::from_header_map(&parts.headers)
        && status.code() != Code::Ok
    {
        return error(&status);
    }
    let collected = match Limited::new(body, MAX_BODY_BYTES + 5).collect().await {
        Ok(collected) => collected,
        Err(why) => return error(&Status::internal(format!("the answer: {why}"))),
    };
    let status = collected
        .trailers()
        .and_then(Status::from_header_map)
        .unwrap_or_else(|| Status::internal("the service ended the call without a status"));
    if status.code() != Code::Ok {
        return error(&status);
    }
    let mut frames = Frames::new(route.rpc.output(), MAX_BODY_BYTES);
    frames.push(&collected.to_bytes());
    let answer = match frames.next() {
        Ok(Some(message)) if frames.is_empty() => message,
        Ok(_) => return error(&Status::internal("the service sent no single answer")),
        Err(status) => return error(&status),
    };
    match transcode::to_json(&answer) {
        Ok(json) => respond(StatusCode::OK, "application/json", Bytes::from(json)),
        Err(status) => error(&status),
    }
}

/// A server stream as Server-Sent Events. A status the service answers at once (before
/// any message) is the HTTP answer; a later one ends the events with an `error` event.
fn events(route: &Route, response: Response<tonic::body::Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    if let Some(status) = Status::from_header_map(&parts.headers)
        && status.code() != Code::Ok
    {
        return error(&status);
    }
    struct State {
        body: tonic::body::Body,
        frames: Frames,
        done: bool,
    }
    let state = State {
        body,
        frames: Frames::new(route.rpc.output(), MAX_BODY_BYTES),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut state| async move {
        loop {
            if state.done {
                return None;
            }
            let failed = |state: &mut State, status: &Status| {
                state.done = true;
                let mut event = b"event: error\ndata: ".to_vec();
                event.extend(transcode::status_json(status));
                event.extend(b"\n\n");
                Some(event)
            };
            let event = match state.frames.next() {
                Ok(Some(message)) => match transcode::to_json(&message) {
                    Ok(json) => {
                        let mut event = b"data: ".to_vec();
                        event.extend(json);
                        event.extend(b"\n\n");
                        Some(event)
                    }
                    Err(status) => failed(&mut state, &status),
                },
                Ok(None) => match state.body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            state.frames.push(&data);
                            None
                        }
                        Err(frame) => {
                            let status = frame
                                .trailers_ref()
                                .and_then(Status::from_header_map)
                                .unwrap_or_else(|| Status::internal("the stream ended oddly"));
                            if status.code() == Code::Ok {
                                return None;
                            }
                            failed(&mut state, &status)
                        }
                    },
                    Some(Err(status)) => failed(&mut state, &status),
                    None => failed(
                        &mut state,
                        &Status::internal("the service ended the stream without a status"),
                    ),
                },
                Err(status) => failed(&mut state, &status),
            };
            if let Some(event) = event {
                return Some((Ok(Frame::data(Bytes::from(event))), state));
            }
        }
    });
    event_stream(stream)
}

/// Server-Sent Events: each item of `events` is one or more whole events.
pub fn event_stream<S>(events: S) -> Response<Body>
where
    S: futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static,
{
    let mut response = Response::new(StreamBody::new(events.boxed()).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An answer of `status` with `body`, never cached nor sniffed.
pub fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed_unsync());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `status` as its HTTP answer.
fn error(status: &Status) -> Response<Body> {
    respond(
        transcode::http_status(status.code()),
        "application/json",
        Bytes::from(transcode::status_json(status)),
    )
}

/// Serves `gateway` on `listener` (HTTP/1.1, and HTTP/2 for a client that speaks it
/// first) until `shutdown` resolves; then stops accepting and gives the requests in
/// flight a few seconds.
///
/// # Errors
///
/// Never: a connection that fails is logged and dropped; the result is for the caller's
/// `select!`s.
pub async fn serve<S: Grpc>(
    listener: TcpListener,
    mut gateway: Gateway<S>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    gateway.loopback = listener
        .local_addr()
        .is_ok_and(|address| address.ip().is_loopback());
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tracing::info!(local_addr = ?listener.local_addr().ok(), "HTTP/JSON API listening");
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::warn!(%peer, "HTTP connection refused: {MAX_CONNECTIONS} already open");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let service = hyper::service::service_fn(move |request| {
            let gateway = gateway.clone();
            async move { Ok::<_, Infallible>(gateway.handle(request).await) }
        });
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("HTTP requests still open after the drain were cut");
    }
    Ok(())
}
