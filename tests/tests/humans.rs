//! Human in the loop, end to end, each scenario in both wirings. An invocation that needs
//! an approval (the model's `request_approval`, or a tools-TOML `requires_approval` gate)
//! or an answer waits durably and shows exactly what it waits for. `ResolveApproval` and
//! `AnswerClarification` resume it: an approved write is applied exactly once by the
//! executor's own record, a denial runs nothing and the same proposal is never put to a
//! human again. Every refused reply (bad input, wrong digest, nothing waiting, a full
//! orchestrator, a caller without the approver role) writes nothing; of two concurrent
//! resolves exactly one wins. A cancel or the wait bound ends a wait; waiting does not
//! use up the deadline; a watcher follows a wait to the final end; a restart keeps the
//! wait, its bound and an approved run, and never applies a write twice.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::time::Duration;

use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use agentloop_stack::{Stack, StackOptions};
use futures::StreamExt;
use tonic::{Code, Status, Streaming};

both_wirings!(
    approve_applies_the_write_exactly_once,
    deny_runs_nothing_and_is_never_asked_again,
    a_full_orchestrator_refuses_a_reply_and_writes_nothing,
    a_clarification_answer_resumes_the_run,
    refused_replies_write_nothing,
    of_two_concurrent_resolves_exactly_one_wins,
    cancel_ends_a_wait_for_good,
    the_wait_bound_ends_a_wait,
    waiting_does_not_use_up_the_deadline,
    a_watcher_follows_a_wait_to_the_final_end,
    a_resolve_after_a_restart_resumes_the_invocation,
    a_policy_gated_tool_waits_and_runs_once_approved,
    with_authentication_the_approver_is_the_caller,
);

/// Turn 1 asks for an approval of one transfer (its arguments written out of canonical
/// order, with white space); turn 2 answers.
const APPROVE_THEN_FINAL: &str = r#"{"turns": [
  {"request_approval": {"summary": "move 42.00 from alice to bob", "calls": [
    {"id": "t1", "name": "transfer", "arguments": {"to": "bob",  "from": "alice", "amount": 4200}}]}},
  {"final": "moved"}]}"#;

/// The canonical form of the transfer's arguments above.
const CANONICAL_TRANSFER: &str = r#"{"amount":4200,"from":"alice","to":"bob"}"#;

/// The log (see [`shape`]) of a one-turn approval, approved, then completed on turn 2:
/// the approved calls run in the reopened turn 1, without asking the model.
const APPROVED: [&str; 7] = [
    "turn 1",
    "waiting TERMINAL_REASON_APPROVAL_REQUIRED",
    "resolved APPROVAL_VERDICT_APPROVE",
    "batch_started 1",
    "turn 1",
    "turn 2",
    "ended TERMINAL_REASON_COMPLETED",
];

/// The log of a one-turn approval, denied, after which turn 2 ends the invocation with
/// `end`.
fn denied_log(end: &'static str) -> [&'static str; 5] {
    [
        "turn 1",
        "waiting TERMINAL_REASON_APPROVAL_REQUIRED",
        "resolved APPROVAL_VERDICT_DENY",
        "turn 2",
        end,
    ]
}

/// The calls [`APPROVE_THEN_FINAL`] proposes, as an approver sees them: canonical.
fn proposed_transfer() -> [pb::ToolCall; 1] {
    [pb::ToolCall {
        call_id: "t1".into(),
        tool: "transfer".into(),
        arguments_json: CANONICAL_TRANSFER.into(),
    }]
}

/// Turn 1 asks a question; turn 2 answers.
const QUESTION: &str = r#"{"turns": [{"clarification": "Which one?"}, {"final": "ok"}]}"#;

/// The log of a question whose wait bound passed.
const QUESTION_EXPIRED: [&str; 3] = [
    "turn 1",
    "waiting TERMINAL_REASON_CLARIFICATION_REQUIRED",
    "ended TERMINAL_REASON_DEADLINE_EXCEEDED",
];

/// Turn 1 sleeps for a minute: the invocation runs while a test tries to reply to it.
const SLEEPING: &str =
    r#"{"turns": [{"tool_calls": [{"id": "s", "name": "sleep", "arguments": {"ms": 60000}}]}]}"#;

/// The rest of `stream`, to its end (bounded).
async fn read_to_the_end(stream: Streaming<pb::WatchInvocationResponse>) -> Vec<pb::Event> {
    tokio::time::timeout(
        PATIENCE,
        stream.map(|item| item.unwrap().event.unwrap()).collect(),
    )
    .await
    .expect("the watch never ended")
}

/// Starts an invocation that sleeps in turn 1; returns once its sleep has begun.
async fn start_sleeping(client: &mut Client, executor: &DemoExecutor) -> String {
    let mut stats = executor.watch_stats();
    let before = stats.borrow().sleeps_started;
    let id = start(client, start_request(SLEEPING)).await;
    stats
        .wait_for(|s| s.sleeps_started == before + 1)
        .await
        .unwrap();
    id
}

async fn cancel(client: &mut Client, id: &str, reason: &str) -> pb::Invocation {
    client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.into(),
            reason: reason.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
}

/// Resolves as `request` says, reads the log to the final end and checks it is
/// `expected` (`why` says what that shows); returns what the resolve answered and the
/// log.
async fn resolve_to_the_end(
    client: &mut Client,
    request: pb::ResolveApprovalRequest,
    expected: &[&str],
    why: &str,
) -> (pb::Invocation, Vec<pb::Event>) {
    let id = request.invocation_id.clone();
    let resumed = resolve(client, request).await.unwrap();
    let events = events_until_final_end(client, &id).await;
    assert_log(&events, expected, why);
    (resumed, events)
}

