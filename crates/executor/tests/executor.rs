#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! An executor built on the library, served over real gRPC on 127.0.0.1 port 0 and
//! called with the generated client.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop_auth::Callers;
use agentloop_executor::{
    BuildError, CallError, Context, Disposition, Executor, ExecutorService, Record, SideEffect,
    Tool, Verdict, Verifier,
};
use agentloop_proto::MAX_STAGE_CALLS;
use agentloop_proto::client::{self, ClientConfig, Transport};
use agentloop_proto::v1::stage_answer::Answer;
use agentloop_proto::v1::tool_executor_service_client::ToolExecutorServiceClient;
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    CheckVerdict, Claim, DescribeRequest, DescribeResponse, EffectEntry, ErrorType, NextAction,
    ReconcileStatus, ToolCall, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceExecuteStageRequest,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse,
    ToolExecutorServiceVerifyRequest, ToolExecutorServiceVerifyResponse,
};
use agentloop_server::Access;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Bounds every wait of a test, so a bug fails it instead of hanging it.
const WITHIN: Duration = Duration::from_secs(10);
const SERVICE: &str = "agentloop.v1.ToolExecutorService";

// ---- The tools under test ----------------------------------------------------------

/// Arguments of `echo`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EchoArgs {
    /// What to say back.
    #[schemars(length(min = 1))]
    text: String,
    /// How many times.
    #[serde(default = "one")]
    times: u8,
}

fn one() -> u8 {
    1
}

#[derive(Debug, Serialize)]
struct Echoed {
    text: String,
    caller: Option<String>,
}

/// A read-only tool: says its text back, as often as asked, naming the caller.
struct Echo;

impl Tool for Echo {
    const NAME: &'static str = "echo";
    const DESCRIPTION: &'static str = "Says the text back.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    const TIMEOUT: Duration = Duration::from_millis(1500);
    type Args = EchoArgs;
    type Output = Echoed;

    async fn call(&self, args: EchoArgs, ctx: &Context) -> Result<Echoed, CallError> {
        Ok(Echoed {
            text: args.text.repeat(usize::from(args.times)),
            caller: ctx.caller().map(str::to_owned),
        })
    }
}

/// Arguments of `credit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreditArgs {
    account: String,
    cents: u64,
}

#[derive(Debug, Serialize)]
struct Credited {
    receipt: String,
    account: String,
    cents: u64,
}

/// A write: counts its calls, so a test sees how often the tool really ran. With a
/// gate, each call reports that it entered and waits for the gate to open.
#[derive(Default)]
struct Credit {
    calls: Arc<AtomicUsize>,
    gate: Option<(mpsc::UnboundedSender<()>, Arc<Notify>)>,
}

impl Tool for Credit {
    const NAME: &'static str = "credit";
    const DESCRIPTION: &'static str = "Credits an account, once per effect key.";
    const SIDE_EFFECT: SideEffect = SideEffect::Write;
    const TIMEOUT: Duration = Duration::from_secs(10);
    const REQUIRES_APPROVAL: bool = true;
    type Args = CreditArgs;
    type Output = Credited;

    fn receipt(output: &Credited) -> String {
        output.receipt.clone()
    }

