//! The gRPC tool port against a gateway on a real loopback server: stages stop after an
//! old gateway says it does not know them, and only then.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use agentloop_engine::{CallId, ToolCall};
use agentloop_orchestrator::grpc::{Remote, Tools};
use agentloop_proto::client::{self, Transport};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_runtime::ports::{Dispatch, FailureKind, ToolsPort};
use tonic::{Code, Request, Response, Status};

/// A gateway whose `ExecuteStage` fails with the given code, each time it is asked.
struct Failing {
    code: Code,
    asked: Arc<Mutex<u32>>,
}

#[tonic::async_trait]
impl ToolGatewayService for Failing {
    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        Ok(Response::new(pb::ListToolsResponse::default()))
    }

    async fn execute(
        &self,
        _request: Request<pb::ToolGatewayServiceExecuteRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceExecuteResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn execute_stage(
        &self,
        _request: Request<pb::ExecuteStageRequest>,
    ) -> Result<Response<pb::ExecuteStageResponse>, Status> {
        *self.asked.lock().unwrap() += 1;
        Err(Status::new(self.code, "as told"))
    }

    async fn reconcile(
        &self,
        _request: Request<pb::ToolGatewayServiceReconcileRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceReconcileResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn verify(
        &self,
        _request: Request<pb::ToolGatewayServiceVerifyRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceVerifyResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn register_executor(
        &self,
        _request: Request<pb::RegisterExecutorRequest>,
    ) -> Result<Response<pb::RegisterExecutorResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn deregister_executor(
        &self,
        _request: Request<pb::DeregisterExecutorRequest>,
    ) -> Result<Response<pb::DeregisterExecutorResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }
}

/// The port, over gRPC, to a gateway that fails stages with `code`.
/// Returns the port and the count of stages the gateway was asked.
async fn port_to(
    code: Code,
) -> (
    Tools<Remote<ToolGatewayServiceClient<Transport>>>,
    Arc<Mutex<u32>>,
) {
    let asked = Arc::new(Mutex::new(0));
    let gateway = Failing {
        code,
        asked: asked.clone(),
    };
    let (listener, endpoint) = common::listener().await;
    let services =
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::tool_gateway(gateway));
    tokio::spawn(agentloop_server::serve(
        listener,
        services,
        std::future::pending(),
    ));
    let transport = common::channel(&endpoint).await;
    (
        Tools::remote(Remote(client::tool_gateway(transport))),
        asked,
    )
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        call_id: CallId::new(id),
        tool: "lookup".into(),
        arguments_json: "{}".into(),
    }
}

fn dispatch(call: &ToolCall) -> Dispatch<'_> {
    Dispatch {
        invocation: uuid::Uuid::nil(),
        call,
        effect_key: "",
        attempt: 1,
        timeout_ms: 1_000,
        digest: None,
        answer: None,
    }
}

#[tokio::test]
async fn a_gateway_without_stages_gets_calls_one_by_one_from_then_on() {
    let (port, asked) = port_to(Code::Unimplemented).await;
    let (a, b) = (call("a"), call("b"));
    let stage = [dispatch(&a), dispatch(&b)];
    assert!(port.max_stage() > 1);
    let failure = port.execute_stage(&stage).await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Unimplemented);
    assert_eq!(port.max_stage(), 1);
    assert_eq!(*asked.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_failed_stage_of_a_gateway_that_has_them_keeps_stages_on() {
    let (port, asked) = port_to(Code::Unavailable).await;
    let (a, b) = (call("a"), call("b"));
    let stage = [dispatch(&a), dispatch(&b)];
    for _ in 0..2 {
        let failure = port.execute_stage(&stage).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Unavailable);
        assert!(port.max_stage() > 1);
    }
    assert_eq!(*asked.lock().unwrap(), 2);
}