/// Approves `digest` of `id`, reads the log to the final end and checks it is
/// [`APPROVED`] (`why` says what that shows) and the invocation completed; returns what
/// the approval answered and the log.
async fn approve_to_completion(
    client: &mut Client,
    id: &str,
    digest: &str,
    why: &str,
) -> (pb::Invocation, Vec<pb::Event>) {
    let request = resolve_request(id, digest, pb::ApprovalVerdict::Approve);
    let (resumed, events) = resolve_to_the_end(client, request, &APPROVED, why).await;
    assert_eq!(
        reason_of(client, id).await,
        pb::TerminalReason::Completed,
        "{why}"
    );
    (resumed, events)
}

async fn answer(client: &mut Client, id: &str, text: &str) -> Result<pb::Invocation, Status> {
    Ok(client
        .answer_clarification(pb::AnswerClarificationRequest {
            invocation_id: id.into(),
            answer: text.into(),
            actor: "carol".into(),
            action: 0,
        })
        .await?
        .into_inner()
        .invocation
        .unwrap())
}

/// The invocations `ListInvocations` says wait.
async fn list_waiting(client: &mut Client) -> Vec<pb::Invocation> {
    client
        .list_invocations(pb::ListInvocationsRequest {
            state: pb::InvocationState::Waiting.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .invocations
}

/// The terminal reason of `id` now.
async fn reason_of(client: &mut Client, id: &str) -> pb::TerminalReason {
    reason(&get(client, id).await)
}

/// The kind of each event, and the turn number of turns and started batches.
fn shape(events: &[pb::Event]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event.body.as_ref().unwrap() {
            pb::event::Body::Turn(turn) => format!("turn {}", turn.turn),
            pb::event::Body::BatchStarted(turn) => format!("batch_started {}", turn.turn),
            pb::event::Body::Ended(end) if end.wait_until.is_some() => {
                format!("waiting {}", end.reason().as_str_name())
            }
            pb::event::Body::Ended(end) => format!("ended {}", end.reason().as_str_name()),
            pb::event::Body::ApprovalResolved(resolved) => {
                format!("resolved {}", resolved.verdict().as_str_name())
            }
            pb::event::Body::ClarificationAnswered(_) => "answered".into(),
        })
        .collect()
}

/// The kinds (see [`shape`]) of the events of `events` that start with `kind`.
fn kinds(events: &[pb::Event], kind: &str) -> Vec<String> {
    shape(events)
        .into_iter()
        .filter(|shown| shown.starts_with(kind))
        .collect()
}

fn assert_contiguous(events: &[pb::Event]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "seqs are contiguous from 1");
}

/// Checks that `events` is a whole log from seq 1, of the `expected` shape.
fn assert_log(events: &[pb::Event], expected: &[&str], why: &str) {
    assert_contiguous(events);
    assert_eq!(shape(events), expected, "{why}");
}

/// The resolution a log records third, after the turn and the wait.
fn resolution(events: &[pb::Event]) -> &pb::ApprovalResolved {
    let Some(pb::event::Body::ApprovalResolved(resolved)) = &events[2].body else {
        panic!("no resolution after the wait: {events:?}")
    };
    resolved
}

/// The answer a log records third, after the turn and the wait.
fn answered(events: &[pb::Event]) -> &pb::ClarificationAnswered {
    let Some(pb::event::Body::ClarificationAnswered(answered)) = &events[2].body else {
        panic!("no answer after the wait: {events:?}")
    };
    answered
}

fn millis(timestamp: &prost_types::Timestamp) -> i64 {
    timestamp.seconds * 1000 + i64::from(timestamp.nanos) / 1_000_000
}

fn seconds(seconds: i64) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos: 0 }
}

/// Runs `script` with a wait bound of `max_wait`.
fn bounded(script: &str, max_wait: prost_types::Duration) -> pb::StartInvocationRequest {
    let mut request = start_request(script);
    request.budget_overrides = Some(pb::BudgetOverrides {
        max_wait: Some(max_wait),
        ..Default::default()
    });
    request
}

/// Asks for an approval of a transfer, with a wait bound of an hour.
fn approval_request(script: &str) -> pb::StartInvocationRequest {
    bounded(script, seconds(3600))
}