    async fn call(&self, args: CreditArgs, ctx: &Context) -> Result<Credited, CallError> {
        if args.cents == 0 {
            return Err(CallError::rejected("nothing to credit"));
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((entered, open)) = &self.gate {
            let _ = entered.send(());
            open.notified().await;
        }
        Ok(Credited {
            receipt: format!("cr-{n}-{}", ctx.effect_key()),
            account: args.account,
            cents: args.cents,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
struct HangArgs {}

/// A read-only tool that hands its cancellation token to the test, then never returns.
struct Hang {
    tokens: mpsc::UnboundedSender<CancellationToken>,
}

impl Tool for Hang {
    const NAME: &'static str = "hang";
    const DESCRIPTION: &'static str = "Never returns.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    const TIMEOUT: Duration = Duration::from_secs(600);
    type Args = HangArgs;
    type Output = ();

    async fn call(&self, _args: HangArgs, ctx: &Context) -> Result<(), CallError> {
        let _ = self.tokens.send(ctx.cancellation().clone());
        std::future::pending().await
    }
}

/// `hang`, with a timeout short enough to pass in a test.
struct Slow {
    tokens: mpsc::UnboundedSender<CancellationToken>,
}

impl Tool for Slow {
    const NAME: &'static str = "slow";
    const DESCRIPTION: &'static str = "Never returns before its timeout.";
    const SIDE_EFFECT: SideEffect = SideEffect::IdempotentWrite;
    const TIMEOUT: Duration = Duration::from_millis(100);
    type Args = HangArgs;
    type Output = ();

    fn input_schema() -> schemars::Schema {
        schemars::json_schema!({ "type": "object", "additionalProperties": false })
    }

    async fn call(&self, _args: HangArgs, ctx: &Context) -> Result<(), CallError> {
        let _ = self.tokens.send(ctx.cancellation().clone());
        std::future::pending().await
    }
}

/// Accepts a claim whose every effect of `credit` is in the record.
struct CreditsRecorded {
    record: Record,
}

impl Verifier for CreditsRecorded {
    const NAME: &'static str = "credited";
    const DESCRIPTION: &'static str = "Every credit the claim rests on is recorded.";
    const TIMEOUT: Duration = Duration::from_secs(3);

    async fn verify(&self, claim: Claim) -> Verdict {
        let mut evidence = Vec::new();
        let mut reasons = Vec::new();
        for effect in &claim.effects {
            match self.record.get("credit", &effect.effect_key) {
                Ok(Some(entry)) => evidence.push(entry.receipt),
                Ok(None) => reasons.push(format!("{} is not recorded", effect.effect_key)),
                Err(error) => return Verdict::undecided(error.to_string()),
            }
        }
        if reasons.is_empty() {
            Verdict::Accepted { evidence }
        } else {
            Verdict::Rejected { reasons, evidence }
        }
    }
}

// ---- Harness -----------------------------------------------------------------------

struct Server {
    addr: SocketAddr,
    client: ToolExecutorServiceClient<Transport>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), agentloop_server::ServeError>>,
}

impl Server {
    async fn start<S: ExecutorService>(service: S, access: Access) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agentloop_executor::serve(
            listener,
            service,
            access,
            async {
                let _ = stopped.await;
            },
        ));
        let client = client::tool_executor(
            client::connect(&format!("http://{addr}"), ClientConfig::default())
                .await
                .unwrap(),
        );
        Server {
            addr,
            client,
            stop: Some(stop),
            task,
        }
    }

    async fn open(executor: Executor) -> Server {
        Server::start(executor, Access::default()).await
    }

    fn begin_drain(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }

    async fn stop(mut self) {
        self.begin_drain();
        drop(self.client);
        tokio::time::timeout(WITHIN, self.task)
            .await
            .expect("serve did not return")
            .unwrap()
            .unwrap();
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
) -> Result<Outcome, Status> {
    let result = client.execute(req).await?.into_inner().result.unwrap();
    assert_eq!(result.call_id, "c1");
    Ok(result.outcome.unwrap())
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

async fn reconcile(
    client: &mut ToolExecutorServiceClient<Transport>,
    tool: &str,
    key: &str,
) -> Result<ToolExecutorServiceReconcileResponse, Status> {
    let req = ToolExecutorServiceReconcileRequest {
        tool: tool.into(),
        effect_key: key.into(),
    };
    Ok(client.reconcile(req).await?.into_inner())
}

/// A read-and-write executor over `dir`, with the `credited` verifier.
fn executor(dir: &Path, credit: Credit) -> Executor {
    let record = Record::open(dir).unwrap();
    Executor::builder()
        .record(record.clone())
        .tool(Echo)
        .tool(credit)
        .verifier(CreditsRecorded { record })
        .build()
        .unwrap()
}

const CREDIT: &str = r#"{"account":"acct-1","cents":500}"#;

// ---- Describe ----------------------------------------------------------------------

#[tokio::test]
async fn describe_reports_the_schemas_derived_from_the_argument_types() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::open(executor(dir.path(), Credit::default())).await;
    let DescribeResponse { tools, verifiers } = server
        .client
        .describe(DescribeRequest {})
        .await
        .unwrap()
        .into_inner();

    assert_eq!(
        tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["echo", "credit"]
    );
    let echo = &tools[0];
    let schema: serde_json::Value = serde_json::from_str(&echo.input_schema_json).unwrap();
    let mut derived = serde_json::to_value(schemars::schema_for!(EchoArgs)).unwrap();
    derived.as_object_mut().unwrap().remove("$schema");
    assert_eq!(schema, derived);
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["required"], serde_json::json!(["text"]));
    assert_eq!(schema["properties"]["text"]["minLength"], 1);
    assert_eq!(
        schema["properties"]["text"]["description"],
        "What to say back."
    );
    assert_eq!(echo.side_effect(), SideEffect::ReadOnly);
    assert_eq!(
        echo.timeout,
        Some(prost_types::Duration {
            seconds: 1,
            nanos: 500_000_000
        })
    );
    assert!(!echo.commutative && !echo.requires_approval);
    assert!(echo.digest.is_empty() && !echo.unavailable);
    assert_eq!(echo.description, "Says the text back.");
    assert_eq!(tools[1].side_effect(), SideEffect::Write);
    assert!(tools[1].requires_approval);
    assert_eq!(tools[1], agentloop_executor::descriptor::<Credit>());

    assert_eq!(verifiers.len(), 1);
    assert_eq!(verifiers[0].name, "credited");
    assert_eq!(
        verifiers[0].description,
        "Every credit the claim rests on is recorded."
    );
    assert_eq!(verifiers[0].timeout.unwrap().seconds, 3);
    server.stop().await;
}

#[test]
fn an_executor_that_breaks_the_registrys_rules_is_refused_naming_the_tool() {
    struct Named<const BAD: u8>;
    macro_rules! tool {
        ($ty:ty, $name:expr, $effect:expr, $timeout:expr) => {
            impl Tool for $ty {
                const NAME: &'static str = $name;
                const DESCRIPTION: &'static str = "d";
                const SIDE_EFFECT: SideEffect = $effect;
                const TIMEOUT: Duration = $timeout;
                type Args = HangArgs;
                type Output = ();
                async fn call(&self, _: HangArgs, _: &Context) -> Result<(), CallError> {
                    Ok(())
                }
            }
        };
    }
    tool!(
        Named<0>,
        "bad name",
        SideEffect::ReadOnly,
        Duration::from_secs(1)
    );
    tool!(Named<1>, "zero", SideEffect::ReadOnly, Duration::ZERO);
    tool!(
        Named<2>,
        "long",
        SideEffect::ReadOnly,
        Duration::from_secs(601)
    );
    tool!(
        Named<3>,
        "vague",
        SideEffect::Unspecified,
        Duration::from_secs(1)
    );
    tool!(Named<4>, "write", SideEffect::Write, Duration::from_secs(1));

    let name_of = |error: BuildError| error.to_string();
    let bad = Executor::builder().tool(Named::<0>).build().unwrap_err();
    assert!(matches!(&bad, BuildError::InvalidToolName { tool } if tool == "bad name"));
    let duplicate = Executor::builder()
        .tool(Echo)
        .tool(Echo)
        .build()
        .unwrap_err();
    assert!(matches!(&duplicate, BuildError::DuplicateTool { tool } if tool == "echo"));
    for (error, tool) in [
        (
            Executor::builder().tool(Named::<1>).build().unwrap_err(),
            "zero",
        ),
        (
            Executor::builder().tool(Named::<2>).build().unwrap_err(),
            "long",
        ),
    ] {
        assert!(
            matches!(&error, BuildError::InvalidToolTimeout { tool: t, .. } if t == tool),
            "{error}"
        );
    }
    let vague = Executor::builder().tool(Named::<3>).build().unwrap_err();
    assert!(matches!(&vague, BuildError::UnspecifiedSideEffect { tool } if tool == "vague"));
    let unrecorded = Executor::builder().tool(Named::<4>).build().unwrap_err();
    assert!(matches!(&unrecorded, BuildError::NoRecord { tool } if tool == "write"));
    assert!(name_of(unrecorded).contains("\"write\""));

    let dir = tempfile::tempdir().unwrap();
    let record = Record::open(dir.path()).unwrap();
    let twice = Executor::builder()
        .verifier(CreditsRecorded {
            record: record.clone(),
        })
        .verifier(CreditsRecorded { record })
        .build()
        .unwrap_err();
    assert!(matches!(&twice, BuildError::DuplicateVerifier { verifier } if verifier == "credited"));
    // A read-only executor needs no record.
    assert!(Executor::builder().tool(Echo).build().is_ok());
}

// ---- Execute: arguments and requests -----------------------------------------------

#[tokio::test]
async fn typed_arguments_parse_and_a_bad_one_is_a_structured_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::open(executor(dir.path(), Credit::default())).await;
    let c = &mut server.client;

    let (out, receipt) = output(
        execute(c, request("echo", r#"{"text":"hi","times":2}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(out, serde_json::json!({"text": "hihi", "caller": null}));
    assert!(receipt.is_empty());
    // A default from serde applies; a read ignores an effect key it does not need.
    let (out, _) = output(
        execute(c, request("echo", r#"{"text":"hi"}"#, "k"))
            .await
            .unwrap(),
    );
    assert_eq!(out["text"], "hi");

    for (args, says) in [
        (r#"{"text":"hi","loud":true}"#, "unknown field `loud`"),
        (r#"{"times":2}"#, "missing field `text`"),
        (
            r#"{"text":"hi","times":300}"#,
            "invalid value: integer `300`",
        ),
        ("not json", "expected ident"),
    ] {
        let bad = error(execute(c, request("echo", args, "")).await.unwrap());
        assert_eq!(bad.error_type(), ErrorType::InvalidArguments, "{args}");
        assert!(bad.message.contains(says), "{args}: {}", bad.message);
        assert!(bad.message.starts_with("invalid arguments for echo: "));
        assert!(!bad.retryable);
        assert_eq!(bad.next_allowed_action(), NextAction::FixArguments);
    }
    // The tool's own refusal is structured too, with its advice.
    let refused = error(
        execute(c, request("credit", r#"{"account":"a","cents":0}"#, "k0"))
            .await
            .unwrap(),
    );
    assert_eq!(refused.error_type(), ErrorType::Rejected);
    assert_eq!(refused.next_allowed_action(), NextAction::Stop);

    // Malformed requests are gRPC errors: nothing ran.
    let unknown = execute(c, request("teleport", "{}", "")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("teleport"));
    let no_key = execute(c, request("credit", CREDIT, "")).await.unwrap_err();
    assert_eq!(no_key.code(), Code::InvalidArgument);
    let long_key = execute(c, request("credit", CREDIT, &"k".repeat(257)))
        .await
        .unwrap_err();
    assert_eq!(long_key.code(), Code::InvalidArgument);
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(64 * 1024));
    let too_big = execute(c, request("echo", &big, "")).await.unwrap_err();
    assert_eq!(too_big.code(), Code::InvalidArgument);
    let mut long_id = request("echo", r#"{"text":"hi"}"#, "");
    long_id.invocation_id = "i".repeat(257);
    assert_eq!(
        c.execute(long_id).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let no_call = ToolExecutorServiceExecuteRequest {
        call: None,
        ..request("echo", "{}", "")
    };
    assert_eq!(
        c.execute(no_call).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    server.stop().await;
}

#[tokio::test]
async fn a_tool_past_its_timeout_is_a_retryable_timeout_and_its_token_fires() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, mut handed) = mpsc::unbounded_channel();
    let executor = Executor::builder()
        .record(Record::open(dir.path()).unwrap())
        .tool(Slow { tokens })
        .build()
        .unwrap();
    let mut server = Server::open(executor).await;
    let timeout = error(
        execute(&mut server.client, request("slow", "{}", "k1"))
            .await
            .unwrap(),
    );
    assert_eq!(timeout.error_type(), ErrorType::Timeout);
    assert!(timeout.retryable);
    assert_eq!(timeout.next_allowed_action(), NextAction::Retry);
    assert!(timeout.message.contains("100 ms"), "{}", timeout.message);
    assert!(handed.recv().await.unwrap().is_cancelled());
    // Nothing was recorded: the key is not applied.
    let answer = reconcile(&mut server.client, "slow", "k1").await.unwrap();
    assert_eq!(answer.status(), ReconcileStatus::NotApplied);
    server.stop().await;
}

#[tokio::test]
async fn callers_are_authenticated_by_service_token_and_named_to_the_tool() {
    let access = Access {
        callers: Some(Callers::from_tokens([("gateway".to_owned(), "t".repeat(40))]).unwrap()),
        tls: None,
    };
    let executor = Executor::builder().tool(Echo).build().unwrap();
    let mut server = Server::start(executor, access).await;
    let anonymous = execute(&mut server.client, request("echo", r#"{"text":"hi"}"#, ""))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);

    let config = ClientConfig::default()
        .with_bearer(Some(&"t".repeat(40)))
        .unwrap();
    let mut client = client::tool_executor(
        client::connect(&format!("http://{}", server.addr), config)
            .await
            .unwrap(),
    );
    let (out, _) = output(
        execute(&mut client, request("echo", r#"{"text":"hi"}"#, ""))
            .await
            .unwrap(),
    );
    assert_eq!(out["caller"], "gateway");
    drop(client);
    server.stop().await;
}

// ---- Writes: once per effect key ---------------------------------------------------

#[tokio::test]
async fn a_write_applies_once_per_effect_key() {
    let dir = tempfile::tempdir().unwrap();
    let credit = Credit::default();
    let calls = Arc::clone(&credit.calls);
    let mut server = Server::open(executor(dir.path(), credit)).await;
    let c = &mut server.client;

    let first = execute(c, request("credit", CREDIT, "e1")).await.unwrap();
    let (out, receipt) = output(first.clone());
    assert_eq!(receipt, "cr-1-e1");
    assert_eq!(
        out,
        serde_json::json!({"receipt": "cr-1-e1", "account": "acct-1", "cents": 500})
    );
    // The same key again: the recorded result, and the tool is not called.
    let respaced = r#"{ "cents": 500, "account": "acct-1" }"#;
    assert_eq!(
        execute(c, request("credit", respaced, "e1")).await.unwrap(),
        first
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The same key with other arguments is the caller's bug, not a duplicate.
    let conflict = error(
        execute(
            c,
            request("credit", r#"{"account":"acct-1","cents":1}"#, "e1"),
        )
        .await
        .unwrap(),
    );
    assert_eq!(conflict.error_type(), ErrorType::Conflict);
    assert!(!conflict.retryable);
    assert_eq!(conflict.next_allowed_action(), NextAction::Stop);
    // Another key is another effect.
    let (_, second) = output(execute(c, request("credit", CREDIT, "e2")).await.unwrap());
    assert_eq!(second, "cr-2-e2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let recorded = Record::read(dir.path()).unwrap();
    assert_eq!(
        recorded
            .iter()
            .map(|e| (e.tool.as_str(), e.effect_key.as_str(), e.receipt.as_str()))
            .collect::<Vec<_>>(),
        [("credit", "e1", "cr-1-e1"), ("credit", "e2", "cr-2-e2")]
    );
    assert_eq!(recorded[0].arguments_json, CREDIT);
    assert_eq!(recorded[0].invocation_id, "inv-1");
    server.stop().await;
}

/// Counts the Executes that reached it, and how they ended, around an executor: a
/// wrapper as a tool owner would write one.
#[derive(Clone)]
struct Counting {
    executor: Executor,
    arrived: Arc<watch::Sender<usize>>,
    ended: Arc<std::sync::Mutex<Vec<Disposition>>>,
}

impl ExecutorService for Counting {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[tonic::async_trait]
impl ToolExecutorService for Counting {
    async fn describe(
        &self,
        request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        self.executor.describe(request).await
    }

    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        self.arrived.send_modify(|n| *n += 1);
        let executed = self.executor.execute_request(request).await?;
        self.ended.lock().unwrap().push(executed.disposition());
        Ok(Response::new(executed.into_response()))
    }

    type ExecuteStageStream = agentloop_proto::server::StageStream;

    /// A stage holds reads only, which this wrapper does not count.
    async fn execute_stage(
        &self,
        request: tonic::Request<agentloop_proto::v1::ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStageStream>, tonic::Status> {
        self.executor.execute_stage(request).await
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        self.executor.reconcile(request).await
    }

    async fn verify(
        &self,
        request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        self.executor.verify(request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_with_one_key_call_the_tool_once() {
    const REQUESTS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let open = Arc::new(Notify::new());
    let credit = Credit {
        gate: Some((entered_tx, Arc::clone(&open))),
        ..Credit::default()
    };
    let calls = Arc::clone(&credit.calls);
    let counting = Counting {
        executor: executor(dir.path(), credit),
        arrived: Arc::new(watch::Sender::new(0)),
        ended: Arc::default(),
    };
    let mut arrived = counting.arrived.subscribe();
    let server = Server::start(counting.clone(), Access::default()).await;

    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let mut client = server.client.clone();
            tokio::spawn(async move { execute(&mut client, request("credit", CREDIT, "e1")).await })
        })
        .collect();
    // One call is inside the tool, holding the key; the gate opens only once every
    // request has reached the executor.
    tokio::time::timeout(WITHIN, entered.recv())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(WITHIN, arrived.wait_for(|n| *n == REQUESTS))
        .await
        .unwrap()
        .unwrap();
    open.notify_one();

    let mut outcomes = Vec::new();
    for request in requests {
        outcomes.push(request.await.unwrap().unwrap());
    }
    assert!(outcomes.windows(2).all(|w| w[0] == w[1]), "{outcomes:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        entered.try_recv().is_err(),
        "a second call entered the tool"
    );
    let mut ended = counting.ended.lock().unwrap().clone();
    ended.sort_by_key(|d| *d != Disposition::Applied);
    assert_eq!(ended[0], Disposition::Applied);
    assert!(ended[1..].iter().all(|d| *d == Disposition::Replayed));
    assert_eq!(Record::read(dir.path()).unwrap().len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn the_record_survives_a_restart_and_reconcile_answers_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::open(executor(dir.path(), Credit::default())).await;
    let first = execute(&mut server.client, request("credit", CREDIT, "e1"))
        .await
        .unwrap();
    server.stop().await;

    // A new executor over the same directory.
    let credit = Credit::default();
    let calls = Arc::clone(&credit.calls);
    let mut server = Server::open(executor(dir.path(), credit)).await;
    let c = &mut server.client;
    let applied = reconcile(c, "credit", "e1").await.unwrap();
    assert_eq!(applied.status(), ReconcileStatus::Applied);
    assert_eq!(applied.receipt, "cr-1-e1");
    let (out, _) = output(first.clone());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&applied.output_json).unwrap(),
        out
    );
    assert!(
        applied.detail.contains("attempt 1 of call c1"),
        "{applied:?}"
    );
    let absent = reconcile(c, "credit", "never-sent").await.unwrap();
    assert_eq!(absent.status(), ReconcileStatus::NotApplied);
    assert!(absent.receipt.is_empty() && absent.output_json.is_empty());

    assert_eq!(
        execute(c, request("credit", CREDIT, "e1")).await.unwrap(),
        first
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool ran again");

    for (tool, key, code) in [
        ("echo", "e1", Code::InvalidArgument),
        ("teleport", "e1", Code::NotFound),
        ("credit", "", Code::InvalidArgument),
        ("credit", &"k".repeat(257), Code::InvalidArgument),
    ] {
        let status = reconcile(c, tool, key).await.unwrap_err();
        assert_eq!(status.code(), code, "{tool} {key}");
    }
    server.stop().await;
}

// ---- Verify ------------------------------------------------------------------------

#[tokio::test]
async fn verifiers_judge_claims_and_unknown_ones_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::open(executor(dir.path(), Credit::default())).await;
    execute(&mut server.client, request("credit", CREDIT, "e1"))
        .await
        .unwrap();
    let claim = |keys: &[&str]| Claim {
        invocation_id: "inv-1".into(),
        effects: keys
            .iter()
            .map(|key| EffectEntry {
                effect_key: (*key).into(),
                tool: "credit".into(),
                ..EffectEntry::default()
            })
            .collect(),
        ..Claim::default()
    };
    let verify = |verifier: &str, claim: Option<Claim>| ToolExecutorServiceVerifyRequest {
        verifier: verifier.into(),
        claim,
    };
    let c = &mut server.client;
    let accepted = c
        .verify(verify("credited", Some(claim(&["e1"]))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(accepted.verdict(), CheckVerdict::Accepted);
    assert_eq!(accepted.evidence, ["cr-1-e1"]);
    let rejected = c
        .verify(verify("credited", Some(claim(&["e1", "e9"]))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rejected.verdict(), CheckVerdict::Rejected);
    assert_eq!(rejected.reasons, ["e9 is not recorded"]);

    let unknown = c
        .verify(verify("balance_ok", Some(claim(&[]))))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("balance_ok"));
    let no_claim = c.verify(verify("credited", None)).await.unwrap_err();
    assert_eq!(no_claim.code(), Code::InvalidArgument);
    server.stop().await;
}

// ---- Cancellation, health and drain ------------------------------------------------

fn hanging() -> (Executor, mpsc::UnboundedReceiver<CancellationToken>) {
    let (tokens, handed) = mpsc::unbounded_channel();
    let executor = Executor::builder()
        .tool(Hang { tokens })
        .drain_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    (executor, handed)
}

#[tokio::test]
async fn a_client_that_drops_the_call_fires_the_token() {
    let (executor, mut handed) = hanging();
    let server = Server::open(executor).await;
    let mut client = server.client.clone();
    let call = tokio::spawn(async move { execute(&mut client, request("hang", "{}", "")).await });
    let token = tokio::time::timeout(WITHIN, handed.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(!token.is_cancelled());
    call.abort();
    tokio::time::timeout(WITHIN, token.cancelled())
        .await
        .expect("the token never fired");
    server.stop().await;
}

#[tokio::test]
async fn a_deadline_that_passes_fires_the_token() {
    let (executor, mut handed) = hanging();
    let mut server = Server::open(executor).await;
    let mut req = Request::new(request("hang", "{}", ""));
    req.set_timeout(Duration::from_millis(200));
    let status = server.client.execute(req).await.unwrap_err();
    // DEADLINE_EXCEEDED when the server's timer wins, CANCELLED when the client's does.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    let token = handed.recv().await.unwrap();
    tokio::time::timeout(WITHIN, token.cancelled())
        .await
        .expect("the token never fired");
    server.stop().await;
}

// ---- Stages ------------------------------------------------------------------------

/// A call of a stage, as the gateway sends it.
fn staged(
    call_id: &str,
    tool: &str,
    args: &str,
    effect_key: &str,
) -> ToolExecutorServiceExecuteRequest {
    let mut staged = request(tool, args, effect_key);
    if let Some(call) = &mut staged.call {
        call.call_id = call_id.into();
    }
    staged
}

#[tokio::test]
async fn a_stage_streams_each_answer_as_it_comes_refuses_writes_and_cancels_with_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, mut handed) = mpsc::unbounded_channel();
    let credit = Credit::default();
    let credits = Arc::clone(&credit.calls);
    let executor = Executor::builder()
        .record(Record::open(dir.path()).unwrap())
        .tool(Echo)
        .tool(credit)
        .tool(Hang { tokens })
        .build()
        .unwrap();
    let mut server = Server::open(executor).await;
    let calls = vec![
        staged("c0", "hang", "{}", ""),
        staged("c1", "echo", r#"{"text":"hi","times":2}"#, ""),
        staged("c2", "credit", CREDIT, "effect-1"),
        staged("c3", "teleport", "{}", ""),
        staged("c4", "echo", r#"{"text":5}"#, ""),
    ];
    let mut answers = server
        .client
        .execute_stage(ToolExecutorServiceExecuteStageRequest { calls })
        .await
        .unwrap()
        .into_inner();
    // Every call but the one that hangs is answered, each under its index, while
    // `hang` still runs: the answers do not wait for each other.
    let mut got = std::collections::BTreeMap::new();
    while got.len() < 4 {
        let reply = tokio::time::timeout(WITHIN, answers.message())
            .await
            .expect("a stage's answer never came")
            .unwrap()
            .expect("the stage ended early");
        let answer = reply.answer.unwrap().answer.unwrap();
        assert!(
            got.insert(reply.index, answer).is_none(),
            "index {} twice",
            reply.index
        );
    }
    match &got[&1] {
        Answer::Result(result) => {
            assert_eq!(result.call_id, "c1");
            assert_eq!(output(result.outcome.clone().unwrap()).0["text"], "hihi");
        }
        other => panic!("{other:?}"),
    }
    match &got[&2] {
        Answer::Refused(refused) => {
            assert_eq!(
                Code::from(refused.code),
                Code::InvalidArgument,
                "{refused:?}"
            );
            assert!(refused.message.contains("Execute"), "{refused:?}");
        }
        other => panic!("{other:?}"),
    }
    match &got[&3] {
        Answer::Refused(refused) => assert_eq!(Code::from(refused.code), Code::NotFound),
        other => panic!("{other:?}"),
    }
    match &got[&4] {
        Answer::Result(result) => {
            let refused = error(result.outcome.clone().unwrap());
            assert_eq!(refused.error_type, ErrorType::InvalidArguments as i32);
        }
        other => panic!("{other:?}"),
    }
    // The write in the stage never ran.
    assert_eq!(credits.load(Ordering::SeqCst), 0);
    let token = tokio::time::timeout(WITHIN, handed.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(!token.is_cancelled());
    drop(answers);
    tokio::time::timeout(WITHIN, token.cancelled())
        .await
        .expect("dropping the stage's stream did not cancel its call");

    let over = (0..=MAX_STAGE_CALLS)
        .map(|i| staged(&format!("c{i}"), "echo", r#"{"text":"hi"}"#, ""))
        .collect();
    let status = server
        .client
        .execute_stage(ToolExecutorServiceExecuteStageRequest { calls: over })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    server.stop().await;
}

/// A read-only tool that reports it started and returns once released.
struct Held {
    started: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

impl Tool for Held {
    const NAME: &'static str = "held";
    const DESCRIPTION: &'static str = "Returns when released.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    const TIMEOUT: Duration = Duration::from_secs(60);
    type Args = HangArgs;
    type Output = &'static str;

    async fn call(&self, _args: HangArgs, _ctx: &Context) -> Result<&'static str, CallError> {
        let _ = self.started.send(());
        self.release.notified().await;
        Ok("done")
    }
}

async fn health(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn health_goes_not_serving_when_the_drain_starts_and_in_flight_calls_finish() {
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let executor = Executor::builder()
        .tool(Held {
            started: started_tx,
            release: Arc::clone(&release),
        })
        .build()
        .unwrap();
    let mut server = Server::open(executor).await;
    let mut health = health(server.addr).await;
    let mut watch = health
        .watch(HealthCheckRequest {
            service: SERVICE.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );

    let mut client = server.client.clone();
    let call = tokio::spawn(async move { execute(&mut client, request("held", "{}", "")).await });
    tokio::time::timeout(WITHIN, started.recv())
        .await
        .unwrap()
        .unwrap();
    server.begin_drain();
    assert_eq!(
        tokio::time::timeout(WITHIN, watch.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .status(),
        ServingStatus::NotServing
    );
    // The drain lets the call that was running finish.
    release.notify_one();
    let (out, _) = output(call.await.unwrap().unwrap());
    assert_eq!(out, "done");
    drop((watch, health, server.client));
    tokio::time::timeout(WITHIN, server.task)
        .await
        .expect("serve did not return")
        .unwrap()
        .unwrap();
    let refused = tokio::net::TcpStream::connect(server.addr).await;
    assert!(refused.is_err(), "the port still accepts connections");
}

#[tokio::test]
async fn a_drain_that_runs_out_of_time_cancels_the_calls() {
    let (executor, mut handed) = hanging();
    let mut server = Server::open(executor).await;
    let mut client = server.client.clone();
    let call = tokio::spawn(async move { execute(&mut client, request("hang", "{}", "")).await });
    let token = tokio::time::timeout(WITHIN, handed.recv())
        .await
        .unwrap()
        .unwrap();
    server.begin_drain();
    let status = tokio::time::timeout(WITHIN, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(token.is_cancelled());
    drop(server.client);
    tokio::time::timeout(WITHIN, server.task)
        .await
        .expect("serve did not return")
        .unwrap()
        .unwrap();
}
