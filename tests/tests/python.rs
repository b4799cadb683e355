//! The Python example (`examples/python`), end to end: its executor (`executor.py`) runs
//! as a real child process, registered by its endpoint (`examples/python/tools.toml`) with the
//! distributed stack's gateway, and its client (`client.py`) runs a scripted invocation
//! against the stack's orchestrator: a lookup, a reservation gated by an approval that
//! the client gives, then an answer citing both. The reservation is applied exactly once
//! by the executor's own record, and a write sent twice with one effect key, even across
//! a restart of the executor, is applied once.
//!
//! Needs `python3` (or `AGENTLOOP_PYTHON`) with `examples/python/requirements.txt`
//! installed. Without them the tests skip, saying why on stderr, unless
//! `AGENTLOOP_REQUIRE_PYTHON=1` is set (CI sets it), which makes that a failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentloop_e2e::*;
use agentloop_proto::v1 as pb;
use agentloop_stack::{Stack, StackOptions};
use agentloop_tools::ToolsConfig;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// The example's directory.
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python");
/// The endpoint `tools.toml` names (executor.py's default `--listen`); the tests replace
/// it with the port the executor got.
const REGISTRY_ENDPOINT: &str = "http://127.0.0.1:50071";
/// The executor's record file inside its `--data-dir`.
const RECORD_FILE: &str = "reservations.jsonl";
/// What executor.py prints once it serves.
const LISTENING: &str = "executor.py: listening on ";

