//! The write protocol and the retry rules, against a tool gateway that answers as told
//! (the fault fake) and the real decision, policy and ledger services in process, over
//! SQLite: which calls are sent again and how often, what the ledger ends up saying, and
//! an executor that cannot reconcile stopping the invocation for an operator.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_decision::DecisionServer;
use agentloop_effects::settle;
use agentloop_engine::{CallOutcome, Check, ErrorType, NextAction, ToolCall, ToolError};
use agentloop_ledger::{LedgerConfig, LedgerService};
use agentloop_orchestrator::{Api, OrchestratorConfig, calls};
use agentloop_policy::{PolicyConfig, PolicyServer};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
use agentloop_runtime::ports::{
    Claim, Dispatch, Failure, FailureKind, Ports, Sent, Tool, ToolsPort,
};
use agentloop_runtime::{Runtime, Workers};
use agentloop_stack::{InProcessDecision, InProcessLedger, InProcessPolicy};
use agentloop_store::SqliteStore;
use async_trait::async_trait;
use futures::StreamExt;
use tonic::{Request, Status};

/// What the fake gateway answers: per tool, the answers to successive `Execute`s (the
/// last one repeats), and one answer for every `Reconcile`.
#[derive(Default)]
struct Script {
    execute: Vec<(&'static str, VecDeque<Answer>)>,
    reconcile: Option<pb::ToolGatewayServiceReconcileResponse>,
}

#[derive(Clone)]
enum Answer {
    Output(&'static str),
    RetryableError,
    Lost,
}

/// One send the fake gateway got.
#[derive(Debug, Clone)]
struct Sending {
    call_id: String,
    effect_key: String,
    attempt: u32,
}

impl Sending {
    fn of(dispatch: &Dispatch<'_>) -> Sending {
        Sending {
            call_id: dispatch.call.call_id.as_str().to_owned(),
            effect_key: dispatch.effect_key.to_owned(),
            attempt: dispatch.attempt,
        }
    }
}

/// The fake gateway: the demo executor's tools plus an idempotent, commutative `upsert`, answers
/// from a script, and a log of every request it got. It takes stages when told to.
struct FaultyTools {
    script: Mutex<Script>,
    sends_stages: bool,
    executed: Mutex<Vec<Sending>>,
    stages: Mutex<Vec<Vec<Sending>>>,
    reconciled: Mutex<u32>,
}

impl FaultyTools {
    /// The scripted answer to one call: the next for its tool (the last one repeats).
    fn answer(&self, call: &ToolCall) -> Answer {
        let mut script = self.script.lock().unwrap();
        let answers = script
            .execute
            .iter_mut()
            .find(|(tool, _)| *tool == call.tool)
            .map(|(_, answers)| answers)
            .unwrap();
        if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            answers.front().cloned().unwrap()
        }
    }

    /// The call's result, or a failure when the answer is lost.
    fn result(&self, call: &ToolCall) -> Result<Sent, Failure> {
        let outcome = match self.answer(call) {
            Answer::Output(json) => CallOutcome::Output {
                output_json: json.into(),
            },
            Answer::RetryableError => CallOutcome::Error(ToolError {
                error_type: ErrorType::Unavailable,
                message: "busy".into(),
                retryable: true,
                next_allowed_action: NextAction::Retry,
            }),
            Answer::Lost => return Err(Failure::new(FailureKind::Unavailable, "connection reset")),
        };
        Ok(Sent {
            outcome,
            receipt: "r-1".into(),
        })
    }

    fn tools() -> Vec<pb::ToolDescriptor> {
        let mut tools = agentloop_demo_executor::descriptors();
        let mut upsert = tools
            .iter()
            .find(|t| t.name == "transfer")
            .cloned()
            .unwrap();
        upsert.name = "upsert".into();
        upsert.set_side_effect(pb::SideEffect::IdempotentWrite);
        // So that two upserts of a turn make one stage, as two lookups do.
        upsert.commutative = true;
        tools.push(upsert);
        tools
    }
}

#[async_trait]
impl ToolsPort for FaultyTools {
    async fn list(&self) -> Result<Vec<Tool>, Failure> {
        Ok(FaultyTools::tools().into_iter().map(calls::tool).collect())
    }

