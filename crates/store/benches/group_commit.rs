//! Throughput of the SQLite store's group commit alone: N invocations append turns at
//! once, each waiting for its previous append, as runners do. Prints appends per second,
//! group commits (fsyncs) per append and the largest group.
//!
//! `cargo bench -p agentloop-store --bench group_commit -- [invocations] [turns]`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a benchmark"
)]

use std::time::Instant;

use agentloop_engine::UnixMillis;
use agentloop_store::conformance::{lookup_turn, new_invocation};
use agentloop_store::{Append, Created, EventStore, SqliteStore};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let invocations: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let turns: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_in(dir.path()).await.unwrap();
        let mut ids = Vec::new();
        let created = futures::future::join_all(
            (0..invocations).map(|i| store.create(new_invocation(1_000 + i, None, "d"))),
        )
        .await;
        for created in created {
            match created.unwrap() {
                Created::New(record) => ids.push(record.invocation_id),
                Created::Existing(_) => unreachable!(),
            }
        }
        let before = store.stats();
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids {
            let store = store.clone();
            tasks.spawn(async move {
                for turn in 1..=turns {
                    let events = [lookup_turn(turn, u32::try_from(turn).unwrap())];
                    store
                        .append(
                            id,
                            Append {
                                expected_version: turn - 1,
                                lease_epoch: 1,
                                events: &events,
                                totals: Default::default(),
                                committed_at: UnixMillis(2_000),
                            },
                        )
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let after = store.stats();
        let appends = after.appends - before.appends;
        println!(
            "{appends} appends in {elapsed:.2} s: {:.0} appends/s, {:.4} group commits per append, largest group {}",
            appends as f64 / elapsed,
            (after.commits - before.commits) as f64 / appends as f64,
            after.largest_group
        );
        store.close().await;
    });
}
