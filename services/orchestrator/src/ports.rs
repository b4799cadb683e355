//! The orchestrator's view of the other four services: narrow traits ("ports"), and their
//! gRPC adapters (the generated clients). The in-process adapters (a service's own
//! implementation, called without a network) live with the wiring, in `agentloop-stack`.
//! Both speak the wire messages, so the service code that validates and answers a request
//! is the same either way.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::decision_service_client::DecisionServiceClient;
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_proto::v1::policy_service_client::PolicyServiceClient;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use async_trait::async_trait;
use tonic::{Code, Status};

/// The model, behind the decision service.
#[async_trait]
pub trait DecisionPort: Send + Sync + 'static {
    /// One decision, offering the model `tools` (the request's own `tools` are empty).
    /// Both are borrowed: the runner keeps the request from turn to turn and shares the
    /// tools with every invocation of the same tools, so an in-process model reads them
    /// where they are and only a network client copies them.
    async fn decide(
        &self,
        request: &pb::DecideRequest,
        tools: &[pb::ToolDescriptor],
    ) -> Result<pb::DecideResponse, Status>;
}

/// Policy: argument schemas, authorization, approval gates, final-answer validators.
#[async_trait]
pub trait PolicyPort: Send + Sync + 'static {
    /// Judges a batch.
    async fn evaluate(&self, request: pb::EvaluateRequest) -> Result<pb::EvaluateResponse, Status>;
    /// Judges a final answer.
    async fn validate_final(
        &self,
        request: pb::ValidateFinalRequest,
    ) -> Result<pb::ValidateFinalResponse, Status>;
}

/// The tool gateway.
#[async_trait]
pub trait ToolsPort: Send + Sync + 'static {
    /// The registered tools.
    async fn list_tools(
        &self,
        request: pb::ListToolsRequest,
    ) -> Result<pb::ListToolsResponse, Status>;
    /// Runs one call. Dropping the future cancels the call at the executor.
    async fn execute(
        &self,
        request: pb::ToolGatewayServiceExecuteRequest,
    ) -> Result<pb::ToolGatewayServiceExecuteResponse, Status>;
    /// Runs the read-only calls of one stage together, each to the answer `execute`
    /// would have given, in the order asked. Dropping the future cancels them all.
    async fn execute_stage(
        &self,
        request: pb::ExecuteStageRequest,
    ) -> Result<pb::ExecuteStageResponse, Status>;
    /// Asks the owning executor what became of an effect.
    async fn reconcile(
        &self,
        request: pb::ToolGatewayServiceReconcileRequest,
    ) -> Result<pb::ToolGatewayServiceReconcileResponse, Status>;
    /// Has a verifier judge a final answer. Dropping the future cancels it.
    async fn verify(
        &self,
        request: pb::ToolGatewayServiceVerifyRequest,
    ) -> Result<pb::ToolGatewayServiceVerifyResponse, Status>;
    /// Whether a stage of several read-only calls goes as one `execute_stage` rather
    /// than one `execute` per call. Across a network that saves a round trip per call
    /// but one. In the same process there is no round trip to save, and a future per
    /// call costs less than gathering the stage's answers into one.
    fn sends_stages(&self) -> bool;
}

/// The effect ledger: every write is recorded before it is dispatched and after.
#[async_trait]
pub trait LedgerPort: Send + Sync + 'static {
    /// Records an effect before dispatch (idempotent on the effect key).
    async fn prepare(&self, request: pb::PrepareRequest) -> Result<pb::PrepareResponse, Status>;
    /// Records that the effect is about to be sent.
    async fn mark_dispatched(
        &self,
        request: pb::MarkDispatchedRequest,
    ) -> Result<pb::MarkDispatchedResponse, Status>;
    /// Records an outcome.
    async fn record(&self, request: pb::RecordRequest) -> Result<pb::RecordResponse, Status>;
    /// One entry, for an operator who settles it (`SettleEffect`).
    async fn get(&self, request: pb::GetRequest) -> Result<pb::GetResponse, Status>;
    /// A page of unresolved entries, for an operator (`ListUnresolvedEffects`).
    async fn list_unresolved(
        &self,
        request: pb::ListUnresolvedRequest,
    ) -> Result<pb::ListUnresolvedResponse, Status>;
    /// A page of one invocation's entries in every state, for checking a final answer.
    async fn list_by_invocation(
        &self,
        request: pb::ListByInvocationRequest,
    ) -> Result<pb::ListByInvocationResponse, Status>;
}

/// The ports one orchestrator uses.
#[derive(Clone)]
pub struct Ports {
    /// The decision service.
    pub decision: Arc<dyn DecisionPort>,
    /// The policy service.
    pub policy: Arc<dyn PolicyPort>,
    /// The tool gateway.
    pub tools: Arc<dyn ToolsPort>,
    /// The effect ledger.
    pub ledger: Arc<dyn LedgerPort>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ports").finish_non_exhaustive()
    }
}

