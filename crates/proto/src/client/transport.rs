//! [`Transport`]: the connection under every generated client of the workspace.
//!
//! Over loopback an RPC is nearly all overhead, so a plain-text endpoint is served by
//! the HTTP/2 library (h2) directly, with no task between a call and the connection's
//! own. tonic's `Channel` queues each call to a tower `Buffer`'s worker task, and
//! hyper's HTTP/2 client behind it spawns two more tasks per call: one that forwards
//! the response and one that sends the request's body. Here the caller's future sends
//! the headers and the message and awaits the response itself; the connection's task,
//! which reads and writes the socket, is the only other task a call wakes
//! (`agentloop bench`, docs/performance.md). `https` endpoints keep tonic's channel and
//! its TLS (rustls, the system's roots).
//!
//! Both routes send a request's message with END_STREAM on its DATA frame ([`Eager`])
//! rather than an empty DATA frame after it, one frame less per call.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use h2::client::{ResponseFuture as H2Response, SendRequest};
use h2::{RecvStream, SendStream};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::http::header::AUTHORIZATION;
use tonic::codegen::http::uri::{Authority, Scheme, Uri};
use tonic::codegen::http::{HeaderMap, HeaderValue, Request, Response};
use tonic::codegen::{Bytes, Service, StdError};
use tonic::transport::Channel;
use tonic::{ConnectError, Status};

/// A connection to one service: cheap to clone, and its clones share one HTTP/2
/// connection, which multiplexes their calls. Build it with [`super::connect`].
#[derive(Clone)]
pub struct Transport {
    route: Route,
    /// `authorization` of every call that does not carry its own.
    authorization: Option<HeaderValue>,
}

#[derive(Clone)]
enum Route {
    Plain(Arc<Plain>),
    Tls(Channel),
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The credential is never printed.
        match &self.route {
            Route::Plain(plain) => f
                .debug_struct("Transport")
                .field("authority", &plain.authority)
                .finish_non_exhaustive(),
            Route::Tls(channel) => f.debug_tuple("Transport").field(channel).finish(),
        }
    }
}

impl Transport {
    /// Over tonic's channel (`https`).
    pub(super) fn tls(channel: Channel) -> Transport {
        Transport {
            route: Route::Tls(channel),
            authorization: None,
        }
    }

    /// Sends `authorization` with every call that does not set its own.
    pub(super) fn with_authorization(mut self, authorization: Option<HeaderValue>) -> Transport {
        self.authorization = authorization;
        self
    }

    /// Over h2 (`http`), connected on first use.
    pub(super) fn plain(
        authority: Authority,
        connect_timeout: Duration,
        request_timeout: Option<Duration>,
    ) -> Transport {
        Transport {
            route: Route::Plain(Arc::new(Plain {
                authority,
                connect_timeout,
                request_timeout,
                open: Mutex::new(None),
                attempts: AtomicU64::new(0),
                connecting: tokio::sync::Mutex::new(None),
            })),
            authorization: None,
        }
    }

    /// Connects now, instead of on the first call.
    pub(super) async fn open(&self) -> Result<(), StdError> {
        match &self.route {
            Route::Plain(plain) => plain.sender().await.map(drop).map_err(StdError::from),
            Route::Tls(_) => Ok(()),
        }
    }
}

/// A plain-text HTTP/2 connection, opened again when it closes.
struct Plain {
    authority: Authority,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    /// The open connection; each call clones its sender.
    open: Mutex<Option<Open>>,
    /// Attempts to connect so far; changed only under `connecting`.
    attempts: AtomicU64,
    /// Held while a connection is being opened, so that callers finding none open one,
    /// not one each; holds why the last attempt failed.
    connecting: tokio::sync::Mutex<Option<String>>,
}

