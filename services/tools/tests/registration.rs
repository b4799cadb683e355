#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! Executors that register themselves: the gateway describes a real second executor
//! process by its endpoint alone, notices when it goes away (its calls answer
//! `unavailable` at once) and when it comes back, refuses names claimed twice and
//! descriptions that break the rules, and serves `RegisterExecutor` and
//! `DeregisterExecutor` over gRPC.
//!
//! The second process is this test binary run again as the ignored test
//! [`child_executor`], which serves the demo executor on the port it is given.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_proto::client::{self, ClientConfig, Transport};
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DeregisterExecutorRequest, DescribeRequest, DescribeResponse, ErrorType, ListToolsRequest,
    ListToolsResponse, RegisterExecutorRequest, SideEffect, ToolCall, ToolDescriptor,
    ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteResponse,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse,
    ToolExecutorServiceVerifyRequest, ToolExecutorServiceVerifyResponse,
    ToolGatewayServiceExecuteRequest, VerifierDescriptor,
};
use agentloop_server::Access;
use agentloop_tools::{ExecutorEntry, Gateway, GatewayLimits, ToolsConfig};
use tokio::sync::oneshot;
use tonic::{Code, Request, Response, Status};

const CHILD_DIR: &str = "AGENTLOOP_TEST_CHILD_EXECUTOR_DIR";
const CHILD_PORT: &str = "AGENTLOOP_TEST_CHILD_EXECUTOR_PORT";

/// Not a test: the second executor process of the tests below, which run this binary
/// again with it selected. It serves the demo executor on `CHILD_PORT` (0: any) and
/// prints the port it bound, then serves until it is killed.
#[test]
#[ignore = "the executor process the registration tests start"]
fn child_executor() {
    let (Ok(dir), Ok(port)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_PORT)) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let executor = DemoExecutor::open(DemoConfig {
            data_dir: dir.into(),
            ..DemoConfig::default()
        })
        .unwrap();
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
            .await
            .unwrap();
        println!("listening on {}", listener.local_addr().unwrap().port());
        agentloop_demo_executor::run(
            listener,
            executor,
            Access::default(),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
}

/// A second executor process; killed when dropped.
struct ChildExecutor {
    child: Child,
    port: u16,
}

