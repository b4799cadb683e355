//! The runtime's ports over gRPC: each a generated client, its calls converted to and
//! from the wire by [`crate::calls`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use agentloop_effects::EffectState;
use agentloop_effects::settle::{Answer, Recorded};
use agentloop_engine::{Authorization, Check};
use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::decision_service_client::DecisionServiceClient;
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_proto::v1::policy_service_client::PolicyServiceClient;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_runtime::ports::{
    Acceptance, Ask, Batch, Claim, Decided, DecisionPort, Dispatch, Effect, EffectPage, Failure,
    LedgerPort, NewEffect, PolicyPort, Ports, Sent, Tool, ToolsPort,
};
use async_trait::async_trait;
use tonic::{Code, Status};
use uuid::Uuid;

use crate::calls;

/// Ports over gRPC connections (the distributed deployment).
pub fn ports(decision: Transport, policy: Transport, tools: Transport, ledger: Transport) -> Ports {
    Ports {
        decision: Arc::new(Decision(agentloop_proto::client::decision(decision))),
        policy: Arc::new(Policy(agentloop_proto::client::policy(policy))),
        tools: Arc::new(GrpcTools::new(agentloop_proto::client::tool_gateway(tools))),
        ledger: Arc::new(Ledger(agentloop_proto::client::effect_ledger(ledger))),
    }
}

/// A unary call's answer, or the runtime's reading of its failure.
fn answer<T>(answered: Result<tonic::Response<T>, Status>) -> Result<T, Failure> {
    answered
        .map(tonic::Response::into_inner)
        .map_err(|status| calls::failure(&status))
}

/// The decision service over gRPC.
#[derive(Debug, Clone)]
pub struct Decision(pub DecisionServiceClient<Transport>);

#[async_trait]
impl DecisionPort for Decision {
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure> {
        let request = calls::decide_request(&ask);
        answer(self.0.clone().decide(request).await).map(calls::decided)
    }
}

/// The policy service over gRPC.
#[derive(Debug, Clone)]
pub struct Policy(pub PolicyServiceClient<Transport>);

#[async_trait]
impl PolicyPort for Policy {
    async fn authorize(&self, batch: Batch<'_>) -> Result<Authorization, Failure> {
        let request = calls::evaluate_request(&batch);
        answer(self.0.clone().evaluate(request).await).map(calls::authorization)
    }

    async fn accept(&self, profile: &str, claim: &Claim) -> Result<Acceptance, Failure> {
        let request = calls::validate_final_request(profile, claim);
        answer(self.0.clone().validate_final(request).await).map(calls::acceptance)
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
    async fn list(&self) -> Result<Vec<Tool>, Failure> {
        let listed = answer(
            self.client
                .clone()
                .list_tools(pb::ListToolsRequest::default())
                .await,
        )?;
        Ok(listed.tools.into_iter().map(calls::tool).collect())
    }

    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure> {
        let request = calls::execute_request(&dispatch);
        calls::sent(answer(self.client.clone().execute(request).await)?)
    }

    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure> {
        let request = calls::stage_request(dispatches);
        let answered = self.client.clone().execute_stage(request).await;
        if let Err(status) = &answered
            && status.code() == Code::Unimplemented
        {
            self.stages.store(false, Relaxed);
        }
        let response = answer(answered)?;
        Ok(calls::stage_answers(dispatches, response))
    }

    async fn reconcile(&self, tool: &str, effect_key: &str) -> Result<Answer, Failure> {
        let request = pb::ToolGatewayServiceReconcileRequest {
            tool: tool.to_owned(),
            effect_key: effect_key.to_owned(),
        };
        answer(self.client.clone().reconcile(request).await).map(calls::answer)
    }

    async fn verify(
        &self,
        name: &str,
        claim: &Claim,
        within: Option<Duration>,
    ) -> Result<Option<Check>, Failure> {
        let request = calls::verify_request(name, claim, within);
        answer(self.client.clone().verify(request).await).map(calls::verdict)
    }

    fn max_stage(&self) -> usize {
        if self.stages.load(Relaxed) {
            MAX_STAGE_CALLS
        } else {
            1
        }
    }
}

/// The effect ledger over gRPC.
#[derive(Debug, Clone)]
pub struct Ledger(pub EffectLedgerServiceClient<Transport>);

#[async_trait]
impl LedgerPort for Ledger {
    async fn prepare(&self, effect: NewEffect<'_>) -> Result<Effect, Failure> {
        let request = calls::prepare_request(&effect);
        calls::answered_entry(answer(self.0.clone().prepare(request).await)?.entry)
    }

    async fn mark_dispatched(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Effect, Failure> {
        let request = calls::mark_dispatched_request(effect_key, expected);
        calls::answered_entry(answer(self.0.clone().mark_dispatched(request).await)?.entry)
    }

    async fn record(
        &self,
        effect_key: &str,
        expected: EffectState,
        recorded: &Recorded,
    ) -> Result<Effect, Failure> {
        let request = calls::record_request(effect_key, expected, recorded);
        calls::answered_entry(answer(self.0.clone().record(request).await)?.entry)
    }

    async fn get(&self, effect_key: &str) -> Result<Effect, Failure> {
        let request = pb::GetRequest {
            effect_key: effect_key.to_owned(),
        };
        calls::answered_entry(answer(self.0.clone().get(request).await)?.entry)
    }

    async fn list_unresolved(
        &self,
        invocation: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let request = pb::ListUnresolvedRequest {
            invocation_id: invocation.to_owned(),
            page_size,
            page_token: page_token.to_owned(),
        };
        let page = answer(self.0.clone().list_unresolved(request).await)?;
        Ok(calls::effect_page(page.entries, page.next_page_token))
    }

    async fn list_by_invocation(
        &self,
        invocation: Uuid,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let request = pb::ListByInvocationRequest {
            invocation_id: invocation.to_string(),
            page_size,
            page_token: page_token.to_owned(),
        };
        let page = answer(self.0.clone().list_by_invocation(request).await)?;
        Ok(calls::effect_page(page.entries, page.next_page_token))
    }
}
