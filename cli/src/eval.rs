//! `agentloop eval`: runs a suite of cases, each on an embedded stack of its own (its own
//! data directory, tools, policies and acceptance rules), concurrently, and judges each
//! run by its committed log and its effect ledger (`agentloop-eval`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::client::{self, RunOptions, Server};
use agentloop::exit;
use agentloop_decision::cassette::{Cassette, Replaying};
use agentloop_engine::{MicroUsd, TerminalReason};
use agentloop_eval::case::{self, Cancel, Crash, Human, Loaded, TransferFault};
use agentloop_eval::report::{self, Aggregate, Verdict};
use agentloop_eval::run::{Call, Effect, Outcome, Run};
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use futures::StreamExt;
use tokio_util::task::AbortOnDropHandle;

use crate::embedded::{self, Serving};

/// The longest one run may take before it is judged not run: a case without a deadline
/// whose model never stops must not hold the suite forever.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// Most pages of the effect ledger read per run (of 100 entries).
const MAX_EFFECT_PAGES: usize = 100;
/// How often a case that cancels while calls run asks whether one is in flight.
const CANCEL_POLL: Duration = Duration::from_millis(10);
/// A `transfer` that times out: its timeout, and how long its reply is held.
const TIMED_OUT_AFTER_MS: u64 = 200;
const TIMED_OUT_REPLY_MS: u64 = 5_000;
/// How long the demo executor holds a write's reply when a case crashes after it.
const HELD_REPLY_MS: u64 = 60_000;
/// Who replies for the case's humans, unless a token says.
const ACTOR: &str = "agentloop-eval";

type Orchestrator = OrchestratorServiceClient<Transport>;

/// What `eval` was asked.
#[derive(Debug)]
pub(crate) struct Eval {
    /// Case files and folders of them.
    pub(crate) suites: Vec<PathBuf>,
    /// The verdicts and the aggregate as one JSON document.
    pub(crate) json: bool,
    /// Where to write a JUnit XML report.
    pub(crate) junit: Option<PathBuf>,
    /// The pass rate (0 to 1) at which the command still exits 0.
    pub(crate) min_pass_rate: Option<f64>,
    /// Runs at once.
    pub(crate) jobs: usize,
    /// A running orchestrator and the caller's token, instead of a stack per case.
    pub(crate) server: Option<(String, Option<String>)>,
}

