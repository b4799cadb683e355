//! Human in the loop across orchestrator workers that share one PostgreSQL event store
//! and one Redis: an invocation that waits on one `agentloop-orchestrator` process is
//! resolved on another and completes there; a resolving process killed with SIGKILL
//! right after the resolve (with the approved write applied and its reply held, or
//! anywhere) is taken over by a survivor, and the write is applied exactly once by the
//! executor's own record. Also, with in-process workers, the races at the start of a
//! wait: a cancel that lands while the run commits its wait still ends the invocation
//! `cancelled`, and a reply that comes while the run that committed the wait is still
//! finishing still resumes it. And under policies: a write sent before a takeover is
//! settled from the executor's record even when the policies in force at the takeover
//! refuse it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentloop_engine::EventBody;
use agentloop_lease::{Lease, LeaseBackend, LeaseError};
use agentloop_proto::v1 as pb;
use agentloop_store::{Append, EventStore, InvocationRecord, StoreError};
use async_trait::async_trait;
use common::{
    Client, Cluster, LeaseFaults, Process, StoreFaults, cancel, events_until_end, get, start, watch,
};
use futures::StreamExt;
use tokio::sync::Notify;
use uuid::Uuid;

const TTL_MS: u64 = 1_000;
const SWEEP_MS: u64 = 200;

/// Turn 1 asks for an approval of one transfer; turn 2 answers.
const APPROVE_THEN_FINAL: &str = r#"{"turns": [
  {"request_approval": {"summary": "move 42.00 from alice to bob", "calls": [
    {"id": "t1", "name": "transfer", "arguments": {"to": "bob", "from": "alice", "amount": 4200}}]}},
  {"final": "moved"}]}"#;

/// Worker processes `a` and `b` of `cluster`, logging into `dir`.
fn spawn_a_and_b(cluster: &Cluster, dir: &std::path::Path) -> (Process, Process) {
    (
        cluster.spawn_worker("a", dir, TTL_MS, SWEEP_MS),
        cluster.spawn_worker("b", dir, TTL_MS, SWEEP_MS),
    )
}

/// Reads the events of `id` up to the `Ended` event that waits for a human; returns
/// that end.
async fn until_waiting(client: &mut Client, id: &str) -> pb::InvocationEnded {
    let mut stream = watch(client, id).await;
    let read = async {
        while let Some(item) = stream.next().await {
            if let Some(pb::event::Body::Ended(end)) = item.unwrap().event.unwrap().body {
                assert!(
                    end.wait_until.is_some(),
                    "ended instead of waiting: {end:?}"
                );
                return end;
            }
        }
        panic!("the stream of {id} ended before it waited");
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("{id} never waited"))
}

async fn approve(
    client: &mut Client,
    id: &str,
    digest: &str,
) -> Result<pb::Invocation, tonic::Status> {
    Ok(client
        .resolve_approval(pb::ResolveApprovalRequest {
            invocation_id: id.into(),
            proposal_digest: digest.into(),
            verdict: pb::ApprovalVerdict::Approve.into(),
            actor: "approver-1".into(),
            comment: String::new(),
        })
        .await?
        .into_inner()
        .invocation
        .unwrap())
}

/// How many transfers the executor applied for `id`, by its own durable record.
fn applied_for(cluster: &Cluster, id: &str) -> usize {
    agentloop_demo_executor::read_record(cluster.executor.data_dir())
        .unwrap()
        .iter()
        .filter(|transfer| transfer.invocation_id == id)
        .count()
}

/// The kind of each event, with the turn number of turns and started batches.
fn shape(events: &[pb::Event]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event.body.as_ref().unwrap() {
            pb::event::Body::Turn(turn) => format!("turn {}", turn.turn),
            pb::event::Body::BatchStarted(turn) => format!("batch_started {}", turn.turn),
            pb::event::Body::Ended(end) if end.wait_until.is_some() => "waiting".into(),
            pb::event::Body::Ended(end) => format!("ended {}", end.reason().as_str_name()),
            pb::event::Body::ApprovalResolved(_) => "resolved".into(),
            pb::event::Body::ClarificationAnswered(_) => "answered".into(),
        })
        .collect()
}

