//! The runtime's ports over services of the same process: the adapters of the embedded
//! wiring, kept here with the wiring so that no service depends on another.
//!
//! The services are called through their own operations: an offline run's turn reads
//! nothing but its script and its number, policy judges the engine's calls and a final
//! answer's claim, the tool gateway sends the calls, and a write's entry is the
//! ledger's. What happens once per invocation or less (listing tools, a verifier's
//! verdict, a reconcile) goes through the gateway's gRPC trait by the orchestrator's own
//! adapter, with no network between.

use std::time::Duration;

use agentloop_decision::{DecisionServer, ModelError, Question};
use agentloop_effects::EffectState;
use agentloop_effects::settle::{Answer, Recorded};
use agentloop_engine::{Authorization, Check};
use agentloop_ledger::{Entry, LedgerError, LedgerService, Page};
use agentloop_orchestrator::calls;
use agentloop_orchestrator::grpc::Tools;
use agentloop_policy::{PolicyServer, Proposal};
use agentloop_runtime::ports::{
    Acceptance, Ask, Batch, Claim, Decided, DecisionPort, Dispatch, Effect, EffectPage, Failure,
    LedgerPort, NewEffect, PolicyPort, Sent, Tool, ToolsPort,
};
use agentloop_tools::Gateway;
use async_trait::async_trait;
use tonic::Status;
use uuid::Uuid;

/// The decision service in this process, called through its core.
#[derive(Debug, Clone)]
pub struct InProcessDecision(pub DecisionServer);

#[async_trait]
impl DecisionPort for InProcessDecision {
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure> {
        let mut id = Uuid::encode_buffer();
        let invocation_id = &*ask.invocation.hyphenated().encode_lower(&mut id);
        let replied = match ask.script {
            Some(script) => {
                let model = script.model();
                self.0.decide_scripted(model, invocation_id, ask.turn).await
            }
            None => {
                // Only what the model reads becomes a message.
                let reads = self.0.reads(ask.profile);
                let window = calls::window(ask.history, reads.history);
                let history = calls::history(invocation_id, window);
                let tools = calls::descriptors(ask.tools, reads.tools);
                let question = Question {
                    invocation_id,
                    turn: ask.turn,
                    goal: ask.goal,
                    summary: "",
                    context_from_seq: window.first().map_or(0, |stored| stored.event.seq),
                    history: &history,
                };
                self.0.decide_for(ask.profile, &question, &tools).await
            }
        };
        replied
            .map(|reply| Decided {
                decision: reply.proposal.proposed(),
                usage: reply.usage,
            })
            .map_err(|error: ModelError| calls::failure(&Status::from(error)))
    }
}

/// Policy in this process, judging the engine's calls.
#[derive(Debug, Clone)]
pub struct InProcessPolicy(pub PolicyServer);

#[async_trait]
impl PolicyPort for InProcessPolicy {
    async fn authorize(&self, batch: Batch<'_>) -> Result<Authorization, Failure> {
        let mut id = Uuid::encode_buffer();
        let proposal = Proposal {
            invocation_id: batch.invocation.hyphenated().encode_lower(&mut id),
            turn: batch.turn,
            profile: batch.profile,
            principal: agentloop_authz::Principal {
                actor: batch.actor,
                tenant: batch.tenant,
                roles: batch.roles,
            },
            calls: batch.calls,
            approved: batch.approved,
        };
        let judged = self.0.judge(&proposal).await;
        judged
            .map(agentloop_engine::Judgement::authorization)
            .map_err(|error| calls::failure(&Status::from(error)))
    }

    async fn accept(&self, profile: &str, claim: &Claim) -> Result<Acceptance, Failure> {
        let accepted = self.0.accept(profile, claim);
        accepted.map_err(|error| calls::failure(&Status::from(error)))
    }
}

/// The tool gateway in this process, sending the engine's calls.
#[derive(Debug)]
pub struct InProcessTools {
    gateway: Gateway,
    /// The rest, through the gateway's gRPC trait.
    api: Tools<Gateway>,
}

impl InProcessTools {
    /// The port over `gateway`.
    pub fn new(gateway: Gateway) -> InProcessTools {
        InProcessTools {
            api: Tools::in_process(gateway.clone()),
            gateway,
        }
    }
}