impl ChildExecutor {
    /// Starts one over `dir` on `port` (0: any) and waits until it has bound it.
    fn start(dir: &std::path::Path, port: u16) -> ChildExecutor {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_executor",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir)
            .env(CHILD_PORT, port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // The harness prints its own words first, on the same line; the child's say it
        // is bound.
        let port = BufReader::new(stdout)
            .lines()
            .map(Result::unwrap)
            .find_map(|line| {
                line.split_once("listening on ")
                    .map(|(_, port)| port.to_owned())
            })
            .expect("the child executor did not start")
            .parse()
            .unwrap();
        ChildExecutor { child, port }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ChildExecutor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Health checked every 50 ms, so a test waits for a change in tens of milliseconds;
/// the waits below are bounded by [`eventually`], never by a sleep.
fn limits() -> GatewayLimits {
    GatewayLimits {
        health_check_ms: 50,
        describe_timeout_ms: 2_000,
        ..GatewayLimits::default()
    }
}

async fn serve_gateway(
    gateway: Gateway,
) -> (oneshot::Sender<()>, ToolGatewayServiceClient<Transport>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
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
    (stop, client::tool_gateway(channel))
}

async fn list(client: &mut ToolGatewayServiceClient<Transport>) -> ListToolsResponse {
    client
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
}

/// Polls `check` every 20 ms until it holds, for at most 20 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lookup(call_id: &str) -> ToolGatewayServiceExecuteRequest {
    ToolGatewayServiceExecuteRequest {
        invocation_id: "inv-1".into(),
        call: Some(ToolCall {
            call_id: call_id.into(),
            tool: "lookup".into(),
            arguments_json: r#"{"key":"policy"}"#.into(),
        }),
        attempt: 1,
        ..ToolGatewayServiceExecuteRequest::default()
    }
}

async fn outcome(
    client: &mut ToolGatewayServiceClient<Transport>,
    request: ToolGatewayServiceExecuteRequest,
) -> Outcome {
    client
        .execute(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap()
        .outcome
        .unwrap()
}

#[tokio::test]
async fn an_executor_named_by_endpoint_is_described_goes_away_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let first = ChildExecutor::start(dir.path(), 0);
    let endpoint = first.endpoint();
    let registry = ToolsConfig {
        executors: vec![ExecutorEntry::new(&endpoint)],
        ..ToolsConfig::default()
    };
    let gateway = Gateway::new(registry, limits()).await.unwrap();
    let (_stop, mut client) = serve_gateway(gateway).await;

    // Described at start: names, schemas, side effects and timeouts from Describe.
    let listed = list(&mut client).await;
    let names: Vec<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup", "sleep", "transfer"]);
    let transfer = listed.tools.iter().find(|t| t.name == "transfer").unwrap();
    assert_eq!(transfer.side_effect(), SideEffect::Write);
    assert!(transfer.input_schema_json.contains("amount"));
    assert_eq!(transfer.digest.len(), 32);
    assert!(listed.tools.iter().all(|t| !t.unavailable));
    assert!(!listed.registry_digest.is_empty());
    match outcome(&mut client, lookup("c1")).await {
        Outcome::Output(output) => assert!(output.output_json.contains("policy")),
        other => panic!("{other:?}"),
    }

    // Gone: the next call answers UNAVAILABLE at once (its tool's timeout is seconds
    // away), and from then on the tools are listed unavailable.
    let port = first.port;
    first.kill();
    match outcome(&mut client, lookup("c2")).await {
        Outcome::Error(error) => {
            assert_eq!(error.error_type, ErrorType::Unavailable as i32, "{error:?}");
            assert!(error.retryable);
        }
        other => panic!("{other:?}"),
    }
    assert!(list(&mut client).await.tools.iter().all(|t| t.unavailable));
    match outcome(&mut client, lookup("c3")).await {
        Outcome::Error(error) => {
            assert_eq!(error.error_type, ErrorType::Unavailable as i32);
            assert!(error.message.contains("unavailable"), "{}", error.message);
        }
        other => panic!("{other:?}"),
    }
    // The registry did not change: only availability did.
    assert_eq!(
        list(&mut client).await.registry_digest,
        listed.registry_digest
    );

    // Back on the same port: the health check notices, the tools are available again
    // and their calls run.
    let _second = ChildExecutor::start(dir.path(), port);
    eventually("the executor to be available again", || {
        let mut client = client.clone();
        async move { list(&mut client).await.tools.iter().all(|t| !t.unavailable) }
    })
    .await;
    match outcome(&mut client, lookup("c4")).await {
        Outcome::Output(output) => assert!(output.output_json.contains("policy")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn executors_register_over_grpc_and_the_first_keeps_a_name() {
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = ChildExecutor::start(first_dir.path(), 0);
    let second = ChildExecutor::start(second_dir.path(), 0);
    let gateway = Gateway::new(ToolsConfig::default(), limits())
        .await
        .unwrap();
    let (_stop, mut client) = serve_gateway(gateway).await;
    assert!(list(&mut client).await.tools.is_empty());

    let registered = client
        .register_executor(RegisterExecutorRequest {
            endpoint: first.endpoint(),
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = registered.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup", "sleep", "transfer"]);
    assert_eq!(registered.verifiers, ["transfer_recorded"]);
    let before = list(&mut client).await;
    assert_eq!(before.tools.len(), 3);

    // The same names from a second executor: refused loudly, the first keeps them.
    let refused = client
        .register_executor(RegisterExecutorRequest {
            endpoint: second.endpoint(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists);
    assert!(
        refused.message().contains(&first.endpoint()),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains(&second.endpoint()),
        "{}",
        refused.message()
    );
    assert_eq!(
        list(&mut client).await.registry_digest,
        before.registry_digest
    );
    assert!(matches!(
        outcome(&mut client, lookup("c1")).await,
        Outcome::Output(_)
    ));

    // Registering again describes again and changes nothing.
    client
        .register_executor(RegisterExecutorRequest {
            endpoint: first.endpoint(),
        })
        .await
        .unwrap();
    assert_eq!(
        list(&mut client).await.registry_digest,
        before.registry_digest
    );

    // Deregistered, its tools are gone; the second may now take the names.
    let removed = client
        .deregister_executor(DeregisterExecutorRequest {
            endpoint: first.endpoint(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.tools, ["lookup", "sleep", "transfer"]);
    assert!(list(&mut client).await.tools.is_empty());
    let gone = client.execute(lookup("c2")).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    client
        .register_executor(RegisterExecutorRequest {
            endpoint: second.endpoint(),
        })
        .await
        .unwrap();
    assert_eq!(list(&mut client).await.tools.len(), 3);

    // Nothing registered there, or no executor there at all.
    let unknown = client
        .deregister_executor(DeregisterExecutorRequest {
            endpoint: first.endpoint(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let nobody = client
        .register_executor(RegisterExecutorRequest {
            endpoint: "http://127.0.0.1:1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(nobody.code(), Code::Unavailable, "{nobody:?}");
    let not_a_url = client
        .register_executor(RegisterExecutorRequest {
            endpoint: "not a url".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(not_a_url.code(), Code::InvalidArgument);
}

/// An executor that describes whatever it is given.
struct Describes(DescribeResponse);

#[tonic::async_trait]
impl ToolExecutorService for Describes {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(self.0.clone()))
    }

    async fn execute(
        &self,
        _request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        Err(Status::unimplemented("describes only"))
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
        _request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        Err(Status::unimplemented("describes only"))
    }

    async fn verify(
        &self,
        _request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        Err(Status::unimplemented("describes only"))
    }
}

fn descriptor(name: &str, schema: &str, timeout_ms: u64) -> ToolDescriptor {
    ToolDescriptor {
        name: name.into(),
        description: "d".into(),
        input_schema_json: schema.into(),
        side_effect: SideEffect::ReadOnly.into(),
        timeout: Some(prost_types::Duration {
            seconds: i64::try_from(timeout_ms / 1000).unwrap(),
            nanos: i32::try_from(timeout_ms % 1000 * 1_000_000).unwrap(),
        }),
        ..ToolDescriptor::default()
    }
}

#[tokio::test]
async fn a_description_that_breaks_the_rules_is_refused_naming_the_executor_and_the_tool() {
    let good = || descriptor("fine", r#"{"type":"object"}"#, 1_000);
    let cases = [
        (
            "an invalid schema",
            vec![good(), descriptor("bad_schema", r#"{"type": 12}"#, 1_000)],
            Vec::new(),
            "bad_schema",
        ),
        (
            "a schema that is not JSON",
            vec![descriptor("not_json", "{", 1_000)],
            Vec::new(),
            "not_json",
        ),
        ("a duplicate name", vec![good(), good()], Vec::new(), "fine"),
        (
            "an absurd timeout",
            vec![descriptor("forever", "{}", 86_400_000)],
            Vec::new(),
            "forever",
        ),
        (
            "no timeout",
            vec![ToolDescriptor {
                timeout: None,
                ..descriptor("untimed", "{}", 1)
            }],
            Vec::new(),
            "untimed",
        ),
        (
            "a name models cannot call",
            vec![descriptor("has space", "{}", 1_000)],
            Vec::new(),
            "has space",
        ),
        (
            "a verifier with an absurd timeout",
            vec![good()],
            vec![VerifierDescriptor {
                name: "slow_check".into(),
                description: "d".into(),
                timeout: Some(prost_types::Duration {
                    seconds: 86_400,
                    nanos: 0,
                }),
            }],
            "slow_check",
        ),
    ];
    let gateway = Gateway::new(ToolsConfig::default(), limits())
        .await
        .unwrap();
    let (_stop, mut client) = serve_gateway(gateway).await;
    for (what, tools, verifiers, named) in cases {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (_stop_executor, stopped) = oneshot::channel::<()>();
        let executor = Describes(DescribeResponse { tools, verifiers });
        tokio::spawn(agentloop_server::serve(
            listener,
            agentloop_server::ServiceSet::new()
                .add(agentloop_proto::server::tool_executor(executor)),
            async {
                let _ = stopped.await;
            },
        ));
        let refused = client
            .register_executor(RegisterExecutorRequest {
                endpoint: endpoint.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert!(
            refused.message().contains(&endpoint),
            "{what}: {}",
            refused.message()
        );
        assert!(
            refused.message().contains(named),
            "{what}: {}",
            refused.message()
        );
        // Nothing of it was registered.
        assert!(list(&mut client).await.tools.is_empty(), "{what}");
    }
}

/// An executor the registry names that is not up when the gateway starts is described
/// once it answers: the gateway starts without it and takes its tools then.
#[tokio::test]
async fn an_executor_that_starts_after_the_gateway_is_described_when_it_answers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let registry = ToolsConfig {
        executors: vec![ExecutorEntry::new(&format!("http://127.0.0.1:{port}"))],
        ..ToolsConfig::default()
    };
    let gateway = Gateway::new(registry, limits()).await.unwrap();
    let (_stop, mut client) = serve_gateway(gateway).await;
    assert!(list(&mut client).await.tools.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let _late = ChildExecutor::start(dir.path(), port);
    eventually("the late executor's tools", || {
        let mut client = client.clone();
        async move { list(&mut client).await.tools.len() == 3 }
    })
    .await;
    assert!(matches!(
        outcome(&mut client, lookup("c1")).await,
        Outcome::Output(_)
    ));
}
