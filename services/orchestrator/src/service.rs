//! The public gRPC API: who calls, request validation, idempotent start, watch, cancel.
//!
//! Identity is checked here and nowhere else in the orchestrator: with `auth` on, every
//! call's bearer token is verified before anything is read, a start takes its actor
//! and tenant from the token, and an invocation of another tenant is NOT_FOUND, the
//! answer for an ID that does not exist, so that nobody learns which IDs exist; only a
//! token holding `auth.all_tenants_role` reads across tenants. The runners, the store
//! and the services behind the ports trust what was admitted here.

use std::pin::Pin;

use agentloop_auth::{Authenticator, Identity};
use agentloop_effects::EffectState;
use agentloop_effects::entry::Outcome;
use agentloop_effects::settle::Recorded;
use agentloop_engine::{
    EventBody, Fingerprint, InputAction, MicroUsd, Reply, TerminalReason, UnixMillis,
};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
use agentloop_runtime::ports::FailureKind;
use agentloop_runtime::{InvocationSpec, Runtime, RuntimeError, Start};
use agentloop_store::{InvocationRecord, InvocationState, ListRequest, MAX_PAGE_SIZE, StoreError};
use futures::{Stream, StreamExt};
use prost::Message;
use sha2::{Digest, Sha256};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use agentloop_wire as wire;

use crate::{OrchestratorError, calls, input, stats};

/// Default page size of `ListInvocations`.
const DEFAULT_PAGE: u32 = 50;
/// Largest cancellation reason, in bytes.
const MAX_REASON_BYTES: usize = 1024;
/// Most entries one `ListUnresolvedEffects` or `ListEffects` page returns.
const MAX_EFFECTS_PAGE: u32 = 500;

/// The public API: the runtime as its callers reach it, each call authenticated when
/// `auth` is on. Serve it with [`crate::service`]; callers in the same process
/// (`agentloop bench`) call its methods directly.
#[derive(Debug, Clone)]
pub struct Api {
    runtime: Runtime,
    auth: Option<Authenticator>,
}

impl Api {
    /// The API of `runtime`, each call authenticated by `auth` (`None`: nobody is, and
    /// every caller sees every tenant).
    pub fn new(runtime: Runtime, auth: Option<Authenticator>) -> Api {
        Api { runtime, auth }
    }
}

/// Who calls, as the API established it.
enum Caller {
    /// Authentication is off (`auth.mode = "none"`): a local operator, who sees every
    /// tenant, and whose starts name their own actor and tenant.
    Anyone,
    /// A verified token's identity.
    Verified(Identity),
    /// A verified token holding `auth.all_tenants_role`: it reads and answers every
    /// tenant's invocations, and what it starts is its own tenant's.
    AllTenants(Identity),
}

impl Caller {
    /// The tenant whose invocations the caller sees; `None` for all.
    fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Anyone | Caller::AllTenants(_) => None,
            Caller::Verified(identity) => Some(&identity.tenant),
        }
    }

    /// The verified token's identity; `None` with authentication off.
    fn identity(&self) -> Option<&Identity> {
        match self {
            Caller::Anyone => None,
            Caller::Verified(identity) | Caller::AllTenants(identity) => Some(identity),
        }
    }

    fn sees(&self, record: &InvocationRecord) -> bool {
        self.tenant().is_none_or(|tenant| tenant == record.tenant)
    }
}

impl Api {
    /// The caller of `request`; UNAUTHENTICATED when `auth` is on and its token is
    /// missing or does not verify.
    async fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        match &self.auth {
            None => Ok(Caller::Anyone),
            Some(auth) => {
                let identity = auth.authenticate(request.metadata()).await?;
                match auth.all_tenants_role() {
                    Some(role) if identity.has_role(role) => Ok(Caller::AllTenants(identity)),
                    Some(_) | None => Ok(Caller::Verified(identity)),
                }
            }
        }
    }

    /// An invocation the caller may see; another tenant's is NOT_FOUND, worded as for an
    /// ID that does not exist.
    async fn owned(
        &self,
        caller: &Caller,
        invocation_id: &str,
    ) -> Result<InvocationRecord, OrchestratorError> {
        let record = self.record(invocation_id).await?;
        if !caller.sees(&record) {
            return Err(StoreError::NotFound(record.invocation_id).into());
        }
        Ok(record)
    }

    /// PERMISSION_DENIED unless a verified caller holds the configured role `role` picks
    /// (`doing` says what it is needed for); a local operator (authentication off) holds
    /// every role.
    fn require_role(
        &self,
        caller: &Caller,
        role: fn(&Authenticator) -> &str,
        doing: &str,
    ) -> Result<(), OrchestratorError> {
        if let (Some(identity), Some(auth)) = (caller.identity(), &self.auth)
            && !identity.has_role(role(auth))
        {
            return Err(RuntimeError::PermissionDenied(format!(
                "{doing} needs the {:?} role",
                role(auth)
            ))
            .into());
        }
        Ok(())
    }

    /// The ID of an invocation the caller may act on. Only a tenant-scoped caller needs
    /// the record read; for the others the store answers NOT_FOUND itself, in the write.
    async fn owned_id(
        &self,
        caller: &Caller,
        invocation_id: &str,
    ) -> Result<Uuid, OrchestratorError> {
        match caller.identity() {
            None => parse_id(invocation_id),
            Some(_) => Ok(self.owned(caller, invocation_id).await?.invocation_id),
        }
    }
}