async fn approve_applies_the_write_exactly_once(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let (id, events, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    assert_eq!(
        shape(&events),
        ["turn 1", "waiting TERMINAL_REASON_APPROVAL_REQUIRED"]
    );
    assert_eq!(end.reason(), pb::TerminalReason::ApprovalRequired);
    assert_eq!(end.proposal_digest.len(), 64, "{end:?}");
    system.stack().runtime().count_waiting().await.unwrap();
    assert_eq!(
        system.metric("agentloop_invocations_waiting{for=\"approval\"}"),
        Some(1.0)
    );

    // What an approver sees: the exact calls, canonical, under the digest to name.
    let waiting = get(&mut client, &id).await;
    assert_eq!(waiting.state(), pb::InvocationState::Waiting);
    assert_eq!(
        waiting.terminal_reason(),
        pb::TerminalReason::ApprovalRequired
    );
    let pending = waiting.pending_approval.clone().unwrap();
    assert_eq!(pending.proposal_digest, end.proposal_digest);
    assert_eq!(pending.summary, "move 42.00 from alice to bob");
    assert_eq!(pending.calls, proposed_transfer());
    assert_eq!(waiting.pending_question, None);
    let since = millis(waiting.waiting_since.as_ref().unwrap());
    let until = millis(waiting.wait_until.as_ref().unwrap());
    assert_eq!(until - since, 3_600_000, "the wait bound asked for");
    assert_eq!(Some(until), end.wait_until.as_ref().map(millis));
    let created = millis(waiting.created_at.as_ref().unwrap());
    assert!(since >= created, "{since} < {created}");
    assert_eq!(waiting.budget.unwrap().max_wait, Some(seconds(3600)));
    assert_eq!(waiting.last_seq, 2);
    assert!(
        applied_for(system.executor(), &id).is_empty(),
        "nothing runs while it waits"
    );
    let listed = list_waiting(&mut client).await;
    assert_eq!(
        listed,
        std::slice::from_ref(&waiting),
        "the waiting invocations, with their calls"
    );

    let (resumed, events) = approve_to_completion(
        &mut client,
        &id,
        &pending.proposal_digest,
        "the approved calls run in the reopened turn 1, without asking the model",
    )
    .await;
    assert_ne!(resumed.state(), pb::InvocationState::Waiting);
    assert!(resumed.pending_approval.is_none());
    assert!(resumed.waiting_since.is_none() && resumed.wait_until.is_none());
    let resolved = resolution(&events);
    assert_eq!(resolved.proposal_digest, pending.proposal_digest);
    assert_eq!(resolved.actor, "approver-1");
    assert!(resolved.waited.is_some());
    let Some(pb::event::Body::Turn(executed)) = &events[4].body else {
        unreachable!()
    };
    assert_eq!(executed.results.len(), 1);
    assert_eq!(executed.results[0].call_id, "t1");
    assert!(
        matches!(&executed.results[0].outcome, Some(pb::tool_result::Outcome::Output(o)) if o.output_json.contains("txn-")),
        "{executed:?}"
    );

    let ended = get(&mut client, &id).await;
    assert_eq!(ended.state(), pb::InvocationState::Ended);
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(ended.answer.as_deref(), Some("moved"));
    assert!(list_waiting(&mut client).await.is_empty());
    let usage = ended.usage.unwrap();
    assert_eq!((usage.steps, usage.tool_calls), (2, 1));
    let applied = applied_for(system.executor(), &id);
    assert_eq!(applied.len(), 1, "applied exactly once: {applied:?}");
    assert_eq!(
        (
            applied[0].from.as_str(),
            applied[0].to.as_str(),
            applied[0].amount
        ),
        ("alice", "bob", 4200)
    );
    assert_eq!(applied[0].call_id, "t1");
    let stats = system.executor().stats();
    assert_eq!((stats.applied, stats.deduplicated), (1, 0));
    system.stop().await;
}

async fn deny_runs_nothing_and_is_never_asked_again(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;

    // Denied, the model goes on without the transfer.
    let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    let mut request = resolve_request(&id, &end.proposal_digest, pb::ApprovalVerdict::Deny);
    request.comment = "too much for a Friday".into();
    let (_, events) = resolve_to_the_end(
        &mut client,
        request,
        &denied_log("ended TERMINAL_REASON_COMPLETED"),
        "denied, the model is asked again",
    )
    .await;
    assert_eq!(resolution(&events).comment, "too much for a Friday");
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(ended.answer.as_deref(), Some("moved"), "as the script says");
    assert_eq!(ended.usage.unwrap().tool_calls, 0);
    assert!(applied_for(system.executor(), &id).is_empty());

    // The same calls proposed again (other call ID, same digest): refused, not put to a
    // human again.
    let again = r#"{"turns": [
      {"request_approval": {"summary": "move it", "calls": [
        {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
      {"request_approval": {"summary": "please, move it", "calls": [
        {"id": "t2", "name": "transfer", "arguments": {"amount": 4200, "to": "bob", "from": "alice"}}]}},
      {"final": "unreachable"}]}"#;
    let (id, _, end) = start_waiting(&mut client, approval_request(again)).await;
    let request = resolve_request(&id, &end.proposal_digest, pb::ApprovalVerdict::Deny);
    let (_, events) = resolve_to_the_end(
        &mut client,
        request,
        &denied_log("ended TERMINAL_REASON_INVALID_DECISION"),
        "the denied proposal again is an invalid decision",
    )
    .await;
    let ended = get(&mut client, &id).await;
    assert!(
        ended.terminal_detail.contains("denied"),
        "{}",
        ended.terminal_detail
    );
    assert!(turns(&events)[1].rejection.is_some());
    assert!(applied_for(system.executor(), &id).is_empty());
    assert_eq!(system.executor().stats().applied, 0);

    // Denied, the model proposes something else: that is put to a human, and approved
    // it runs in its own reopened turn.
    let smaller = r#"{"turns": [
      {"request_approval": {"summary": "move 42.00", "calls": [
        {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
      {"request_approval": {"summary": "move 10.00 instead", "calls": [
        {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 1000}}]}},
      {"final": "moved 10.00"}]}"#;
    let (id, _, first) = start_waiting(&mut client, approval_request(smaller)).await;
    let request = resolve_request(&id, &first.proposal_digest, pb::ApprovalVerdict::Deny);
    resolve(&mut client, request).await.unwrap();
    let mut stream = watch(&mut client, &id).await;
    // The first wait, then the second.
    read_until_waiting(&mut stream).await;
    let (_, second) = read_until_waiting(&mut stream).await;
    assert_ne!(second.proposal_digest, first.proposal_digest);
    let waiting = get(&mut client, &id).await;
    let pending = waiting.pending_approval.unwrap();
    assert_eq!(pending.summary, "move 10.00 instead");
    assert_eq!(
        pending.calls[0].arguments_json,
        r#"{"amount":1000,"from":"alice","to":"bob"}"#
    );
    // The denied digest is not the pending one any more.
    let stale = approve(&mut client, &id, &first.proposal_digest).await;
    assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition);
    let request = resolve_request(&id, &second.proposal_digest, pb::ApprovalVerdict::Approve);
    resolve_to_the_end(
        &mut client,
        request,
        &[
            "turn 1",
            "waiting TERMINAL_REASON_APPROVAL_REQUIRED",
            "resolved APPROVAL_VERDICT_DENY",
            "turn 2",
            "waiting TERMINAL_REASON_APPROVAL_REQUIRED",
            "resolved APPROVAL_VERDICT_APPROVE",
            "batch_started 2",
            "turn 2",
            "turn 3",
            "ended TERMINAL_REASON_COMPLETED",
        ],
        "the other proposal, approved, runs in the reopened turn 2",
    )
    .await;
    let applied = applied_for(system.executor(), &id);
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].amount, 1000, "only the approved proposal ran");
    assert_eq!(
        get(&mut client, &id).await.answer.as_deref(),
        Some("moved 10.00")
    );
    system.stop().await;
}

/// Every slot taken, a reply that this orchestrator could not run is refused
/// (RESOURCE_EXHAUSTED) before anything is written; once a slot frees, it is taken.
async fn a_full_orchestrator_refuses_a_reply_and_writes_nothing(wiring: Wiring) {
    let mut config = OrchestratorConfig::default();
    config.bounds.max_running = 1;
    let system = System::start(wiring, config).await;
    let (mut client, mut checker) = (system.client().await, system.client().await);
    let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    // Waiting, it holds no slot: another invocation can run, once the run that began
    // the wait has let its slot go (a moment after the commit, with nothing to await).
    let mut stats = system.executor().watch_stats();
    let mut sleeper = None;
    for _ in 0..100 {
        match client.start_invocation(start_request(SLEEPING)).await {
            Ok(response) => {
                sleeper = Some(response.into_inner().invocation.unwrap().invocation_id);
                break;
            }
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    let sleeper = sleeper.expect("the waiting invocation keeps its slot");
    stats.wait_for(|s| s.sleeps_started == 1).await.unwrap();
    refused(
        &mut checker,
        &id,
        approve(&mut client, &id, &end.proposal_digest),
        Code::ResourceExhausted,
        "full",
    )
    .await;
    assert_eq!(
        get(&mut client, &id).await.state(),
        pb::InvocationState::Waiting
    );
    cancel(&mut client, &sleeper, "make room").await;
    events_until_final_end(&mut client, &sleeper).await;
    approve_to_completion(
        &mut client,
        &id,
        &end.proposal_digest,
        "once a slot freed, the approval is taken",
    )
    .await;
    assert_eq!(applied_for(system.executor(), &id).len(), 1);
    system.stop().await;
}

async fn a_clarification_answer_resumes_the_run(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [
      {"clarification": "Which account should the refund go to?"},
      {"final": "refunded to savings"}]}"#;
    let (id, events, end) = start_waiting(&mut client, start_request(script)).await;
    assert_eq!(
        shape(&events),
        ["turn 1", "waiting TERMINAL_REASON_CLARIFICATION_REQUIRED"]
    );
    assert!(end.proposal_digest.is_empty());
    let waiting = get(&mut client, &id).await;
    assert_eq!(waiting.state(), pb::InvocationState::Waiting);
    assert_eq!(
        waiting.terminal_reason(),
        pb::TerminalReason::ClarificationRequired
    );
    assert_eq!(
        waiting.pending_question.as_deref(),
        Some("Which account should the refund go to?")
    );
    assert!(waiting.pending_approval.is_none());
    assert!(waiting.waiting_since.is_some() && waiting.wait_until.is_some());
    system.stack().runtime().count_waiting().await.unwrap();
    let waiting_for =
        |what: &str| system.metric(&format!("agentloop_invocations_waiting{{for=\"{what}\"}}"));
    assert_eq!(waiting_for("clarification"), Some(1.0));
    assert_eq!(waiting_for("approval"), Some(0.0));

    let resumed = answer(&mut client, &id, "savings, please").await.unwrap();
    assert_ne!(resumed.state(), pb::InvocationState::Waiting);
    assert_eq!(resumed.pending_question, None);
    let events = events_until_final_end(&mut client, &id).await;
    assert_log(
        &events,
        &[
            "turn 1",
            "waiting TERMINAL_REASON_CLARIFICATION_REQUIRED",
            "answered",
            "turn 2",
            "ended TERMINAL_REASON_COMPLETED",
        ],
        "the answer resumes the run at turn 2",
    );
    let answered = answered(&events);
    assert_eq!(answered.answer, "savings, please");
    assert_eq!(answered.actor, "carol");
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(ended.answer.as_deref(), Some("refunded to savings"));
    system.stack().runtime().count_waiting().await.unwrap();
    assert_eq!(waiting_for("clarification"), Some(0.0));
    system.stop().await;
}

/// Checks that `call` is refused with `code` and that the invocation's log did not move
/// (read through `checker`, before and after).
async fn refused<T: std::fmt::Debug>(
    checker: &mut Client,
    id: &str,
    call: impl Future<Output = Result<T, Status>>,
    code: Code,
    case: &str,
) {
    let before = get(checker, id).await;
    let status = call.await.expect_err(case);
    assert_eq!(status.code(), code, "{case}: {status:?}");
    let after = get(checker, id).await;
    assert_eq!(after.last_seq, before.last_seq, "{case}: nothing written");
    assert_eq!(after.state, before.state, "{case}");
}

/// Checks that approving `digest` of `id` is refused, as nothing there waits for an
/// approval, and writes nothing.
async fn approval_refused(
    client: &mut Client,
    checker: &mut Client,
    id: &str,
    digest: &str,
    case: &str,
) {
    let approval = approve(client, id, digest);
    refused(checker, id, approval, Code::FailedPrecondition, case).await;
}

/// Checks that an answer to `id` is refused, as nothing there waits for one, and writes
/// nothing.
async fn answer_refused(client: &mut Client, checker: &mut Client, id: &str, case: &str) {
    let answer = answer(client, id, "yes");
    refused(checker, id, answer, Code::FailedPrecondition, case).await;
}

async fn refused_replies_write_nothing(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let (mut client, mut checker) = (system.client().await, system.client().await);
    let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    let digest = end.proposal_digest.clone();
    let other_digest = if digest.starts_with('0') {
        "1".repeat(64)
    } else {
        "0".repeat(64)
    };
    let waiting = get(&mut client, &id).await;

    let mut no_actor = resolve_request(&id, &digest, pb::ApprovalVerdict::Approve);
    no_actor.actor = String::new();
    let cases = [
        (no_actor, Code::InvalidArgument, "no actor"),
        (
            resolve_request(&id, &digest, pb::ApprovalVerdict::Unspecified),
            Code::InvalidArgument,
            "unspecified verdict",
        ),
        (
            resolve_request(&id, &other_digest, pb::ApprovalVerdict::Approve),
            Code::FailedPrecondition,
            "another digest",
        ),
        (
            resolve_request(&id, &"g".repeat(64), pb::ApprovalVerdict::Approve),
            Code::InvalidArgument,
            "not a digest",
        ),
        (
            resolve_request(&id, "", pb::ApprovalVerdict::Approve),
            Code::InvalidArgument,
            "no digest",
        ),
        (
            pb::ResolveApprovalRequest {
                comment: "x".repeat(64 * 1024),
                ..resolve_request(&id, &digest, pb::ApprovalVerdict::Deny)
            },
            Code::InvalidArgument,
            "oversized comment",
        ),
    ];
    for (request, code, case) in cases {
        refused(&mut checker, &id, resolve(&mut client, request), code, case).await;
    }
    // An answer to an invocation that waits for an approval.
    answer_refused(&mut client, &mut checker, &id, "an answer").await;
    let unknown = approve(&mut client, "0190a000-0000-7000-8000-000000000000", &digest).await;
    assert_eq!(unknown.unwrap_err().code(), Code::NotFound);
    let still = get(&mut client, &id).await;
    assert_eq!(still, waiting, "every refusal left the wait as it was");

    // Resolved once: a second resolve, of either verdict, finds nothing to resolve.
    approve(&mut client, &id, &digest).await.unwrap();
    let again = resolve(
        &mut client,
        resolve_request(&id, &digest, pb::ApprovalVerdict::Deny),
    )
    .await;
    assert_eq!(
        again.unwrap_err().code(),
        Code::FailedPrecondition,
        "resolved already"
    );
    let events = events_until_final_end(&mut client, &id).await;
    assert_eq!(kinds(&events, "resolved").len(), 1, "one resolution");
    // Completed: nothing waits.
    for verdict in [pb::ApprovalVerdict::Approve, pb::ApprovalVerdict::Deny] {
        refused(
            &mut checker,
            &id,
            resolve(&mut client, resolve_request(&id, &digest, verdict)),
            Code::FailedPrecondition,
            "completed",
        )
        .await;
    }
    assert_eq!(applied_for(system.executor(), &id).len(), 1);

    // Running: nothing waits either.
    let running = start_sleeping(&mut client, system.executor()).await;
    approval_refused(&mut client, &mut checker, &running, &digest, "running").await;
    answer_refused(&mut client, &mut checker, &running, "running").await;
    cancel(&mut client, &running, "done testing").await;
    events_until_final_end(&mut client, &running).await;

    // A question: an empty or oversized answer, or an approval, is refused.
    let (question, ..) = start_waiting(&mut client, start_request(QUESTION)).await;
    for (text, case) in [("", "empty answer"), ("   ", "blank answer")] {
        refused(
            &mut checker,
            &question,
            answer(&mut client, &question, text),
            Code::InvalidArgument,
            case,
        )
        .await;
    }
    refused(
        &mut checker,
        &question,
        answer(&mut client, &question, &"x".repeat(64 * 1024)),
        Code::InvalidArgument,
        "oversized",
    )
    .await;
    approval_refused(&mut client, &mut checker, &question, &digest, "an approval").await;
    // The model's question takes words, not a tool's input.
    let accepted = client.answer_clarification(pb::AnswerClarificationRequest {
        invocation_id: question.clone(),
        answer: "{}".into(),
        actor: "carol".into(),
        action: pb::InputAction::Accept.into(),
    });
    refused(
        &mut checker,
        &question,
        accepted,
        Code::FailedPrecondition,
        "a tool's input",
    )
    .await;
    answer(&mut client, &question, "the first").await.unwrap();
    let again = answer(&mut client, &question, "the second").await;
    assert_eq!(
        again.unwrap_err().code(),
        Code::FailedPrecondition,
        "answered already"
    );
    let events = events_until_final_end(&mut client, &question).await;
    assert_eq!(kinds(&events, "answered").len(), 1, "one answer");
    system.stop().await;
}

async fn of_two_concurrent_resolves_exactly_one_wins(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let mut other = system.client().await;
    for round in 0..4 {
        let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
        let digest = &end.proposal_digest;
        // Opposite verdicts, so the log shows which one won.
        let (first, second) = tokio::join!(
            approve(&mut client, &id, digest),
            resolve(
                &mut other,
                resolve_request(&id, digest, pb::ApprovalVerdict::Deny)
            ),
        );
        let (winner, status) = match (first, second) {
            (Ok(_), Err(status)) => (pb::ApprovalVerdict::Approve, status),
            (Err(status), Ok(_)) => (pb::ApprovalVerdict::Deny, status),
            (first, second) => panic!("{round}: not exactly one winner: {first:?} / {second:?}"),
        };
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{round}: {status:?}"
        );
        let events = events_until_final_end(&mut client, &id).await;
        assert_contiguous(&events);
        let resolutions = kinds(&events, "resolved");
        assert_eq!(resolutions.len(), 1, "{round}: one resolution committed");
        assert_eq!(
            resolutions[0],
            format!("resolved {}", winner.as_str_name()),
            "{round}: the one that answered OK"
        );
        let applied = applied_for(system.executor(), &id).len();
        let expected = usize::from(winner == pb::ApprovalVerdict::Approve);
        assert_eq!(
            applied, expected,
            "{round}: applied once if approved, else never"
        );
        assert_eq!(
            reason_of(&mut client, &id).await,
            pb::TerminalReason::Completed
        );
    }
    system.stop().await;
}

async fn cancel_ends_a_wait_for_good(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let (mut client, mut checker) = (system.client().await, system.client().await);
    let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    let cancelled = cancel(&mut client, &id, "the customer withdrew the request").await;
    // At once: nothing runs that would have to stop first.
    assert_eq!(cancelled.state(), pb::InvocationState::Ended);
    assert_eq!(reason(&cancelled), pb::TerminalReason::Cancelled);
    assert_eq!(
        cancelled.terminal_detail,
        "the customer withdrew the request"
    );
    assert!(cancelled.pending_approval.is_none() && cancelled.wait_until.is_none());

    let events = events_until_final_end(&mut client, &id).await;
    assert_log(
        &events,
        &[
            "turn 1",
            "waiting TERMINAL_REASON_APPROVAL_REQUIRED",
            "ended TERMINAL_REASON_CANCELLED",
        ],
        "the cancel ends the wait",
    );
    let Some(pb::event::Body::Ended(last)) = &events[2].body else {
        unreachable!()
    };
    assert_eq!(last.detail, "the customer withdrew the request");
    approval_refused(
        &mut client,
        &mut checker,
        &id,
        &end.proposal_digest,
        "cancelled",
    )
    .await;
    // Cancelling again changes nothing.
    let again = cancel(&mut client, &id, "again").await;
    assert_eq!(again.terminal_detail, "the customer withdrew the request");
    assert_eq!(again.last_seq, 3);
    assert!(applied_for(system.executor(), &id).is_empty());

    // A clarification too, and a running invocation's cancel reason is its detail.
    let (question, ..) = start_waiting(&mut client, start_request(QUESTION)).await;
    cancel(&mut client, &question, "").await;
    let ended = get(&mut client, &question).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Cancelled);
    assert!(!ended.terminal_detail.is_empty(), "a default detail");
    answer_refused(&mut client, &mut checker, &question, "cancelled").await;

    let running = start_sleeping(&mut client, system.executor()).await;
    cancel(&mut client, &running, "operator: stop the sleeper").await;
    events_until_final_end(&mut client, &running).await;
    let ended = get(&mut client, &running).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Cancelled);
    assert_eq!(ended.terminal_detail, "operator: stop the sleeper");
    system.stop().await;
}

