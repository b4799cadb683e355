//! The I/O shell around one invocation's engine: performs the engine's actions against the
//! ports and the store, and feeds what happened back, until the engine says `Finish`.
//!
//! Every in-flight operation is a task in a `JoinSet` owned by the runner that reports
//! back over a bounded channel; when the invocation ends, the set is dropped and whatever
//! still runs is aborted, which drops its RPC, which cancels it at the far end.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use agentloop_engine::{
    Action, CallId, CallOutcome, ErrorType, Event, EventBody, ExecutionPlan, Input, Invocation,
    NextAction, Outcome, ToolCall, ToolError, Totals, UnixMillis, Verdict, Verification,
};
use agentloop_proto::v1 as pb;
use agentloop_store::Append;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::spec::{InvocationSpec, ToolEntry};
use crate::wire;
use crate::{Progress, Shared};

/// Committed events kept to show the model (bounded context; older turns are in the log).
pub(crate) const HISTORY: usize = 16;
/// Inputs waiting for the runner: a batch's results plus a few answers.
const INPUT_BOUND: usize = 64;
/// The lease epoch of the embedded deployment, where one process owns every invocation.
/// Distributed leases replace it with the epoch of a real lease.
const EMBEDDED_EPOCH: u64 = 1;

pub(crate) struct Runner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: Uuid,
    pub(crate) spec: Arc<InvocationSpec>,
    pub(crate) engine: Invocation,
    pub(crate) cancel: CancellationToken,
    pub(crate) recent: VecDeque<pb::Event>,
    pub(crate) progress: Arc<Progress>,
}

impl Runner {
    /// Runs to the end, or until the orchestrator drains (the invocation stays running in
    /// the store and resumes from its last committed event on the next start).
    pub(crate) async fn run(mut self) {
        let outcome = self.drive().await;
        self.shared.hub.close(self.id);
        self.shared.forget(self.id);
        match outcome {
            Some(outcome) => info!(
                invocation = %self.id,
                reason = %outcome.reason,
                steps = outcome.totals.steps,
                tool_calls = outcome.totals.tool_calls,
                "invocation ended"
            ),
            None => {
                info!(invocation = %self.id, "invocation parked by shutdown; it resumes on restart")
            }
        }
    }

