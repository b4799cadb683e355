//! A real tonic server on an ephemeral port, reached through the crate's `connect`
//! factory: proves the generated client and server agree with the shared limits, that
//! the factory's clients do not compress, and that the servers still speak gzip to a
//! client that asks for it; and that the plain-text route carries messages and
//! streams larger than its flow-control windows, and a request that still streams
//! when its response begins.

#![allow(clippy::expect_used, clippy::panic)]

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentloop_proto::client::{self, ClientConfig, ConnectError};
use agentloop_proto::server;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, SideEffect, StageAnswer, ToolCall, ToolDescriptor,
    ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteResponse,
    ToolExecutorServiceExecuteStageRequest, ToolExecutorServiceExecuteStageResponse,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse, ToolResult,
    stage_answer, tool_result,
};
use http_body::Body as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::CompressionEncoding;
use tonic::codegen::{Bytes, Service as _, http};
use tonic::{Request, Response, Status};

/// A tool executor that describes one tool; `execute` answers with the call's arguments
/// as the result's detail, and `execute_stage` answers each call with a refusal whose
/// message is as many bytes as the call's arguments say.
struct OneTool;

fn descriptor() -> ToolDescriptor {
    ToolDescriptor {
        name: "orders.lookup".to_owned(),
        description: "Looks up an order by ID.".to_owned(),
        input_schema_json: r#"{"type":"object","required":["order_id"]}"#.to_owned(),
        side_effect: SideEffect::ReadOnly.into(),
        commutative: true,
        requires_approval: true,
        timeout: Some(prost_types::Duration {
            seconds: 2,
            nanos: 0,
        }),
        ..ToolDescriptor::default()
    }
}

#[tonic::async_trait]
impl ToolExecutorService for OneTool {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse {
            tools: vec![descriptor()],
            ..DescribeResponse::default()
        }))
    }

    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        let call = request.into_inner().call.unwrap_or_default();
        Ok(Response::new(ToolExecutorServiceExecuteResponse {
            result: Some(ToolResult {
                call_id: call.call_id,
                outcome: Some(tool_result::Outcome::Unknown(tool_result::OutcomeUnknown {
                    detail: call.arguments_json,
                })),
            }),
        }))
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    async fn execute_stage(
        &self,
        request: tonic::Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        let answers = request
            .into_inner()
            .calls
            .into_iter()
            .zip(0..)
            .map(|(call, index)| {
                let size = call
                    .call
                    .and_then(|call| call.arguments_json.parse::<usize>().ok())
                    .ok_or_else(|| Status::invalid_argument("the arguments are a size"))?;
                Ok(ToolExecutorServiceExecuteStageResponse {
                    index,
                    answer: Some(StageAnswer {
                        answer: Some(stage_answer::Answer::Refused(stage_answer::Refused {
                            code: 0,
                            message: "x".repeat(size),
                        })),
                    }),
                })
            })
            .collect::<Vec<_>>();
        Ok(Response::new(Box::pin(tokio_stream::iter(answers))))
    }

    async fn reconcile(
        &self,
        _request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Err(Status::unimplemented("not needed by this test"))
    }

    async fn verify(
        &self,
        _request: Request<agentloop_proto::v1::ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<agentloop_proto::v1::ToolExecutorServiceVerifyResponse>, Status> {
        Err(Status::unimplemented("not needed by this test"))
    }
}

#[tokio::test]
async fn describe_through_the_client_factory() {
    // Bound before serving, so the client cannot race the server's start.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let served = serve(listener, OneTool);

    let config = ClientConfig::default()
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Some(Duration::from_secs(10)));
    let transport = client::connect(&format!("http://{address}"), config)
        .await
        .expect("connects");
    let encoding = |response: &Response<DescribeResponse>| {
        response
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok().map(str::to_owned))
    };
    let plain = client::tool_executor(transport.clone());
    let response = plain
        .clone()
        .describe(DescribeRequest {})
        .await
        .expect("describe succeeds");
    assert_eq!(
        encoding(&response),
        None,
        "the factory's clients do not compress"
    );
    assert_eq!(response.into_inner().tools, vec![descriptor()]);

    // A client that opts in gets gzip both ways.
    let response = plain
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip)
        .describe(DescribeRequest {})
        .await
        .expect("a compressed describe succeeds");
    assert_eq!(encoding(&response).as_deref(), Some("gzip"));
    assert_eq!(response.into_inner().tools, vec![descriptor()]);

    served.stop().await.expect("the server stops cleanly");
}

