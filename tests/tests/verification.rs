//! No evidence, no success, end to end in both wirings: a final answer completes only
//! when what it cites is committed output of the invocation, the effect ledger says its
//! writes were committed, the profile's required evidence is cited, and the profile's
//! verifiers accept it. Otherwise the model hears why in its one repair turn, then the
//! invocation ends `verification_failed`. A verifier that hangs fails closed, and one in
//! flight is dropped by a cancel.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_policy::{Acceptance, PolicyConfig};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_tools::VerifierEntry;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

both_wirings!(
    answers_that_do_not_rest_on_committed_outputs_fail_after_one_repair,
    an_answer_citing_committed_outputs_of_committed_writes_completes,
    the_demo_verifier_accepts_a_recorded_transfer_and_rejects_an_answer_without_one,
    a_verifier_that_does_not_answer_fails_closed,
    a_cancel_drops_a_verifier_in_flight,
    a_verifier_runs_under_the_invocations_deadline,
);

/// agentloop whose default profile has the acceptance rules `toml`, with `verifiers`
/// registered beside the demo's.
async fn under(wiring: Wiring, toml: &str, verifiers: Vec<VerifierEntry>) -> System {
    let acceptance: Acceptance = toml::from_str(toml).unwrap();
    System::start_with(wiring, OrchestratorConfig::default(), |services| {
        services.policy = PolicyConfig {
            acceptance: BTreeMap::from([("default".to_owned(), acceptance)]),
            ..PolicyConfig::default()
        };
        services.verifiers = verifiers;
    })
    .await
}

/// A script: one batch of `calls` (JSON objects), then `finals` (JSON objects).
fn script(calls: &[&str], finals: &[&str]) -> String {
    let mut turns = Vec::new();
    if !calls.is_empty() {
        turns.push(format!(r#"{{"tool_calls": [{}]}}"#, calls.join(", ")));
    }
    turns.extend(finals.iter().map(|f| (*f).to_owned()));
    format!(r#"{{"turns": [{}]}}"#, turns.join(", "))
}

const LOOKUP_PROFILE: &str = r#"{"id": "l1", "name": "lookup", "arguments": {"key": "profile"}}"#;
const LOOKUP_MISSING: &str = r#"{"id": "l2", "name": "lookup", "arguments": {"key": "nope"}}"#;
const TRANSFER: &str = r#"{"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 500}}"#;
/// Refused by the demo executor: the ledger records the write `rejected`.
const TRANSFER_TO_SELF: &str = r#"{"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "alice", "amount": 500}}"#;

fn citing(answer: &str, evidence: &[&str]) -> String {
    serde_json::json!({"final": answer, "evidence": evidence}).to_string()
}

/// The final-answer turns of a log.
fn finals(events: &[pb::Event]) -> Vec<&pb::TurnCommitted> {
    turns(events)
        .into_iter()
        .filter(|turn| {
            matches!(
                turn.decision.as_ref().and_then(|d| d.kind.as_ref()),
                Some(pb::decision::Kind::Final(_))
            )
        })
        .collect()
}

fn check<'a>(checks: &'a [pb::Check], name: &str) -> &'a pb::Check {
    checks
        .iter()
        .find(|check| check.name == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:?}"))
}

fn ended(events: &[pb::Event]) -> &pb::InvocationEnded {
    match events.last().and_then(|e| e.body.as_ref()) {
        Some(pb::event::Body::Ended(ended)) => ended,
        other => panic!("the log does not end with Ended: {other:?}"),
    }
}

/// Runs `script` and checks it ended `verification_failed` after exactly one repair:
/// two answers, each refused with a reason containing `why`, from check `name`.
async fn fails_after_one_repair(system: &System, script: &str, name: &str, why: &str) {
    let mut client = system.client().await;
    let (invocation, events) = run_to_end(&mut client, start_request(script)).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::VerificationFailed,
        "{}",
        invocation.terminal_detail
    );
    assert_eq!(
        invocation.answer, None,
        "a refused answer is never the answer"
    );
    assert!(invocation.accepted_by.is_empty());
    let finals = finals(&events);
    assert_eq!(finals.len(), 2, "one answer, one repair: {finals:?}");
    for turn in &finals {
        let rejection = turn.rejection.as_ref().unwrap();
        assert_eq!(rejection.kind(), pb::RejectionKind::VerificationFailed);
        assert!(rejection.message.contains(why), "{}", rejection.message);
        let check = check(&turn.checks, name);
        assert_ne!(check.verdict(), pb::CheckVerdict::Accepted);
    }
    assert!(
        invocation.terminal_detail.contains(why),
        "{}",
        invocation.terminal_detail
    );
}