/// A connection and the task that drives it.
struct Open {
    sender: SendRequest<Bytes>,
    /// Ends when the connection does.
    task: JoinHandle<()>,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, StdError>> + Send>>;

impl Service<Request<Body>> for Transport {
    type Response = Response<Body>;
    type Error = StdError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        match &mut self.route {
            // Calls wait for a connection inside their future, where a deadline bounds
            // the wait.
            Route::Plain(_) => Poll::Ready(Ok(())),
            Route::Tls(channel) => channel.poll_ready(cx).map_err(StdError::from),
        }
    }

    fn call(&mut self, request: Request<Body>) -> ResponseFuture {
        let mut request = request.map(Eager::wrap);
        if let Some(authorization) = &self.authorization {
            request
                .headers_mut()
                .entry(AUTHORIZATION)
                .or_insert_with(|| authorization.clone());
        }
        // The caller's trace goes on with the call (`traceparent`), when it is traced.
        agentloop_telemetry::inject(request.headers_mut());
        match &mut self.route {
            Route::Plain(plain) => Box::pin(Arc::clone(plain).call(request)),
            Route::Tls(channel) => {
                let response = channel.call(request);
                Box::pin(async move { response.await.map_err(StdError::from) })
            }
        }
    }
}

impl Plain {
    /// One call, within the smaller of the request's own deadline (`grpc-timeout`) and
    /// the configured one. Dropping it resets the stream.
    async fn call(self: Arc<Self>, request: Request<Body>) -> Result<Response<Body>, StdError> {
        let deadline = match (grpc_timeout(request.headers()), self.request_timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let exchange = self.exchange(request);
        match deadline {
            None => exchange.await,
            Some(deadline) => tokio::time::timeout(deadline, exchange)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "no response from {} within {deadline:?}",
                        self.authority
                    ))
                    .into())
                }),
        }
    }

    async fn exchange(&self, request: Request<Body>) -> Result<Response<Body>, StdError> {
        let sender = self.sender().await?;
        let (mut parts, body) = request.into_parts();
        // The generated clients send the path alone; HTTP/2 wants the scheme and
        // authority as well.
        let mut uri = parts.uri.into_parts();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        parts.uri = Uri::from_parts(uri)?;
        // Waits while the server's limit of concurrent streams is reached. A connection
        // that fails here has sent nothing of this call.
        let mut sender = sender
            .ready()
            .await
            .map_err(|error| ConnectError(error.into()))?;
        let end = body.is_end_stream();
        let (response, stream) = sender.send_request(Request::from_parts(parts, ()), end)?;
        let upload = (!end).then(|| Upload {
            body,
            stream,
            pending: None,
        });
        let response = Exchange { response, upload }.await?;
        Ok(response.map(|recv| {
            Body::new(Download {
                recv,
                data_ended: false,
            })
        }))
    }

    /// The open connection's sender, opening a connection if there is none. Callers that
    /// waited for an attempt share its failure instead of each trying again in turn, so
    /// an unreachable service costs them one connect timeout, not one each.
    ///
    /// A failure is a [`tonic::ConnectError`], which tonic reports as UNAVAILABLE and
    /// which tells whoever looks for it in the status's sources that nothing was sent.
    async fn sender(&self) -> Result<SendRequest<Bytes>, ConnectError> {
        if let Some(sender) = self.open_sender() {
            return Ok(sender);
        }
        let seen = self.attempts.load(Ordering::Acquire);
        let mut failure = self.connecting.lock().await;
        if let Some(sender) = self.open_sender() {
            return Ok(sender);
        }
        if self.attempts.load(Ordering::Acquire) != seen
            && let Some(failure) = &*failure
        {
            // An attempt was made while this caller waited for it, and failed.
            return Err(ConnectError(failure.clone().into()));
        }
        self.attempts.fetch_add(1, Ordering::AcqRel);
        let connected = tokio::time::timeout(self.connect_timeout, self.connect())
            .await
            .unwrap_or_else(|_| Err(format!("timed out after {:?}", self.connect_timeout)))
            .map_err(|error| format!("cannot connect to {}: {error}", self.authority));
        match connected {
            Ok(open) => {
                *failure = None;
                let sender = open.sender.clone();
                *self.open.lock().unwrap_or_else(PoisonError::into_inner) = Some(open);
                Ok(sender)
            }
            Err(error) => {
                *failure = Some(error.clone());
                Err(ConnectError(error.into()))
            }
        }
    }

    fn open_sender(&self) -> Option<SendRequest<Bytes>> {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|open| !open.task.is_finished())
            .map(|open| open.sender.clone())
    }

    async fn connect(&self) -> Result<Open, String> {
        let host = self.authority.host();
        // An IPv6 literal comes bracketed in a URI, not in a socket address.
        let host = host
            .strip_prefix('[')
            .and_then(|host| host.strip_suffix(']'))
            .unwrap_or(host);
        let port = self.authority.port_u16().unwrap_or(80);
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|error| error.to_string())?;
        // Small RPCs (ledger transitions, policy checks) must not wait for Nagle.
        stream
            .set_nodelay(true)
            .map_err(|error| error.to_string())?;
        // hyper's client settings, which this route had before it used h2 directly:
        // windows that let a large message go without waiting for WINDOW_UPDATEs, and
        // bounds on what the peer can make it hold.
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(2 * 1024 * 1024)
            .initial_connection_window_size(5 * 1024 * 1024)
            .max_header_list_size(16 * 1024)
            .max_send_buffer_size(1024 * 1024)
            .enable_push(false)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(|error| error.to_string())?;
        // The connection ends when the peer closes it or the last sender is dropped;
        // its calls fail with its error, and the next call opens a new connection.
        let task = tokio::spawn(async move {
            // Its error reaches each call still open on it.
            let _ = connection.await;
        });
        Ok(Open { sender, task })
    }
}

