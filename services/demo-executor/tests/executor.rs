#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! The demo executor over real gRPC on 127.0.0.1 port 0.

use std::path::Path;
use std::time::{Duration, Instant};

use agentloop_demo_executor::RecordError;
use agentloop_demo_executor::record::RECORD_FILE_NAME;
use agentloop_demo_executor::{DemoConfig, DemoError, DemoExecutor, FaultConfig, read_record, run};
use agentloop_proto::client::Transport;
use agentloop_proto::client::{self, ClientConfig};
use agentloop_proto::v1::tool_executor_service_client::ToolExecutorServiceClient;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    CheckVerdict, CitedResult, Claim, DescribeRequest, EffectEntry, EffectState, ErrorType,
    NextAction, ReconcileStatus, ToolCall, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceVerifyRequest,
    ToolExecutorServiceVerifyResponse, ToolOutput, ToolResult,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;

struct Server {
    executor: DemoExecutor,
    client: ToolExecutorServiceClient<Transport>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    async fn start(config: DemoConfig) -> Server {
        let executor = DemoExecutor::open(config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = executor.clone();
        let task = tokio::spawn(async move {
            run(
                listener,
                served,
                agentloop_server::Access::default(),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
        });
        let channel = client::connect(&format!("http://{addr}"), ClientConfig::default())
            .await
            .unwrap();
        Server {
            executor,
            client: client::tool_executor(channel),
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        drop(self.client);
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

fn config(dir: &Path) -> DemoConfig {
    DemoConfig {
        data_dir: dir.to_owned(),
        ..DemoConfig::default()
    }
}

fn request(tool: &str, args: &str, effect_key: &str) -> ToolExecutorServiceExecuteRequest {
    ToolExecutorServiceExecuteRequest {
        invocation_id: "inv-1".into(),
        call: Some(ToolCall {
            call_id: "c1".into(),
            tool: tool.into(),
            arguments_json: args.into(),
        }),
        effect_key: effect_key.into(),
        attempt: 1,
        input_answer: None,
    }
}

async fn execute(
    client: &mut ToolExecutorServiceClient<Transport>,
    req: ToolExecutorServiceExecuteRequest,
) -> Result<Outcome, tonic::Status> {
    let result = client.execute(req).await?.into_inner().result.unwrap();
    assert_eq!(result.call_id, "c1");
    Ok(result.outcome.unwrap())
}

async fn reconcile(
    client: &mut ToolExecutorServiceClient<Transport>,
    tool: &str,
    key: &str,
) -> Result<agentloop_proto::v1::ToolExecutorServiceReconcileResponse, tonic::Status> {
    let req = ToolExecutorServiceReconcileRequest {
        tool: tool.into(),
        effect_key: key.into(),
    };
    Ok(client.reconcile(req).await?.into_inner())
}

fn output(outcome: Outcome) -> (serde_json::Value, String) {
    match outcome {
        Outcome::Output(out) => (serde_json::from_str(&out.output_json).unwrap(), out.receipt),
        other => panic!("expected an output, got {other:?}"),
    }
}

fn error(outcome: Outcome) -> agentloop_proto::v1::ToolError {
    match outcome {
        Outcome::Error(error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

const TRANSFER_ARGS: &str = r#"{"from":"alice","to":"bob","amount":4200}"#;

#[tokio::test]
async fn describe_lists_the_three_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let tools = server
        .client
        .describe(DescribeRequest {})
        .await
        .unwrap()
        .into_inner()
        .tools;
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup", "sleep", "transfer"]);
    assert_eq!(tools, agentloop_demo_executor::descriptors());
    server.stop().await;
}

#[tokio::test]
async fn describe_lists_the_verifier_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let verifiers = server
        .client
        .describe(DescribeRequest {})
        .await
        .unwrap()
        .into_inner()
        .verifiers;
    let expected = agentloop_demo_executor::verifiers();
    assert_eq!(verifiers.len(), expected.len());
    assert_eq!(verifiers[0].name, expected[0].name);
    assert_eq!(verifiers[0].description, expected[0].description);
    assert!(verifiers[0].timeout.is_some_and(|t| t.seconds > 0));
    server.stop().await;
}

#[tokio::test]
async fn a_record_of_the_old_format_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path()
            .join(agentloop_demo_executor::record::LEGACY_RECORD_FILE_NAME),
        "{}\n",
    )
    .unwrap();
    assert!(matches!(
        DemoExecutor::open(config(dir.path())),
        Err(DemoError::LegacyRecord { .. })
    ));
}

#[tokio::test]
async fn lookup_serves_builtin_and_file_entries_and_reports_unknown_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.json");
    std::fs::write(&data, r#"{"region": "eu-west"}"#).unwrap();
    let mut server = Server::start(DemoConfig {
        data_file: Some(data),
        ..config(dir.path())
    })
    .await;
    let c = &mut server.client;

    let (out, receipt) = output(
        execute(c, request("lookup", r#"{"key":"profile"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(
        out,
        serde_json::json!({"key": "profile", "value": "active"})
    );
    assert!(receipt.is_empty());
    let (out, _) = output(
        execute(c, request("lookup", r#"{"key":"policy"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(out["value"], "refund-under-100");
    let (out, _) = output(
        execute(c, request("lookup", r#"{"key":"region"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(out["value"], "eu-west");

    let missing = error(
        execute(c, request("lookup", r#"{"key":"nope"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(missing.error_type, ErrorType::NotFound as i32);
    assert!(!missing.retryable);
    assert_eq!(missing.next_allowed_action, NextAction::FixArguments as i32);

    let bad = error(
        execute(c, request("lookup", r#"{"k":"profile"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(bad.error_type, ErrorType::InvalidArguments as i32);

    let unknown = execute(c, request("teleport", "{}", "")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn a_bad_data_file_or_fault_config_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.json");
    std::fs::write(&data, r#"{"region": 7}"#).unwrap();
    let bad_data = DemoExecutor::open(DemoConfig {
        data_file: Some(data),
        ..config(dir.path())
    });
    assert!(matches!(bad_data, Err(DemoError::DataFile { .. })));
    let faults = FaultConfig {
        fail_before_apply: 1.5,
        ..FaultConfig::default()
    };
    let bad_faults = DemoExecutor::open(DemoConfig {
        faults,
        ..config(dir.path())
    });
    assert!(matches!(bad_faults, Err(DemoError::InvalidConfig(_))));
}

#[tokio::test]
async fn sleep_returns_and_stops_promptly_when_the_caller_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let (out, _) = output(
        execute(&mut server.client, request("sleep", r#"{"ms":5}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(out, serde_json::json!({"slept_ms": 5}));
    let too_long = error(
        execute(&mut server.client, request("sleep", r#"{"ms":600001}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(too_long.error_type, ErrorType::InvalidArguments as i32);

    let mut stats = server.executor.watch_stats();
    let mut req = tonic::Request::new(request("sleep", r#"{"ms":60000}"#, ""));
    req.set_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let status = server.client.execute(req).await.unwrap_err();
    // tonic reports an expired grpc-timeout as DEADLINE_EXCEEDED when the server's
    // timer wins and as CANCELLED("Timeout expired") when the client's own does.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The handler's future was dropped: the sleep's guard counted it.
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_cancelled == 1),
    )
    .await
    .expect("the executor never saw the cancellation")
    .unwrap();
    assert_eq!(server.executor.stats().sleeps_started, 2);
    server.stop().await;
}

#[tokio::test]
async fn transfer_applies_once_per_effect_key_even_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let c = &mut server.client;

    let no_key = execute(c, request("transfer", TRANSFER_ARGS, ""))
        .await
        .unwrap_err();
    assert_eq!(no_key.code(), Code::InvalidArgument);
    let long_key = execute(c, request("transfer", TRANSFER_ARGS, &"k".repeat(257)))
        .await
        .unwrap_err();
    assert_eq!(long_key.code(), Code::InvalidArgument);
    let extra = r#"{"from":"alice","to":"bob","amount":1,"memo":"hi"}"#;
    let rejected = error(execute(c, request("transfer", extra, "e0")).await.unwrap());
    assert_eq!(rejected.error_type, ErrorType::InvalidArguments as i32);
    assert_eq!(
        rejected.next_allowed_action,
        NextAction::FixArguments as i32
    );

    let first = execute(c, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    let (out, receipt) = output(first.clone());
    assert_eq!(receipt, "txn-00000001");
    assert_eq!(
        out,
        serde_json::json!({"receipt": "txn-00000001", "from": "alice", "to": "bob", "amount": 4200})
    );
    let again = execute(c, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    assert_eq!(again, first);
    let conflict = error(
        execute(
            c,
            request(
                "transfer",
                r#"{"from":"alice","to":"bob","amount":1}"#,
                "e1",
            ),
        )
        .await
        .unwrap(),
    );
    assert_eq!(conflict.error_type, ErrorType::Conflict as i32);
    let stats = server.executor.stats();
    assert_eq!((stats.applied, stats.deduplicated), (1, 1));
    server.stop().await;

    // A new process over the same data dir remembers the key.
    let mut server = Server::start(config(dir.path())).await;
    let after = execute(&mut server.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    assert_eq!(after, first);
    assert_eq!(server.executor.stats().applied, 0);
    let second = execute(&mut server.client, request("transfer", TRANSFER_ARGS, "e2"))
        .await
        .unwrap();
    assert_eq!(output(second).1, "txn-00000002");
    let record = read_record(dir.path()).unwrap();
    assert_eq!(
        record
            .iter()
            .map(|t| t.effect_key.as_str())
            .collect::<Vec<_>>(),
        ["e1", "e2"]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_torn_last_line_is_ignored_and_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    execute(&mut server.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    server.stop().await;
    let path = dir.path().join(RECORD_FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let clean_len = bytes.len();
    bytes.extend_from_slice(br#"{"effect_key":"e2","invocation_id":"inv"#);
    std::fs::write(&path, &bytes).unwrap();

    let mut server = Server::start(config(dir.path())).await;
    assert_eq!(
        std::fs::read(&path).unwrap().len(),
        clean_len,
        "torn tail not cut off"
    );
    let c = &mut server.client;
    assert_eq!(
        reconcile(c, "transfer", "e1").await.unwrap().status,
        ReconcileStatus::Applied as i32
    );
    assert_eq!(
        reconcile(c, "transfer", "e2").await.unwrap().status,
        ReconcileStatus::NotApplied as i32
    );
    let second = execute(c, request("transfer", TRANSFER_ARGS, "e2"))
        .await
        .unwrap();
    assert_eq!(output(second).1, "txn-00000002");
    assert_eq!(read_record(dir.path()).unwrap().len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn a_damaged_line_before_the_last_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(RECORD_FILE_NAME), "garbage\n{}\n").unwrap();
    assert!(matches!(
        DemoExecutor::open(config(dir.path())),
        Err(DemoError::Record(RecordError::Corrupt { line: 1, .. }))
    ));
}

#[tokio::test]
async fn reconcile_answers_from_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let c = &mut server.client;
    let (_, receipt) = output(
        execute(c, request("transfer", TRANSFER_ARGS, "e1"))
            .await
            .unwrap(),
    );

    let applied = reconcile(c, "transfer", "e1").await.unwrap();
    assert_eq!(applied.status, ReconcileStatus::Applied as i32);
    assert_eq!(applied.receipt, receipt);
    let out: serde_json::Value = serde_json::from_str(&applied.output_json).unwrap();
    assert_eq!(out["amount"], 4200);

    let absent = reconcile(c, "transfer", "never-sent").await.unwrap();
    assert_eq!(absent.status, ReconcileStatus::NotApplied as i32);
    assert!(absent.receipt.is_empty());

    assert_eq!(
        reconcile(c, "transfer", "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        reconcile(c, "transfer", &"k".repeat(257))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        reconcile(c, "lookup", "e1").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        reconcile(c, "teleport", "e1").await.unwrap_err().code(),
        Code::NotFound
    );
    server.stop().await;
}

#[tokio::test]
async fn fail_before_apply_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        fail_before_apply: 1.0,
        seed: Some(7),
        ..FaultConfig::default()
    };
    let mut server = Server::start(DemoConfig {
        faults,
        ..config(dir.path())
    })
    .await;
    let status = execute(&mut server.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let answer = reconcile(&mut server.client, "transfer", "e1")
        .await
        .unwrap();
    assert_eq!(answer.status, ReconcileStatus::NotApplied as i32);
    assert!(read_record(dir.path()).unwrap().is_empty());
    assert_eq!(server.executor.stats().failed_before_apply, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_dropped_reply_still_applied_the_transfer_once() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        drop_reply_after_apply: 1.0,
        seed: Some(7),
        ..FaultConfig::default()
    };
    let mut server = Server::start(DemoConfig {
        faults,
        ..config(dir.path())
    })
    .await;
    for _ in 0..3 {
        let status = execute(&mut server.client, request("transfer", TRANSFER_ARGS, "e1"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
    }
    let answer = reconcile(&mut server.client, "transfer", "e1")
        .await
        .unwrap();
    assert_eq!(answer.status, ReconcileStatus::Applied as i32);
    assert_eq!(answer.receipt, "txn-00000001");
    assert_eq!(read_record(dir.path()).unwrap().len(), 1);
    let stats = server.executor.stats();
    assert_eq!(
        (stats.applied, stats.deduplicated, stats.dropped_replies),
        (1, 2, 3)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_reply_delayed_past_the_deadline_leaves_the_transfer_applied() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        reply_delay_ms: 30_000,
        ..FaultConfig::default()
    };
    let mut server = Server::start(DemoConfig {
        faults,
        ..config(dir.path())
    })
    .await;
    let mut stats = server.executor.watch_stats();
    let mut req = tonic::Request::new(request("transfer", TRANSFER_ARGS, "e1"));
    req.set_timeout(Duration::from_millis(300));
    let status = server.client.execute(req).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), stats.wait_for(|s| s.applied == 1))
        .await
        .unwrap()
        .unwrap();
    let answer = reconcile(&mut server.client, "transfer", "e1")
        .await
        .unwrap();
    assert_eq!(answer.status, ReconcileStatus::Applied as i32);
    server.stop().await;
}

/// `slow_reply` decides which replies wait: none at 0, some (seeded) in between, and the
/// fast ones answer at once while a delay of minutes is configured.
#[tokio::test]
async fn only_the_slow_share_of_replies_is_delayed() {
    for (slow_reply, seed) in [(0.0, 1), (0.5, 7)] {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultConfig {
            reply_delay_ms: 300_000,
            slow_reply,
            seed: Some(seed),
            ..FaultConfig::default()
        };
        let mut server = Server::start(DemoConfig {
            faults,
            ..config(dir.path())
        })
        .await;
        let mut fast = 0;
        for i in 0..20 {
            let mut req = tonic::Request::new(request("transfer", TRANSFER_ARGS, &format!("s{i}")));
            req.set_timeout(Duration::from_millis(500));
            if server.client.execute(req).await.is_ok() {
                fast += 1;
            }
        }
        let stats = server.executor.stats();
        assert_eq!(stats.applied, 20, "every transfer is applied, slow or not");
        assert_eq!(stats.delayed_replies, 20 - fast);
        if slow_reply == 0.0 {
            assert_eq!(fast, 20);
        } else {
            assert!((1..20).contains(&fast), "{fast} fast replies of 20");
        }
        server.stop().await;
    }
}

/// Outcome codes of 24 transfers with distinct keys under 50 % faults.
async fn fault_pattern(seed: u64) -> Vec<Code> {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        fail_before_apply: 0.3,
        drop_reply_after_apply: 0.3,
        seed: Some(seed),
        ..FaultConfig::default()
    };
    let mut server = Server::start(DemoConfig {
        faults,
        ..config(dir.path())
    })
    .await;
    let mut codes = Vec::new();
    for i in 0..24 {
        let code = match execute(
            &mut server.client,
            request("transfer", TRANSFER_ARGS, &format!("e{i}")),
        )
        .await
        {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        codes.push(code);
    }
    // Ground truth: exactly the transfers that were not failed before apply are recorded.
    let stats = server.executor.stats();
    assert_eq!(read_record(dir.path()).unwrap().len() as u64, stats.applied);
    assert_eq!(stats.applied + stats.failed_before_apply, 24);
    server.stop().await;
    codes
}

#[tokio::test]
async fn faults_follow_the_seed() {
    let first = fault_pattern(42).await;
    assert_eq!(first, fault_pattern(42).await);
    assert!(
        first.contains(&Code::Ok) && first.contains(&Code::Unavailable),
        "{first:?}"
    );
    assert_ne!(first, fault_pattern(43).await);
}

// ---- Verify: the transfer_recorded verifier ------------------------------------------

fn committed(effect_key: &str, receipt: &str) -> EffectEntry {
    EffectEntry {
        invocation_id: "inv-1".into(),
        call_id: "c1".into(),
        effect_key: effect_key.into(),
        attempt: 1,
        tool: "transfer".into(),
        state: EffectState::Committed as i32,
        receipt: receipt.into(),
        ..EffectEntry::default()
    }
}

fn cited(tool: &str, args: &str, receipt: &str) -> CitedResult {
    CitedResult {
        call_id: "c1".into(),
        turn: 1,
        tool: tool.into(),
        arguments_json: args.into(),
        result: Some(ToolResult {
            call_id: "c1".into(),
            outcome: Some(Outcome::Output(ToolOutput {
                output_json: "{}".into(),
                receipt: receipt.into(),
            })),
        }),
    }
}

fn claim(effects: Vec<EffectEntry>, cited: Vec<CitedResult>) -> Claim {
    Claim {
        invocation_id: "inv-1".into(),
        tenant: "demo".into(),
        answer: "Moved 42.00 from alice to bob.".into(),
        evidence: vec!["c1".into()],
        cited,
        effects,
        ..Claim::default()
    }
}

async fn verify(
    client: &mut ToolExecutorServiceClient<Transport>,
    verifier: &str,
    claim: Option<Claim>,
) -> Result<ToolExecutorServiceVerifyResponse, tonic::Status> {
    let request = ToolExecutorServiceVerifyRequest {
        verifier: verifier.into(),
        claim,
    };
    Ok(client.verify(request).await?.into_inner())
}

/// Runs a transfer under effect key `key` and returns its receipt.
async fn transfer(client: &mut ToolExecutorServiceClient<Transport>, key: &str) -> String {
    let (_, receipt) = output(
        execute(client, request("transfer", TRANSFER_ARGS, key))
            .await
            .unwrap(),
    );
    assert!(!receipt.is_empty());
    receipt
}

#[tokio::test]
async fn the_verifier_accepts_a_transfer_made_through_execute_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let receipt = transfer(&mut server.client, "e1").await;
    let backed = claim(
        vec![committed("e1", &receipt)],
        vec![cited("transfer", TRANSFER_ARGS, &receipt)],
    );
    let verdict = verify(
        &mut server.client,
        "transfer_recorded",
        Some(backed.clone()),
    )
    .await
    .unwrap();
    assert_eq!(verdict.verdict(), CheckVerdict::Accepted, "{verdict:?}");
    assert!(verdict.reasons.is_empty());
    assert_eq!(verdict.evidence, std::slice::from_ref(&receipt));
    server.stop().await;

    // The verdict rests on the durable record, not on this process's memory.
    let mut server = Server::start(config(dir.path())).await;
    let verdict = verify(&mut server.client, "transfer_recorded", Some(backed))
        .await
        .unwrap();
    assert_eq!(verdict.verdict(), CheckVerdict::Accepted, "{verdict:?}");
    assert_eq!(verdict.evidence, [receipt]);
    server.stop().await;
}

#[tokio::test]
async fn the_verifier_rejects_made_up_receipts_and_effect_keys_naming_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let receipt = transfer(&mut server.client, "e1").await;
    let c = &mut server.client;

    let unknown_key = verify(
        c,
        "transfer_recorded",
        Some(claim(vec![committed("e-made-up", &receipt)], vec![])),
    )
    .await
    .unwrap();
    assert_eq!(unknown_key.verdict(), CheckVerdict::Rejected);
    assert_eq!(unknown_key.reasons.len(), 1, "{unknown_key:?}");
    assert!(
        unknown_key.reasons[0].contains("\"e-made-up\""),
        "{unknown_key:?}"
    );

    let wrong_receipt = verify(
        c,
        "transfer_recorded",
        Some(claim(vec![committed("e1", "txn-12345678")], vec![])),
    )
    .await
    .unwrap();
    assert_eq!(wrong_receipt.verdict(), CheckVerdict::Rejected);
    assert!(
        wrong_receipt.reasons[0].contains("\"txn-12345678\""),
        "{wrong_receipt:?}"
    );

    let made_up_citation = verify(
        c,
        "transfer_recorded",
        Some(claim(
            vec![committed("e1", &receipt)],
            vec![cited("transfer", TRANSFER_ARGS, "txn-99999999")],
        )),
    )
    .await
    .unwrap();
    assert_eq!(made_up_citation.verdict(), CheckVerdict::Rejected);
    assert_eq!(made_up_citation.reasons.len(), 1, "{made_up_citation:?}");
    assert!(made_up_citation.reasons[0].contains("\"txn-99999999\""));
    // What did check out is still named.
    assert_eq!(made_up_citation.evidence, std::slice::from_ref(&receipt));

    // A real receipt cited for another transfer than the one it records.
    let other_transfer = verify(
        c,
        "transfer_recorded",
        Some(claim(
            vec![],
            vec![cited(
                "transfer",
                r#"{"from":"alice","to":"mallory","amount":4200}"#,
                &receipt,
            )],
        )),
    )
    .await
    .unwrap();
    assert_eq!(other_transfer.verdict(), CheckVerdict::Rejected);
    assert!(
        other_transfer.reasons[0].contains("not the one the call asked for"),
        "{other_transfer:?}"
    );

    // Another invocation's claim to this invocation's transfer.
    let mut elsewhere = claim(vec![committed("e1", &receipt)], vec![]);
    elsewhere.invocation_id = "inv-2".into();
    let elsewhere = verify(c, "transfer_recorded", Some(elsewhere))
        .await
        .unwrap();
    assert_eq!(elsewhere.verdict(), CheckVerdict::Rejected);
    assert!(elsewhere.reasons[0].contains("another invocation"));
    server.stop().await;
}

#[tokio::test]
async fn the_verifier_rejects_a_claim_that_rests_on_no_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let receipt = transfer(&mut server.client, "e1").await;
    let c = &mut server.client;
    let not_committed = EffectEntry {
        state: EffectState::OutcomeUnknown as i32,
        ..committed("e1", &receipt)
    };
    for nothing in [
        claim(vec![], vec![]),
        claim(
            vec![not_committed],
            vec![cited("lookup", r#"{"key":"policy"}"#, "")],
        ),
    ] {
        let verdict = verify(c, "transfer_recorded", Some(nothing)).await.unwrap();
        assert_eq!(verdict.verdict(), CheckVerdict::Rejected, "{verdict:?}");
        assert_eq!(verdict.reasons, ["no committed transfer to confirm"]);
        assert!(verdict.evidence.is_empty());
    }
    server.stop().await;
}

#[tokio::test]
async fn verify_refuses_unknown_verifiers_and_requests_without_a_claim() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(config(dir.path())).await;
    let c = &mut server.client;
    let unknown = verify(c, "balance_ok", Some(claim(vec![], vec![])))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("balance_ok"));
    let no_claim = verify(c, "transfer_recorded", None).await.unwrap_err();
    assert_eq!(no_claim.code(), Code::InvalidArgument);
    assert_eq!(
        agentloop_demo_executor::verifiers()
            .iter()
            .map(|v| v.name)
            .collect::<Vec<_>>(),
        ["transfer_recorded"]
    );
    server.stop().await;
}