async fn answers_that_do_not_rest_on_committed_outputs_fail_after_one_repair(wiring: Wiring) {
    let system = under(wiring, "require_citations = true", Vec::new()).await;
    let guess = r#"{"final": "the profile is active"}"#;
    // Cites nothing.
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_PROFILE], &[guess, guess]),
        "citations",
        "cites no result",
    )
    .await;
    // Cites an error result.
    let error = citing("the key exists", &["l2"]);
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_MISSING], &[&error, &error]),
        "citations",
        "ended with an error (ERROR_TYPE_NOT_FOUND",
    )
    .await;
    // Cites a call that no turn made.
    let made_up = citing("the profile is active", &["l1", "l9"]);
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_PROFILE], &[&made_up, &made_up]),
        "citations",
        "\"l9\" is not a call with a committed result",
    )
    .await;
    // Claims a write the ledger has as rejected, citing a good lookup beside it.
    let moved = citing("moved 5.00 to alice", &["l1"]);
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_PROFILE, TRANSFER_TO_SELF], &[&moved, &moved]),
        "writes",
        "\"t1\" (transfer) is rejected in the effect ledger",
    )
    .await;
    assert_eq!(system.executor().stats().applied, 0);
    system.stop().await;
}

async fn an_answer_citing_committed_outputs_of_committed_writes_completes(wiring: Wiring) {
    let rules = r#"
        require_citations = true
        [[require]]
        tool = "transfer"
        where = [{ pointer = "/receipt", matches = "^txn-" }, { pointer = "/to", equals = "bob" }]
    "#;
    let system = under(wiring, rules, Vec::new()).await;
    let mut client = system.client().await;
    // The first answer cites the lookup only; the repair cites the transfer too.
    let partial = citing("moved 5.00 to bob", &["l1"]);
    let whole = citing("moved 5.00 to bob", &["l1", "t1"]);
    let (invocation, events) = run_to_end(
        &mut client,
        start_request(&script(&[LOOKUP_PROFILE, TRANSFER], &[&partial, &whole])),
    )
    .await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::Completed,
        "{}",
        invocation.terminal_detail
    );
    assert_eq!(invocation.answer.as_deref(), Some("moved 5.00 to bob"));
    let finals = finals(&events);
    assert_eq!(finals.len(), 2);
    let first = finals[0].rejection.as_ref().unwrap();
    assert!(
        first
            .message
            .contains("must cite a transfer result with an output"),
        "the model hears what is missing: {}",
        first.message
    );

    // GetInvocation and the Ended event say what accepted it, with the evidence.
    let accepted = &invocation.accepted_by;
    assert_eq!(accepted, &ended(&events).accepted_by);
    assert!(finals[1].checks.is_empty(), "recorded once, with the end");
    assert!(
        accepted
            .iter()
            .all(|c| c.verdict() == pb::CheckVerdict::Accepted)
    );
    assert!(accepted.iter().all(|c| c.kind() == pb::CheckKind::Rule));
    assert_eq!(check(accepted, "citations").evidence, ["l1", "t1"]);
    assert_eq!(check(accepted, "require:transfer").evidence, ["t1"]);
    let writes = &check(accepted, "writes").evidence;
    assert_eq!(writes.len(), 1, "the transfer's effect key: {writes:?}");
    assert_eq!(
        applied_for(system.executor(), &invocation.invocation_id).len(),
        1
    );
    system.stop().await;
}

async fn the_demo_verifier_accepts_a_recorded_transfer_and_rejects_an_answer_without_one(
    wiring: Wiring,
) {
    let system = under(wiring, r#"verifiers = ["transfer_recorded"]"#, Vec::new()).await;
    let mut client = system.client().await;
    let (invocation, events) = run_to_end(
        &mut client,
        start_request(&script(
            &[TRANSFER],
            &[&citing("moved 5.00 to bob", &["t1"])],
        )),
    )
    .await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::Completed,
        "{}: {:?}",
        invocation.terminal_detail,
        finals(&events)
    );
    let verifier = check(&invocation.accepted_by, "transfer_recorded");
    assert_eq!(verifier.kind(), pb::CheckKind::Verifier);
    let applied = applied_for(system.executor(), &invocation.invocation_id);
    assert_eq!(
        verifier.evidence,
        [applied[0].receipt.clone()],
        "the verifier's evidence is the executor's receipt"
    );

    // Nothing was transferred, so the verifier has nothing to confirm.
    let looked = citing("moved 5.00 to bob", &["l1"]);
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_PROFILE], &[&looked, &looked]),
        "transfer_recorded",
        "no committed transfer to confirm",
    )
    .await;
    system.stop().await;
}