/// A call in flight: its request's body going out and its response coming in, both
/// driven by the caller's task.
struct Exchange {
    response: H2Response,
    /// The request's body, until all of it is with the connection.
    upload: Option<Upload>,
}

impl Future for Exchange {
    type Output = Result<Response<RecvStream>, StdError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(upload) = &mut this.upload
            && let Poll::Ready(sent) = upload.poll_send(cx)
        {
            this.upload = None;
            // The body's own error (a message over the size limit, say) ends the call;
            // the stream has been reset.
            sent?;
        }
        let response = ready!(Pin::new(&mut this.response).poll(cx))?;
        if let Some(upload) = this.upload.take() {
            // A streaming request goes on after its response has begun.
            tokio::spawn(upload);
        }
        Poll::Ready(Ok(response))
    }
}

/// A request's body on its way out, within the stream's flow-control window: the next
/// frame is read from the body only once the last one is with the connection, so a
/// streaming request holds at most one frame here.
struct Upload {
    body: Body,
    stream: SendStream<Bytes>,
    /// Data read from the body and not yet sent, and whether the body ends with it.
    pending: Option<(Bytes, bool)>,
}

impl Upload {
    /// Sends what the body has ready. Ready once the body has been sent whole, or when
    /// the stream can take no more: then the response tells why. An error is the body's
    /// own, after which the stream is reset.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        loop {
            let Some((data, end)) = &mut self.pending else {
                match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                    // A body that did not say its last frame was the last.
                    None => {
                        let _ = self.stream.send_data(Bytes::new(), true);
                        return Poll::Ready(Ok(()));
                    }
                    Some(Err(status)) => {
                        self.stream.send_reset(h2::Reason::CANCEL);
                        return Poll::Ready(Err(status));
                    }
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => self.pending = Some((data, self.body.is_end_stream())),
                        Err(frame) => {
                            if let Ok(trailers) = frame.into_trailers() {
                                let _ = self.stream.send_trailers(trailers);
                                return Poll::Ready(Ok(()));
                            }
                        }
                    },
                }
                continue;
            };
            if data.is_empty() && !*end {
                self.pending = None;
                continue;
            }
            if !data.is_empty() {
                // Capacity comes at once while the windows are open, as they are for a
                // unary request; otherwise the connection's task wakes this one.
                self.stream.reserve_capacity(data.len());
                while self.stream.capacity() == 0 {
                    match ready!(self.stream.poll_capacity(cx)) {
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return Poll::Ready(Ok(())),
                    }
                }
            }
            let now = data.split_to(data.len().min(self.stream.capacity()));
            let last = *end && data.is_empty();
            if self.stream.send_data(now, last).is_err() || last {
                return Poll::Ready(Ok(()));
            }
            if data.is_empty() {
                self.pending = None;
            }
        }
    }
}