    async fn execute(&self, dispatch: Dispatch<'_>) -> Result<Sent, Failure> {
        self.executed.lock().unwrap().push(Sending::of(&dispatch));
        self.result(dispatch.call)
    }

    /// A lost answer loses the whole stage's reply.
    async fn execute_stage(
        &self,
        dispatches: &[Dispatch<'_>],
    ) -> Result<Vec<Result<Sent, Failure>>, Failure> {
        assert!(
            self.sends_stages,
            "a stage was sent to a port that takes none"
        );
        self.stages
            .lock()
            .unwrap()
            .push(dispatches.iter().map(Sending::of).collect());
        let mut answers = Vec::new();
        for dispatch in dispatches {
            answers.push(Ok(self.result(dispatch.call)?));
        }
        Ok(answers)
    }

    fn max_stage(&self) -> usize {
        if self.sends_stages { 256 } else { 1 }
    }

    async fn verify(
        &self,
        _name: &str,
        _claim: &Claim,
        _within: Option<Duration>,
    ) -> Result<Option<Check>, Failure> {
        Err(Failure::new(
            FailureKind::Unimplemented,
            "no verifier in these tests",
        ))
    }

    async fn reconcile(&self, _tool: &str, _effect_key: &str) -> Result<settle::Answer, Failure> {
        *self.reconciled.lock().unwrap() += 1;
        let answer = self.script.lock().unwrap().reconcile.clone();
        Ok(calls::answer(answer.unwrap_or_default()))
    }
}

struct Setup {
    orchestrator: Api,
    tools: Arc<FaultyTools>,
    ledger: LedgerService,
    _dir: tempfile::TempDir,
}

async fn setup(script: Script) -> Setup {
    setup_with(script, false).await
}

async fn setup_with(script: Script, sends_stages: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tools = Arc::new(FaultyTools {
        script: Mutex::new(script),
        sends_stages,
        executed: Mutex::new(Vec::new()),
        stages: Mutex::new(Vec::new()),
        reconciled: Mutex::new(0),
    });
    let policy =
        PolicyServer::from_descriptors(&FaultyTools::tools(), &PolicyConfig::default()).unwrap();
    let ledger = LedgerService::new(
        LedgerConfig {
            data_dir: dir.path().join("ledger"),
            ..LedgerConfig::default()
        }
        .open_store()
        .await
        .unwrap(),
    );
    let ports = Ports {
        decision: Arc::new(InProcessDecision(DecisionServer::new(None))),
        policy: Arc::new(InProcessPolicy(policy)),
        tools: tools.clone(),
        ledger: Arc::new(InProcessLedger(ledger.clone())),
    };
    let store = SqliteStore::open_in(&dir.path().join("events"))
        .await
        .unwrap();
    let config = OrchestratorConfig::default();
    let workers = Workers::in_process(&config.workers);
    let runtime = Runtime::new(
        config.runtime(),
        Arc::new(store),
        ports,
        workers,
        agentloop_telemetry::Telemetry::off(),
    );
    let orchestrator = Api::new(runtime, None);
    Setup {
        orchestrator,
        tools,
        ledger,
        _dir: dir,
    }
}

/// Runs one call of `tool` to the end; returns the ended invocation and the turn's result.
async fn run_one(setup: &Setup, tool: &str) -> (pb::Invocation, pb::ToolResult) {
    let script = format!(
        r#"{{"turns": [
          {{"tool_calls": [{{"id": "c", "name": "{tool}", "arguments": {args}}}]}},
          {{"final": "done"}}]}}"#,
        args = if tool == "lookup" {
            r#"{"key": "profile"}"#
        } else {
            r#"{"from": "a", "to": "b", "amount": 5}"#
        }
    );
    let (invocation, results) = run(setup, script).await;
    (invocation, results.into_iter().next().unwrap())
}