/// Most roles a start may name (with authentication off; a token's are bounded by
/// `agentloop-auth`).
const MAX_ROLES: usize = 64;

/// The actor, tenant and roles a start runs for: the verified caller's, or, with `auth`
/// off, the request's own (checked by the same rule as a token's).
fn principal(
    caller: &Caller,
    request: &pb::StartInvocationRequest,
) -> Result<(String, String, Vec<String>), OrchestratorError> {
    let roles = match caller.identity() {
        Some(identity) if request.roles.is_empty() || request.roles == identity.roles => {
            identity.roles.clone()
        }
        Some(_) => {
            return Err(RuntimeError::PermissionDenied(
                "roles name other roles than the caller's token grants".into(),
            )
            .into());
        }
        None if request.roles.len() > MAX_ROLES => {
            return Err(invalid(format!("at most {MAX_ROLES} roles may be named")));
        }
        None => {
            if !request
                .roles
                .iter()
                .all(|role| agentloop_auth::is_valid_identity(role))
            {
                return Err(invalid(
                    "a role must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -",
                ));
            }
            request.roles.clone()
        }
    };
    // What a caller starts is its own tenant's, whatever it may read.
    let tenant = named(
        "tenant",
        &request.tenant,
        caller.identity().map(|identity| identity.tenant.as_str()),
        "tenant names another tenant than the caller's",
    );
    let actor = acting_actor(caller, &request.actor);
    // Which refusal a request wrong in both says: another tenant for a verified caller,
    // a malformed actor otherwise.
    match caller.identity() {
        Some(_) => {
            let tenant = tenant?;
            Ok((actor?, tenant, roles))
        }
        None => {
            let actor = actor?;
            Ok((actor, tenant?, roles))
        }
    }
}

/// The actor a request acts as: the verified caller's (a body naming another actor is
/// PERMISSION_DENIED), or, with `auth` off, the one it names (empty for none).
fn acting_actor(caller: &Caller, actor: &str) -> Result<String, OrchestratorError> {
    named(
        "actor",
        actor,
        caller.identity().map(|identity| identity.actor.as_str()),
        "actor names another actor than the caller",
    )
}

