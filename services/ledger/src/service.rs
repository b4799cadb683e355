//! The gRPC face of the ledger: turns wire requests into store calls, rejecting
//! malformed enum values before anything is read or written.

use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use tonic::{Request, Response, Status};

use crate::error::LedgerError;
use crate::observe::Observed;
use crate::state::{EffectState, Outcome};
use crate::store::{Entry, LedgerStore, NewEffect};

/// `agentloop.v1.EffectLedgerService` over a [`LedgerStore`]. Serve it with
/// `agentloop_proto::server::effect_ledger(LedgerService::new(store))`.
#[derive(Debug, Clone)]
pub struct LedgerService {
    store: LedgerStore,
    observed: Observed,
}

impl LedgerService {
    /// Serves `store`, its metrics in the process's telemetry.
    pub fn new(store: LedgerStore) -> Self {
        Self {
            store,
            observed: Observed::new(&agentloop_server::process_telemetry()),
        }
    }

    /// Records the metrics into `telemetry` (one service's of several in a process).
    #[must_use]
    pub fn with_telemetry(mut self, telemetry: &agentloop_telemetry::Telemetry) -> Self {
        self.observed = Observed::new(telemetry);
        self
    }

    /// Counts the unresolved effects in the database into `agentloop_effects_unresolved`.
    ///
    /// # Errors
    ///
    /// When the database fails; the figures then stay as they were.
    pub async fn count_unresolved(&self) -> Result<(), LedgerError> {
        let counts = self.store.count_unresolved().await?;
        self.observed.unresolved(&counts);
        Ok(())
    }

    /// Counts the unresolved effects now and every `every`, until dropped. A failed
    /// count is logged and tried again at the next.
    pub async fn keep_counting(self, every: std::time::Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.count_unresolved().await {
                tracing::warn!(%error, "cannot count the unresolved effects");
            }
        }
    }
}

/// The ledger's operations in its own types: what the gRPC methods below do once they
/// have checked the request, and what a caller in the same process calls directly.
/// Every move is counted in the metrics.
impl LedgerService {
    /// The store, for reads (`get`, `list_unresolved`, `list_by_invocation`).
    pub fn store(&self) -> &LedgerStore {
        &self.store
    }

    /// Records `new` before it is dispatched, or finds it by its effect key: the entry,
    /// and whether this call created it.
    ///
    /// # Errors
    ///
    /// What the store refuses, or its failure.
    pub async fn prepare_effect(&self, new: &NewEffect) -> Result<(Entry, bool), LedgerError> {
        let (entry, created) = self.store.prepare(new).await?;
        if created {
            self.observed.moved(entry.state);
        }
        Ok((entry, created))
    }

    /// Records that the effect is about to be sent, if it is in `expected`.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when it is not, or the store fails.
    pub async fn dispatch_effect(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Entry, LedgerError> {
        let entry = self.store.mark_dispatched(effect_key, expected).await?;
        self.observed.moved(entry.state);
        Ok(entry)
    }

    /// Records `outcome`, if the entry is in `expected`.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when it is not, or the store fails.
    pub async fn record_effect(
        &self,
        effect_key: &str,
        expected: EffectState,
        outcome: Outcome,
        receipt: &str,
        detail: &str,
    ) -> Result<Entry, LedgerError> {
        let entry = self
            .store
            .record(effect_key, expected, outcome, receipt, detail)
            .await?;
        self.observed.moved(entry.state);
        Ok(entry)
    }
}

/// A required state field: a known, specified enum value. The guard is required even
/// though the proto calls UNSPECIFIED "no expectation": the guard is what stops two
/// workers from both moving an effect, so the ledger does not offer an unguarded move.
fn state_field(field: &'static str, raw: i32) -> Result<EffectState, LedgerError> {
    let wire = pb::EffectState::try_from(raw)
        .map_err(|_| LedgerError::invalid(field, format!("unknown EffectState value {raw}")))?;
    EffectState::from_proto(wire)
        .ok_or_else(|| LedgerError::invalid(field, "must be set (not EFFECT_STATE_UNSPECIFIED)"))
}

#[tonic::async_trait]
impl EffectLedgerService for LedgerService {
    async fn prepare(
        &self,
        request: Request<pb::PrepareRequest>,
    ) -> Result<Response<pb::PrepareResponse>, Status> {
        let request = request.into_inner();
        let new = NewEffect {
            invocation_id: request.invocation_id,
            call_id: request.call_id,
            effect_key: request.effect_key,
            tool: request.tool,
        };
        let (entry, created) = self.prepare_effect(&new).await?;
        Ok(Response::new(pb::PrepareResponse {
            entry: Some(entry.to_proto()),
            created,
        }))
    }

    async fn mark_dispatched(
        &self,
        request: Request<pb::MarkDispatchedRequest>,
    ) -> Result<Response<pb::MarkDispatchedResponse>, Status> {
        let request = request.into_inner();
        let expected = state_field("expected_state", request.expected_state)?;
        let entry = self.dispatch_effect(&request.effect_key, expected).await?;
        Ok(Response::new(pb::MarkDispatchedResponse {
            entry: Some(entry.to_proto()),
        }))
    }

    async fn record(
        &self,
        request: Request<pb::RecordRequest>,
    ) -> Result<Response<pb::RecordResponse>, Status> {
        let request = request.into_inner();
        let expected = state_field("expected_state", request.expected_state)?;
        let state = state_field("state", request.state)?;
        let outcome = Outcome::from_state(state).ok_or_else(|| {
            LedgerError::invalid(
                "state",
                format!(
                    "{state} is not an outcome (COMMITTED, REJECTED, OUTCOME_UNKNOWN or \
                     RECONCILIATION_REQUIRED)"
                ),
            )
        })?;
        let entry = self
            .record_effect(
                &request.effect_key,
                expected,
                outcome,
                &request.receipt,
                &request.detail,
            )
            .await?;
        Ok(Response::new(pb::RecordResponse {
            entry: Some(entry.to_proto()),
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let entry = self.store.get(&request.into_inner().effect_key).await?;
        Ok(Response::new(pb::GetResponse {
            entry: Some(entry.to_proto()),
        }))
    }

    async fn list_unresolved(
        &self,
        request: Request<pb::ListUnresolvedRequest>,
    ) -> Result<Response<pb::ListUnresolvedResponse>, Status> {
        let request = request.into_inner();
        let invocation = Some(request.invocation_id.as_str()).filter(|id| !id.is_empty());
        let token = Some(request.page_token.as_str()).filter(|t| !t.is_empty());
        let page = self
            .store
            .list_unresolved(invocation, request.page_size, token)
            .await?;
        Ok(Response::new(pb::ListUnresolvedResponse {
            entries: page.entries.iter().map(|e| e.to_proto()).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
        }))
    }

    async fn list_by_invocation(
        &self,
        request: Request<pb::ListByInvocationRequest>,
    ) -> Result<Response<pb::ListByInvocationResponse>, Status> {
        let request = request.into_inner();
        // An empty invocation_id is passed on, not dropped as in ListUnresolved: here it
        // is required, and the store refuses it as INVALID_ARGUMENT.
        let token = Some(request.page_token.as_str()).filter(|t| !t.is_empty());
        let page = self
            .store
            .list_by_invocation(&request.invocation_id, request.page_size, token)
            .await?;
        Ok(Response::new(pb::ListByInvocationResponse {
            entries: page.entries.iter().map(|e| e.to_proto()).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
        }))
    }
}