/// Runs the suite; the exit code is 0 when every run passed or the pass rate reached
/// `min_pass_rate`, 1 otherwise, 2 for a suite that cannot be read.
pub(crate) async fn eval(request: Eval) -> anyhow::Result<u8> {
    let started = Instant::now();
    let cases = match load(&request.suites, request.server.is_some()) {
        Ok(cases) => cases,
        Err(problems) => {
            for problem in problems {
                eprintln!("agentloop eval: {problem}");
            }
            return Ok(exit::USAGE);
        }
    };
    let runs: Vec<(&Loaded, u32)> = cases
        .iter()
        .flat_map(|case| (1..=case.case.repeat).map(move |run| (case, run)))
        .collect();
    let mut verdicts = Vec::with_capacity(runs.len());
    let mut judged = futures::stream::iter(runs)
        .map(|(case, run)| {
            let server = request.server.as_ref();
            async move {
                let observed = match server {
                    Some((endpoint, token)) => on_server(endpoint, token.as_deref(), case).await,
                    None => run_case(case).await,
                };
                Verdict::of(case, run, observed)
            }
        })
        .buffered(request.jobs.max(1));
    while let Some(verdict) = judged.next().await {
        if !request.json {
            println!("{}", report::line(&verdict));
        }
        verdicts.push(verdict);
    }
    let aggregate = Aggregate::of(&verdicts);
    if request.json {
        let document = serde_json::json!({"runs": verdicts, "aggregate": aggregate});
        println!("{}", serde_json::to_string_pretty(&document)?);
    } else {
        print!("\n{}", aggregate.text());
    }
    if let Some(path) = &request.junit {
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        std::fs::write(path, report::junit(&verdicts, elapsed))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    let enough = request
        .min_pass_rate
        .is_some_and(|minimum| aggregate.pass_rate >= minimum);
    Ok(if aggregate.passed == aggregate.runs || enough {
        0
    } else {
        exit::FAILURE
    })
}

/// Every case of the suites, or every problem found in them; on a `server`, a case that
/// needs the embedded stack is one.
fn load(suites: &[PathBuf], server: bool) -> Result<Vec<Loaded>, Vec<String>> {
    let files = case::files(suites).map_err(|e| vec![e.to_string()])?;
    if files.is_empty() {
        return Err(vec![
            "no case files (*.json) in the suites given".to_owned(),
        ]);
    }
    let mut problems = Vec::new();
    let mut cases = Vec::new();
    let mut names = BTreeSet::new();
    for file in files {
        match case::load(&file) {
            Ok(loaded) if !names.insert(loaded.case.name.clone()) => problems.push(format!(
                "{}: another case is named {:?}",
                file.display(),
                loaded.case.name
            )),
            Ok(loaded) if server && needs_embedded(&loaded.case) => problems.push(format!(
                "{}: it names tools, policies, acceptance rules, a model, a cassette or faults, which only the embedded stack of each case can take (not --server)",
                file.display()
            )),
            Ok(loaded) => cases.push(loaded),
            Err(error) => problems.push(error.to_string()),
        }
    }
    if problems.is_empty() {
        Ok(cases)
    } else {
        Err(problems)
    }
}

/// Whether `case` configures the stack it runs on.
fn needs_embedded(case: &case::Case) -> bool {
    case.tools.is_some()
        || !case.policies.is_empty()
        || case.acceptance.is_some()
        || case.cassette.is_some()
        || case.model.is_some()
        || case.faults.transfer.is_some()
        || case.faults.crash.is_some()
}

/// One run of `case` on the orchestrator at `endpoint`.
async fn on_server(endpoint: &str, token: Option<&str>, case: &Loaded) -> Result<Run, String> {
    let started = Instant::now();
    let orchestrator = connect(endpoint, token).await?;
    // With a token, the orchestrator takes the replying actor from it.
    let actor = if token.is_some() { "" } else { ACTOR };
    tokio::time::timeout(RUN_TIMEOUT, drive(orchestrator, case, None, actor, started))
        .await
        .unwrap_or_else(|_| Err(format!("it did not end within {} s", RUN_TIMEOUT.as_secs())))
}

/// One run of `case` on an embedded stack of its own, read back from its log, its ledger
/// and the demo executor's own record of the writes it applied.
async fn run_case(case: &Loaded) -> Result<Run, String> {
    let data = tempfile::tempdir().map_err(|e| format!("no data directory: {e}"))?;
    let started = Instant::now();
    let resumed = match case.case.faults.crash {
        Some(Crash::AfterWriteSent) => Some(crash_after_write_sent(case, data.path()).await?),
        None => None,
    };
    let (configuration, options) = configured(case, data.path(), false)?;
    let running = configuration
        .start(options)
        .await
        .map_err(|e| format!("the stack did not start: {e:#}"))?;
    let orchestrator = connect(&running.stack().endpoint(), None).await?;
    let observed = tokio::time::timeout(
        RUN_TIMEOUT,
        drive(orchestrator, case, resumed, ACTOR, started),
    )
    .await
    .unwrap_or_else(|_| Err(format!("it did not end within {} s", RUN_TIMEOUT.as_secs())));
    let stopped = running.stop().await;
    let mut observed = observed?;
    stopped.map_err(|e| format!("the stack did not stop: {e:#}"))?;
    if case.case.tools.is_none() {
        let record = agentloop_demo_executor::read_record(
            &data.path().join(agentloop_stack::DEMO_EXECUTOR_DIR),
        )
        .map_err(|e| format!("the demo executor's record: {e}"))?;
        observed.record = Some(
            record
                .into_iter()
                .filter(|applied| applied.invocation_id == observed.invocation_id)
                .map(|applied| applied.effect_key)
                .collect(),
        );
    }
    Ok(observed)
}

/// The stack `case` runs on, over `data`, configured but not started; with
/// `hold_replies`, the demo executor holds every write's reply after applying it.
fn configured(
    case: &Loaded,
    data: &std::path::Path,
    hold_replies: bool,
) -> Result<(embedded::Configuration, agentloop_stack::StackOptions), String> {
    let mut options = crate::embedded(
        data.to_owned(),
        case.case.tools.as_deref(),
        case.case.policies.clone(),
        case.case.acceptance.as_deref(),
    )
    .map_err(|e| format!("{e:#}"))?;
    let mut configuration = embedded::configure(Serving::local()).map_err(|e| format!("{e:#}"))?;
    let faults = &mut options.services.demo.faults;
    if hold_replies {
        faults.reply_delay_ms = HELD_REPLY_MS;
    }
    match case.case.faults.transfer {
        Some(TransferFault::FailsBeforeApply) => faults.fail_before_apply = 1.0,
        Some(TransferFault::LosesReply) => faults.drop_reply_after_apply = 1.0,
        Some(TransferFault::TimesOut) => {
            faults.reply_delay_ms = TIMED_OUT_REPLY_MS;
            options
                .services
                .demo_timeouts_ms
                .insert("transfer".to_owned(), TIMED_OUT_AFTER_MS);
        }
        None => {}
    }
    let model: Option<Arc<dyn agentloop_decision::Model>> =
        match (&case.case.cassette, &case.case.model) {
            (Some(path), _) => Some(Arc::new(Replaying::new(Cassette::load(path)?))),
            (None, Some(spec)) => {
                let price = match case.case.price {
                    Some([input, output]) => Some(
                        format!("{input},{output}")
                            .parse::<agentloop_decision::Price>()
                            .map_err(|e| format!("`price`: {e}"))?,
                    ),
                    None => None,
                };
                Some(crate::model::from_spec(spec, price).map_err(|e| format!("{e:#}"))?)
            }
            (None, None) => None,
        };
    if model.is_some() {
        // As `run` sets it for a real model (and for the one a cassette recorded).
        configuration.config.limits.decision_repairs = 1;
        options.services.model = model;
    }
    Ok((configuration, options))
}

/// Starts `case`'s invocation on a stack that runs on a runtime of its own, waits until
/// the demo executor has applied a write (its reply held back), and stops that runtime
/// dead: no task of that stack runs again, so the turn is never committed, as if its
/// process had been killed. Returns the invocation, which the next stack over `data`
/// resumes.
async fn crash_after_write_sent(case: &Loaded, data: &std::path::Path) -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("no runtime for the stack to crash: {e}"))?;
    let (configuration, options) = configured(case, data, true)?;
    let started = runtime.spawn(configuration.start(options)).await;
    match started {
        Ok(Ok(running)) => {
            let sent = send_a_write(&running, case).await;
            // Whatever came of it, nothing of that stack runs again.
            runtime.shutdown_background();
            drop(running);
            sent
        }
        Ok(Err(error)) => {
            runtime.shutdown_background();
            Err(format!("the stack to crash did not start: {error:#}"))
        }
        Err(error) => {
            runtime.shutdown_background();
            Err(format!("the stack to crash did not start: {error}"))
        }
    }
}