/// The identity a request's `field` names: `verified`, which the body may repeat but
/// not change (`other` says so), or, without one, the named value, checked by the rule
/// a token's identity follows.
fn named(
    field: &str,
    value: &str,
    verified: Option<&str>,
    other: &str,
) -> Result<String, OrchestratorError> {
    match verified {
        Some(verified) if value.is_empty() || value == verified => Ok(verified.to_owned()),
        Some(_) => Err(RuntimeError::PermissionDenied(other.to_owned()).into()),
        None if value.is_empty() || agentloop_auth::is_valid_identity(value) => {
            Ok(value.to_owned())
        }
        None => Err(invalid(format!(
            "{field} must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -"
        ))),
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchInvocationResponse, Status>> + Send>>;

/// The tenant a list or an aggregate reads: the one the request names, or all with
/// authentication off; a verified caller reads its own, and naming another is
/// PERMISSION_DENIED.
fn scope(caller: &Caller, requested: &str) -> Result<Option<String>, OrchestratorError> {
    let tenant = named(
        "tenant",
        requested,
        caller.tenant(),
        "tenant names another tenant than the caller's",
    )?;
    Ok(Some(tenant).filter(|tenant| !tenant.is_empty()))
}

/// The creation window `[after, before)` a request names; either end may be open.
fn window(
    after: Option<prost_types::Timestamp>,
    before: Option<prost_types::Timestamp>,
) -> Result<(Option<UnixMillis>, Option<UnixMillis>), OrchestratorError> {
    let instant = |name: &str, at: Option<prost_types::Timestamp>| {
        at.map(|at| {
            wire::unix_millis(&at)
                .ok_or_else(|| invalid(format!("{name} is not an instant after 1970")))
        })
        .transpose()
    };
    let from = instant("created_after", after)?;
    let before = instant("created_before", before)?;
    if let (Some(from), Some(before)) = (from, before)
        && from >= before
    {
        return Err(invalid("created_after must be before created_before"));
    }
    Ok((from, before))
}

fn invalid(message: impl Into<String>) -> OrchestratorError {
    RuntimeError::InvalidArgument(message.into()).into()
}

fn parse_id(text: &str) -> Result<Uuid, OrchestratorError> {
    if text.is_empty() {
        return Err(invalid("invocation_id is required"));
    }
    Uuid::parse_str(text).map_err(|_| invalid(format!("invocation_id {text:?} is not a UUID")))
}

fn bounded(field: &str, text: &str, limit: usize) -> Result<(), OrchestratorError> {
    if text.len() > limit {
        return Err(invalid(format!(
            "{field} is {} bytes; at most {limit} are allowed",
            text.len()
        )));
    }
    Ok(())
}

fn millis(duration: &prost_types::Duration, field: &str) -> Result<u64, OrchestratorError> {
    wire::millis(duration)
        .ok_or_else(|| invalid(format!("{field} must be a non-negative duration")))
}

impl Api {
    /// Starts `request`, whose actor and tenant the API has settled.
    async fn start(
        &self,
        request: pb::StartInvocationRequest,
    ) -> Result<pb::StartInvocationResponse, OrchestratorError> {
        let config = self.runtime.config();
        let bounds = config.bounds;
        if request.goal.trim().is_empty() {
            return Err(invalid("goal is required"));
        }
        bounded("goal", &request.goal, bounds.max_goal_bytes)?;
        bounded(
            "idempotency_key",
            &request.idempotency_key,
            bounds.max_key_bytes,
        )?;
        bounded("actor", &request.actor, bounds.max_key_bytes)?;
        bounded("tenant", &request.tenant, bounds.max_key_bytes)?;
        bounded(
            "scripted_model_json",
            &request.scripted_model_json,
            bounds.max_script_bytes,
        )?;
        let profile = match request.profile.as_str() {
            "" | "default" => "default".to_owned(),
            other => {
                return Err(invalid(format!(
                    "unknown profile {other:?}; this orchestrator has \"default\""
                )));
            }
        };
        let script = if request.scripted_model_json.is_empty() {
            None
        } else {
            agentloop_script::ScriptedModel::parse(&request.scripted_model_json)
                .map_err(|e| invalid(format!("scripted_model_json: {e}")))?;
            Some(request.scripted_model_json.clone())
        };
        let now = self.runtime.now();
        let limits = limits(&request, config, now)?;
        let digest = hex::encode(Sha256::digest(request.encode_to_vec()));
        let started = self
            .runtime
            .start(Start {
                goal: request.goal,
                profile,
                actor: request.actor,
                tenant: request.tenant,
                roles: request.roles,
                limits,
                allowed_tools: request.allowed_tools,
                script,
                idempotency_key: Some(request.idempotency_key).filter(|key| !key.is_empty()),
                request_digest: digest,
                created_at: now,
            })
            .await?;
        Ok(pb::StartInvocationResponse {
            invocation: Some(self.invocation(&started.record).await?),
            created: started.created,
        })
    }

    async fn record(&self, invocation_id: &str) -> Result<InvocationRecord, OrchestratorError> {
        let id = parse_id(invocation_id)?;
        Ok(self.runtime.store().get(id).await?)
    }

    /// The wire form of a stored invocation, with live progress if it runs here, and,
    /// while it waits for an approval, the exact calls that would run (read from the
    /// turn committed with its waiting end).
    async fn invocation(
        &self,
        record: &InvocationRecord,
    ) -> Result<pb::Invocation, OrchestratorError> {
        let spec = InvocationSpec::of(record)?;
        let mut wire = invocation(record, &spec);
        if record.state == InvocationState::Running
            && let Some((turn, in_flight)) = self.runtime.progress(record.invocation_id)
        {
            wire.current_turn = turn;
            wire.calls_in_flight = in_flight;
        }
        if let Some(pending) = &mut wire.pending_approval {
            pending.calls = self.pending_calls(record, &spec).await?;
        }
        Ok(wire)
    }

    /// The calls of the turn an invocation waits after, with canonical arguments: the
    /// form the proposal's digest binds.
    async fn pending_calls(
        &self,
        record: &InvocationRecord,
        spec: &InvocationSpec,
    ) -> Result<Vec<pb::ToolCall>, OrchestratorError> {
        let id = record.invocation_id;
        let from = record.version.saturating_sub(1);
        let stored = self.runtime.store().events(id, from, 1).await?;
        let Some(EventBody::Turn(turn)) = stored.first().map(|stored| &stored.event.body) else {
            return Err(StoreError::Corrupt(format!(
                "invocation {id}: no turn before its waiting end"
            ))
            .into());
        };
        let batch = turn
            .batch(&spec.tools, &spec.limits.bounds)
            .map_err(|why| StoreError::Corrupt(format!("invocation {id}: pending calls: {why}")))?;
        batch
            .calls
            .iter()
            .map(|call| {
                // Valid JSON: the batch was validated.
                let arguments: serde_json::Value = serde_json::from_str(&call.arguments_json)
                    .map_err(|e| StoreError::Corrupt(format!("invocation {id}: arguments: {e}")))?;
                Ok(pb::ToolCall {
                    arguments_json: agentloop_engine::canonical_json(&arguments),
                    ..wire::tool_call(call)
                })
            })
            .collect()
    }
}

/// The budgets `request` runs under: the configured ones, with the overrides it asks
/// for within the bounds; its deadline placed in time from `now`.
fn limits(
    request: &pb::StartInvocationRequest,
    config: &agentloop_runtime::RuntimeConfig,
    now: agentloop_engine::UnixMillis,
) -> Result<agentloop_engine::Limits, OrchestratorError> {
    let mut limits = config.limits.limits(now);
    let bounds = config.bounds;
    if let Some(overrides) = &request.budget_overrides {
        if let Some(max_steps) = overrides.max_steps {
            if max_steps == 0 || max_steps > bounds.max_steps_cap {
                return Err(invalid(format!(
                    "max_steps must be within 1..={}",
                    bounds.max_steps_cap
                )));
            }
            limits.max_steps = max_steps;
        }
        if let Some(max_tool_calls) = overrides.max_tool_calls {
            if max_tool_calls > bounds.max_tool_calls_cap {
                return Err(invalid(format!(
                    "max_tool_calls must be at most {}",
                    bounds.max_tool_calls_cap
                )));
            }
            limits.max_tool_calls = max_tool_calls;
        }
        if let Some(max_tokens) = overrides.max_tokens {
            limits.max_tokens = Some(max_tokens);
        }
        if let Some(max_cost) = overrides.max_cost_micro_usd {
            limits.max_cost = Some(MicroUsd(max_cost));
        }
        if let Some(repeats) = overrides.max_repeated_plan {
            limits.max_repeated_plan = std::num::NonZeroU32::new(repeats);
        }
        if let Some(deadline) = &overrides.deadline {
            let ms = millis(deadline, "deadline")?;
            if ms == 0 || ms > bounds.max_deadline_ms {
                return Err(invalid(format!(
                    "deadline must be within 1 ms..={} ms",
                    bounds.max_deadline_ms
                )));
            }
            limits.deadline = Some(now.saturating_add(ms));
        }
        if let Some(max_wait) = &overrides.max_wait {
            let ms = millis(max_wait, "max_wait")?;
            if ms == 0 || ms > bounds.max_wait_cap_ms {
                return Err(invalid(format!(
                    "max_wait must be within 1 ms..={} ms",
                    bounds.max_wait_cap_ms
                )));
            }
            limits.max_wait_ms = ms;
        }
    }
    Ok(limits)
}

/// A stored invocation -> its wire form (durable state only, and no pending calls).
fn invocation(record: &InvocationRecord, spec: &InvocationSpec) -> pb::Invocation {
    let id = record.invocation_id;
    let end = record.end.as_ref();
    let reason = end.map(|end| end.reason);
    // What it waits for, while it waits.
    let waiting = end.filter(|_| record.state == InvocationState::Waiting);
    let wait = waiting.and_then(|end| end.wait);
    pb::Invocation {
        invocation_id: id.to_string(),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        goal: spec.goal.clone(),
        profile: spec.profile.clone(),
        actor: spec.actor.clone(),
        tenant: spec.tenant.clone(),
        state: match record.state {
            InvocationState::Running => pb::InvocationState::Running,
            InvocationState::Waiting => pb::InvocationState::Waiting,
            InvocationState::Ended => pb::InvocationState::Ended,
        }
        .into(),
        terminal_reason: reason
            .map_or(pb::TerminalReason::Unspecified, wire::terminal_reason)
            .into(),
        terminal_detail: end.map(|end| end.detail.clone()).unwrap_or_default(),
        answer: end.and_then(|end| end.answer.clone()),
        budget: Some(wire::budget(&spec.limits, record.created_at)),
        usage: Some(wire::budget_usage(&record.totals)),
        pending_approval: waiting
            .filter(|end| end.reason == TerminalReason::ApprovalRequired)
            .map(|end| pb::PendingApproval {
                proposal_digest: end.proposal.map(|p| p.to_string()).unwrap_or_default(),
                summary: end.detail.clone(),
                calls: Vec::new(),
            }),
        pending_question: waiting
            .filter(|end| end.reason == TerminalReason::ClarificationRequired)
            .map(|end| end.detail.clone()),
        pending_input: waiting
            .and_then(|end| end.input.as_deref())
            .map(wire::pending_input),
        created_at: Some(wire::timestamp(record.created_at)),
        updated_at: Some(wire::timestamp(record.updated_at)),
        last_seq: record.version,
        current_turn: 0,
        calls_in_flight: 0,
        waiting_since: wait.map(|wait| wire::timestamp(wait.since)),
        wait_until: wait.map(|wait| wire::timestamp(wait.until)),
        accepted_by: end
            .map(|end| wire::checks(&end.accepted_by))
            .unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl OrchestratorService for Api {
    async fn start_invocation(
        &self,
        request: Request<pb::StartInvocationRequest>,
    ) -> Result<Response<pb::StartInvocationResponse>, Status> {
        let caller = self.caller(&request).await?;
        let mut request = request.into_inner();
        // The request as the caller's identity makes it, so that naming one's own tenant
        // or leaving it out is the same request for its idempotency key.
        (request.actor, request.tenant, request.roles) = principal(&caller, &request)?;
        let started = self.start(request).await?;
        Ok(Response::new(started))
    }

    async fn get_invocation(
        &self,
        request: Request<pb::GetInvocationRequest>,
    ) -> Result<Response<pb::GetInvocationResponse>, Status> {
        let caller = self.caller(&request).await?;
        let record = self
            .owned(&caller, &request.into_inner().invocation_id)
            .await?;
        Ok(Response::new(pb::GetInvocationResponse {
            invocation: Some(self.invocation(&record).await?),
        }))
    }

    async fn list_invocations(
        &self,
        request: Request<pb::ListInvocationsRequest>,
    ) -> Result<Response<pb::ListInvocationsResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let limit = match request.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let before = match request.page_token.as_str() {
            "" => None,
            token => Some(
                Uuid::parse_str(token)
                    .map_err(|_| invalid("page_token is malformed"))
                    .map_err(Status::from)?,
            ),
        };
        let state = match pb::InvocationState::try_from(request.state) {
            Ok(pb::InvocationState::Unspecified) => None,
            Ok(pb::InvocationState::Running) => Some(InvocationState::Running),
            Ok(pb::InvocationState::Ended) => Some(InvocationState::Ended),
            Ok(pb::InvocationState::Waiting) => Some(InvocationState::Waiting),
            // Invocations start running as they are accepted: none is ever pending here.
            Ok(pb::InvocationState::Pending) => {
                return Ok(Response::new(pb::ListInvocationsResponse::default()));
            }
            Err(_) => {
                return Err(
                    invalid(format!("state {} is not an InvocationState", request.state)).into(),
                );
            }
        };
        let reason = match pb::TerminalReason::try_from(request.terminal_reason) {
            Ok(pb::TerminalReason::Unspecified) => None,
            Ok(reason) => wire::terminal_reason_from(reason),
            Err(_) => None,
        };
        if request.terminal_reason != 0 && reason.is_none() {
            return Err(invalid(format!(
                "terminal_reason {} is not a TerminalReason",
                request.terminal_reason
            ))
            .into());
        }
        let tenant = scope(&caller, &request.tenant)?;
        let (created_from, created_before) = window(request.created_after, request.created_before)?;
        let records = self
            .runtime
            .store()
            .list(ListRequest {
                limit,
                before,
                state,
                tenant,
                reason,
                created_from,
                created_before,
            })
            .await
            .map_err(OrchestratorError::from)?;
        let next_page_token = match records.last() {
            Some(last) if records.len() == limit as usize => last.invocation_id.to_string(),
            Some(_) | None => String::new(),
        };
        let mut invocations = Vec::with_capacity(records.len());
        for record in &records {
            invocations.push(self.invocation(record).await?);
        }
        Ok(Response::new(pb::ListInvocationsResponse {
            invocations,
            next_page_token,
        }))
    }

    async fn get_invocation_stats(
        &self,
        request: Request<pb::GetInvocationStatsRequest>,
    ) -> Result<Response<pb::GetInvocationStatsResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let tenant = scope(&caller, &request.tenant)?;
        let (created_from, created_before) = window(request.created_after, request.created_before)?;
        let selected = ListRequest {
            tenant,
            created_from,
            created_before,
            ..ListRequest::default()
        };
        let stats = stats::read(
            self.runtime.store().as_ref(),
            selected,
            stats::MAX_INVOCATIONS,
            stats::PAGE,
        )
        .await
        .map_err(OrchestratorError::from)?;
        Ok(Response::new(stats))
    }

    type WatchInvocationStream = WatchStream;

    async fn watch_invocation(
        &self,
        request: Request<pb::WatchInvocationRequest>,
    ) -> Result<Response<Self::WatchInvocationStream>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let record = self.owned(&caller, &request.invocation_id).await?;
        let from_seq = request.from_seq.max(1);
        if record.state == InvocationState::Ended && from_seq > record.version {
            // Its log is whole and the watcher has seen it all: an empty stream that ends,
            // rather than one that waits for events that never come.
            return Ok(Response::new(Box::pin(futures::stream::empty())));
        }
        if from_seq > record.version + 1 {
            // Nobody saw that event (only committed ones are shown), and a stream that
            // waited for it would not notice an end before it.
            return Err(OrchestratorError(RuntimeError::OutOfRange(format!(
                "from_seq {from_seq} is beyond the next event, {}",
                record.version + 1
            )))
            .into());
        }
        // Ends by itself: after the final event, when the watcher goes away, or when
        // the invocation parks on shutdown.
        let id = record.invocation_id.to_string();
        let events = ReceiverStream::new(self.runtime.watch(record.invocation_id, from_seq));
        Ok(Response::new(Box::pin(events.map(move |watched| {
            watched
                .map(|stored| pb::WatchInvocationResponse {
                    event: Some(wire::event(&id, stored.committed_at, &stored.event)),
                })
                .map_err(|error| Status::from(OrchestratorError(error)))
        }))))
    }

    async fn cancel_invocation(
        &self,
        request: Request<pb::CancelInvocationRequest>,
    ) -> Result<Response<pb::CancelInvocationResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        bounded("reason", &request.reason, MAX_REASON_BYTES)?;
        let id = self.owned_id(&caller, &request.invocation_id).await?;
        let record = self
            .runtime
            .cancel(id, &request.reason)
            .await
            .map_err(OrchestratorError)?;
        Ok(Response::new(pb::CancelInvocationResponse {
            invocation: Some(self.invocation(&record).await?),
        }))
    }

    async fn resolve_approval(
        &self,
        request: Request<pb::ResolveApprovalRequest>,
    ) -> Result<Response<pb::ResolveApprovalResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let record = self.owned(&caller, &request.invocation_id).await?;
        self.require_role(
            &caller,
            Authenticator::approver_role,
            "resolving an approval",
        )?;
        let approved = match request.verdict() {
            pb::ApprovalVerdict::Approve => true,
            pb::ApprovalVerdict::Deny => false,
            pb::ApprovalVerdict::Unspecified => {
                return Err(invalid("verdict must be APPROVE or DENY").into());
            }
        };
        let actor = acting_actor(&caller, &request.actor)?;
        // Someone resolves it: with `auth` off, the request must say who.
        if actor.is_empty() {
            return Err(invalid("actor is required").into());
        }
        let bounds = self.runtime.config().bounds;
        bounded("comment", &request.comment, bounds.max_reply_bytes)?;
        let proposal = match request.proposal_digest.as_str() {
            "" => return Err(invalid("proposal_digest is required").into()),
            digest => digest
                .parse::<Fingerprint>()
                .map_err(|_| invalid("proposal_digest is not a proposal digest (64 hex digits)"))?,
        };
        let reply = Reply::Resolve {
            proposal,
            approved,
            actor,
            comment: request.comment,
        };
        let record = self
            .runtime
            .reply(&record, reply)
            .await
            .map_err(OrchestratorError)?;
        Ok(Response::new(pb::ResolveApprovalResponse {
            invocation: Some(self.invocation(&record).await?),
        }))
    }

    async fn answer_clarification(
        &self,
        request: Request<pb::AnswerClarificationRequest>,
    ) -> Result<Response<pb::AnswerClarificationResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let record = self.owned(&caller, &request.invocation_id).await?;
        let bounds = self.runtime.config().bounds;
        bounded("answer", &request.answer, bounds.max_reply_bytes)?;
        let actor = acting_actor(&caller, &request.actor)?;
        // A tool's question, while the invocation waits for its answer.
        let asked = record
            .end
            .as_ref()
            .filter(|_| record.state == InvocationState::Waiting)
            .and_then(|end| end.input.as_deref());
        let action = wire::input_action_from(request.action());
        let (answer, action) = match (asked, action) {
            (None, None) if request.answer.trim().is_empty() => {
                return Err(invalid("answer is required").into());
            }
            // An action without a tool's question: the engine refuses it as the wrong
            // kind of reply, as it refuses an answer to an approval.
            (None, action) => (request.answer, action),
            (Some(asked), None | Some(InputAction::Accept)) => {
                let content =
                    input::accepted(&asked.schema_json, &request.answer).map_err(invalid)?;
                bounded("answer", &content, bounds.max_reply_bytes)?;
                (content, Some(InputAction::Accept))
            }
            (Some(_), Some(action)) if !request.answer.is_empty() => {
                return Err(
                    invalid(format!("answer must be empty with {}", action.as_str())).into(),
                );
            }
            (Some(_), Some(action)) => (String::new(), Some(action)),
        };
        let reply = Reply::Answer {
            answer,
            actor,
            action,
        };
        let record = self
            .runtime
            .reply(&record, reply)
            .await
            .map_err(OrchestratorError)?;
        Ok(Response::new(pb::AnswerClarificationResponse {
            invocation: Some(self.invocation(&record).await?),
        }))
    }

    async fn list_unresolved_effects(
        &self,
        request: Request<pb::ListUnresolvedEffectsRequest>,
    ) -> Result<Response<pb::ListUnresolvedEffectsResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        // A local operator, or one of every tenant, sees every entry, as the ledger keeps
        // them; a verified caller names an invocation of its own tenant.
        let invocation_id = match (&caller, request.invocation_id.as_str()) {
            (Caller::Anyone | Caller::AllTenants(_), "") => String::new(),
            (Caller::Verified(_), "") => {
                return Err(invalid("invocation_id is required").into());
            }
            (Caller::Anyone, id) => id.to_owned(),
            (Caller::Verified(_) | Caller::AllTenants(_), id) => {
                self.owned(&caller, id).await?.invocation_id.to_string()
            }
        };
        let listed = self
            .runtime
            .ports()
            .ledger
            .list_unresolved(
                &invocation_id,
                request.page_size.min(MAX_EFFECTS_PAGE),
                &request.page_token,
            )
            .await
            .map_err(|failure| ledger_status(&failure))?;
        Ok(Response::new(pb::ListUnresolvedEffectsResponse {
            entries: listed.entries.iter().map(wire::entry).collect(),
            next_page_token: listed.next_page_token,
        }))
    }

    async fn list_effects(
        &self,
        request: Request<pb::ListEffectsRequest>,
    ) -> Result<Response<pb::ListEffectsResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let id = self.owned_id(&caller, &request.invocation_id).await?;
        let listed = self
            .runtime
            .ports()
            .ledger
            .list_by_invocation(
                id,
                request.page_size.min(MAX_EFFECTS_PAGE),
                &request.page_token,
            )
            .await
            .map_err(|failure| ledger_status(&failure))?;
        Ok(Response::new(pb::ListEffectsResponse {
            entries: listed.entries.iter().map(wire::entry).collect(),
            next_page_token: listed.next_page_token,
        }))
    }

    async fn settle_effect(
        &self,
        request: Request<pb::SettleEffectRequest>,
    ) -> Result<Response<pb::SettleEffectResponse>, Status> {
        let caller = self.caller(&request).await?;
        let request = request.into_inner();
        let record = self.owned(&caller, &request.invocation_id).await?;
        self.require_role(&caller, Authenticator::operator_role, "settling an effect")?;
        let outcome = match request.state() {
            pb::EffectState::Committed => Outcome::Committed,
            pb::EffectState::Rejected => Outcome::Rejected,
            pb::EffectState::Unspecified
            | pb::EffectState::Prepared
            | pb::EffectState::Dispatched
            | pb::EffectState::OutcomeUnknown
            | pb::EffectState::ReconciliationRequired => {
                return Err(invalid(
                    "state must be EFFECT_STATE_COMMITTED or EFFECT_STATE_REJECTED",
                )
                .into());
            }
        };
        let actor = acting_actor(&caller, &request.actor)?;
        if actor.is_empty() {
            return Err(invalid("actor is required").into());
        }
        if request.detail.trim().is_empty() {
            return Err(invalid("detail is required: say how the effect was checked").into());
        }
        let bounds = self.runtime.config().bounds;
        bounded("detail", &request.detail, bounds.max_reply_bytes)?;
        bounded("receipt", &request.receipt, bounds.max_reply_bytes)?;
        if request.effect_key.is_empty() {
            return Err(invalid("effect_key is required").into());
        }
        bounded("effect_key", &request.effect_key, bounds.max_reply_bytes)?;
        let ledger = &self.runtime.ports().ledger;
        // An effect of another invocation is as absent as one that does not exist, so
        // that a key names nothing beyond the invocation the caller may see.
        let not_found = || {
            OrchestratorError(RuntimeError::NotFound(format!(
                "invocation {} has no effect {:?}",
                record.invocation_id, request.effect_key
            )))
        };
        let entry = match ledger.get(&request.effect_key).await {
            Ok(found) => found,
            Err(failure) if failure.kind == FailureKind::NotFound => {
                return Err(not_found().into());
            }
            Err(failure) => return Err(ledger_status(&failure)),
        };
        if entry.invocation_id != record.invocation_id.to_string() {
            return Err(not_found().into());
        }
        if entry.state != Some(EffectState::ReconciliationRequired) {
            let state = entry.state.map_or("unknown", EffectState::as_str);
            return Err(OrchestratorError(RuntimeError::FailedPrecondition(format!(
                "effect {:?} is {state}: only a reconciliation_required effect is an operator's to settle",
                entry.effect_key
            )))
            .into());
        }
        // Guarded by the state just read: of two operators settling at once, one wins and
        // the other gets FAILED_PRECONDITION from the ledger.
        let recorded = Recorded {
            outcome,
            receipt: request.receipt,
            detail: format!("settled by {actor}: {}", request.detail),
        };
        let settled = ledger
            .record(
                &entry.effect_key,
                EffectState::ReconciliationRequired,
                &recorded,
            )
            .await
            .map_err(|failure| ledger_status(&failure))?;
        tracing::info!(
            invocation = %record.invocation_id,
            effect_key = %request.effect_key,
            state = outcome.state().as_str(),
            %actor,
            "effect settled by an operator"
        );
        Ok(Response::new(pb::SettleEffectResponse {
            entry: Some(wire::entry(&settled)),
        }))
    }
}

/// The ledger's refusal, passed on to the caller as it gave it.
fn ledger_status(failure: &agentloop_runtime::ports::Failure) -> Status {
    Status::new(calls::code(failure.kind), failure.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_convert_and_negative_ones_are_refused() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(millis(&d(2, 500_000_000), "x").unwrap(), 2_500);
        assert!(millis(&d(-1, 0), "x").is_err());
        assert!(millis(&d(0, -5), "x").is_err());
        assert!(millis(&d(0, 1_000_000_000), "x").is_err());
    }

    #[test]
    fn ids_are_checked() {
        assert!(
            matches!(parse_id(""), Err(OrchestratorError(RuntimeError::InvalidArgument(m))) if m.contains("required"))
        );
        assert!(
            matches!(parse_id("nope"), Err(OrchestratorError(RuntimeError::InvalidArgument(m))) if m.contains("not a UUID"))
        );
        assert!(parse_id(&Uuid::now_v7().to_string()).is_ok());
    }
}
