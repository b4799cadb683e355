//! The runtime's ports over gRPC, their calls converted to and from the wire by
//! [`crate::calls`]. The decision service, policy and the ledger are reached by their
//! generated clients. The tool gateway is reached through its gRPC trait, by one
//! adapter: over the network the trait is the client's ([`Remote`]), in the same
//! process the gateway's own implementation, with no network between.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
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
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_runtime::ports::{
    Acceptance, Ask, Batch, Claim, Decided, DecisionPort, Dispatch, Effect, EffectPage, Failure,
    LedgerPort, NewEffect, PolicyPort, Ports, Sent, Tool, ToolsPort,
};
use async_trait::async_trait;
use tonic::{Code, Request, Response, Status};
use uuid::Uuid;

use agentloop_wire as wire;

use crate::calls;

/// Ports over gRPC connections (the distributed deployment).
pub fn ports(decision: Transport, policy: Transport, tools: Transport, ledger: Transport) -> Ports {
    Ports {
        decision: Arc::new(Decision::new(agentloop_proto::client::decision(decision))),
        policy: Arc::new(Policy(agentloop_proto::client::policy(policy))),
        tools: Arc::new(Tools::remote(Remote(
            agentloop_proto::client::tool_gateway(tools),
        ))),
        ledger: Arc::new(Ledger(agentloop_proto::client::effect_ledger(ledger))),
    }
}

/// A unary call's answer, or the runtime's reading of its failure.
fn answer<T>(answered: Result<tonic::Response<T>, Status>) -> Result<T, Failure> {
    answered
        .map(tonic::Response::into_inner)
        .map_err(|status| calls::failure(&status))
}

/// Most profiles whose model's reads a [`Decision`] port remembers; past them, the
/// requests of a new profile carry everything.
const MAX_KNOWN_PROFILES: usize = 256;

/// The decision service over gRPC.
///
/// Each answer says what the model reads of a request; the requests that follow for the
/// same profile carry only that much of the window and the tools, as a model in the
/// orchestrator's own process is given. Should the service's model read more by then
/// (its configuration changed, or a replica configured otherwise answers), the service
/// says so without asking the model, and the turn goes again whole, once.
#[derive(Debug)]
pub struct Decision {
    client: DecisionServiceClient<Transport>,
    /// By profile: what its model reads, for requests without a script and with one.
    reads: Mutex<HashMap<String, [Option<pb::Reads>; 2]>>,
}

impl Decision {
    /// The port over `client`; it knows no model's reads yet.
    pub fn new(client: DecisionServiceClient<Transport>) -> Decision {
        Decision {
            client,
            reads: Mutex::new(HashMap::new()),
        }
    }

    fn known(&self, profile: &str, scripted: bool) -> Option<pb::Reads> {
        let reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        reads
            .get(profile)
            .and_then(|known| known[usize::from(scripted)])
    }

    fn learn(&self, profile: &str, scripted: bool, said: Option<pb::Reads>) {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let room = reads.len() < MAX_KNOWN_PROFILES;
        match reads.get_mut(profile) {
            Some(known) => known[usize::from(scripted)] = said,
            None if said.is_some() && room => {
                let mut known = [None; 2];
                known[usize::from(scripted)] = said;
                reads.insert(profile.to_owned(), known);
            }
            None => {}
        }
    }
}

#[async_trait]
impl DecisionPort for Decision {
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure> {
        let scripted = ask.script.is_some();
        let known = self.known(ask.profile, scripted);
        let request = calls::decide_request(&ask, known);
        let mut response = answer(self.client.clone().decide(request).await)?;
        if known.is_some()
            && let Some(pb::decide_response::Outcome::Resend(_)) = response.outcome
        {
            // A whole request leaves nothing out, so it is never answered so again.
            let whole = calls::decide_request(&ask, None);
            response = answer(self.client.clone().decide(whole).await)?;
        }
        // The lock is taken again only when what the model reads changed, which most
        // turns do not.
        if response.reads != known {
            self.learn(ask.profile, scripted, response.reads);
        }
        Ok(calls::decided(response))
    }
}

/// Policy over gRPC.
#[derive(Debug, Clone)]
pub struct Policy(pub PolicyServiceClient<Transport>);

#[async_trait]
impl PolicyPort for Policy {
    async fn authorize(&self, batch: Batch<'_>) -> Result<Authorization, Failure> {
        let request = calls::evaluate_request(&batch);
        answer(self.0.clone().evaluate(request).await).map(wire::authorization)
    }