async fn the_wait_bound_ends_a_wait(wiring: Wiring) {
    let mut config = OrchestratorConfig::default();
    config.limits.wait_sweep_ms = 100;
    let system = System::start(wiring, config).await;
    let (mut client, mut checker) = (system.client().await, system.client().await);
    let id = start(&mut client, bounded(APPROVE_THEN_FINAL, seconds(1))).await;
    let mut stream = watch(&mut client, &id).await;
    let (_, waiting) = read_until_waiting(&mut stream).await;
    // The rest of the same stream: the final end, then the stream is over.
    let rest = read_to_the_end(stream).await;
    assert_eq!(shape(&rest), ["ended TERMINAL_REASON_DEADLINE_EXCEEDED"]);
    let Some(pb::event::Body::Ended(end)) = &rest[0].body else {
        unreachable!()
    };
    assert!(end.wait_until.is_none());
    assert!(
        end.detail.contains("approval") && end.detail.contains(&waiting.proposal_digest),
        "the detail says what it waited for: {}",
        end.detail
    );
    assert!(
        millis(rest[0].committed_at.as_ref().unwrap())
            >= millis(waiting.wait_until.as_ref().unwrap()),
        "not before the bound"
    );
    let ended = get(&mut client, &id).await;
    assert_eq!(ended.state(), pb::InvocationState::Ended);
    assert_eq!(reason(&ended), pb::TerminalReason::DeadlineExceeded);
    approval_refused(
        &mut client,
        &mut checker,
        &id,
        &waiting.proposal_digest,
        "expired",
    )
    .await;
    assert!(applied_for(system.executor(), &id).is_empty());

    // A bound of nothing, or past `bounds.max_wait_cap_ms`, is refused.
    for bound in [0, 31 * 24 * 3600] {
        let request = bounded(APPROVE_THEN_FINAL, seconds(bound));
        let status = client.start_invocation(request).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{bound} s: {status:?}"
        );
    }

    // A question: the detail quotes it.
    let script = r#"{"turns": [{"clarification": "Which colour?"}, {"final": "ok"}]}"#;
    let half_a_second = prost_types::Duration {
        seconds: 0,
        nanos: 500_000_000,
    };
    let question = start(&mut client, bounded(script, half_a_second)).await;
    let events = events_until_final_end(&mut client, &question).await;
    assert_log(
        &events,
        &QUESTION_EXPIRED,
        "the bound ends the question's wait",
    );
    let ended = get(&mut client, &question).await;
    assert!(
        ended.terminal_detail.contains("Which colour?"),
        "{}",
        ended.terminal_detail
    );
    system.stop().await;
}

