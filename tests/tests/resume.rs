//! Shutdown and restart of the embedded default: in-flight turns commit, running
//! invocations park, and the next start resumes them from the last committed event.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_e2e::{events_until_end, get, start, start_request, turns};
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use agentloop_stack::{Stack, StackOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_last_committed_turn() {
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.limits.drain_timeout_ms = 50;
    let options = StackOptions {
        orchestrator: config,
        ..StackOptions::embedded(dir.path().join("data"))
    };
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"tool_calls": [{"id": "s", "name": "sleep", "arguments": {"ms": 60000}}]},
      {"final": "resumed"}]}"#;

    let stack = Stack::start(options.clone()).await.unwrap();
    let mut client = agentloop_proto::client::orchestrator(
        agentloop_proto::client::connect(&stack.endpoint(), Default::default())
            .await
            .unwrap(),
    );
    let id = start(&mut client, start_request(script)).await;
    let mut stats = stack.demo_executor().watch_stats();
    stats.wait_for(|s| s.sleeps_started == 1).await.unwrap();
    // Shut down while the sleep runs: after the drain timeout it is cancelled, its turn
    // is committed, and the invocation parks instead of ending.
    stack.stop().await.unwrap();

    let stack = Stack::start(options).await.unwrap();
    let mut client = agentloop_proto::client::orchestrator(
        agentloop_proto::client::connect(&stack.endpoint(), Default::default())
            .await
            .unwrap(),
    );
    let events = events_until_end(&mut client, &id, 1).await;
    let invocation = get(&mut client, &id).await;
    assert_eq!(invocation.terminal_reason(), pb::TerminalReason::Completed);
    assert_eq!(invocation.answer.as_deref(), Some("resumed"));
    let turns = turns(&events);
    let numbers: Vec<u32> = turns.iter().map(|t| t.turn).collect();
    assert_eq!(
        numbers,
        [1, 2, 3],
        "no committed turn is redone, none is lost"
    );
    assert!(matches!(
        turns[1].results[0].outcome,
        Some(pb::tool_result::Outcome::Cancelled(_))
    ));
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    stack.stop().await.unwrap();
}
