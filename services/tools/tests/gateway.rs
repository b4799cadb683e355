#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! The gateway over real gRPC on 127.0.0.1 port 0, in front of a real demo executor.

use std::net::SocketAddr;
use std::time::Duration;

use agentloop_server::Access;

use agentloop_demo_executor::{DemoConfig, DemoExecutor, FaultConfig};
use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::client::Transport;
use agentloop_proto::client::{self, ClientConfig};
use agentloop_proto::v1::stage_answer::Answer;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    ErrorType, ExecuteStageRequest, ListToolsRequest, ReconcileStatus, ToolCall,
    ToolGatewayServiceExecuteRequest, ToolGatewayServiceReconcileRequest,
};
use agentloop_tools::{Gateway, GatewayError, GatewayLimits, ToolsConfig};
use tokio::sync::oneshot;
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
        timeout: None,
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
    assert_eq!(all, agentloop_demo_executor::descriptors());
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
async fn a_write_to_an_unreachable_executor_is_not_started() {
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
        Outcome::NotStarted(reason) => assert!(!reason.reason.is_empty()),
        other => panic!("expected not_started, got {other:?}"),
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
    let service: std::sync::Arc<
        dyn agentloop_proto::v1::tool_executor_service_server::ToolExecutorService,
    > = std::sync::Arc::new(executor.clone());
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