/// Starts `case`'s invocation on `running` and returns its ID once the demo executor
/// has applied a write of it.
async fn send_a_write(running: &embedded::Embedded, case: &Loaded) -> Result<String, String> {
    let mut applied = running.stack().demo_executor().watch_stats();
    let mut orchestrator = connect(&running.stack().endpoint(), None).await?;
    let id = start(&mut orchestrator, case).await?;
    let mut events = watch(&mut orchestrator, &id).await?;
    // A run that ends (or waits) without a write has nothing to crash after.
    let stops = async {
        while let Some(Ok(watched)) = events.next().await {
            if let Some(pb::event::Body::Ended(_)) = watched.event.and_then(|event| event.body) {
                break;
            }
        }
    };
    let sent = tokio::time::timeout(RUN_TIMEOUT, async {
        tokio::select! {
            applied = applied.wait_for(|stats| stats.applied > 0) => applied.is_ok(),
            () = stops => false,
        }
    });
    if sent.await.unwrap_or(false) {
        Ok(id)
    } else {
        Err("the run applied no write to crash after".to_owned())
    }
}

async fn connect(endpoint: &str, token: Option<&str>) -> Result<Orchestrator, String> {
    client::client(Server { endpoint, token })
        .await
        .map_err(|e| format!("{e:#}"))
}

/// The committed events of invocation `id`, from its first, as they come.
async fn watch(
    orchestrator: &mut Orchestrator,
    id: &str,
) -> Result<tonic::Streaming<pb::WatchInvocationResponse>, String> {
    Ok(orchestrator
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.to_owned(),
            from_seq: 1,
        })
        .await
        .map_err(refused("cannot watch the invocation"))?
        .into_inner())
}

/// Starts `case`'s invocation; its ID.
async fn start(orchestrator: &mut Orchestrator, case: &Loaded) -> Result<String, String> {
    let budgets = &case.case.budgets;
    let request = client::start_request(RunOptions {
        goal: case.case.goal.clone(),
        script: case.script.clone(),
        json: false,
        idempotency_key: None,
        max_steps: budgets.max_steps,
        max_tool_calls: budgets.max_tool_calls,
        max_repeated_plan: budgets.max_repeated_plan,
        deadline: budgets.deadline_ms.map(Duration::from_millis),
        max_cost: budgets.max_cost_usd.and_then(case::micro_usd).map(MicroUsd),
        max_wait: None,
        roles: Vec::new(),
    });
    Ok(orchestrator
        .start_invocation(request)
        .await
        .map_err(refused("the orchestrator refused the invocation"))?
        .into_inner()
        .invocation
        .ok_or("the orchestrator answered without an invocation")?
        .invocation_id)
}

