#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! The gateway over real gRPC on 127.0.0.1 port 0, in front of a real demo executor
//! and, for `Verify`, of in-test verifier executors.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_server::Access;

use agentloop_demo_executor::{DemoConfig, DemoExecutor, FaultConfig};
use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::client::Transport;
use agentloop_proto::client::{self, ClientConfig};
use agentloop_proto::server::{StageStream, ToolExecutor};
use agentloop_proto::v1::stage_answer::Answer;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_proto::v1::tool_result::{InputRequired, Outcome};
use agentloop_proto::v1::{
    Check, CheckKind, CheckVerdict, CitedResult, Claim, DescribeRequest, DescribeResponse,
    EffectEntry, EffectState, ErrorType, ExecuteStageRequest, InputAction, InputAnswer,
    ListToolsRequest, ReconcileStatus, SideEffect, ToolCall, ToolDescriptor,
    ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteResponse,
    ToolExecutorServiceExecuteStageRequest, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceReconcileResponse, ToolExecutorServiceVerifyRequest,
    ToolExecutorServiceVerifyResponse, ToolGatewayServiceExecuteRequest,
    ToolGatewayServiceReconcileRequest, ToolGatewayServiceVerifyRequest, ToolOutput, ToolResult,
};
use agentloop_tools::{Gateway, GatewayError, GatewayLimits, ToolsConfig, VerifierEntry};
use tokio::sync::{oneshot, watch};
use tonic::Code;

/// A served thing that stops when dropped (the test runtime ends anyway).
struct Served {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn serve_executor(executor: DemoExecutor) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(agentloop_demo_executor::run(
        listener,
        executor,
        Access::default(),
        async {
            let _ = stopped.await;
        },
    ));
    Served { addr, _stop: stop }
}

async fn serve_gateway(gateway: Gateway) -> (Served, ToolGatewayServiceClient<Transport>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(agentloop_tools::run(
        listener,
        gateway,
        Access::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let channel = client::connect(&format!("http://{addr}"), ClientConfig::default())
        .await
        .unwrap();
    (Served { addr, _stop: stop }, client::tool_gateway(channel))
}

struct Setup {
    executor: DemoExecutor,
    client: ToolGatewayServiceClient<Transport>,
    _dir: tempfile::TempDir,
    _served: (Served, Served),
}

async fn setup_with(faults: FaultConfig, limits: GatewayLimits) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.path().to_owned(),
        faults,
        ..DemoConfig::default()
    })
    .unwrap();
    let served_executor = serve_executor(executor.clone()).await;
    let endpoint = format!("http://{}", served_executor.addr);
    let registry =
        ToolsConfig::from_descriptors(&endpoint, agentloop_demo_executor::descriptors()).unwrap();
    let gateway = Gateway::new(registry, limits).await.unwrap();
    let (served_gateway, client) = serve_gateway(gateway).await;
    Setup {
        executor,
        client,
        _dir: dir,
        _served: (served_executor, served_gateway),
    }
}

async fn setup() -> Setup {
    setup_with(FaultConfig::default(), GatewayLimits::default()).await
}

fn request(tool: &str, args: &str, effect_key: &str) -> ToolGatewayServiceExecuteRequest {
    ToolGatewayServiceExecuteRequest {
        invocation_id: "inv-1".into(),
        call: Some(ToolCall {
            call_id: "c1".into(),
            tool: tool.into(),
            arguments_json: args.into(),
        }),
        effect_key: effect_key.into(),
        attempt: 1,
        ..ToolGatewayServiceExecuteRequest::default()
    }
}

fn with_timeout(
    mut req: ToolGatewayServiceExecuteRequest,
    ms: i32,
) -> ToolGatewayServiceExecuteRequest {
    req.timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: ms * 1_000_000,
    });
    req
}

async fn execute(
    client: &mut ToolGatewayServiceClient<Transport>,
    req: ToolGatewayServiceExecuteRequest,
) -> Result<Outcome, tonic::Status> {
    let result = client.execute(req).await?.into_inner().result.unwrap();
    assert_eq!(result.call_id, "c1");
    Ok(result.outcome.unwrap())
}

const TRANSFER_ARGS: &str = r#"{"from":"alice","to":"bob","amount":4200}"#;