    async fn drive(&mut self) -> Option<Outcome> {
        let (tx, mut rx) = mpsc::channel::<Input>(INPUT_BOUND);
        let mut tasks = JoinSet::new();
        let mut queue = VecDeque::from([Input::Start]);
        let mut batch: Option<CancellationToken> = None;
        let mut cancel_sent = false;
        let deadline = self
            .engine
            .limits()
            .deadline
            .map(|at| instant_of(at, self.shared.clock.now()));
        let mut tick_armed = deadline.is_some();
        // Tool calls may be running: a drain waits for them and the commit of their turn,
        // for at most the drain timeout; then it cancels them, so a shutdown is bounded.
        let mut executing = false;
        let mut drain_cutoff: Option<tokio::time::Instant> = None;
        let mut drain_cut = false;
        loop {
            let input = match queue.pop_front() {
                Some(input) => input,
                None => tokio::select! {
                    biased;
                    () = self.cancel.cancelled(), if !cancel_sent => {
                        cancel_sent = true;
                        Input::Cancel
                    }
                    () = sleep_until(deadline), if tick_armed => {
                        tick_armed = false;
                        Input::Tick
                    }
                    () = self.shared.drain.cancelled(), if !executing => return None,
                    () = self.shared.drain.cancelled(), if executing && drain_cutoff.is_none() && !drain_cut => {
                        let timeout = Duration::from_millis(self.shared.config.limits.drain_timeout_ms);
                        drain_cutoff = Some(tokio::time::Instant::now() + timeout);
                        continue;
                    }
                    () = sleep_until(drain_cutoff), if executing && drain_cutoff.is_some() => {
                        warn!(invocation = %self.id, "drain timeout: cancelling the running calls");
                        if let Some(token) = &batch {
                            token.cancel();
                        }
                        drain_cutoff = None;
                        drain_cut = true;
                        continue;
                    }
                    Some(input) = rx.recv() => input,
                },
            };
            if let Input::CallFinished { .. } = input {
                let _ = self
                    .progress
                    .in_flight
                    .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
            }
            let actions = match self.engine.step(input, self.shared.clock.now()) {
                Ok(actions) => actions,
                Err(error) => {
                    // A late answer for work the engine no longer waits for.
                    debug!(invocation = %self.id, %error, "input refused");
                    continue;
                }
            };
            for action in actions {
                match action {
                    Action::Decide { turn } => {
                        if self.shared.drain.is_cancelled() {
                            return None;
                        }
                        self.progress.turn.store(turn, Relaxed);
                        tasks.spawn(self.decide(turn, tx.clone()));
                    }
                    Action::Authorize { turn, calls } => {
                        tasks.spawn(self.authorize(turn, &calls, tx.clone()));
                    }
                    Action::Execute { turn, calls, plan } => {
                        let token = self.cancel.child_token();
                        batch = Some(token.clone());
                        executing = true;
                        let count = u32::try_from(calls.len()).unwrap_or(u32::MAX);
                        self.progress.in_flight.store(count, Relaxed);
                        tasks.spawn(execute_batch(
                            self.shared.clone(),
                            self.spec.clone(),
                            self.id,
                            turn,
                            calls,
                            plan,
                            token,
                            tx.clone(),
                        ));
                    }
                    Action::CancelCalls { .. } => {
                        if let Some(token) = &batch {
                            token.cancel();
                        }
                    }
                    Action::Reconcile { turn, calls } => {
                        tasks.spawn(self.reconcile(turn, calls, tx.clone()));
                    }
                    Action::Verify { answer, .. } => {
                        tasks.spawn(self.verify(answer, tx.clone()));
                    }
                    Action::Commit {
                        expected_version,
                        events,
                        totals,
                    } => {
                        let ends = events.iter().any(|e| matches!(e.body, EventBody::Ended(_)));
                        let input = self.commit(expected_version, events, totals).await;
                        executing = false;
                        batch = None;
                        self.progress.in_flight.store(0, Relaxed);
                        if ends {
                            tasks.abort_all();
                        }
                        queue.push_back(input);
                    }
                    Action::Finish(outcome) => {
                        tasks.abort_all();
                        return Some(outcome);
                    }
                }
            }
        }
    }

    fn decide(&self, turn: u32, tx: mpsc::Sender<Input>) -> impl Future<Output = ()> + use<> {
        let request = pb::DecideRequest {
            invocation_id: self.id.to_string(),
            turn,
            goal: self.spec.goal.clone(),
            profile: self.spec.profile.clone(),
            tools: self.shared.descriptors_for(&self.spec),
            history: self.recent.iter().cloned().collect(),
            context_from_seq: self.recent.front().map_or(0, |event| event.seq),
            summary: String::new(),
            scripted_model_json: self.spec.script.clone().unwrap_or_default(),
        };
        let port = self.shared.ports.decision.clone();
        async move {
            let input = match port.decide(request).await {
                Ok(response) => wire::decided(response),
                Err(status) => Input::DecisionFailed {
                    message: format!("{:?}: {}", status.code(), status.message()),
                },
            };
            let _ = tx.send(input).await;
        }
    }

    fn authorize(
        &self,
        turn: u32,
        calls: &[ToolCall],
        tx: mpsc::Sender<Input>,
    ) -> impl Future<Output = ()> + use<> {
        let totals = self.engine.protocol().totals;
        let request = pb::EvaluateRequest {
            invocation_id: self.id.to_string(),
            turn,
            profile: self.spec.profile.clone(),
            calls: calls.iter().map(wire::tool_call).collect(),
            actor: self.spec.actor.clone(),
            tenant: self.spec.tenant.clone(),
            budget: Some(wire::budget(&self.spec.limits, UnixMillis(0))),
            usage: Some(wire::budget_usage(&totals)),
            approved_proposal_digest: String::new(),
        };
        let port = self.shared.ports.policy.clone();
        async move {
            // Fail closed: no verdict, no execution.
            let verdict = match port.evaluate(request).await {
                Ok(response) => wire::verdict(response),
                Err(status) => Verdict::Deny {
                    reason: format!(
                        "the policy service failed: {:?}: {}",
                        status.code(),
                        status.message()
                    ),
                },
            };
            let _ = tx.send(Input::Authorized(verdict)).await;
        }
    }