/// A deadline of 1 s and an answer after 1.5 s: by default the wait does not count, so
/// the resumed run completes; with `limits.wait_counts_toward_deadline` it is past its
/// deadline as soon as it resumes. (The sleep lets time pass; it synchronises nothing.)
async fn waiting_does_not_use_up_the_deadline(wiring: Wiring) {
    let script = r#"{"turns": [
      {"clarification": "Which key?"},
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"final": "profile=active"}]}"#;
    for counts in [false, true] {
        let mut config = OrchestratorConfig::default();
        config.limits.wait_counts_toward_deadline = counts;
        let system = System::start(wiring, config).await;
        let mut client = system.client().await;
        let mut request = start_request(script);
        request.budget_overrides = Some(pb::BudgetOverrides {
            deadline: Some(seconds(1)),
            max_wait: Some(seconds(60)),
            ..Default::default()
        });
        let (id, ..) = start_waiting(&mut client, request).await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        answer(&mut client, &id, "profile").await.unwrap();
        events_until_final_end(&mut client, &id).await;
        let ended = get(&mut client, &id).await;
        let expected = if counts {
            pb::TerminalReason::DeadlineExceeded
        } else {
            pb::TerminalReason::Completed
        };
        assert_eq!(reason(&ended), expected, "counts={counts}: {ended:?}");
        system.stop().await;
    }
}

