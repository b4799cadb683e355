//! Generated servers wrapped with the same limits and compression as the clients of
//! the `client` module, so both sides of every agentloop RPC agree on them.
//!
//! Servers accept gzip-compressed requests and compress responses with gzip when the
//! client accepts it. The workspace's own clients ask for neither (see the `client`
//! module); a client across a slow link may.

use tonic::codec::CompressionEncoding;

use crate::MAX_MESSAGE_BYTES;
use crate::v1::decision_service_server::{DecisionService, DecisionServiceServer};
use crate::v1::effect_ledger_service_server::{EffectLedgerService, EffectLedgerServiceServer};
use crate::v1::orchestrator_service_server::{OrchestratorService, OrchestratorServiceServer};
use crate::v1::policy_service_server::{PolicyService, PolicyServiceServer};
use crate::v1::tool_executor_service_server::{ToolExecutorService, ToolExecutorServiceServer};
use crate::v1::tool_gateway_service_server::{ToolGatewayService, ToolGatewayServiceServer};

/// Applies the shared limits and compression to a generated server. A macro because
/// the generated servers share these methods by name, not through a trait.
macro_rules! configured {
    ($server:expr) => {
        $server
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
    };
}

/// Serves an [`OrchestratorService`] implementation with the shared settings.
pub fn orchestrator<T: OrchestratorService>(service: T) -> OrchestratorServiceServer<T> {
    configured!(OrchestratorServiceServer::new(service))
}

/// Serves a [`DecisionService`] implementation with the shared settings.
pub fn decision<T: DecisionService>(service: T) -> DecisionServiceServer<T> {
    configured!(DecisionServiceServer::new(service))
}

/// Serves a [`PolicyService`] implementation with the shared settings.
pub fn policy<T: PolicyService>(service: T) -> PolicyServiceServer<T> {
    configured!(PolicyServiceServer::new(service))
}

/// Serves a [`ToolGatewayService`] implementation with the shared settings.
pub fn tool_gateway<T: ToolGatewayService>(service: T) -> ToolGatewayServiceServer<T> {
    configured!(ToolGatewayServiceServer::new(service))
}

/// Serves a [`ToolExecutorService`] implementation (a Rust tool executor) with the
/// shared settings.
pub fn tool_executor<T: ToolExecutorService>(service: T) -> ToolExecutorServiceServer<T> {
    configured!(ToolExecutorServiceServer::new(service))
}

/// The answers of a [`ToolExecutorService`]'s `ExecuteStage`, as they come: the stream
/// type every executor in the workspace answers with.
pub type StageStream =
    tonic::codegen::BoxStream<crate::v1::ToolExecutorServiceExecuteStageResponse>;

/// Any tool executor, behind a pointer (`Arc<ToolExecutor>`): how the gateway holds the
/// executors that run in its own process.
pub type ToolExecutor = dyn ToolExecutorService<ExecuteStageStream = StageStream>;

/// Serves an [`EffectLedgerService`] implementation with the shared settings.
pub fn effect_ledger<T: EffectLedgerService>(service: T) -> EffectLedgerServiceServer<T> {
    configured!(EffectLedgerServiceServer::new(service))
}