impl Future for Upload {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Its error has nobody to go to: the response is already with the caller, and
        // the stream has been reset.
        let _ = ready!(self.poll_send(cx));
        Poll::Ready(())
    }
}

/// A response's body as it arrives; each DATA frame's bytes go back to the stream's
/// window once read.
struct Download {
    recv: RecvStream,
    /// All DATA frames have been read; trailers may follow.
    data_ended: bool,
}

impl HttpBody for Download {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_ended {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Fails only when the stream has ended, when no window is left.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => self.data_ended = true,
            }
        }
        Poll::Ready(
            ready!(self.recv.poll_trailers(cx))
                .transpose()
                .map(|trailers| trailers.map(Frame::trailers)),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// The deadline a request carries.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    crate::grpc_timeout(headers.get("grpc-timeout")?.to_str().ok()?)
}

/// A request body that looks one frame ahead, so that its last DATA frame says it is
/// the last: a unary request's message then travels as one DATA frame with END_STREAM,
/// where an HTTP/2 client that cannot tell would send an empty DATA frame after it.
struct Eager {
    inner: Body,
    /// The frame read ahead.
    next: Option<Result<Frame<Bytes>, Status>>,
    /// The inner body has ended.
    ended: bool,
}

impl Eager {
    fn wrap(inner: Body) -> Body {
        Body::new(Eager {
            inner,
            next: None,
            ended: false,
        })
    }
}

impl HttpBody for Eager {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let frame = match this.next.take() {
            Some(frame) => frame,
            None if this.ended => return Poll::Ready(None),
            None => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(frame) => frame,
                None => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            },
        };
        if frame.is_ok() {
            // Pending is fine: the inner body keeps the waker, and this frame goes now.
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(next)) => this.next = Some(next),
                Poll::Pending => {}
            }
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.next.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http::HeaderValue;

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_str(value).ok()?);
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts_are_read_in_every_unit() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("4S"), Some(Duration::from_secs(4)));
        assert_eq!(timeout_of("300m"), Some(Duration::from_millis(300)));
        assert_eq!(timeout_of("250000u"), Some(Duration::from_millis(250)));
        assert_eq!(
            timeout_of("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for value in ["", "S", "100", "100x", "123456789S", "-1S", "1.5S"] {
            assert_eq!(timeout_of(value), None, "{value:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    /// A body whose frames are all ready at once.
    struct Frames(std::collections::VecDeque<&'static str>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|data| Ok(Frame::data(Bytes::from(data)))),
            )
        }
    }

    /// Polls `body` to its end, noting after each frame whether it said it was the last.
    fn drain(mut body: Body) -> Vec<(Bytes, bool)> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut seen = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            let data = frame
                .ok()
                .and_then(|frame| frame.into_data().ok())
                .unwrap_or_default();
            seen.push((data, body.is_end_stream()));
        }
        seen
    }

    #[test]
    fn a_single_message_ends_the_stream_with_its_frame() {
        let body = Eager::wrap(Body::new(Frames(["message"].into())));
        assert_eq!(drain(body), [(Bytes::from("message"), true)]);
    }

    #[test]
    fn only_the_last_of_several_frames_ends_the_stream() {
        let body = Eager::wrap(Body::new(Frames(["one", "two", "three"].into())));
        assert_eq!(
            drain(body),
            [
                (Bytes::from("one"), false),
                (Bytes::from("two"), false),
                (Bytes::from("three"), true),
            ]
        );
    }
}
