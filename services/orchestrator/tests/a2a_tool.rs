//! A remote A2A agent used as a tool, across a kill -9 of the orchestrator that called
//! it: the remote agent (another agentloop, serving A2A) is sent the message once, and
//! the worker that takes the invocation over finds the task by the call's effect key
//! (the message's ID) and settles the call from it instead of sending it again.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentloop_decision::ScriptedModel;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use agentloop_stack::{ServicesOptions, Stack, StackOptions, Wiring};
use common::{Cluster, check_log, events_until_end, start};

/// The remote agent answers after a while: long enough to kill its caller meanwhile.
const REMOTE: &str = r#"{"turns": [{"final": "remote says 42", "delay_ms": 2500}]}"#;

/// Calls the remote agent, then answers citing it.
const CALL_REMOTE: &str = r#"{"turns": [
  {"tool_calls": [{"id": "r1", "name": "remote", "arguments": {"message": "What is the answer?"}}]},
  {"final": "the remote agent says 42", "evidence": ["r1"]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_remote_agent_is_sent_its_message_once_across_a_kill_of_its_caller() {
    agentloop_server::install_crypto_provider();
    let remote_dir = tempfile::tempdir().unwrap();
    let mut options = StackOptions {
        wiring: Wiring::Embedded,
        orchestrator: OrchestratorConfig {
            http_listen: Some(([127, 0, 0, 1], 0).into()),
            ..OrchestratorConfig::default()
        },
        ..StackOptions::embedded(remote_dir.path().join("data"))
    };
    options.services = ServicesOptions {
        model: Some(Arc::new(ScriptedModel::parse(REMOTE).unwrap())),
        ..ServicesOptions::new(remote_dir.path().to_path_buf())
    };
    let remote = Stack::start(options).await.unwrap();
    let url = remote.http_endpoint().unwrap();
    let registry = agentloop_tools::ToolsConfig::parse(&format!(
        "[[a2a_agents]]\nname = \"remote\"\nurl = \"{url}\"\ntimeout_ms = 30000\n"
    ))
    .unwrap();
    let Some(cluster) = Cluster::start_configured("a2a_tool_kill", |services| {
        services.tools = Some(registry);
    })
    .await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut victim = cluster.spawn_worker("p0", dir.path(), 1_000, 200);
    let survivor = cluster.spawn_worker("p1", dir.path(), 1_000, 200);
    let mut on_victim = victim.client().await;
    let id = start(&mut on_victim, CALL_REMOTE, "a2a-kill").await;

    // Kill the caller once the remote agent holds the task.
    let remote_client = agentloop_proto::client::orchestrator(
        agentloop_stack::channel(&remote.endpoint()).await.unwrap(),
    );
    let remote_tasks = || {
        let mut client = remote_client.clone();
        async move {
            client
                .list_invocations(pb::ListInvocationsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .invocations
        }
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while remote_tasks().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the remote agent gets the task");
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();

    // The survivor takes the invocation over and completes it from the same task.
    let mut on_survivor = survivor.client().await;
    let events = events_until_end(&mut on_survivor, &id).await;
    assert_eq!(
        check_log(&events),
        pb::TerminalReason::Completed,
        "{events:?}"
    );
    let tasks = remote_tasks().await;
    assert_eq!(tasks.len(), 1, "one message, one task: {tasks:?}");
    assert_eq!(tasks[0].answer.as_deref(), Some("remote says 42"));
    let effects = on_survivor
        .list_effects(pb::ListEffectsRequest {
            invocation_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].state(), pb::EffectState::Committed);
    assert_eq!(effects[0].effect_key, tasks[0].idempotency_key);
    assert_eq!(effects[0].receipt, tasks[0].invocation_id);
    assert_eq!(effects[0].attempt, 1, "sent once: {effects:?}");
    remote.stop().await.unwrap();
}