/// Reads the whole log of `id`, an approved invocation, once it has ended, and checks it
/// completed with the approved calls run in the reopened turn 1, the seqs without a
/// gap, and the write applied exactly once by the executor's record.
async fn approved_once(cluster: &Cluster, client: &mut Client, id: &str) -> Vec<pb::Event> {
    let events = events_until_end(client, id).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "{id}: seqs are contiguous from 1");
    assert_eq!(
        shape(&events),
        [
            "turn 1",
            "waiting",
            "resolved",
            "batch_started 1",
            "turn 1",
            "turn 2",
            "ended TERMINAL_REASON_COMPLETED",
        ],
        "{id}"
    );
    assert_eq!(applied_for(cluster, id), 1, "{id}: applied exactly once");
    events
}

/// Worker A runs the invocation until it waits; worker B shows the same pending calls.
/// Two approvals at once, one through each process: exactly one wins. Then A dies; B
/// takes the approval, runs the approved write once and completes the invocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_on_another_process_resumes_the_invocation_there() {
    let Some(cluster) = Cluster::start_or_skip("approval_on_another_process").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = spawn_a_and_b(&cluster, dir.path());
    let (mut via_a, mut via_b) = (a.client().await, b.client().await);
    let id = start(&mut via_a, APPROVE_THEN_FINAL, "across-1").await;
    let end = until_waiting(&mut via_a, &id).await;

    let seen_by_a = get(&mut via_a, &id).await;
    let seen_by_b = get(&mut via_b, &id).await;
    assert_eq!(seen_by_b.state(), pb::InvocationState::Waiting);
    assert_eq!(seen_by_a, seen_by_b, "every worker shows the same wait");
    let pending = seen_by_b.pending_approval.unwrap();
    assert_eq!(pending.proposal_digest, end.proposal_digest);
    assert_eq!(
        pending.calls,
        [pb::ToolCall {
            call_id: "t1".into(),
            tool: "transfer".into(),
            arguments_json: r#"{"amount":4200,"from":"alice","to":"bob"}"#.into(),
        }]
    );

    // Two approvals of another invocation at once, one through each process: the
    // PostgreSQL version admits exactly one.
    let other = start(&mut via_a, APPROVE_THEN_FINAL, "across-2").await;
    let other_end = until_waiting(&mut via_a, &other).await;
    let (first, second) = tokio::join!(
        approve(&mut via_a, &other, &other_end.proposal_digest),
        approve(&mut via_b, &other, &other_end.proposal_digest),
    );
    match (&first, &second) {
        (Ok(_), Err(status)) | (Err(status), Ok(_)) => {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        }
        _ => panic!("not exactly one winner: {first:?} / {second:?}"),
    }
    approved_once(&cluster, &mut via_b, &other).await;

    // A is gone (it held nothing: nothing runs while the invocation waits), so the run
    // after the approval can only be B's.
    let mut a = a;
    a.kill();
    approve(&mut via_b, &id, &end.proposal_digest)
        .await
        .unwrap();
    let twice = approve(&mut via_b, &id, &end.proposal_digest).await;
    assert_eq!(twice.unwrap_err().code(), tonic::Code::FailedPrecondition);
    approved_once(&cluster, &mut via_b, &id).await;
    let ended = get(&mut via_b, &id).await;
    assert_eq!(ended.terminal_reason(), pb::TerminalReason::Completed);
    assert_eq!(ended.answer.as_deref(), Some("moved"));
    let stats = cluster.executor.stats();
    assert_eq!((stats.applied, stats.deduplicated), (2, 0));
    drop((a, b));
    cluster.stop().await;
}