#[tokio::test]
async fn an_invalid_endpoint_is_a_typed_error() {
    let error = client::connect("not a uri", ClientConfig::default())
        .await
        .expect_err("must not connect");
    assert!(
        matches!(error, ConnectError::InvalidEndpoint { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_typed_error() {
    // Take a free port and close it again, so nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    drop(listener);
    let error = client::connect(&format!("http://{address}"), ClientConfig::default())
        .await
        .expect_err("must not connect");
    assert!(matches!(error, ConnectError::Connect { .. }), "{error:?}");
}

/// A server started by [`serve`].
struct Served {
    stop: oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    /// Shuts the server down and waits until it has.
    async fn stop(self) -> Result<(), Box<dyn std::error::Error>> {
        // A send fails only when the server already ended; its result then says why.
        let _ = self.stop.send(());
        self.serving.await??;
        Ok(())
    }
}

/// Serves `service` on `listener` until stopped.
fn serve<S: ToolExecutorService>(listener: TcpListener, service: S) -> Served {
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server::tool_executor(service))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Served { stop, serving }
}

async fn describe(transport: &client::Transport) -> Result<Vec<ToolDescriptor>, Status> {
    client::tool_executor(transport.clone())
        .describe(DescribeRequest {})
        .await
        .map(|response| response.into_inner().tools)
}

#[tokio::test]
async fn a_lazy_transport_connects_once_the_server_is_up() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    drop(listener);
    let transport = client::connect(
        &format!("http://{address}"),
        ClientConfig::default().with_lazy(true),
    )
    .await
    .expect("a lazy transport does not connect yet");

    let status = describe(&transport).await.expect_err("nothing listens yet");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // The gateway reads a connect error among the sources as "nothing was sent".
    let mut source = std::error::Error::source(&status);
    let mut not_sent = false;
    while let Some(error) = source {
        not_sent |= error.downcast_ref::<tonic::ConnectError>().is_some();
        source = error.source();
    }
    assert!(not_sent, "no connect error among the sources of {status:?}");

    let listener = TcpListener::bind(address)
        .await
        .expect("bind the port again");
    let served = serve(listener, OneTool);
    assert_eq!(
        describe(&transport).await.expect("connects now"),
        vec![descriptor()]
    );
    served.stop().await.expect("the server stops cleanly");
}

#[tokio::test]
async fn a_closed_connection_is_opened_again_by_a_later_call() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let served = serve(listener, OneTool);
    let transport = client::connect(&format!("http://{address}"), ClientConfig::default())
        .await
        .expect("connects");
    assert_eq!(
        describe(&transport).await.expect("first call"),
        vec![descriptor()]
    );

    // The server goes away, closing the connection, and comes back on the same port.
    served.stop().await.expect("the server stops cleanly");
    let listener = TcpListener::bind(address)
        .await
        .expect("bind the port again");
    let served = serve(listener, OneTool);

    // The first call may still find the old connection, before the client has read its
    // end; that call fails and the connection is closed by then. So within two calls, one
    // must go through a new connection.
    let mut answered = None;
    for _ in 0..2 {
        if let Ok(tools) = describe(&transport).await {
            answered = Some(tools);
            break;
        }
    }
    assert_eq!(
        answered,
        Some(vec![descriptor()]),
        "no call reached the new server"
    );
    served.stop().await.expect("the server stops cleanly");
}

/// A tool executor that never answers.
struct Silent;

#[tonic::async_trait]
impl ToolExecutorService for Silent {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        std::future::pending().await
    }

    async fn execute(
        &self,
        _request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        std::future::pending().await
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    /// A test executor from before stages: each call comes as an `Execute`.
    async fn execute_stage(
        &self,
        _request: tonic::Request<agentloop_proto::v1::ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("no stages"))
    }

    async fn reconcile(
        &self,
        _request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        std::future::pending().await
    }

    async fn verify(
        &self,
        _request: Request<agentloop_proto::v1::ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<agentloop_proto::v1::ToolExecutorServiceVerifyResponse>, Status> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_call_without_an_answer_ends_at_the_request_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let served = serve(listener, Silent);
    let transport = client::connect(
        &format!("http://{address}"),
        ClientConfig::default().with_request_timeout(Some(Duration::from_millis(100))),
    )
    .await
    .expect("connects");

    // The server knows no deadline (none is sent): only the client's own timer ends it.
    let status = describe(&transport).await.expect_err("no answer comes");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    served.stop().await.expect("the server stops cleanly");
}

/// A client of a [`OneTool`] served on a new port, and the server.
async fn one_tool() -> (client::Transport, Served) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let served = serve(listener, OneTool);
    let transport = client::connect(&format!("http://{address}"), ClientConfig::default())
        .await
        .expect("connects");
    (transport, served)
}

/// `future`'s output, or a failed test if it stalls: a request timeout bounds a call
/// until its response's headers, not the reading of its body.
async fn unstalled<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("stalled for 20 s")
}

async fn execute(transport: &client::Transport, arguments: String) -> Result<String, Status> {
    let response = client::tool_executor(transport.clone())
        .execute(ToolExecutorServiceExecuteRequest {
            call: Some(ToolCall {
                call_id: "call-1".to_owned(),
                tool: "echo".to_owned(),
                arguments_json: arguments,
            }),
            ..ToolExecutorServiceExecuteRequest::default()
        })
        .await?;
    match response
        .into_inner()
        .result
        .and_then(|result| result.outcome)
    {
        Some(tool_result::Outcome::Unknown(unknown)) => Ok(unknown.detail),
        other => Err(Status::internal(format!("not an echo: {other:?}"))),
    }
}