    fn verify(&self, answer: String, tx: mpsc::Sender<Input>) -> impl Future<Output = ()> + use<> {
        let evidence_refs = self.evidence();
        let request = pb::ValidateFinalRequest {
            invocation_id: self.id.to_string(),
            profile: self.spec.profile.clone(),
            goal: self.spec.goal.clone(),
            answer,
            evidence_refs,
        };
        let port = self.shared.ports.policy.clone();
        async move {
            // Fail closed: an answer nobody could check is not accepted.
            let verification = match port.validate_final(request).await {
                Ok(response) => wire::verification(response),
                Err(status) => Verification::Rejected {
                    reason: format!(
                        "the validators failed: {:?}: {}",
                        status.code(),
                        status.message()
                    ),
                },
            };
            let _ = tx.send(Input::Verified(verification)).await;
        }
    }

    /// Successful tool results in the recent history, as `seq:call_id` references.
    fn evidence(&self) -> Vec<String> {
        use pb::tool_result::Outcome;
        let mut refs = Vec::new();
        for event in &self.recent {
            if let Some(pb::event::Body::Turn(turn)) = &event.body {
                for result in &turn.results {
                    if matches!(result.outcome, Some(Outcome::Output(_))) {
                        refs.push(format!("{}:{}", event.seq, result.call_id));
                    }
                }
            }
        }
        refs
    }

    fn reconcile(
        &self,
        turn: u32,
        calls: Vec<ToolCall>,
        tx: mpsc::Sender<Input>,
    ) -> impl Future<Output = ()> + use<> {
        let port = self.shared.ports.tools.clone();
        let id = self.id;
        async move {
            for call in calls {
                let request = pb::ToolGatewayServiceReconcileRequest {
                    tool: call.tool.clone(),
                    effect_key: effect_key(id, turn, &call),
                };
                let call_id = call.call_id.clone();
                let input = match port.reconcile(request).await {
                    Ok(answer) => reconciled(call_id, answer),
                    Err(status) => Input::ReconciliationFailed {
                        call_id,
                        detail: format!("{:?}: {}", status.code(), status.message()),
                    },
                };
                if tx.send(input).await.is_err() {
                    return;
                }
            }
        }
    }

    async fn commit(&mut self, expected_version: u64, events: Vec<Event>, totals: Totals) -> Input {
        let committed_at = self.shared.clock.now();
        let append = Append {
            expected_version,
            lease_epoch: EMBEDDED_EPOCH,
            events: &events,
            totals,
            committed_at,
        };
        match self.shared.store.append(self.id, append).await {
            Ok(()) => {
                let id = self.id.to_string();
                let wire: Vec<pb::Event> = events
                    .iter()
                    .map(|event| wire::event(&id, committed_at, event))
                    .collect();
                for event in &wire {
                    if self.recent.len() == HISTORY {
                        self.recent.pop_front();
                    }
                    self.recent.push_back(event.clone());
                }
                self.shared.hub.publish(self.id, wire);
                Input::Committed
            }
            Err(error) => {
                warn!(invocation = %self.id, %error, "commit failed");
                Input::CommitFailed {
                    message: error.to_string(),
                }
            }
        }
    }
}

fn reconciled(call_id: CallId, answer: pb::ToolGatewayServiceReconcileResponse) -> Input {
    match answer.status() {
        pb::ReconcileStatus::Applied => Input::Reconciled {
            call_id,
            outcome: CallOutcome::Output {
                output_json: answer.output_json,
            },
        },
        pb::ReconcileStatus::NotApplied => Input::Reconciled {
            call_id,
            outcome: CallOutcome::Error(ToolError {
                error_type: ErrorType::Unavailable,
                message: "the executor's records show the effect was not applied".into(),
                retryable: true,
                next_allowed_action: NextAction::Retry,
            }),
        },
        pb::ReconcileStatus::Unknown | pb::ReconcileStatus::Unspecified => {
            Input::ReconciliationFailed {
                call_id,
                detail: if answer.detail.is_empty() {
                    "the executor cannot tell".into()
                } else {
                    answer.detail
                },
            }
        }
    }
}