fn refused(what: &str) -> impl Fn(tonic::Status) -> String + '_ {
    move |status| format!("{what}: {:?}: {}", status.code(), status.message())
}

/// Starts the case's invocation (or takes the one a crash left, `resumed`), follows it
/// to its end (giving the humans' replies as it waits), and reads what it did.
async fn drive(
    mut orchestrator: Orchestrator,
    case: &Loaded,
    resumed: Option<String>,
    actor: &str,
    started: Instant,
) -> Result<Run, String> {
    let id = match resumed {
        Some(id) => id,
        None => start(&mut orchestrator, case).await?,
    };
    let mut events = watch(&mut orchestrator, &id).await?;
    // Beside the watch, which must keep reading: a watcher that stops holds the run back.
    let canceller = (case.case.cancel == Some(Cancel::WhileCallsRun)).then(|| {
        AbortOnDropHandle::new(tokio::spawn(cancel_while_calls_run(
            orchestrator.clone(),
            id.clone(),
        )))
    });
    let mut humans = case.case.humans.iter();
    let mut log = Log::default();
    let end = loop {
        let event = events
            .next()
            .await
            .ok_or("the watch ended before the invocation did")?
            .map_err(refused("the watch failed"))?
            .event;
        let Some(body) = event.and_then(|event| event.body) else {
            continue;
        };
        let pb::event::Body::Ended(end) = body else {
            log.add(body);
            continue;
        };
        let reason = agentloop_wire::terminal_reason_from(end.reason())
            .ok_or("the invocation ended without a reason")?;
        if end.wait_until.is_none() {
            break (reason, end);
        }
        let Some(human) = humans.next() else {
            break (reason, end);
        };
        reply(&mut orchestrator, &id, actor, reason, &end, human).await?;
    };
    if let Some(canceller) = canceller {
        canceller
            .await
            .map_err(|e| format!("the cancel did not run: {e}"))??;
    }
    let invocation = client::get(&mut orchestrator, &id)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let usage = invocation.usage.unwrap_or_default();
    let (reason, end) = end;
    Ok(Run {
        invocation_id: id.clone(),
        record: None,
        reason,
        detail: end.detail,
        answer: end.answer,
        evidence: log.evidence,
        calls: log.calls,
        turns: usage.steps,
        tokens: usage.input_tokens.saturating_add(usage.output_tokens),
        cost_micro_usd: usage.cost_micro_usd,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        effects: effects(&mut orchestrator, &id).await?,
    })
}

/// Cancels invocation `id` once the orchestrator reports a call of it in flight,
/// asking every [`CANCEL_POLL`] up to [`RUN_TIMEOUT`].
async fn cancel_while_calls_run(mut orchestrator: Orchestrator, id: String) -> Result<(), String> {
    let until = Instant::now() + RUN_TIMEOUT;
    loop {
        let invocation = client::get(&mut orchestrator, &id)
            .await
            .map_err(|e| format!("{e:#}"))?;
        if invocation.calls_in_flight > 0 {
            break;
        }
        if invocation.state() == pb::InvocationState::Ended {
            return Err("the run ended before a call was in flight to cancel".to_owned());
        }
        if Instant::now() > until {
            return Err("no call was in flight to cancel".to_owned());
        }
        tokio::time::sleep(CANCEL_POLL).await;
    }
    orchestrator
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id,
            reason: "cancelled by the evaluation case".to_owned(),
        })
        .await
        .map_err(refused("the cancel was refused"))?;
    Ok(())
}

