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

use std::process::Stdio;
use std::time::Duration;

use agentloop_e2e::*;
use agentloop_proto::v1 as pb;
use agentloop_stack::Wiring;
use agentloop_tools::ToolsConfig;

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

/// The gateway's tools once it lists every one of `names` (bounded wait: the MCP servers
/// start beside the stack).
async fn listed(system: &System, names: &[&str]) -> Vec<pb::ToolDescriptor> {
    let endpoints = system.stack().endpoints().unwrap();
    let mut gateway = agentloop_proto::client::tool_gateway(
        agentloop_stack::channel_as(&endpoints.tools, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let tools = gateway
            .list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .tools;
        if names
            .iter()
            .all(|name| tools.iter().any(|tool| tool.name == *name))
        {
            return tools;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "MCP tools never listed: {names:?} among {tools:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    if !mcp_server_installed("mcp-server-time") || !mcp_server_installed("mcp-server-everything") {
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
    let tools = listed(&system, &["time__get_current_time", "everything__echo"]).await;
    let time = tools
        .iter()
        .find(|tool| tool.name == "time__get_current_time")
        .unwrap();
    assert_eq!(time.side_effect(), pb::SideEffect::ReadOnly);
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
    if !mcp_server_installed("python3") {
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

/// Calls server-everything's `trigger-elicitation-request` (a write: the server asks a
/// person for a form of fields, `name` required, some with defaults) and answers citing it.
const ASKING: &str = r#"{"turns": [
  {"tool_calls": [{"id": "form", "name": "everything__trigger-elicitation-request", "arguments": {}}]},
  {"final": "The form came back.", "evidence": ["form"]}
]}"#;

/// The JSON body of a POST to the HTTP API, answered as JSON.
async fn post_json(base: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.unwrap()
}

/// The text the last commit of turn 1 has for its one call.
fn form_output(events: &[pb::Event]) -> String {
    let last = turns(events)
        .into_iter()
        .rev()
        .find(|turn| turn.turn == 1)
        .unwrap();
    match &last.results[0].outcome {
        Some(pb::tool_result::Outcome::Output(output)) => output.output_json.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_mcp_servers_question_waits_for_a_person_whose_answer_reaches_the_server() {
    if !mcp_server_installed("mcp-server-everything") {
        return;
    }
    let (_everything, port) = everything().await;
    let registry = ToolsConfig::parse(&format!(
        "[[mcp_servers]]\nname = \"everything\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"
    ))
    .unwrap();
    let config = agentloop_orchestrator::OrchestratorConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..Default::default()
    };
    let system = System::start_with(Wiring::Distributed, config, |services| {
        services.tools = Some(registry);
    })
    .await;
    let http = system.stack().http_endpoint().expect("HTTP is on");
    let mut client = system.client().await;
    // The server offers the tool only to a client that declares it takes questions.
    let tools = listed(&system, &["everything__trigger-elicitation-request"]).await;
    let form = tools
        .iter()
        .find(|tool| tool.name == "everything__trigger-elicitation-request")
        .unwrap();
    assert_eq!(form.side_effect(), pb::SideEffect::Write);
    let (id, first, end) = start_waiting(&mut client, start_request(ASKING)).await;

    // It waits with the server's question and the schema of its answer.
    assert_eq!(
        end.reason(),
        pb::TerminalReason::ClarificationRequired,
        "{end:?}"
    );
    assert_eq!(
        end.detail,
        "Please provide inputs for the following fields:"
    );
    let waiting = get(&mut client, &id).await;
    assert_eq!(
        waiting.pending_question.as_deref(),
        Some(end.detail.as_str())
    );
    let input = waiting.pending_input.expect("the tool's question");
    assert_eq!(input.call_id, "form");
    assert_eq!(input.tool, "everything__trigger-elicitation-request");
    let schema: serde_json::Value = serde_json::from_str(&input.requested_schema_json).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["name"]));
    let asked = turns(&first)[0];
    assert!(matches!(
        asked.results[0].outcome,
        Some(pb::tool_result::Outcome::InputRequired(_))
    ));

    // An answer outside the schema is refused, and nothing is written.
    let refused = client
        .answer_clarification(pb::AnswerClarificationRequest {
            invocation_id: id.clone(),
            answer: r#"{"integer": 500}"#.into(),
            actor: "ada".into(),
            action: pb::InputAction::Accept.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("schema"), "{refused:?}");
    assert_eq!(get(&mut client, &id).await.last_seq, waiting.last_seq);

    // The answer: the call is sent again with it, defaults filled in, and the run ends.
    client
        .answer_clarification(pb::AnswerClarificationRequest {
            invocation_id: id.clone(),
            answer: r#"{"name": "Ada Lovelace", "check": true}"#.into(),
            actor: "ada".into(),
            action: pb::InputAction::Unspecified.into(),
        })
        .await
        .unwrap();
    let events = events_until_final_end(&mut client, &id).await;
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed, "{ended:?}");
    let output = form_output(&events);
    assert!(output.contains("Name: Ada Lovelace"), "{output}");
    assert!(output.contains("Agreed to terms: true"), "{output}");
    assert!(
        output.contains("Favorite Integer: 42"),
        "a default: {output}"
    );
    // Each send was an effect of its own: the first applied nothing, the second applied.
    let effects = effects(&mut client, &id).await;
    let mut states: Vec<pb::EffectState> = effects.iter().map(|e| e.state()).collect();
    states.sort_unstable();
    assert_eq!(
        states,
        [pb::EffectState::Committed, pb::EffectState::Rejected],
        "{effects:?}"
    );

    // Declined over HTTP/JSON: the server is told, and the run goes on.
    let (declined, _, _) = start_waiting(&mut client, start_request(ASKING)).await;
    let answered = post_json(
        &http,
        &format!("/v1/invocations/{declined}:answerClarification"),
        serde_json::json!({"action": "INPUT_ACTION_DECLINE", "actor": "ada"}),
    )
    .await;
    assert_eq!(answered["invocation"]["state"], "INVOCATION_STATE_RUNNING");
    let events = events_until_final_end(&mut client, &declined).await;
    let output = form_output(&events);
    assert!(output.contains("declined"), "{output}");
    system.stop().await;
}
