//! The I/O shell around one invocation's engine: performs the engine's actions against the
//! ports and the store, and feeds what happened back, until the engine says `Finish`.
//!
//! Every in-flight operation (a model call, a policy check, one tool call, ...) is a future
//! the runner polls itself, which resolves to the input that reports it. So an
//! invocation is one task however many turns it runs, a waiting one holds no channel or
//! task beside it, and when it ends the set of operations is dropped, which drops their
//! RPCs, which cancels them at the far end. The engine bounds the set: one model call,
//! policy check or verification at a time, or the calls of one batch.
//!
//! The runner holds the invocation's lease through a [`Keeper`], and every commit carries
//! the lease's epoch. When the lease goes, the running calls are cancelled at once. If a
//! caller asked to cancel (`CancelInvocation` records the request, then revokes), the
//! runner takes the lease again and ends the invocation `cancelled`, committing what the
//! interrupted calls did. A lease lost any other way (renewals failed, another worker took
//! over) stops the runner without committing anything more.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use agentloop_engine::{
    Action, CallId, Event, EventBody, Fingerprint, Input, InputAnswer, Invocation, Outcome,
    Refusal, SideEffect, TerminalReason, ToolCall, ToolDigest, Totals, UnixMillis, Verdict,
    Verification, WaitEnd,
};
use agentloop_lease::{Keeper, KeeperExit};
use agentloop_store::{Append, InvocationState, StoreError, StoredEvent};
use agentloop_telemetry::{ActiveSpan, KeyValue, semconv};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::context::ModelContext;
use crate::intern::Descriptors;
use crate::ports::{Ask, Batch as PolicyBatch, Claim, Decided};
use crate::spec::RunnerSpec;
use crate::{Progress, Shared, Taken};
use crate::{effects, verify};

/// An operation in flight; it resolves to the inputs that report it.
type Op = Pin<Box<dyn Future<Output = Done> + Send>>;

/// What an operation reports.
enum Done {
    /// Most operations: one input.
    One(Input),
    /// A stage sent as one request: one `CallFinished` per call.
    Stage(Vec<Input>),
}

impl Done {
    /// How many calls of the batch this reports finished.
    fn finished_calls(&self) -> usize {
        match self {
            Done::One(Input::CallFinished { .. }) => 1,
            Done::One(_) => 0,
            Done::Stage(inputs) => inputs.len(),
        }
    }
}

/// The batch being executed: its calls, the stages not started yet, and how many calls of
/// the current stage still run (a stage starts when the one before it is done).
struct Batch {
    turn: u32,
    calls: Vec<ToolCall>,
    /// Calls policy refused at dispatch (rare: after an approval or a resume), behind
    /// one pointer: the batch lives in every runner's task.
    refused: Option<Arc<Vec<Refusal>>>,
    /// A person's answer to the question one of the calls asked (rarer still).
    answer: Option<Arc<InputAnswer>>,
    stages: std::vec::IntoIter<Vec<usize>>,
    running: usize,
    token: CancellationToken,
}

impl Batch {
    /// The answer `call` is sent with, if it asked.
    fn answer_for(&self, call: &ToolCall) -> Option<Arc<InputAnswer>> {
        self.answer
            .as_ref()
            .filter(|answer| answer.call_id == call.call_id)
            .cloned()
    }
}

pub(crate) struct Runner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: Uuid,
    /// Whom it acts for and what it may call.
    pub(crate) spec: Arc<RunnerSpec>,
    pub(crate) engine: Invocation,
    /// Keeps the lease; `None` only while it is being replaced after a revocation.
    pub(crate) keeper: Option<Keeper>,
    /// Fired by the keeper when the lease is revoked or lost.
    pub(crate) lost: CancellationToken,
    /// A cancel request is on record: the first input is `Cancel`, not `Start`.
    pub(crate) cancel_requested: bool,
    /// What the model is shown: the goal, the script, the last committed events.
    pub(crate) context: ModelContext,
    /// The tools offered to the model, shared with the invocations of the same tools.
    pub(crate) tools: Arc<Descriptors>,
    /// The generation of the gateway's descriptors `tools` was taken from.
    pub(crate) tools_generation: u64,
    pub(crate) progress: Arc<Progress>,
    /// This segment's `invoke_agent` span (none while traces are off); every operation
    /// runs under it.
    pub(crate) span: ActiveSpan,
    /// When the invocation was created, for its duration.
    pub(crate) created_at: UnixMillis,
}

