//! agentloop as an A2A agent, driven by a client no one here wrote: the official Python
//! SDK (`a2a-sdk`, pinned in `tests/a2a/requirements.txt`) runs `tests/a2a/client.py`
//! against the embedded stack's HTTP listener. The script reports what the client saw;
//! these tests judge it, and check the stack's side (a write applied once). Then the
//! other way round: a remote agent (another agentloop) as a tool (`[[a2a_agents]]`).
//!
//! Needs a Python with `a2a-sdk` (`AGENTLOOP_A2A_PYTHON`, else `python3`). Without it the
//! tests skip, saying why on stderr, unless `AGENTLOOP_REQUIRE_PYTHON=1` (CI sets it),
//! which makes that a failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::wildcard_enum_match_arm
)]

use std::sync::Arc;

use agentloop_auth::testing::{Alg, TokenIssuer};
use agentloop_decision::ScriptedModel;
use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use serde_json::{Value, json};

/// A lookup, then an answer citing it.
const LOOKUP_THEN_ANSWER: &str = r#"{"turns": [
  {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
  {"final": "profile=active", "evidence": ["a"]}]}"#;

/// A question, then a transfer that needs an approval, then an answer.
const ASK_APPROVE_ANSWER: &str = r#"{"turns": [
  {"clarification": "Which accounts?"},
  {"request_approval": {"summary": "move 42.00", "calls": [
    {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
  {"final": "moved"}]}"#;

/// The interpreter with `a2a-sdk`, or `None` (said on stderr) when there is none.
fn python() -> Option<String> {
    let python = std::env::var("AGENTLOOP_A2A_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = std::process::Command::new(&python)
        .args(["-c", "import a2a.client"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        assert!(
            std::env::var("AGENTLOOP_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "AGENTLOOP_REQUIRE_PYTHON=1, but {python} cannot import a2a (pip install -r \
             tests/a2a/requirements.txt; AGENTLOOP_A2A_PYTHON names the interpreter)"
        );
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {python} cannot import a2a; pip install -r tests/a2a/requirements.txt"
        );
    }
    found.then_some(python)
}

/// The embedded stack serving HTTP, its model replaying `script` for every task.
async fn system(script: &str, config: OrchestratorConfig) -> System {
    let model = Arc::new(ScriptedModel::parse(script).unwrap());
    let config = OrchestratorConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..config
    };
    System::start_with(Wiring::Embedded, config, |services| {
        services.model = Some(model);
    })
    .await
}

/// What `client.py SCENARIO` saw, as it printed it.
async fn run(python: &str, scenario: &str, system: &System, tokens: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/a2a/client.py");
    let base = system.stack().http_endpoint().expect("HTTP is on");
    let out = tokio::process::Command::new(python)
        .arg(script)
        .arg(scenario)
        .arg(&base)
        .args(tokens)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("client.py finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client.py {scenario} failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

fn states(events: &Value) -> Vec<(String, String)> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|event| {
            (
                event[0].as_str().unwrap().to_owned(),
                event[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_answered_with_its_evidence_streamed_and_sent_again_idempotently() {
    let Some(python) = python() else { return };
    let system = system(LOOKUP_THEN_ANSWER, OrchestratorConfig::default()).await;
    let seen = run(&python, "complete", &system, &[]).await;

    // The card the SDK resolved: one JSON-RPC interface on this listener, streaming.
    let card = &seen["card"];
    assert_eq!(card["name"], "agentloop");
    let base = system.stack().http_endpoint().unwrap();
    assert_eq!(
        card["supportedInterfaces"],
        json!([{"url": format!("{base}/a2a"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}])
    );
    assert_eq!(card["capabilities"]["streaming"], true);
    assert!(
        card.get("securitySchemes").is_none(),
        "no auth, no scheme: {card}"
    );
    assert_eq!(&seen["card_under_endpoint"], card);

    // The blocking send answers once the task has ended: the answer and what backs it.
    let task = &seen["task"];
    assert_eq!(task["state"], "TASK_STATE_COMPLETED");
    let artifact = &task["artifacts"][0];
    assert_eq!(artifact["artifactId"], "answer");
    assert_eq!(artifact["parts"][0]["text"], "profile=active");
    let checks = artifact["parts"][1]["data"]["acceptedBy"]
        .as_array()
        .unwrap();
    assert!(
        checks
            .iter()
            .any(|check| check["name"] == "citations" && check["evidence"] == json!(["a"])),
        "{checks:?}"
    );
    // The task is the invocation.
    let id = task["id"].as_str().unwrap();
    let mut client = system.client().await;
    let invocation = client
        .get_invocation(agentloop_proto::v1::GetInvocationRequest {
            invocation_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    assert_eq!(invocation.answer.as_deref(), Some("profile=active"));
    assert_eq!(
        seen["got"],
        json!({"id": id, "state": "TASK_STATE_COMPLETED"})
    );
    assert_eq!(seen["again"], id, "the same message is the same task");

    // The stream: the task, a working update per turn, the answer, then completed.
    let stream = states(&seen["stream"]);
    assert_eq!(stream[0].0, "task");
    assert_eq!(
        stream[1..],
        [
            ("status".into(), "TASK_STATE_WORKING".into()),
            ("status".into(), "TASK_STATE_WORKING".into()),
            ("artifact".into(), "answer".into()),
            ("status".into(), "TASK_STATE_COMPLETED".into()),
        ],
        "{}",
        seen["stream"]
    );
    assert_eq!(seen["stream"][1][2], json!(["turn 1: called lookup"]));
    assert_eq!(seen["stream"][3][2], json!(["profile=active"]));

    // An ID that is no invocation's is no task; a listing leaves the artifacts out
    // unless asked, cuts the history as asked, and refuses a page of no tasks.
    assert_eq!(seen["bogus"], "not found");
    let listed = seen["listed"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "the task sent twice is one: {listed:?}");
    assert!(listed.iter().any(|task| task["id"] == id));
    for task in listed {
        assert_eq!(task["state"], "TASK_STATE_COMPLETED");
        assert_eq!(
            (task["artifacts"].as_u64(), task["history"].as_u64()),
            (Some(0), Some(0))
        );
    }
    assert_eq!(seen["page_size_0"], "invalid");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_and_an_approval_are_answered_by_reply_messages() {
    let Some(python) = python() else { return };
    let system = system(ASK_APPROVE_ANSWER, OrchestratorConfig::default()).await;
    let seen = run(&python, "input", &system, &[]).await;

    // The question: the stream ends input-required, with the model's words.
    let asked = &seen["asked"];
    let last = asked.as_array().unwrap().last().unwrap();
    assert_eq!(last[1], "TASK_STATE_INPUT_REQUIRED", "{asked}");
    assert_eq!(last[2], json!(["Which accounts?"]));
    assert_eq!(last[3], json!([{"kind": "clarification"}]));
    let id = asked[0][2].as_str().unwrap().to_owned();

    // The answer resumes it, until the approval: its calls and the digest to name.
    let answered = &seen["answered"];
    let last = answered.as_array().unwrap().last().unwrap();
    assert_eq!(last[1], "TASK_STATE_INPUT_REQUIRED", "{answered}");
    let approval = &last[3][0];
    assert_eq!(approval["kind"], "approval");
    assert_eq!(approval["calls"][0]["tool"], "transfer");
    assert_eq!(approval["calls"][0]["arguments"]["amount"], 4200.0);
    assert_eq!(approval["proposalDigest"].as_str().unwrap().len(), 64);
    assert_eq!(answered[0][1], "TASK_STATE_WORKING", "{answered}");

    // A bare "approve" names no proposal and is refused, changing nothing.
    let refused = seen["bare_approve"].as_str().unwrap();
    assert!(refused.contains("proposalDigest"), "{refused}");

    // The approval with its digest: the transfer runs once, and the task completes.
    let approved = states(&seen["approved"]);
    assert_eq!(
        approved.last().unwrap(),
        &("status".to_owned(), "TASK_STATE_COMPLETED".to_owned()),
        "{}",
        seen["approved"]
    );
    let applied = applied_for(system.executor(), &id);
    assert_eq!(applied.len(), 1, "the transfer once: {applied:?}");
    assert_eq!(applied[0].amount, 4200);
    // A reply to a task that has ended is an operation this agent does not do.
    assert_eq!(seen["after_end"], "UnsupportedOperationError");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_task_does_not_exist_and_its_owner_cancels_it() {
    let Some(python) = python() else { return };
    let issuer = TokenIssuer::new(Alg::Es256);
    let keys = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.server.auth = issuer.write_key_source(keys.path());
    let system = system(ASK_APPROVE_ANSWER, config).await;
    let alice = issuer.token("alice", "acme", &[]);
    let mallory = issuer.token("mallory", "other", &["approver"]);
    let seen = run(&python, "tenants", &system, &[&alice, &mallory]).await;

    // With authentication on, the card says how to authenticate.
    let card = &seen["card"];
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    // Every call of mallory's on alice's task finds nothing, and lists nothing.
    assert_eq!(
        seen["intruder"],
        json!({"get": "not found", "cancel": "not found", "subscribe": "not found",
               "reply": "not found"})
    );
    assert_eq!(seen["intruder_lists"], json!([]));
    let anonymous = seen["anonymous"].as_str().unwrap();
    assert!(anonymous.contains("401"), "{anonymous}");
    // Alice subscribes to her waiting task: the task, and the stream ends there.
    let subscribed = states(&seen["subscribed"]);
    assert_eq!(
        subscribed,
        [("task".to_owned(), "TASK_STATE_INPUT_REQUIRED".to_owned())]
    );
    // And cancels it; a second cancel finds it ended.
    assert_eq!(seen["cancelled"], "TASK_STATE_CANCELED");
    assert_eq!(seen["cancel_again"], "TaskNotCancelableError");
    system.stop().await;
}

/// The remote agent's script: it takes a moment, then answers.
const REMOTE: &str = r#"{"turns": [{"final": "remote says 42", "delay_ms": 200}]}"#;

/// Calls the remote agent's tool, then answers citing it.
const CALL_REMOTE: &str = r#"{"turns": [
  {"tool_calls": [{"id": "r1", "name": "remote", "arguments": {"message": "What is the answer?"}}]},
  {"final": "the remote agent says 42", "evidence": ["r1"]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_is_a_tool_whose_message_id_is_the_effect_key() {
    // The remote agent: another agentloop, serving A2A.
    let remote = system(REMOTE, OrchestratorConfig::default()).await;
    let url = remote.stack().http_endpoint().unwrap();
    // The caller: its registry has the remote agent as a tool, and nothing else.
    let registry = agentloop_tools::ToolsConfig::parse(&format!(
        "[[a2a_agents]]\nname = \"remote\"\nurl = \"{url}\"\ntimeout_ms = 30000\n"
    ))
    .unwrap();
    let caller = System::start_with(
        Wiring::Embedded,
        OrchestratorConfig::default(),
        |services| {
            services.tools = Some(registry);
        },
    )
    .await;
    let mut client = caller.client().await;
    let (invocation, events) = run_to_end(&mut client, start_request(CALL_REMOTE)).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::Completed,
        "{invocation:?}"
    );
    let result = &turns(&events)[0].results[0];
    let Some(pb::tool_result::Outcome::Output(output)) = &result.outcome else {
        panic!("{result:?}")
    };
    let output: Value = serde_json::from_str(&output.output_json).unwrap();
    assert_eq!(output["answer"], "remote says 42", "{output}");

    // One task on the remote agent, keyed by the call's effect key.
    let mut remote_client = remote.client().await;
    let tasks = remote_client
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let effects = effects(&mut client, &invocation.invocation_id).await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].state(), pb::EffectState::Committed);
    assert_eq!(tasks[0].idempotency_key, effects[0].effect_key);
    assert_eq!(effects[0].receipt, tasks[0].invocation_id);
    assert_eq!(output["taskId"], tasks[0].invocation_id.as_str());
    caller.stop().await;
    remote.stop().await;
}
