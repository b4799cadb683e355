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
use agentloop_ledger::{LedgerConfig, LedgerService};
use agentloop_orchestrator::{InProcess, Orchestrator, OrchestratorConfig, Ports, ToolsPort};
use agentloop_policy::{PolicyConfig, PolicyServer};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
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

/// The fake gateway: the demo executor's tools plus an idempotent `upsert`, answers
/// from a script, and a log of every request it got.
struct FaultyTools {
    script: Mutex<Script>,
    executed: Mutex<Vec<pb::ToolGatewayServiceExecuteRequest>>,
    reconciled: Mutex<u32>,
}

#[async_trait]
impl ToolsPort for FaultyTools {
    async fn list_tools(
        &self,
        _request: pb::ListToolsRequest,
    ) -> Result<pb::ListToolsResponse, Status> {
        let mut tools = agentloop_demo_executor::descriptors();
        let mut upsert = tools
            .iter()
            .find(|t| t.name == "transfer")
            .cloned()
            .unwrap();
        upsert.name = "upsert".into();
        upsert.set_side_effect(pb::SideEffect::IdempotentWrite);
        tools.push(upsert);
        Ok(pb::ListToolsResponse { tools })
    }

    async fn execute(
        &self,
        request: pb::ToolGatewayServiceExecuteRequest,
    ) -> Result<pb::ToolGatewayServiceExecuteResponse, Status> {
        let call = request.call.clone().unwrap();
        self.executed.lock().unwrap().push(request);
        let answer = {
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
        };
        use pb::tool_result::Outcome;
        let outcome = match answer {
            Answer::Output(json) => Outcome::Output(pb::ToolOutput {
                output_json: json.into(),
                receipt: "r-1".into(),
            }),
            Answer::RetryableError => Outcome::Error(pb::ToolError {
                error_type: pb::ErrorType::Unavailable.into(),
                message: "busy".into(),
                retryable: true,
                next_allowed_action: pb::NextAction::Retry.into(),
            }),
            Answer::Lost => return Err(Status::unavailable("connection reset")),
        };
        Ok(pb::ToolGatewayServiceExecuteResponse {
            result: Some(pb::ToolResult {
                call_id: call.call_id,
                outcome: Some(outcome),
            }),
        })
    }

    async fn reconcile(
        &self,
        _request: pb::ToolGatewayServiceReconcileRequest,
    ) -> Result<pb::ToolGatewayServiceReconcileResponse, Status> {
        *self.reconciled.lock().unwrap() += 1;
        Ok(self
            .script
            .lock()
            .unwrap()
            .reconcile
            .clone()
            .unwrap_or_default())
    }
}

struct Setup {
    orchestrator: Orchestrator,
    tools: Arc<FaultyTools>,
    ledger: LedgerService,
    _dir: tempfile::TempDir,
}

async fn setup(script: Script) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tools = Arc::new(FaultyTools {
        script: Mutex::new(script),
        executed: Mutex::new(Vec::new()),
        reconciled: Mutex::new(0),
    });
    let descriptors = tools
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .tools;
    let policy = PolicyServer::from_descriptors(&descriptors, &PolicyConfig::default()).unwrap();
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
        decision: Arc::new(DecisionServer::new(None)),
        policy: Arc::new(InProcess(Arc::new(policy))),
        tools: tools.clone(),
        ledger: Arc::new(InProcess(Arc::new(ledger.clone()))),
    };
    let store = SqliteStore::open_in(&dir.path().join("events"))
        .await
        .unwrap();
    let orchestrator = Orchestrator::new(OrchestratorConfig::default(), Arc::new(store), ports);
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
    let mut result = None;
    let all = async {
        while let Some(item) = stream.next().await {
            if let Some(pb::event::Body::Turn(turn)) = item.unwrap().event.unwrap().body
                && turn.turn == 1
            {
                result = turn.results.into_iter().next();
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
    (invocation, result.unwrap())
}

fn sends(setup: &Setup) -> Vec<pb::ToolGatewayServiceExecuteRequest> {
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