impl Runner {
    /// Runs to the end, until the orchestrator drains (the invocation stays running in
    /// the store; it is handed off to another worker, or resumes on the next start), or
    /// until the lease is lost (whoever holds it now continues).
    ///
    /// Not an `async fn`: one of those keeps its argument twice in its future (the
    /// argument, and the local it is moved into), and this future is what every parked
    /// invocation holds.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would keep the runner twice in its future"
    )]
    pub(crate) fn run(mut self) -> impl Future<Output = ()> + Send {
        async move { self.finish().await }
    }

    async fn finish(&mut self) {
        let exit = self.drive().await;
        // Boxed: what a future awaits is part of it, so the wind-down's locals (the exit,
        // the keeper, their awaits) would make every parked invocation's future larger.
        Box::pin(self.close(exit)).await;
    }

    /// Winds the invocation down after `drive` returned `exit`: lets the lease go (or hands
    /// the invocation off when parked by a drain), and forgets it.
    async fn close(&mut self, exit: Exit) {
        self.shared.hub.close(self.id);
        let keeper = self.keeper.take();
        let instruments = &self.shared.instruments;
        if keeper.is_some() {
            instruments.leases_held.dec();
        }
        match &exit {
            Exit::Ended(outcome) => {
                instruments.ended(outcome.reason, self.created_at, self.shared.clock.now());
                self.span.set(|| {
                    vec![KeyValue::new(
                        semconv::TERMINAL_REASON,
                        outcome.reason.as_str(),
                    )]
                });
                info!(
                    invocation = %self.id,
                    reason = %outcome.reason,
                    steps = outcome.totals.steps,
                    tool_calls = outcome.totals.tool_calls,
                    "run ended"
                );
                if let Some(keeper) = keeper {
                    let _ = keeper.release().await;
                }
            }
            Exit::Parked => {
                if let Some(keeper) = keeper {
                    let _ = keeper.release().await;
                }
                match self
                    .shared
                    .workers
                    .handoff
                    .offer(&self.id.to_string())
                    .await
                {
                    Ok(()) => {
                        info!(invocation = %self.id, "invocation parked by shutdown and handed off")
                    }
                    Err(error) => info!(
                        invocation = %self.id,
                        %error,
                        "invocation parked by shutdown; a sweep or the next start resumes it"
                    ),
                }
            }
            Exit::Lost(why) => {
                if let Some(keeper) = keeper {
                    keeper.stop();
                }
                instruments.leases_lost.inc();
                self.span.fail("lease_lost", || why.clone());
                warn!(invocation = %self.id, why = %why, "lease lost: stopped without committing more");
            }
        }
        self.span.end();
        self.shared.forget(self.id, &self.spec.tenant);
        if let Exit::Ended(_) = &exit {
            self.shared.tenants.ended(&self.spec.tenant, self.id).await;
        }
        if let Exit::Ended(outcome) = &exit
            && matches!(
                outcome.reason,
                TerminalReason::ApprovalRequired | TerminalReason::ClarificationRequired
            )
        {
            // Boxed: what a future awaits is part of it, and every parked invocation keeps
            // this one whole.
            Box::pin(self.cancel_wait_if_requested()).await;
        }
    }

    async fn drive(&mut self) -> Exit {
        let mut ops: FuturesUnordered<Op> = FuturesUnordered::new();
        let first = if self.cancel_requested {
            Input::Cancel {
                reason: Box::pin(self.cancel_reason()).await,
            }
        } else {
            Input::Start
        };
        let mut queue = VecDeque::from([first]);
        let mut batch: Option<Batch> = None;
        let mut lost = self.lost.clone();
        let deadline = self
            .engine
            .deadline()
            .map(|at| instant_of(at, self.shared.clock.now()));
        let mut tick_armed = deadline.is_some();
        // While tool calls run (`engine.is_executing()`), a drain waits for them and the
        // commit of their turn, for at most the drain timeout; then it cancels them, so a
        // shutdown is bounded.
        let mut drain_cutoff: Option<tokio::time::Instant> = None;
        let mut drain_cut = false;
        // When the model was asked for the turn being run, until its commit.
        let mut turn_began: Option<tokio::time::Instant> = None;
        loop {
            let executing = self.engine.is_executing();
            // `if let`, not `match`, and the lease's loss handled after the `select!`, not
            // in it: the value an `if let` tests is dropped before its `else`, so neither
            // the popped `Option<Input>` nor the `select!`'s output is kept in the future
            // while the runner waits (in the `select!`, or to take the lease again).
            let input = if let Some(input) = queue.pop_front() {
                input
            } else if let Some(input) = tokio::select! {
                biased;
                () = lost.cancelled() => None,
                // One timer for both the deadline and the drain cutoff, and one
                // branch for the drain: every branch's future lives in the runner's
                // own, which a parked invocation keeps.
                () = sleep_until(
                    [deadline.filter(|_| tick_armed), drain_cutoff.filter(|_| executing)]
                        .into_iter()
                        .flatten()
                        .min(),
                ) => {
                    if tick_armed && deadline.is_some_and(|at| at <= tokio::time::Instant::now()) {
                        tick_armed = false;
                        Some(Input::Tick)
                    } else {
                        warn!(invocation = %self.id, "drain timeout: cancelling the running calls");
                        if let Some(batch) = &batch {
                            batch.token.cancel();
                        }
                        drain_cutoff = None;
                        drain_cut = true;
                        continue;
                    }
                }
                () = self.shared.drain.cancelled(), if !executing || (drain_cutoff.is_none() && !drain_cut) => {
                    if !executing {
                        return Exit::Parked;
                    }
                    let timeout = Duration::from_millis(self.shared.config.limits.drain_timeout_ms);
                    drain_cutoff = Some(tokio::time::Instant::now() + timeout);
                    continue;
                }
                Some(done) = ops.next() => {
                    let finished = done.finished_calls();
                    if let (1.., Some(batch)) = (finished, &mut batch) {
                        batch.running = batch.running.saturating_sub(finished);
                        self.start_stage(batch, &mut ops);
                    }
                    match done {
                        Done::One(input) => Some(input),
                        Done::Stage(inputs) => {
                            queue.extend(inputs);
                            continue;
                        }
                    }
                }
            } {
                input
            } else {
                // Stop the running calls first: whoever runs the invocation next must not
                // find this worker's side effects still starting.
                if let Some(batch) = &batch {
                    batch.token.cancel();
                }
                // Boxed, like the commit and the timer: what a future awaits is part of
                // it, and a parked invocation keeps the runner's future whole while it
                // waits in neither.
                match Box::pin(self.regain()).await {
                    Ok((token, reason)) => {
                        lost = token;
                        Input::Cancel { reason }
                    }
                    Err(why) => return Exit::Lost(why),
                }
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
            // A loop, not `for`: the commit's parts are taken out of its action in a
            // statement of their own, so neither the action nor the `Option` it came in
            // is kept in the future while the commit is awaited.
            let mut actions = actions.into_iter();
            loop {
                let (expected_version, events, totals) = match actions.next() {
                    None => break,
                    Some(Action::Commit {
                        expected_version,
                        events,
                        totals,
                    }) => (expected_version, events, totals),
                    Some(Action::Finish(outcome)) => return Exit::Ended(outcome),
                    Some(Action::Decide { turn }) => {
                        if self.shared.drain.is_cancelled() {
                            return Exit::Parked;
                        }
                        self.progress.turn.store(turn, Relaxed);
                        turn_began = Some(tokio::time::Instant::now());
                        ops.push(self.decide(turn));
                        continue;
                    }
                    Some(Action::Authorize {
                        turn,
                        calls,
                        approved,
                    }) => {
                        ops.push(self.authorize(turn, calls, approved));
                        continue;
                    }
                    Some(Action::Execute {
                        turn,
                        calls,
                        plan,
                        refused,
                        answer,
                    }) => {
                        let count = u32::try_from(calls.len()).unwrap_or(u32::MAX);
                        self.progress.in_flight.store(count, Relaxed);
                        let started = batch.insert(Batch {
                            turn,
                            calls,
                            refused: (!refused.is_empty()).then(|| Arc::new(refused)),
                            answer: answer.map(|answer| Arc::new(*answer)),
                            stages: plan.stages.into_iter(),
                            running: 0,
                            token: CancellationToken::new(),
                        });
                        self.start_stage(started, &mut ops);
                        continue;
                    }
                    Some(Action::CancelCalls { .. }) => {
                        if let Some(batch) = &batch {
                            batch.token.cancel();
                        }
                        continue;
                    }
                    Some(Action::Reconcile { turn, calls }) => {
                        for call in calls {
                            let answered = batch
                                .as_ref()
                                .and_then(|batch| batch.answer_for(&call))
                                .map(|answer| answer.seq);
                            ops.push(self.reconcile(turn, call, answered));
                        }
                        continue;
                    }
                    Some(Action::Verify {
                        answer, evidence, ..
                    }) => {
                        ops.push(self.verify(answer, evidence));
                        continue;
                    }
                };
                let ends = events.iter().any(|e| matches!(e.body, EventBody::Ended(_)));
                let commit = Box::pin(self.commit(expected_version, events, totals));
                let input = match commit.await {
                    Ok(input) => input,
                    Err(why) => return Exit::Lost(why),
                };
                batch = None;
                if let Some(began) = turn_began.take() {
                    self.shared
                        .instruments
                        .turn_seconds
                        .observe(began.elapsed().as_secs_f64());
                }
                self.progress.in_flight.store(0, Relaxed);
                if ends {
                    ops.clear();
                }
                queue.push_back(input);
            }
        }
    }

    /// Starts the next stages of `batch` until one has calls running (a stage of calls
    /// that are all missing from the batch counts as done). A stage of several reads,
    /// up to the contract's bound, goes as one operation when the gateway port prefers
    /// that.
    fn start_stage(&self, batch: &mut Batch, ops: &mut FuturesUnordered<Op>) {
        while batch.running == 0 {
            let Some(stage) = batch.stages.next() else {
                return;
            };
            let calls = || stage.iter().filter_map(|&index| batch.calls.get(index));
            let count = calls().count();
            if count >= 2
                && count <= self.shared.ports.tools.max_stage()
                && batch.refused.is_none()
                && batch.answer.is_none()
                && calls()
                    .all(|call| settings(&self.spec, &self.shared, call).0 == SideEffect::ReadOnly)
            {
                ops.push(self.stage(batch.turn, calls().cloned().collect(), batch.token.clone()));
            } else {
                for call in calls() {
                    let refused = batch.refused.clone();
                    let answer = batch.answer_for(call);
                    ops.push(self.call(
                        batch.turn,
                        call.clone(),
                        batch.token.clone(),
                        refused,
                        answer,
                    ));
                }
            }
            batch.running += count;
        }
    }

    fn decide(&mut self, turn: u32) -> Op {
        let generation = self.shared.tools_generation();
        if generation != self.tools_generation {
            // The gateway's tools changed (or were not listed yet as the runner started).
            self.tools = self.shared.descriptors_for(&self.spec.tools);
            self.tools_generation = generation;
        }
        let (context, tools) = (self.context.clone(), Arc::clone(&self.tools));
        let (shared, spec, id) = (self.shared.clone(), self.spec.clone(), self.id);
        self.span.boxed(async move {
            let script = match context.script() {
                Ok(script) => script,
                Err(why) => {
                    let message = format!("the invocation's script does not parse: {why}");
                    return Done::One(Input::DecisionFailed { message });
                }
            };
            let ask = Ask {
                invocation: id,
                turn,
                profile: &spec.profile,
                goal: context.goal(),
                history: context.history(),
                script,
                tools: &tools.0,
            };
            Done::One(match shared.ports.decision.decide(ask).await {
                Ok(Decided { decision, usage }) => Input::Decided { decision, usage },
                Err(failure) => Input::DecisionFailed {
                    message: failure.to_string(),
                },
            })
        })
    }

    /// Asks policy about `calls`; `approved` is the digest a human approved them under,
    /// which satisfies policy's approval gate for exactly these calls.
    fn authorize(&self, turn: u32, calls: Vec<ToolCall>, approved: Option<Fingerprint>) -> Op {
        let (shared, spec, id) = (self.shared.clone(), self.spec.clone(), self.id);
        self.span.boxed(async move {
            let span = shared
                .instruments
                .step(|| semconv::SPAN_AUTHORIZE.to_owned(), turn);
            let batch = PolicyBatch {
                invocation: id,
                turn,
                profile: &spec.profile,
                actor: &spec.actor,
                tenant: &spec.tenant,
                roles: spec.roles(),
                calls: &calls,
                approved,
            };
            // Fail closed: no verdict, no execution.
            let authorization = match span.scope(shared.ports.policy.authorize(batch)).await {
                Ok(authorization) => authorization,
                Err(failure) => Verdict::Deny {
                    reason: format!("the policy service failed: {failure}"),
                    refusals: Vec::new(),
                }
                .into(),
            };
            span.set(|| {
                vec![KeyValue::new(
                    semconv::POLICY_VERDICT,
                    verdict_name(&authorization.verdict),
                )]
            });
            span.end();
            Done::One(Input::Authorized(authorization))
        })
    }

    /// Checks `answer`, citing `evidence`, against the committed state; see
    /// [`crate::verify`].
    fn verify(&self, answer: String, evidence: Vec<CallId>) -> Op {
        let evidence: Vec<String> = evidence.iter().map(|id| id.as_str().to_owned()).collect();
        let mut cited = Vec::new();
        let older = self.context.cite(&evidence, &mut cited);
        let within = self
            .engine
            .deadline()
            .map(|at| Duration::from_millis(at.0.saturating_sub(self.shared.clock.now().0)));
        let verify = verify::Verify {
            shared: self.shared.clone(),
            id: self.id,
            profile: self.spec.profile.clone(),
            claim: Claim {
                invocation_id: self.id.to_string(),
                actor: self.spec.actor.clone(),
                tenant: self.spec.tenant.clone(),
                goal: self.context.goal().to_owned(),
                answer,
                evidence,
                cited,
                effects: Vec::new(),
            },
            older,
            writes: self.engine.protocol().wrote,
            within,
        };
        let turn = self.progress.turn.load(Relaxed);
        self.span.boxed(async move {
            let span = verify
                .shared
                .instruments
                .step(|| semconv::SPAN_VERIFY.to_owned(), turn);
            let verified = span.scope(verify.run()).await;
            span.set(|| {
                vec![KeyValue::new(
                    semconv::VERIFICATION_VERDICT,
                    verified_name(&verified),
                )]
            });
            span.end();
            Done::One(Input::Verified(verified))
        })
    }

    /// Reconciles `call`, whose effect is keyed by the answer it was sent with, if any
    /// (`answered`, the answer's seq).
    fn reconcile(&self, turn: u32, call: ToolCall, answered: Option<u64>) -> Op {
        let (shared, id) = (self.shared.clone(), self.id);
        self.span.boxed(async move {
            let span = shared.instruments.step(
                || format!("{} {}", semconv::SPAN_RECONCILE, call.tool),
                turn,
            );
            span.set(|| {
                vec![KeyValue::new(
                    semconv::EFFECT_KEY,
                    effects::effect_key(id, turn, &call, answered),
                )]
            });
            let input = span
                .scope(effects::reconcile(&shared.ports, id, turn, &call, answered))
                .await;
            span.end();
            Done::One(input)
        })
    }

    /// One call of a batch; `token` cancels the batch; `refused` are the batch's
    /// refusals at dispatch; `answer` is a person's answer to the question it asked.
    fn call(
        &self,
        turn: u32,
        call: ToolCall,
        token: CancellationToken,
        refused: Option<Arc<Vec<Refusal>>>,
        answer: Option<Arc<InputAnswer>>,
    ) -> Op {
        let (shared, spec, id) = (self.shared.clone(), self.spec.clone(), self.id);
        self.span.boxed(async move {
            let (side_effect, timeout_ms) = settings(&spec, &shared, &call);
            let answered = answer.as_ref().map(|answer| answer.seq);
            let span =
                shared
                    .instruments
                    .execute_tool(id, turn, &call, side_effect.writes(), answered);
            let run = effects::Call {
                ports: &shared.ports,
                invocation: id,
                turn,
                call: &call,
                side_effect,
                timeout_ms,
                digest: digest(&spec, &call),
                token: &token,
                refused: refused
                    .as_deref()
                    .and_then(|refused| refused.iter().find(|r| r.call_id == call.call_id)),
                answer: answer.as_deref(),
            };
            let outcome = span.scope(run.run()).await;
            shared.instruments.tool_done(&span, &outcome);
            Done::One(Input::CallFinished {
                call_id: call.call_id,
                outcome,
            })
        })
    }

    /// The read-only calls of one stage, as one request; `token` cancels the batch.
    fn stage(&self, turn: u32, calls: Vec<ToolCall>, token: CancellationToken) -> Op {
        let (shared, spec, id) = (self.shared.clone(), self.spec.clone(), self.id);
        self.span.boxed(async move {
            // One span per call; the request carrying them all goes under the invocation.
            let spans: Vec<ActiveSpan> = calls
                .iter()
                .map(|call| shared.instruments.execute_tool(id, turn, call, false, None))
                .collect();
            let stage: Vec<effects::Call<'_>> = calls
                .iter()
                .map(|call| effects::Call {
                    ports: &shared.ports,
                    invocation: id,
                    turn,
                    call,
                    side_effect: SideEffect::ReadOnly,
                    timeout_ms: settings(&spec, &shared, call).1,
                    digest: digest(&spec, call),
                    token: &token,
                    refused: None,
                    answer: None,
                })
                .collect();
            let outcomes = effects::run_stage(&shared.ports, &token, &stage).await;
            for (span, outcome) in spans.iter().zip(&outcomes) {
                shared.instruments.tool_done(span, outcome);
            }
            Done::Stage(
                calls
                    .into_iter()
                    .zip(outcomes)
                    .map(|(call, outcome)| Input::CallFinished {
                        call_id: call.call_id,
                        outcome,
                    })
                    .collect(),
            )
        })
    }

    /// After the run committed a wait: a cancel recorded while that commit was under way
    /// found the invocation running, so it only revoked the lease, and nobody would end
    /// the wait it did not see. End it now, `cancelled`, as that cancel would have. (A
    /// cancel recorded after the commit finds the invocation waiting and ends it itself;
    /// whichever end comes second finds the wait over and writes nothing.)
    async fn cancel_wait_if_requested(&self) {
        let record = match self.shared.store.get(self.id).await {
            Ok(record) => record,
            Err(error) => {
                warn!(invocation = %self.id, %error, "cannot check for a cancel after the wait");
                return;
            }
        };
        if record.state != InvocationState::Waiting || record.cancel_requested_at.is_none() {
            return;
        }
        let why = WaitEnd::Cancelled(record.cancel_reason.clone());
        match self.shared.end_wait(&record, why).await {
            Ok(ended) => debug!(invocation = %self.id, ended, "cancelled as it began to wait"),
            Err(error) => warn!(invocation = %self.id, %error, "cannot end a cancelled wait"),
        }
    }

    /// The reason of the cancel on record, read when the runner starts with one (rare:
    /// so no runner keeps it). The store unreachable, the cancel goes on without it.
    async fn cancel_reason(&self) -> String {
        match self.shared.store.get(self.id).await {
            Ok(record) => record.cancel_reason,
            Err(error) => {
                warn!(invocation = %self.id, %error, "cancel reason unread");
                String::new()
            }
        }
    }

    /// After the keeper fired: if a cancel was requested, take the lease again and return
    /// the new keeper's token with the cancel's reason, so the runner can end the
    /// invocation `cancelled` under a fresh epoch. Any other loss, or another worker winning the lease first, is `Err`
    /// with why: this runner must stop.
    ///
    /// A revoked lease may also reach the keeper as `Lost`: revoking deletes the lease,
    /// then publishes, and a renewal can land in between. So both are taken at their word
    /// only after the store is asked whether a cancel was recorded.
    async fn regain(&mut self) -> Result<(CancellationToken, String), String> {
        let Some(keeper) = self.keeper.take() else {
            return Err("no lease".into());
        };
        let exit = keeper.stop();
        if !matches!(exit, KeeperExit::Revoked | KeeperExit::Lost) {
            return Err(format!("{exit:?}"));
        }
        let (lease, reason) = match self.shared.take(self.id).await {
            Ok(Taken::Held(lease, record)) if record.cancel_requested_at.is_some() => {
                (lease, record.cancel_reason)
            }
            Ok(Taken::Held(lease, _record)) => {
                self.shared.let_go(&lease).await;
                return Err(format!("{exit:?}, and no cancel was requested"));
            }
            Ok(Taken::Elsewhere) => {
                return Err(format!("{exit:?}, and another worker holds the lease now"));
            }
            Ok(Taken::Ended) => return Err(format!("{exit:?}, and the invocation has ended")),
            Err(error) => {
                return Err(format!(
                    "{exit:?}, and the lease could not be taken again: {error}"
                ));
            }
        };
        let token = CancellationToken::new();
        let keepers = self
            .shared
            .workers
            .keepers()
            .await
            .map_err(|error| format!("cancelled, and the lease could not be kept: {error}"))?;
        self.keeper = Some(keepers.keep(lease, token.clone()));
        Ok((token, reason))
    }

    /// Appends a commit under the current lease epoch. `Err` when the store says another
    /// worker owns the invocation now (a newer epoch, a moved version, an end it wrote):
    /// the runner must stop. Other failures go to the engine as `CommitFailed`.
    async fn commit(
        &mut self,
        expected_version: u64,
        events: Vec<Event>,
        totals: Totals,
    ) -> Result<Input, String> {
        let Some(lease_epoch) = self.keeper.as_ref().map(|keeper| keeper.lease().epoch) else {
            return Err("no lease".into());
        };
        let committed_at = self.shared.clock.now();
        let instruments = &self.shared.instruments;
        let size = events.len();
        let span = self.span.enter(|| {
            instruments.step(
                || semconv::SPAN_COMMIT.to_owned(),
                self.progress.turn.load(Relaxed),
            )
        });
        span.set(|| {
            vec![KeyValue::new(
                semconv::COMMIT_EVENTS,
                i64::try_from(size).unwrap_or(i64::MAX),
            )]
        });
        let began = tokio::time::Instant::now();
        let append = Append {
            expected_version,
            lease_epoch,
            events: &events,
            totals,
            committed_at,
        };
        let appended = self.shared.store.append(self.id, append).await;
        instruments
            .commit_seconds
            .observe(began.elapsed().as_secs_f64());
        instruments.commit_events.observe(size as f64);
        if let Err(error) = &appended {
            span.fail("commit_failed", || error.to_string());
        }
        span.end();
        match appended {
            Ok(()) => {
                let stored: Vec<Arc<StoredEvent>> = events
                    .into_iter()
                    .map(|event| {
                        Arc::new(StoredEvent {
                            committed_at,
                            event,
                        })
                    })
                    .collect();
                self.shared.hub.publish(self.id, &stored);
                self.context.committed(stored);
                Ok(Input::Committed)
            }
            Err(
                error @ (StoreError::StaleEpoch { .. }
                | StoreError::VersionConflict { .. }
                | StoreError::Ended(_)),
            ) => Err(format!("fenced off by the store: {error}")),
            Err(error) => {
                warn!(invocation = %self.id, %error, "commit failed");
                Ok(Input::CommitFailed {
                    message: error.to_string(),
                })
            }
        }
    }
}

