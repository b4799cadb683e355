//! Chaos: 200 invocations making `transfer` calls through three orchestrator processes
//! (PostgreSQL + Redis), while the executor drops replies after applying, answers past
//! the deadline and fails before applying, and orchestrator processes are killed with
//! SIGKILL at random moments (and replaced). Afterwards every invocation has ended, the
//! executor's own record shows every transfer applied at most once, and every ledger
//! entry is final or flagged for an operator. Prints its figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use agentloop_demo_executor::{FaultConfig, read_record};
use agentloop_proto::v1 as pb;
use agentloop_store::{EventStore, InvocationState, PgOptions, PgStore};
use common::{Cluster, Process};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const INVOCATIONS: usize = 200;
const KILLS: usize = 8;
const SEED: u64 = 20_261_129;

fn script(n: usize) -> String {
    format!(
        r#"{{"turns": [
          {{"tool_calls": [{{"id": "t1", "name": "transfer",
             "arguments": {{"from": "acct-{n}", "to": "merchant", "amount": {a}}}}}]}},
          {{"tool_calls": [{{"id": "s", "name": "sleep", "arguments": {{"ms": {pause}}}}}]}},
          {{"tool_calls": [{{"id": "t2", "name": "transfer",
             "arguments": {{"from": "acct-{n}", "to": "savings", "amount": {b}}}}}]}},
          {{"tool_calls": [{{"id": "s2", "name": "sleep", "arguments": {{"ms": {again}}}}}]}},
          {{"final": "moved"}}]}}"#,
        a = n + 1,
        b = 10_000 + n,
        pause = 400 + n % 400,
        again = 801 + n % 400,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_no_write_applied_twice_and_nothing_lost() {
    let faults = FaultConfig {
        fail_before_apply: 0.05,
        drop_reply_after_apply: 0.1,
        reply_delay_ms: 1_000,
        slow_reply: 0.1,
        seed: Some(SEED),
    };
    let Some(cluster) = Cluster::start_with("chaos", faults, Some(400)).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(SEED);
    let worker = |name: &str| cluster.spawn_worker(name, dir.path(), 1_000, 200);
    let mut processes: Vec<Process> = (0..3).map(|n| worker(&format!("w{n}"))).collect();

    // Start everything through the first process once it answers.
    let mut client = processes[0].client().await;
    let mut ids = Vec::new();
    for n in 0..INVOCATIONS {
        let started = client
            .start_invocation(pb::StartInvocationRequest {
                goal: "chaos".into(),
                scripted_model_json: script(n),
                idempotency_key: format!("chaos-{n}"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        ids.push(uuid::Uuid::parse_str(&started.invocation.unwrap().invocation_id).unwrap());
    }
    drop(client);

    // Kill a random worker at random moments, replacing each one.
    let store = PgStore::connect(PgOptions::new(cluster.database.url()))
        .await
        .unwrap();
    let mut kills = 0;
    let mut spawned = 3;
    let ended = |store: &PgStore| {
        let store = store.clone();
        let ids = ids.clone();
        async move {
            let mut ended = 0;
            for id in ids {
                if store.get(id).await.unwrap().state == InvocationState::Ended {
                    ended += 1;
                }
            }
            ended
        }
    };
    while kills < KILLS && ended(&store).await < INVOCATIONS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
        let victim = rng.random_range(0..processes.len());
        let mut killed = processes.swap_remove(victim);
        killed.child.kill().unwrap();
        killed.child.wait().unwrap();
        kills += 1;
        processes.push(worker(&format!("w{spawned}")));
        spawned += 1;
    }
    let mut waited = 0;
    while ended(&store).await < INVOCATIONS {
        assert!(waited < 3_000, "invocations still running after 5 minutes");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }

    // Every invocation ended exactly once, with a whole log.
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for &id in &ids {
        let record = store.get(id).await.unwrap();
        let end = record.end.unwrap();
        *reasons.entry(end.reason.to_string()).or_default() += 1;
        let events = store.events(id, 1, 100).await.unwrap();
        let ends = events
            .iter()
            .filter(|e| matches!(e.event.body, agentloop_engine::EventBody::Ended(_)))
            .count();
        assert_eq!(ends, 1, "{id}");
        let seqs: Vec<u64> = events.iter().map(|e| e.event.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "{id}");
    }

    // The executor's own record: each effect key, and each call of each invocation,
    // applied at most once.
    let applied = read_record(cluster.executor.data_dir()).unwrap();
    let mut keys = HashSet::new();
    let mut calls = HashSet::new();
    let mut duplicates = 0;
    for transfer in &applied {
        if !keys.insert(transfer.effect_key.clone())
            || !calls.insert((transfer.invocation_id.clone(), transfer.call_id.clone()))
        {
            duplicates += 1;
        }
    }

    // The ledger: nothing left in flight; only flagged entries may remain unresolved.
    // Read as the orchestrator reads it, with its service token.
    let token = cluster
        .services
        .endpoints()
        .unwrap()
        .tokens
        .orchestrator
        .clone();
    let transport = agentloop_stack::channel_as(&cluster.ledger, Some(&token))
        .await
        .unwrap();
    let mut ledger = agentloop_proto::client::effect_ledger(transport);
    let mut unresolved = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = ledger
            .list_unresolved(pb::ListUnresolvedRequest {
                page_size: 500,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        unresolved.extend(page.entries);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let in_flight: Vec<_> = unresolved
        .iter()
        .filter(|e| e.state() != pb::EffectState::ReconciliationRequired)
        .collect();

    let stats = cluster.executor.stats();
    println!(
        "chaos: {INVOCATIONS} invocations, {kills} SIGKILLs, faults injected: {} replies \
         dropped after applying, {} replies past the deadline, {} failures before applying; \
         effects applied {}, duplicates {duplicates}; ledger entries flagged for an \
         operator {}, left in flight {}; terminal reasons {reasons:?}",
        stats.dropped_replies,
        stats.delayed_replies,
        stats.failed_before_apply,
        applied.len(),
        unresolved.len() - in_flight.len(),
        in_flight.len(),
    );
    assert_eq!(duplicates, 0, "a write was applied twice");
    assert!(
        in_flight.is_empty(),
        "ledger entries left in flight: {in_flight:?}"
    );
    assert_eq!(
        kills, KILLS,
        "every kill landed while invocations were running"
    );
    assert!(stats.dropped_replies > 0 && stats.delayed_replies > 0);
    drop(processes);
    cluster.stop().await;
}