/// A verifier that never answers, and tells when it is asked and when the call it was
/// asked in goes away.
#[derive(Clone, Default)]
struct Hanging {
    asked: Arc<Notify>,
    dropped: Arc<Notify>,
}

/// Notifies when dropped: the verifier's call was cancelled.
struct OnDrop(Arc<Notify>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

#[tonic::async_trait]
impl ToolExecutorService for Hanging {
    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        Ok(Response::new(pb::DescribeResponse::default()))
    }

    async fn execute(
        &self,
        _request: Request<pb::ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<pb::ToolExecutorServiceExecuteResponse>, Status> {
        Err(Status::unimplemented("a verifier only"))
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    /// A test executor from before stages: each call comes as an `Execute`.
    async fn execute_stage(
        &self,
        _request: tonic::Request<agentloop_proto::v1::ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("no stages"))
    }

    async fn reconcile(
        &self,
        _request: Request<pb::ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<pb::ToolExecutorServiceReconcileResponse>, Status> {
        Err(Status::unimplemented("a verifier only"))
    }

    async fn verify(
        &self,
        _request: Request<pb::ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<pb::ToolExecutorServiceVerifyResponse>, Status> {
        let _guard = OnDrop(self.dropped.clone());
        self.asked.notify_one();
        std::future::pending().await
    }
}

/// Serves `verifier` on a loopback port; its registry entry, named `hangs`, with
/// `timeout_ms`.
async fn serve(verifier: Hanging, timeout_ms: u64) -> VerifierEntry {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let services =
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::tool_executor(verifier));
    tokio::spawn(agentloop_server::serve(
        listener,
        services,
        std::future::pending(),
    ));
    VerifierEntry {
        timeout_ms,
        ..VerifierEntry::new("hangs", &endpoint, "never answers")
    }
}

async fn a_verifier_that_does_not_answer_fails_closed(wiring: Wiring) {
    let entry = serve(Hanging::default(), 300).await;
    let system = under(wiring, r#"verifiers = ["hangs"]"#, vec![entry]).await;
    let answer = citing("the profile is active", &["l1"]);
    fails_after_one_repair(
        &system,
        &script(&[LOOKUP_PROFILE], &[&answer, &answer]),
        "hangs",
        "timed out after 300 ms",
    )
    .await;
    system.stop().await;
}

async fn a_cancel_drops_a_verifier_in_flight(wiring: Wiring) {
    let verifier = Hanging::default();
    let entry = serve(verifier.clone(), 600_000).await;
    let system = under(wiring, r#"verifiers = ["hangs"]"#, vec![entry]).await;
    let mut client = system.client().await;
    let answer = citing("the profile is active", &["l1"]);
    let id = start(
        &mut client,
        start_request(&script(&[LOOKUP_PROFILE], &[&answer])),
    )
    .await;
    verifier.asked.notified().await;
    client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.clone(),
            reason: "enough".into(),
        })
        .await
        .unwrap();
    verifier.dropped.notified().await;
    let events = events_until_end(&mut client, &id, 1).await;
    let invocation = get(&mut client, &id).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::Cancelled);
    let finals = finals(&events);
    assert_eq!(finals.len(), 1);
    assert_eq!(
        finals[0].rejection.as_ref().unwrap().kind(),
        pb::RejectionKind::Stopped,
        "the answer under verification is committed as stopped"
    );
    system.stop().await;
}

async fn a_verifier_runs_under_the_invocations_deadline(wiring: Wiring) {
    let verifier = Hanging::default();
    let entry = serve(verifier.clone(), 600_000).await;
    let system = under(wiring, r#"verifiers = ["hangs"]"#, vec![entry]).await;
    let mut client = system.client().await;
    let answer = citing("the profile is active", &["l1"]);
    let request = pb::StartInvocationRequest {
        budget_overrides: Some(pb::BudgetOverrides {
            deadline: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ..start_request(&script(&[LOOKUP_PROFILE], &[&answer, &answer]))
    };
    let (invocation, _) = run_to_end(&mut client, request).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::DeadlineExceeded,
        "{}",
        invocation.terminal_detail
    );
    verifier.dropped.notified().await;
    system.stop().await;
}