/// Runs `script` to the end; returns the ended invocation and the results of turn 1.
async fn run(setup: &Setup, script: String) -> (pb::Invocation, Vec<pb::ToolResult>) {
    let started = setup
        .orchestrator
        .start_invocation(Request::new(pb::StartInvocationRequest {
            goal: "effects".into(),
            scripted_model_json: script,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let id = started.invocation.unwrap().invocation_id;
    let mut stream = setup
        .orchestrator
        .watch_invocation(Request::new(pb::WatchInvocationRequest {
            invocation_id: id.clone(),
            from_seq: 1,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut results = Vec::new();
    let all = async {
        while let Some(item) = stream.next().await {
            if let Some(pb::event::Body::Turn(turn)) = item.unwrap().event.unwrap().body
                && turn.turn == 1
            {
                results = turn.results;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .unwrap();
    let invocation = setup
        .orchestrator
        .get_invocation(Request::new(pb::GetInvocationRequest { invocation_id: id }))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    (invocation, results)
}

fn sends(setup: &Setup) -> Vec<Sending> {
    setup.tools.executed.lock().unwrap().clone()
}

async fn entry(setup: &Setup, invocation_id: &str, key: &str) -> pb::EffectEntry {
    let listed = setup
        .ledger
        .list_unresolved(Request::new(pb::ListUnresolvedRequest {
            invocation_id: invocation_id.into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    if let Some(entry) = listed.entries.into_iter().find(|e| e.effect_key == key) {
        return entry;
    }
    setup
        .ledger
        .get(Request::new(pb::GetRequest {
            effect_key: key.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_retryable_errors_is_sent_again_within_a_bound() {
    let setup = setup(Script {
        execute: vec![(
            "lookup",
            VecDeque::from([
                Answer::RetryableError,
                Answer::RetryableError,
                Answer::Output(r#"{"value":"active"}"#),
            ]),
        )],
        ..Script::default()
    })
    .await;
    let (invocation, result) = run_one(&setup, "lookup").await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    assert!(matches!(
        result.outcome,
        Some(pb::tool_result::Outcome::Output(_))
    ));
    assert_eq!(sends(&setup).len(), 3);

    // Always failing: three sends, then the error is the result.
    let setup = setup_failing("lookup").await;
    let (_, result) = run_one(&setup, "lookup").await;
    assert!(matches!(
        result.outcome,
        Some(pb::tool_result::Outcome::Error(_))
    ));
    assert_eq!(sends(&setup).len(), 3, "the bound holds");
}

/// Two lookups in one turn: one stage of reads.
const TWO_LOOKUPS: &str = r#"{"turns": [
  {"tool_calls": [
    {"id": "a", "name": "lookup", "arguments": {"key": "profile"}},
    {"id": "b", "name": "lookup", "arguments": {"key": "policy"}}]},
  {"final": "done"}]}"#;

fn call_ids(requests: &[Sending]) -> Vec<String> {
    requests
        .iter()
        .map(|request| request.call_id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_of_reads_goes_as_one_request_and_only_a_retryable_call_is_sent_again() {
    // The stage's first call is busy, the second answers; the first's resend answers.
    let setup = setup_with(
        Script {
            execute: vec![(
                "lookup",
                VecDeque::from([Answer::RetryableError, Answer::Output(r#"{"value":"x"}"#)]),
            )],
            ..Script::default()
        },
        true,
    )
    .await;
    let (invocation, results) = run(&setup, TWO_LOOKUPS.into()).await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    let stages = setup.tools.stages.lock().unwrap().clone();
    assert_eq!(stages.len(), 1, "one request for the stage");
    assert_eq!(call_ids(&stages[0]), ["a", "b"]);
    assert_eq!(call_ids(&sends(&setup)), ["a"], "only the busy call again");
    assert_eq!(results.len(), 2);
    for result in &results {
        assert!(
            matches!(result.outcome, Some(pb::tool_result::Outcome::Output(_))),
            "{result:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_whose_reply_is_lost_sends_each_read_again_on_its_own() {
    let setup = setup_with(
        Script {
            execute: vec![(
                "lookup",
                VecDeque::from([Answer::Lost, Answer::Output(r#"{"value":"x"}"#)]),
            )],
            ..Script::default()
        },
        true,
    )
    .await;
    let (invocation, results) = run(&setup, TWO_LOOKUPS.into()).await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    assert_eq!(setup.tools.stages.lock().unwrap().len(), 1);
    let mut resent = call_ids(&sends(&setup));
    resent.sort();
    assert_eq!(resent, ["a", "b"]);
    assert!(
        results
            .iter()
            .all(|result| matches!(result.outcome, Some(pb::tool_result::Outcome::Output(_)))),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_of_writes_goes_call_by_call_under_the_ledger() {
    let setup = setup_with(
        Script {
            execute: vec![("upsert", VecDeque::from([Answer::Output(r#"{"ok":true}"#)]))],
            ..Script::default()
        },
        true,
    )
    .await;
    let script = r#"{"turns": [
      {"tool_calls": [
        {"id": "a", "name": "upsert", "arguments": {"from": "a", "to": "b", "amount": 5}},
        {"id": "b", "name": "upsert", "arguments": {"from": "a", "to": "c", "amount": 6}}]},
      {"final": "done"}]}"#;
    let (invocation, _) = run(&setup, script.into()).await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    assert!(setup.tools.stages.lock().unwrap().is_empty());
    let sent = sends(&setup);
    let mut ids = call_ids(&sent);
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
    for request in &sent {
        let entry = entry(&setup, &invocation.invocation_id, &request.effect_key).await;
        assert_eq!(entry.state(), pb::EffectState::Committed);
    }
}

async fn setup_failing(tool: &'static str) -> Setup {
    setup(Script {
        execute: vec![(tool, VecDeque::from([Answer::RetryableError]))],
        ..Script::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_write_is_never_sent_twice_and_its_error_is_recorded() {
    let setup = setup_failing("transfer").await;
    let (invocation, result) = run_one(&setup, "transfer").await;
    assert!(matches!(
        result.outcome,
        Some(pb::tool_result::Outcome::Error(_))
    ));
    let sent = sends(&setup);
    assert_eq!(
        sent.len(),
        1,
        "a write with a retryable error is not sent again"
    );
    assert_eq!(sent[0].attempt, 1);
    let entry = entry(&setup, &invocation.invocation_id, &sent[0].effect_key).await;
    assert_eq!(entry.state(), pb::EffectState::Rejected);
    assert_eq!(entry.call_id, "c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_write_is_sent_again_under_the_same_key() {
    let setup = setup(Script {
        execute: vec![(
            "upsert",
            VecDeque::from([Answer::RetryableError, Answer::Output(r#"{"ok":true}"#)]),
        )],
        ..Script::default()
    })
    .await;
    let (invocation, result) = run_one(&setup, "upsert").await;
    assert!(matches!(
        result.outcome,
        Some(pb::tool_result::Outcome::Output(_))
    ));
    let sent = sends(&setup);
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].effect_key, sent[1].effect_key,
        "one effect, one key"
    );
    assert_eq!(sent[0].effect_key.len(), 64);
    let entry = entry(&setup, &invocation.invocation_id, &sent[0].effect_key).await;
    assert_eq!(entry.state(), pb::EffectState::Committed);
    assert_eq!(entry.receipt, "r-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_the_executor_cannot_reconcile_stops_for_an_operator() {
    let setup = setup(Script {
        execute: vec![("transfer", VecDeque::from([Answer::Lost]))],
        reconcile: Some(pb::ToolGatewayServiceReconcileResponse {
            status: pb::ReconcileStatus::Unknown.into(),
            detail: "the bank is down".into(),
            ..Default::default()
        }),
    })
    .await;
    let (invocation, result) = run_one(&setup, "transfer").await;
    assert_eq!(
        invocation.terminal_reason(),
        pb::TerminalReason::ReconciliationRequired
    );
    assert!(matches!(
        result.outcome,
        Some(pb::tool_result::Outcome::Unknown(_))
    ));
    let sent = sends(&setup);
    assert_eq!(
        sent.len(),
        1,
        "an unknown write is never sent again blindly"
    );
    assert_eq!(*setup.tools.reconciled.lock().unwrap(), 1);
    let entry = entry(&setup, &invocation.invocation_id, &sent[0].effect_key).await;
    assert_eq!(entry.state(), pb::EffectState::ReconciliationRequired);
    assert!(
        entry.detail.contains("the bank is down"),
        "{}",
        entry.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_settles_what_the_runtime_could_not_and_only_that() {
    let setup = setup(Script {
        execute: vec![
            ("transfer", VecDeque::from([Answer::Lost])),
            (
                "lookup",
                VecDeque::from([Answer::Output(r#"{"status":"active"}"#)]),
            ),
        ],
        reconcile: Some(pb::ToolGatewayServiceReconcileResponse {
            status: pb::ReconcileStatus::Unknown.into(),
            detail: "the bank is down".into(),
            ..Default::default()
        }),
    })
    .await;
    let (flagged, _) = run_one(&setup, "transfer").await;
    let key = sends(&setup)[0].effect_key.clone();
    let (other, _) = run_one(&setup, "lookup").await;
    let settle = |invocation: &str, key: &str, state: pb::EffectState, detail: &str| {
        let request = pb::SettleEffectRequest {
            invocation_id: invocation.into(),
            effect_key: key.into(),
            state: state.into(),
            receipt: "txn-7".into(),
            detail: detail.into(),
            actor: "olga".into(),
        };
        async {
            setup
                .orchestrator
                .settle_effect(Request::new(request))
                .await
        }
    };
    let code = |result: Result<tonic::Response<pb::SettleEffectResponse>, Status>| {
        result.map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code())
    };
    let id = flagged.invocation_id.as_str();
    let committed = pb::EffectState::Committed;
    let refused = [
        (
            settle(id, &key, pb::EffectState::OutcomeUnknown, "checked").await,
            tonic::Code::InvalidArgument,
        ),
        (
            settle(id, &key, committed, " ").await,
            tonic::Code::InvalidArgument,
        ),
        (
            settle("", &key, committed, "checked").await,
            tonic::Code::InvalidArgument,
        ),
        // Another invocation's key, and a key of none, are not the invocation's effects.
        (
            settle(&other.invocation_id, &key, committed, "checked").await,
            tonic::Code::NotFound,
        ),
        (
            settle(id, &"0".repeat(64), committed, "checked").await,
            tonic::Code::NotFound,
        ),
        (
            settle(&uuid_of_none(), &key, committed, "checked").await,
            tonic::Code::NotFound,
        ),
    ];
    for (i, (result, expected)) in refused.into_iter().enumerate() {
        assert_eq!(code(result), expected, "refusal {i}");
    }
    assert_eq!(
        entry(&setup, id, &key).await.state(),
        pb::EffectState::ReconciliationRequired,
        "a refused settlement changes nothing"
    );

    let settled = settle(id, &key, committed, "found in the bank statement")
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(settled.state(), pb::EffectState::Committed);
    assert_eq!(settled.receipt, "txn-7");
    assert_eq!(
        settled.detail,
        "settled by olga: found in the bank statement"
    );
    assert_eq!(entry(&setup, id, &key).await, settled);
    // Settled once: a second verdict is refused, and the first stands.
    let again = settle(id, &key, pb::EffectState::Rejected, "changed my mind").await;
    assert_eq!(code(again), tonic::Code::FailedPrecondition);
    assert_eq!(
        entry(&setup, id, &key).await.state(),
        pb::EffectState::Committed
    );
    // Settling does not restart the invocation.
    let after = setup
        .orchestrator
        .get_invocation(Request::new(pb::GetInvocationRequest {
            invocation_id: id.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    assert_eq!(
        after.terminal_reason(),
        pb::TerminalReason::ReconciliationRequired
    );
    assert_eq!(after.last_seq, flagged.last_seq);
}

fn uuid_of_none() -> String {
    "00000000-0000-4000-8000-000000000000".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_the_executor_applied_is_completed_from_its_answer() {
    let setup = setup(Script {
        execute: vec![("transfer", VecDeque::from([Answer::Lost]))],
        reconcile: Some(pb::ToolGatewayServiceReconcileResponse {
            status: pb::ReconcileStatus::Applied.into(),
            receipt: "txn-9".into(),
            output_json: r#"{"receipt":"txn-9"}"#.into(),
            ..Default::default()
        }),
    })
    .await;
    let (invocation, result) = run_one(&setup, "transfer").await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    assert!(
        matches!(&result.outcome, Some(pb::tool_result::Outcome::Output(o)) if o.output_json.contains("txn-9"))
    );
    let sent = sends(&setup);
    assert_eq!(sent.len(), 1);
    let entry = entry(&setup, &invocation.invocation_id, &sent[0].effect_key).await;
    assert_eq!(entry.state(), pb::EffectState::Committed);
    assert_eq!(entry.receipt, "txn-9");
}