/// Gives a human's reply to the wait the run is in.
async fn reply(
    orchestrator: &mut Orchestrator,
    id: &str,
    actor: &str,
    reason: TerminalReason,
    end: &pb::InvocationEnded,
    human: &Human,
) -> Result<(), String> {
    let resolve = |verdict: pb::ApprovalVerdict, comment: &str| pb::ResolveApprovalRequest {
        invocation_id: id.to_owned(),
        proposal_digest: end.proposal_digest.clone(),
        verdict: verdict.into(),
        actor: actor.to_owned(),
        comment: comment.to_owned(),
    };
    match (reason, human) {
        (TerminalReason::ApprovalRequired, Human::Approve { comment }) => {
            orchestrator
                .resolve_approval(resolve(pb::ApprovalVerdict::Approve, comment))
                .await
                .map_err(refused("the approval was refused"))?;
        }
        (TerminalReason::ApprovalRequired, Human::Deny { comment }) => {
            orchestrator
                .resolve_approval(resolve(pb::ApprovalVerdict::Deny, comment))
                .await
                .map_err(refused("the denial was refused"))?;
        }
        (TerminalReason::ClarificationRequired, Human::Answer(answer)) => {
            orchestrator
                .answer_clarification(pb::AnswerClarificationRequest {
                    invocation_id: id.to_owned(),
                    answer: answer.clone(),
                    actor: actor.to_owned(),
                    // A tool's question takes the answer as its content, accepted.
                    action: pb::InputAction::Unspecified.into(),
                })
                .await
                .map_err(refused("the answer was refused"))?;
        }
        (reason, human) => {
            return Err(format!(
                "the run waits with {reason}, and the next human reply is {human:?}"
            ));
        }
    }
    Ok(())
}

/// The calls and the final answer's evidence, as the log shows them.
#[derive(Default)]
struct Log {
    calls: Vec<Call>,
    evidence: Vec<String>,
}

impl Log {
    fn add(&mut self, body: pb::event::Body) {
        let turn = match body {
            pb::event::Body::Turn(turn) | pb::event::Body::BatchStarted(turn) => turn,
            pb::event::Body::Ended(_)
            | pb::event::Body::ApprovalResolved(_)
            | pb::event::Body::ClarificationAnswered(_) => return,
        };
        let number = turn.turn;
        let proposed = match turn.decision.and_then(|decision| decision.kind) {
            Some(pb::decision::Kind::ToolCalls(batch)) => batch.calls,
            Some(pb::decision::Kind::RequestApproval(request)) => request.calls,
            Some(pb::decision::Kind::Final(answer)) => {
                self.evidence = answer.evidence;
                Vec::new()
            }
            Some(pb::decision::Kind::Clarification(_) | pb::decision::Kind::CannotContinue(_))
            | None => Vec::new(),
        };
        // A turn reopened by an approval is committed again with the same calls.
        for call in proposed {
            if self
                .calls
                .iter()
                .any(|known| known.turn == number && known.id == call.call_id)
            {
                continue;
            }
            self.calls.push(Call {
                turn: number,
                arguments: serde_json::from_str(&call.arguments_json)
                    .unwrap_or(serde_json::Value::Null),
                id: call.call_id,
                name: call.tool,
                outcome: Outcome::NotRun,
            });
        }
        for result in turn.results {
            let outcome = match result.outcome {
                Some(pb::tool_result::Outcome::Output(_)) => Outcome::Output,
                Some(pb::tool_result::Outcome::Error(_)) => Outcome::Error,
                Some(
                    pb::tool_result::Outcome::Cancelled(_)
                    | pb::tool_result::Outcome::NotStarted(_),
                ) => Outcome::Cancelled,
                Some(pb::tool_result::Outcome::Unknown(_)) => Outcome::Unknown,
                // Not finished: its turn is committed again once the person answers.
                Some(pb::tool_result::Outcome::InputRequired(_)) | None => Outcome::NotRun,
            };
            if let Some(call) = self
                .calls
                .iter_mut()
                .find(|call| call.turn == number && call.id == result.call_id)
            {
                call.outcome = outcome;
            }
        }
    }
}

/// The invocation's entries in the effect ledger.
async fn effects(orchestrator: &mut Orchestrator, id: &str) -> Result<Vec<Effect>, String> {
    let mut effects = Vec::new();
    let mut page_token = String::new();
    for _ in 0..MAX_EFFECT_PAGES {
        let page = orchestrator
            .list_effects(pb::ListEffectsRequest {
                invocation_id: id.to_owned(),
                page_size: 100,
                page_token,
            })
            .await
            .map_err(refused("cannot read the effect ledger"))?
            .into_inner();
        effects.extend(page.entries.into_iter().map(|entry| Effect {
            applied: entry.state() == pb::EffectState::Committed,
            call_id: entry.call_id,
            tool: entry.tool,
            key: entry.effect_key,
        }));
        if page.next_page_token.is_empty() {
            return Ok(effects);
        }
        page_token = page.next_page_token;
    }
    Err(format!(
        "the effect ledger holds more than {MAX_EFFECT_PAGES} pages for the run"
    ))
}