/// B takes the approval and sends the write; the executor applies it and holds the
/// reply; B is killed. A takes the invocation over from its log (the started batch)
/// and settles the write from the executor's record: applied once, never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_after_the_approved_write_was_applied_settles_it_once() {
    let Some(cluster) = Cluster::start_holding_replies("kill_after_approved_write").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, mut b) = spawn_a_and_b(&cluster, dir.path());
    let (mut via_a, mut via_b) = (a.client().await, b.client().await);
    let id = start(&mut via_a, APPROVE_THEN_FINAL, "kill-applied-1").await;
    let end = until_waiting(&mut via_a, &id).await;

    let mut stats = cluster.executor.watch_stats();
    approve(&mut via_b, &id, &end.proposal_digest)
        .await
        .unwrap();
    stats.wait_for(|s| s.applied == 1).await.unwrap();
    b.kill();

    let events = approved_once(&cluster, &mut via_a, &id).await;
    let Some(pb::event::Body::Turn(turn)) = &events[4].body else {
        unreachable!()
    };
    assert_eq!(
        get(&mut via_a, &id).await.terminal_reason(),
        pb::TerminalReason::Completed
    );
    settled_from_the_record(&cluster, turn);
    drop(a);
    cluster.stop().await;
}

/// Several invocations wait on A; B takes all their approvals at once and is killed
/// the moment the last one returns, wherever their runs are (the model takes 3 s for
/// turn 2, so none can have ended). A finishes every one, and each write is applied
/// exactly once. Prints how far each run had come at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_right_after_the_resolves_loses_no_write_and_repeats_none() {
    let Some(cluster) = Cluster::start_or_skip("kill_right_after_resolve").await else {
        return;
    };
    let script = r#"{"turns": [
      {"request_approval": {"summary": "move 42.00 from alice to bob", "calls": [
        {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
      {"final": "moved", "delay_ms": 3000}]}"#;
    let dir = tempfile::tempdir().unwrap();
    let (a, mut b) = spawn_a_and_b(&cluster, dir.path());
    let mut via_a = a.client().await;
    let via_b = b.client().await;
    let mut waiting = Vec::new();
    for n in 0..4 {
        let id = start(&mut via_a, script, &format!("kill-resolve-{n}")).await;
        let end = until_waiting(&mut via_a, &id).await;
        waiting.push((id, end.proposal_digest));
    }
    let resolves = waiting.iter().map(|(id, digest)| {
        let mut client = via_b.clone();
        async move { approve(&mut client, id, digest).await }
    });
    for result in futures::future::join_all(resolves).await {
        result.unwrap();
    }
    b.kill();
    let killed_at = unix_ms_now();

    let mut progress = Vec::new();
    for (id, _) in &waiting {
        let events = approved_once(&cluster, &mut via_a, id).await;
        let before_kill = events
            .iter()
            .filter(|e| unix_ms(e.committed_at.as_ref().unwrap()) <= killed_at)
            .count();
        assert!(
            (3..7).contains(&before_kill),
            "{id}: resolved before the kill, ended after it: {before_kill} events before"
        );
        progress.push(shape(&events)[before_kill - 1].clone());
    }
    // The executor's durable record, not its counters: a kill can drop a request's
    // handler after its transfer was recorded and before it was counted.
    let record = agentloop_demo_executor::read_record(cluster.executor.data_dir()).unwrap();
    assert_eq!(record.len(), 4, "four writes, each applied once");
    println!(
        "kill -9 right after 4 resolves; the last event of each before the kill: {progress:?}"
    );
    drop(a);
    cluster.stop().await;
}

/// B takes the approval of a large transfer (gated by the demo policies) and sends it;
/// the executor applies it and holds the reply. Transfers are then frozen by a policy
/// reload, and B is killed. A takes the invocation over and checks the started batch
/// again with the policies in force: the write was sent before the crash, so it is
/// settled from the executor's record (applied once), not refused as if it had never
/// happened; the turn records the policies that judged it last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_sent_before_a_takeover_is_settled_even_if_policy_now_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.cedar");
    let demo = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/policies/demo.cedar"
    ))
    .unwrap();
    std::fs::write(&policies, &demo).unwrap();
    let configured = Cluster::start_configured("takeover_under_policies", |options| {
        options.demo.faults = agentloop_demo_executor::FaultConfig {
            reply_delay_ms: 60_000,
            ..Default::default()
        };
        options.policy.policies =
            std::collections::BTreeMap::from([("default".to_owned(), vec![policies.clone()])]);
    });
    let Some(cluster) = configured.await else {
        return;
    };
    let (a, mut b) = spawn_a_and_b(&cluster, dir.path());
    let (mut via_a, mut via_b) = (a.client().await, b.client().await);
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 20000}}]},
      {"final": "moved"}]}"#;
    let request = pb::StartInvocationRequest {
        roles: vec!["clerk".into()],
        ..common::start_request(script, "takeover-under-policies-1")
    };
    let started = via_a.start_invocation(request).await.unwrap().into_inner();
    let id = started.invocation.unwrap().invocation_id;
    let end = until_waiting(&mut via_a, &id).await;
    assert!(
        end.detail.contains("large-transfers-need-approval"),
        "{}",
        end.detail
    );

    let mut stats = cluster.executor.watch_stats();
    approve(&mut via_b, &id, &end.proposal_digest)
        .await
        .unwrap();
    stats.wait_for(|s| s.applied == 1).await.unwrap();
    let frozen = format!(
        "{demo}\n@id(\"transfers-frozen\")\nforbid(principal, action, resource == Agentloop::Tool::\"transfer\");\n"
    );
    std::fs::write(&policies, frozen).unwrap();
    let profiles = cluster.services.policies();
    assert!(profiles.reload().unwrap());
    b.kill();

    let events = approved_once(&cluster, &mut via_a, &id).await;
    let (Some(pb::event::Body::BatchStarted(started)), Some(pb::event::Body::Turn(turn))) =
        (&events[3].body, &events[4].body)
    else {
        unreachable!()
    };
    settled_from_the_record(&cluster, turn);
    assert_eq!(turn.policy_version, profiles.versions()["default"]);
    assert_ne!(
        turn.policy_version, started.policy_version,
        "judged again at the takeover"
    );
    drop(a);
    cluster.stop().await;
}

