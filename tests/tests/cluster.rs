//! The production overlay as processes on this machine (`deploy/local/cluster`): every
//! service binary with its manifest's configuration file and variables, two
//! orchestrators over one PostgreSQL and one Redis. An invocation starts on the first
//! orchestrator, which is killed (SIGKILL) between two turns; the second takes its lease
//! over and finishes it, with no committed turn redone.
//!
//! The binaries are the workspace's, next to this test's own (`cargo test --workspace`
//! builds them); `AGENTLOOP_BIN_DIR` names another folder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use agentloop_e2e::{Client, PATIENCE, get, reason, turns, watch};
use agentloop_proto::client::{ClientConfig, connect};
use agentloop_proto::v1 as pb;
use futures::StreamExt;

/// The folder of the service binaries.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENTLOOP_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/<this test> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// 17 consecutive free loopback ports below the ephemeral range (where the other tests'
/// port-0 listeners land), as the script's `--port-base`.
fn free_port_base() -> u16 {
    let start = 20_000 + (std::process::id() % 400) as u16 * 20;
    (0..400u16)
        .map(|n| 20_000 + (start - 20_000 + n * 20) % 8_000)
        .find(|base| {
            (0..17).all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        })
        .expect("no 17 free ports in 20000..28000")
}

/// Stops the cluster however the test ends.
struct Cluster {
    script: PathBuf,
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
}

impl Cluster {
    fn up(database: &str, ledger_database: &str, redis: &str) -> Cluster {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let script = root.join("deploy/local/cluster");
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new("bash")
            .arg(&script)
            .arg("up")
            .arg("--dir")
            .arg(dir.path())
            .args(["--database-url", database])
            .args(["--ledger-database-url", ledger_database])
            .args(["--redis-url", redis])
            .arg("--bin-dir")
            .arg(bin_dir())
            .args(["--port-base", &free_port_base().to_string()])
            .output()
            .unwrap();
        let cluster = Cluster {
            script,
            env: BTreeMap::new(),
            dir,
        };
        assert!(
            output.status.success(),
            "deploy/local/cluster up failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let mut cluster = cluster;
        cluster.env = std::fs::read_to_string(cluster.dir.path().join("cluster.env"))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        cluster
    }

    fn get(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("cluster.env has no {key}"))
    }

    async fn client(&self, orchestrator: &str) -> Client {
        let token = std::fs::read_to_string(self.get("TOKEN_FILE")).unwrap();
        let config = ClientConfig::default()
            .with_request_timeout(None)
            .with_bearer(Some(token.trim()))
            .unwrap();
        agentloop_proto::client::orchestrator(
            connect(self.get(orchestrator), config).await.unwrap(),
        )
    }

    fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("logs/{process}.log")))
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("down")
            .arg("--dir")
            .arg(self.dir.path())
            .status();
    }
}

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
    let cluster = Cluster::up(events.url(), ledger.url(), &redis.url());

    // Turn 1 looks a value up; the model takes 2 s over turn 2, long enough to kill the
    // orchestrator in between; turn 3 answers from both lookups.
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"tool_calls": [{"id": "b", "name": "lookup", "arguments": {"key": "policy"}}],
       "delay_ms": 2000},
      {"final": "profile=active; policy=refund-under-100", "evidence": ["a", "b"]}]}"#;
    let mut first = cluster.client("ORCHESTRATOR_0").await;
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
    let pid = cluster.get("PID_ORCHESTRATOR_0").to_owned();
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    drop(stream);

    // The second orchestrator sweeps the dead one's lease once its TTL has run out.
    let mut second = cluster.client("ORCHESTRATOR_1").await;
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
    let metrics = agentloop_telemetry::scrape::get(cluster.get("ORCHESTRATOR_1_METRICS"))
        .await
        .unwrap();
    let taken = agentloop_telemetry::metrics::sample(
        &metrics,
        r#"agentloop_leases_taken_over_total{how="sweep"}"#,
    );
    assert_eq!(taken, Some(1.0), "{metrics}");
}
