//! The production overlay as processes on this machine (`deploy/local/cluster`): every
//! service binary with its manifest's configuration file and variables, two
//! orchestrators over one PostgreSQL and one Redis. An invocation starts on the first
//! orchestrator, which is killed (SIGKILL) between two turns; the second takes its lease
//! over and finishes it, with no committed turn redone.
//!
//! The binaries are the workspace's, next to this test's own (`cargo test --workspace`
//! builds them); `AGENTLOOP_BIN_DIR` names another folder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use agentloop_bench::cluster::{ClusterOptions, LocalCluster};
use agentloop_e2e::{PATIENCE, bin_dir, get, reason, turns, watch};
use agentloop_proto::v1 as pb;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orchestrator_killed_mid_invocation_is_taken_over_by_the_other() {
    let Some(postgres) = agentloop_store::testing::PostgresServer::for_test("cluster").await else {
        return;
    };
    let Some(redis) = agentloop_lease::testing::RedisServer::start_or_skip("cluster").await else {
        return;
    };
    let events = postgres.create_database().await.unwrap();
    let ledger = postgres.create_database().await.unwrap();
    let cluster = LocalCluster::up(&ClusterOptions {
        script: agentloop_bench::cluster::default_script(),
        bin_dir: bin_dir(),
        parent_dir: None,
        database_url: events.url().to_owned(),
        ledger_database_url: ledger.url().to_owned(),
        redis_url: redis.url(),
        env: Vec::new(),
        netns: None,
    })
    .await
    .unwrap();
    let [first_endpoint, second_endpoint] = cluster.orchestrators().unwrap();

    // Turn 1 looks a value up; the model takes 2 s over turn 2, long enough to kill the
    // orchestrator in between; turn 3 answers from both lookups.
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"tool_calls": [{"id": "b", "name": "lookup", "arguments": {"key": "policy"}}],
       "delay_ms": 2000},
      {"final": "profile=active; policy=refund-under-100", "evidence": ["a", "b"]}]}"#;
    let mut first = cluster.client(first_endpoint).await.unwrap();
    let id = first
        .start_invocation(pb::StartInvocationRequest {
            goal: "survive a dead orchestrator".into(),
            scripted_model_json: script.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
        .invocation_id;
    let mut stream = watch(&mut first, &id).await;
    let committed = tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            if let Some(pb::event::Body::Turn(turn)) = item.unwrap().event.unwrap().body {
                return turn;
            }
        }
        panic!("the watch ended before turn 1 was committed")
    })
    .await
    .expect("turn 1 was never committed");
    assert_eq!(committed.turn, 1);
    let pid = cluster.pids()["orchestrator-0"].to_string();
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    drop(stream);

    // The second orchestrator sweeps the dead one's lease once its TTL has run out.
    let mut second = cluster.client(second_endpoint).await.unwrap();
    let log = tokio::time::timeout(
        PATIENCE,
        agentloop_e2e::events_until_end(&mut second, &id, 1),
    )
    .await
    .unwrap_or_else(|_| panic!("not finished; its log:\n{}", cluster.log("orchestrator-1")));
    let invocation = get(&mut second, &id).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::Completed,
        "{log:?}"
    );
    let numbers: Vec<u32> = turns(&log).iter().map(|t| t.turn).collect();
    assert_eq!(numbers, [1, 2, 3], "each turn committed once");

    // The takeover was the second orchestrator's, by its sweep.
    let metrics = agentloop_telemetry::scrape::get(cluster.get("ORCHESTRATOR_1_METRICS").unwrap())
        .await
        .unwrap();
    let taken = agentloop_telemetry::metrics::sample(
        &metrics,
        r#"agentloop_leases_taken_over_total{how="sweep"}"#,
    );
    assert_eq!(taken, Some(1.0), "{metrics}");

    // Replayed from the deployment's own databases under a policy set without lookups:
    // exactly the two lookups are refused now, and the log is left as it was.
    let dir = tempfile::tempdir().unwrap();
    let strict = dir.path().join("transfers-only.cedar");
    std::fs::write(
        &strict,
        r#"@id("transfers-only")
permit (principal, action == Agentloop::Action::"call", resource == Agentloop::Tool::"transfer");"#,
    )
    .unwrap();
    let mut services = agentloop_stack::ServicesOptions::new(dir.path().join("data"));
    services.policy.policies = [("default".to_owned(), vec![strict])].into();
    services.ledger.database_url = Some(ledger.url().to_owned());
    let replayed = agentloop_stack::replay(
        services,
        Some(events.url()),
        agentloop_stack::Replaying::Ids(vec![id.clone()]),
    )
    .await
    .unwrap();
    let refused: Vec<&str> = replayed[0]
        .now_refused
        .iter()
        .map(|change| change.call_id.as_str())
        .collect();
    assert_eq!(refused, ["a", "b"], "{replayed:?}");
    assert_eq!(replayed[0].answers, 1);
    assert_eq!(get(&mut second, &id).await.last_seq, invocation.last_seq);
}

#[test]
fn a_variable_of_no_service_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    for variable in [
        "AGENTLOOP_NOPE_KEY=1",
        "AGENTLOOP_POLICY_=1",
        "AGENTLOOP_POLICY_KEY",
    ] {
        let output = Command::new("bash")
            .arg(agentloop_bench::cluster::default_script())
            .arg("up")
            .arg("--dir")
            .arg(dir.path())
            .args(["--database-url", "postgres://db/events"])
            .args(["--ledger-database-url", "postgres://db/ledger"])
            .args(["--redis-url", "redis://redis:6379"])
            .args(["--env", variable])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{variable}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("--env {variable} names no service")),
            "{variable}: {stderr}"
        );
        assert!(
            !dir.path().join("pids").exists(),
            "{variable}: nothing started"
        );
    }
}