impl Ports {
    /// Ports over gRPC connections (the distributed deployment).
    pub fn grpc(
        decision: Transport,
        policy: Transport,
        tools: Transport,
        ledger: Transport,
    ) -> Ports {
        Ports {
            decision: Arc::new(agentloop_proto::client::decision(decision)),
            policy: Arc::new(agentloop_proto::client::policy(policy)),
            tools: Arc::new(GrpcTools::new(agentloop_proto::client::tool_gateway(tools))),
            ledger: Arc::new(agentloop_proto::client::effect_ledger(ledger)),
        }
    }
}

// The generated clients' own methods take `&mut self` and would lose to the port
// methods in method resolution, hence the fully qualified calls on a cheap clone.

#[async_trait]
impl DecisionPort for DecisionServiceClient<Transport> {
    async fn decide(
        &self,
        request: &pb::DecideRequest,
        tools: &[pb::ToolDescriptor],
    ) -> Result<pb::DecideResponse, Status> {
        let request = pb::DecideRequest {
            tools: tools.to_vec(),
            ..request.clone()
        };
        DecisionServiceClient::decide(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }
}

#[async_trait]
impl PolicyPort for PolicyServiceClient<Transport> {
    async fn evaluate(&self, request: pb::EvaluateRequest) -> Result<pb::EvaluateResponse, Status> {
        PolicyServiceClient::evaluate(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn validate_final(
        &self,
        request: pb::ValidateFinalRequest,
    ) -> Result<pb::ValidateFinalResponse, Status> {
        PolicyServiceClient::validate_final(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }
}

/// The tool gateway over gRPC.
///
/// Stages go as one `ExecuteStage` until the gateway answers it UNIMPLEMENTED: a gateway
/// from before that RPC, met during a rolling upgrade that updated the orchestrators
/// first. From then on this port sends every call on its own. The stage that met the
/// answer loses nothing: its calls, unanswered, are sent again one by one.
#[derive(Debug)]
pub struct GrpcTools {
    client: ToolGatewayServiceClient<Transport>,
    stages: AtomicBool,
}

impl GrpcTools {
    /// The port over `client`; it tries stages first.
    pub fn new(client: ToolGatewayServiceClient<Transport>) -> GrpcTools {
        GrpcTools {
            client,
            stages: AtomicBool::new(true),
        }
    }
}

#[async_trait]
impl ToolsPort for GrpcTools {
    async fn list_tools(
        &self,
        request: pb::ListToolsRequest,
    ) -> Result<pb::ListToolsResponse, Status> {
        self.client
            .clone()
            .list_tools(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn execute(
        &self,
        request: pb::ToolGatewayServiceExecuteRequest,
    ) -> Result<pb::ToolGatewayServiceExecuteResponse, Status> {
        self.client
            .clone()
            .execute(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn execute_stage(
        &self,
        request: pb::ExecuteStageRequest,
    ) -> Result<pb::ExecuteStageResponse, Status> {
        let answered = self.client.clone().execute_stage(request).await;
        if let Err(status) = &answered
            && status.code() == Code::Unimplemented
        {
            self.stages.store(false, Relaxed);
        }
        answered.map(tonic::Response::into_inner)
    }

    async fn reconcile(
        &self,
        request: pb::ToolGatewayServiceReconcileRequest,
    ) -> Result<pb::ToolGatewayServiceReconcileResponse, Status> {
        self.client
            .clone()
            .reconcile(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn verify(
        &self,
        request: pb::ToolGatewayServiceVerifyRequest,
    ) -> Result<pb::ToolGatewayServiceVerifyResponse, Status> {
        self.client
            .clone()
            .verify(request)
            .await
            .map(tonic::Response::into_inner)
    }

    fn sends_stages(&self) -> bool {
        self.stages.load(Relaxed)
    }
}

#[async_trait]
impl LedgerPort for EffectLedgerServiceClient<Transport> {
    async fn prepare(&self, request: pb::PrepareRequest) -> Result<pb::PrepareResponse, Status> {
        EffectLedgerServiceClient::prepare(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn mark_dispatched(
        &self,
        request: pb::MarkDispatchedRequest,
    ) -> Result<pb::MarkDispatchedResponse, Status> {
        EffectLedgerServiceClient::mark_dispatched(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn record(&self, request: pb::RecordRequest) -> Result<pb::RecordResponse, Status> {
        EffectLedgerServiceClient::record(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn get(&self, request: pb::GetRequest) -> Result<pb::GetResponse, Status> {
        EffectLedgerServiceClient::get(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn list_unresolved(
        &self,
        request: pb::ListUnresolvedRequest,
    ) -> Result<pb::ListUnresolvedResponse, Status> {
        EffectLedgerServiceClient::list_unresolved(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn list_by_invocation(
        &self,
        request: pb::ListByInvocationRequest,
    ) -> Result<pb::ListByInvocationResponse, Status> {
        EffectLedgerServiceClient::list_by_invocation(&mut self.clone(), request)
            .await
            .map(tonic::Response::into_inner)
    }
}