async fn a_watcher_follows_a_wait_to_the_final_end(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let id = start(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    // Attached before the wait.
    let mut watcher = system.client().await;
    let mut stream = watch(&mut watcher, &id).await;
    let (mut seen, end) = read_until_waiting(&mut stream).await;
    // A watch from beyond the next event of a waiting invocation is refused: no watcher
    // saw that event, and a stream waiting for it would miss an end before it.
    let Err(beyond) = watch_from(&mut watcher, &id, 4).await else {
        panic!("a watch from beyond the next event was accepted");
    };
    assert_eq!(beyond.code(), Code::OutOfRange, "{beyond:?}");
    // Another client resolves.
    let mut approver = system.client().await;
    approve(&mut approver, &id, &end.proposal_digest)
        .await
        .unwrap();
    seen.extend(read_to_the_end(stream).await);
    assert_log(
        &seen,
        &APPROVED,
        "the stream ended at the final end, and only there",
    );
    // A watch from past the waiting end sees only what followed it.
    let later = read_to_the_end(watch_from(&mut client, &id, 3).await.unwrap()).await;
    assert_eq!(later.first().map(|e| e.seq), Some(3));
    assert_eq!(later.len(), 5);
    system.stop().await;
}

async fn a_resolve_after_a_restart_resumes_the_invocation(wiring: Wiring) {
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut options = StackOptions {
        wiring,
        ..StackOptions::embedded(dir.path().join("data"))
    };
    // A stop cancels running calls after 50 ms.
    options.orchestrator.limits.drain_timeout_ms = 50;
    let stack = Stack::start(options.clone()).await.unwrap();
    let mut client = client_of(&stack).await;
    let (id, _, end) = start_waiting(&mut client, approval_request(APPROVE_THEN_FINAL)).await;
    let before = get(&mut client, &id).await;
    // And a question whose wait bound (1 s) passes while the server may be down.
    let (question, ..) = start_waiting(&mut client, bounded(QUESTION, seconds(1))).await;
    stack.stop().await.unwrap();

    let stack = Stack::start(options.clone()).await.unwrap();
    let mut client = client_of(&stack).await;
    let after = get(&mut client, &id).await;
    assert_eq!(after, before, "the wait survived the restart as it was");
    assert_eq!(after.state(), pb::InvocationState::Waiting);
    let events = events_until_final_end(&mut client, &question).await;
    assert_log(
        &events,
        &QUESTION_EXPIRED,
        "the bound holds across the restart",
    );
    approve_to_completion(
        &mut client,
        &id,
        &end.proposal_digest,
        "approved after a restart, it runs as approved before one",
    )
    .await;
    assert_eq!(applied_for(stack.demo_executor(), &id).len(), 1);
    stack.stop().await.unwrap();

    // And once more: nothing runs again after a restart of a completed invocation.
    let stack = Stack::start(options.clone()).await.unwrap();
    let mut client = client_of(&stack).await;
    assert_eq!(get(&mut client, &id).await.last_seq, 7);
    assert_eq!(applied_for(stack.demo_executor(), &id).len(), 1);

    // A stop while the approved batch runs (its transfer applied, its sleep running):
    // the turn is committed with what ran, and the next start goes on from there
    // without running anything of it again.
    let script = r#"{"turns": [
      {"request_approval": {"summary": "move, then wait", "calls": [
        {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}},
        {"id": "s1", "name": "sleep", "arguments": {"ms": 60000}}]}},
      {"final": "moved"}]}"#;
    let (id, _, end) = start_waiting(&mut client, approval_request(script)).await;
    let mut stats = stack.demo_executor().watch_stats();
    approve(&mut client, &id, &end.proposal_digest)
        .await
        .unwrap();
    stats.wait_for(|s| s.sleeps_started == 1).await.unwrap();
    stack.stop().await.unwrap();
    let stack = Stack::start(options).await.unwrap();
    let mut client = client_of(&stack).await;
    let events = events_until_final_end(&mut client, &id).await;
    assert_log(
        &events,
        &APPROVED,
        "the interrupted batch is committed, then the run goes on",
    );
    let executed = turns(&events)[1];
    assert!(
        matches!(
            executed.results[1].outcome,
            Some(pb::tool_result::Outcome::Cancelled(_))
        ),
        "{executed:?}"
    );
    assert_eq!(
        reason_of(&mut client, &id).await,
        pb::TerminalReason::Completed
    );
    assert_eq!(applied_for(stack.demo_executor(), &id).len(), 1);
    stack.stop().await.unwrap();
}

