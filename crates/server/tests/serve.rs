//! `serve` over real TCP on 127.0.0.1 port 0: health, reflection and graceful shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::net::SocketAddr;

use agentloop_proto::v1::tool_executor_service_server::{
    ToolExecutorService, ToolExecutorServiceServer,
};
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceReconcileResponse,
};
use agentloop_server::{ServiceSet, serve};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

/// A tool executor that implements nothing: only its name matters here.
#[derive(Debug, Clone, Copy)]
struct Idle;

#[tonic::async_trait]
impl ToolExecutorService for Idle {
    async fn describe(
        &self,
        _: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse::default()))
    }
    async fn execute(
        &self,
        _: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        Err(Status::unimplemented("idle"))
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
        _: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Err(Status::unimplemented("idle"))
    }

    async fn verify(
        &self,
        _: Request<agentloop_proto::v1::ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<agentloop_proto::v1::ToolExecutorServiceVerifyResponse>, Status> {
        Err(Status::unimplemented("idle"))
    }
}

const EXECUTOR: &str = "agentloop.v1.ToolExecutorService";

struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), agentloop_server::ServeError>>,
}

async fn start() -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let services = ServiceSet::new().add(ToolExecutorServiceServer::new(Idle));
    assert_eq!(services.names(), [EXECUTOR]);
    let handle = tokio::spawn(serve(listener, services, async {
        let _ = stopped.await;
    }));
    Running { addr, stop, handle }
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn status_of(client: &mut HealthClient<Channel>, service: &str) -> Result<i32, Status> {
    client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map(|r| r.into_inner().status)
}

#[tokio::test]
async fn health_reports_added_services_and_not_found_for_others() {
    let server = start().await;
    let mut health = HealthClient::new(channel(server.addr).await);

    assert_eq!(
        status_of(&mut health, EXECUTOR).await.unwrap(),
        ServingStatus::Serving as i32
    );
    assert_eq!(
        status_of(&mut health, "").await.unwrap(),
        ServingStatus::Serving as i32
    );
    let unknown = status_of(&mut health, "agentloop.v1.NoSuchService")
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // The service itself is routed (not just advertised).
    let mut executor =
        agentloop_proto::v1::tool_executor_service_client::ToolExecutorServiceClient::new(
            channel(server.addr).await,
        );
    executor.describe(DescribeRequest::default()).await.unwrap();

    drop(health);
    drop(executor);
    server.stop.send(()).unwrap();
    server.handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn reflection_lists_the_served_services_only() {
    let server = start().await;
    let mut reflection = ServerReflectionClient::new(channel(server.addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let names: Vec<String> = match response.message_response.unwrap() {
        MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection response {other:?}"),
    };
    assert!(names.iter().any(|n| n == EXECUTOR), "{names:?}");
    assert!(
        names.iter().any(|n| n == "grpc.health.v1.Health"),
        "{names:?}"
    );
    // Services in the descriptor set but not served here are not advertised.
    assert!(
        !names
            .iter()
            .any(|n| n == "agentloop.v1.OrchestratorService"),
        "{names:?}"
    );

    // The agentloop descriptor is resolvable, so grpcurl can describe the methods.
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(EXECUTOR.to_owned())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    match responses
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
    {
        MessageResponse::FileDescriptorResponse(files) => {
            assert!(!files.file_descriptor_proto.is_empty());
        }
        other => panic!("unexpected reflection response {other:?}"),
    }

    drop(responses);
    drop(reflection);
    server.stop.send(()).unwrap();
    server.handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_flips_health_then_drains_and_closes_the_port() {
    let server = start().await;
    let mut health = HealthClient::new(channel(server.addr).await);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: EXECUTOR.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status,
        ServingStatus::Serving as i32
    );

    server.stop.send(()).unwrap();

    // The open watch (an in-flight RPC) sees NOT_SERVING before the server goes away.
    assert_eq!(
        watch.message().await.unwrap().unwrap().status,
        ServingStatus::NotServing as i32
    );
    // The drain waits for that RPC; once the client lets go, serve returns Ok.
    drop(watch);
    drop(health);
    server.handle.await.unwrap().unwrap();

    let refused = tokio::net::TcpStream::connect(server.addr).await;
    assert!(refused.is_err(), "port still accepts connections");
}

#[tokio::test]
async fn a_service_winds_down_after_health_turns_not_serving_and_before_the_port_closes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (began, winding) = oneshot::channel::<()>();
    let (finish, finished) = oneshot::channel::<()>();
    let services = ServiceSet::new()
        .add(ToolExecutorServiceServer::new(Idle))
        .drain(async move {
            let _ = began.send(());
            let _ = finished.await;
        });
    let handle = tokio::spawn(serve(listener, services, async {
        let _ = stopped.await;
    }));
    let mut health = HealthClient::new(channel(addr).await);
    assert_eq!(
        status_of(&mut health, EXECUTOR).await.unwrap(),
        ServingStatus::Serving as i32
    );

    stop.send(()).unwrap();
    winding.await.unwrap();
    // While the service winds down, a new connection is still accepted and told
    // NOT_SERVING: readiness fails at once, not when the wind-down is over.
    let mut fresh = HealthClient::new(channel(addr).await);
    for service in [EXECUTOR, ""] {
        assert_eq!(
            status_of(&mut fresh, service).await.unwrap(),
            ServingStatus::NotServing as i32,
            "{service:?}"
        );
    }
    assert!(
        !handle.is_finished(),
        "serve returned before the wind-down ended"
    );

    finish.send(()).unwrap();
    drop(fresh);
    drop(health);
    handle.await.unwrap().unwrap();
}