    async fn accept(&self, profile: &str, claim: &Claim) -> Result<Acceptance, Failure> {
        let request = calls::validate_final_request(profile, claim);
        answer(self.0.clone().validate_final(request).await).map(wire::acceptance)
    }
}

/// The tool gateway, through its gRPC trait.
///
/// Stages of reads go as one `ExecuteStage` to a remote gateway, until it answers that
/// UNIMPLEMENTED: a gateway from before that RPC, met during a rolling upgrade that
/// updated the orchestrators first. From then on every call goes on its own. The stage
/// that met the answer loses nothing: its calls, unanswered, are sent again one by one.
#[derive(Debug)]
pub struct Tools<S> {
    service: Arc<S>,
    stages: AtomicBool,
}

impl<S> Tools<S> {
    /// The port over a gateway across the network: it tries stages first.
    pub fn remote(service: S) -> Tools<S> {
        Tools {
            service: Arc::new(service),
            stages: AtomicBool::new(true),
        }
    }

    /// The port over a gateway in the same process, where a future per call costs less
    /// than gathering a stage's answers into one: it sends no stages.
    pub fn in_process(service: S) -> Tools<S> {
        Tools {
            service: Arc::new(service),
            stages: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl<S: ToolGatewayService> ToolsPort for Tools<S> {
    async fn list(&self) -> Result<Vec<Tool>, Failure> {
        let request = Request::new(pb::ListToolsRequest::default());
        let listed = answer(self.service.list_tools(request).await)?;
        Ok(listed.tools.into_iter().map(calls::tool).collect())
    }

    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure> {
        let request = Request::new(calls::execute_request(&dispatch));
        calls::sent(answer(self.service.execute(request).await)?)
    }

    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure> {
        let request = Request::new(calls::stage_request(dispatches));
        let answered = self.service.execute_stage(request).await;
        if let Err(status) = &answered
            && status.code() == Code::Unimplemented
        {
            self.stages.store(false, Relaxed);
        }
        Ok(calls::stage_answers(dispatches, answer(answered)?))
    }

    async fn reconcile(&self, tool: &str, effect_key: &str) -> Result<Answer, Failure> {
        let request = Request::new(pb::ToolGatewayServiceReconcileRequest {
            tool: tool.to_owned(),
            effect_key: effect_key.to_owned(),
        });
        answer(self.service.reconcile(request).await).map(calls::answer)
    }

    async fn verify(
        &self,
        name: &str,
        claim: &Claim,
        within: Option<Duration>,
    ) -> Result<Option<Check>, Failure> {
        let request = Request::new(calls::verify_request(name, claim, within));
        answer(self.service.verify(request).await).map(calls::verdict)
    }

    fn max_stage(&self) -> usize {
        if self.stages.load(Relaxed) {
            MAX_STAGE_CALLS
        } else {
            1
        }
    }
}

/// A service's generated client as an implementation of the service's gRPC trait, each
/// method sent across the network, so that one adapter serves a remote service and one
/// in the same process.
#[derive(Debug, Clone)]
pub struct Remote<C>(pub C);

#[tonic::async_trait]
impl ToolGatewayService for Remote<ToolGatewayServiceClient<Transport>> {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        self.0.clone().list_tools(request).await
    }

    async fn register_executor(
        &self,
        request: Request<pb::RegisterExecutorRequest>,
    ) -> Result<Response<pb::RegisterExecutorResponse>, Status> {
        self.0.clone().register_executor(request).await
    }

    async fn deregister_executor(
        &self,
        request: Request<pb::DeregisterExecutorRequest>,
    ) -> Result<Response<pb::DeregisterExecutorResponse>, Status> {
        self.0.clone().deregister_executor(request).await
    }

    async fn execute(
        &self,
        request: Request<pb::ToolGatewayServiceExecuteRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceExecuteResponse>, Status> {
        self.0.clone().execute(request).await
    }

    async fn execute_stage(
        &self,
        request: Request<pb::ExecuteStageRequest>,
    ) -> Result<Response<pb::ExecuteStageResponse>, Status> {
        self.0.clone().execute_stage(request).await
    }

    async fn reconcile(
        &self,
        request: Request<pb::ToolGatewayServiceReconcileRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceReconcileResponse>, Status> {
        self.0.clone().reconcile(request).await
    }

    async fn verify(
        &self,
        request: Request<pb::ToolGatewayServiceVerifyRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceVerifyResponse>, Status> {
        self.0.clone().verify(request).await
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