/// Runs a batch stage by stage; the calls of a stage run together, and each result is
/// reported the moment it arrives.
#[allow(clippy::too_many_arguments)]
async fn execute_batch(
    shared: Arc<Shared>,
    spec: Arc<InvocationSpec>,
    id: Uuid,
    turn: u32,
    calls: Vec<ToolCall>,
    plan: ExecutionPlan,
    token: CancellationToken,
    tx: mpsc::Sender<Input>,
) {
    for stage in plan.stages {
        let mut running: FuturesUnordered<_> = stage
            .iter()
            .filter_map(|&index| calls.get(index))
            .map(|call| run_call(&shared, &spec, id, turn, call, &token))
            .collect();
        while let Some((call_id, outcome)) = running.next().await {
            if tx
                .send(Input::CallFinished { call_id, outcome })
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

async fn run_call(
    shared: &Shared,
    spec: &InvocationSpec,
    id: Uuid,
    turn: u32,
    call: &ToolCall,
    token: &CancellationToken,
) -> (CallId, CallOutcome) {
    let call_id = call.call_id.clone();
    if token.is_cancelled() {
        return (call_id, CallOutcome::NotStarted);
    }
    let (writes, timeout_ms) = match spec.tool(&call.tool) {
        Some(ToolEntry {
            side_effect,
            timeout_ms,
            ..
        }) => (side_effect.writes(), *timeout_ms),
        // The engine only executes catalog tools; treat a mismatch as the riskier kind.
        None => (true, shared.config.limits.tool_timeout_ms),
    };
    let request = pb::ToolGatewayServiceExecuteRequest {
        invocation_id: id.to_string(),
        call: Some(wire::tool_call(call)),
        effect_key: if writes {
            effect_key(id, turn, call)
        } else {
            String::new()
        },
        attempt: 1,
        timeout: Some(prost_types::Duration {
            seconds: i64::try_from(timeout_ms / 1000).unwrap_or(i64::MAX),
            nanos: i32::try_from((timeout_ms % 1000) * 1_000_000).unwrap_or(0),
        }),
    };
    let tools = shared.ports.tools.clone();
    let outcome = tokio::select! {
        biased;
        // Dropping the RPC cancels it at the executor. A write may already have been
        // applied, so its outcome is unknown and gets reconciled, never assumed.
        () = token.cancelled() => if writes {
            CallOutcome::Unknown { detail: "cancelled while in flight".into() }
        } else {
            CallOutcome::Cancelled
        },
        result = tools.execute(request) => match result {
            Ok(response) => match response.result {
                Some(result) => wire::call_outcome(result, writes),
                None => wire::unanswered(writes, "the tool gateway sent no result".into()),
            },
            Err(status) => wire::unanswered(
                writes,
                format!("the tool gateway failed: {:?}: {}", status.code(), status.message()),
            ),
        },
    };
    (call_id, outcome)
}

/// The effect key of a write: stable for the same call of the same turn of the same
/// invocation, across retries, restarts and takeovers. Call IDs are only unique within a
/// batch, so the turn is part of the key; the tool and the exact arguments are too, so a
/// turn that is decided again after a crash with a *different* call under the same ID
/// gets a different key instead of being mistaken for the first.
pub(crate) fn effect_key(invocation_id: Uuid, turn: u32, call: &ToolCall) -> String {
    let mut hasher = Sha256::new();
    for part in [
        invocation_id.as_bytes().as_slice(),
        &turn.to_be_bytes(),
        call.call_id.as_str().as_bytes(),
        call.tool.as_bytes(),
        call.arguments_json.as_bytes(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn instant_of(at: UnixMillis, now: UnixMillis) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(at.0.saturating_sub(now.0))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            call_id: CallId::new(id),
            tool: "transfer".into(),
            arguments_json: args.into(),
        }
    }

    #[test]
    fn effect_keys_are_stable_and_tell_calls_apart() {
        let invocation = Uuid::from_u128(7);
        let key = effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#));
        assert_eq!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":5}"#))
        );
        assert_eq!(key.len(), 64);
        assert_ne!(
            key,
            effect_key(invocation, 2, &call("c1", r#"{"amount":5}"#))
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c2", r#"{"amount":5}"#))
        );
        assert_ne!(
            key,
            effect_key(invocation, 1, &call("c1", r#"{"amount":6}"#))
        );
        assert_ne!(
            key,
            effect_key(Uuid::from_u128(8), 1, &call("c1", r#"{"amount":5}"#))
        );
    }
}
