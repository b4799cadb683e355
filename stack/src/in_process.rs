//! The orchestrator's ports over services of the same process: the adapters of the
//! embedded wiring, kept here with the wiring so that no service depends on another.

use std::sync::Arc;

use agentloop_decision::DecisionServer;
use agentloop_orchestrator::{DecisionPort, LedgerPort, PolicyPort, ToolsPort};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::policy_service_server::PolicyService;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use async_trait::async_trait;
use tonic::{Request, Status};

/// A service implementation used as a port, in the same process: its generated gRPC trait
/// called directly, with no network between.
#[derive(Debug)]
pub struct InProcess<S>(pub Arc<S>);

/// The decision service in this process, called through its core rather than its gRPC
/// trait, which would need the request by value with the tools inside (a copy of both
/// every turn).
#[derive(Debug, Clone)]
pub struct InProcessDecision(pub DecisionServer);

#[async_trait]
impl DecisionPort for InProcessDecision {
    async fn decide(
        &self,
        request: &pb::DecideRequest,
        tools: &[pb::ToolDescriptor],
    ) -> Result<pb::DecideResponse, Status> {
        self.0
            .decide_with(request, tools)
            .await
            .map(pb::DecideResponse::from)
            .map_err(Status::from)
    }
}

#[async_trait]
impl<S: PolicyService> PolicyPort for InProcess<S> {
    async fn evaluate(&self, request: pb::EvaluateRequest) -> Result<pb::EvaluateResponse, Status> {
        self.0
            .evaluate(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn validate_final(
        &self,
        request: pb::ValidateFinalRequest,
    ) -> Result<pb::ValidateFinalResponse, Status> {
        self.0
            .validate_final(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }
}

#[async_trait]
impl<S: ToolGatewayService> ToolsPort for InProcess<S> {
    async fn list_tools(
        &self,
        request: pb::ListToolsRequest,
    ) -> Result<pb::ListToolsResponse, Status> {
        self.0
            .list_tools(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn execute(
        &self,
        request: pb::ToolGatewayServiceExecuteRequest,
    ) -> Result<pb::ToolGatewayServiceExecuteResponse, Status> {
        self.0
            .execute(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn execute_stage(
        &self,
        request: pb::ExecuteStageRequest,
    ) -> Result<pb::ExecuteStageResponse, Status> {
        self.0
            .execute_stage(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn reconcile(
        &self,
        request: pb::ToolGatewayServiceReconcileRequest,
    ) -> Result<pb::ToolGatewayServiceReconcileResponse, Status> {
        self.0
            .reconcile(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn verify(
        &self,
        request: pb::ToolGatewayServiceVerifyRequest,
    ) -> Result<pb::ToolGatewayServiceVerifyResponse, Status> {
        self.0
            .verify(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    fn sends_stages(&self) -> bool {
        false
    }
}

#[async_trait]
impl<S: EffectLedgerService> LedgerPort for InProcess<S> {
    async fn prepare(&self, request: pb::PrepareRequest) -> Result<pb::PrepareResponse, Status> {
        self.0
            .prepare(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn mark_dispatched(
        &self,
        request: pb::MarkDispatchedRequest,
    ) -> Result<pb::MarkDispatchedResponse, Status> {
        self.0
            .mark_dispatched(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn record(&self, request: pb::RecordRequest) -> Result<pb::RecordResponse, Status> {
        self.0
            .record(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn get(&self, request: pb::GetRequest) -> Result<pb::GetResponse, Status> {
        self.0
            .get(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn list_unresolved(
        &self,
        request: pb::ListUnresolvedRequest,
    ) -> Result<pb::ListUnresolvedResponse, Status> {
        self.0
            .list_unresolved(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn list_by_invocation(
        &self,
        request: pb::ListByInvocationRequest,
    ) -> Result<pb::ListByInvocationResponse, Status> {
        self.0
            .list_by_invocation(Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }
}
