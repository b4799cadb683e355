//! A real tonic server on an ephemeral port, reached through the crate's `connect`
//! factory: proves the generated client and server agree with the shared limits, that
//! the factory's clients do not compress, and that the servers still speak gzip to a
//! client that asks for it.

use std::time::Duration;

use agentloop_proto::client::{self, ClientConfig, ConnectError};
use agentloop_proto::server;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, SideEffect, ToolDescriptor,
    ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteResponse,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

/// A tool executor that only describes one tool.
struct OneTool;

fn descriptor() -> ToolDescriptor {
    ToolDescriptor {
        name: "orders.lookup".to_owned(),
        description: "Looks up an order by ID.".to_owned(),
        input_schema_json: r#"{"type":"object","required":["order_id"]}"#.to_owned(),
        side_effect: SideEffect::ReadOnly.into(),
        commutative: true,
        timeout: Some(prost_types::Duration {
            seconds: 2,
            nanos: 0,
        }),
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
        }))
    }

    async fn execute(
        &self,
        _request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        Err(Status::unimplemented("not needed by this test"))
    }

    async fn reconcile(
        &self,
        _request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Err(Status::unimplemented("not needed by this test"))
    }
}

#[tokio::test]
async fn describe_through_the_client_factory() {
    // Bound before serving, so the client cannot race the server's start.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let address = listener.local_addr().expect("local address");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server::tool_executor(OneTool))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stop_rx.await;
            }),
    );

    let config = ClientConfig::default()
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Some(Duration::from_secs(10)));
    let channel = client::connect(&format!("http://{address}"), config)
        .await
        .expect("connects");
    let encoding = |response: &Response<DescribeResponse>| {
        response
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok().map(str::to_owned))
    };
    let plain = client::tool_executor(channel.clone());
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

    stop_tx.send(()).expect("server still running");
    serving
        .await
        .expect("server task joins")
        .expect("server shuts down cleanly");
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