/// A tools TOML whose `transfer` has `requires_approval = true`, both tools served by
/// `endpoint`.
fn gated_tools(endpoint: &str) -> agentloop_tools::ToolsConfig {
    let text = format!(
        r#"
[[tools]]
name = "lookup"
endpoint = "{endpoint}"
description = "Looks up a value by key."
side_effect = "read_only"
timeout_ms = 5000
input_schema = '{{"type": "object", "properties": {{"key": {{"type": "string"}}}}, "required": ["key"]}}'

[[tools]]
name = "transfer"
endpoint = "{endpoint}"
description = "Moves an amount (in cents) from one account to another."
side_effect = "write"
requires_approval = true
timeout_ms = 10000
input_schema = '{{"type": "object", "properties": {{"from": {{"type": "string"}}, "to": {{"type": "string"}}, "amount": {{"type": "integer", "minimum": 1}}}}, "required": ["from", "to", "amount"], "additionalProperties": false}}'
"#
    );
    agentloop_tools::ToolsConfig::parse(&text).unwrap()
}

async fn a_policy_gated_tool_waits_and_runs_once_approved(wiring: Wiring) {
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    // A demo executor of its own, which the tools TOML names by its endpoint.
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.path().join("executor"),
        ..DemoConfig::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(agentloop_demo_executor::run(
        listener,
        executor.clone(),
        agentloop_server::Access::default(),
        std::future::pending(),
    ));
    let mut options = StackOptions {
        wiring,
        ..StackOptions::embedded(dir.path().join("data"))
    };
    options.services.tools = Some(gated_tools(&endpoint));
    let stack = Stack::start(options).await.unwrap();
    let mut client = client_of(&stack).await;

    // Plain tool calls: the model does not ask, policy does.
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "t1", "name": "transfer", "arguments": {"to": "bob", "from": "alice", "amount": 4200}}]},
      {"final": "moved"}]}"#;
    let (id, events, end) = start_waiting(&mut client, start_request(script)).await;
    assert_eq!(
        shape(&events),
        ["turn 1", "waiting TERMINAL_REASON_APPROVAL_REQUIRED"]
    );
    let waiting = get(&mut client, &id).await;
    assert_eq!(waiting.state(), pb::InvocationState::Waiting);
    let pending = waiting.pending_approval.unwrap();
    assert_eq!(pending.proposal_digest, end.proposal_digest);
    assert!(!pending.summary.is_empty(), "policy says why");
    assert_eq!(pending.calls, proposed_transfer());
    assert!(applied_for(&executor, &id).is_empty());

    approve_to_completion(
        &mut client,
        &id,
        &pending.proposal_digest,
        "the gate a human passed does not stop the approved calls again",
    )
    .await;
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(ended.answer.as_deref(), Some("moved"));
    assert_eq!(applied_for(&executor, &id).len(), 1);
    assert_eq!(executor.stats().applied, 1);

    // A lookup is not gated.
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"final": "active"}]}"#;
    let (invocation, _) = run_to_end(&mut client, start_request(script)).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::Completed);
    stack.stop().await.unwrap();
    served.abort();
}