/// The Python interpreter, when it and the example's packages are there. Otherwise
/// `None`, said loudly on stderr, or a failure with `AGENTLOOP_REQUIRE_PYTHON=1`.
fn python() -> Option<String> {
    let python = std::env::var("AGENTLOOP_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python)
        .args([
            "-c",
            "import grpc, grpc_tools.protoc, grpc_health.v1.health",
        ])
        .output();
    let missing = match probe {
        Err(error) => format!("cannot run {python}: {error}"),
        Ok(out) if !out.status.success() => format!(
            "{python} lacks the grpc packages: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ),
        Ok(_) => return Some(python),
    };
    assert!(
        std::env::var("AGENTLOOP_REQUIRE_PYTHON").as_deref() != Ok("1"),
        "AGENTLOOP_REQUIRE_PYTHON=1, but {missing}"
    );
    // Straight to the process's stderr: the test harness captures `eprintln!`, and a
    // skip should be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED the Python example's test: {missing}. Install them with `{python} -m pip \
         install -r examples/python/requirements.txt`; AGENTLOOP_REQUIRE_PYTHON=1 turns this \
         skip into a failure."
    );
    None
}

/// Generates the stubs into `dir/stubs` (as `python3 examples/python/stubs.py DIR`).
async fn generate_stubs(python: &str, dir: &Path) -> PathBuf {
    let stubs = dir.join("stubs");
    let out = tokio::time::timeout(
        PATIENCE,
        Command::new(python)
            .arg(format!("{EXAMPLE}/stubs.py"))
            .arg(&stubs)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("stub generation hung")
    .unwrap();
    assert!(
        out.status.success(),
        "stubs.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stubs
}

/// A running `executor.py`, killed when dropped (a test that fails stops it too).
struct Executor {
    child: Child,
    endpoint: String,
    data_dir: PathBuf,
    log: PathBuf,
}

impl Executor {
    /// Starts `executor.py` on a free loopback port over `data_dir` and returns once its
    /// health says SERVING.
    async fn start(python: &str, stubs: &Path, data_dir: &Path, extra: &[&str]) -> Executor {
        let log = data_dir.with_extension("log");
        let mut child = Command::new(python)
            .arg(format!("{EXAMPLE}/executor.py"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--stubs")
            .arg(stubs)
            .args(extra)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The first line says where it listens (port 0 picks one): no port is guessed.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("executor.py never said where it listens")
            .unwrap();
        let mut executor = Executor {
            child,
            endpoint: String::new(),
            data_dir: data_dir.to_owned(),
            log,
        };
        let Some(address) = line.as_deref().and_then(|l| l.strip_prefix(LISTENING)) else {
            panic!("executor.py did not start: {line:?}\n{}", executor.logs());
        };
        executor.endpoint = format!("http://{address}");
        executor.wait_serving().await;
        executor
    }

    /// Polls grpc health until SERVING, within [`PATIENCE`].
    async fn wait_serving(&self) {
        let transport = agentloop_stack::channel(&self.endpoint).await.unwrap();
        let mut health = HealthClient::new(transport);
        let check = tokio::time::timeout(PATIENCE, async {
            let mut poll = tokio::time::interval(Duration::from_millis(50));
            loop {
                poll.tick().await;
                let request = HealthCheckRequest {
                    service: "agentloop.v1.ToolExecutorService".into(),
                };
                if let Ok(response) = health.check(request).await
                    && response.get_ref().status() == ServingStatus::Serving
                {
                    return;
                }
            }
        });
        if check.await.is_err() {
            panic!("executor.py never served\n{}", self.logs());
        }
    }

    /// Its stderr so far, for failure messages.
    fn logs(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("--- executor.py stderr ---\n{text}")
    }

    /// A client of it, presenting `token` if given.
    async fn client(&self, token: Option<&str>) -> ExecutorClient {
        let transport = agentloop_stack::channel_as(&self.endpoint, token)
            .await
            .unwrap();
        agentloop_proto::client::tool_executor(transport)
    }

    /// Its record, one JSON object per applied effect key.
    fn record(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.data_dir.join(RECORD_FILE)).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// SIGTERM, then waits (bounded) for the drained exit, which must be a success.
    async fn terminate(mut self) {
        let pid = self.child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("executor.py did not stop on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}\n{}", self.logs());
    }
}

/// `examples/python/tools.toml`, its endpoint replaced by `endpoint`.
fn registry(endpoint: &str) -> ToolsConfig {
    let text = std::fs::read_to_string(format!("{EXAMPLE}/tools.toml")).unwrap();
    assert!(
        text.contains(REGISTRY_ENDPOINT),
        "tools.toml names {REGISTRY_ENDPOINT}"
    );
    ToolsConfig::parse(&text.replace(REGISTRY_ENDPOINT, endpoint)).unwrap()
}

/// The committed result of call `id` in `events`, from the last turn that holds it.
fn result<'a>(events: &'a [pb::Event], id: &str) -> &'a pb::ToolResult {
    turns(events)
        .into_iter()
        .flat_map(|turn| &turn.results)
        .rfind(|result| result.call_id == id)
        .unwrap_or_else(|| panic!("no result for call {id} in {events:?}"))
}

fn output(result: &pb::ToolResult) -> (serde_json::Value, String) {
    match &result.outcome {
        Some(pb::tool_result::Outcome::Output(output)) => (
            serde_json::from_str(&output.output_json).unwrap(),
            output.receipt.clone(),
        ),
        other => panic!("{} has no output: {other:?}", result.call_id),
    }
}

/// The client reads the lookup, waits for the reservation's approval and gives it; the
/// reservation is applied once, and the answer that cites both completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_runs_the_python_executors_tools_through_an_approval() {
    let Some(python) = python() else { return };
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let stubs = generate_stubs(&python, dir.path()).await;
    let executor = Executor::start(&python, &stubs, &dir.path().join("executor"), &[]).await;

    let mut options = StackOptions {
        wiring: Wiring::Distributed,
        ..StackOptions::embedded(dir.path().join("data"))
    };
    options.services.tools = Some(registry(&executor.endpoint));
    let stack = Stack::start(options).await.unwrap();

    let run = Command::new(&python)
        .arg(format!("{EXAMPLE}/client.py"))
        .args(["--orchestrator", &stack.endpoint()])
        .args(["--script", &format!("{EXAMPLE}/script.json")])
        .args(["--goal", "Reserve 2 units of widget-7 for order-1001"])
        .arg("--stubs")
        .arg(&stubs)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let run = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("client.py hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let said = format!(
        "--- client.py stdout ---\n{stdout}\n--- client.py stderr ---\n{}\n{}",
        String::from_utf8_lossy(&run.stderr),
        executor.logs()
    );
    assert!(
        run.status.success(),
        "client.py failed: {}\n{said}",
        run.status
    );
    assert!(stdout.contains("terminal reason: completed"), "{said}");
    assert!(
        stdout.contains("approval approve by python-client"),
        "{said}"
    );
    let id = stdout
        .lines()
        .find_map(|line| line.strip_prefix("invocation "))
        .unwrap_or_else(|| panic!("client.py printed no invocation ID\n{said}"))
        .to_owned();

    // The log, as the orchestrator committed it.
    let mut client = client_of(&stack).await;
    let events = events_until_final_end(&mut client, &id).await;
    let (looked, receipt) = output(result(&events, "look"));
    assert_eq!(looked["sku"], "widget-7");
    assert_eq!(looked["available"], 12, "{looked}");
    assert!(receipt.is_empty(), "a read has no receipt");
    let (held, receipt) = output(result(&events, "hold"));
    assert!(
        receipt.is_empty(),
        "the log keeps receipts in the effect ledger"
    );
    assert_eq!(held["quantity"], 2);
    let reservation = held["reservation"].as_str().unwrap().to_owned();
    assert!(reservation.starts_with("rsv-"), "{held}");
    let resolved = events
        .iter()
        .find_map(|event| match &event.body {
            Some(pb::event::Body::ApprovalResolved(resolved)) => Some(resolved),
            _ => None,
        })
        .expect("the reservation waited for an approval");
    assert_eq!(resolved.verdict(), pb::ApprovalVerdict::Approve);
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(
        ended.answer.as_deref(),
        Some("Reserved 2 of widget-7 for order-1001 (12 were in stock).")
    );

    // The executor's own record: applied exactly once.
    let applied: Vec<_> = executor
        .record()
        .into_iter()
        .filter(|entry| entry["invocation_id"] == id.as_str())
        .collect();
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0]["receipt"], reservation.as_str());
    assert_eq!(applied[0]["call_id"], "hold");

    // The effect ledger committed that one write, under the executor's key and receipt.
    let endpoints = stack.endpoints().unwrap();
    let transport =
        agentloop_stack::channel_as(&endpoints.ledger, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap();
    let effects = agentloop_proto::client::effect_ledger(transport)
        .list_by_invocation(pb::ListByInvocationRequest {
            invocation_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].state(), pb::EffectState::Committed);
    assert_eq!(effects[0].tool, "py_reserve");
    assert_eq!(effects[0].receipt, reservation);
    assert_eq!(applied[0]["effect_key"], effects[0].effect_key.as_str());

    // A stage of two reads through the gateway. This executor answers its own
    // `ExecuteStage` UNIMPLEMENTED, so the gateway sends each call as an `Execute`.
    let transport =
        agentloop_stack::channel_as(&endpoints.tools, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap();
    let look = |call_id: &str, sku: &str| pb::ToolGatewayServiceExecuteRequest {
        invocation_id: "python-e2e-stage".into(),
        call: Some(pb::ToolCall {
            call_id: call_id.into(),
            tool: "py_inventory_lookup".into(),
            arguments_json: format!(r#"{{"sku": "{sku}"}}"#),
        }),
        attempt: 1,
        ..Default::default()
    };
    for _ in 0..2 {
        let answers = agentloop_proto::client::tool_gateway(transport.clone())
            .execute_stage(pb::ExecuteStageRequest {
                calls: vec![look("w", "widget-7"), look("g", "gadget-2")],
            })
            .await
            .unwrap()
            .into_inner()
            .answers;
        let skus: Vec<serde_json::Value> = answers
            .into_iter()
            .map(|answer| match answer.answer {
                Some(pb::stage_answer::Answer::Result(result)) => output(&result).0["sku"].clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(skus, ["widget-7", "gadget-2"]);
    }

    stack.stop().await.unwrap();
    executor.terminate().await;
}

fn execute_request(
    key: &str,
    tool: &str,
    arguments: &str,
) -> pb::ToolExecutorServiceExecuteRequest {
    pb::ToolExecutorServiceExecuteRequest {
        invocation_id: "python-e2e".into(),
        call: Some(pb::ToolCall {
            call_id: "c1".into(),
            tool: tool.into(),
            arguments_json: arguments.into(),
        }),
        effect_key: key.into(),
        attempt: 1,
        input_answer: None,
    }
}

type ExecutorClient =
    pb::tool_executor_service_client::ToolExecutorServiceClient<agentloop_proto::client::Transport>;

/// Executes `request`; its result (a tool error is a result, not a gRPC error).
async fn execute(
    client: &mut ExecutorClient,
    request: pb::ToolExecutorServiceExecuteRequest,
) -> pb::ToolResult {
    let response = client.execute(request).await.unwrap().into_inner();
    response.result.unwrap()
}

const RESERVE: &str = r#"{"sku": "gadget-2", "quantity": 2, "order": "order-7"}"#;

/// Sent straight to the executor: its Describe agrees with tools.toml; a write sent twice
/// with one effect key, before and after a restart, is applied once and answered with
/// the first receipt; Reconcile answers from the record; bad arguments are structured
/// tool errors; only the holder of the service token is served (health is open); SIGTERM
/// drains it to a clean exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_executor_applies_one_effect_key_once() {
    let Some(python) = python() else { return };
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let stubs = generate_stubs(&python, dir.path()).await;
    let token_file = dir.path().join("caller.token");
    std::fs::write(&token_file, "test-service-token\n").unwrap();
    let token_arg = token_file.to_str().unwrap();
    let data_dir = dir.path().join("executor");
    let flags = ["--caller-token-file", token_arg];
    let executor = Executor::start(&python, &stubs, &data_dir, &flags).await;
    let token = Some("test-service-token");

    // Without the token, or with another, nothing is served.
    for wrong in [None, Some("another-token")] {
        let refused = executor
            .client(wrong)
            .await
            .describe(pb::DescribeRequest {})
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    let mut client = executor.client(token).await;

    // Describe is what the gateway registers (tools.toml names the executor alone), and
    // it passes the gateway's rules.
    let described = client
        .describe(pb::DescribeRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = described.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["py_inventory_lookup", "py_reserve"]);
    let reserve = &described.tools[1];
    assert_eq!(reserve.side_effect(), pb::SideEffect::Write);
    assert!(reserve.requires_approval);
    assert!(described.verifiers.is_empty());
    let registered = ToolsConfig::from_describe(&executor.endpoint, described.clone()).unwrap();
    assert_eq!(registered.tools.len(), 2);
    // It serves no stages, which the contract allows: the gateway sends calls one by one.
    let stage = client
        .execute_stage(pb::ToolExecutorServiceExecuteStageRequest {
            calls: vec![execute_request(
                "",
                "py_inventory_lookup",
                r#"{"sku": "gadget-2"}"#,
            )],
        })
        .await
        .unwrap_err();
    assert_eq!(stage.code(), Code::Unimplemented, "{stage:?}");

    // The same write twice with one key: one apply, one receipt.
    let key = "python-e2e-key-1";
    let reserve = || execute_request(key, "py_reserve", RESERVE);
    let first = execute(&mut client, reserve()).await;
    let second = execute(&mut client, reserve()).await;
    assert_eq!(
        first, second,
        "the duplicate answers with the original result"
    );
    let (held, receipt) = output(&first);
    assert_eq!(held["available"], 1);
    assert_eq!(executor.record().len(), 1);
    let look = execute_request("", "py_inventory_lookup", r#"{"sku": "gadget-2"}"#);
    let looked = execute(&mut client, look.clone()).await;
    assert_eq!(output(&looked).0["reserved"], 2, "reserved once, not twice");

    // The same key with other arguments is a conflict, not a second apply.
    let other = execute_request(
        key,
        "py_reserve",
        r#"{"sku": "gadget-2", "quantity": 1, "order": "order-7"}"#,
    );
    let conflict = execute(&mut client, other).await;
    assert_tool_error(&conflict, pb::ErrorType::Conflict);

    // Reconcile answers from the record.
    let reconcile = |effect_key: &str| pb::ToolExecutorServiceReconcileRequest {
        tool: "py_reserve".into(),
        effect_key: effect_key.into(),
    };
    let applied = client.reconcile(reconcile(key)).await.unwrap().into_inner();
    assert_eq!(applied.status(), pb::ReconcileStatus::Applied);
    assert_eq!(applied.receipt, receipt);
    let Some(pb::tool_result::Outcome::Output(first_output)) = &first.outcome else {
        unreachable!()
    };
    assert_eq!(applied.output_json, first_output.output_json);
    let never = client
        .reconcile(reconcile("never-sent"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(never.status(), pb::ReconcileStatus::NotApplied);

    // Bad arguments are the model's to fix: tool errors, not gRPC errors.
    use pb::ErrorType::{InvalidArguments, NotFound, Rejected};
    let huge = format!(r#"{{"sku": "{}"}}"#, "x".repeat(70_000));
    let refused = [
        ("py_inventory_lookup", r#"{"sku": 7}"#, InvalidArguments),
        (
            "py_inventory_lookup",
            r#"{"sku": "a", "x": 1}"#,
            InvalidArguments,
        ),
        ("py_inventory_lookup", huge.as_str(), InvalidArguments),
        ("py_inventory_lookup", r#"{"sku": "nothing"}"#, NotFound),
        ("py_reserve", "not json", InvalidArguments),
        (
            "py_reserve",
            r#"{"sku": "gadget-2", "quantity": 5, "order": "o"}"#,
            Rejected,
        ),
    ];
    for (tool, arguments, error) in refused {
        let key = if tool == "py_reserve" { "k2" } else { "" };
        let answered = execute(&mut client, execute_request(key, tool, arguments)).await;
        assert_tool_error(&answered, error);
    }
    // A write without an effect key is a bad request from the gateway.
    let keyless = client
        .execute(execute_request("", "py_reserve", RESERVE))
        .await
        .unwrap_err();
    assert_eq!(keyless.code(), Code::InvalidArgument);
    assert_eq!(executor.record().len(), 1, "no refusal was recorded");

    // A restart keeps the record: the key is still applied, once.
    executor.terminate().await;
    let executor = Executor::start(&python, &stubs, &data_dir, &flags).await;
    let mut client = executor.client(token).await;
    let again = execute(&mut client, reserve()).await;
    assert_eq!(
        again, first,
        "the restarted executor answers with the first result"
    );
    assert_eq!(executor.record().len(), 1);
    let looked = execute(&mut client, look).await;
    assert_eq!(output(&looked).0["reserved"], 2);
    executor.terminate().await;
}

fn assert_tool_error(result: &pb::ToolResult, expected: pb::ErrorType) {
    match &result.outcome {
        Some(pb::tool_result::Outcome::Error(error)) => {
            assert_eq!(error.error_type(), expected, "{error:?}");
            assert!(!error.message.is_empty());
        }
        other => panic!("expected a {expected:?} tool error, got {other:?}"),
    }
}