#[async_trait]
impl ToolsPort for InProcessTools {
    async fn list(&self) -> Result<Vec<Tool>, Failure> {
        self.api.list().await
    }

    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure> {
        let mut id = Uuid::encode_buffer();
        let answer = dispatch.answer.map(agentloop_wire::input_answer);
        let sent = self.gateway.dispatch(agentloop_tools::Dispatch {
            invocation_id: dispatch.invocation.hyphenated().encode_lower(&mut id),
            call: dispatch.call,
            effect_key: dispatch.effect_key,
            attempt: dispatch.attempt,
            timeout: Some(Duration::from_millis(dispatch.timeout_ms)),
            planned: dispatch.digest,
            answer: answer.as_ref(),
        });
        match sent.await {
            Ok(answered) => Ok(Sent {
                outcome: answered.outcome,
                receipt: answered.receipt,
            }),
            Err(error) => Err(calls::failure(&Status::from(error))),
        }
    }

    /// Never asked for ([`ToolsPort::max_stage`] is 1); answered as the gateway answers
    /// a stage, writes refused.
    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure> {
        self.api.execute_stage(dispatches).await
    }

    async fn reconcile(&self, tool: &str, effect_key: &str) -> Result<Answer, Failure> {
        self.api.reconcile(tool, effect_key).await
    }

    async fn verify(
        &self,
        name: &str,
        claim: &Claim,
        within: Option<Duration>,
    ) -> Result<Option<Check>, Failure> {
        self.api.verify(name, claim, within).await
    }

    fn max_stage(&self) -> usize {
        self.api.max_stage()
    }
}

/// The effect ledger in this process, called through its own operations.
#[derive(Debug, Clone)]
pub struct InProcessLedger(pub LedgerService);

/// A ledger refusal as the runtime reads it: the status the ledger's gRPC face answers.
fn refused(error: LedgerError) -> Failure {
    calls::failure(&Status::from(error))
}

/// An entry of the ledger's store as the runtime's.
fn effect(entry: Entry) -> Effect {
    Effect {
        invocation_id: entry.invocation_id,
        call_id: entry.call_id,
        effect_key: entry.effect_key,
        attempt: entry.attempt,
        tool: entry.tool,
        state: Some(entry.state),
        receipt: entry.receipt,
        detail: entry.detail,
        created_at: entry.created_at,
        updated_at: entry.updated_at,
    }
}

fn page(page: Page) -> EffectPage {
    EffectPage {
        entries: page.entries.into_iter().map(effect).collect(),
        next_page_token: page.next_page_token.unwrap_or_default(),
    }
}

#[async_trait]
impl LedgerPort for InProcessLedger {
    async fn prepare(&self, new: NewEffect<'_>) -> Result<Effect, Failure> {
        let new = agentloop_ledger::NewEffect {
            invocation_id: new.invocation.to_string(),
            call_id: new.call_id.to_owned(),
            effect_key: new.effect_key.to_owned(),
            tool: new.tool.to_owned(),
        };
        let (entry, _created) = self.0.prepare_effect(&new).await.map_err(refused)?;
        Ok(effect(entry))
    }

    async fn mark_dispatched(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Effect, Failure> {
        let entry = self.0.dispatch_effect(effect_key, expected).await;
        entry.map(effect).map_err(refused)
    }

    async fn record(
        &self,
        effect_key: &str,
        expected: EffectState,
        recorded: &Recorded,
    ) -> Result<Effect, Failure> {
        let entry = self
            .0
            .record_effect(
                effect_key,
                expected,
                recorded.outcome,
                &recorded.receipt,
                &recorded.detail,
            )
            .await;
        entry.map(effect).map_err(refused)
    }

    async fn get(&self, effect_key: &str) -> Result<Effect, Failure> {
        let entry = self.0.store().get(effect_key).await;
        entry.map(effect).map_err(refused)
    }

    async fn list_unresolved(
        &self,
        invocation: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let invocation = Some(invocation).filter(|id| !id.is_empty());
        let token = Some(page_token).filter(|token| !token.is_empty());
        let listed = self.0.store().list_unresolved(invocation, page_size, token);
        listed.await.map(page).map_err(refused)
    }

    async fn list_by_invocation(
        &self,
        invocation: Uuid,
        page_size: u32,
        page_token: &str,
    ) -> Result<EffectPage, Failure> {
        let token = Some(page_token).filter(|token| !token.is_empty());
        let invocation = invocation.to_string();
        let listed = self
            .0
            .store()
            .list_by_invocation(&invocation, page_size, token);
        listed.await.map(page).map_err(refused)
    }
}
