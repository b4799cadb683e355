//! The runtime's ports over services of the same process: the adapters of the embedded
//! wiring, kept here with the wiring so that no service depends on another.
//!
//! The decision service and the ledger are called through their own operations: an
//! offline run's turn reads nothing but its script and its number, and a write's entry
//! is the ledger's. Policy and the tool gateway are called through their gRPC traits by
//! the orchestrator's own adapters (`agentloop_orchestrator::grpc::{Policy, Tools}`),
//! with no network between.

use agentloop_decision::{DecisionServer, ModelError};
use agentloop_effects::EffectState;
use agentloop_effects::settle::Recorded;
use agentloop_ledger::{Entry, LedgerError, LedgerService, Page};
use agentloop_orchestrator::calls;
use agentloop_proto::v1 as pb;
use agentloop_runtime::ports::{
    Ask, Decided, DecisionPort, Effect, EffectPage, Failure, LedgerPort, NewEffect,
};
use async_trait::async_trait;
use tonic::Status;
use uuid::Uuid;

/// The decision service in this process, called through its core.
#[derive(Debug, Clone)]
pub struct InProcessDecision(pub DecisionServer);

#[async_trait]
impl DecisionPort for InProcessDecision {
    async fn decide(&self, ask: Ask<'_>) -> Result<Decided, Failure> {
        let replied = match ask.script {
            Some(script) => {
                let id = ask.invocation.to_string();
                self.0.decide_scripted(script.model(), &id, ask.turn).await
            }
            None => {
                // Only what the model reads becomes a message.
                let reads = self.0.reads(ask.profile);
                let window = &ask.history[ask.history.len().saturating_sub(reads.history)..];
                let tools = if reads.tools { ask.tools } else { &[] };
                let request = calls::decide_request(&Ask {
                    history: window,
                    tools,
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