#[tokio::test]
async fn list_tools_returns_the_registry_sorted_and_filtered() {
    let mut s = setup().await;
    let all = s
        .client
        .list_tools(ListToolsRequest { names: vec![] })
        .await
        .unwrap()
        .into_inner()
        .tools;
    let names: Vec<_> = all.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup", "sleep", "transfer"]);
    // As described, with the contract version the gateway gives each.
    assert!(all.iter().all(|t| t.digest.len() == 32));
    let undigested: Vec<_> = all
        .iter()
        .map(|t| agentloop_proto::v1::ToolDescriptor {
            digest: String::new(),
            ..t.clone()
        })
        .collect();
    assert_eq!(undigested, agentloop_demo_executor::descriptors());
    let some = s
        .client
        .list_tools(ListToolsRequest {
            names: vec!["transfer".into(), "nope".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert_eq!(
        some.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["transfer"]
    );
}

#[tokio::test]
async fn lookup_goes_through_and_tool_errors_pass_through() {
    let mut s = setup().await;
    match execute(&mut s.client, request("lookup", r#"{"key":"policy"}"#, ""))
        .await
        .unwrap()
    {
        Outcome::Output(out) => assert!(out.output_json.contains("refund-under-100")),
        other => panic!("{other:?}"),
    }
    match execute(&mut s.client, request("lookup", r#"{"key":"nope"}"#, ""))
        .await
        .unwrap()
    {
        Outcome::Error(e) => assert_eq!(e.error_type, ErrorType::NotFound as i32),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn calls_are_timed_by_registered_tool_and_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.path().to_owned(),
        ..DemoConfig::default()
    })
    .unwrap();
    let served = serve_executor(executor).await;
    let registry = ToolsConfig::from_descriptors(
        &format!("http://{}", served.addr),
        agentloop_demo_executor::descriptors(),
    )
    .unwrap();
    let telemetry = agentloop_telemetry::Telemetry::off();
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap()
        .with_telemetry(&telemetry);
    let (_served_gateway, mut client) = serve_gateway(gateway).await;
    for args in [
        r#"{"key":"policy"}"#,
        r#"{"key":"profile"}"#,
        r#"{"key":"nope"}"#,
    ] {
        execute(&mut client, request("lookup", args, ""))
            .await
            .unwrap();
    }
    // Refused before it is forwarded: an RPC error, no call to time.
    execute(&mut client, request("no_such_tool", "{}", ""))
        .await
        .unwrap_err();

    let text = telemetry.metrics().encode();
    let count = |labels: &str| {
        agentloop_telemetry::metrics::sample(
            &text,
            &format!("agentloop_tool_call_duration_seconds_count{{{labels}}}"),
        )
    };
    assert_eq!(
        count(r#"tool="lookup",outcome="output""#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        count(r#"tool="lookup",outcome="error""#),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("no_such_tool"), "{text}");
}

#[tokio::test]
async fn bad_requests_are_refused_before_dispatch() {
    let limits = GatewayLimits {
        max_arguments_bytes: 64,
        ..GatewayLimits::default()
    };
    let mut s = setup_with(FaultConfig::default(), limits).await;
    let unknown = execute(&mut s.client, request("teleport", "{}", ""))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let big = format!(r#"{{"key":"{}"}}"#, "x".repeat(100));
    let too_big = execute(&mut s.client, request("lookup", &big, ""))
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::InvalidArgument);
    let no_key = execute(&mut s.client, request("transfer", TRANSFER_ARGS, ""))
        .await
        .unwrap_err();
    assert_eq!(no_key.code(), Code::InvalidArgument);
    let mut no_call = request("lookup", "{}", "");
    no_call.call = None;
    assert_eq!(
        s.client.execute(no_call).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(s.executor.stats().applied, 0);
}

fn stage_call(
    call_id: &str,
    tool: &str,
    args: &str,
    effect_key: &str,
) -> ToolGatewayServiceExecuteRequest {
    let mut call = request(tool, args, effect_key);
    if let Some(call) = &mut call.call {
        call.call_id = call_id.into();
    }
    call
}

#[tokio::test]
async fn a_stage_answers_each_call_in_order_and_refuses_only_the_bad_ones() {
    let mut s = setup().await;
    let answers = s
        .client
        .execute_stage(ExecuteStageRequest {
            calls: vec![
                stage_call("c1", "lookup", r#"{"key":"policy"}"#, ""),
                stage_call("c2", "transfer", TRANSFER_ARGS, "effect-1"),
                stage_call("c3", "teleport", "{}", ""),
                stage_call("c4", "lookup", r#"{"key":"nope"}"#, ""),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .answers;
    let answers: Vec<Answer> = answers.into_iter().map(|a| a.answer.unwrap()).collect();
    match &answers[..] {
        [
            Answer::Result(found),
            Answer::Refused(write),
            Answer::Refused(unknown),
            Answer::Result(missing),
        ] => {
            assert_eq!(found.call_id, "c1");
            match found.outcome.as_ref().unwrap() {
                Outcome::Output(out) => assert!(out.output_json.contains("refund-under-100")),
                other => panic!("{other:?}"),
            }
            // What `Execute` would have failed with, code and message.
            assert_eq!(Code::from(write.code), Code::InvalidArgument, "{write:?}");
            assert!(write.message.contains("Execute"), "{write:?}");
            assert_eq!(Code::from(unknown.code), Code::NotFound, "{unknown:?}");
            assert_eq!(missing.call_id, "c4");
            match missing.outcome.as_ref().unwrap() {
                Outcome::Error(e) => assert_eq!(e.error_type, ErrorType::NotFound as i32),
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    // The write in the stage was never sent.
    assert_eq!(s.executor.stats().applied, 0);
}

#[tokio::test]
async fn a_stage_over_its_bound_is_refused_whole() {
    let mut s = setup().await;
    let calls = (0..=MAX_STAGE_CALLS)
        .map(|i| stage_call(&format!("c{i}"), "lookup", r#"{"key":"policy"}"#, ""))
        .collect();
    let status = s
        .client
        .execute_stage(ExecuteStageRequest { calls })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn a_stage_runs_its_calls_together_and_a_caller_that_gives_up_cancels_them_all() {
    let s = setup().await;
    let mut stats = s.executor.watch_stats();
    let mut client = s.client.clone();
    let stage = tokio::spawn(async move {
        client
            .execute_stage(ExecuteStageRequest {
                calls: vec![
                    stage_call("c1", "sleep", r#"{"ms":60000}"#, ""),
                    stage_call("c2", "sleep", r#"{"ms":60000}"#, ""),
                ],
            })
            .await
    });
    // Both sleep at once: one after the other, the second would start after 60 s.
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_started == 2),
    )
    .await
    .expect("the calls of the stage did not run together")
    .unwrap();
    stage.abort();
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_cancelled == 2),
    )
    .await
    .expect("the executor never saw the cancellations")
    .unwrap();
}

/// The demo executor, with the RPCs the gateway sent it recorded by name; with
/// `stages` off it answers `ExecuteStage` UNIMPLEMENTED, as an executor from before
/// stages does.
#[derive(Clone)]
struct Recording {
    executor: DemoExecutor,
    stages: bool,
    sent: Arc<Mutex<Vec<&'static str>>>,
}

impl Recording {
    fn sent(&self) -> Vec<&'static str> {
        self.sent.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl ToolExecutorService for Recording {
    async fn describe(
        &self,
        request: tonic::Request<DescribeRequest>,
    ) -> Result<tonic::Response<DescribeResponse>, tonic::Status> {
        self.executor.describe(request).await
    }

    async fn execute(
        &self,
        request: tonic::Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceExecuteResponse>, tonic::Status> {
        self.sent.lock().unwrap().push("Execute");
        self.executor.execute(request).await
    }

    type ExecuteStageStream = StageStream;

    async fn execute_stage(
        &self,
        request: tonic::Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<StageStream>, tonic::Status> {
        self.sent.lock().unwrap().push("ExecuteStage");
        if !self.stages {
            return Err(tonic::Status::unimplemented("no stages"));
        }
        self.executor.execute_stage(request).await
    }

    async fn reconcile(
        &self,
        request: tonic::Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceReconcileResponse>, tonic::Status> {
        self.executor.reconcile(request).await
    }

    async fn verify(
        &self,
        request: tonic::Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceVerifyResponse>, tonic::Status> {
        self.executor.verify(request).await
    }
}

#[tokio::test]
async fn a_stages_reads_go_to_their_executor_in_one_request_or_one_by_one_without_stages() {
    for stages in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let recording = Recording {
            executor: DemoExecutor::open(DemoConfig {
                data_dir: dir.path().to_owned(),
                ..DemoConfig::default()
            })
            .unwrap(),
            stages,
            sent: Arc::default(),
        };
        let served = serve_set(
            agentloop_server::ServiceSet::new()
                .add(agentloop_proto::server::tool_executor(recording.clone())),
        )
        .await;
        let registry = ToolsConfig::from_descriptors(
            &format!("http://{}", served.addr),
            agentloop_demo_executor::descriptors(),
        )
        .unwrap();
        let gateway = Gateway::new(registry, GatewayLimits::default())
            .await
            .unwrap();
        let (_gateway, mut client) = serve_gateway(gateway).await;
        for _ in 0..2 {
            let answers = client
                .execute_stage(ExecuteStageRequest {
                    calls: vec![
                        stage_call("c1", "lookup", r#"{"key":"policy"}"#, ""),
                        stage_call("c2", "lookup", r#"{"key":"nope"}"#, ""),
                        stage_call("c3", "lookup", r#"{"key":"profile"}"#, ""),
                    ],
                })
                .await
                .unwrap()
                .into_inner()
                .answers;
            let outcomes: Vec<(String, Outcome)> = answers
                .into_iter()
                .map(|answer| match answer.answer.unwrap() {
                    Answer::Result(result) => (result.call_id, result.outcome.unwrap()),
                    other => panic!("{other:?}"),
                })
                .collect();
            match &outcomes[..] {
                [
                    (c1, Outcome::Output(policy)),
                    (c2, Outcome::Error(missing)),
                    (c3, Outcome::Output(profile)),
                ] => {
                    assert_eq!([c1, c2, c3], ["c1", "c2", "c3"]);
                    assert!(
                        policy.output_json.contains("refund-under-100"),
                        "{policy:?}"
                    );
                    assert_eq!(missing.error_type, ErrorType::NotFound as i32);
                    assert!(profile.output_json.contains("active"), "{profile:?}");
                }
                other => panic!("stages {stages}: {other:?}"),
            }
        }
        // With stages, one request per stage. Without, the first stage asks once, and
        // from then on every call goes on its own: the answer is remembered.
        let expected: &[&str] = if stages {
            &["ExecuteStage", "ExecuteStage"]
        } else {
            &[
                "ExecuteStage",
                "Execute",
                "Execute",
                "Execute",
                "Execute",
                "Execute",
                "Execute",
            ]
        };
        assert_eq!(recording.sent(), expected, "stages {stages}");
    }
}

#[tokio::test]
async fn a_call_of_a_stage_past_its_deadline_times_out_alone_and_is_cancelled() {
    let mut s = setup().await;
    let mut stats = s.executor.watch_stats();
    // Sent together as one `ExecuteStage`, whose own deadline is the latest of the
    // three, that of the short sleep: ten minutes.
    let stage = ExecuteStageRequest {
        calls: vec![
            with_timeout(stage_call("c1", "sleep", r#"{"ms":60000}"#, ""), 300),
            stage_call("c2", "sleep", r#"{"ms":1}"#, ""),
            stage_call("c3", "lookup", r#"{"key":"policy"}"#, ""),
        ],
    };
    let answers = tokio::time::timeout(Duration::from_secs(30), s.client.execute_stage(stage))
        .await
        .expect("the stage waited past the deadline of its late call")
        .unwrap()
        .into_inner()
        .answers;
    let outcomes: Vec<Outcome> = answers
        .into_iter()
        .map(|answer| match answer.answer.unwrap() {
            Answer::Result(result) => result.outcome.unwrap(),
            other => panic!("{other:?}"),
        })
        .collect();
    match &outcomes[..] {
        [
            Outcome::Error(late),
            Outcome::Output(slept),
            Outcome::Output(found),
        ] => {
            assert_eq!(late.error_type, ErrorType::Timeout as i32, "{late:?}");
            assert!(late.retryable);
            assert!(slept.output_json.contains("slept"), "{slept:?}");
            assert!(found.output_json.contains("refund-under-100"), "{found:?}");
        }
        other => panic!("{other:?}"),
    }
    // Once every call was answered, the stream was dropped, and with it the sleep.
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_cancelled == 1),
    )
    .await
    .expect("the executor never saw the late call cancelled")
    .unwrap();
}

#[tokio::test]
async fn a_caller_that_gives_up_cancels_the_executor_call() {
    let mut s = setup().await;
    let mut stats = s.executor.watch_stats();
    let mut req = tonic::Request::new(request("sleep", r#"{"ms":60000}"#, ""));
    req.set_timeout(Duration::from_millis(300));
    let status = s.client.execute(req).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    // The gateway's handler was dropped, and with it the forwarded call: the
    // executor's sleep was dropped long before its 60 s were up.
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_cancelled == 1),
    )
    .await
    .expect("the executor never saw the cancellation")
    .unwrap();
}

#[tokio::test]
async fn a_read_past_its_deadline_is_a_retryable_timeout() {
    let mut s = setup().await;
    let req = with_timeout(request("sleep", r#"{"ms":60000}"#, ""), 200);
    match execute(&mut s.client, req).await.unwrap() {
        Outcome::Error(e) => {
            assert_eq!(e.error_type, ErrorType::Timeout as i32);
            assert!(e.retryable);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn transfer_is_applied_once_per_effect_key() {
    let mut s = setup().await;
    let first = execute(&mut s.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    let second = execute(&mut s.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    assert_eq!(first, second);
    match first {
        Outcome::Output(out) => assert_eq!(out.receipt, "txn-00000001"),
        other => panic!("{other:?}"),
    }
    let stats = s.executor.stats();
    assert_eq!((stats.applied, stats.deduplicated), (1, 1));

    let applied = s
        .client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "transfer".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applied.status, ReconcileStatus::Applied as i32);
    let absent = s
        .client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "transfer".into(),
            effect_key: "e9".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(absent.status, ReconcileStatus::NotApplied as i32);
    let read_only = s
        .client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "lookup".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(read_only.code(), Code::InvalidArgument);
    let unknown = s
        .client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "nope".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

#[tokio::test]
async fn a_write_to_an_unreachable_executor_is_unavailable_and_not_applied() {
    // A port that was free a moment ago: nothing listens on it.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let registry = ToolsConfig::from_descriptors(
        &format!("http://{closed}"),
        agentloop_demo_executor::descriptors(),
    )
    .unwrap();
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap();
    let (_served, mut client) = serve_gateway(gateway).await;
    match execute(&mut client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap()
    {
        // Nothing was sent: a retryable error, never an unknown outcome.
        Outcome::Error(error) => {
            assert_eq!(error.error_type, ErrorType::Unavailable as i32, "{error:?}");
            assert!(error.retryable);
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    // The executor is unreachable, so Reconcile cannot answer: a retryable status.
    let status = client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "transfer".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test]
async fn a_write_whose_reply_is_late_is_unknown_then_reconciled_as_applied() {
    let faults = FaultConfig {
        reply_delay_ms: 30_000,
        ..FaultConfig::default()
    };
    let mut s = setup_with(faults, GatewayLimits::default()).await;
    let mut stats = s.executor.watch_stats();
    let req = with_timeout(request("transfer", TRANSFER_ARGS, "e1"), 500);
    match execute(&mut s.client, req).await.unwrap() {
        Outcome::Unknown(unknown) => assert!(unknown.detail.contains("may have been applied")),
        other => panic!("expected unknown, got {other:?}"),
    }
    tokio::time::timeout(Duration::from_secs(10), stats.wait_for(|s| s.applied == 1))
        .await
        .unwrap()
        .unwrap();
    let answer = s
        .client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "transfer".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.status, ReconcileStatus::Applied as i32);
    assert_eq!(answer.receipt, "txn-00000001");
}

#[tokio::test]
async fn a_lost_reply_of_a_write_is_unknown() {
    let faults = FaultConfig {
        drop_reply_after_apply: 1.0,
        seed: Some(1),
        ..FaultConfig::default()
    };
    let mut s = setup_with(faults, GatewayLimits::default()).await;
    let outcome = execute(&mut s.client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Unknown(_)), "{outcome:?}");
    assert_eq!(s.executor.stats().applied, 1);
}

#[tokio::test]
async fn invalid_registries_and_limits_are_refused() {
    let bad =
        ToolsConfig::from_descriptors("ftp://127.0.0.1:1", agentloop_demo_executor::descriptors());
    assert!(bad.is_err());
    let registry =
        ToolsConfig::from_descriptors("http://127.0.0.1:1", agentloop_demo_executor::descriptors())
            .unwrap();
    let zero = GatewayLimits {
        max_concurrent_calls_per_executor: 0,
        ..GatewayLimits::default()
    };
    assert!(matches!(
        Gateway::new(registry.clone(), zero).await,
        Err(GatewayError::InvalidLimits(_))
    ));
    let mut duplicate = registry.clone();
    duplicate.tools.push(registry.tools[0].clone());
    assert!(matches!(
        Gateway::new(duplicate, GatewayLimits::default()).await,
        Err(GatewayError::Config(
            agentloop_tools::ConfigError::DuplicateName(_)
        ))
    ));
}

/// An in-process executor answers like a served one: same results, the gateway's
/// deadline still cancels its call, and no network is involved (its endpoint is not
/// served at all).
#[tokio::test]
async fn an_in_process_executor_is_called_without_a_network() {
    let dir = tempfile::tempdir().unwrap();
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.path().to_owned(),
        ..DemoConfig::default()
    })
    .unwrap();
    let endpoint = "http://in-process.localhost";
    let registry =
        ToolsConfig::from_descriptors(endpoint, agentloop_demo_executor::descriptors()).unwrap();
    let service: std::sync::Arc<ToolExecutor> = std::sync::Arc::new(executor.clone());
    let gateway = Gateway::with_in_process(
        registry,
        GatewayLimits::default(),
        vec![(endpoint.to_owned(), service)],
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let (_served, mut client) = serve_gateway(gateway).await;

    match execute(&mut client, request("lookup", r#"{"key":"profile"}"#, ""))
        .await
        .unwrap()
    {
        Outcome::Output(output) => assert!(output.output_json.contains("active")),
        other => panic!("{other:?}"),
    }
    let applied = execute(&mut client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap();
    assert!(matches!(applied, Outcome::Output(_)), "{applied:?}");
    assert_eq!(executor.stats().applied, 1);
    let reconciled = client
        .reconcile(ToolGatewayServiceReconcileRequest {
            tool: "transfer".into(),
            effect_key: "e1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reconciled.status(), ReconcileStatus::Applied);

    let mut stats = executor.watch_stats();
    let late = with_timeout(request("sleep", r#"{"ms":60000}"#, ""), 200);
    match execute(&mut client, late).await.unwrap() {
        Outcome::Error(e) => assert_eq!(e.error_type, ErrorType::Timeout as i32),
        other => panic!("{other:?}"),
    }
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.sleeps_cancelled == 1),
    )
    .await
    .expect("the in-process call was not dropped at the deadline")
    .unwrap();
}

// ---- A tool's question ----------------------------------------------------------------

/// An executor whose one tool, `ask`, asks a question (a huge one when its arguments
/// say `{"big":true}`), and records the answers it is sent with.
#[derive(Clone, Default)]
struct Asking {
    answers: Arc<Mutex<Vec<Option<InputAnswer>>>>,
}

#[tonic::async_trait]
impl ToolExecutorService for Asking {
    async fn describe(
        &self,
        _: tonic::Request<DescribeRequest>,
    ) -> Result<tonic::Response<DescribeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("registered by the test"))
    }

    async fn execute(
        &self,
        request: tonic::Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceExecuteResponse>, tonic::Status> {
        let request = request.into_inner();
        self.answers
            .lock()
            .unwrap()
            .push(request.input_answer.clone());
        let call = request.call.unwrap_or_default();
        let big = call.arguments_json.contains("big");
        let message = if big {
            "?".repeat(5_000)
        } else {
            "which account?".to_owned()
        };
        Ok(tonic::Response::new(ToolExecutorServiceExecuteResponse {
            result: Some(ToolResult {
                call_id: call.call_id,
                outcome: Some(Outcome::InputRequired(InputRequired {
                    message,
                    requested_schema_json: r#"{"type":"object"}"#.into(),
                })),
            }),
        }))
    }

    type ExecuteStageStream = StageStream;

    /// A test executor from before stages: each call comes as an `Execute`.
    async fn execute_stage(
        &self,
        _request: tonic::Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("no stages"))
    }

    async fn reconcile(
        &self,
        _: tonic::Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceReconcileResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("reads only"))
    }

    async fn verify(
        &self,
        _: tonic::Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceVerifyResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no verifiers"))
    }
}

#[tokio::test]
async fn a_tools_question_comes_back_bounded_and_its_answer_is_passed_on_checked() {
    let endpoint = "http://asking.localhost";
    let ask = ToolDescriptor {
        name: "ask".into(),
        description: "asks a person".into(),
        input_schema_json: r#"{"type":"object"}"#.into(),
        side_effect: SideEffect::ReadOnly.into(),
        timeout: Some(prost_types::Duration {
            seconds: 5,
            nanos: 0,
        }),
        ..ToolDescriptor::default()
    };
    let registry = ToolsConfig::from_descriptors(endpoint, vec![ask]).unwrap();
    let executor = Asking::default();
    let service: Arc<ToolExecutor> = Arc::new(executor.clone());
    let gateway = Gateway::with_in_process(
        registry,
        GatewayLimits::default(),
        vec![(endpoint.to_owned(), service)],
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let (_served, mut client) = serve_gateway(gateway).await;
    let answered = |action: InputAction, content: &str| ToolGatewayServiceExecuteRequest {
        input_answer: Some(InputAnswer {
            action: action.into(),
            content_json: content.into(),
        }),
        ..request("ask", "{}", "")
    };

    // The question passes through; the answer reaches the executor as sent.
    match execute(&mut client, answered(InputAction::Accept, r#"{"a":1}"#))
        .await
        .unwrap()
    {
        Outcome::InputRequired(asked) => assert_eq!(asked.message, "which account?"),
        other => panic!("{other:?}"),
    }
    let seen = executor.answers.lock().unwrap().clone();
    assert_eq!(
        seen,
        [Some(InputAnswer {
            action: InputAction::Accept.into(),
            content_json: r#"{"a":1}"#.into(),
        })]
    );

    // A question over the bound is not taken from the executor.
    match execute(&mut client, request("ask", r#"{"big":true}"#, ""))
        .await
        .unwrap()
    {
        Outcome::Error(error) => assert!(error.message.contains("malformed"), "{error:?}"),
        other => panic!("{other:?}"),
    }

    // An answer that cannot be one is refused before anything is sent.
    for (action, content) in [
        (InputAction::Unspecified, ""),
        (InputAction::Accept, ""),
        (InputAction::Decline, "{}"),
        (InputAction::Cancel, "{}"),
    ] {
        let refused = execute(&mut client, answered(action, content))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{action:?}");
    }
    let big = "x".repeat(GatewayLimits::default().max_arguments_bytes + 1);
    let refused = execute(&mut client, answered(InputAction::Accept, &big))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        executor.answers.lock().unwrap().len(),
        2,
        "nothing more was sent"
    );
}

// ---- Verify -------------------------------------------------------------------------

/// An executor that serves verifiers only, each name a behaviour: `accepts`, `rejects`,
/// `mute` (rejects without a reason), `unspecified` (no verdict), `verbose` (too many
/// reasons), `hangs*` (never answers), anything else UNIMPLEMENTED.
#[derive(Clone, Default)]
struct TestVerifiers {
    seen: Arc<Mutex<Vec<ToolExecutorServiceVerifyRequest>>>,
    /// How many `hangs*` calls were dropped (the gateway gave up on them).
    dropped: Arc<watch::Sender<u32>>,
}

struct CountsDrop(Arc<watch::Sender<u32>>);

impl Drop for CountsDrop {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n += 1);
    }
}

fn reply(
    verdict: CheckVerdict,
    reasons: &[&str],
    evidence: &[&str],
) -> Result<tonic::Response<ToolExecutorServiceVerifyResponse>, tonic::Status> {
    Ok(tonic::Response::new(ToolExecutorServiceVerifyResponse {
        verdict: verdict as i32,
        reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
        evidence: evidence.iter().map(|e| (*e).to_owned()).collect(),
    }))
}

#[tonic::async_trait]
impl ToolExecutorService for TestVerifiers {
    async fn describe(
        &self,
        _: tonic::Request<DescribeRequest>,
    ) -> Result<tonic::Response<DescribeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no tools"))
    }

    async fn execute(
        &self,
        _: tonic::Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceExecuteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no tools"))
    }

    type ExecuteStageStream = StageStream;

    /// A test executor from before stages: each call comes as an `Execute`.
    async fn execute_stage(
        &self,
        _request: tonic::Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("no stages"))
    }

    async fn reconcile(
        &self,
        _: tonic::Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceReconcileResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no tools"))
    }

    async fn verify(
        &self,
        request: tonic::Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<tonic::Response<ToolExecutorServiceVerifyResponse>, tonic::Status> {
        let request = request.into_inner();
        self.seen.lock().unwrap().push(request.clone());
        match request.verifier.as_str() {
            "accepts" => reply(CheckVerdict::Accepted, &[], &["rec-1", "rec-2"]),
            "rejects" => reply(
                CheckVerdict::Rejected,
                &["amount differs", "no such account"],
                &["rec-1"],
            ),
            "mute" => reply(CheckVerdict::Rejected, &[], &[]),
            "unspecified" => reply(CheckVerdict::Unspecified, &["?"], &[]),
            "verbose" => {
                let many: Vec<String> = (0..33).map(|i| format!("reason {i}")).collect();
                let many: Vec<&str> = many.iter().map(String::as_str).collect();
                reply(CheckVerdict::Rejected, &many, &[])
            }
            hangs if hangs.starts_with("hangs") => {
                let _guard = CountsDrop(Arc::clone(&self.dropped));
                std::future::pending().await
            }
            _ => Err(tonic::Status::unimplemented(
                "this executor serves no verifier",
            )),
        }
    }
}

/// Serves `services` on 127.0.0.1 port 0.
async fn serve_set(services: agentloop_server::ServiceSet) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(agentloop_server::serve(listener, services, async {
        let _ = stopped.await;
    }));
    Served { addr, _stop: stop }
}

async fn serve_verifiers(verifiers: TestVerifiers) -> Served {
    serve_set(
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::tool_executor(verifiers)),
    )
    .await
}

fn verifier(name: &str, endpoint: &str, timeout_ms: u64) -> VerifierEntry {
    VerifierEntry {
        timeout_ms,
        ..VerifierEntry::new(name, endpoint, "a test verifier")
    }
}

fn registry_of(verifiers: Vec<VerifierEntry>) -> ToolsConfig {
    ToolsConfig {
        verifiers,
        ..ToolsConfig::default()
    }
}

fn claim() -> Claim {
    Claim {
        invocation_id: "inv-1".into(),
        tenant: "t1".into(),
        answer: "done".into(),
        ..Claim::default()
    }
}

fn verify_request(verifier: &str) -> ToolGatewayServiceVerifyRequest {
    ToolGatewayServiceVerifyRequest {
        verifier: verifier.into(),
        claim: Some(claim()),
        timeout: None,
    }
}

async fn verify(
    client: &mut ToolGatewayServiceClient<Transport>,
    request: ToolGatewayServiceVerifyRequest,
) -> Result<Check, tonic::Status> {
    Ok(client.verify(request).await?.into_inner().check.unwrap())
}

fn assert_undecided(check: &Check, says: &str) {
    assert_eq!(check.verdict(), CheckVerdict::Undecided, "{check:?}");
    assert_eq!(check.kind(), CheckKind::Verifier);
    assert_eq!(check.reasons.len(), 1, "{check:?}");
    assert!(check.reasons[0].contains(says), "{check:?}");
    assert!(check.evidence.is_empty(), "{check:?}");
}

struct VerifierSetup {
    verifiers: TestVerifiers,
    client: ToolGatewayServiceClient<Transport>,
    _served: Vec<Served>,
}

/// The test verifiers behind one endpoint, registered under `names` with `timeout_ms`.
async fn verifier_setup(names: &[(&str, u64)]) -> VerifierSetup {
    let verifiers = TestVerifiers::default();
    let executor = serve_verifiers(verifiers.clone()).await;
    let endpoint = format!("http://{}", executor.addr);
    let registry = registry_of(
        names
            .iter()
            .map(|(name, timeout_ms)| verifier(name, &endpoint, *timeout_ms))
            .collect(),
    );
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap();
    let (gateway, client) = serve_gateway(gateway).await;
    VerifierSetup {
        verifiers,
        client,
        _served: vec![executor, gateway],
    }
}

#[tokio::test]
async fn an_accepting_verifier_gives_an_accepted_check_named_after_it() {
    let mut s = verifier_setup(&[("accepts", 5_000)]).await;
    let check = verify(&mut s.client, verify_request("accepts"))
        .await
        .unwrap();
    assert_eq!(
        check,
        Check {
            name: "accepts".into(),
            kind: CheckKind::Verifier as i32,
            verdict: CheckVerdict::Accepted as i32,
            reasons: vec![],
            evidence: vec!["rec-1".into(), "rec-2".into()],
        }
    );
    // The executor was asked about this verifier and this claim.
    let seen = s.verifiers.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [ToolExecutorServiceVerifyRequest {
            verifier: "accepts".into(),
            claim: Some(claim()),
        }]
    );
}

#[tokio::test]
async fn a_rejecting_verifier_passes_its_reasons_on_and_a_mute_one_gets_a_reason() {
    let mut s = verifier_setup(&[("rejects", 5_000), ("mute", 5_000)]).await;
    let rejected = verify(&mut s.client, verify_request("rejects"))
        .await
        .unwrap();
    assert_eq!(rejected.verdict(), CheckVerdict::Rejected);
    assert_eq!(rejected.reasons, ["amount differs", "no such account"]);
    assert_eq!(rejected.evidence, ["rec-1"]);
    let mute = verify(&mut s.client, verify_request("mute")).await.unwrap();
    assert_eq!(mute.verdict(), CheckVerdict::Rejected);
    assert_eq!(mute.reasons.len(), 1);
    assert!(mute.reasons[0].contains("mute"), "{mute:?}");
}

#[tokio::test]
async fn a_verifier_that_never_answers_is_undecided_at_the_smaller_timeout_and_cancelled() {
    let mut s = verifier_setup(&[("hangs", 200), ("hangs_long", 60_000)]).await;
    let mut dropped = s.verifiers.dropped.subscribe();
    // The verifier's own timeout.
    let check = verify(&mut s.client, verify_request("hangs"))
        .await
        .unwrap();
    assert_eq!(check.name, "hangs");
    assert_undecided(&check, "verifier hangs timed out after 200 ms");
    // The request's, when it is the smaller.
    let mut request = verify_request("hangs_long");
    request.timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: 150_000_000,
    });
    let check = verify(&mut s.client, request).await.unwrap();
    assert_undecided(&check, "verifier hangs_long timed out after 150 ms");
    // Both executor calls were dropped, not left running.
    tokio::time::timeout(Duration::from_secs(10), dropped.wait_for(|n| *n == 2))
        .await
        .expect("the executor never saw the gateway give up")
        .unwrap();
}

#[tokio::test]
async fn a_caller_that_gives_up_cancels_the_verifier_call() {
    let mut s = verifier_setup(&[("hangs", 60_000)]).await;
    let mut dropped = s.verifiers.dropped.subscribe();
    let mut request = tonic::Request::new(verify_request("hangs"));
    request.set_timeout(Duration::from_millis(300));
    let status = s.client.verify(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), dropped.wait_for(|n| *n == 1))
        .await
        .expect("the executor never saw the cancellation")
        .unwrap();
}

#[tokio::test]
async fn verifiers_that_cannot_answer_clearly_are_undecided() {
    let verifiers = TestVerifiers::default();
    let executor = serve_verifiers(verifiers.clone()).await;
    let endpoint = format!("http://{}", executor.addr);
    // Serves health and reflection, and no ToolExecutorService at all.
    let bare = serve_set(agentloop_server::ServiceSet::new()).await;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let registry = registry_of(vec![
        verifier("unimplemented", &endpoint, 5_000),
        verifier("unspecified", &endpoint, 5_000),
        verifier("verbose", &endpoint, 5_000),
        verifier("bare", &format!("http://{}", bare.addr), 5_000),
        verifier("down", &format!("http://{closed}"), 5_000),
    ]);
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap();
    let (_served, mut client) = serve_gateway(gateway).await;
    let cases = [
        ("unimplemented", "not served by its executor"),
        ("bare", "not served by its executor"),
        ("unspecified", "no verdict"),
        ("verbose", "beyond bounds: 33 reasons"),
        ("down", "could not be reached"),
    ];
    for (name, says) in cases {
        let check = verify(&mut client, verify_request(name)).await.unwrap();
        assert_eq!(check.name, name);
        assert_undecided(&check, says);
    }
    assert_eq!(verifiers.seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn an_unknown_verifier_is_not_found_and_a_bad_request_is_refused() {
    let mut s = verifier_setup(&[("accepts", 5_000)]).await;
    let unknown = verify(&mut s.client, verify_request("nope"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("nope"));
    let mut no_claim = verify_request("accepts");
    no_claim.claim = None;
    assert_eq!(
        verify(&mut s.client, no_claim).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut negative = verify_request("accepts");
    negative.timeout = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    assert_eq!(
        verify(&mut s.client, negative).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert!(s.verifiers.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn invalid_verifier_registries_are_refused() {
    let twice = registry_of(vec![
        verifier("v", "http://127.0.0.1:1", 5_000),
        verifier("v", "http://127.0.0.1:2", 5_000),
    ]);
    match Gateway::new(twice, GatewayLimits::default()).await {
        Err(GatewayError::Config(agentloop_tools::ConfigError::DuplicateVerifier(name))) => {
            assert_eq!(name, "v");
        }
        other => panic!("{other:?}"),
    }
    for timeout_ms in [0, 600_001] {
        let bad = registry_of(vec![verifier("v", "http://127.0.0.1:1", timeout_ms)]);
        assert!(
            matches!(
                Gateway::new(bad, GatewayLimits::default()).await,
                Err(GatewayError::Config(
                    agentloop_tools::ConfigError::InvalidVerifier { .. }
                ))
            ),
            "{timeout_ms}"
        );
    }
    let bad_endpoint = registry_of(vec![verifier("v", "ftp://127.0.0.1:1", 5_000)]);
    assert!(
        Gateway::new(bad_endpoint, GatewayLimits::default())
            .await
            .is_err()
    );
    let text = "[[verifiers]]\nname = \"v\"\nendpoint = \"http://127.0.0.1:1\"\ndescription = \"d\"\ntimeout_ms = 0\n";
    assert!(matches!(
        ToolsConfig::parse(text),
        Err(agentloop_tools::ConfigError::InvalidVerifier { .. })
    ));
}

/// `Verify` is behind the caller check that guards `Execute`: no token, no verdict.
#[tokio::test]
async fn verify_is_guarded_like_execute() {
    let verifiers = TestVerifiers::default();
    let executor = serve_verifiers(verifiers.clone()).await;
    let registry = registry_of(vec![verifier(
        "accepts",
        &format!("http://{}", executor.addr),
        5_000,
    )]);
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap();
    let token = "orchestrator-token-0123456789abcdef";
    let access = Access {
        callers: Some(
            agentloop_auth::Callers::from_tokens([("orchestrator".to_owned(), token.to_owned())])
                .unwrap(),
        ),
        tls: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(agentloop_tools::run(listener, gateway, access, async {
        let _ = stopped.await;
    }));
    let endpoint = format!("http://{addr}");
    let mut anonymous = client::tool_gateway(
        client::connect(&endpoint, ClientConfig::default())
            .await
            .unwrap(),
    );
    let refused = verify(&mut anonymous, verify_request("accepts"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let execute_refused = anonymous
        .execute(request("lookup", "{}", ""))
        .await
        .unwrap_err();
    assert_eq!(execute_refused.code(), Code::Unauthenticated);
    assert!(verifiers.seen.lock().unwrap().is_empty());

    let as_orchestrator = ClientConfig::default().with_bearer(Some(token)).unwrap();
    let mut orchestrator =
        client::tool_gateway(client::connect(&endpoint, as_orchestrator).await.unwrap());
    let check = verify(&mut orchestrator, verify_request("accepts"))
        .await
        .unwrap();
    assert_eq!(check.verdict(), CheckVerdict::Accepted);
}

/// The orchestrator may call the gateway in its own process, and the gateway may call
/// the executor in its own: the same checks, the same timeout, the same cancellation.
#[tokio::test]
async fn an_in_process_verifier_is_called_through_the_trait_without_a_network() {
    let verifiers = TestVerifiers::default();
    let mut dropped = verifiers.dropped.subscribe();
    let endpoint = "http://in-process.localhost";
    let service: Arc<ToolExecutor> = Arc::new(verifiers.clone());
    let gateway = Gateway::with_in_process(
        registry_of(vec![
            verifier("accepts", endpoint, 5_000),
            verifier("hangs", endpoint, 100),
        ]),
        GatewayLimits::default(),
        vec![(endpoint.to_owned(), service)],
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let accepted =
        ToolGatewayService::verify(&gateway, tonic::Request::new(verify_request("accepts")))
            .await
            .unwrap()
            .into_inner()
            .check
            .unwrap();
    assert_eq!(accepted.verdict(), CheckVerdict::Accepted);
    let hung = ToolGatewayService::verify(&gateway, tonic::Request::new(verify_request("hangs")))
        .await
        .unwrap()
        .into_inner()
        .check
        .unwrap();
    assert_undecided(&hung, "timed out after 100 ms");
    tokio::time::timeout(Duration::from_secs(10), dropped.wait_for(|n| *n == 1))
        .await
        .expect("the in-process verifier was not dropped at the deadline")
        .unwrap();
    let unknown = ToolGatewayService::verify(&gateway, tonic::Request::new(verify_request("nope")))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

/// The demo executor's verifier, registered at the endpoint of its tools, confirms a
/// transfer made through the gateway and rejects one it never made.
#[tokio::test]
async fn the_demo_verifier_confirms_a_transfer_made_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.path().to_owned(),
        ..DemoConfig::default()
    })
    .unwrap();
    let served = serve_executor(executor.clone()).await;
    let endpoint = format!("http://{}", served.addr);
    let mut registry =
        ToolsConfig::from_descriptors(&endpoint, agentloop_demo_executor::descriptors()).unwrap();
    registry.verifiers = agentloop_demo_executor::verifiers()
        .into_iter()
        .map(|v| VerifierEntry::new(v.name, &endpoint, v.description))
        .collect();
    let gateway = Gateway::new(registry, GatewayLimits::default())
        .await
        .unwrap();
    let (_gateway, mut client) = serve_gateway(gateway).await;

    let receipt = match execute(&mut client, request("transfer", TRANSFER_ARGS, "e1"))
        .await
        .unwrap()
    {
        Outcome::Output(out) => out.receipt,
        other => panic!("{other:?}"),
    };
    let made = |receipt: &str| Claim {
        effects: vec![EffectEntry {
            invocation_id: "inv-1".into(),
            call_id: "c1".into(),
            effect_key: "e1".into(),
            attempt: 1,
            tool: "transfer".into(),
            state: EffectState::Committed as i32,
            receipt: receipt.into(),
            ..EffectEntry::default()
        }],
        cited: vec![CitedResult {
            call_id: "c1".into(),
            turn: 1,
            tool: "transfer".into(),
            arguments_json: TRANSFER_ARGS.into(),
            result: Some(ToolResult {
                call_id: "c1".into(),
                outcome: Some(Outcome::Output(ToolOutput {
                    output_json: "{}".into(),
                    receipt: receipt.into(),
                })),
            }),
        }],
        ..claim()
    };
    let ask = |claim: Claim| ToolGatewayServiceVerifyRequest {
        verifier: agentloop_demo_executor::TRANSFER_RECORDED.into(),
        claim: Some(claim),
        timeout: None,
    };
    let accepted = verify(&mut client, ask(made(&receipt))).await.unwrap();
    assert_eq!(accepted.verdict(), CheckVerdict::Accepted, "{accepted:?}");
    assert_eq!(accepted.name, "transfer_recorded");
    assert_eq!(accepted.evidence, std::slice::from_ref(&receipt));
    let rejected = verify(&mut client, ask(made("txn-99999999")))
        .await
        .unwrap();
    assert_eq!(rejected.verdict(), CheckVerdict::Rejected, "{rejected:?}");
    assert_eq!(rejected.reasons.len(), 2, "{rejected:?}");
    // Tools and verifiers are looked up apart: a tool is not a verifier.
    let mut tool = ask(made(&receipt));
    tool.verifier = "transfer".into();
    assert_eq!(
        verify(&mut client, tool).await.unwrap_err().code(),
        Code::NotFound
    );
}

/// A call planned under a tool's contract version runs only while the tool still has
/// it: one planned under another is answered CONFLICT and never reaches the executor,
/// and a digest that is none is refused as the bad input it is.
#[tokio::test]
async fn a_call_planned_under_another_contract_is_not_sent() {
    let mut s = setup().await;
    let listed = s
        .client
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let transfer = listed.tools.iter().find(|t| t.name == "transfer").unwrap();
    assert_eq!(transfer.digest.len(), 32);
    let args = r#"{"from":"a","to":"b","amount":5}"#;

    let stale = ToolGatewayServiceExecuteRequest {
        descriptor_digest: "0".repeat(32),
        ..request("transfer", args, "key-stale")
    };
    match execute(&mut s.client, stale).await.unwrap() {
        Outcome::Error(error) => {
            assert_eq!(error.error_type, ErrorType::Conflict as i32, "{error:?}");
            assert!(!error.retryable);
            assert!(
                error.message.contains(&transfer.digest),
                "{}",
                error.message
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.executor.stats().applied,
        0,
        "the stale call reached the executor"
    );

    let malformed = ToolGatewayServiceExecuteRequest {
        descriptor_digest: "not a digest".into(),
        ..request("transfer", args, "key-malformed")
    };
    let refused = execute(&mut s.client, malformed).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("descriptor_digest"),
        "{refused:?}"
    );
    assert_eq!(s.executor.stats().applied, 0);

    let current = ToolGatewayServiceExecuteRequest {
        descriptor_digest: transfer.digest.clone(),
        ..request("transfer", args, "key-current")
    };
    assert!(matches!(
        execute(&mut s.client, current).await.unwrap(),
        Outcome::Output(_)
    ));
    assert_eq!(s.executor.stats().applied, 1);
}
