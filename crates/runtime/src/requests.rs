//! What callers ask of the runtime beside replies (`waits`) and watches (`watch`):
//! starting an invocation, cancelling one, and reading where one is. The orchestrator's
//! API has checked who asks and what they may ask before any of these is called.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use agentloop_engine::{Limits, ToolCatalog, ToolSpec, UnixMillis, WaitEnd};
use agentloop_store::{Created, EventStore, InvocationRecord, InvocationState, NewInvocation};
use agentloop_telemetry::KeyValue;
use agentloop_telemetry::semconv::REPLAYED;
use tracing::{info, warn};
use uuid::Uuid;

use crate::spec::InvocationSpec;
use crate::{Ports, Runtime, RuntimeConfig, RuntimeError};

/// A new invocation, as the API admitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The task.
    pub goal: String,
    /// The profile it runs under.
    pub profile: String,
    /// Who it acts for.
    pub actor: String,
    /// The actor's tenant.
    pub tenant: String,
    /// The actor's roles, which policies test.
    pub roles: Vec<String>,
    /// Its budgets, the deadline already placed in time.
    pub limits: Limits,
    /// The tools it may call, by name; empty for all the gateway's.
    pub allowed_tools: Vec<String>,
    /// The scripted model of an offline run, as JSON text the API has parsed.
    pub script: Option<String>,
    /// The caller's idempotency key, if it gave one.
    pub idempotency_key: Option<String>,
    /// A digest of the whole request: the same key with another request is refused.
    pub request_digest: String,
    /// When it was asked for: the time its deadline was placed from.
    pub created_at: UnixMillis,
}

/// What a start did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The invocation as stored.
    pub record: InvocationRecord,
    /// Whether this start created it (not: its idempotency key named an earlier one).
    pub created: bool,
}

impl Runtime {
    /// Stores `start` as a new invocation and runs it, or finds the invocation its
    /// idempotency key started before.
    pub async fn start(&self, start: Start) -> Result<Started, RuntimeError> {
        let shared = &self.shared;
        if shared.drain.is_cancelled() {
            return Err(RuntimeError::Unavailable(
                "the orchestrator is shutting down".into(),
            ));
        }
        let descriptors = shared.descriptors().await?;
        for name in &start.allowed_tools {
            if !descriptors.iter().any(|d| &d.name == name) {
                return Err(RuntimeError::InvalidArgument(format!(
                    "allowed_tools names unknown tool {name:?}"
                )));
            }
        }
        let default_timeout = shared.config.limits.tool_timeout_ms;
        let tools = descriptors
            .iter()
            .filter(|d| start.allowed_tools.is_empty() || start.allowed_tools.contains(&d.name))
            .map(|d| {
                let spec = ToolSpec {
                    side_effect: d.side_effect,
                    commutative: d.commutative,
                    timeout_ms: Some(d.timeout_ms.unwrap_or(default_timeout)),
                    digest: d.digest,
                };
                (d.name.clone(), spec)
            })
            .collect::<ToolCatalog>();

        // Taken before anything is stored and held until the runner starts (or the start
        // gives up), so concurrent starts cannot pass the bounds together.
        let Some(mut slot) = shared.slot() else {
            return Err(shared.full());
        };
        let invocation_id = Uuid::now_v7();
        slot.ticket = Some(
            shared
                .tenants
                .admit_start(&start.tenant, invocation_id)
                .await?,
        );
        // Under the caller's span (the API runs in its context), and stored with the
        // spec, so that a resumed run continues the same trace.
        let span = shared.instruments.invoke_agent(
            invocation_id,
            &start.profile,
            &start.tenant,
            None,
            None,
        );
        let spec = InvocationSpec {
            goal: start.goal,
            profile: start.profile,
            actor: start.actor,
            tenant: start.tenant,
            roles: Some(Box::new(start.roles)).filter(|roles| !roles.is_empty()),
            limits: start.limits,
            tools: Arc::new(tools),
            script: start.script,
            trace: agentloop_telemetry::traceparent(&span.span_context()),
        };
        let spec_json = serde_json::to_string(&spec).map_err(|e| {
            RuntimeError::InvalidArgument(format!("cannot encode the invocation: {e}"))
        })?;
        let new = NewInvocation {
            invocation_id,
            tenant: spec.tenant.clone(),
            idempotency_key: start.idempotency_key,
            request_digest: start.request_digest,
            spec: spec_json,
            created_at: start.created_at,
        };
        match shared.store.create(new).await? {
            Created::New(record) => {
                shared.instruments.started();
                if let Err(error) = self.start_new(&record, spec, slot, span).await {
                    // Stored and running: the sweep starts it once the lease backend
                    // answers again. The caller gets the invocation, not an error, so a
                    // retry does not look like a different request.
                    warn!(invocation = %record.invocation_id, %error, "stored, not started yet");
                }
                Ok(Started {
                    record,
                    created: true,
                })
            }
            Created::Existing(record) => {
                // The key's invocation runs (or ran) under the first start's span.
                span.set(|| vec![KeyValue::new(REPLAYED, true)]);
                Ok(Started {
                    record,
                    created: false,
                })
            }
        }
    }

    /// Records a cancel of `id` and carries it out: a waiting invocation ends now; a
    /// running one's lease is revoked, and whoever runs it next ends it `cancelled`.
    /// Cancelling an ended invocation changes nothing and is not an error.
    pub async fn cancel(&self, id: Uuid, reason: &str) -> Result<InvocationRecord, RuntimeError> {
        let shared = &self.shared;
        // First durable, then announced: whichever worker runs the invocation next (its
        // current holder after taking the lease again, or any worker after a crash) finds
        // the request and ends it `cancelled`.
        let now = shared.clock.now();
        let mut record = shared.store.request_cancel(id, now, reason).await?;
        // Waiting, nothing runs: the wait ends now. Should a reply come first, the
        // invocation runs again, and it is cancelled as a running one is.
        if record.state == InvocationState::Waiting {
            let why = WaitEnd::Cancelled(record.cancel_reason.clone());
            shared.end_wait(&record, why).await?;
            record = shared.store.get(id).await?;
        }
        if record.state == InvocationState::Running {
            info!(invocation = %id, reason, "cancel requested");
            if let Err(error) = shared.workers.leases.revoke(&id.to_string()).await {
                // Recorded all the same: the holder stops when its lease lapses, and the
                // next worker ends the invocation `cancelled`.
                warn!(invocation = %id, %error, "cancel recorded; revocation failed");
            }
        }
        Ok(record)
    }

    /// The turn an invocation this process runs is at, and its calls in flight; `None`
    /// when it does not run here. A hint, never durable.
    pub fn progress(&self, id: Uuid) -> Option<(u32, u32)> {
        self.shared.progress(id).map(|progress| {
            (
                progress.turn.load(Relaxed),
                progress.in_flight.load(Relaxed),
            )
        })
    }

    /// The time on the runtime's clock.
    pub fn now(&self) -> agentloop_engine::UnixMillis {
        self.shared.clock.now()
    }

    /// The event store.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.shared.store
    }

    /// The ports.
    pub fn ports(&self) -> &Ports {
        &self.shared.ports
    }

    /// Its settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }
}
