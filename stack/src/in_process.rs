//! The runtime's ports over services of the same process: the adapters of the embedded
//! wiring, kept here with the wiring so that no service depends on another.
//!
//! The policy service, the tool gateway and the ledger are called through their gRPC
//! traits, with the messages the gRPC adapters send (`agentloop_orchestrator::calls`),
//! and no network between. The decision service is called through its core, so an
//! offline run's turn reads nothing but its script and its number.

use std::sync::Arc;
use std::time::Duration;

use agentloop_decision::{DecisionServer, ModelError};
use agentloop_effects::EffectState;
use agentloop_effects::settle::{Answer, Recorded};
use agentloop_engine::{Authorization, Check};
use agentloop_orchestrator::calls;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::policy_service_server::PolicyService;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_runtime::ports::{
    Acceptance, Ask, Batch, Claim, Decided, DecisionPort, Dispatch, Effect, EffectPage, Failure,
    LedgerPort, NewEffect, PolicyPort, Sent, Tool, ToolsPort,
};
use async_trait::async_trait;
use tonic::{Request, Status};
use uuid::Uuid;

/// A service implementation used as a port, in the same process: its generated gRPC trait
/// called directly, with no network between.
#[derive(Debug)]
pub struct InProcess<S>(pub Arc<S>);

/// The decision service in this process, called through its core.
#[derive(Debug, Clone)]
pub struct InProcessDecision(pub DecisionServer);

/// A response's message, or the runtime's reading of its failure.
fn answer<T>(answered: Result<tonic::Response<T>, Status>) -> Result<T, Failure> {
    answered
        .map(tonic::Response::into_inner)
        .map_err(|status| calls::failure(&status))
}

#[async_trait]
impl DecisionPort for InProcessDecision {
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure> {
        let replied = match ask.script {
            Some(script) => {
                let id = ask.invocation.to_string();
                self.0.decide_scripted(script, &id, ask.turn).await
            }
            None => {
                // Only the window the model reads becomes a message.
                let reads = self.0.reads_history(ask.profile);
                let window = &ask.history[ask.history.len().saturating_sub(reads)..];
                let request = calls::decide_request(&Ask {
                    history: window,
                    ..ask
                });
                self.0.decide(&request).await
            }
        };
        replied
            .map(|reply| calls::decided(pb::DecideResponse::from(reply)))
            .map_err(|error: ModelError| calls::failure(&Status::from(error)))
    }
}

#[async_trait]
impl<S: PolicyService> PolicyPort for InProcess<S> {
    async fn authorize(&self, batch: Batch<'_>) -> Result<Authorization, Failure> {
        let request = Request::new(calls::evaluate_request(&batch));
        answer(self.0.evaluate(request).await).map(calls::authorization)
    }

    async fn accept(&self, profile: &str, claim: &Claim) -> Result<Acceptance, Failure> {
        let request = Request::new(calls::validate_final_request(profile, claim));
        answer(self.0.validate_final(request).await).map(calls::acceptance)
    }
}

#[async_trait]
impl<S: ToolGatewayService> ToolsPort for InProcess<S> {
    async fn list(&self) -> Result<Vec<Tool>, Failure> {
        let request = Request::new(pb::ListToolsRequest::default());
        let listed = answer(self.0.list_tools(request).await)?;
        Ok(listed.tools.into_iter().map(calls::tool).collect())
    }

    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure> {
        let request = Request::new(calls::execute_request(&dispatch));
        calls::sent(answer(self.0.execute(request).await)?)
    }

    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure> {
        let request = Request::new(calls::stage_request(dispatches));
        let response = answer(self.0.execute_stage(request).await)?;
        Ok(calls::stage_answers(dispatches, response))
    }

    async fn reconcile(&self, tool: &str, effect_key: &str) -> Result<Answer, Failure> {
        let request = Request::new(pb::ToolGatewayServiceReconcileRequest {
            tool: tool.to_owned(),
            effect_key: effect_key.to_owned(),
        });
        answer(self.0.reconcile(request).await).map(calls::answer)
    }

    async fn verify(
        &self,
        name: &str,
        claim: &Claim,
        within: Option<Duration>,
    ) -> Result<Option<Check>, Failure> {
        let request = Request::new(calls::verify_request(name, claim, within));
        answer(self.0.verify(request).await).map(calls::verdict)
    }

    fn max_stage(&self) -> usize {
        // No round trip to save: a future per call costs less than gathering a stage.
        1
    }
}

#[async_trait]
impl<S: EffectLedgerService> LedgerPort for InProcess<S> {
    async fn prepare(&self, effect: NewEffect<'_>) -> Result<Effect, Failure> {
        let request = Request::new(calls::prepare_request(&effect));
        calls::answered_entry(answer(self.0.prepare(request).await)?.entry)
    }

    async fn mark_dispatched(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Effect, Failure> {
        let request = Request::new(calls::mark_dispatched_request(effect_key, expected));
        calls::answered_entry(answer(self.0.mark_dispatched(request).await)?.entry)
    }

    async fn record(
        &self,
        effect_key: &str,
        expected: EffectState,
        recorded: &Recorded,
    ) -> Result<Effect, Failure> {
        let request = Request::new(calls::record_request(effect_key, expected, recorded));
        calls::answered_entry(answer(self.0.record(request).await)?.entry)
    }

    async fn get(&self, effect_key: &str) -> Result<Effect, Failure> {
        let request = Request::new(pb::GetRequest {
            effect_key: effect_key.to_owned(),
        });
        calls::answered_entry(answer(self.0.get(request).await)?.entry)
    }

    async fn list_unresolved(
        &self,
        invocation: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let request = Request::new(pb::ListUnresolvedRequest {
            invocation_id: invocation.to_owned(),
            page_size,
            page_token: page_token.to_owned(),
        });
        let page = answer(self.0.list_unresolved(request).await)?;
        Ok(calls::effect_page(page.entries, page.next_page_token))
    }

    async fn list_by_invocation(
        &self,
        invocation: Uuid,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let request = Request::new(pb::ListByInvocationRequest {
            invocation_id: invocation.to_string(),
            page_size,
            page_token: page_token.to_owned(),
        });
        let page = answer(self.0.list_by_invocation(request).await)?;
        Ok(calls::effect_page(page.entries, page.next_page_token))
    }
}