#[tokio::test]
async fn messages_larger_than_the_flow_control_windows_go_through_whole() {
    let (transport, served) = one_tool().await;
    // 3 MiB: more than the server's stream window (1 MiB), so the request waits for
    // window updates, and more than the client's (2 MiB), so the response arrives only
    // if the client hands its bytes back as it reads them. Twice, on one connection.
    let arguments = "a".repeat(3 * 1024 * 1024);
    for _ in 0..2 {
        let echoed = unstalled(execute(&transport, arguments.clone()))
            .await
            .expect("the echo comes back");
        assert_eq!(echoed.len(), arguments.len());
        assert!(echoed == arguments, "the echo differs from the request");
    }
    served.stop().await.expect("the server stops cleanly");
}

#[tokio::test]
async fn a_stream_larger_than_the_connection_window_is_read_whole() {
    let (transport, served) = one_tool().await;
    let megabyte = 1024 * 1024;
    // Eight answers of 1 MiB: more than the connection's window (5 MiB).
    let calls = (0..8)
        .map(|_| ToolExecutorServiceExecuteRequest {
            call: Some(ToolCall {
                arguments_json: megabyte.to_string(),
                ..ToolCall::default()
            }),
            ..ToolExecutorServiceExecuteRequest::default()
        })
        .collect();
    let mut answers = client::tool_executor(transport.clone())
        .execute_stage(ToolExecutorServiceExecuteStageRequest { calls })
        .await
        .expect("the stage starts")
        .into_inner();
    let sizes = unstalled(async {
        let mut sizes = Vec::new();
        while let Some(answer) = answers.message().await.expect("the stream goes on") {
            match answer.answer.and_then(|answer| answer.answer) {
                Some(stage_answer::Answer::Refused(refused)) => sizes.push(refused.message.len()),
                other => panic!("not a sized answer: {other:?}"),
            }
        }
        sizes
    })
    .await;
    assert_eq!(sizes, vec![megabyte; 8]);
    served.stop().await.expect("the server stops cleanly");
}

#[tokio::test]
async fn a_request_over_the_message_limit_fails_alone() {
    let (transport, served) = one_tool().await;
    let status = unstalled(execute(
        &transport,
        "a".repeat(agentloop_proto::MAX_MESSAGE_BYTES + 1),
    ))
    .await
    .expect_err("the request is over the limit");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    // The connection is still good for the next call.
    assert_eq!(
        unstalled(execute(&transport, "{}".to_owned()))
            .await
            .expect("a small call"),
        "{}"
    );
    served.stop().await.expect("the server stops cleanly");
}

/// A request body fed by a channel: a stream whose frames come when the test sends them.
struct Fed(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        self.0
            .poll_recv(cx)
            .map(|data| data.map(|data| Ok(http_body::Frame::data(data))))
    }
}

#[tokio::test]
async fn a_request_still_streaming_when_its_response_begins_goes_on() {
    // A bare HTTP/2 server that answers with headers at once, then reads the request to
    // its end and sends how many bytes it read in the trailers.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("a connection");
        let mut connection = h2::server::handshake(socket).await.expect("a handshake");
        let (request, mut respond) = connection
            .accept()
            .await
            .expect("a request")
            .expect("a good request");
        // The connection's frames are read while it is polled.
        tokio::spawn(async move { while connection.accept().await.is_some() {} });
        let mut sending = respond
            .send_response(http::Response::new(()), false)
            .expect("the headers go");
        let mut body = request.into_body();
        let mut read = 0;
        while let Some(data) = body.data().await {
            let data = data.expect("the request's data");
            read += data.len();
            body.flow_control()
                .release_capacity(data.len())
                .expect("capacity goes back");
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("read", read.into());
        sending.send_trailers(trailers).expect("the trailers go");
    });

    let mut transport = client::connect(&format!("http://{address}"), ClientConfig::default())
        .await
        .expect("connects");
    let (feed, fed) = tokio::sync::mpsc::channel(1);
    let request = http::Request::post("/count")
        .body(tonic::body::Body::new(Fed(fed)))
        .expect("a request");
    std::future::poll_fn(|cx| transport.poll_ready(cx))
        .await
        .expect("ready");
    // The response begins before the request has sent a byte.
    let response = unstalled(transport.call(request))
        .await
        .expect("the response begins");
    for _ in 0..3 {
        feed.send(Bytes::from_static(b"12345"))
            .await
            .expect("the request reads on");
    }
    drop(feed);
    let mut body = response.into_body();
    let trailers = unstalled(async {
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
                .await
                .expect("the trailers come")
                .expect("a good frame");
            if let Ok(trailers) = frame.into_trailers() {
                break trailers;
            }
        }
    })
    .await;
    assert_eq!(
        trailers.get("read").map(|read| read.as_bytes()),
        Some(&b"15"[..])
    );
    server.await.expect("the server ends well");
}
