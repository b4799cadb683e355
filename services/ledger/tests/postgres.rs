//! The ledger on PostgreSQL: the conformance suite (each check on a database of its own),
//! durability across a reconnect, two ledger processes racing on one database, and
//! sharing a database with the event store. Skips loudly without a server unless
//! `AGENTLOOP_REQUIRE_POSTGRES=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod conformance;

use std::sync::Arc;

use agentloop_ledger::{Backend, EffectState, LedgerError, LedgerStore, Outcome, StoreOptions};
use agentloop_store::testing::{PostgresServer, TestDatabase};
use agentloop_store::{EventStore, PgOptions, PgStore};
use conformance::{effect, unknown_outcome};
use tokio::sync::Barrier;

async fn store_on(database: &TestDatabase) -> LedgerStore {
    let options = StoreOptions {
        max_connections: 8,
        ..StoreOptions::default()
    };
    LedgerStore::connect_postgres(database.url(), &options)
        .await
        .expect("connect to the test database")
}

async fn fresh(server: &PostgresServer) -> (LedgerStore, TestDatabase) {
    let database = server.create_database().await.expect("create database");
    (store_on(&database).await, database)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_conformance_suite() {
    let Some(server) = PostgresServer::for_test("postgres_passes_the_conformance_suite").await
    else {
        return;
    };
    conformance::run_all(|| fresh(&server)).await;
}

#[tokio::test]
async fn entries_survive_a_reconnect_with_synchronous_commit() {
    let Some(server) =
        PostgresServer::for_test("entries_survive_a_reconnect_with_synchronous_commit").await
    else {
        return;
    };
    let (store, database) = fresh(&server).await;
    assert_eq!(store.backend(), Backend::Postgres);
    assert_eq!(store.durability().await.unwrap(), "synchronous_commit=on");
    let new = effect("inv", "c1");
    let entry = unknown_outcome(&store, &new).await;
    store.close().await;

    // New sessions; reconnecting also finds the schema already migrated.
    let store = store_on(&database).await;
    assert_eq!(store.get(&new.effect_key).await.unwrap(), entry);
    store.close().await;
}

/// Two ledger processes (two pools) on one database, their tasks racing the same
/// dispatch: one wins across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ledgers_on_one_database_one_dispatch_wins() {
    let Some(server) =
        PostgresServer::for_test("two_ledgers_on_one_database_one_dispatch_wins").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let ledgers = [store_on(&database).await, store_on(&database).await];
    let mut total_wins = 0;
    for round in 0..10 {
        let new = effect("inv", &format!("c{round}"));
        ledgers[0].prepare(&new).await.unwrap();
        let barrier = Arc::new(Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = ledgers[i % 2].clone();
                let (key, barrier) = (new.effect_key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.mark_dispatched(&key, EffectState::Prepared).await
                })
            })
            .collect();
        let mut wins = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(entry) => {
                    assert_eq!(entry.attempt, 1);
                    wins += 1;
                }
                Err(LedgerError::Transition { .. }) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(wins, 1, "round {round}");
        total_wins += wins;
        assert_eq!(ledgers[1].get(&new.effect_key).await.unwrap().attempt, 1);
    }
    assert_eq!(total_wins, 10);
    for ledger in ledgers {
        ledger.close().await;
    }
}

/// One database for a deployment: the ledger keeps its own migration history, so the
/// event store's migrations and its do not collide, in either order.
#[tokio::test]
async fn shares_a_database_with_the_event_store() {
    let Some(server) = PostgresServer::for_test("shares_a_database_with_the_event_store").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let events = PgStore::connect(PgOptions::new(database.url()))
        .await
        .unwrap();
    let ledger = store_on(&database).await;
    let new = effect("inv", "c1");
    unknown_outcome(&ledger, &new).await;
    ledger
        .record(
            &new.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::Committed,
            "r",
            "",
        )
        .await
        .unwrap();
    let invocation = agentloop_store::conformance::new_invocation(1_000, None, "digest");
    let id = invocation.invocation_id;
    events.create(invocation).await.unwrap();
    assert_eq!(events.get(id).await.unwrap().version, 0);
    events.close().await;
    ledger.close().await;

    // Reconnecting both runs both migrators again over the same database.
    let ledger = store_on(&database).await;
    let events = PgStore::connect(PgOptions::new(database.url()))
        .await
        .unwrap();
    assert_eq!(
        ledger.get(&new.effect_key).await.unwrap().state,
        EffectState::Committed
    );
    events.close().await;
    ledger.close().await;
}
