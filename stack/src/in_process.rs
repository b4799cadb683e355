//! The orchestrator's ports over services of the same process: the adapters of the
//! embedded wiring, kept here with the wiring so that no service depends on another.

use agentloop_decision::DecisionServer;
use agentloop_orchestrator::DecisionPort;
use agentloop_proto::v1 as pb;
use async_trait::async_trait;
use tonic::Status;

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
