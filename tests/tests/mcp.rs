//! MCP servers as tools, end to end: the reference servers `mcp-server-time` (stdio,
//! spawned by the gateway) and `@modelcontextprotocol/server-everything` (streamable
//! HTTP, started here) are named in the registry's `[[mcp_servers]]`; the distributed
//! stack's gateway offers their tools as `<server>__<tool>`, the policy service and the
//! orchestrator learn them from it, and a scripted model calls one tool of each and
//! answers citing both. Cancelling an invocation whose MCP call runs cancels the call at
//! the server (against the fake server of `crates/mcp/tests`, which records what it is
//! sent; the same is shown on the wire against server-everything there).
//!
//! Needs both servers on `PATH` (`pip install mcp-server-time`, `npm install -g
//! @modelcontextprotocol/server-everything`). Without them the test skips, saying why on
//! stderr, unless `AGENTLOOP_REQUIRE_MCP=1` is set (CI sets it), which makes that a
//! failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use agentloop_e2e::*;
use agentloop_proto::v1 as pb;
use agentloop_stack::Wiring;
use agentloop_tools::ToolsConfig;

/// Whether `program` is on `PATH`; when not, the test skips (or fails under
/// `AGENTLOOP_REQUIRE_MCP=1`).
fn installed(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    if !found {
        assert!(
            std::env::var("AGENTLOOP_REQUIRE_MCP").as_deref() != Ok("1"),
            "{program} is not installed and AGENTLOOP_REQUIRE_MCP=1"
        );
        // Straight to stderr: the harness hides eprintln! of a passing test.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {program} is not on PATH; set AGENTLOOP_REQUIRE_MCP=1 to fail instead"
        );
    }
    found
}

/// server-everything over streamable HTTP on a free port, killed when dropped.
async fn everything() -> (tokio::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new("mcp-server-everything")
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            server.try_wait().unwrap().is_none(),
            "server-everything exited"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything is not listening"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, port)
}

const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [
    {"id": "now", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}},
    {"id": "echo", "name": "everything__echo", "arguments": {"message": "hello from agentloop"}}
  ]},
  {"final": "It is now the time the clock gave, and the echo came back.", "evidence": ["now", "echo"]}
]}"#;

#[tokio::test]
async fn a_scripted_model_calls_tools_of_two_reference_mcp_servers() {
    if !installed("mcp-server-time") || !installed("mcp-server-everything") {
        return;
    }
    let (_everything, port) = everything().await;
    let registry = ToolsConfig::parse(&format!(
        r#"
[[mcp_servers]]
name = "time"
command = "mcp-server-time"

[[mcp_servers]]
name = "everything"
url = "http://127.0.0.1:{port}/mcp"
"#
    ))
    .unwrap();
    let system = System::start_with(Wiring::Distributed, Default::default(), |services| {
        services.tools = Some(registry);
    })
    .await;
    // The servers start beside the stack: wait (bounded) until the gateway lists both.
    let endpoints = system.stack().endpoints().unwrap();
    let mut gateway = agentloop_proto::client::tool_gateway(
        agentloop_stack::channel_as(&endpoints.tools, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = gateway
            .list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
        if names.contains(&"time__get_current_time") && names.contains(&"everything__echo") {
            let time = &listed.tools[names
                .iter()
                .position(|n| *n == "time__get_current_time")
                .unwrap()];
            assert_eq!(time.side_effect(), pb::SideEffect::ReadOnly);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "MCP tools never listed: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = system.client().await;

    let (invocation, events) = run_to_end(&mut client, start_request(SCRIPT)).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::Completed,
        "{invocation:?}"
    );
    let outputs: Vec<String> = turns(&events)
        .iter()
        .flat_map(|turn| &turn.results)
        .map(|result| match &result.outcome {
            Some(pb::tool_result::Outcome::Output(output)) => output.output_json.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(outputs[0].contains("UTC"), "{}", outputs[0]);
    assert!(
        outputs[1].contains("Echo: hello from agentloop"),
        "{}",
        outputs[1]
    );
    // Both ran under the contract versions the gateway listed.
    let first = turns(&events)[0];
    let mut digests: Vec<&str> = first.tool_digests.keys().map(String::as_str).collect();
    digests.sort_unstable();
    assert_eq!(digests, ["everything__echo", "time__get_current_time"]);
    system.stop().await;
}

/// What the fake MCP server of `crates/mcp/tests` has seen: the calls it started and
/// the cancellations it received, asked through the gateway as the orchestrator would.
async fn seen_by_fake(
    gateway: &mut agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient<
        agentloop_proto::client::Transport,
    >,
) -> serde_json::Value {
    let result = gateway
        .execute(pb::ToolGatewayServiceExecuteRequest {
            invocation_id: "the-test".into(),
            call: Some(pb::ToolCall {
                call_id: "ask".into(),
                tool: "fake__cancellations".into(),
                arguments_json: "{}".into(),
            }),
            attempt: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    match result.outcome {
        Some(pb::tool_result::Outcome::Output(output)) => {
            serde_json::from_str(&output.output_json).unwrap()
        }
        other => panic!("{other:?}"),
    }
}

/// Cancelling an invocation while its MCP call runs cancels the call at the server: the
/// server receives `notifications/cancelled` for that very request.
#[tokio::test]
async fn cancelling_an_invocation_cancels_its_mcp_call_at_the_server() {
    if !installed("python3") {
        return;
    }
    let fake = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/mcp/tests/fake_mcp_server.py"
    );
    let registry = ToolsConfig::parse(&format!(
        "[[mcp_servers]]\nname = \"fake\"\ncommand = \"python3\"\nargs = [{fake:?}]\ntimeout_ms = 120000\n"
    ))
    .unwrap();
    let system = System::start_with(Wiring::Distributed, Default::default(), |services| {
        services.tools = Some(registry);
    })
    .await;
    let endpoints = system.stack().endpoints().unwrap();
    let mut gateway = agentloop_proto::client::tool_gateway(
        agentloop_stack::channel_as(&endpoints.tools, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap(),
    );
    let mut client = system.client().await;
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "wait", "name": "fake__sleep", "arguments": {"seconds": 600}}]},
      {"final": "never reached"}
    ]}"#;
    let id = start(&mut client, start_request(script)).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let started = loop {
        let seen = seen_by_fake(&mut gateway).await;
        if let Some(started) = seen["started"].as_array().and_then(|s| s.first().cloned()) {
            break started;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never started: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.clone(),
            reason: "the test cancels".into(),
        })
        .await
        .unwrap();
    let events = events_until_end(&mut client, &id, 1).await;
    assert_eq!(
        reason(&get(&mut client, &id).await),
        pb::TerminalReason::Cancelled,
        "{events:?}"
    );
    let cancelled = loop {
        let seen = seen_by_fake(&mut gateway).await;
        if let Some(cancelled) = seen["cancelled"]
            .as_array()
            .and_then(|c| c.first().cloned())
        {
            break cancelled;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never cancelled at the server: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(cancelled["id"], started, "{cancelled}");
    system.stop().await;
}