/// The one write of `turn` was applied once by the executor, never sent again, and its
/// result is the executor's record of it.
fn settled_from_the_record(cluster: &Cluster, turn: &pb::TurnCommitted) {
    assert!(
        matches!(&turn.results[0].outcome, Some(pb::tool_result::Outcome::Output(o)) if o.output_json.contains("txn-")),
        "the write's result comes from the executor's record: {turn:?}"
    );
    let stats = cluster.executor.stats();
    assert_eq!(
        (stats.applied, stats.deduplicated),
        (1, 0),
        "applied once, never sent again"
    );
}

fn unix_ms(timestamp: &prost_types::Timestamp) -> u64 {
    u64::try_from(timestamp.seconds).unwrap() * 1_000
        + u64::try_from(timestamp.nanos).unwrap() / 1_000_000
}

fn unix_ms_now() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(now.as_millis()).unwrap()
}

/// Holds the commit of a waiting end until a cancel has been recorded, so the cancel
/// finds the invocation still running and the run commits its wait after it.
struct CancelDuringWait {
    /// Fired when a waiting end is about to be committed.
    reached: Arc<Notify>,
    /// Fired once the cancel request is on record.
    cancelled: Arc<Notify>,
}

#[async_trait]
impl StoreFaults for CancelDuringWait {
    async fn append(
        &self,
        store: &dyn EventStore,
        id: Uuid,
        append: Append<'_>,
    ) -> Result<(), StoreError> {
        let waits = append
            .events
            .iter()
            .any(|event| matches!(&event.body, EventBody::Ended(end) if end.waits()));
        if waits {
            let cancelled = self.cancelled.notified();
            self.reached.notify_one();
            cancelled.await;
        }
        store.append(id, append).await
    }
    async fn request_cancel(
        &self,
        store: &dyn EventStore,
        id: Uuid,
        at: agentloop_engine::UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError> {
        let record = store.request_cancel(id, at, reason).await;
        self.cancelled.notify_one();
        record
    }
}

/// A cancel accepted while the run is committing its wait (the cancel sees it running,
/// the wait is committed after the cancel was recorded) still ends the invocation
/// `cancelled`, with the cancel's reason: it must not wait for a human after all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_while_the_wait_commits_still_cancels() {
    let Some(cluster) = Cluster::start_or_skip("cancel_while_the_wait_commits").await else {
        return;
    };
    let reached = Arc::new(Notify::new());
    let store = cluster
        .store_with(CancelDuringWait {
            reached: reached.clone(),
            cancelled: Arc::new(Notify::new()),
        })
        .await;
    let worker = cluster
        .worker(
            cluster.config("w", 2_000, 3_600_000),
            store,
            cluster.leases(),
        )
        .await;
    let mut client = worker.client().await;
    let id = start(&mut client, APPROVE_THEN_FINAL, "cancel-during-wait").await;
    reached.notified().await;
    let accepted = cancel(&mut client, &id, "changed my mind").await;
    assert_eq!(
        accepted.state(),
        pb::InvocationState::Running,
        "the race this test makes"
    );

