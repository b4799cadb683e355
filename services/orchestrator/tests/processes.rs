//! Three `agentloop-orchestrator` processes share one PostgreSQL event store and one Redis;
//! one is killed with SIGKILL in the middle of its invocations. Every invocation still
//! reaches its terminal reason exactly once, with no committed turn redone and none lost.
//! Prints the time from the kill to the takeover of each interrupted invocation, and
//! bounds it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentloop_proto::v1 as pb;
use common::{Cluster, Process, check_log, events_until_end, percentile, start};

const TTL_MS: u64 = 1_000;
const SWEEP_MS: u64 = 200;

fn unix_ms(timestamp: &prost_types::Timestamp) -> u64 {
    u64::try_from(timestamp.seconds).unwrap() * 1_000
        + u64::try_from(timestamp.nanos).unwrap() / 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_worker_loses_no_invocation_and_repeats_no_turn() {
    let Some(cluster) = Cluster::start_or_skip("kill_a_worker_process").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let processes: Vec<Process> = ["p0", "p1", "p2"]
        .into_iter()
        .map(|name| cluster.spawn_worker(name, dir.path(), TTL_MS, SWEEP_MS))
        .collect();
    let mut clients = Vec::new();
    for process in &processes {
        clients.push(process.client().await);
    }
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "s1", "name": "sleep", "arguments": {"ms": 150}},
                      {"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"tool_calls": [{"id": "s2", "name": "sleep", "arguments": {"ms": 149}}]},
      {"tool_calls": [{"id": "s3", "name": "sleep", "arguments": {"ms": 151}}]},
      {"tool_calls": [{"id": "s4", "name": "sleep", "arguments": {"ms": 152}}]},
      {"final": "done"}]}"#;
    let count = 30;
    let mut ids = Vec::new();
    for n in 0..count {
        let id = start(&mut clients[n % 3], script, &format!("kill-{n}")).await;
        ids.push(id);
    }
    // Kill p0 once the work is well under way.
    let mut stats = cluster.executor.watch_stats();
    stats.wait_for(|s| s.sleeps_started >= 40).await.unwrap();
    let mut processes = processes;
    let mut victim = processes.remove(0);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let killed_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    let mut survivor = clients.remove(1);
    let mut interrupted = 0;
    let mut takeovers = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let events = events_until_end(&mut survivor, id).await;
        assert_eq!(check_log(&events), pb::TerminalReason::Completed, "{id}");
        assert_eq!(events.len(), 6, "five turns and the end: {id}");
        // Started on p0 and not finished when it died: the first event after the kill is
        // the takeover's.
        if n % 3 == 0
            && let Some(next) = events
                .iter()
                .find(|e| unix_ms(e.committed_at.as_ref().unwrap()) > killed_at)
        {
            interrupted += 1;
            takeovers.push(Duration::from_millis(
                unix_ms(next.committed_at.as_ref().unwrap()) - killed_at,
            ));
        }
    }
    assert!(
        interrupted > 0,
        "the kill interrupted some of p0's invocations"
    );
    takeovers.sort();
    let slowest = takeovers[takeovers.len() - 1];
    println!(
        "kill -9 of 1 of 3 orchestrator processes: {count} invocations all completed once; \
         {interrupted} interrupted, next commit after the kill: p50 {:?}, max {slowest:?} \
         (lease TTL {TTL_MS} ms, sweep every {SWEEP_MS} ms)",
        percentile(&takeovers, 0.5),
    );
    // A correctness bound, not a speed benchmark: takeover comes at most TTL + sweep after
    // the dead worker's last renewal (`WorkersConfig`), and the next commit after it one
    // redone turn (a sleep of at most 152 ms) later; measured, at most 1.3 s. Twice the
    // takeover bound leaves room for a loaded machine and still fails a takeover that waits
    // for a second TTL or skips sweeps.
    let bound = Duration::from_millis(2 * (TTL_MS + SWEEP_MS));
    assert!(
        slowest < bound,
        "an interrupted invocation was taken over only {slowest:?} after the kill, not under \
         {bound:?}"
    );
    drop(processes);
    cluster.stop().await;
}