/// How a runner stopped.
enum Exit {
    /// The invocation ended.
    Ended(Outcome),
    /// The orchestrator drains; the invocation is still running in the store.
    Parked,
    /// The lease is gone; why.
    Lost(String),
}

/// A call's side-effect class and timeout, from the invocation's catalog. The engine
/// only executes catalog tools; a mismatch is treated as the riskier kind.
fn settings(spec: &RunnerSpec, shared: &Shared, call: &ToolCall) -> (SideEffect, u64) {
    let default = shared.config.limits.tool_timeout_ms;
    match spec.tools.get(&call.tool) {
        Some(tool) => (tool.side_effect, tool.timeout_ms.unwrap_or(default)),
        None => (SideEffect::Write, default),
    }
}

/// The contract version the invocation plans `call`'s tool under, if it is versioned.
fn digest(spec: &RunnerSpec, call: &ToolCall) -> Option<ToolDigest> {
    spec.tools.get(&call.tool).and_then(|tool| tool.digest)
}

fn instant_of(at: UnixMillis, now: UnixMillis) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(at.0.saturating_sub(now.0))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => Box::pin(tokio::time::sleep_until(at)).await,
        None => std::future::pending().await,
    }
}

/// A policy verdict's name, as `agentloop.policy.verdict` says it.
fn verdict_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Allow => "allow",
        Verdict::Deny { .. } => "deny",
        Verdict::RequireApproval { .. } => "require_approval",
    }
}

/// A verification's name, as `agentloop.verification.verdict` says it.
fn verified_name(verification: &Verification) -> &'static str {
    match verification {
        Verification::Accepted { .. } => "accepted",
        Verification::Rejected { .. } => "rejected",
    }
}