    let events = tokio::time::timeout(Duration::from_secs(30), events_until_end(&mut client, &id))
        .await
        .expect("the cancelled invocation waits for a human instead of ending");
    assert_eq!(
        shape(&events),
        ["turn 1", "waiting", "ended TERMINAL_REASON_CANCELLED"]
    );
    let ended = get(&mut client, &id).await;
    assert_eq!(ended.state(), pb::InvocationState::Ended);
    assert_eq!(ended.terminal_reason(), pb::TerminalReason::Cancelled);
    assert_eq!(ended.terminal_detail, "changed my mind");
    worker.stop().await;
    cluster.stop().await;
}

/// Leases whose release takes `RELEASE_DELAY`: the run that committed a wait takes that
/// long to finish after the commit.
#[derive(Debug)]
struct SlowRelease;

const RELEASE_DELAY: Duration = Duration::from_millis(500);

#[async_trait]
impl LeaseFaults for SlowRelease {
    async fn release(&self, leases: &dyn LeaseBackend, lease: &Lease) -> Result<bool, LeaseError> {
        tokio::time::sleep(RELEASE_DELAY).await;
        leases.release(lease).await
    }
}

/// An approval that arrives while the run that committed the wait is still finishing
/// on the same worker (releasing its lease) resumes the invocation all the same, with
/// no sweep to fall back on, and even when that run's slot was the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_while_the_waiting_run_finishes_still_resumes() {
    let Some(cluster) = Cluster::start_or_skip("approval_while_the_run_finishes").await else {
        return;
    };
    // With room to spare, and with the finishing run's slot the only one.
    for (n, max_running) in [(0, 10_000), (1, 1)] {
        let leases = cluster.leases_with(SlowRelease);
        let mut config = cluster.config(&format!("w{n}"), 2_000, 3_600_000);
        config.bounds.max_running = max_running;
        let worker = cluster.worker(config, cluster.store().await, leases).await;
        let mut client = worker.client().await;
        let key = format!("approve-while-finishing-{n}");
        let id = start(&mut client, APPROVE_THEN_FINAL, &key).await;
        let end = until_waiting(&mut client, &id).await;
        // At once: the run is still releasing its lease.
        approve(&mut client, &id, &end.proposal_digest)
            .await
            .unwrap();
        let approved = approved_once(&cluster, &mut client, &id);
        if tokio::time::timeout(Duration::from_secs(10), approved)
            .await
            .is_err()
        {
            let now = get(&mut client, &id).await;
            panic!("max_running {max_running}: approved, and nobody runs it: {now:?}");
        }
        worker.stop().await;
    }
    cluster.stop().await;
}