/// With `[auth]` on, the recorded approver and answerer are the verified callers: naming
/// someone else, or lacking the approver role, is PERMISSION_DENIED; another tenant does
/// not see the invocation; none of them writes anything.
async fn with_authentication_the_approver_is_the_caller(wiring: Wiring) {
    use agentloop_auth::testing::{Alg, TokenIssuer};
    let issuer = TokenIssuer::new(Alg::Hs256);
    let keys = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.server.auth = issuer.write_key_source(keys.path());
    let system = System::start(wiring, config).await;
    let as_token = |token: String| {
        let endpoint = system.stack().endpoint();
        async move {
            let transport = agentloop_stack::channel_as(&endpoint, Some(&token))
                .await
                .unwrap();
            agentloop_proto::client::orchestrator(transport)
        }
    };
    let mut alice = as_token(issuer.token("alice", "acme", &[])).await;
    let mut bob = as_token(issuer.token("bob", "acme", &["approver"])).await;
    let mallory = as_token(issuer.token("mallory", "other", &["approver"])).await;

    let (id, _, end) = start_waiting(&mut alice, approval_request(APPROVE_THEN_FINAL)).await;
    let digest = end.proposal_digest.clone();
    let approve_as = |actor: &str| {
        let mut request = resolve_request(&id, &digest, pb::ApprovalVerdict::Approve);
        request.actor = actor.into();
        request
    };
    let refusals = [
        (
            alice.clone(),
            "",
            Code::PermissionDenied,
            "no approver role",
        ),
        (
            bob.clone(),
            "carol",
            Code::PermissionDenied,
            "another actor named",
        ),
        (mallory, "", Code::NotFound, "another tenant"),
    ];
    for (mut caller, actor, code, case) in refusals {
        let approval = resolve(&mut caller, approve_as(actor));
        refused(&mut alice.clone(), &id, approval, code, case).await;
    }
    resolve(&mut bob, approve_as("")).await.unwrap();
    let events = events_until_final_end(&mut alice, &id).await;
    assert_eq!(
        resolution(&events).actor,
        "bob",
        "the verified caller approved"
    );
    assert_eq!(
        reason_of(&mut alice, &id).await,
        pb::TerminalReason::Completed
    );
    assert_eq!(applied_for(system.executor(), &id).len(), 1);

    // An answer is recorded under its caller too.
    let (question, ..) = start_waiting(&mut alice, start_request(QUESTION)).await;
    let answered_by_alice = alice
        .answer_clarification(pb::AnswerClarificationRequest {
            invocation_id: question.clone(),
            answer: "the first".into(),
            actor: String::new(),
            action: 0,
        })
        .await;
    answered_by_alice.unwrap();
    let events = events_until_final_end(&mut alice, &question).await;
    assert_eq!(answered(&events).actor, "alice");
    system.stop().await;
}
